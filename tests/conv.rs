//! `Tensor::conv2d`, `max_pool2d` and `avg_pool2d` against direct loops
//! written out here, on awkward shapes (odd sizes, stride larger than the
//! kernel, dilation, groups and depthwise, padding on one side), on the CPU
//! fused and unfused and on the reference interpreter; the kernels a
//! convolution with bias and relu compiles to; and the errors of shapes
//! that do not fit.

mod conv_transpose;
mod pools;

use kiln::{
    CompileOptions, DType, Data, Device, Options, Pool2d, Result, Tensor, TensorType, compile_with,
};
use kiln_runtime::cpu::Activation;
use kiln_support::gradcheck::Rng;

/// Where a case runs: the CPU fused, the CPU unfused, the interpreter.
const RUNS: [(Device, bool); 3] = [
    (Device::Cpu, true),
    (Device::Cpu, false),
    (Device::Reference, true),
];

fn floats(data: &Data) -> Vec<f32> {
    match data {
        Data::F32(v) => v.clone(),
        other => panic!("expected f32 data, got {other:?}"),
    }
}

/// `f` compiled for `device` over inputs of `shapes`, run on `values`.
fn run(
    device: Device,
    fusion: bool,
    inputs: &[(Vec<usize>, Vec<f32>)],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Vec<f32>> {
    let specs: Vec<TensorType> = inputs
        .iter()
        .map(|(d, _)| TensorType::new(DType::F32, d.as_slice()))
        .collect();
    let mut g = compile_with(
        "conv",
        &specs,
        CompileOptions {
            device,
            optimizer: Options {
                fusion,
                ..Options::default()
            },
            ..CompileOptions::default()
        },
        |t| Ok(vec![f(t)?]),
    )?;
    let data: Vec<Data> = inputs.iter().map(|(_, v)| Data::F32(v.clone())).collect();
    let refs: Vec<&Data> = data.iter().collect();
    Ok(floats(&g.run(&refs)?[0]))
}

/// Checks `f` on every run against `want`, to `|a-b| <= 1e-4 max(1, |b|)`:
/// sums of up to a few hundred products of values of order one, in f32.
fn check_all(
    what: &str,
    inputs: &[(Vec<usize>, Vec<f32>)],
    want: &[f32],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<()> {
    for (device, fusion) in RUNS {
        let got = run(device, fusion, inputs, f)?;
        assert_eq!(got.len(), want.len(), "{what} on {device:?}: length");
        for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
            let ok = if b.is_nan() {
                a.is_nan()
            } else {
                (a - b).abs() <= 1e-4 * b.abs().max(1.0)
            };
            assert!(
                ok,
                "{what} on {device:?} (fusion {fusion}): element {i}: got {a}, want {b}"
            );
        }
    }
    Ok(())
}

/// One convolution's parameters.
#[derive(Clone, Copy, Debug)]
struct Conv {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    k: [usize; 2],
    stride: [usize; 2],
    pad: [(usize, usize); 2],
    dil: [usize; 2],
    groups: usize,
}

/// The output size along one axis, floor mode.
fn out_len(len: usize, k: usize, s: usize, (p0, p1): (usize, usize), d: usize) -> usize {
    (len + p0 + p1 - d * (k - 1) - 1) / s + 1
}

/// The convolution as the definition says it, in f64.
fn conv_loop(p: &Conv, x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f32> {
    let oh = out_len(p.h, p.k[0], p.stride[0], p.pad[0], p.dil[0]);
    let ow = out_len(p.w, p.k[1], p.stride[1], p.pad[1], p.dil[1]);
    let (cg, og) = (p.c / p.groups, p.o / p.groups);
    let mut out = Vec::new();
    for n in 0..p.n {
        for o in 0..p.o {
            let g = o / og;
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = b.map_or(0.0, |b| f64::from(b[o]));
                    for c in 0..cg {
                        for ki in 0..p.k[0] {
                            for kj in 0..p.k[1] {
                                let y = (i * p.stride[0] + ki * p.dil[0]) as isize
                                    - p.pad[0].0 as isize;
                                let xx = (j * p.stride[1] + kj * p.dil[1]) as isize
                                    - p.pad[1].0 as isize;
                                if y < 0 || xx < 0 || y >= p.h as isize || xx >= p.w as isize {
                                    continue;
                                }
                                let ch = g * cg + c;
                                let xv = x[((n * p.c + ch) * p.h + y as usize) * p.w + xx as usize];
                                let wv = w[((o * cg + c) * p.k[0] + ki) * p.k[1] + kj];
                                acc += f64::from(xv) * f64::from(wv);
                            }
                        }
                    }
                    out.push(acc as f32);
                }
            }
        }
    }
    out
}

