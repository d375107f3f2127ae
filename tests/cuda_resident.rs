//! Values that live on the GPU: eager ops on device tensors read and
//! write device memory only, compiled calls read device tensors where they
//! are and leave their outputs there, a training step moves its batch in
//! and its loss out and nothing else (a batch already on the device, not
//! even that) while its state is written in place, matching the same step
//! run on host data bit for bit, steps on the buffers of the step before
//! replay as one CUDA graph launch with the same results, a loader's epoch
//! fed to the GPU copies each batch in once (an epoch's first while the
//! one before ends) and trains as host batches do, and running out of
//! device memory is an `Err` after which the device still computes. The
//! traffic is read from `kiln::memory_stats`. Every test skips, saying
//! why, where there is no GPU.

#![cfg(feature = "cuda")]

use std::sync::{Arc, Mutex};

use kiln::data::{DataError, DataLoader, Dataset, LoaderOptions};
use kiln::optim::{Optimizer, Sgd};
use kiln::{
    BackendOptions, CompileOptions, DType, Data, Device, MemoryStats, Precision, Result, Tensor,
    TensorType,
};

const GPU: Device = Device::Cuda(0);

/// GPU 0 with matmuls in IEEE f32 (cuBLAS `sgemm`), so that results are
/// the same bits run after run.
fn ieee_on_gpu() -> CompileOptions {
    CompileOptions {
        device: GPU,
        backend: BackendOptions {
            precision: Precision::F32,
            ..BackendOptions::default()
        },
        ..CompileOptions::default()
    }
}

/// The counters are the device's, shared by every test of this binary:
/// each test holds this while it runs.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The first GPU's counters, or `None` after printing why the test skips.
fn stats_or_skip() -> Option<MemoryStats> {
    kiln::memory_stats(GPU)
        .map_err(|why| eprintln!("skipped: {why}"))
        .ok()
}

/// What moved between `before` and now.
fn moved(before: MemoryStats) -> Result<(u64, u64, u64)> {
    let now = kiln::memory_stats(GPU)?;
    Ok((
        now.bytes_to_device - before.bytes_to_device,
        now.bytes_to_host - before.bytes_to_host,
        now.host_waits - before.host_waits,
    ))
}

#[test]
fn eager_ops_on_device_tensors_stay_on_the_device() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if stats_or_skip().is_none() {
        return Ok(());
    }
    let (a, b) = (Tensor::randn([257, 131], 1)?, Tensor::randn([131], 2)?);
    let (ga, gb) = (a.to(GPU)?, b.to(GPU)?);
    let before = kiln::memory_stats(GPU)?;
    // Three realizes, each reading the last one's result on the device.
    let y = (&ga + &gb)?.relu()?;
    y.realize()?;
    let z = (&y * 2.0f32)?.exp()?;
    z.realize()?;
    let s = z.sum(&[1], false)?;
    s.realize()?;
    assert_eq!(s.device(), GPU);
    assert_eq!(moved(before)?, (0, 0, 0), "bytes in, bytes out, waits");
    kiln::synchronize(GPU)?;
    assert_eq!(moved(before)?, (0, 0, 1), "a synchronize waits once");
    let got = s.to_vec::<f32>()?;
    assert_eq!(moved(before)?, (0, 257 * 4, 2), "one read, one more wait");
    let want = (((&a + &b)?.relu()? * 2.0f32)?.exp()?)
        .to(Device::Reference)?
        .sum(&[1], false)?
        .to_vec::<f32>()?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs(),
            "[{i}]: gpu {g}, reference {w}"
        );
    }
    Ok(())
}

#[test]
fn compiled_calls_read_device_tensors_where_they_are() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if stats_or_skip().is_none() {
        return Ok(());
    }
    let w = Tensor::randn([96, 33], 3)?;
    let spec = [TensorType::new(DType::F32, [70, 96])];
    // The captured weight is copied in once, when the graph is compiled.
    let mut layer = kiln::compile_with("layer", &spec, ieee_on_gpu(), |t| {
        Ok(vec![t[0].matmul(&w)?.relu()?])
    })?;
    let x = Tensor::randn([70, 96], 4)?;
    let on_gpu = x.to(GPU)?;
    let before = kiln::memory_stats(GPU)?;
    let mut out = layer.call(&[&on_gpu])?.remove(0);
    for _ in 0..3 {
        out = layer.call(&[&on_gpu])?.remove(0);
    }
    assert_eq!(out.device(), GPU);
    assert_eq!(moved(before)?, (0, 0, 0), "bytes in, bytes out, waits");
    let got = out.to_vec::<f32>()?;
    let want = x
        .matmul(&w)?
        .relu()?
        .to(Device::Reference)?
        .to_vec::<f32>()?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "[{i}]: gpu {g}, reference {w}"
        );
    }
    Ok(())
}

