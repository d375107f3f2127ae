use super::*;

/// The sum as `conv2d` builds it: products paired level by level.
fn tree_sum(mut terms: Vec<f32>) -> f32 {
    while terms.len() > 1 {
        terms = terms
            .chunks(2)
            .map(|p| if p.len() == 2 { p[0] + p[1] } else { p[0] })
            .collect();
    }
    terms[0]
}

/// Values of every sign and size, a few zeros, no pattern along a row.
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let h = (i ^ seed).wrapping_mul(2654435761).rotate_left(13);
            if h.is_multiple_of(17) {
                0.0
            } else {
                (h % 2001) as f32 / 997.0 - 1.0
            }
        })
        .collect()
}

/// A window of `k x k` taps, `dilation` apart, from `-pad`.
fn window(k: usize, pad: isize, dilation: isize, planes_weights: usize) -> Vec<Tap> {
    let mut taps = Vec::new();
    for y in 0..k {
        for x in 0..k {
            taps.push(Tap {
                dy: y as isize * dilation - pad,
                dx: x as isize * dilation - pad,
                weight: (y * k + x) * planes_weights,
            });
        }
    }
    taps
}

/// The outputs of `t` over `planes`, one tap at a time as the definition
/// reads, then its activation.
fn reference(t: &Taps<'_>, planes: &[Plane]) -> Vec<f32> {
    let ([h, w], [oh, ow], [sh, sw]) = (t.in_dims, t.out_dims, t.stride);
    let mut want = Vec::new();
    for p in planes {
        for r in 0..oh {
            for c in 0..ow {
                let terms = (t.taps.iter())
                    .map(|tap| {
                        let y = (r * sh) as isize + tap.dy;
                        let x = (c * sw) as isize + tap.dx;
                        let inside = (0..h as isize).contains(&y) && (0..w as isize).contains(&x);
                        let v = match inside {
                            true => t.input[p.input + y as usize * w + x as usize],
                            false => t.fill,
                        };
                        v * t.weights[p.weights + tap.weight]
                    })
                    .collect();
                // ReLU as `max(x, +0)` reads: a NaN stays; then the cap.
                let sum: f32 = tree_sum(terms);
                let relu = match t.activation.relu && !(sum > 0.0 || sum.is_nan()) {
                    true => 0.0,
                    false => sum,
                };
                want.push(t.activation.cap.filter(|&c| relu > c).unwrap_or(relu));
            }
        }
    }
    want
}

/// `t` over `planes` on every path this CPU runs, against `reference`,
/// bit for bit.
fn check(t: &Taps<'_>, planes: &[Plane], what: &str) {
    let want = reference(t, planes);
    for isa in [Isa::Generic, Isa::Avx2]
        .into_iter()
        .filter(|i| i.available())
    {
        let mut got = vec![f32::NAN; want.len()];
        taps(isa, t, planes, &mut got).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{isa} {what}");
    }
}

/// Planes of a convolution: `count` of them, not packed (the input planes
/// 5 values apart, the weights interleaved with another plane's), over
/// `in_dims`, and their values.
fn planes(count: usize, [h, w]: [usize; 2], taps: usize) -> (Vec<Plane>, Vec<f32>, Vec<f32>) {
    let planes = (0..count)
        .map(|p| Plane {
            input: 3 + p * (h * w + 5),
            weights: p,
        })
        .collect();
    let input = values(3 + count * (h * w + 5), 7);
    let weights = values(2 * taps + count, 11);
    (planes, input, weights)
}

fn case(in_dims: [usize; 2], k: usize, stride: [usize; 2], pad: isize, dilation: isize) {
    let span = (k as isize - 1) * dilation + 1;
    let out_dims =
        [0, 1].map(|a| ((in_dims[a] as isize + 2 * pad - span) / stride[a] as isize + 1) as usize);
    let window = window(k, pad, dilation, 2);
    // 11 planes: a whole group of 8 for the lanes, then 3.
    let (planes, input, weights) = planes(11, in_dims, k * k);
    let relu6 = Activation {
        relu: true,
        cap: Some(1.0),
    };
    let cap = Activation {
        relu: false,
        cap: Some(-0.5),
    };
    for (fill, activation) in [
        (0.0, Activation::NONE),
        (0.5, Activation::NONE),
        (0.0, relu6),
        (0.5, cap),
    ] {
        let t = Taps {
            input: &input,
            weights: &weights,
            in_dims,
            out_dims,
            stride,
            taps: &window,
            fill,
            activation,
        };
        let what =
            format!("{in_dims:?} k{k} s{stride:?} p{pad} d{dilation} fill {fill} {activation:?}");
        check(&t, &planes, &what);
    }
}

#[test]
fn sums_are_the_pairwise_trees_of_rounded_products_bit_for_bit() {
    for (in_dims, k, stride, pad, dilation) in [
        ([7, 7], 3, [1, 1], 1, 1),
        ([56, 56], 3, [1, 1], 1, 1),
        ([13, 29], 3, [2, 2], 1, 1),
        ([112, 112], 3, [2, 2], 1, 1),
        ([14, 14], 5, [1, 1], 2, 1),
        ([23, 19], 5, [2, 2], 2, 1),
        ([11, 40], 3, [1, 3], 0, 2),
        ([9, 9], 7, [1, 1], 3, 1),
        ([30, 17], 3, [3, 1], 2, 1),
        // Planes of more than `SMALL_PLANE` outputs, by rows.
        ([40, 37], 5, [2, 2], 2, 1),
        ([24, 23], 7, [1, 1], 3, 1),
        ([33, 70], 3, [1, 3], 0, 2),
        ([60, 20], 3, [3, 1], 2, 1),
        ([23, 19], 3, [1, 1], 1, 1),
        // Windows that start inside the input (cropped), small and large.
        ([12, 12], 3, [1, 1], -1, 1),
        ([30, 30], 5, [2, 1], -2, 1),
    ] {
        case(in_dims, k, stride, pad, dilation);
    }
}

