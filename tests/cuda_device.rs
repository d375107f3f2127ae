//! The CUDA runtime: opening a device fails with a clear `Err` where there is
//! none (no driver, no NVRTC, no such ordinal), never a panic; on a GPU,
//! compiled graphs agree with the interpreter in both matmul precisions.
//! Also on a GPU: matmul operands read in place at unaligned offsets,
//! cuBLASLt's fused ReLU against kiln's (NaN, infinities, signed zeros),
//! empty inputs, an executable run on another thread, products run from
//! many threads at once, and the feed of batches through pinned memory:
//! each batch handed out once, values held by the caller kept, a feed
//! dropped mid-copy.
//! Every op and fusion kind runs on the GPU through `tests/cpu.rs` and `tests/cpu_products.rs` with
//! `KILN_TEST_DEVICE=cuda:0`. GPU-only tests print why they skip.

#![cfg(feature = "cuda")]

use kiln::{CompileOptions, DType, Data, DataRef, Device, Options, Result, Tensor, TensorType};
use kiln_runtime::cuda::{self, Executable};
use kiln_runtime::{Backend as _, Executable as _, Precision};

/// Backend options with matmuls in `precision`.
fn options(precision: Precision) -> kiln::BackendOptions {
    kiln::BackendOptions {
        precision,
        ..kiln::BackendOptions::default()
    }
}

/// The first GPU, or why there is none.
fn gpu() -> std::result::Result<std::sync::Arc<cuda::Gpu>, String> {
    cuda::gpu(0).map_err(|e| e.to_string())
}

/// The first GPU, or `None` after printing why the test skips.
fn gpu_or_skip() -> Option<std::sync::Arc<cuda::Gpu>> {
    gpu().map_err(|why| eprintln!("skipped: {why}")).ok()
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
            // A value is copied in when it moves, so the move says it.
            let err = x.to(Device::Cuda(0)).err().map(|e| e.to_string());
            assert_eq!(err.as_deref(), Some(why.as_str()));
            let stats = kiln::memory_stats(Device::Cuda(0)).err();
            assert_eq!(stats.map(|e| e.to_string()).as_deref(), Some(why.as_str()));
            let compiled = kiln::compile_with(
                "double",
                &[TensorType::new(DType::F32, [4, 4])],
                CompileOptions {
                    device: Device::Cuda(0),
                    backend: kiln::BackendOptions::default(),
                    ..CompileOptions::default()
                },
                |t| Ok(vec![(&t[0] * 2.0f32)?]),
            );
            assert!(compiled.is_err());
        }
        Ok(d) => {
            let err = cuda::gpu(1 << 20).err().map(|e| e.to_string());
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
    let Some(d) = gpu_or_skip() else {
        return Ok(());
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
        let mut exec = Executable::new(optimized.clone(), d.clone(), options(precision))?;
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
        let mut out = vec![Data::zeros(DType::F32, 64 * 10).unwrap()];
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

/// `f` on GPU 0 (matmuls in TF32) against the interpreter: NaN exactly
/// where the interpreter has NaN, zeros of its sign, other values within
/// `rtol` of the largest magnitude. Returns false, saying why, where there is no GPU.
fn agrees_on_the_gpu(
    inputs: &[Tensor],
    rtol: f32,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<bool> {
    if gpu_or_skip().is_none() {
        return Ok(false);
    }
    let on = |device: Device| -> Result<Vec<f32>> {
        let moved: Vec<Tensor> = inputs.iter().map(|t| t.to(device)).collect::<Result<_>>()?;
        f(&moved)?.to_vec::<f32>()
    };
    let (got, want) = (on(Device::Cuda(0))?, on(Device::Reference)?);
    assert_eq!(got.len(), want.len());
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.is_nan(),
            w.is_nan(),
            "element {i}: gpu {g}, reference {w}"
        );
        if *g == 0.0 && *w == 0.0 {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "element {i}: gpu {g}, reference {w}"
            );
        }
        assert!(
            w.is_nan() || g == w || (g - w).abs() <= rtol * scale,
            "element {i}: gpu {g}, reference {w}"
        );
    }
    Ok(true)
}

/// TF32 keeps 10 mantissa bits per product: about 1e-3 of the magnitudes summed.
const TF32: f32 = 2e-2;

