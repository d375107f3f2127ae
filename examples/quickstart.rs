//! kiln's main job, end to end: learn to read handwritten digits.
//!
//! 5,000 MNIST digits ship with kiln (`data/digits/`, CC BY-SA 3.0): the
//! first 4,000 train an MLP (784-256-256-10), the last 1,000 test it. One
//! training step (the bytes normalized inside it, the forward pass,
//! cross-entropy, the gradients, AdamW's update) is compiled once with
//! `kiln::compile_step` and fed batches by the DataLoader; the parameters
//! and the optimizer's state live in the compiled step. Each epoch prints
//! the loss, the test accuracy and samples/s. Then the same steps run with
//! fusion off, fused and unfused epochs taking turns, to show what fusion
//! buys. Last, the trained model is written to `target/quickstart.onnx`.
//!
//! Run with `cargo run --release --example quickstart`. Built with
//! `--features cuda`, `-- --device cuda` trains on GPU 0, its parameters and
//! optimizer state living in the GPU's memory, and prints the CPU's
//! samples/s for an epoch of the same steps beside the GPU's. With
//! `-- --autocast bf16` the steps train in mixed precision (`Autocast`):
//! products on bf16 operands, accumulated in f32, f32 master weights.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use kiln::data::npy::NpyArray;
use kiln::data::{ArrayDataset, DataLoader, Dataset, LoaderOptions, Subset, Zip};
use kiln::nn::{Mlp, Module};
use kiln::optim::{AdamW, Optimizer};
use kiln::{
    Autocast, CompileOptions, CompiledStep, DType, Device, Options, Result, Tensor, TensorType,
};

/// Digits that train; the rest test.
const TRAIN: usize = 4000;
/// Images per training step.
const BATCH: usize = 250;
/// Passes over the training digits.
const EPOCHS: u64 = 8;

/// Bytes to the normalized pixels MNIST models expect, flattened.
fn pixels(images: &Tensor) -> Result<Tensor> {
    let rows = images.dims()[0];
    let x = ((images.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081);
    x?.reshape([rows, 784])
}

/// The training step compiled for `device` with `optimizer` (fusion and
/// mixed precision): state = parameters, then AdamW's state; arguments = a
/// batch of images and labels; output = the batch's loss.
fn training_step(
    device: Device,
    mlp: &Mlp,
    optimizer: &AdamW,
    options: Options,
) -> Result<CompiledStep> {
    let params: Vec<&Tensor> = mlp.parameters().into_iter().map(|(_, p)| p).collect();
    let mut state: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    state.extend(optimizer.state(&params)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let batch = [
        TensorType::new(DType::U8, [BATCH, 28, 28]),
        TensorType::new(DType::I32, [BATCH]),
    ];
    let n = params.len();
    kiln::compile_step_with(
        "train",
        &state,
        &batch,
        CompileOptions {
            device,
            optimizer: options,
            ..CompileOptions::default()
        },
        |state, batch| {
            let (params, moments) = state.split_at(n);
            let logits = mlp.with_parameters(params)?.forward(&pixels(&batch[0])?)?;
            let loss = logits.cross_entropy(&batch[1])?;
            let param_refs: Vec<&Tensor> = params.iter().collect();
            let grads = kiln::grad(&loss, &param_refs)?;
            let (params, moments) = optimizer.update(params, &grads, moments)?;
            Ok((vec![loss], params.into_iter().chain(moments).collect()))
        },
    )
}

/// The fraction of `images` whose argmax of the logits is the label.
fn accuracy(mlp: &Mlp, params: &[Tensor], images: &Tensor, labels: &Tensor) -> Result<f32> {
    let logits = mlp.with_parameters(params)?.forward(&pixels(images)?)?;
    let right = logits.argmax(-1, false)?.eq(labels)?.cast(DType::F32)?;
    right.mean_all()?.to_scalar()
}

/// A shuffled loader of whole batches over `data`.
fn loader(data: Arc<dyn Dataset>) -> Result<DataLoader> {
    let options = LoaderOptions {
        batch_size: BATCH,
        shuffle: Some(7),
        drop_last: true,
        ..LoaderOptions::default()
    };
    Ok(DataLoader::new(data, options)?)
}

/// One epoch of steps; returns the mean loss and the seconds it took.
fn epoch(
    step: &mut CompiledStep,
    loader: &mut DataLoader,
    index: u64,
    bar: &ProgressBar,
) -> Result<(f32, f64)> {
    let start = Instant::now();
    // The losses are read at the end: on a GPU the steps queue up meanwhile,
    // each batch's copy in overlapping the step before.
    let mut losses = Vec::new();
    for batch in loader.epoch(index).to_device(step.graph().device())? {
        let batch = batch?;
        losses.push(step.call(&[&batch[0], &batch[1]])?.remove(0));
        bar.inc(1);
    }
    let mut total = 0.0f32;
    for loss in &losses {
        total += loss.to_scalar::<f32>()?;
    }
    Ok((total / losses.len() as f32, start.elapsed().as_secs_f64()))
}

/// The device `--device cpu|cuda` names (the CPU without it) and the
/// mixed precision `--autocast bf16` asks for (none without it).
fn flags() -> std::result::Result<(Device, Option<Autocast>), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut device, mut autocast) = (Device::Cpu, None);
    for pair in args.chunks(2) {
        match pair {
            [flag, value] if flag == "--device" && value == "cpu" => device = Device::Cpu,
            [flag, value] if flag == "--device" && value == "cuda" => device = Device::Cuda(0),
            [flag, value] if flag == "--autocast" && value == "bf16" => {
                autocast = Some(Autocast::BF16);
            }
            _ => {
                return Err(format!(
                    "usage: quickstart [--device cpu|cuda] [--autocast bf16], not {args:?}"
                ));
            }
        }
    }
    Ok((device, autocast))
}

