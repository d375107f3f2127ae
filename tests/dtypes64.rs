//! The 64-bit dtypes, i64 and f64, against the reference interpreter: the
//! interpreter itself exact in i64 (values beyond 2^31 and 2^53 included)
//! and IEEE in f64, then the CPU backend, fused and unfused, on
//! elementwise ops, comparisons, `where`, reductions and casts between
//! every pair of dtypes, over awkward shapes (rank 0, empty, odd sizes,
//! broadcasting).
//!
//! i64 results and f64 arithmetic that IEEE rounds once (`+ - * /`, sqrt,
//! max/min, comparisons, casts) must agree bit for bit; f64's exp, log,
//! tanh, sigmoid and pow call the same Rust functions on both sides and
//! must too; f64 sums may differ in order only, within 1e-12 relative to
//! the larger of the two results.
//!
//! Matrix products of f64, i32 and i64 against the definition (wrapping
//! for the integers); f64 training is `train_f64.rs`'s.

mod f64s;

use f64s::{close, naive_matmul, normals};
use kiln::{CompileOptions, DType, Data, Device, Options, Result, Scalar, Tensor, TensorType};
use kiln_support::data;
use kiln_support::gradcheck::Rng;

/// An op under test, on its inputs.
type Op = fn(&[Tensor]) -> Result<Tensor>;

/// Shapes with vector tails, thread splits, rank 0 and no elements.
const SHAPES: [&[usize]; 7] = [&[], &[0], &[1], &[3], &[7, 3], &[50], &[1027]];

/// i64 values of every size: small ones (which collide, for comparisons
/// and ties), ones beyond i32, and the extremes.
fn i64s(n: usize, seed: u64) -> Vec<i64> {
    let mut w = Rng(seed);
    let specials = [i64::MIN, i64::MAX, 0, -1, 1 << 40, -(1 << 33) - 5];
    (0..n)
        .map(|i| match w.next_u64() % 4 {
            0 => specials[i % specials.len()],
            1 => (w.next_u64() % 7) as i64 - 3,
            2 => (w.next_u64() as i64) >> 20,
            _ => w.next_u64() as i64,
        })
        .collect()
}

/// f64 values: normal ones, ones beyond f32's range and precision, and
/// NaN, infinities and signed zeros.
fn f64s(n: usize, seed: u64) -> Vec<f64> {
    let mut w = Rng(seed);
    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1e300];
    (0..n)
        .map(|i| match w.next_u64() % 8 {
            0 => specials[i % specials.len()],
            1 => ((w.next_u64() % 5) as f64 - 2.0) * 0.5,
            2 => (w.next_u64() as i64 >> 11) as f64 * 1e-3,
            _ => (w.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0,
        })
        .collect()
}

/// A tensor of `dtype` and `dims` with seeded values.
fn input(dtype: DType, dims: &[usize], seed: u64) -> Result<Tensor> {
    let n = dims.iter().product();
    match dtype {
        DType::I64 => Tensor::from_vec(i64s(n, seed), dims),
        DType::F64 => Tensor::from_vec(f64s(n, seed), dims),
        other => {
            // The 32-bit and narrower types from i64 values, wrapped, and
            // f32 from f64 values, rounded: specials included.
            let wide = match other {
                DType::F32 | DType::BF16 | DType::F16 => Tensor::from_vec(f64s(n, seed), dims)?,
                _ => Tensor::from_vec(i64s(n, seed), dims)?,
            };
            wide.cast(other)
        }
    }
}