fn conv_case(p: Conv, bias: bool, seed: u64) -> Result<()> {
    let mut rng = Rng(seed);
    let x = rng.fill(p.n * p.c * p.h * p.w, |r| r.uniform(-1.0, 1.0));
    let w = rng.fill(p.o * (p.c / p.groups) * p.k[0] * p.k[1], |r| {
        r.uniform(-1.0, 1.0)
    });
    let b = rng.fill(p.o, |r| r.uniform(-1.0, 1.0));
    let want = conv_loop(&p, &x, &w, bias.then_some(b.as_slice()));
    let mut inputs = vec![
        (vec![p.n, p.c, p.h, p.w], x),
        (vec![p.o, p.c / p.groups, p.k[0], p.k[1]], w),
    ];
    if bias {
        inputs.push((vec![p.o], b));
    }
    check_all(&format!("{p:?}"), &inputs, &want, &|t| {
        t[0].conv2d(&t[1], t.get(2), p.stride, p.pad, p.dil, p.groups)
    })
}

const BASE: Conv = Conv {
    n: 2,
    c: 3,
    h: 7,
    w: 5,
    o: 4,
    k: [3, 3],
    stride: [1, 1],
    pad: [(1, 1), (1, 1)],
    dil: [1, 1],
    groups: 1,
};

#[test]
fn conv2d_odd_sizes_with_bias() -> Result<()> {
    conv_case(BASE, true, 1)
}

#[test]
fn conv2d_batch_of_one_without_padding() -> Result<()> {
    conv_case(
        Conv {
            n: 1,
            h: 9,
            w: 6,
            pad: [(0, 0); 2],
            ..BASE
        },
        false,
        2,
    )
}

#[test]
fn conv2d_stride_larger_than_the_kernel() -> Result<()> {
    conv_case(
        Conv {
            h: 11,
            w: 13,
            k: [2, 3],
            stride: [3, 4],
            pad: [(0, 0), (1, 1)],
            ..BASE
        },
        true,
        3,
    )
}

#[test]
fn conv2d_dilation_and_padding_on_one_side() -> Result<()> {
    conv_case(
        Conv {
            h: 10,
            w: 9,
            o: 5,
            k: [3, 2],
            stride: [1, 2],
            pad: [(2, 0), (0, 3)],
            dil: [2, 3],
            ..BASE
        },
        true,
        4,
    )
}

#[test]
fn conv2d_groups() -> Result<()> {
    conv_case(
        Conv {
            c: 6,
            h: 6,
            w: 7,
            o: 4,
            groups: 2,
            ..BASE
        },
        true,
        5,
    )
}

#[test]
fn conv2d_depthwise_and_depth_multiplier() -> Result<()> {
    let depthwise = Conv {
        n: 3,
        c: 5,
        o: 5,
        groups: 5,
        stride: [2, 2],
        pad: [(1, 0), (1, 1)],
        ..BASE
    };
    conv_case(depthwise, true, 6)?;
    conv_case(Conv { o: 10, ..depthwise }, false, 7)?;
    // Wide enough for the middle of each row to run in vectors: stride-2
    // reads of the input in place, through its padding.
    let wide = Conv {
        h: 9,
        w: 37,
        ..depthwise
    };
    conv_case(wide, true, 17)
}

