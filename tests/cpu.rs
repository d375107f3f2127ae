//! A backend against the reference interpreter: every op and every fusion
//! kind, on seeded random inputs of sizes 1, 3, 7, 50, 1027 (vector tails
//! and thread splits) and [4096, 1000], with NaN, infinities and signed zeros
//! where the op defines them.
//!
//! Ops computed exactly as IEEE says (`+ - * /`, sqrt, comparisons, casts,
//! max/min, relu, the data movement) must agree bit for bit; transcendental
//! functions within their stated bounds; sums and products within the error
//! bound of f32 accumulation, `n * eps * sum|x|`.
//!
//! The backend is the CPU, or with feature `cuda` on a GPU machine the GPU
//! that `KILN_TEST_DEVICE=cuda:N` names. There the bounds that differ are
//! CUDA's (expf is 2 ulp) and matmuls compute in TF32.

use kiln::{CompileOptions, DType, Data, Device, Result, Tensor};
use kiln_support::data;

const SIZES: [usize; 5] = [1, 3, 7, 50, 1027];

/// The device under test (`KILN_TEST_DEVICE=cuda:0` in a build without
/// feature `cuda` fails every test with the not-built error).
fn device() -> Device {
    if let Some(n) = std::env::var("KILN_TEST_DEVICE")
        .ok()
        .and_then(|d| d.strip_prefix("cuda:").and_then(|n| n.parse().ok()))
    {
        return Device::Cuda(n);
    }
    Device::Cpu
}

/// The bound of exp: 2 ulp for CUDA's `expf`, below that for kiln's CPU polynomial.
fn exp_rtol() -> f64 {
    if device() == Device::Cpu {
        2e-7
    } else {
        2.5e-7
    }
}

/// The error bound of a product summed over `k` terms of magnitude up to
/// `scale`: f32 accumulation on the CPU, TF32 products (10-bit mantissas,
/// relative error 2^-10 each) on a GPU.
fn product_tol(k: usize, scale: f64) -> Tol {
    if device() == Device::Cpu {
        sum_tol(k, scale)
    } else {
        Tol {
            rtol: 1e-3,
            atol: k as f64 * scale * 2f64.powi(-10),
        }
    }
}

/// Seeded normal values with the special values sprinkled in.
fn input(dims: &[usize], seed: u64, specials: bool) -> Result<Tensor> {
    let t = Tensor::randn(dims, seed)?;
    if !specials {
        return Ok(t);
    }
    let mut v = t.to_vec::<f32>()?;
    let marks = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
    for (k, &m) in marks.iter().enumerate() {
        let i = (k * 7919 + seed as usize) % v.len().max(1);
        if let Some(x) = v.get_mut(i) {
            *x = m;
        }
    }
    Tensor::from_vec(v, dims)
}

/// How far the CPU may be from the interpreter.
#[derive(Clone, Copy, Debug)]
struct Tol {
    rtol: f64,
    atol: f64,
}

const EXACT: Tol = Tol {
    rtol: 0.0,
    atol: 0.0,
};

/// Compares element by element; NaN matches NaN, and -0 matches +0 only
/// under a tolerance.
fn compare(what: &str, cpu: &Data, reference: &Data, tol: Tol) {
    assert_eq!(cpu.len(), reference.len(), "{what}: lengths");
    for i in 0..cpu.len() {
        let (a, b) = (cpu.get(i).to_f64(), reference.get(i).to_f64());
        let same = (a.is_nan() && b.is_nan())
            || if tol.rtol == 0.0 && tol.atol == 0.0 {
                a.to_bits() == b.to_bits() || (cpu.dtype() != DType::F32 && a == b)
            } else {
                a == b || (a - b).abs() <= (tol.rtol * a.abs().max(b.abs())).max(tol.atol)
            };
        assert!(
            same,
            "{what}: element {i}: cpu {a:e}, reference {b:e} (tolerance {tol:?})"
        );
    }
}

