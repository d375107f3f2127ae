//! kiln's main job, end to end: a dataset of 60,000 28x28 u8 images with
//! labels, written once as `.npy` files into a cache folder (seeded synthetic
//! data), loaded in batches by the DataLoader, and fed to a compiled 3-layer
//! MLP forward pass (784-256-256-10) whose first kernel also casts the bytes
//! to f32 and normalizes them. Then the same epoch with fusion off.
//!
//! Run with `cargo run --release --example quickstart`. The output is
//! checkable without labels that mean anything: the logits' checksum is the
//! same fused and unfused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kiln::data::npy::{NpyDType, write_npy};
use kiln::data::{ArrayDataset, DataLoader, LoaderOptions, Zip};
use kiln::{CompiledGraph, DType, Data, Options, Result, Tensor, TensorType};

/// Images in the dataset.
const IMAGES: usize = 60_000;
/// Images per batch.
const BATCH: usize = 250;

/// Writes the dataset unless a valid copy is already cached; returns the
/// images' and the labels' files.
fn dataset(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let (x, y) = (dir.join("images.npy"), dir.join("labels.npy"));
    if ArrayDataset::npy(&x).is_ok() && ArrayDataset::npy(&y).is_ok() {
        return Ok((x, y));
    }
    std::fs::create_dir_all(dir).map_err(|e| kiln::data::DataError::Mismatch {
        message: e.to_string(),
    })?;
    eprintln!("writing {IMAGES} images to {}", dir.display());
    // A seeded linear congruential stream: cheap, and the same on every machine.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 56) as u8
    };
    let images: Vec<u8> = (0..IMAGES * 28 * 28).map(|_| next()).collect();
    let labels: Vec<u8> = (0..IMAGES)
        .flat_map(|_| i32::from(next() % 10).to_le_bytes())
        .collect();
    write_npy(&x, NpyDType::U8, &[IMAGES, 28, 28], &images)?;
    write_npy(&y, NpyDType::I32, &[IMAGES], &labels)?;
    Ok((x, y))
}

/// The forward pass on a batch of raw images: normalization, then three
/// layers with relu between them.
fn forward(x: &Tensor, layers: &[(Tensor, Tensor)]) -> Result<Tensor> {
    let pixels = ((x.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081);
    let mut h = pixels?.reshape([BATCH, 784])?;
    for (i, (w, b)) in layers.iter().enumerate() {
        let z = (h.matmul(w)? + b)?;
        h = if i + 1 < layers.len() { z.relu()? } else { z };
    }
    Ok(h)
}

/// One epoch through the compiled graph, with what it took and the logits' checksum.
fn epoch(loader: &mut DataLoader, layers: &[(Tensor, Tensor)], fusion: bool) -> Result<()> {
    let mut graph = compiled(layers, fusion)?;
    let mut logits = graph.output_buffers()?;
    let bar = ProgressBar::new((IMAGES / BATCH) as u64).with_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} batches {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(if fusion { "fused" } else { "unfused" });
    let (mut checksum, mut batches, mut compute) = (0.0f64, 0usize, Duration::ZERO);
    let start = Instant::now();
    let mut batches_of_epoch = loader.epoch(0);
    while let Some(batch) = batches_of_epoch.next() {
        let batch = batch?;
        let t = Instant::now();
        graph.run_into(&[batch.fields[0].data()], &mut logits)?;
        compute += t.elapsed();
        if let Data::F32(v) = &logits[0] {
            checksum += v.iter().map(|&x| f64::from(x)).sum::<f64>();
        }
        batches += 1;
        bar.inc(1);
        // Its buffers are filled again by a later batch: no allocation per batch.
        batches_of_epoch.recycle(batch);
    }
    drop(batches_of_epoch);
    bar.finish_and_clear();
    let wall = start.elapsed();
    let m = loader.metrics();
    println!(
        "{:>8}: {batches} batches of {BATCH} in {:.1} ms ({:.0} samples/s), {} kernels per batch, compute {:.1} ms",
        if fusion { "fused" } else { "unfused" },
        wall.as_secs_f64() * 1e3,
        (batches * BATCH) as f64 / wall.as_secs_f64(),
        graph.optimized().schedule.kernels(),
        compute.as_secs_f64() * 1e3,
    );
    println!(
        "          loader p50 {:.2} ms, p95 {:.2} ms, waited {:.1} ms; logits checksum {checksum:.4e}",
        m.batch_latency_p50.as_secs_f64() * 1e3,
        m.batch_latency_p95.as_secs_f64() * 1e3,
        m.waited.as_secs_f64() * 1e3,
    );
    Ok(())
}

/// The MLP's weights and biases, seeded and realized, so that a compiled
/// graph takes them as data.
fn layers() -> Result<Vec<(Tensor, Tensor)>> {
    let sizes = [784, 256, 256, 10];
    sizes
        .windows(2)
        .enumerate()
        .map(|(i, p)| {
            let w = (Tensor::randn([p[0], p[1]], i as u64)? * (2.0 / p[0] as f32).sqrt())?;
            let b = Tensor::from_vec(vec![0.01f32; p[1]], [p[1]])?;
            w.realize()?;
            Ok((w, b))
        })
        .collect()
}

/// The forward pass compiled for one batch of raw images.
fn compiled(layers: &[(Tensor, Tensor)], fusion: bool) -> Result<CompiledGraph> {
    let spec = TensorType::new(DType::U8, [BATCH, 28, 28]);
    kiln::compile_with("mlp", &[spec], Options { fusion }, |x| {
        Ok(vec![forward(&x[0], layers)?])
    })
}

/// A loader over the images and labels: shuffled, whole batches only.
fn loader(images: &Path, labels: &Path) -> Result<DataLoader> {
    let data = Zip::new(vec![
        Box::new(ArrayDataset::npy(images)?),
        Box::new(ArrayDataset::npy(labels)?),
    ])?;
    let options = LoaderOptions {
        batch_size: BATCH,
        shuffle: Some(7),
        drop_last: true,
        ..LoaderOptions::default()
    };
    Ok(DataLoader::new(Arc::new(data), options)?)
}

fn main() -> Result<()> {
    let cache = std::env::var_os("KILN_CACHE")
        .map_or_else(|| PathBuf::from("target/kiln-cache"), PathBuf::from);
    let (x, y) = dataset(&cache.join("quickstart"))?;
    let layers = layers()?;
    for fusion in [true, false] {
        epoch(&mut loader(&x, &y)?, &layers, fusion)?;
    }
    Ok(())
}