/// Depthwise convolutions of the windows whose sums the CPU hands to its
/// machine kernel (3x3, 5x5, 7x7), at both strides, asymmetric padding and
/// dilation, with what follows them in models (a bias, then ReLU6,
/// hardswish or nothing; ReLU6 or a cap without a bias) fused after the
/// sum: the interpreter's values, bit
/// for bit, as the generated code's were. (SiLU is left out: the CPU's
/// sigmoid is within 2 ulp of the interpreter's, not equal to it.)
#[test]
fn depthwise_sums_are_the_interpreters_bit_for_bit() -> Result<()> {
    type Tail = fn(Tensor) -> Result<Tensor>;
    // Each with the bias or without it, and the ReLU and cap the machine
    // kernel applies itself (where they are all that follows the sum, as
    // ONNX's Clip imports ReLU6: a max with +0, then a min).
    let none = Activation::NONE;
    let relu6 = Activation {
        relu: true,
        cap: Some(6.0),
    };
    let capped = Activation {
        relu: false,
        cap: Some(2.5),
    };
    let tails: [(&str, bool, Tail, Activation); 5] = [
        ("none", true, Ok, none),
        ("relu6", true, |y| y.clamp(0.0, 6.0), none),
        (
            "relu6 without a bias",
            false,
            |y| (y.maximum(&Tensor::scalar(0.0f32))?).minimum(&Tensor::scalar(6.0f32)),
            relu6,
        ),
        (
            "a cap without a bias",
            false,
            |y| y.minimum(&Tensor::scalar(2.5f32)),
            capped,
        ),
        (
            "hardswish",
            true,
            |y| {
                let gate = y.add(&Tensor::scalar(3.0f32))?.clamp(0.0, 6.0)?;
                y.mul(&gate.div(&Tensor::scalar(6.0f32))?)
            },
            none,
        ),
    ];
    let cases = [
        (3, [1, 1], [(1, 1), (1, 1)], [1, 1], [2, 7, 23, 19]),
        (3, [1, 1], [(0, 2), (2, 1)], [1, 1], [1, 11, 9, 13]),
        (3, [2, 2], [(1, 0), (0, 1)], [1, 1], [1, 5, 30, 41]),
        (3, [1, 1], [(2, 2), (2, 2)], [2, 2], [1, 3, 12, 35]),
        (5, [2, 2], [(2, 2), (2, 2)], [1, 1], [2, 4, 17, 26]),
        (5, [1, 1], [(2, 2), (2, 2)], [1, 1], [1, 3, 7, 7]),
        (7, [1, 2], [(3, 3), (3, 3)], [1, 1], [1, 2, 15, 50]),
    ];
    for (seed, (k, stride, pad, dil, [n, c, h, w])) in cases.into_iter().enumerate() {
        let mut rng = Rng(seed as u64 + 40);
        let x = rng.fill(n * c * h * w, |r| r.uniform(-2.0, 2.0));
        let wt = rng.fill(c * k * k, |r| r.uniform(-1.0, 1.0));
        let b = rng.fill(c, |r| r.uniform(-1.0, 1.0));
        let inputs = [(vec![n, c, h, w], x), (vec![c, 1, k, k], wt), (vec![c], b)];
        for (name, bias, tail, activation) in tails {
            let f = |t: &[Tensor]| {
                let bias = t.get(2).filter(|_| bias);
                tail(t[0].conv2d(&t[1], bias, stride, pad, dil, c)?)
            };
            // The CPU takes this sum by its machine kernel, and the
            // activation where there is one alone.
            let dims = [inputs[0].0.as_slice(), &inputs[1].0, &inputs[2].0];
            let t: Vec<Tensor> = (dims.iter().enumerate())
                .map(|(i, d)| Tensor::randn(*d, i as u64))
                .collect::<Result<_>>()?;
            let optimized = kiln::optimize("dw", &[&f(&t)?], Options::default())?;
            let taps = (optimized.schedule.launches.iter())
                .filter_map(|l| match &optimized.graph.node(l.node).op {
                    kiln_ir::Op::Kernel(kernel) => kiln_runtime::cpu::taps_of(kernel),
                    _ => None,
                })
                .collect::<Vec<_>>();
            let want = [(k * k, activation)];
            assert_eq!(taps, want, "{k}x{k} s{stride:?} d{dil:?} {name}");
            let got = run(Device::Cpu, true, &inputs, &f)?;
            let want = run(Device::Reference, true, &inputs, &f)?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "{k}x{k} s{stride:?} d{dil:?} {name}"
            );
        }
    }
    Ok(())
}

