//! A backend against the reference interpreter: every op and every fusion
//! kind, on seeded random inputs of sizes 1, 3, 7, 50, 1027 (vector tails
//! and thread splits) and [4096, 1000], with NaN, infinities and signed zeros
//! where the op defines them.
//!
//! Ops computed exactly as IEEE says (`+ - * /`, rem, sqrt, comparisons, casts,
//! max/min, relu, the data movement) must agree bit for bit; transcendental
//! functions within their stated bounds; sums and products within the error
//! bound of f32 accumulation, `n * eps * sum|x|`.
//!
//! The backend is the CPU, or with feature `cuda` on a GPU machine the GPU
//! that `KILN_TEST_DEVICE=cuda:N` names. There the bounds that differ are
//! CUDA's (expf is 2 ulp) and matmuls compute in TF32.

// The shared helpers, of which this file uses some.
#[allow(dead_code)]
mod agree;

use agree::{EXACT, SIZES, Tol, check, exp_rtol, input, sum_tol};
use kiln::{DType, Device, Result, Tensor};

#[test]
fn unary_ops_at_every_size() -> Result<()> {
    type Op = fn(&Tensor) -> Result<Tensor>;
    // The trigonometric and hyperbolic ops compute in f64 on the CPU, as
    // the interpreter does: exact there; CUDA's f32 functions are 2-4 ulp.
    let called = match agree::device() {
        Device::Cpu => EXACT,
        _ => Tol {
            rtol: 5e-7,
            atol: 1e-37,
        },
    };
    let ops: [(&str, Op, Tol); 21] = [
        ("neg", Tensor::neg, EXACT),
        ("abs", Tensor::abs, EXACT),
        ("relu", Tensor::relu, EXACT),
        ("sqrt", Tensor::sqrt, EXACT),
        ("recip", Tensor::recip, EXACT),
        (
            "exp",
            Tensor::exp,
            Tol {
                rtol: exp_rtol(),
                atol: 1e-37,
            },
        ),
        (
            "log",
            Tensor::log,
            Tol {
                rtol: 2e-7,
                atol: 2e-7,
            },
        ),
        (
            "tanh",
            Tensor::tanh,
            Tol {
                rtol: 5e-7,
                atol: 1e-37,
            },
        ),
        (
            "sigmoid",
            Tensor::sigmoid,
            Tol {
                rtol: 5e-7,
                atol: 1e-37,
            },
        ),
        // x * sigmoid(x): a row function's over long rows on the CPU.
        (
            "silu",
            |x| x.mul(&x.sigmoid()?),
            Tol {
                rtol: 1e-6,
                atol: 1e-37,
            },
        ),
        ("sin", Tensor::sin, called),
        ("cos", Tensor::cos, called),
        ("tan", Tensor::tan, called),
        ("asin", Tensor::asin, called),
        ("acos", Tensor::acos, called),
        ("atan", Tensor::atan, called),
        ("sinh", Tensor::sinh, called),
        ("cosh", Tensor::cosh, called),
        ("asinh", Tensor::asinh, called),
        ("acosh", Tensor::acosh, called),
        ("atanh", Tensor::atanh, called),
    ];
    for (name, op, tol) in ops {
        for n in SIZES {
            let x = input(&[n], n as u64, true)?;
            check(&format!("{name} [{n}]"), &[x], tol, |t| op(&t[0]))?;
        }
        let x = input(&[4096, 1000], 7, true)?;
        check(&format!("{name} [4096,1000]"), &[x], tol, |t| op(&t[0]))?;
    }
    Ok(())
}