#[test]
fn matmuls_of_operands_at_an_offset_run_on_the_gpu() -> Result<()> {
    // Views read in place at element offsets 1, 129 and 3: pointers 4-byte
    // aligned, which cuBLASLt's heuristic must be told.
    let x = Tensor::randn([65, 129], 1)?;
    let w = Tensor::randn([128, 100], 2)?;
    let b = Tensor::randn([96], 3)?;
    let inputs = [x, w, b];
    let ran = agrees_on_the_gpu(&inputs, TF32, |t| {
        let columns = t[0].slice(0, 0, 64, 1)?.slice(1, 1, 129, 1)?;
        (columns.matmul(&t[1].slice(1, 3, 99, 1)?)? + &t[2])?.relu()
    })?;
    if ran {
        agrees_on_the_gpu(&inputs, TF32, |t| {
            let rows = t[0].slice(0, 1, 65, 1)?.slice(1, 0, 128, 1)?;
            rows.matmul(&t[1])
        })?;
        let batched = [Tensor::randn([3, 33, 18], 4)?, Tensor::randn([17, 5], 5)?];
        agrees_on_the_gpu(&batched, TF32, |t| t[0].slice(2, 1, 18, 1)?.matmul(&t[1]))?;
    }
    Ok(())
}

/// kiln's relu keeps NaN and turns -0 into +0 (`x > 0 ? x : +0` on
/// non-NaN). cuBLASLt documents its RELU_BIAS epilogue only as a ReLU;
/// this pins what the fused path computes against the interpreter.
#[test]
fn relu_after_a_fused_bias_keeps_nan_and_gives_plus_zero() -> Result<()> {
    let mut x = Tensor::randn([64, 96], 1)?.to_vec::<f32>()?;
    x[5 * 96 + 7] = f32::NAN;
    x[9 * 96] = f32::INFINITY;
    // Row 11 is -0 throughout: with a positive w, its products and their
    // sums are -0, and so is -0 plus a bias of -0.
    x[11 * 96..12 * 96].fill(-0.0);
    let w = Tensor::randn([96, 80], 2)?.abs()?;
    let mut b = Tensor::randn([80], 3)?.to_vec::<f32>()?;
    b[..4].fill(-0.0);
    let inputs = [
        Tensor::from_vec(x, [64, 96])?,
        w,
        Tensor::from_vec(b, [80])?,
    ];
    agrees_on_the_gpu(&inputs, TF32, |t| (t[0].matmul(&t[1])? + &t[2])?.relu())?;
    Ok(())
}

#[test]
fn empty_inputs_run() -> Result<()> {
    let Some(d) = gpu_or_skip() else {
        return Ok(());
    };
    let x = Tensor::from_vec(Vec::<f32>::new(), [0, 4])?;
    let y = Tensor::randn([4], 1)?;
    let outputs = [(&x + &y)?.relu()?, (x.sum(&[0], false)? + &y)?];
    let optimized = kiln::optimize("empty", &[&outputs[0], &outputs[1]], Options::default())?;
    let mut exec = Executable::new(optimized.clone(), d, options(Precision::F32))?;
    let data: Vec<Data> = optimized
        .graph
        .inputs
        .iter()
        .map(|ty| match ty.shape.numel() {
            0 => Ok(Data::F32(Vec::new())),
            _ => y.to_vec::<f32>().map(Data::F32),
        })
        .collect::<Result<_>>()?;
    let inputs: Vec<DataRef> = data.iter().map(DataRef::from).collect();
    let mut out = vec![
        Data::zeros(DType::F32, 0).unwrap(),
        Data::zeros(DType::F32, 4).unwrap(),
    ];
    exec.run_into(&inputs, &mut out)?;
    assert_eq!(out[1], Data::F32(y.to_vec()?));
    Ok(())
}

/// A batch's values, borrowed.
fn refs(b: &[Data; 2]) -> [DataRef<'_>; 2] {
    [DataRef::from(&b[0]), DataRef::from(&b[1])]
}

/// Batch `k` of a feed test: `n` bytes and `n` i32 values.
fn fed(k: i32, n: usize) -> [Data; 2] {
    [
        Data::U8((0..n).map(|i| (i as i32 * 7 + k) as u8).collect()),
        Data::I32((0..n as i32).map(|i| i * 3 - k).collect()),
    ]
}

#[test]
fn a_feed_hands_out_each_batch_and_keeps_what_is_held() -> Result<()> {
    if gpu_or_skip().is_none() {
        return Ok(());
    }
    let mut feed = cuda::Cuda { ordinal: 0 }.feed()?;
    assert!(feed.take().is_err(), "a take with nothing put");
    let types = |n: usize| {
        [
            TensorType::new(DType::U8, [n]),
            TensorType::new(DType::I32, [n]),
        ]
    };
    let first = fed(0, 1000);
    assert!(
        feed.put(&types(999), &refs(&first)).is_err(),
        "values longer than their types"
    );
    feed.put(&types(1000), &refs(&first))?;
    assert!(
        feed.put(&types(1000), &refs(&first)).is_err(),
        "a second put before a take"
    );
    // Held while three more batches go through the same two sets of buffers.
    let held = feed.take()?;
    for k in 1..4 {
        // The last batch is shorter, and the one before it empty.
        let n = [1000, 0, 77][k as usize - 1];
        let batch = fed(k, n);
        feed.put(&types(n), &refs(&batch))?;
        let got = feed.take()?;
        for (storage, want) in got.iter().zip(&batch) {
            assert_eq!(&*storage.to_host()?, want, "batch {k}");
        }
    }
    for (storage, want) in held.iter().zip(&first) {
        assert_eq!(&*storage.to_host()?, want, "the batch held");
    }
    Ok(())
}