const BATCH: usize = 50;

/// SGD at 0.05 with momentum 0.9, the optimizer of these steps.
fn momentum_sgd() -> Sgd {
    Sgd {
        momentum: 0.9,
        ..Sgd::new(0.05)
    }
}

/// An MLP 784-64-10 on digit-like bytes, its parameters and momentum.
fn mlp_state(sgd: &Sgd) -> Result<Vec<Tensor>> {
    let params = vec![
        (Tensor::randn([784, 64], 5)? * 0.05f32)?,
        Tensor::zeros([64], DType::F32)?,
        (Tensor::randn([64, 10], 6)? * 0.1f32)?,
        Tensor::zeros([10], DType::F32)?,
    ];
    let refs: Vec<&Tensor> = params.iter().collect();
    let momentum = sgd.state(&refs)?;
    Ok(params.into_iter().chain(momentum).collect())
}

/// The step: the loss, then the parameters and momentum after the update.
fn train(sgd: &Sgd, s: &[Tensor], b: &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let (p, m) = s.split_at(4);
    let x = (b[0].cast(DType::F32)? * (1.0f32 / 255.0))?;
    let h = (x.matmul(&p[0])? + &p[1])?.relu()?;
    let loss = (h.matmul(&p[2])? + &p[3])?.cross_entropy(&b[1])?;
    let grads = kiln::grad(&loss, &p.iter().collect::<Vec<_>>())?;
    let (p, m) = sgd.update(p, &grads, m)?;
    Ok((vec![loss], p.into_iter().chain(m).collect()))
}

/// Batch `k`'s images and labels.
fn batch_values(k: usize) -> (Vec<u8>, Vec<i32>) {
    let images = (0..BATCH * 784).map(|i| ((i * 7919 + k * 31) % 256) as u8);
    let labels = (0..BATCH).map(|i| ((i * 31 + k) % 10) as i32);
    (images.collect(), labels.collect())
}

fn batch(k: usize) -> [Data; 2] {
    let (images, labels) = batch_values(k);
    [Data::U8(images), Data::I32(labels)]
}

fn batch_types() -> [TensorType; 2] {
    [
        TensorType::new(DType::U8, [BATCH, 784]),
        TensorType::new(DType::I32, [BATCH]),
    ]
}

#[test]
fn a_training_step_moves_its_batch_in_and_its_loss_out() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if stats_or_skip().is_none() {
        return Ok(());
    }
    let sgd = momentum_sgd();
    let state = mlp_state(&sgd)?;
    let refs: Vec<&Tensor> = state.iter().collect();
    let mut step = kiln::compile_step_with("fit", &refs, &batch_types(), ieee_on_gpu(), |s, b| {
        train(&sgd, s, b)
    })?;
    assert!(step.in_place().iter().all(|&b| b), "{:?}", step.in_place());
    drop(state);
    let batches: Vec<[Data; 2]> = (0..4).map(batch).collect();
    // The first step copies the caller's initial state into the step's own.
    step.run(&[&batches[0][0], &batches[0][1]])?;
    let batch_bytes = (BATCH * 784 + BATCH * 4) as u64;
    let mut losses = Vec::new();
    for b in &batches[1..] {
        let before = kiln::memory_stats(GPU)?;
        let loss = step.run(&[&b[0], &b[1]])?.remove(0);
        assert_eq!(
            moved(before)?,
            (batch_bytes, 0, 0),
            "a step, before its loss is read"
        );
        losses.push(loss.to_scalar::<f32>()?);
        assert_eq!(moved(before)?, (batch_bytes, 4, 1), "a step and its loss");
    }

    // The same steps on host data: the state copied in and out each time,
    // written to buffers of its own.
    let state = mlp_state(&sgd)?;
    let mut specs: Vec<TensorType> = state.iter().map(|t| t.ty().clone()).collect();
    specs.extend(batch_types());
    let mut plain = kiln::compile_with("fit", &specs, ieee_on_gpu(), |t| {
        let (loss, next) = train(&sgd, &t[..8], &t[8..])?;
        Ok(loss.into_iter().chain(next).collect())
    })?;
    let mut current: Vec<Data> = (state.iter())
        .map(|t| t.to_vec::<f32>().map(Data::F32))
        .collect::<Result<_>>()?;
    for (k, b) in batches.iter().enumerate() {
        let inputs: Vec<&Data> = current.iter().chain(b).collect();
        let mut out = plain.run(&inputs)?;
        if k > 0 {
            assert_eq!(out[0], Data::F32(vec![losses[k - 1]]), "loss of step {k}");
        }
        current = out.split_off(1);
    }
    for (k, (t, want)) in step.state()?.iter().zip(&current).enumerate() {
        assert_eq!(&Data::F32(t.to_vec::<f32>()?), want, "state tensor {k}");
    }
    // A batch already on the device moves nothing in.
    let (images, labels) = batch_values(9);
    let images = Tensor::from_vec(images, [BATCH, 784])?.to(GPU)?;
    let labels = Tensor::from_vec(labels, [BATCH])?.to(GPU)?;
    let before = kiln::memory_stats(GPU)?;
    let loss = step.call(&[&images, &labels])?.remove(0);
    assert_eq!(moved(before)?, (0, 0, 0), "a step on a batch on the device");
    assert!(loss.to_scalar::<f32>()?.is_finite());
    Ok(())
}

