//! The CUDA runtime: opening a device fails with a clear `Err` where there is
//! none (no driver, no NVRTC, no such ordinal), never a panic; on a GPU,
//! compiled graphs agree with the interpreter in both matmul precisions, and
//! batches staged through pinned memory while the previous launch computes
//! give the results of plain runs.
//! Every op and fusion kind runs on the GPU through `tests/cpu.rs` with
//! `KILN_TEST_DEVICE=cuda:0`. GPU-only tests print why they skip.

#![cfg(feature = "cuda")]

use kiln::{DType, Data, DataRef, Device, Options, Result, Tensor, TensorType};
use kiln_runtime::cuda::device::{self, Executable, Precision};

/// The first GPU, or why there is none.
fn gpu() -> std::result::Result<std::sync::Arc<device::Device>, String> {
    device::device(0).map_err(|e| e.to_string())
}

#[test]
fn a_missing_gpu_is_an_err_not_a_panic() -> Result<()> {
    let x = Tensor::randn([4, 4], 0)?;
    match gpu() {
        Err(why) => {
            // Each layer of the missing stack says what is missing.
            assert!(
                why.contains("no NVIDIA driver")
                    || why.contains("LD_LIBRARY_PATH")
                    || why.contains("no device"),
                "{why}"
            );
            let on_gpu = (x.to(Device::Cuda(0))? * 2.0f32)?;
            let err = on_gpu.to_vec::<f32>().err().map(|e| e.to_string());
            assert_eq!(err.as_deref(), Some(why.as_str()));
            let compiled = kiln::compile_on(
                Device::Cuda(0),
                "double",
                &[TensorType::new(DType::F32, [4, 4])],
                Options::default(),
                |t| Ok(vec![(&t[0] * 2.0f32)?]),
            );
            assert!(compiled.is_err());
        }
        Ok(d) => {
            let err = device::device(1 << 20).err().map(|e| e.to_string());
            assert!(err.is_some_and(|e| e.contains("no device")), "{}", d.name());
        }
    }
    Ok(())
}

/// relu(x @ w + b) @ w2 with normalized u8 input: every matmul kind (a
/// computed operand, the bias+ReLU epilogue, a plain product).
fn mlp(x: &Tensor, w: &Tensor, b: &Tensor, w2: &Tensor) -> Result<Tensor> {
    let pixels = ((x.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.5f32)?;
    (pixels.matmul(w)? + b)?.relu()?.matmul(w2)
}

#[test]
fn compiled_graphs_agree_with_the_interpreter_in_both_precisions() -> Result<()> {
    let d = match gpu() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("skipped: {why}");
            return Ok(());
        }
    };
    let bytes: Vec<u8> = (0..64 * 784).map(|i| (i * 37 % 256) as u8).collect();
    let x = Tensor::from_vec(bytes.clone(), [64, 784])?;
    let (w, b, w2) = (
        Tensor::randn([784, 256], 1)?,
        Tensor::randn([256], 2)?,
        Tensor::randn([256, 10], 3)?,
    );
    let want = mlp(&x.to(Device::Reference)?, &w, &b, &w2)?.to_vec::<f32>()?;
    let optimized = kiln::optimize("mlp", &[&mlp(&x, &w, &b, &w2)?], Options::default())?;
    // TF32 keeps 10 mantissa bits per product: about 1e-3 of the magnitudes summed.
    for (precision, rtol) in [(Precision::F32, 1e-4f32), (Precision::Tf32, 2e-2)] {
        let mut exec = Executable::new(optimized.clone(), d.clone(), precision)?;
        let inputs: Vec<Data> = optimized
            .graph
            .inputs
            .iter()
            .zip([x.clone(), w.clone(), b.clone(), w2.clone()])
            .map(|(ty, t)| match ty.dtype {
                DType::U8 => t.to_vec::<u8>().map(Data::U8),
                _ => t.to_vec::<f32>().map(Data::F32),
            })
            .collect::<Result<_>>()?;
        let refs: Vec<DataRef> = inputs.iter().map(DataRef::from).collect();
        let mut out = vec![Data::zeros(DType::F32, 64 * 10)];
        exec.run_into(&refs, &mut out)?;
        let Data::F32(got) = &out[0] else {
            panic!("f32 logits");
        };
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= rtol * scale,
                "{precision:?}: logit {i}: gpu {g}, reference {w}"
            );
        }
        eprintln!(
            "{precision:?} on {}: agrees within {rtol} of {scale}",
            d.name()
        );
    }
    Ok(())
}

#[test]
fn prepared_inputs_overlap_the_previous_launch_and_give_the_same_results() -> Result<()> {
    let d = match gpu() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("skipped: {why}");
            return Ok(());
        }
    };
    let w = Tensor::randn([64, 32], 1)?;
    let graph = |x: &Tensor| (x.cast(DType::F32)? * (1.0f32 / 255.0))?.matmul(&w)?.relu();
    let spec = Tensor::from_vec(vec![0u8; 16 * 64], [16, 64])?;
    let optimized = kiln::optimize("batches", &[&graph(&spec)?], Options::default())?;
    let batches: Vec<Data> = (0..4u8)
        .map(|b| {
            Data::U8(
                (0..16 * 64)
                    .map(|i| (i as u8).wrapping_mul(b + 1))
                    .collect(),
            )
        })
        .collect();
    let weights = Data::F32(w.to_vec()?);
    let types = optimized.graph.inputs.clone();
    let mut plain = Executable::new(optimized.clone(), d.clone(), Precision::F32)?;
    let mut piped = Executable::new(optimized.clone(), d, Precision::F32)?;
    piped.prepare(&arguments(&types, &batches[0], &weights))?;
    for (i, batch) in batches.iter().enumerate() {
        piped.launch_prepared()?;
        if let Some(next) = batches.get(i + 1) {
            piped.prepare(&arguments(&types, next, &weights))?;
        }
        let mut got = vec![Data::zeros(DType::F32, 16 * 32)];
        piped.finish(&arguments(&types, batch, &weights), &mut got)?;
        let mut want = vec![Data::zeros(DType::F32, 16 * 32)];
        plain.run_into(&arguments(&types, batch, &weights), &mut want)?;
        assert_eq!(got, want, "batch {i}");
    }
    Ok(())
}

/// The graph's inputs in order: the batch for the u8 input, the weights for the other.
fn arguments<'a>(types: &[TensorType], x: &'a Data, weights: &'a Data) -> Vec<DataRef<'a>> {
    types
        .iter()
        .map(|ty| match ty.dtype {
            DType::U8 => DataRef::from(x),
            _ => DataRef::from(weights),
        })
        .collect()
}