#[test]
fn an_executable_moved_to_another_thread_runs_there() -> Result<()> {
    let Some(d) = gpu_or_skip() else {
        return Ok(());
    };
    let (x, w) = (Tensor::randn([32, 48], 1)?, Tensor::randn([48, 24], 2)?);
    let optimized = kiln::optimize("moved", &[&x.matmul(&w)?.relu()?], Options::default())?;
    let data = [Data::F32(x.to_vec()?), Data::F32(w.to_vec()?)];
    let run = move |mut exec: Executable| -> Result<Data> {
        let inputs: Vec<DataRef> = data.iter().map(DataRef::from).collect();
        let mut out = vec![Data::zeros(DType::F32, 32 * 24).unwrap()];
        exec.run_into(&inputs, &mut out)?;
        Ok(out.remove(0))
    };
    let here = run.clone()(Executable::new(
        optimized.clone(),
        d.clone(),
        options(Precision::Tf32),
    )?)?;
    let exec = Executable::new(optimized, d, options(Precision::Tf32))?;
    let there = std::thread::spawn(move || run(exec))
        .join()
        .expect("the thread returns")?;
    assert_eq!(here, there);
    Ok(())
}

/// Products run from eight threads at once, each thread calling its own
/// compiled graph, agree with the CPU's: the kernels of one cuBLASLt
/// product (partial products in the workspace every product shares, then
/// their sum) are never split by another thread's. Every call is on inputs
/// copied in anew and kept, so no two calls have the same buffers and
/// none is a graph replay (one operation of the stream): each enqueues its
/// product's kernels one by one. Shapes of the tests above, and long sums,
/// which the heuristic splits.
#[test]
fn products_run_from_many_threads_at_once_agree() -> Result<()> {
    if gpu_or_skip().is_none() {
        return Ok(());
    }
    let shapes = [(32, 48, 24), (64, 96, 80), (16, 4096, 16), (128, 512, 64)];
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                s.spawn(move || -> Result<()> {
                    let (m, k, n) = shapes[t as usize % shapes.len()];
                    let (x, w) = (Tensor::randn([m, k], t)?, Tensor::randn([k, n], t + 8)?);
                    let want = x.matmul(&w)?.relu()?.to_vec::<f32>()?;
                    let scale = want.iter().fold(1.0f32, |a, v| a.max(v.abs()));
                    let options = CompileOptions {
                        device: Device::Cuda(0),
                        backend: options(Precision::Tf32),
                        ..CompileOptions::default()
                    };
                    let spec = [x.ty().clone(), w.ty().clone()];
                    let mut product = kiln::compile_with("threads", &spec, options, |t| {
                        Ok(vec![t[0].matmul(&t[1])?.relu()?])
                    })?;
                    let mut kept = Vec::new();
                    for run in 0..20 {
                        let inputs = [x.to(Device::Cuda(0))?, w.to(Device::Cuda(0))?];
                        let got = product.call(&[&inputs[0], &inputs[1]])?.remove(0);
                        for (i, (g, w)) in got.to_vec::<f32>()?.iter().zip(&want).enumerate() {
                            assert!(
                                (g - w).abs() <= TF32 * scale,
                                "{m}x{k}x{n}, run {run}, element {i}: gpu {g}, cpu {w}"
                            );
                        }
                        kept.push((inputs, got));
                    }
                    Ok(())
                })
            })
            .collect();
        (threads.into_iter())
            .try_for_each(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

#[test]
fn a_feed_dropped_with_a_copy_in_flight_frees_safely() -> Result<()> {
    let Some(d) = gpu_or_skip() else {
        return Ok(());
    };
    let x = Tensor::randn([4096, 4096], 1)?;
    let batch = Data::F32(x.to_vec()?);
    let ty = [TensorType::new(DType::F32, [4096, 4096])];
    for _ in 0..3 {
        // A 64 MiB copy is still running when the feed goes.
        let mut feed = cuda::Cuda { ordinal: 0 }.feed()?;
        feed.put(&ty, &[DataRef::from(&batch)])?;
    }
    let optimized = kiln::optimize("dropped", &[&x.relu()?], Options::default())?;
    let mut exec = Executable::new(optimized, d, options(Precision::F32))?;
    let mut out = vec![Data::zeros(DType::F32, 4096 * 4096).unwrap()];
    exec.run_into(&[DataRef::from(&batch)], &mut out)?;
    let want: Vec<f32> = x.to_vec::<f32>()?.iter().map(|v| v.max(0.0)).collect();
    assert_eq!(out[0], Data::F32(want));
    Ok(())
}