/// What `steps_on_device` holds until its last step.
#[derive(PartialEq)]
enum Keep {
    Nothing,
    /// Each step's loss, as an epoch that reads its losses at its end.
    Losses,
    /// Each step's batch and loss.
    Everything,
}

/// Steps on `batches` moved to the GPU one at a time from `state`, each
/// batch and loss let go before the next or kept to the end (`keep`): the
/// losses, the state after, and the graph launches counted.
fn steps_on_device(
    sgd: &Sgd,
    state: &[Tensor],
    batches: &[(Vec<u8>, Vec<i32>)],
    keep: Keep,
) -> Result<(Vec<f32>, Vec<Vec<f32>>, u64)> {
    let refs: Vec<&Tensor> = state.iter().collect();
    let options = CompileOptions {
        device: GPU,
        ..CompileOptions::default()
    };
    let mut step = kiln::compile_step_with("fit", &refs, &batch_types(), options, |s, b| {
        train(sgd, s, b)
    })?;
    let before = kiln::memory_stats(GPU)?;
    let (mut losses, mut kept) = (Vec::new(), Vec::new());
    for (images, labels) in batches {
        let images = Tensor::from_slice(images, [BATCH, 784])?.to(GPU)?;
        let labels = Tensor::from_slice(labels, [BATCH])?.to(GPU)?;
        let loss = step.call(&[&images, &labels])?.remove(0);
        losses.push(loss.to_scalar::<f32>()?);
        match keep {
            Keep::Nothing => {}
            Keep::Losses => kept.push(vec![loss]),
            Keep::Everything => kept.push(vec![images, labels, loss]),
        }
    }
    let launches = kiln::memory_stats(GPU)?.graph_launches - before.graph_launches;
    let state = (step.state()?.iter())
        .map(|t| t.to_vec::<f32>())
        .collect::<Result<_>>()?;
    Ok((losses, state, launches))
}

#[test]
fn steps_on_the_same_buffers_replay_as_one_graph_launch() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if stats_or_skip().is_none() {
        return Ok(());
    }
    let sgd = momentum_sgd();
    let state = mlp_state(&sgd)?;
    let batches: Vec<(Vec<u8>, Vec<i32>)> = (0..6).map(batch_values).collect();
    // Every step on new buffers: launched kernel by kernel.
    let (losses, after, launches) = steps_on_device(&sgd, &state, &batches, Keep::Everything)?;
    assert_eq!(launches, 0, "steps on buffers never seen before");
    // The batch and loss of one step let go before the next: the second
    // step is captured, every step from it one graph launch.
    let (replayed, replayed_after, launches) =
        steps_on_device(&sgd, &state, &batches, Keep::Nothing)?;
    assert_eq!(launches, 5, "graph launches over 6 steps");
    assert_eq!(replayed, losses, "losses");
    assert_eq!(replayed_after, after, "state after the steps");
    // Losses held to the end: each step's loss is new memory, written
    // from a buffer of the step's own, and the steps still replay.
    let (held, held_after, launches) = steps_on_device(&sgd, &state, &batches, Keep::Losses)?;
    assert_eq!(launches, 5, "graph launches over 6 steps, losses held");
    assert_eq!(held, losses, "losses, held");
    assert_eq!(held_after, after, "state after the steps, losses held");
    Ok(())
}

/// A graph of one kernel replays too, each call's output its own value.
#[test]
fn a_single_kernel_replays_as_one_graph_launch() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if stats_or_skip().is_none() {
        return Ok(());
    }
    let a = Tensor::randn([256, 256], 1)?;
    let b = Tensor::randn([256, 256], 2)?;
    let want = (&a + &b)?.relu()?.to_vec::<f32>()?;
    let (a, b) = (a.to(GPU)?, b.to(GPU)?);
    let options = CompileOptions {
        device: GPU,
        ..CompileOptions::default()
    };
    let spec = [a.ty().clone(), b.ty().clone()];
    let mut g = kiln::compile_with("add_relu", &spec, options, |t| {
        Ok(vec![(&t[0] + &t[1])?.relu()?])
    })?;
    assert_eq!(g.launches(), 1);
    let before = kiln::memory_stats(GPU)?;
    for call in 0..5 {
        let got = g.call(&[&a, &b])?.remove(0).to_vec::<f32>()?;
        assert!(got == want, "call {call}");
    }
    let launches = kiln::memory_stats(GPU)?.graph_launches - before.graph_launches;
    assert_eq!(launches, 4, "graph launches over 5 calls");
    Ok(())
}

