//! bf16 and f16 tensors: every cast into and out of them rounds to nearest
//! even (checked against the `half` crate's conversions, bit for bit, on
//! every f32 class: zeros, subnormals of both widths, ties, the largest
//! finite values and past them, infinities, NaN), and ops on them compute
//! in f32 and round at their result, on the CPU as on the interpreter,
//! fused and unfused, at awkward sizes.

use kiln::{CompileOptions, DType, Device, Options, Result, Scalar, Tensor, TensorType, bf16, f16};

/// f32 values of every class, with both signs.
fn awkward_f32() -> Vec<f32> {
    let mut v = vec![
        0.0,
        1.0,
        1.5,
        3.0e-8,  // below f16's smallest subnormal (2^-24 = 5.96e-8)
        2.98e-8, // near half of it: rounds to 0 or to it
        5.96e-8,
        6.1e-5, // near f16's smallest normal (2^-14)
        65504.0,
        65519.0, // rounds down to f16's largest
        65520.0, // rounds to infinity in f16
        1.0e5,
        3.0e38,
        f32::MAX,
        f32::MIN_POSITIVE,
        1.0e-40, // an f32 subnormal
        f32::INFINITY,
        f32::NAN,
    ];
    // Ties of bf16 (the 16 dropped bits exactly 0x8000) with even and odd
    // kept parts, and one past each; the same for f16 at 13 bits.
    for bits in [
        0x3f80_8000u32,
        0x3f81_8000,
        0x3f80_8001,
        0x3f80_1000,
        0x3f80_3000,
        0x3f80_1001,
    ] {
        v.push(f32::from_bits(bits));
    }
    // Steps through f16's subnormal range, where ties fall on 2^-25.
    for k in 0..40 {
        v.push(k as f32 * 2f32.powi(-26));
    }
    let negated: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(negated);
    v
}

fn same_bits_or_nan(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// Every device and fusion a graph runs on here: realized on the CPU and
/// the interpreter, compiled fused and unfused on the CPU.
fn every_path(
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for device in [Device::Cpu, Device::Reference] {
        let moved: Vec<Tensor> = inputs.iter().map(|t| t.to(device)).collect::<Result<_>>()?;
        out.push((format!("{device:?}"), f(&moved)?));
    }
    let specs: Vec<TensorType> = inputs
        .iter()
        .map(|t| TensorType::new(t.dtype(), t.shape().clone()))
        .collect();
    for fusion in [true, false] {
        let options = CompileOptions {
            optimizer: Options {
                fusion,
                ..Options::default()
            },
            ..CompileOptions::default()
        };
        let mut graph = kiln::compile_with("half", &specs, options, |x| Ok(vec![f(x)?]))?;
        let refs: Vec<&Tensor> = inputs.iter().collect();
        out.push((
            format!("compiled, fusion {fusion}"),
            graph.call(&refs)?.remove(0),
        ));
    }
    Ok(out)
}

/// The f32 value of each element of a 16-bit or f32 tensor.
fn as_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(match t.dtype() {
        DType::BF16 => t.to_vec::<bf16>()?.into_iter().map(bf16::to_f32).collect(),
        DType::F16 => t.to_vec::<f16>()?.into_iter().map(f16::to_f32).collect(),
        DType::F32 => t.to_vec::<f32>()?,
        other => panic!("as_f32 of {other}"),
    })
}

#[test]
fn casts_from_f32_round_to_nearest_even_as_the_half_crate_does() -> Result<()> {
    let v = awkward_f32();
    let n = v.len();
    let x = Tensor::from_vec(v.clone(), [n])?;
    for dtype in [DType::BF16, DType::F16] {
        let want: Vec<f32> = match dtype {
            DType::BF16 => v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
            _ => v.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
        };
        for (path, got) in every_path(std::slice::from_ref(&x), |t| t[0].cast(dtype))? {
            assert_eq!(got.dtype(), dtype);
            same_bits_or_nan(&format!("f32 -> {dtype}, {path}"), &as_f32(&got)?, &want);
            // And back to f32: exactly the 16-bit value.
            let back = got.cast(DType::F32)?;
            same_bits_or_nan(&format!("{dtype} -> f32, {path}"), &as_f32(&back)?, &want);
        }
    }
    Ok(())
}