/// Builds `f` on the device under test and on the reference device from the
/// same inputs and compares the results.
fn check(
    what: &str,
    inputs: &[Tensor],
    tol: Tol,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<()> {
    let tested: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.to(device()))
        .collect::<Result<_>>()?;
    let cpu = f(&tested)?;
    assert_eq!(cpu.device(), device(), "{what}: ran elsewhere");
    let reference: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.to(Device::Reference))
        .collect::<Result<_>>()?;
    let want = f(&reference)?;
    assert_eq!(
        want.device(),
        Device::Reference,
        "{what}: the oracle ran on the CPU"
    );
    assert_eq!(cpu.dims(), want.dims(), "{what}: shapes");
    let (a, b) = (data(&cpu)?, data(&want)?);
    compare(what, &a, &b, tol);
    Ok(())
}

/// The error bound of summing `n` values of magnitude up to `scale` in f32.
fn sum_tol(n: usize, scale: f64) -> Tol {
    Tol {
        rtol: 1e-6,
        atol: 4.0 * n as f64 * f64::from(f32::EPSILON) * scale,
    }
}

#[test]
fn unary_ops_at_every_size() -> Result<()> {
    type Op = fn(&Tensor) -> Result<Tensor>;
    let ops: [(&str, Op, Tol); 9] = [
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

#[test]
fn binary_ops_with_broadcasting() -> Result<()> {
    type Op = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let ops: [(&str, Op, Tol); 7] = [
        ("add", Tensor::add, EXACT),
        ("sub", Tensor::sub, EXACT),
        ("mul", Tensor::mul, EXACT),
        ("div", Tensor::div, EXACT),
        ("maximum", Tensor::maximum, EXACT),
        ("minimum", Tensor::minimum, EXACT),
        ("pow", Tensor::pow, EXACT),
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
        check(
            &format!("pad [3,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].pad(&[(1, 2), (3, 0)], -1.5f32)?.abs(),
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

#[test]
fn matmuls_plain_transposed_batched() -> Result<()> {
    for (m, k, n) in [
        (1, 1, 1),
        (3, 7, 5),
        (50, 3, 1027),
        (7, 1027, 3),
        (64, 784, 256),
        // Large enough for the AVX-512 kernels where the machine has them.
        (520, 517, 509),
    ] {
        let (a, b, bias) = (
            input(&[m, k], 31, false)?,
            input(&[k, n], 32, false)?,
            input(&[n], 33, false)?,
        );
        let tol = product_tol(k, 16.0);
        check(
            &format!("matmul {m}x{k}x{n}"),
            &[a.clone(), b.clone()],
            tol,
            |t| t[0].matmul(&t[1]),
        )?;
        check(
            &format!("relu(x@w+b) {m}x{k}x{n}"),
            &[a.clone(), b.clone(), bias],
            tol,
            |t| (t[0].matmul(&t[1])? + &t[2])?.relu(),
        )?;
        let bt = b.t()?.to_vec::<f32>()?;
        let bt = Tensor::from_vec(bt, [n, k])?;
        check(
            &format!("x@w.T {m}x{k}x{n}"),
            &[a.clone(), bt.clone()],
            tol,
            |t| t[0].matmul(&t[1].t()?),
        )?;
        // Operands computed inside the matmul's kernel: normalized bytes on
        // the left, a scaled transposed weight on the right.
        let pixels: Vec<u8> = (0..m * k).map(|i| (i * 37 % 256) as u8).collect();
        let pixels = Tensor::from_vec(pixels, [m, k])?;
        check(
            &format!("normalize(u8)@w {m}x{k}x{n}"),
            &[pixels, b.clone()],
            tol,
            |t| {
                let x = ((t[0].cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? / 0.3081f32;
                x?.matmul(&t[1])
            },
        )?;
        // The first layer's weight gradient: the normalized bytes
        // transposed, as the training step computes them.
        let pixels: Vec<u8> = (0..m * k).map(|i| (i * 53 % 256) as u8).collect();
        let pixels = Tensor::from_vec(pixels, [m, k])?;
        let g = input(&[m, n], 40, false)?;
        check(
            &format!("normalize(u8).T@g {k}x{m}x{n}"),
            &[pixels, g.clone()],
            product_tol(m, 16.0),
            |t| {
                let x = ((t[0].cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? / 0.3081f32;
                x?.t()?.matmul(&t[1])
            },
        )?;
        // The same on the right (`g @ normalize(u8).T`), and batched.
        let pixels: Vec<u8> = (0..2 * n * k).map(|i| (i * 29 % 256) as u8).collect();
        let pixels = Tensor::from_vec(pixels, [2, n, k])?;
        let normalize = |x: &Tensor| -> Result<Tensor> {
            ((x.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? / 0.3081f32
        };
        check(
            &format!("a@normalize(u8).T {m}x{k}x{n}"),
            &[a.clone(), pixels.clone()],
            tol,
            |t| t[0].matmul(&normalize(&t[1].slice(0, 0, 1, 1)?.reshape([n, k])?)?.t()?),
        )?;
        let g3 = input(&[2, m, n], 42, false)?;
        check(
            &format!("normalize(u8).T@g batched 2x{k}x{n}x{m}"),
            &[pixels, g3],
            product_tol(n, 16.0),
            |t| {
                normalize(&t[0])?
                    .permute(&[0, 2, 1])?
                    .matmul(&t[1].permute(&[0, 2, 1])?)
            },
        )?;
        // One operand computed for two products, as is and transposed (the
        // second launch reads what the first computed), and for both sides
        // of one product.
        let pixels: Vec<u8> = (0..m * k).map(|i| (i * 41 % 256) as u8).collect();
        let pixels = Tensor::from_vec(pixels, [m, k])?;
        check(
            &format!("x.T@(x@w), x normalized u8 {m}x{k}x{n}"),
            &[pixels.clone(), b.clone()],
            product_tol(k * m, 64.0),
            |t| {
                let x = normalize(&t[0])?;
                x.t()?.matmul(&x.matmul(&t[1])?)
            },
        )?;
        check(
            &format!("x@x.T, x normalized u8 {m}x{k}"),
            &[pixels],
            product_tol(k, 16.0),
            |t| {
                let x = normalize(&t[0])?;
                x.matmul(&x.t()?)
            },
        )?;
        // ReLU's backward pass in the product's epilogue: the gradient
        // where the layer's output was positive, else 0.
        let h = input(&[m, k], 41, true)?;
        check(
            &format!("where(h>0, g@w.T, 0) {m}x{n}x{k}"),
            &[g, b.clone(), h],
            product_tol(n, 16.0),
            |t| {
                let zero = Tensor::scalar(0.0f32);
                let dh = t[0].matmul(&t[1].t()?)?;
                t[2].gt(&zero)?.where_cond(&dh, &zero)
            },
        )?;
        check(
            &format!("x@(w.T*0.5).T {m}x{k}x{n}"),
            &[a.clone(), bt],
            tol,
            |t| t[0].matmul(&(&t[1] * 0.5f32)?.t()?),
        )?;
    }
    let (a, b) = (
        input(&[2, 3, 7, 5], 34, false)?,
        input(&[2, 3, 5, 4], 35, false)?,
    );
    check("batched matmul", &[a, b], product_tol(5, 16.0), |t| {
        t[0].matmul(&t[1])?.exp()
    })?;
    // Each product large enough for the AVX-512 kernels, whose blocks of
    // rows take the epilogue as they finish.
    let (a, b) = (
        input(&[2, 200, 256], 38, false)?,
        input(&[2, 256, 200], 39, false)?,
    );
    check(
        "batched relu(x@w * 0.5 - 1) 2x200x256x200",
        &[a, b],
        product_tol(256, 16.0),
        |t| ((t[0].matmul(&t[1])? * 0.5f32)? - 1.0f32)?.relu(),
    )?;
    let (v, w) = (input(&[7], 36, false)?, input(&[7, 3], 37, false)?);
    check("vector @ matrix", &[v, w], product_tol(7, 16.0), |t| {
        t[0].matmul(&t[1])
    })
}

#[test]
fn fusion_kinds_agree() -> Result<()> {
    let soft = Tol {
        rtol: 2e-6,
        atol: 1e-7,
    };
    let log_soft = Tol {
        rtol: 2e-6,
        atol: 2e-6,
    };
    for n in SIZES {
        let x = input(&[5, n], 41, false)?;
        check(
            &format!("softmax [5,{n}]"),
            std::slice::from_ref(&x),
            soft,
            |t| t[0].softmax(-1),
        )?;
        check(
            &format!("log_softmax [5,{n}]"),
            std::slice::from_ref(&x),
            log_soft,
            |t| t[0].log_softmax(-1),
        )?;
        check(
            &format!("softmax axis 0 [5,{n}]"),
            std::slice::from_ref(&x),
            soft,
            |t| t[0].softmax(0),
        )?;
        check(
            &format!("x - mean [5,{n}]"),
            std::slice::from_ref(&x),
            sum_tol(n, 8.0),
            |t| &t[0] - &t[0].mean(&[1], true)?,
        )?;
        check(
            &format!("sum(x*x) [5,{n}]"),
            std::slice::from_ref(&x),
            sum_tol(5 * n, 16.0),
            |t| (&t[0] * &t[0])?.sum_all(),
        )?;
        let (w, b) = (input(&[n], 42, false)?, input(&[n], 43, false)?);
        check(
            &format!("layer_norm [5,{n}]"),
            &[x.clone(), w, b],
            Tol {
                rtol: 1e-4,
                atol: 1e-4,
            },
            |t| t[0].layer_norm(&t[1], &t[2], 1e-5),
        )?;
        check(
            &format!("gelu [5,{n}]"),
            &[x],
            Tol {
                rtol: 2e-6,
                atol: 1e-7,
            },
            |t| t[0].gelu(),
        )?;
    }
    // Short rows run four at a time, in blocks of rows shared by two threads.
    let x = input(&[4096, 10], 45, false)?;
    check(
        "log_softmax [4096,10]",
        std::slice::from_ref(&x),
        log_soft,
        |t| t[0].log_softmax(-1),
    )?;
    let x = input(&[4096, 1000], 44, false)?;
    check("softmax [4096,1000]", std::slice::from_ref(&x), soft, |t| {
        t[0].softmax(-1)
    })?;
    check(
        "ew_chain [4096,1000]",
        &[x.clone(), x.clone(), x],
        EXACT,
        |t| ((&t[0] * &t[1])? + &t[2])?.relu()? * 0.5f32,
    )
}

#[test]
fn side_outputs_of_products_and_sums_agree() -> Result<()> {
    use kiln::TensorType;
    // A momentum update fused into the kernel computing its gradient: the
    // epilogue of a column sum (a bias's gradient), of a row sum and of a
    // product with A transposed (a weight's), each storing the momentum
    // beside the new parameter. Awkward sizes: vector tails, one row,
    // thread splits.
    for (rows, cols, k) in [
        (1, 1, 1),
        (3, 7, 5),
        (50, 13, 9),
        (1027, 5, 3),
        (37, 1027, 6),
    ] {
        let dims: [&[usize]; 8] = [
            &[rows, cols],
            &[cols],
            &[cols],
            &[rows, k],
            &[k, cols],
            &[k, cols],
            &[rows],
            &[rows],
        ];
        let inputs: Vec<Tensor> = dims
            .iter()
            .enumerate()
            .map(|(i, d)| input(d, 60 + i as u64, false))
            .collect::<Result<_>>()?;
        let specs: Vec<TensorType> = inputs.iter().map(|t| t.ty().clone()).collect();
        let update = |t: &[Tensor]| -> Result<Vec<Tensor>> {
            let momentum = |m: &Tensor, g: &Tensor| (m * 0.9f32)? + g;
            let bias_m = momentum(&t[1], &t[0].sum(&[0], false)?)?;
            let bias = (&t[2] - &(&bias_m * 0.1f32)?)?;
            let weight_m = momentum(&t[4], &t[3].t()?.matmul(&t[0])?)?;
            let weight = (&t[5] - &(&weight_m * 0.1f32)?)?;
            let row_m = momentum(&t[6], &t[0].sum(&[1], false)?)?;
            let row = (&t[7] - &(&row_m * 0.1f32)?)?;
            Ok(vec![bias_m, bias, weight_m, weight, row_m, row])
        };
        let compile =
            |device| kiln::compile_with("update", &specs, CompileOptions::on(device), update);
        let mut tested = compile(device())?;
        // On a GPU the product's epilogue, which cuBLASLt has no form for,
        // is a kernel of its own after the GEMM.
        let launches = if device() == Device::Cpu { 3 } else { 4 };
        assert_eq!(
            tested.launches(),
            launches,
            "[{rows},{cols}] x {k}: two sums and a product"
        );
        let data: Vec<Data> = inputs.iter().map(data).collect::<Result<_>>()?;
        let refs: Vec<&Data> = data.iter().collect();
        let got = tested.run(&refs)?;
        let want = compile(Device::Reference)?.run(&refs)?;
        let tols = [
            sum_tol(rows, 8.0),
            sum_tol(rows, 8.0),
            product_tol(rows, 16.0),
            product_tol(rows, 16.0),
            sum_tol(cols, 8.0),
            sum_tol(cols, 8.0),
        ];
        for (i, ((a, b), tol)) in got.iter().zip(&want).zip(tols).enumerate() {
            compare(&format!("[{rows},{cols}] x {k}: output {i}"), a, b, tol);
        }
    }
    Ok(())
}

#[test]
fn transcendentals_stay_within_their_bounds() -> Result<()> {
    // Every 97th f32 bit pattern of each sign: the whole range, subnormals included.
    let mut values: Vec<f32> = (0..u32::MAX / 97)
        .map(|k| f32::from_bits(k.wrapping_mul(97)))
        .filter(|v| v.is_finite())
        .collect();
    // The special values, where a polynomial's bit tricks go wrong first.
    values.extend([
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
    ]);
    let x = Tensor::from_slice(&values, [values.len()])?.to(device())?;
    type F = fn(&Tensor) -> Result<Tensor>;
    type Exact = fn(f64) -> f64;
    let cases: [(&str, F, Exact, f64); 4] = [
        ("exp", Tensor::exp, f64::exp, exp_rtol()),
        ("log", Tensor::log, f64::ln, 2e-7),
        ("tanh", Tensor::tanh, f64::tanh, 5e-7),
        (
            "sigmoid",
            Tensor::sigmoid,
            |v| 1.0 / (1.0 + (-v).exp()),
            5e-7,
        ),
    ];
    for (name, f, exact, bound) in cases {
        let got = f(&x)?.to_vec::<f32>()?;
        let mut worst = (0.0f64, 0.0f32);
        for (&v, &g) in values.iter().zip(&got) {
            let want = exact(f64::from(v));
            let w32 = want as f32;
            // Where the true value is not a normal f32 the bound is absolute.
            let err = if w32.is_nan() {
                if g.is_nan() { 0.0 } else { f64::INFINITY }
            } else if w32.is_infinite() || g.is_infinite() {
                if g == w32 { 0.0 } else { f64::INFINITY }
            } else if want.abs() < f64::from(f32::MIN_POSITIVE) {
                ((f64::from(g) - want).abs() / f64::from(f32::MIN_POSITIVE)) * 1e-7
            } else {
                (f64::from(g) - want).abs() / want.abs()
            };
            if err > worst.0 {
                worst = (err, v);
            }
        }
        eprintln!(
            "{name}: worst relative error {:e} at {:e}",
            worst.0, worst.1
        );
        assert!(
            worst.0 <= bound,
            "{name}: relative error {:e} at x = {:e} exceeds {bound:e}",
            worst.0,
            worst.1
        );
    }
    Ok(())
}

/// Sums of exponentials over long rows (on AVX2 machines a call of 256-bit
/// code, over the output row or chunks of 1024 on the stack) with ragged
/// ends, and rows that leave exp's fast range: -inf, values spread over
/// +-200, a NaN, nothing but -inf, +inf.
#[test]
fn sums_of_exponentials_over_long_rows_agree() -> Result<()> {
    let soft = Tol {
        rtol: 2e-6,
        atol: 1e-7,
    };
    let log_soft = Tol {
        rtol: 2e-6,
        atol: 2e-6,
    };
    for n in [32, 33, 1000, 2500] {
        let mut v = Tensor::randn([7, n], 46)?.to_vec::<f32>()?;
        for (j, x) in v.iter_mut().enumerate() {
            let (row, k) = (j / n, j % n);
            match row {
                1 if k % 5 == 0 => *x = f32::NEG_INFINITY,
                2 => *x = (k * 7919 % 401) as f32 - 200.0,
                3 if k == n / 2 => *x = f32::NAN,
                4 => *x = f32::NEG_INFINITY,
                5 if k == n - 1 => *x = f32::INFINITY,
                _ => {}
            }
        }
        let x = Tensor::from_vec(v, [7, n])?;
        let one = std::slice::from_ref(&x);
        check(&format!("softmax [7,{n}]"), one, soft, |t| t[0].softmax(-1))?;
        check(&format!("log_softmax [7,{n}]"), one, log_soft, |t| {
            t[0].log_softmax(-1)
        })?;
        check(&format!("sum(exp(x)) [7,{n}]"), one, soft, |t| {
            t[0].exp()?.sum(&[1], false)
        })?;
    }
    Ok(())
}

/// Long rows scaled by their own max (on AVX2 machines the max and the
/// product by calls of 256-bit code, the product reading the input row):
/// exact, with ragged ends and the NaN, infinities and zeros `input` puts
/// in.
#[test]
fn long_rows_scaled_by_their_max_agree_exactly() -> Result<()> {
    for n in [32, 33, 50, 1027] {
        let x = input(&[5, n], 47, true)?;
        check(
            &format!("x * max(x) [5,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].mul(&t[0].max(&[1], true)?),
        )?;
    }
    Ok(())
}

#[test]
fn compiled_graphs_replay_and_reject_wrong_inputs() -> Result<()> {
    let w = Tensor::randn([16, 4], 1)?;
    let spec = kiln::TensorType::new(DType::F32, [8, 16]);
    let mut g = kiln::compile("layer", &[spec], |x| {
        Ok(vec![(x[0].matmul(&w)?.relu()? + 1.0f32)?])
    })?;
    for seed in 0..3 {
        let x = Tensor::randn([8, 16], seed)?;
        let got = g.call(&[&x])?;
        let want = (x.to(Device::Reference)?.matmul(&w)?.relu()? + 1.0f32)?;
        compare(
            "compiled call",
            &data(&got[0])?,
            &data(&want)?,
            sum_tol(16, 16.0),
        );
    }
    let wrong = Tensor::randn([8, 15], 0)?;
    let err = g.call(&[&wrong]).err().map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("layer: input 0 must be f32[8,16], got 120 values of f32")
    );
    let err = g.call(&[]).err().map(|e| e.to_string());
    assert_eq!(err.as_deref(), Some("layer: expected 1 arguments, got 0"));
    Ok(())
}

#[test]
fn an_empty_matmul_of_a_padded_operand_is_empty() -> Result<()> {
    // A padded view of an empty tensor has an offset before its buffer.
    let (a, b) = (
        Tensor::from_vec(Vec::<f32>::new(), [2, 0, 7])?,
        input(&[4, 10, 1], 51, false)?,
    );
    check("empty padded matmul", &[a, b], EXACT, |t| {
        t[0].pad(&[(2, 0), (0, 0), (2, 1)], f32::NEG_INFINITY)?
            .matmul(&t[1])
    })?;
    let (x, w) = (input(&[3, 0], 52, false)?, input(&[0, 2], 53, false)?);
    check("matmul over an empty axis", &[x, w], EXACT, |t| {
        t[0].matmul(&t[1])
    })
}
