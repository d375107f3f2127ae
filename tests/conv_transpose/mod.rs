//! `Tensor::conv_transpose2d` against the scatter that defines it, with
//! the helpers of `tests/conv.rs`, whose module this is.

use kiln::{DType, Result, Tensor};
use kiln_support::gradcheck::Rng;

use super::{BASE, Conv, check_all};

/// The transposed convolution as its definition scatters it, in f64: input
/// element `(iy, ix)` adds `x * w` at output `(iy * s - before + ky * d,
/// ...)` for each kernel position. `p.c` and `p.o` are its input and
/// output channels; the weight is `[c, o / groups, kh, kw]`.
fn conv_transpose_loop(
    p: &Conv,
    extra: [usize; 2],
    x: &[f32],
    w: &[f32],
    b: &[f32],
) -> (usize, usize, Vec<f32>) {
    let len = |a: usize, n: usize| {
        (n - 1) * p.stride[a] + p.dil[a] * (p.k[a] - 1) + extra[a] + 1 - p.pad[a].0 - p.pad[a].1
    };
    let (oh, ow) = (len(0, p.h), len(1, p.w));
    let (cg, og) = (p.c / p.groups, p.o / p.groups);
    let mut out: Vec<f64> = (0..p.n * p.o * oh * ow)
        .map(|i| f64::from(b[i / (oh * ow) % p.o]))
        .collect();
    for n in 0..p.n {
        for c in 0..p.c {
            let g = c / cg;
            for iy in 0..p.h {
                for ix in 0..p.w {
                    let xv = f64::from(x[((n * p.c + c) * p.h + iy) * p.w + ix]);
                    for oc in 0..og {
                        for ky in 0..p.k[0] {
                            for kx in 0..p.k[1] {
                                let y = (iy * p.stride[0] + ky * p.dil[0]) as isize
                                    - p.pad[0].0 as isize;
                                let xx = (ix * p.stride[1] + kx * p.dil[1]) as isize
                                    - p.pad[1].0 as isize;
                                if y < 0 || xx < 0 || y >= oh as isize || xx >= ow as isize {
                                    continue;
                                }
                                let o = g * og + oc;
                                let wv = f64::from(w[((c * og + oc) * p.k[0] + ky) * p.k[1] + kx]);
                                out[((n * p.o + o) * oh + y as usize) * ow + xx as usize] +=
                                    xv * wv;
                            }
                        }
                    }
                }
            }
        }
    }
    (oh, ow, out.into_iter().map(|v| v as f32).collect())
}

#[test]
fn conv_transpose2d_scatters_each_input_through_the_kernel() -> Result<()> {
    let cases = [
        (BASE, [0, 0]),
        // Stride 2 (an upsampling decoder), output padding, no padding.
        (
            Conv {
                stride: [2, 2],
                pad: [(0, 0), (0, 0)],
                ..BASE
            },
            [1, 1],
        ),
        // Stride 3 by 2, dilation, uneven padding larger than the reach on one side.
        (
            Conv {
                stride: [3, 2],
                dil: [2, 1],
                pad: [(1, 4), (0, 2)],
                k: [2, 3],
                ..BASE
            },
            [1, 0],
        ),
        // Padding larger than the reach on the first side: cropped there.
        (
            Conv {
                pad: [(3, 0), (2, 1)],
                stride: [2, 2],
                ..BASE
            },
            [0, 1],
        ),
        // Groups: 4 input channels in 2 groups, 6 outputs.
        (
            Conv {
                c: 4,
                o: 6,
                groups: 2,
                stride: [2, 1],
                ..BASE
            },
            [0, 0],
        ),
        // Strides as long as the kernel (a U-Net's upsampling): one
        // product per group. Plain, then cropped unevenly, in groups, and
        // 3 by 2.
        (
            Conv {
                k: [2, 2],
                stride: [2, 2],
                pad: [(0, 0), (0, 0)],
                ..BASE
            },
            [0, 0],
        ),
        (
            Conv {
                k: [3, 2],
                stride: [3, 2],
                pad: [(1, 2), (0, 1)],
                c: 4,
                o: 6,
                groups: 2,
                ..BASE
            },
            [0, 0],
        ),
    ];
    for (seed, (p, extra)) in cases.into_iter().enumerate() {
        let mut rng = Rng(40 + seed as u64);
        let x = rng.fill(p.n * p.c * p.h * p.w, |r| r.uniform(-1.0, 1.0));
        let w = rng.fill(p.c * (p.o / p.groups) * p.k[0] * p.k[1], |r| {
            r.uniform(-1.0, 1.0)
        });
        let b = rng.fill(p.o, |r| r.uniform(-1.0, 1.0));
        let (oh, ow, want) = conv_transpose_loop(&p, extra, &x, &w, &b);
        let shape = Tensor::zeros([p.n, p.c, p.h, p.w], DType::F32)?.conv_transpose2d(
            &Tensor::zeros([p.c, p.o / p.groups, p.k[0], p.k[1]], DType::F32)?,
            None,
            p.stride,
            p.pad,
            extra,
            p.dil,
            p.groups,
        )?;
        assert_eq!(shape.dims(), [p.n, p.o, oh, ow], "{p:?}");
        let inputs = [
            (vec![p.n, p.c, p.h, p.w], x),
            (vec![p.c, p.o / p.groups, p.k[0], p.k[1]], w),
            (vec![p.o], b),
        ];
        check_all(
            &format!("transposed {p:?}, output padding {extra:?}"),
            &inputs,
            &want,
            &|t| t[0].conv_transpose2d(&t[1], Some(&t[2]), p.stride, p.pad, extra, p.dil, p.groups),
        )?;
    }
    Ok(())
}

#[test]
fn a_bias_that_does_not_fit_is_an_error_naming_the_op() -> Result<()> {
    // Strides as long as the kernel (one product per group) and not.
    let x = Tensor::zeros([1, 4, 3, 3], DType::F32)?;
    let w = Tensor::zeros([4, 3, 2, 2], DType::F32)?;
    for stride in [[2, 2], [1, 1]] {
        for bias in [
            Tensor::zeros([2, 3], DType::F32)?,
            Tensor::zeros([6], DType::F64)?,
        ] {
            let e = x
                .conv_transpose2d(&w, Some(&bias), stride, [(0, 0); 2], [0, 0], [1, 1], 2)
                .expect_err("a bias of another shape or dtype")
                .to_string();
            assert!(
                e.contains("conv_transpose2d") && e.contains("the bias must be f32 [6]"),
                "{e}"
            );
        }
    }
    Ok(())
}
