//! The device under test against the reference interpreter, for
//! `tests/cpu.rs`, `tests/cpu_products.rs` and `tests/product_outputs.rs`:
//! the device, seeded inputs with special values, the tolerances and the
//! comparison.

use kiln::{DType, Data, Device, Result, Tensor};
use kiln_support::data;

pub const SIZES: [usize; 5] = [1, 3, 7, 50, 1027];

/// The device under test (`KILN_TEST_DEVICE=cuda:0` in a build without
/// feature `cuda` fails every test with the not-built error).
pub fn device() -> Device {
    if let Some(n) = std::env::var("KILN_TEST_DEVICE")
        .ok()
        .and_then(|d| d.strip_prefix("cuda:").and_then(|n| n.parse().ok()))
    {
        return Device::Cuda(n);
    }
    Device::Cpu
}

/// The bound of exp: 2 ulp for CUDA's `expf`, below that for kiln's CPU polynomial.
pub fn exp_rtol() -> f64 {
    if device() == Device::Cpu {
        2e-7
    } else {
        2.5e-7
    }
}

/// Seeded normal values with the special values sprinkled in.
pub fn input(dims: &[usize], seed: u64, specials: bool) -> Result<Tensor> {
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
pub struct Tol {
    pub rtol: f64,
    pub atol: f64,
}

pub const EXACT: Tol = Tol {
    rtol: 0.0,
    atol: 0.0,
};

/// Compares element by element; NaN matches NaN, and -0 matches +0 only
/// under a tolerance.
pub fn compare(what: &str, cpu: &Data, reference: &Data, tol: Tol) {
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
pub fn check(
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
pub fn sum_tol(n: usize, scale: f64) -> Tol {
    Tol {
        rtol: 1e-6,
        atol: 4.0 * n as f64 * f64::from(f32::EPSILON) * scale,
    }
}

/// The error bound of a product summed over `k` terms of magnitude up to
/// `scale`: f32 accumulation on the CPU, TF32 products (10-bit mantissas,
/// relative error 2^-10 each) on a GPU.
pub fn product_tol(k: usize, scale: f64) -> Tol {
    if device() == Device::Cpu {
        sum_tol(k, scale)
    } else {
        Tol {
            rtol: 1e-3,
            atol: k as f64 * scale * 2f64.powi(-10),
        }
    }
}
