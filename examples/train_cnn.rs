//! A small convolutional network learns the shipped digits.
//!
//! The same 4,000 training and 1,000 test digits as the quickstart
//! (`data/digits/`, CC BY-SA 3.0), through `nn::Sequential`: a 5x5
//! convolution to 16 channels, batch norm, ReLU, 2x2 max pooling, a 5x5
//! convolution to 32 channels, batch norm, ReLU, 2x2 max pooling, dropout
//! of a quarter, and a linear layer to the ten classes. One training step
//! (the bytes normalized inside it, the forward pass in training mode,
//! cross-entropy, the gradients, AdamW's update, the batch norms' running
//! statistics, the dropout's next key) is compiled once with
//! `kiln::compile_step`; each epoch prints the loss, the test accuracy
//! (inference mode: the running statistics, no dropout) and samples/s.
//!
//! Run with `cargo run --release --example train_cnn`.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kiln::data::npy::NpyArray;
use kiln::data::{ArrayDataset, DataLoader, Dataset, LoaderOptions, Subset, Zip};
use kiln::nn::{
    BatchNorm2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d, Module, Relu, Sequential,
};
use kiln::optim::{AdamW, Optimizer};
use kiln::{CompiledStep, DType, Pool2d, Result, Tensor, TensorType};

/// Digits that train; the rest test.
const TRAIN: usize = 4000;
/// Images per training step.
const BATCH: usize = 100;
/// Passes over the training digits.
const EPOCHS: u64 = 6;

/// Bytes to the normalized pixels MNIST models expect, one channel.
fn pixels(images: &Tensor) -> Result<Tensor> {
    let rows = images.dims()[0];
    let x = ((images.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081);
    x?.reshape([rows, 1, 28, 28])
}

/// The network: 28x28 -> 16 maps of 24x24 -> 12x12 -> 32 maps of 8x8 ->
/// 4x4 -> (a quarter dropped in training) -> 10 logits.
fn network() -> Result<Sequential> {
    let pool = MaxPool2d(Pool2d::new([2, 2]));
    Ok(Sequential::new(vec![
        Box::new(Conv2d::new(1, 16, [5, 5], 0)?),
        Box::new(BatchNorm2d::new(16)?),
        Box::new(Relu),
        Box::new(pool),
        Box::new(Conv2d::new(16, 32, [5, 5], 1)?),
        Box::new(BatchNorm2d::new(32)?),
        Box::new(Relu),
        Box::new(pool),
        Box::new(Flatten),
        Box::new(Dropout::new(0.25, 3)?),
        Box::new(Linear::new(32 * 4 * 4, 10, 2)?),
    ]))
}

/// The training step: state = parameters, buffers, then AdamW's state;
/// arguments = a batch of images and labels; output = the batch's loss.
fn training_step(net: &Sequential, optimizer: &AdamW) -> Result<CompiledStep> {
    let params: Vec<&Tensor> = net.parameters().into_iter().map(|(_, p)| p).collect();
    let buffers = net.buffers();
    let mut state: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    state.extend(buffers.iter().map(|(_, b)| (*b).clone()));
    state.extend(optimizer.state(&params)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let batch = [
        TensorType::new(DType::U8, [BATCH, 28, 28]),
        TensorType::new(DType::I32, [BATCH]),
    ];
    let (n, m) = (params.len(), buffers.len());
    kiln::compile_step("train_cnn", &state, &batch, |state, batch| {
        let (params, rest) = state.split_at(n);
        let (buffers, moments) = rest.split_at(m);
        let model = net.with_parameters(params)?.with_buffers(buffers)?;
        let mut new_buffers = Vec::new();
        let logits = model.forward_train(&pixels(&batch[0])?, &mut new_buffers)?;
        let loss = logits.cross_entropy(&batch[1])?;
        let param_refs: Vec<&Tensor> = params.iter().collect();
        let grads = kiln::grad(&loss, &param_refs)?;
        let (params, moments) = optimizer.update(params, &grads, moments)?;
        let state = params.into_iter().chain(new_buffers).chain(moments);
        Ok((vec![loss], state.collect()))
    })
}

/// The fraction of `images` whose argmax of the logits is the label, the
/// network given `state`'s parameters and buffers.
fn accuracy(net: &Sequential, state: &[Tensor], images: &Tensor, labels: &Tensor) -> Result<f32> {
    let (params, buffers) = state.split_at(net.parameters().len());
    let model = net
        .with_parameters(params)?
        .with_buffers(&buffers[..net.buffers().len()])?;
    let logits = model.forward(&pixels(images)?)?;
    let right = logits.argmax(-1, false)?.eq(labels)?.cast(DType::F32)?;
    right.mean_all()?.to_scalar()
}

fn main() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    let images: Arc<dyn Dataset> = Arc::new(ArrayDataset::npy(dir.join("images.npy"))?);
    let labels: Arc<dyn Dataset> = Arc::new(ArrayDataset::npy(dir.join("labels.npy"))?);
    let train: Arc<dyn Dataset> = Arc::new(Zip::new(vec![
        Box::new(Subset::new(images.clone(), 0..TRAIN)?),
        Box::new(Subset::new(labels.clone(), 0..TRAIN)?),
    ])?);
    let test_images = NpyArray::open(dir.join("images.npy"))?.rows(TRAIN, images.len())?;
    let test_labels = NpyArray::open(dir.join("labels.npy"))?.rows(TRAIN, images.len())?;

    let net = network()?;
    let optimizer = AdamW::new(1e-3);
    let compiling = Instant::now();
    let mut step = training_step(&net, &optimizer)?;
    println!(
        "training a CNN (conv 5x5 x16, batch norm, pool, conv 5x5 x32, batch norm, pool, dropout, linear) on {TRAIN} digits, batches of {BATCH}, AdamW: {} kernels per step, traced and compiled in {:.0} ms",
        step.graph().launches(),
        compiling.elapsed().as_secs_f64() * 1e3,
    );
    let mut loader = DataLoader::new(
        train,
        LoaderOptions {
            batch_size: BATCH,
            shuffle: Some(7),
            drop_last: true,
            ..LoaderOptions::default()
        },
    )?;
    for e in 0..EPOCHS {
        let start = Instant::now();
        let mut batches = loader.epoch(e);
        let mut losses = Vec::new();
        while let Some(batch) = batches.next() {
            let batch = batch?;
            losses.push(step.run(&batch.inputs())?.remove(0));
            batches.recycle(batch);
        }
        let mut total = 0.0f32;
        for loss in &losses {
            total += loss.to_scalar::<f32>()?;
        }
        let seconds = start.elapsed().as_secs_f64();
        let acc = accuracy(&net, &step.state()?, &test_images, &test_labels)?;
        println!(
            "epoch {:>2}: loss {:.4}, test accuracy {:.1}%, {:.0} samples/s",
            e + 1,
            total / losses.len() as f32,
            acc * 100.0,
            (losses.len() * BATCH) as f64 / seconds
        );
    }
    Ok(())
}