/// SiLU as the epilogue of a product (in place, over rows of 1 to 1027)
/// and of a depthwise convolution's sums (rows of 7 and 40), where the
/// CPU's generated code calls a row function on rows of 32 and more.
#[test]
fn silu_after_products_and_depthwise_sums() -> Result<()> {
    let silu = |y: Tensor| y.mul(&y.sigmoid()?);
    let tol = |k: usize| Tol {
        rtol: 1e-6 + agree::product_tol(k, 16.0).rtol,
        ..agree::product_tol(k, 16.0)
    };
    for n in SIZES {
        let (x, w) = (input(&[9, 37], 61, false)?, input(&[37, n], 62, false)?);
        let what = format!("silu(x@w) 9x37x{n}");
        check(&what, &[x, w], tol(37), |t| silu(t[0].matmul(&t[1])?))?;
    }
    for (h, w) in [(9, 7), (6, 40)] {
        let (x, k) = (
            input(&[1, 5, h, w], 63, false)?,
            input(&[5, 1, 3, 3], 64, false)?,
        );
        let what = format!("silu(depthwise) 5x{h}x{w}");
        check(&what, &[x, k], tol(9), |t| {
            silu(t[0].conv2d(&t[1], None, [1, 1], [(1, 1), (1, 1)], [1, 1], 5)?)
        })?;
    }
    Ok(())
}

#[test]
fn binary_ops_with_broadcasting() -> Result<()> {
    type Op = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let ops: [(&str, Op, Tol); 8] = [
        ("add", Tensor::add, EXACT),
        ("sub", Tensor::sub, EXACT),
        ("mul", Tensor::mul, EXACT),
        ("div", Tensor::div, EXACT),
        ("maximum", Tensor::maximum, EXACT),
        ("minimum", Tensor::minimum, EXACT),
        ("pow", Tensor::pow, EXACT),
        ("fmod", Tensor::fmod, EXACT),
    ];
    for (name, op, tol) in ops {
        for n in SIZES {
            let (a, b) = (input(&[n], 1, true)?, input(&[n], 2, true)?);
            check(&format!("{name} [{n}]"), &[a, b], tol, |t| op(&t[0], &t[1]))?;
            // Rows against a broadcast row and a broadcast column.
            let (a, row, col) = (
                input(&[5, n], 3, true)?,
                input(&[n], 4, false)?,
                input(&[5, 1], 5, false)?,
            );
            check(
                &format!("{name} [5,{n}] row"),
                &[a.clone(), row],
                tol,
                |t| op(&t[0], &t[1]),
            )?;
            check(&format!("{name} [5,{n}] col"), &[a, col], tol, |t| {
                op(&t[0], &t[1])
            })?;
        }
        let (a, b) = (input(&[4096, 1000], 8, true)?, input(&[1000], 9, true)?);
        check(&format!("{name} [4096,1000]"), &[a, b], tol, |t| {
            op(&t[0], &t[1])
        })?;
    }
    Ok(())
}

/// 16-bit floats computed in f32 and rounded as stored: bit for bit the
/// interpreter's, at every size (a GPU reads and stores them four at a
/// time, the tail one at a time), with special values, 16-bit and f32
/// operands mixed, and the casts between them.
#[test]
fn half_floats_elementwise_at_every_size() -> Result<()> {
    for half in [DType::BF16, DType::F16] {
        let narrow = |dims: &[usize], seed| -> Result<Tensor> {
            let t = input(dims, seed, true)?.cast(half)?;
            t.realize()?;
            Ok(t)
        };
        for n in SIZES.into_iter().chain([4096]) {
            let (a, b, c) = (narrow(&[n], 11)?, narrow(&[n], 12)?, input(&[n], 13, true)?);
            check(
                &format!("{half} relu(a + b) [{n}]"),
                &[a.clone(), b.clone()],
                EXACT,
                |t| (&t[0] + &t[1])?.relu(),
            )?;
            check(
                &format!("{half} a * c + b, c f32 [{n}]"),
                &[a.clone(), b, c.clone()],
                EXACT,
                |t| (&t[0].cast(DType::F32)? * &t[2])? + &t[1].cast(DType::F32)?,
            )?;
            check(&format!("f32 to {half} [{n}]"), &[c], EXACT, |t| {
                t[0].cast(half)
            })?;
            check(
                &format!("{half} a[:, 1:] * 2 [5, {n}]"),
                &[narrow(&[5, n + 1], 14)?],
                EXACT,
                |t| t[0].slice(1, 1, n + 1, 1)? * Tensor::scalar(2.0f32).cast(half)?,
            )?;
        }
    }
    Ok(())
}

