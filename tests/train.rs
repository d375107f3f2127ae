//! Training reaches what the examples print: an MLP trained on the first
//! 4,000 shipped digits by a compiled step (gradients and the update fused
//! with the forward pass) reads the last 1,000 at over 90%. Here with SGD
//! and Nesterov momentum (the quickstart trains with AdamW), batches from
//! the DataLoader, and the kernel count of the fused step pinned. The CNN of
//! `examples/train_cnn.rs` (batch norm, pooling, dropout) reads them at over
//! 90% after one epoch.

use std::path::Path;
use std::sync::Arc;

use kiln::data::npy::NpyArray;
use kiln::data::{ArrayDataset, DataLoader, Dataset, LoaderOptions, Subset, Zip};
use kiln::nn::{Mlp, Module};
use kiln::optim::{AdamW, Optimizer, Sgd};
use kiln::{DType, Result, Tensor, TensorType};

const BATCH: usize = 250;

fn pixels(images: &Tensor) -> Result<Tensor> {
    let rows = images.dims()[0];
    ((images.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.5f32)?.reshape([rows, 784])
}

/// The shipped digits: a loader over the first 4,000 in shuffled batches of
/// `batch`, and the last 1,000 images and labels.
fn digits(batch: usize) -> Result<(DataLoader, [Tensor; 2])> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    let images: Arc<dyn Dataset> = Arc::new(ArrayDataset::npy(dir.join("images.npy"))?);
    let labels: Arc<dyn Dataset> = Arc::new(ArrayDataset::npy(dir.join("labels.npy"))?);
    let train = Zip::new(vec![
        Box::new(Subset::new(images, 0..4000)?),
        Box::new(Subset::new(labels, 0..4000)?),
    ])?;
    let options = LoaderOptions {
        batch_size: batch,
        shuffle: Some(3),
        drop_last: true,
        ..LoaderOptions::default()
    };
    let test = [
        NpyArray::open(dir.join("images.npy"))?.rows(4000, 5000)?,
        NpyArray::open(dir.join("labels.npy"))?.rows(4000, 5000)?,
    ];
    Ok((DataLoader::new(Arc::new(train), options)?, test))
}

/// The share of `logits`' rows whose largest entry is at the label.
fn accuracy(logits: &Tensor, labels: &Tensor) -> Result<f32> {
    let predicted = logits.argmax(-1, false)?;
    predicted
        .eq(labels)?
        .cast(DType::F32)?
        .mean_all()?
        .to_scalar()
}

#[test]
fn an_mlp_learns_the_digits() -> Result<()> {
    let (mut loader, [test_images, test_labels]) = digits(BATCH)?;

    let mlp = Mlp::new(&[784, 128, 10], 5)?;
    let sgd = Sgd {
        momentum: 0.9,
        nesterov: true,
        ..Sgd::new(0.1)
    };
    let params: Vec<&Tensor> = mlp.parameters().into_iter().map(|(_, p)| p).collect();
    let n = params.len();
    let mut state: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    state.extend(sgd.state(&params)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let batch = [
        TensorType::new(DType::U8, [BATCH, 28, 28]),
        TensorType::new(DType::I32, [BATCH]),
    ];
    let mut step = kiln::compile_step("train", &state, &batch, |s, b| {
        let (p, momenta) = s.split_at(n);
        let loss = mlp
            .with_parameters(p)?
            .forward(&pixels(&b[0])?)?
            .cross_entropy(&b[1])?;
        let grads = kiln::grad(&loss, &p.iter().collect::<Vec<_>>())?;
        let (p, momenta) = sgd.update(p, &grads, momenta)?;
        Ok((vec![loss], p.into_iter().chain(momenta).collect()))
    })?;
    let kernels = step.graph().launches();
    // Pinned so that a change to the fuser shows here.
    assert_eq!(kernels, 12, "kernels per fused SGD step");

    let mut first_loss = None;
    let mut last_loss = 0.0;
    for epoch in 0..10 {
        let mut batches = loader.epoch(epoch);
        while let Some(b) = batches.next() {
            let b = b?;
            let out = step.run(&b.inputs())?;
            last_loss = f64::from(out[0].to_scalar::<f32>()?);
            first_loss.get_or_insert(last_loss);
            batches.recycle(b);
        }
    }
    assert!(
        last_loss < first_loss.unwrap_or(0.0) / 4.0,
        "loss {first_loss:?} -> {last_loss}"
    );

    let trained = mlp.with_parameters(&step.state()?[..n])?;
    let accuracy = accuracy(&trained.forward(&pixels(&test_images)?)?, &test_labels)?;
    assert!(accuracy > 0.9, "test accuracy {accuracy}");
    Ok(())
}

#[test]
fn a_cnn_learns_the_digits_in_an_epoch() -> Result<()> {
    let (mut loader, [test_images, test_labels]) = digits(100)?;
    let net = kiln_support::digits_cnn::network()?;
    let images = |x: &Tensor| pixels(x)?.reshape([x.dims()[0], 1, 28, 28]);
    let adamw = AdamW::new(1e-3);
    let params: Vec<&Tensor> = net.parameters().into_iter().map(|(_, p)| p).collect();
    let (n, m) = (params.len(), net.buffers().len());
    let mut state: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    state.extend(net.buffers().into_iter().map(|(_, b)| b.clone()));
    state.extend(adamw.state(&params)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let batch = [
        TensorType::new(DType::U8, [100, 28, 28]),
        TensorType::new(DType::I32, [100]),
    ];
    let mut step = kiln::compile_step("train_cnn", &state, &batch, |s, b| {
        let model = net.with_parameters(&s[..n])?.with_buffers(&s[n..n + m])?;
        let mut buffers = Vec::new();
        let loss = model
            .forward_train(&images(&b[0])?, &mut buffers)?
            .cross_entropy(&b[1])?;
        let grads = kiln::grad(&loss, &s[..n].iter().collect::<Vec<_>>())?;
        let (p, moments) = adamw.update(&s[..n], &grads, &s[n + m..])?;
        Ok((
            vec![loss],
            p.into_iter().chain(buffers).chain(moments).collect(),
        ))
    })?;
    let mut batches = loader.epoch(0);
    while let Some(b) = batches.next() {
        let b = b?;
        step.run(&b.inputs())?;
        batches.recycle(b);
    }
    // Inference: the running statistics, no dropout.
    let state = step.state()?;
    let trained = net
        .with_parameters(&state[..n])?
        .with_buffers(&state[n..n + m])?;
    let accuracy = accuracy(&trained.forward(&images(&test_images)?)?, &test_labels)?;
    assert!(accuracy > 0.9, "test accuracy {accuracy}");
    Ok(())
}