#[test]
fn taps_outside_the_plane_read_the_fill() {
    // Every tap right of a 5x3 plane, or below it: products of the fill.
    let (planes, input, weights) = planes(9, [5, 3], 9);
    for (dy, dx) in [(0, 3), (5, 0), (-4, -3)] {
        let mut window = window(3, 0, 1, 2);
        for tap in &mut window {
            (tap.dy, tap.dx) = (tap.dy + dy, tap.dx + dx);
        }
        let t = Taps {
            input: &input,
            weights: &weights,
            in_dims: [5, 3],
            out_dims: [3, 2],
            stride: [1, 1],
            taps: &window,
            fill: 1.25,
            activation: Activation::NONE,
        };
        check(&t, &planes, &format!("taps moved by ({dy}, {dx})"));
    }
}

#[test]
fn reads_outside_the_slices_and_other_tap_counts_are_errors() {
    let taps9 = window(3, 1, 1, 1);
    let (input, weights) = (vec![0.0; 16], vec![0.0; 9]);
    let t = Taps {
        input: &input,
        weights: &weights,
        in_dims: [4, 4],
        out_dims: [4, 4],
        stride: [1, 1],
        taps: &taps9,
        fill: 0.0,
        activation: Activation::NONE,
    };
    let plane = |input, weights| [Plane { input, weights }];
    let mut out = vec![0.0; 16];
    let run = |t: &Taps<'_>, input, weights, out: &mut [f32]| {
        // Both paths check alike: the 4x4 planes go by lanes, by rows on
        // the generic path.
        let isas = [Isa::Generic, Isa::Avx2]
            .into_iter()
            .filter(|i| i.available());
        let results: Vec<_> = isas
            .map(|isa| taps(isa, t, &plane(input, weights), out))
            .collect();
        assert!(results.windows(2).all(|r| r[0] == r[1]), "{results:?}");
        results[0].clone()
    };
    assert!(run(&t, 0, 0, &mut out).is_ok());
    let e = run(&t, 1, 0, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TapPlane {
                plane: 0,
                what: "input values",
                first: 1,
                count: 16,
                len: 16
            }
        ),
        "{e}"
    );
    let e = run(&t, 0, 1, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TapPlane {
                what: "weights",
                first: 1,
                count: 9,
                ..
            }
        ),
        "{e}"
    );
    let e = run(&t, 0, 0, &mut out[..15]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Short {
                len: 15,
                needs: 16,
                ..
            }
        ),
        "{e}"
    );
    // Strides whose window overflows, and a stride of 0.
    let far = Taps {
        out_dims: [3, 1],
        stride: [1 << 63, 1],
        ..t
    };
    let e = run(&far, 0, 0, &mut out[..3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TapWindow {
                stride: [_, 1],
                span: [Some(2), Some(2)],
                ..
            }
        ),
        "{e}"
    );
    let e = run(
        &Taps {
            stride: [1, 0],
            ..t
        },
        0,
        0,
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(e, Error::TapWindow { stride: [1, 0], .. }), "{e}");
    let e = run(
        &Taps {
            taps: &taps9[..4],
            ..t
        },
        0,
        0,
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(e, Error::TapCount { count: 4, .. }), "{e}");
}

/// ReLU and a cap over edge values (zeros of both signs, infinities, NaNs
/// of both signs, the cap and its neighbours, subnormals), 0 to 17 of them,
/// in registers as the AVX2 code stores them and one at a time, bit for bit as their definition
/// reads: anything not above zero +0, a NaN kept as it is, then the lesser
/// of that and the cap.
#[test]
fn activations_of_edge_values_are_their_definitions() {
    let cap = 2.5f32;
    let edges = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        cap,
        f32::from_bits(cap.to_bits() + 1),
        f32::from_bits(cap.to_bits() - 1),
        f32::MIN_POSITIVE / 2.0,
        -f32::MIN_POSITIVE / 2.0,
        1.0,
        -1.0,
        7.0,
        -7.0,
        1e-30,
        3.0,
    ];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (relu, cap) in [(true, None), (false, Some(cap)), (true, Some(cap))] {
        let act = Activation { relu, cap };
        let definition = |x: f32| {
            let x = match relu && !(x > 0.0 || x.is_nan()) {
                true => 0.0,
                false => x,
            };
            cap.filter(|&c| x > c).unwrap_or(x)
        };
        for len in 0..=edges.len() {
            let want: Vec<f32> = edges[..len].iter().map(|&x| definition(x)).collect();
            for vectors in [false, vectors_available(Isa::Avx2)] {
                let mut got = edges[..len].to_vec();
                for eight in got.chunks_mut(8) {
                    let mut lanes = [0.0f32; 8];
                    lanes[..eight.len()].copy_from_slice(eight);
                    if vectors {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: the CPU has AVX2 and FMA (`vectors`).
                        unsafe {
                            avx2::activated_lanes(act, &mut lanes)
                        };
                    } else {
                        lanes = lanes.map(|x| act.of(x));
                    }
                    eight.copy_from_slice(&lanes[..eight.len()]);
                }
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{act:?} over {len}, vectors {vectors}"
                );
            }
        }
    }
}
