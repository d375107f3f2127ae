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

fn case(in_dims: [usize; 2], k: usize, stride: [usize; 2], pad: isize, dilation: isize) {
    let [h, w] = in_dims;
    let span = (k as isize - 1) * dilation + 1;
    let out_dims =
        [0, 1].map(|a| ((in_dims[a] as isize + 2 * pad - span) / stride[a] as isize + 1) as usize);
    let window = window(k, pad, dilation, 2);
    // Three planes, not packed: the input planes 5 values apart, the
    // weights interleaved with another plane's.
    let planes: Vec<Plane> = (0..3)
        .map(|p| Plane {
            input: 3 + p * (h * w + 5),
            weights: p,
        })
        .collect();
    let input = values(3 + 3 * (h * w + 5), 7);
    let weights = values(2 * k * k + 3, 11);
    let t = Taps {
        input: &input,
        weights: &weights,
        in_dims,
        out_dims,
        stride,
        taps: &window,
        fill: 0.0,
    };
    let [oh, ow] = out_dims;
    let mut want = Vec::new();
    for p in &planes {
        for r in 0..oh {
            for c in 0..ow {
                let terms = (window.iter())
                    .map(|tap| {
                        let y = (r * stride[0]) as isize + tap.dy;
                        let x = (c * stride[1]) as isize + tap.dx;
                        let inside = (0..h as isize).contains(&y) && (0..w as isize).contains(&x);
                        let v = match inside {
                            true => input[p.input + y as usize * w + x as usize],
                            false => 0.0,
                        };
                        v * weights[p.weights + tap.weight]
                    })
                    .collect();
                want.push(tree_sum(terms));
            }
        }
    }
    for isa in [Isa::Generic, Isa::Avx2]
        .into_iter()
        .filter(|i| i.available())
    {
        let mut got = vec![f32::NAN; want.len()];
        taps(isa, &t, &planes, &mut got).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{isa} {in_dims:?} k{k} s{stride:?} p{pad} d{dilation}"
        );
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
    ] {
        case(in_dims, k, stride, pad, dilation);
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
    };
    let plane = |input, weights| [Plane { input, weights }];
    let mut out = vec![0.0; 16];
    assert!(taps(Isa::Generic, &t, &plane(0, 0), &mut out).is_ok());
    let e = taps(Isa::Generic, &t, &plane(1, 0), &mut out).unwrap_err();
    assert!(e.to_string().contains("plane 0 reads input"), "{e}");
    let e = taps(Isa::Generic, &t, &plane(0, 1), &mut out).unwrap_err();
    assert!(e.to_string().contains("weight"), "{e}");
    let e = taps(Isa::Generic, &t, &plane(0, 0), &mut out[..15]).unwrap_err();
    assert!(e.to_string().contains("15"), "{e}");
    let four = &taps9[..4];
    let e = taps(
        Isa::Generic,
        &Taps { taps: four, ..t },
        &plane(0, 0),
        &mut out,
    )
    .unwrap_err();
    assert!(e.to_string().contains("4 taps"), "{e}");
}