#[test]
fn casts_from_f64_and_integers_round_once() -> Result<()> {
    // Just above a bf16 tie by less than f32 resolves: rounding to f32
    // first would land on the tie and round down to even.
    let above_tie = f64::from(f32::from_bits(0x3f80_8000)) + 1e-12;
    let f64s = vec![
        above_tie,
        -above_tie,
        1.0 / 3.0,
        1e300,
        -1e-300,
        f64::NAN,
        65519.999,
    ];
    let ints: Vec<i64> = vec![
        0,
        1,
        -1,
        257,
        16_777_217,
        2049,
        -2049,
        i64::from(i32::MAX),
        65_520,
    ];
    let cases = [
        (Tensor::from_vec(f64s.clone(), [f64s.len()])?, f64s.clone()),
        (
            Tensor::from_vec(ints.clone(), [ints.len()])?,
            ints.iter().map(|&i| i as f64).collect(),
        ),
        (
            Tensor::from_vec(
                ints.iter().map(|&i| i as i32).collect::<Vec<_>>(),
                [ints.len()],
            )?,
            ints.iter().map(|&i| f64::from(i as i32)).collect(),
        ),
    ];
    for (x, exact) in cases {
        for dtype in [DType::BF16, DType::F16] {
            let want: Vec<f32> = exact
                .iter()
                .map(|&e| Scalar::F64(e).cast(dtype).to_f64() as f32)
                .collect();
            // The reference rounding is direct: above the tie goes up.
            if dtype == DType::BF16 && x.dtype() == DType::F64 {
                assert_eq!(want[0].to_bits(), 0x3f81_0000, "the oracle rounds once");
            }
            for (path, got) in every_path(std::slice::from_ref(&x), |t| t[0].cast(dtype))? {
                let what = format!("{} -> {dtype}, {path}", x.dtype());
                same_bits_or_nan(&what, &as_f32(&got)?, &want);
            }
        }
    }
    Ok(())
}

#[test]
fn elementwise_ops_on_halves_round_at_each_result() -> Result<()> {
    for dtype in [DType::BF16, DType::F16] {
        for n in [1usize, 7, 50, 1027] {
            let a = Tensor::randn([n], 3)?.cast(dtype)?;
            let b = (Tensor::randn([n], 4)?.abs()? + 0.5f32)?.cast(dtype)?;
            let f = |t: &[Tensor]| -> Result<Tensor> {
                let s = (&t[0] * &t[1])?;
                let q = (&s / &t[1])?;
                let r = (q + &t[0])?.relu()?;
                // A where of halves, and a comparison of them.
                let keep = t[0].gt(&t[1])?;
                keep.where_cond(&r, &t[1].sqrt()?)
            };
            let paths = every_path(&[a, b], f)?;
            let want = as_f32(&paths[1].1)?;
            for (path, got) in &paths {
                assert_eq!(got.dtype(), dtype, "{dtype} [{n}], {path}");
                same_bits_or_nan(&format!("{dtype} [{n}], {path}"), &as_f32(got)?, &want);
            }
        }
    }
    Ok(())
}

