//! Every path a graph can take, for the index, join and random tests:
//! realized on the CPU
//! and on the reference interpreter, and compiled on the CPU fused and
//! unfused (and on the GPU that `KILN_TEST_DEVICE=cuda:N` names, its
//! matmuls in IEEE f32 as the interpreter's: TF32 keeps 10 bits of each
//! operand), with checks of the results against expected values.

use kiln::{
    BackendOptions, CompileOptions, DType, Device, Options, Precision, Result, Tensor, TensorType,
};

/// The results of `f` on `inputs` along every path, each with its name.
pub fn every_path(
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let mut results = Vec::new();
    for device in [Device::Cpu, Device::Reference] {
        let moved: Vec<Tensor> = inputs.iter().map(|t| t.to(device)).collect::<Result<_>>()?;
        results.push((format!("realized on {device:?}"), f(&moved)?));
    }
    let mut compiled = vec![
        (
            Device::Cpu,
            Options {
                fusion: true,
                ..Options::default()
            },
        ),
        (
            Device::Cpu,
            Options {
                fusion: false,
                ..Options::default()
            },
        ),
    ];
    if let Some(n) = std::env::var("KILN_TEST_DEVICE")
        .ok()
        .and_then(|d| d.strip_prefix("cuda:").and_then(|n| n.parse().ok()))
    {
        compiled.push((
            Device::Cuda(n),
            Options {
                fusion: true,
                ..Options::default()
            },
        ));
        compiled.push((
            Device::Cuda(n),
            Options {
                fusion: false,
                ..Options::default()
            },
        ));
    }
    let specs: Vec<_> = inputs
        .iter()
        .map(|t| TensorType::new(t.dtype(), t.shape().clone()))
        .collect();
    for (device, options) in compiled {
        let mut graph = kiln::compile_with(
            "index",
            &specs,
            CompileOptions {
                device,
                optimizer: options,
                backend: BackendOptions {
                    precision: Precision::F32,
                    ..BackendOptions::default()
                },
            },
            |x| Ok(vec![f(x)?]),
        )?;
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let out = graph.call(&refs)?.remove(0);
        results.push((format!("compiled on {device:?}, {options:?}"), out));
    }
    Ok(results)
}

/// Every element as f64 (which holds each dtype's values exactly, i64's
/// up to 2^53).
pub fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::F64 => t.to_vec::<f64>()?,
        DType::I64 => t.to_vec::<i64>()?.into_iter().map(|x| x as f64).collect(),
        DType::I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        DType::U8 => t.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
        DType::Bool => t.to_vec::<bool>()?.into_iter().map(f64::from).collect(),
        DType::BF16 => t
            .to_vec::<kiln::bf16>()?
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F16 => t
            .to_vec::<kiln::f16>()?
            .into_iter()
            .map(f64::from)
            .collect(),
    })
}

/// `f` on `inputs` along every path equals `want` of shape `dims` and dtype
/// `dtype` exactly (NaN matches NaN).
pub fn check(
    what: &str,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    dtype: DType,
    dims: &[usize],
    want: &[f64],
) -> Result<()> {
    for (path, out) in every_path(inputs, &f)? {
        assert_eq!(out.dims(), dims, "{what}, {path}: shape");
        assert_eq!(out.dtype(), dtype, "{what}, {path}: dtype");
        let got = values(&out)?;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                g == w || (g.is_nan() && w.is_nan()),
                "{what}, {path}: element {i}: got {g}, want {w}"
            );
        }
    }
    Ok(())
}

/// `f` on `inputs` along every path within `tol` (relative to the largest
/// magnitude) of the interpreter's result, NaN where it has NaN.
pub fn close(
    what: &str,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    tol: f64,
) -> Result<()> {
    let paths = every_path(inputs, &f)?;
    let want = values(&paths[1].1)?;
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(1.0f64, |m, w| m.max(w.abs()));
    for (path, out) in &paths {
        assert_eq!(out.dims(), paths[1].1.dims(), "{what}, {path}: shape");
        for (i, (g, w)) in values(out)?.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= tol * scale || (g.is_nan() && w.is_nan()),
                "{what}, {path}: element {i}: got {g}, want {w}"
            );
        }
    }
    Ok(())
}