/// Integer remainders by every kind of divisor: 0 and `MIN % -1` give 0
/// (where `srem` traps), the rest C's, the dividend's sign; in i32, i64
/// and u8, and in bf16 and f16 (exact, so bit for bit).
#[test]
fn remainders_by_every_kind_of_divisor() -> Result<()> {
    let dividends = [i32::MIN, i32::MAX, -7, 7, 0, -1, 12345, -98765];
    let divisors = [0, -1, 1, 3, -3, i32::MIN, i32::MAX, 7];
    for n in SIZES {
        let a: Vec<i32> = (0..n).map(|i| dividends[i % 8]).collect();
        let b: Vec<i32> = (0..n).map(|i| divisors[(i / 8 + i) % 8]).collect();
        let (a, b) = (Tensor::from_vec(a, [n])?, Tensor::from_vec(b, [n])?);
        for dtype in [DType::I32, DType::I64, DType::U8, DType::BF16, DType::F16] {
            let (a, b) = (a.cast(dtype)?, b.cast(dtype)?);
            a.realize()?;
            b.realize()?;
            check(&format!("{dtype} fmod [{n}]"), &[a, b], EXACT, |t| {
                t[0].fmod(&t[1])
            })?;
        }
    }
    let (a, b) = (
        Tensor::from_vec(vec![-7i32, 7, -7, 7, 5, i32::MIN, -5], [7])?,
        Tensor::from_vec(vec![3i32, -3, 0, -1, 3, -1, -3], [7])?,
    );
    assert_eq!(a.fmod(&b)?.to_vec::<i32>()?, [-1, 1, 0, 0, 2, 0, -2]);
    let (a, b) = (
        Tensor::from_vec(vec![i64::MIN, i64::MIN, 7, -7], [4])?,
        Tensor::from_vec(vec![-1i64, 0, 0, i64::MIN], [4])?,
    );
    assert_eq!(a.fmod(&b)?.to_vec::<i64>()?, [0, 0, 0, -7]);
    // Floats: NaN by 0 and of infinity, x by infinity x, -0 kept.
    let inf = f32::INFINITY;
    let (a, b) = (
        Tensor::from_vec(vec![5.0f32, inf, -3.5, -4.0, 7.5], [5])?,
        Tensor::from_vec(vec![0.0f32, 2.0, inf, 2.0, -2.0], [5])?,
    );
    let bits: Vec<u32> = (a.fmod(&b)?.to_vec::<f32>()?.iter())
        .map(|x| x.to_bits())
        .collect();
    let want: Vec<u32> = [f32::NAN, f32::NAN, -3.5, -0.0, 1.5]
        .iter()
        .map(|x| x.to_bits())
        .collect();
    assert_eq!(bits[2..], want[2..]);
    assert!(f32::from_bits(bits[0]).is_nan() && f32::from_bits(bits[1]).is_nan());
    Ok(())
}