fn main() -> Result<()> {
    let (device, autocast) = match flags() {
        Ok(f) => f,
        Err(usage) => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    let images: Arc<dyn Dataset> = Arc::new(ArrayDataset::npy(dir.join("images.npy"))?);
    let labels: Arc<dyn Dataset> = Arc::new(ArrayDataset::npy(dir.join("labels.npy"))?);
    let split = |range: std::ops::Range<usize>| -> Result<Arc<dyn Dataset>> {
        Ok(Arc::new(Zip::new(vec![
            Box::new(Subset::new(images.clone(), range.clone())?),
            Box::new(Subset::new(labels.clone(), range)?),
        ])?))
    };
    let train = split(0..TRAIN)?;
    let test = split(TRAIN..images.len())?;
    // The test split whole, as two tensors read from the files.
    let test_images = NpyArray::open(dir.join("images.npy"))?.rows(TRAIN, test.len() + TRAIN)?;
    let test_labels = NpyArray::open(dir.join("labels.npy"))?.rows(TRAIN, test.len() + TRAIN)?;

    let mlp = Mlp::new(&[784, 256, 256, 10], 0)?;
    let optimizer = AdamW::new(1e-3);
    let fused = Options {
        autocast,
        ..Options::default()
    };
    let mut step = training_step(device, &mlp, &optimizer, fused)?;
    let precision = autocast.map_or("f32".to_string(), |a| format!("{a:?} autocast"));
    println!(
        "training an MLP 784-256-256-10 on {TRAIN} digits, batches of {BATCH}, AdamW, {precision}, on {device:?}: {} kernels per step, {} of {} state tensors updated in place",
        step.graph().launches(),
        step.in_place().iter().filter(|&&b| b).count(),
        step.in_place().len(),
    );
    let mut train_loader = loader(train)?;
    let steps = (TRAIN / BATCH) as u64;
    for e in 0..EPOCHS {
        let bar = ProgressBar::new(steps).with_style(
            ProgressStyle::with_template("epoch {msg} [{bar:30}] {pos}/{len} steps {per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(format!("{}", e + 1));
        let (loss, seconds) = epoch(&mut step, &mut train_loader, e, &bar)?;
        bar.finish_and_clear();
        let state = step.state()?;
        let acc = accuracy(
            &mlp,
            &state[..mlp.parameters().len()],
            &test_images,
            &test_labels,
        )?;
        println!(
            "epoch {:>2}: loss {loss:.4}, test accuracy {:.1}%, {:.0} samples/s",
            e + 1,
            acc * 100.0,
            (steps as usize * BATCH) as f64 / seconds
        );
    }

    // Fused against unfused from the same state, epochs taking turns.
    let unfused_options = Options {
        fusion: false,
        ..fused
    };
    let mut unfused = training_step(device, &mlp, &optimizer, unfused_options)?;
    let hidden = ProgressBar::hidden();
    let mut seconds = [Vec::new(), Vec::new()];
    for (turn, which) in [0, 1, 1, 0].into_iter().enumerate() {
        let run = if which == 0 { &mut step } else { &mut unfused };
        seconds[which].push(epoch(run, &mut train_loader, EPOCHS + turn as u64, &hidden)?.1);
    }
    let rate =
        |s: &[f64]| (steps as usize * BATCH) as f64 / (s.iter().sum::<f64>() / s.len() as f64);
    println!(
        "fused {:.0} samples/s ({} kernels per step), unfused {:.0} samples/s ({} kernels per step)",
        rate(&seconds[0]),
        step.graph().launches(),
        rate(&seconds[1]),
        unfused.graph().launches()
    );
    if device != Device::Cpu {
        // The same steps on the CPU, from the initial parameters.
        let mut on_cpu = training_step(Device::Cpu, &mlp, &optimizer, fused)?;
        let cpu = epoch(&mut on_cpu, &mut train_loader, EPOCHS + 4, &hidden)?.1;
        println!(
            "on {device:?} {:.0} samples/s, on the CPU {:.0} samples/s",
            rate(&seconds[0]),
            rate(&[cpu])
        );
    }

    // The trained classifier as an ONNX model, for any ONNX runtime: one
    // image's bytes in (kiln exports static shapes), logits out.
    let trained = mlp.with_parameters(&step.state()?[..mlp.parameters().len()])?;
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&target).map_err(|e| kiln::onnx::OnnxError::Io {
        file: target.display().to_string(),
        message: e.to_string(),
    })?;
    let path = target.join("quickstart.onnx");
    let image = TensorType::new(DType::U8, [1, 28, 28]);
    kiln::onnx::export_file(&path, "digits", &[image], |x| {
        Ok(vec![trained.forward(&pixels(&x[0])?)?])
    })?;
    println!(
        "wrote {} (ONNX opset {}): u8[1, 28, 28] in, logits out",
        path.display(),
        kiln::onnx::OPSET
    );
    Ok(())
}