#[test]
fn sums_and_matmuls_of_halves_accumulate_in_f32() -> Result<()> {
    for dtype in [DType::BF16, DType::F16] {
        let x = Tensor::randn([37, 129], 5)?.cast(dtype)?;
        let w = Tensor::randn([129, 21], 6)?.cast(dtype)?;
        let f = |t: &[Tensor]| -> Result<Tensor> {
            let y = t[0].matmul(&t[1])?;
            let s = t[0].sum(&[1], true)?;
            (y + s)?.exp()?.log()
        };
        let paths = every_path(&[x, w], f)?;
        let want = as_f32(&paths[1].1)?;
        // A sum of 129 products in f32 against the interpreter's f64, then
        // one rounding to the 16-bit type: at most one unit apart there.
        let unit = if dtype == DType::BF16 {
            2f32.powi(-8)
        } else {
            2f32.powi(-11)
        };
        for (path, got) in &paths {
            assert_eq!(got.dtype(), dtype, "{dtype}, {path}");
            for (i, (g, w)) in as_f32(got)?.iter().zip(&want).enumerate() {
                // Infinities (exp past f16's 65504) and zeros (log of one
                // that underflowed) are equal or not at all.
                assert!(
                    g == w || (g - w).abs() <= 2.0 * unit * w.abs().max(1.0),
                    "{dtype}, {path}: element {i}: got {g}, want {w}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn half_tensors_round_trip_through_the_host() -> Result<()> {
    let v: Vec<bf16> = [1.0f32, -2.5, 3.0e38, f32::INFINITY]
        .map(bf16::from_f32)
        .to_vec();
    let t = Tensor::from_vec(v.clone(), [2, 2])?;
    assert_eq!(t.dtype(), DType::BF16);
    assert_eq!(t.to_vec::<bf16>()?, v);
    let h: Vec<f16> = [0.5f32, -65504.0, 6.0e-8].map(f16::from_f32).to_vec();
    let t = Tensor::from_vec(h.clone(), [3])?;
    assert_eq!(t.to_vec::<f16>()?, h);
    assert_eq!(
        format!("{}", TensorType::new(DType::BF16, [2, 3])),
        "bf16[2,3]"
    );
    Ok(())
}

/// A function of one tensor, as the cases below name them.
type Unary<'a> = &'a dyn Fn(&Tensor) -> Result<Tensor>;

#[test]
fn softmax_norms_and_means_of_halves_round_once() -> Result<()> {
    // Computed in f32 and rounded at the end, as PyTorch computes them:
    // bit for bit the f32 result cast, where rounding each step to 16 bits
    // was two units off on ONNX's fp16 attention tests.
    for dtype in [DType::BF16, DType::F16] {
        let x = Tensor::randn([9, 67], 7)?.cast(dtype)?;
        let w = Tensor::randn([67], 8)?.cast(dtype)?;
        let b = Tensor::randn([67], 9)?.cast(dtype)?;
        let cases: [(&str, Unary); 5] = [
            ("softmax", &|t| t.softmax(-1)),
            ("log_softmax", &|t| t.log_softmax(-1)),
            ("mean", &|t| t.mean(&[1], true)),
            ("logsumexp", &|t| t.logsumexp(&[1], false)),
            ("layer_norm", &|t| {
                t.layer_norm(&w.cast(t.dtype())?, &b.cast(t.dtype())?, 1e-5)
            }),
        ];
        for (what, f) in cases {
            let got = f(&x)?;
            assert_eq!(got.dtype(), dtype, "{what}");
            let want = f(&x.cast(DType::F32)?)?.cast(dtype)?;
            same_bits_or_nan(
                &format!("{what} of {dtype}"),
                &as_f32(&got)?,
                &as_f32(&want)?,
            );
        }
    }
    Ok(())
}

#[test]
fn a_gather_of_halves_outside_the_table_reads_nan() -> Result<()> {
    for dtype in [DType::BF16, DType::F16] {
        let table = Tensor::randn([5, 3], 11)?.cast(dtype)?;
        let ids = Tensor::from_vec(vec![0i64, -1, 5, 7, 2], [5])?;
        let want = as_f32(&table)?;
        for (path, got) in every_path(&[table, ids], |t| t[0].index_select(0, &t[1]))? {
            let got = as_f32(&got)?;
            for (k, row) in [Some(0), Some(4), None, None, Some(2)]
                .into_iter()
                .enumerate()
            {
                for c in 0..3 {
                    let g = got[k * 3 + c];
                    match row {
                        Some(r) => assert_eq!(g.to_bits(), want[r * 3 + c].to_bits(), "{path}"),
                        None => assert!(g.is_nan(), "{dtype}, {path}: id {k} read {g}"),
                    }
                }
            }
        }
    }
    Ok(())
}