#[test]
fn conv2d_many_channels_by_im2col() -> Result<()> {
    // 16 channels x 9 positions: above the multiply-and-sum's limit.
    conv_case(
        Conv {
            c: 16,
            h: 6,
            w: 5,
            o: 7,
            pad: [(1, 2), (0, 1)],
            ..BASE
        },
        true,
        8,
    )?;
    conv_case(
        Conv {
            c: 12,
            o: 6,
            groups: 2,
            dil: [2, 1],
            ..BASE
        },
        false,
        9,
    )
}

#[test]
fn conv2d_one_by_one() -> Result<()> {
    conv_case(
        Conv {
            k: [1, 1],
            pad: [(0, 0); 2],
            ..BASE
        },
        true,
        10,
    )
}

/// Max or average pooling as the definition says it.
fn pool_loop(dims: [usize; 4], x: &[f32], p: &Pool2d, avg: Option<bool>) -> Vec<f32> {
    let [n, c, h, w] = dims;
    let oh = pools::pool_len(
        h,
        p.kernel[0],
        p.stride[0],
        p.padding[0],
        p.dilation[0],
        p.ceil_mode,
    );
    let ow = pools::pool_len(
        w,
        p.kernel[1],
        p.stride[1],
        p.padding[1],
        p.dilation[1],
        p.ceil_mode,
    );
    let mut out = Vec::new();
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let (mut max, mut sum, mut count) = (f32::NEG_INFINITY, 0.0f64, 0usize);
                for ki in 0..p.kernel[0] {
                    for kj in 0..p.kernel[1] {
                        let y = (i * p.stride[0] + ki * p.dilation[0]) as isize
                            - p.padding[0].0 as isize;
                        let xx = (j * p.stride[1] + kj * p.dilation[1]) as isize
                            - p.padding[1].0 as isize;
                        let in_pad = y < h as isize + p.padding[0].1 as isize
                            && xx < w as isize + p.padding[1].1 as isize;
                        if y < 0 || xx < 0 || y >= h as isize || xx >= w as isize {
                            if avg == Some(true) && in_pad {
                                count += 1;
                            }
                            continue;
                        }
                        let v = x[(plane * h + y as usize) * w + xx as usize];
                        max = max.max(v);
                        sum += f64::from(v);
                        count += 1;
                    }
                }
                out.push(match avg {
                    None => max,
                    Some(_) => (sum / count as f64) as f32,
                });
            }
        }
    }
    out
}

fn pool_case(dims: [usize; 4], p: Pool2d, seed: u64) -> Result<()> {
    let x = Rng(seed).fill(dims.iter().product(), |r| r.uniform(-2.0, 2.0));
    let inputs = [(dims.to_vec(), x.clone())];
    check_all(
        &format!("max {p:?}"),
        &inputs,
        &pool_loop(dims, &x, &p, None),
        &|t| t[0].max_pool2d(&p),
    )?;
    for include in [false, true] {
        let want = pool_loop(dims, &x, &p, Some(include));
        check_all(&format!("avg {include} {p:?}"), &inputs, &want, &|t| {
            t[0].avg_pool2d(&p, include)
        })?;
    }
    Ok(())
}

#[test]
fn pooling_plain_strided_and_one_sided() -> Result<()> {
    pool_case([2, 3, 7, 9], Pool2d::new([2, 2]), 11)?;
    pool_case(
        [1, 2, 8, 5],
        Pool2d {
            stride: [3, 1],
            padding: [(1, 0), (0, 2)],
            ..Pool2d::new([3, 3])
        },
        12,
    )?;
    // ResNet's 3x3/2 with padding, wide enough for vectors in each row.
    pool_case(
        [2, 3, 9, 37],
        Pool2d {
            stride: [2, 2],
            padding: [(1, 1); 2],
            ..Pool2d::new([3, 3])
        },
        14,
    )?;
    // Stride larger than the window.
    pool_case(
        [3, 1, 10, 11],
        Pool2d {
            stride: [4, 3],
            ..Pool2d::new([2, 2])
        },
        13,
    )
}