#[test]
fn comparisons_where_and_casts() -> Result<()> {
    for n in SIZES {
        let (a, b) = (input(&[n], 11, true)?, input(&[n], 12, true)?);
        type Cmp = fn(&Tensor, &Tensor) -> Result<Tensor>;
        let cmps: [(&str, Cmp); 6] = [
            ("lt", Tensor::lt),
            ("le", Tensor::le),
            ("gt", Tensor::gt),
            ("ge", Tensor::ge),
            ("eq", Tensor::eq),
            ("ne", Tensor::ne),
        ];
        for (name, cmp) in cmps {
            check(
                &format!("{name} [{n}]"),
                &[a.clone(), b.clone()],
                EXACT,
                |t| cmp(&t[0], &t[1]),
            )?;
        }
        check(
            &format!("where [{n}]"),
            &[a.clone(), b.clone()],
            EXACT,
            |t| t[0].gt(&t[1])?.where_cond(&t[0], &t[1]),
        )?;
        let scaled = (&a * 100.0f32)?;
        for (from, to) in [
            (DType::F32, DType::I32),
            (DType::F32, DType::U8),
            (DType::F32, DType::Bool),
            (DType::I32, DType::F32),
            (DType::I32, DType::U8),
            (DType::I32, DType::Bool),
            (DType::U8, DType::F32),
            (DType::U8, DType::I32),
            (DType::U8, DType::Bool),
            (DType::Bool, DType::F32),
            (DType::Bool, DType::I32),
            (DType::Bool, DType::U8),
        ] {
            check(
                &format!("cast {from}->{to} [{n}]"),
                std::slice::from_ref(&scaled),
                EXACT,
                |t| t[0].cast(from)?.cast(to),
            )?;
        }
        // Integer arithmetic wraps; i32 max/min/relu/abs/neg.
        check(
            &format!("i32 ops [{n}]"),
            std::slice::from_ref(&scaled),
            EXACT,
            |t| {
                let i = t[0].cast(DType::I32)?;
                let j = (&i * &i)?.sub(&i.abs()?)?.maximum(&i.neg()?)?;
                (&j + &i.relu()?)?.minimum(&(&i * 3i32)?)
            },
        )?;
        // Every lane type's comparisons, as graph inputs (u8 and bool read
        // four bytes at a time) and computed; masks selecting masks, f32 and
        // i32 values; float to integer casts that saturate (the specials,
        // and values far beyond i32).
        let bytes: Vec<u8> = (0..n).map(|i| (i * 97 % 256) as u8).collect();
        let flags: Vec<bool> = (0..n).map(|i| i % 3 != 1).collect();
        let inputs = [
            scaled.clone(),
            Tensor::from_vec(bytes, [n])?,
            Tensor::from_vec(flags, [n])?,
            (&b * 1e12f32)?,
        ];
        check(&format!("masks of every type [{n}]"), &inputs, EXACT, |t| {
            let i = t[0].cast(DType::I32)?;
            let by_int = i.lt(&(&i.abs()? - 3i32)?)?;
            let by_byte = t[1].ge(&t[1].minimum(&Tensor::scalar(100u8))?)?;
            let by_float = t[0].le(&t[3])?;
            let mask = by_int
                .where_cond(&t[2], &by_byte)?
                .ne(&by_float.where_cond(&by_int, &t[2])?)?;
            let wide = t[3].cast(DType::I32)?;
            let picked = mask.where_cond(&(&i + &wide)?, &(&i * -7i32)?)?;
            let floats = mask.where_cond(&t[3], &picked.cast(DType::F32)?)?;
            (&floats
                + &t[1]
                    .maximum(&t[1].minimum(&Tensor::scalar(9u8))?)?
                    .cast(DType::F32)?)?
                .add(&mask.cast(DType::F32)?)
        })?;
        check(&format!("casts from lanes [{n}]"), &inputs, EXACT, |t| {
            let saturated = t[3].cast(DType::I32)?;
            let bytes = t[3].cast(DType::U8)?.cast(DType::I32)?;
            let flags = t[3].cast(DType::Bool)?.cast(DType::I32)?;
            let wrapped = (&t[0].cast(DType::I32)? * 1000i32)?
                .cast(DType::U8)?
                .cast(DType::I32)?;
            let from_flags = t[2]
                .cast(DType::I32)?
                .add(&t[2].cast(DType::U8)?.cast(DType::I32)?)?;
            let nonzero = t[1].cast(DType::Bool)?.cast(DType::I32)?;
            saturated
                .add(&bytes)?
                .add(&flags)?
                .add(&wrapped)?
                .add(&from_flags)?
                .add(&nonzero)?
                .add(&t[1].cast(DType::I32)?)
        })?;
        // A row's label, the same all along the row, against every column:
        // a cross-entropy gradient's `where(label == col, ..)`.
        let labels: Vec<i32> = (0..n).map(|i| (i * 7 % 5) as i32).collect();
        let labels = Tensor::from_vec(labels, [n, 1])?;
        let classes = Tensor::from_vec((0..5).collect::<Vec<i32>>(), [1, 5])?;
        let logits = input(&[n, 5], 13, true)?;
        check(
            &format!("label == class [{n}, 5]"),
            &[labels, classes, logits],
            EXACT,
            |t| {
                let hit = t[0].eq(&t[1])?;
                hit.where_cond(&(&t[2] - 1.0f32)?, &t[2])
            },
        )?;
        check(
            &format!("u8 ops [{n}]"),
            std::slice::from_ref(&scaled),
            EXACT,
            |t| {
                let u = t[0].cast(DType::U8)?;
                (&(&u * &u)? + &u)?
                    .maximum(&u)?
                    .sub(&u.minimum(&(&u + &u)?)?)
            },
        )?;
    }
    Ok(())
}

