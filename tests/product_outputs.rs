//! Matmuls whose kernel's output cannot hold the f32 product (a bf16, f16,
//! f64, i64, u8 or bool output: the product rounded, widened, converted
//! or compared, with a bias and ReLU between): the kernel keeps the product
//! apart, in scratch after any operand a prologue writes there, and its
//! epilogue reads it there. One kernel each, against the interpreter.

// The shared helpers, of which this file uses some.
#[allow(dead_code)]
mod agree;

use agree::{EXACT, Tol, check, input, product_tol};
use kiln::{DType, Options, Result, Tensor};

/// `f`'s graph is one kernel: its output's conversion costs none.
fn one_kernel(
    what: &str,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<()> {
    let out = f(inputs)?;
    let optimized = kiln::optimize(what, &[&out], Options::default())?;
    assert_eq!(
        optimized.schedule.kernels(),
        1,
        "{what}:\n{}",
        optimized.graph
    );
    Ok(())
}

/// The tolerance of a product of depth `k` stored as `dtype`: rounded once
/// to a 16-bit output's precision, exact for the others.
fn stored_tol(dtype: DType, k: usize) -> Tol {
    let rtol = match dtype {
        DType::BF16 => 2f64.powi(-7),
        DType::F16 => 2f64.powi(-10),
        _ => 1e-6,
    };
    Tol {
        rtol,
        ..product_tol(k, 16.0)
    }
}

#[test]
fn products_into_outputs_of_other_sizes() -> Result<()> {
    for (m, k, n) in [(1, 5, 3), (7, 1027, 3), (50, 3, 1027), (64, 784, 256)] {
        let (x, w, bias) = (
            input(&[m, k], 51, false)?,
            input(&[k, n], 52, false)?,
            input(&[n], 53, false)?,
        );
        for dtype in [DType::BF16, DType::F16, DType::F64] {
            let tol = stored_tol(dtype, k);
            let product = |t: &[Tensor]| t[0].matmul(&t[1])?.cast(dtype);
            let dense = |t: &[Tensor]| (t[0].matmul(&t[1])? + &t[2])?.relu()?.cast(dtype);
            let what = format!("(x@w) as {dtype} {m}x{k}x{n}");
            check(&what, &[x.clone(), w.clone()], tol, product)?;
            one_kernel(&what, &[x.clone(), w.clone()], product)?;
            let what = format!("relu(x@w+b) as {dtype} {m}x{k}x{n}");
            check(&what, &[x.clone(), w.clone(), bias.clone()], tol, dense)?;
            one_kernel(&what, &[x.clone(), w.clone(), bias.clone()], dense)?;
        }
    }
    Ok(())
}

/// Integer and boolean outputs: small integers, whose sums are exact on
/// every path, so that the conversion and the comparison agree exactly.
#[test]
fn products_into_integer_and_boolean_outputs() -> Result<()> {
    let ints = |dims: &[usize], seed: u64| -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let values: Vec<f32> = (0..n as u64)
            .map(|i| ((i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed) >> 59) as f32 % 5.0 - 2.0)
            .collect();
        Tensor::from_vec(values, dims)
    };
    for (m, k, n) in [(3, 7, 5), (37, 64, 129)] {
        let (x, w) = (ints(&[m, k], 1)?, ints(&[k, n], 2)?);
        let to_i64 = |t: &[Tensor]| t[0].matmul(&t[1])?.cast(DType::I64);
        let zero = Tensor::scalar(0.0f32);
        let positive = |t: &[Tensor]| t[0].matmul(&t[1])?.gt(&zero);
        let to_u8 = |t: &[Tensor]| t[0].matmul(&t[1])?.relu()?.cast(DType::U8);
        for (what, f) in [
            (
                "(x@w) as i64",
                &to_i64 as &dyn Fn(&[Tensor]) -> Result<Tensor>,
            ),
            ("x@w > 0", &positive),
            ("relu(x@w) as u8", &to_u8),
        ] {
            let what = format!("{what} {m}x{k}x{n}");
            check(&what, &[x.clone(), w.clone()], EXACT, f)?;
            one_kernel(&what, &[x.clone(), w.clone()], f)?;
        }
    }
    Ok(())
}

/// A computed operand written into scratch by its prologue (bytes
/// normalized, as a first layer reads images), the product after it.
#[test]
fn a_product_apart_follows_a_written_operand() -> Result<()> {
    let (m, k, n) = (50, 300, 70);
    let bytes: Vec<u8> = (0..m * k).map(|i| (i * 7919 % 256) as u8).collect();
    let x = Tensor::from_vec(bytes, [m, k])?;
    let w = input(&[k, n], 54, false)?;
    let layer = |t: &[Tensor]| {
        let pixels = ((t[0].cast(DType::F32)? * (1.0f32 / 255.0))? - 0.5f32)?;
        pixels.matmul(&t[1])?.relu()?.cast(DType::BF16)
    };
    check(
        "normalized u8 @ w as bf16",
        &[x.clone(), w.clone()],
        stored_tol(DType::BF16, k),
        layer,
    )?;
    one_kernel("normalized u8 @ w as bf16", &[x, w], layer)
}