#[test]
fn pooling_ceil_mode_and_dilation() -> Result<()> {
    pool_case(
        [2, 2, 7, 8],
        Pool2d {
            stride: [2, 2],
            padding: [(1, 1), (1, 1)],
            ceil_mode: true,
            ..Pool2d::new([3, 3])
        },
        14,
    )?;
    pool_case(
        [1, 3, 9, 10],
        Pool2d {
            stride: [2, 3],
            padding: [(0, 1), (1, 0)],
            dilation: [2, 2],
            ceil_mode: true,
            ..Pool2d::new([2, 3])
        },
        15,
    )
}

#[test]
fn pooling_large_windows_along_width_then_height() -> Result<()> {
    pool_case(
        [2, 2, 20, 23],
        Pool2d {
            stride: [3, 2],
            padding: [(2, 1), (0, 4)],
            dilation: [2, 3],
            ceil_mode: true,
            ..Pool2d::new([6, 5])
        },
        16,
    )
}

#[test]
fn conv2d_bias_relu_is_one_kernel_after_storing_the_padded_input() -> Result<()> {
    let specs = [
        TensorType::new(DType::F32, [4, 3, 9, 9]),
        TensorType::new(DType::F32, [8, 3, 3, 3]),
        TensorType::new(DType::F32, [8]),
    ];
    let g = kiln::compile("conv_bias_relu", &specs, |t| {
        Ok(vec![
            t[0].conv2d(&t[1], Some(&t[2]), [1, 1], [(1, 1); 2], [1, 1], 1)?
                .relu()?,
        ])
    })?;
    // The padded input, then the products, the bias and relu in one pass.
    assert_eq!(g.optimized().schedule.kernels(), 2);
    Ok(())
}

#[test]
fn shapes_that_do_not_fit_are_errors_naming_the_op() -> Result<()> {
    let x = Tensor::zeros([1, 4, 5, 5], DType::F32)?;
    let msg = |r: Result<Tensor>| r.map(|_| ()).unwrap_err().to_string();
    let w = Tensor::zeros([2, 3, 3, 3], DType::F32)?;
    let e = msg(x.conv2d(&w, None, [1, 1], [(0, 0); 2], [1, 1], 1));
    assert!(
        e.starts_with("conv2d:") && e.contains("[1, 4, 5, 5]") && e.contains("[2, 3, 3, 3]"),
        "{e}"
    );
    let w = Tensor::zeros([3, 2, 3, 3], DType::F32)?;
    let e = msg(x.conv2d(&w, None, [1, 1], [(0, 0); 2], [1, 1], 2));
    assert!(e.contains("2 groups do not divide"), "{e}");
    let w = Tensor::zeros([2, 4, 7, 3], DType::F32)?;
    let e = msg(x.conv2d(&w, None, [1, 1], [(1, 0); 2], [1, 1], 1));
    assert!(e.contains("height") && e.contains("more than the 6"), "{e}");
    let e = msg(x.conv2d(
        &w,
        Some(&Tensor::zeros([3], DType::F32)?),
        [1, 1],
        [(1, 1); 2],
        [1, 1],
        1,
    ));
    assert!(e.contains("bias"), "{e}");
    let e = msg(x.reshape([4, 5, 5])?.max_pool2d(&Pool2d::new([2, 2])));
    assert!(e.starts_with("max_pool2d:") && e.contains("rank 4"), "{e}");
    let e = msg(x.avg_pool2d(
        &Pool2d {
            padding: [(2, 0), (0, 0)],
            ..Pool2d::new([2, 2])
        },
        true,
    ));
    assert!(e.starts_with("avg_pool2d:") && e.contains("padding"), "{e}");
    let e = msg(x.max_pool2d(&Pool2d {
        stride: [0, 1],
        ..Pool2d::new([2, 2])
    }));
    assert!(e.contains("stride 0"), "{e}");
    Ok(())
}