/// `f` on `inputs`, compiled for `device` with fusion on or off.
fn run(
    device: Device,
    fusion: bool,
    inputs: &[Tensor],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Data> {
    let specs: Vec<TensorType> = inputs
        .iter()
        .map(|t| TensorType::new(t.dtype(), t.dims()))
        .collect();
    let options = Options {
        fusion,
        ..Options::default()
    };
    let mut graph = kiln::compile_with(
        "dtypes64",
        &specs,
        CompileOptions {
            device,
            optimizer: options,
            ..CompileOptions::default()
        },
        |x| Ok(vec![f(x)?]),
    )?;
    let out = graph.call(&inputs.iter().collect::<Vec<_>>())?;
    data(&out[0])
}

/// Whether two elements are the same: bit for bit (NaNs match NaNs), or
/// for floats within `rtol` of the larger magnitude, at least `atol`.
fn same(a: Scalar, b: Scalar, rtol: f64, atol: f64) -> bool {
    match (a, b) {
        (Scalar::F64(x), Scalar::F64(y)) => {
            (x.is_nan() && y.is_nan())
                || x.to_bits() == y.to_bits()
                || (rtol > 0.0 && (x - y).abs() <= (rtol * x.abs().max(y.abs())).max(atol))
        }
        (Scalar::F32(x), Scalar::F32(y)) => {
            (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits()
        }
        _ => a == b,
    }
}

/// `f` on the CPU, fused and unfused, against the interpreter.
fn check(
    what: &str,
    inputs: &[Tensor],
    rtol: f64,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<()> {
    let want = run(Device::Reference, true, inputs, &f)?;
    for fusion in [true, false] {
        let got = run(Device::Cpu, fusion, inputs, &f)?;
        assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
        assert_eq!(got.len(), want.len(), "{what}: length");
        for i in 0..got.len() {
            let (a, b) = (got.get(i), want.get(i));
            assert!(
                same(a, b, rtol, rtol),
                "{what} (fusion {fusion}): element {i}: cpu {a}, reference {b}"
            );
        }
    }
    Ok(())
}

#[test]
fn the_interpreter_computes_i64_exactly_beyond_i32() -> Result<()> {
    let big = 3_000_000_000i64;
    let a = Tensor::from_vec(vec![big, i64::MAX, -big, 1 << 53], [4])?.to(Device::Reference)?;
    let b = Tensor::from_vec(vec![5_000_000_007i64, 2, big, 1], [4])?.to(Device::Reference)?;
    assert_eq!(
        a.add(&b)?.to_vec::<i64>()?,
        [8_000_000_007, i64::MIN + 1, 0, (1 << 53) + 1]
    );
    assert_eq!(
        a.mul(&b)?.to_vec::<i64>()?,
        [big.wrapping_mul(5_000_000_007), -2, -big * big, 1 << 53]
    );
    // 2^53 + 1 is no f64: computed through floats it would compare equal.
    let next = Tensor::scalar((1i64 << 53) + 1).to(Device::Reference)?;
    let even = Tensor::scalar(1i64 << 53).to(Device::Reference)?;
    assert!(next.gt(&even)?.to_scalar::<bool>()?);
    assert_eq!(
        a.sum(&[0], false)?.to_scalar::<i64>()?,
        big.wrapping_add(i64::MAX)
            .wrapping_sub(big)
            .wrapping_add(1 << 53)
    );
    assert_eq!(a.max(&[0], false)?.to_scalar::<i64>()?, i64::MAX);
    assert_eq!(a.neg()?.to_vec::<i64>()?[1], -i64::MAX);
    assert_eq!(
        Tensor::scalar(i64::MIN)
            .to(Device::Reference)?
            .abs()?
            .to_scalar::<i64>()?,
        i64::MIN
    );
    Ok(())
}

#[test]
fn the_interpreter_computes_f64_in_f64() -> Result<()> {
    let x = Tensor::from_vec(vec![0.1f64, 1e-300, 1e300, 2.0], [4])?.to(Device::Reference)?;
    let y = Tensor::from_vec(vec![0.2f64, 3.0, 10.0, 0.5], [4])?.to(Device::Reference)?;
    assert_eq!(
        x.add(&y)?.to_vec::<f64>()?,
        [0.1 + 0.2, 1e-300 + 3.0, 1e300 + 10.0, 2.5]
    );
    assert_eq!(x.mul(&y)?.to_vec::<f64>()?[1], 3e-300);
    let e = x.exp()?.to_vec::<f64>()?;
    assert!((e[0] - 0.1f64.exp()).abs() <= 1e-12 * e[0]);
    assert_eq!(x.sqrt()?.to_vec::<f64>()?[3], 2.0f64.sqrt());
    assert_eq!(x.pow(&y)?.to_vec::<f64>()?[3], 2.0f64.sqrt());
    let total = x.sum(&[0], false)?.to_scalar::<f64>()?;
    assert_eq!(total, 0.1 + 1e-300 + 1e300 + 2.0);
    assert_eq!(
        x.cast(DType::F32)?.to_vec::<f32>()?,
        [0.1f32, 0.0, f32::INFINITY, 2.0]
    );
    Ok(())
}

#[test]
fn i64_values_beyond_i32_round_trip_through_the_cpu() -> Result<()> {
    let values = vec![1i64 << 40, -(1i64 << 35) - 3, i64::MAX, 4_294_967_296];
    let x = Tensor::from_vec(values.clone(), [4])?;
    let one = Tensor::from_vec(vec![1i64; 4], [4])?;
    for fusion in [true, false] {
        let got = run(Device::Cpu, fusion, &[x.clone(), one.clone()], &|t| {
            t[0].add(&t[1])?.sub(&t[1])?.mul(&t[1])
        })?;
        assert_eq!(got, Data::I64(values.clone()), "fusion {fusion}");
        // Through f64 and back: exact below 2^53.
        let got = run(Device::Cpu, fusion, std::slice::from_ref(&x), &|t| {
            t[0].cast(DType::F64)?.cast(DType::I64)
        })?;
        assert_eq!(got.get(0), Scalar::I64(1 << 40), "fusion {fusion}");
        let sum = run(Device::Cpu, fusion, std::slice::from_ref(&x), &|t| {
            t[0].sum(&[0], false)
        })?;
        let want = values.iter().fold(0i64, |a, &v| a.wrapping_add(v));
        assert_eq!(sum, Data::I64(vec![want]), "fusion {fusion}");
    }
    Ok(())
}

#[test]
fn i64_elementwise_ops_match_the_interpreter() -> Result<()> {
    for (k, dims) in SHAPES.iter().enumerate() {
        let seed = k as u64 * 31;
        let (a, b) = (
            input(DType::I64, dims, seed)?,
            input(DType::I64, dims, seed + 1)?,
        );
        let both = [a.clone(), b.clone()];
        let ops: [(&str, Op); 15] = [
            ("add", |t| t[0].add(&t[1])),
            ("sub", |t| t[0].sub(&t[1])),
            ("mul", |t| t[0].mul(&t[1])),
            ("fmod", |t| t[0].fmod(&t[1])),
            ("max", |t| t[0].maximum(&t[1])),
            ("min", |t| t[0].minimum(&t[1])),
            ("neg", |t| t[0].neg()),
            ("abs", |t| t[0].abs()),
            ("relu", |t| t[0].relu()),
            ("lt", |t| t[0].lt(&t[1])),
            ("le", |t| t[0].le(&t[1])),
            ("gt", |t| t[0].gt(&t[1])),
            ("ge", |t| t[0].ge(&t[1])),
            ("eq", |t| t[0].eq(&t[1])),
            ("where", |t| {
                t[0].lt(&t[1])?.where_cond(&t[0], &t[1].mul(&t[1])?)
            }),
        ];
        for (name, op) in ops {
            check(&format!("i64 {name} {dims:?}"), &both, 0.0, op)?;
        }
        // A chain that fuses into one kernel, with a constant beyond i32.
        check(&format!("i64 chain {dims:?}"), &both, 0.0, |t| {
            let big = Tensor::scalar(5_000_000_000i64);
            t[0].mul(&big)?.add(&t[1])?.maximum(&t[1].neg()?)
        })?;
    }
    Ok(())
}

#[test]
fn f64_elementwise_ops_match_the_interpreter() -> Result<()> {
    for (k, dims) in SHAPES.iter().enumerate() {
        let seed = k as u64 * 37 + 5;
        let (a, b) = (
            input(DType::F64, dims, seed)?,
            input(DType::F64, dims, seed + 1)?,
        );
        let both = [a.clone(), b.clone()];
        let ops: [(&str, Op); 22] = [
            ("add", |t| t[0].add(&t[1])),
            ("sub", |t| t[0].sub(&t[1])),
            ("mul", |t| t[0].mul(&t[1])),
            ("div", |t| t[0].div(&t[1])),
            ("fmod", |t| t[0].fmod(&t[1])),
            ("max", |t| t[0].maximum(&t[1])),
            ("min", |t| t[0].minimum(&t[1])),
            ("pow", |t| t[0].abs()?.pow(&t[1])),
            ("neg", |t| t[0].neg()),
            ("abs", |t| t[0].abs()),
            ("relu", |t| t[0].relu()),
            ("sqrt", |t| t[0].sqrt()),
            ("recip", |t| t[0].recip()),
            ("exp", |t| t[0].exp()),
            ("log", |t| t[0].log()),
            ("tanh", |t| t[0].tanh()),
            ("sigmoid", |t| t[0].sigmoid()),
            ("lt", |t| t[0].lt(&t[1])),
            ("ge", |t| t[0].ge(&t[1])),
            ("eq", |t| t[0].eq(&t[1])),
            ("ne", |t| t[0].ne(&t[1])),
            ("where", |t| t[0].gt(&t[1])?.where_cond(&t[0], &t[1].exp()?)),
        ];
        for (name, op) in ops {
            check(&format!("f64 {name} {dims:?}"), &both, 0.0, op)?;
        }
        check(&format!("f64 chain {dims:?}"), &both, 0.0, |t| {
            let c = Tensor::scalar(Scalar::F64(0.1));
            t[0].mul(&c)?.add(&t[1])?.tanh()?.mul(&t[0].sigmoid()?)
        })?;
    }
    Ok(())
}

#[test]
fn broadcasting_64_bit_values_matches_the_interpreter() -> Result<()> {
    for n in [1, 3, 50] {
        for dtype in [DType::I64, DType::F64] {
            let col = input(dtype, &[n, 1], n as u64)?;
            let row = input(dtype, &[1, 7], n as u64 + 9)?;
            let scalar = input(dtype, &[], 3)?;
            check(
                &format!("{dtype} broadcast [{n}, 7]"),
                &[col, row, scalar],
                0.0,
                |t| t[0].add(&t[1])?.maximum(&t[2])?.mul(&t[1]),
            )?;
        }
    }
    Ok(())
}

#[test]
fn reductions_of_64_bit_values_match_the_interpreter() -> Result<()> {
    let shapes: [&[usize]; 6] = [&[1], &[7], &[1027], &[5, 3], &[3, 50], &[4, 0, 2]];
    for (k, dims) in shapes.iter().enumerate() {
        for dtype in [DType::I64, DType::F64] {
            // Finite f64 values: NaN and infinities would hide the sum's error.
            let x = match dtype {
                DType::F64 => Tensor::from_vec(
                    f64s(dims.iter().product(), k as u64)
                        .into_iter()
                        .map(|v| if v.is_finite() { v } else { 1.5 })
                        .collect(),
                    *dims,
                )?,
                _ => input(dtype, dims, k as u64)?,
            };
            let axes: Vec<isize> = (0..dims.len() as isize).collect();
            for axis in &axes {
                let what = format!("{dtype} sum {dims:?} axis {axis}");
                check(&what, std::slice::from_ref(&x), 1e-12, |t| {
                    t[0].sum(&[*axis], false)
                })?;
                if dims[*axis as usize] > 0 {
                    let what = format!("{dtype} max {dims:?} axis {axis}");
                    check(&what, std::slice::from_ref(&x), 0.0, |t| {
                        t[0].max(&[*axis], true)
                    })?;
                }
            }
            let what = format!("{dtype} sum of all {dims:?}");
            check(&what, std::slice::from_ref(&x), 1e-12, |t| {
                t[0].sum(&axes, false)
            })?;
            // A reduction with a prologue and a broadcast epilogue.
            if dims.iter().all(|&d| d > 0) {
                let last = dims.len() as isize - 1;
                let what = format!("{dtype} x - max {dims:?}");
                check(&what, std::slice::from_ref(&x), 0.0, |t| {
                    t[0].sub(&t[0].abs()?.max(&[last], true)?)
                })?;
            }
        }
    }
    Ok(())
}

#[test]
fn casts_between_every_pair_of_dtypes_match_the_interpreter() -> Result<()> {
    let dtypes = DType::ALL;
    for (k, dims) in SHAPES.iter().enumerate() {
        for from in dtypes {
            let x = input(from, dims, k as u64 * 7 + 1)?;
            for to in dtypes {
                let what = format!("cast {from} -> {to} {dims:?}");
                check(&what, std::slice::from_ref(&x), 0.0, |t| t[0].cast(to))?;
            }
        }
    }
    // Floats beyond every integer range saturate; NaN goes to 0.
    let specials = Tensor::from_vec(
        vec![1e300, -1e300, f64::NAN, 2.5e9, -2.5e9, 300.7, -0.9, 9.3e18],
        [8],
    )?;
    for to in [DType::I32, DType::I64, DType::U8, DType::F32] {
        check(
            &format!("saturating cast f64 -> {to}"),
            std::slice::from_ref(&specials),
            0.0,
            |t| t[0].cast(to),
        )?;
    }
    Ok(())
}

#[test]
fn f64_gradients_flow_and_i64_carries_none() -> Result<()> {
    let x = Tensor::from_vec(vec![0.5f64, -1.25, 2.0], [3])?;
    let w = Tensor::from_vec(vec![3.0f32, 1.0, -2.0], [3])?;
    // loss = sum(tanh(x) * w), through an f32 -> f64 cast.
    let loss = x.tanh()?.mul(&w.cast(DType::F64)?)?.sum_all()?;
    assert_eq!(loss.dtype(), DType::F64);
    let grads = kiln::grad(&loss, &[&x, &w])?;
    let dx = grads[0].to_vec::<f64>()?;
    for (i, (&xi, wi)) in [0.5f64, -1.25, 2.0]
        .iter()
        .zip([3.0, 1.0, -2.0])
        .enumerate()
    {
        let want = wi * (1.0 - xi.tanh() * xi.tanh());
        assert!((dx[i] - want).abs() <= 1e-12, "dx[{i}] {} vs {want}", dx[i]);
    }
    assert_eq!(grads[1].dtype(), DType::F32);
    let dw = grads[1].to_vec::<f32>()?;
    assert_eq!(dw[0], 0.5f64.tanh() as f32);
    let ids = Tensor::from_vec(vec![1i64, 2, 3], [3])?;
    assert!(
        kiln::grad(&ids.sum_all()?, &[&ids]).is_err(),
        "an i64 loss has no gradient"
    );
    Ok(())
}

#[test]
fn a_matmul_feeding_wider_or_narrower_values_matches_the_interpreter() -> Result<()> {
    // The product is f32 whatever follows: an f64, i64 or bool epilogue
    // must not be computed in place over it. The product itself differs
    // from the interpreter's by f32 accumulation (1e-5 of it here); the
    // inputs are small integers, whose products and sums are exact, where
    // a rounding would flip a truncation or a comparison.
    let ints = |n: usize, seed: u64| -> Vec<f32> {
        i64s(n, seed).iter().map(|&v| (v % 5) as f32).collect()
    };
    let a = Tensor::from_vec(f64s(15, 1).iter().map(|&v| v as f32).collect(), [3, 5])?;
    let b = Tensor::from_vec(f64s(35, 2).iter().map(|&v| v as f32).collect(), [5, 7])?;
    check("matmul -> f64", &[a, b], 1e-5, |t| {
        t[0].matmul(&t[1])?
            .cast(DType::F64)?
            .mul(&Tensor::scalar(Scalar::F64(0.1)))
    })?;
    let ab = [
        Tensor::from_vec(ints(15, 3), [3, 5])?,
        Tensor::from_vec(ints(35, 4), [5, 7])?,
    ];
    check("matmul -> i64", &ab, 0.0, |t| {
        t[0].matmul(&t[1])?
            .cast(DType::I64)?
            .add(&Tensor::scalar(1i64 << 40))
    })?;
    check("matmul -> bool", &ab, 0.0, |t| {
        t[0].matmul(&t[1])?.gt(&Tensor::scalar(0.0f32))
    })?;
    Ok(())
}

#[test]
fn f64_composites_and_their_gradients_follow_f32s() -> Result<()> {
    // gelu, layer_norm and cross_entropy build their constants in the
    // input's dtype: in f64 they compute, and differentiate, what they do
    // in f32, to f32's precision.
    let x32 = Tensor::randn([5, 7], 11)?;
    let targets = Tensor::from_vec(vec![0i32, 6, 3, 1, 2], [5])?;
    type Loss = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let losses: [(&str, Loss); 3] = [
        ("gelu", |x, _| x.gelu()?.sum_all()),
        ("layer_norm", |x, _| {
            let (g, b) = (
                Tensor::ones([7], x.dtype())?,
                Tensor::zeros([7], x.dtype())?,
            );
            x.layer_norm(&g, &b, 1e-5)?.exp()?.sum_all()
        }),
        ("cross_entropy", |x, t| x.cross_entropy(t)),
    ];
    for (name, loss) in losses {
        let x64 = x32.cast(DType::F64)?;
        let (l32, l64) = (loss(&x32, &targets)?, loss(&x64, &targets)?);
        let g32 = kiln::grad(&l32, &[&x32])?.remove(0).to_vec::<f32>()?;
        let g64 = kiln::grad(&l64, &[&x64])?.remove(0).to_vec::<f64>()?;
        let (v32, v64) = (l32.to_scalar::<f32>()?, l64.to_scalar::<f64>()?);
        assert!(
            (f64::from(v32) - v64).abs() <= 1e-5 * v64.abs().max(1.0),
            "{name}: {v32} against {v64}"
        );
        for (i, (a, b)) in g32.iter().zip(&g64).enumerate() {
            assert!(
                (f64::from(*a) - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{name}[{i}]: {a} against {b}"
            );
        }
    }
    Ok(())
}

#[test]
fn f64_and_integer_matmuls_are_products_summed() -> Result<()> {
    // f64 against the definition, on awkward sizes, a batch broadcast and
    // 1-D operands, then against the interpreter fused and unfused.
    let (m, k, n) = (7, 13, 5);
    let (a, b) = (normals(m * k, 1), normals(k * n, 2));
    let (ta, tb) = (
        Tensor::from_vec(a.clone(), [m, k])?,
        Tensor::from_vec(b.clone(), [k, n])?,
    );
    let want = naive_matmul(&a, &b, m, k, n);
    close(
        "[7,13]@[13,5]",
        &ta.matmul(&tb)?.to_vec::<f64>()?,
        &want,
        1e-14,
    );
    let batched = ta.reshape([1, m, k])?.expand([3, m, k])?.matmul(&tb)?;
    assert_eq!(batched.dims(), [3, m, n]);
    close("batch", &batched.to_vec::<f64>()?, &want.repeat(3), 1e-14);
    let row = Tensor::from_vec(a[..k].to_vec(), [k])?.matmul(&tb)?;
    assert_eq!(row.dims(), [n]);
    close("row", &row.to_vec::<f64>()?, &want[..n], 1e-14);
    let column = ta.matmul(&Tensor::from_vec(
        b.iter().step_by(n).copied().collect(),
        [k],
    )?)?;
    let first: Vec<f64> = want.iter().step_by(n).copied().collect();
    close("column", &column.to_vec::<f64>()?, &first, 1e-14);
    let awkward = [
        Tensor::from_vec(normals(2 * 33 * 17, 3), [2, 1, 33, 17])?,
        Tensor::from_vec(normals(3 * 17 * 9, 4), [3, 17, 9])?,
    ];
    check("f64 matmul", &awkward, 1e-12, |t| t[0].matmul(&t[1]))?;
    // Integers wrap, as their products and sums do: i64 beyond i32, i32
    // past its range.
    let (x, y) = (i64s(4 * 6, 5), i64s(6 * 3, 6));
    let want: Vec<i64> = (0..12)
        .map(|e| {
            (0..6).fold(0i64, |s, p| {
                s.wrapping_add(x[(e / 3) * 6 + p].wrapping_mul(y[p * 3 + e % 3]))
            })
        })
        .collect();
    let got = Tensor::from_vec(x.clone(), [4, 6])?
        .matmul(&Tensor::from_vec(y.clone(), [6, 3])?)?
        .to_vec::<i64>()?;
    assert_eq!(got, want, "i64 matmul");
    let big: Vec<i32> = (0..6).map(|v| i32::MAX - v).collect();
    let got = Tensor::from_vec(big.clone(), [1, 6])?
        .matmul(&Tensor::from_vec(big.clone(), [6, 1])?)?
        .to_vec::<i32>()?;
    let want = big
        .iter()
        .fold(0i32, |s, v| s.wrapping_add(v.wrapping_mul(*v)));
    assert_eq!(got, [want], "i32 matmul");
    // u8, bool and mixed operands are refused, naming the op.
    for (lhs, rhs) in [
        (
            Tensor::ones([2, 2], DType::U8)?,
            Tensor::ones([2, 2], DType::U8)?,
        ),
        (
            Tensor::ones([2, 2], DType::Bool)?,
            Tensor::ones([2, 2], DType::Bool)?,
        ),
        (
            Tensor::ones([2, 2], DType::F64)?,
            Tensor::ones([2, 2], DType::F32)?,
        ),
    ] {
        let err = lhs
            .matmul(&rhs)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("matmul"), "{} @ {}: {err}", lhs.ty(), rhs.ty());
    }
    Ok(())
}