/// `batch_values` as a dataset: item `i` is row `i % BATCH` of batch
/// `i / BATCH`, an image and its label.
struct Digits(usize);

impl Dataset for Digits {
    fn len(&self) -> usize {
        self.0
    }

    fn fields(&self) -> Vec<TensorType> {
        vec![
            TensorType::new(DType::U8, [784]),
            TensorType::new(DType::I32, []),
        ]
    }

    fn read(
        &self,
        index: usize,
        field: usize,
        out: &mut [u8],
    ) -> std::result::Result<(), DataError> {
        let (images, labels) = batch_values(index / BATCH);
        let row = index % BATCH;
        match field {
            0 => out.copy_from_slice(&images[row * 784..(row + 1) * 784]),
            _ => out.copy_from_slice(&labels[row].to_le_bytes()),
        }
        Ok(())
    }
}

#[test]
fn a_fed_epoch_copies_each_batch_in_once_and_trains_as_host_batches() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if stats_or_skip().is_none() {
        return Ok(());
    }
    let sgd = momentum_sgd();
    let batches = 7;
    let options = LoaderOptions {
        batch_size: BATCH,
        ..LoaderOptions::default()
    };
    let mut loader = DataLoader::new(Arc::new(Digits(batches * BATCH)), options)?;
    let mut steps = Vec::new();
    for _ in 0..2 {
        let state = mlp_state(&sgd)?;
        let refs: Vec<&Tensor> = state.iter().collect();
        let step = kiln::compile_step_with("fit", &refs, &batch_types(), ieee_on_gpu(), |s, b| {
            train(&sgd, s, b)
        })?;
        steps.push(step);
    }
    // Fed: each batch copied in while the step before runs, and while an
    // epoch's last step runs, the next epoch's first batch, which the next
    // epoch takes up from the feed the loader keeps.
    let batch_bytes = (BATCH * 784 + BATCH * 4) as u64;
    let mut losses = Vec::new();
    for epoch in 0..2 {
        let before = kiln::memory_stats(GPU)?;
        for batch in loader.epoch(epoch).to_device(GPU)? {
            let batch = batch?;
            losses.push(steps[0].call(&[&batch[0], &batch[1]])?.remove(0));
        }
        // Epoch 0 puts its 7 batches and epoch 1's first, epoch 1 its 6
        // others and epoch 2's first. The pinned buffers of the batch
        // before last are reused from the third put of the feed on, after a
        // wait for their last copy.
        let moved = moved(before)?;
        let waits = [batches - 1, batches][epoch as usize] as u64;
        assert_eq!(
            moved,
            (
                batches as u64 * batch_bytes + [batch_bytes, 0][epoch as usize],
                0,
                waits
            ),
            "epoch {epoch}: every batch in once (the state is on the device since the step was compiled), nothing out, a wait per reused pinned buffer"
        );
    }
    let fed: Vec<f32> = losses
        .iter()
        .map(|l| l.to_scalar::<f32>())
        .collect::<Result<_>>()?;
    // The same steps on the loader's host batches.
    let mut plain = Vec::new();
    for epoch in 0..2 {
        for batch in loader.epoch(epoch) {
            let batch = batch?;
            plain.push(
                steps[1]
                    .run(&batch.inputs())?
                    .remove(0)
                    .to_scalar::<f32>()?,
            );
        }
    }
    assert_eq!(fed, plain, "losses");
    Ok(())
}

#[test]
fn device_memory_running_out_is_an_err_and_the_device_goes_on() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(before) = stats_or_skip() else {
        return Ok(());
    };
    // 2^46 f32 values: 256 TiB, more than any GPU has.
    let huge = [1usize << 20, 1 << 20, 1 << 6];
    let zero = Tensor::scalar(0.0f32).to(GPU)?;
    let err = zero
        .expand(huge)?
        .exp()?
        .realize()
        .err()
        .map(|e| e.to_string());
    let want = format!(
        "exp: out of memory: {} bytes for f32[1048576,1048576,64] on GPU 0",
        1u64 << 48
    );
    assert_eq!(err.as_deref(), Some(want.as_str()));
    let after = kiln::memory_stats(GPU)?;
    assert!(
        after.bytes_in_use <= before.bytes_in_use + (1 << 20),
        "{before:?} -> {after:?}"
    );
    let x = Tensor::from_slice(&[1.0f32, -2.0], [2])?.to(GPU)?;
    assert_eq!(x.relu()?.to_vec::<f32>()?, vec![1.0, 0.0]);
    Ok(())
}