#[test]
fn reductions_over_every_axis_kind() -> Result<()> {
    for n in SIZES {
        for dims in [vec![n], vec![3, n], vec![n, 5], vec![2, n, 3]] {
            let x = input(&dims, n as u64, false)?;
            let count = dims.iter().product::<usize>();
            for axes in [vec![0isize], vec![-1], vec![0, -1]] {
                if axes.len() > dims.len() {
                    continue;
                }
                let what = format!("{dims:?} axes {axes:?}");
                check(
                    &format!("sum {what}"),
                    std::slice::from_ref(&x),
                    sum_tol(count, 4.0),
                    |t| t[0].sum(&axes, false),
                )?;
                check(
                    &format!("max {what}"),
                    std::slice::from_ref(&x),
                    EXACT,
                    |t| t[0].max(&axes, true),
                )?;
                check(
                    &format!("mean {what}"),
                    std::slice::from_ref(&x),
                    sum_tol(count, 4.0),
                    |t| t[0].mean(&axes, true),
                )?;
            }
        }
        // NaN and infinities propagate through max and sum; integers sum
        // exactly.
        let x = input(&[4, n], 3, true)?;
        check(
            &format!("max nan [4,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].max(&[1], false),
        )?;
        check(
            &format!("sum nan [4,{n}]"),
            std::slice::from_ref(&x),
            sum_tol(n, 4.0),
            |t| t[0].sum(&[1], false),
        )?;
        check(&format!("sum i32 [4,{n}]"), &[x], EXACT, |t| {
            (&t[0] * 1000.0f32)?.cast(DType::I32)?.sum(&[0, 1], false)
        })?;
    }
    let x = input(&[4096, 1000], 5, false)?;
    check(
        "sum rows [4096,1000]",
        std::slice::from_ref(&x),
        sum_tol(1000, 4.0),
        |t| t[0].sum(&[1], true),
    )?;
    check(
        "sum cols [4096,1000]",
        std::slice::from_ref(&x),
        sum_tol(4096, 4.0),
        |t| t[0].sum(&[0], true),
    )?;
    check(
        "sum all [4096,1000]",
        std::slice::from_ref(&x),
        sum_tol(4096 * 1000, 4.0),
        |t| t[0].sum_all(),
    )?;
    // Large reductions with few outputs run as two kernels (split-reduce).
    check(
        "max cols [4096,1000]",
        std::slice::from_ref(&x),
        EXACT,
        |t| t[0].max(&[0], true),
    )?;
    let specials = input(&[4096, 1000], 6, true)?;
    check("max all, NaN [4096,1000]", &[specials], EXACT, |t| {
        t[0].max(&[0, 1], false)
    })
}

#[test]
fn max_keeps_signed_zeros_and_nans_wherever_they_fall() -> Result<()> {
    // Rows of negatives with zeros and NaNs put where the vector loop meets
    // them: in one lane of one accumulator (indices 16 apart), across lanes,
    // in the ragged last vector, in the scalar tail. The max is +0 when a +0
    // is in the row, whichever zero came first, and NaN when a NaN is.
    let rows: [&[(usize, f32)]; 6] = [
        &[(1, -0.0), (17, 0.0)],
        &[(1, 0.0), (17, -0.0)],
        &[(1, -0.0), (17, -0.0)],
        &[(usize::MAX, f32::NAN)],
        &[(0, 0.0), (2, f32::NAN)],
        &[(3, -0.0), (usize::MAX, 0.0)],
    ];
    for n in SIZES.into_iter().filter(|&n| n > 1) {
        let mut v = Vec::with_capacity(rows.len() * n);
        for marks in rows {
            let mut row: Vec<f32> = (0..n).map(|i| -1.0 - (i % 13) as f32).collect();
            for &(i, x) in marks {
                row[i.min(n - 1)] = x;
            }
            v.extend(row);
        }
        let x = Tensor::from_vec(v, [rows.len(), n])?;
        check(&format!("max zeros, NaN [6,{n}]"), &[x], EXACT, |t| {
            t[0].max(&[1], false)
        })?;
    }
    Ok(())
}

#[test]
fn views_fold_into_reads() -> Result<()> {
    for n in SIZES {
        let x = input(&[3, n], 21, true)?;
        check(
            &format!("transpose [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].t()?.relu(),
        )?;
        check(
            &format!("slice [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].slice(1, n / 3, n, 2)?.neg(),
        )?;
        // Every other element to the row's last, in lanes (two vectors and
        // a shuffle): f32, and i32 through its own lanes.
        check(
            &format!("every other to the end [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].slice(1, (n + 1) % 2, n, 2)? * 3.0f32,
        )?;
        check(
            &format!("every other i32 [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| {
                let i = (&t[0] * 100.0f32)?.cast(DType::I32)?;
                (i.slice(1, 1 - n % 2, n, 2)? * 3i32)?.cast(DType::F32)
            },
        )?;
        // Reductions whose prologue holds i32 and bool lanes (a causal
        // mask), and stride-2 reads in a reduction's prologue.
        check(
            &format!("masked softmax [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| {
                let cols = Tensor::from_vec((0..n as i32).collect::<Vec<_>>(), [1, n])?;
                let rows = Tensor::from_vec(vec![0i32, n as i32 / 2, n as i32], [3, 1])?;
                let keep = rows.ge(&cols)?;
                let masked = keep.where_cond(&t[0], &Tensor::scalar(f32::NEG_INFINITY))?;
                masked.max(&[1], false)
            },
        )?;
        check(
            &format!("every other element summed [3,{n}]"),
            std::slice::from_ref(&x),
            sum_tol(n.div_ceil(2), 4.0),
            |t| t[0].slice(1, 0, n, 2)?.sum(&[1], false),
        )?;
        check(
            &format!("pad [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].pad(&[(1, 2), (3, 0)], -1.5f32)?.abs(),
        )?;
        // A padded row handed to a row function (SiLU, a rounding to
        // bf16): rows of padding alone read the fill, not a row beside.
        check(
            &format!("silu of a pad [3,{n}]"),
            std::slice::from_ref(&x),
            Tol {
                rtol: 1e-6,
                atol: 1e-37,
            },
            |t| {
                let p = t[0].pad(&[(1, 2), (3, 0)], -1.5f32)?;
                p.mul(&p.sigmoid()?)
            },
        )?;
        check(
            &format!("a pad as bf16 [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].pad(&[(1, 2), (3, 0)], -1.5f32)?.cast(DType::BF16),
        )?;
        // Padded reads that differ along the row and across rows, in one
        // kernel: rows of both padding and the input (the middle in
        // vectors), rows of padding alone, a transposed and a broadcast read.
        let y = input(&[2, 3, n], 22, true)?;
        check(
            &format!("pads of two ranges [2,3,{n}]"),
            &[y.clone(), x.clone()],
            EXACT,
            |t| {
                let a = t[0].pad(&[(1, 0), (0, 2), (3, 1)], -1.5f32)?;
                let b = t[0].pad(&[(0, 1), (2, 0), (1, 3)], 2.0f32)?;
                let c = t[1].t()?.pad(&[(4, 0), (0, 2)], 0.5f32)?.t()?;
                let c = c.unsqueeze(0)?.expand([3, 5, n + 4])?;
                ((a * b)? + c)?.relu()
            },
        )?;
        check(
            &format!("reshape of transpose [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].t()?.reshape([3 * n])?.neg(),
        )?;
        check(
            &format!("expand [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].unsqueeze(0)?.expand([2, 3, n])?.relu(),
        )?;
        check(
            &format!("padded sum [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].pad(&[(0, 0), (2, 2)], 0.0f32)?.max(&[1], false),
        )?;
        // A view as an output, and an input returned as it is.
        check(
            &format!("view output [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].t(),
        )?;
    }
    Ok(())
}
