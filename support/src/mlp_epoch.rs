//! The data bench's epoch (`benches/data.rs`): 60,000 seeded synthetic
//! 28x28 u8 images with labels, written once as `.npy` files into a cache
//! folder, a 3-layer MLP forward pass (784-256-256-10) whose first kernel
//! also casts the bytes to f32 and normalizes them, compiled, and the loader
//! that feeds it: the loader against the same batches in memory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln::data::npy::{NpyDType, write_npy};
use kiln::data::{ArrayDataset, DataLoader, LoaderOptions, Zip};
use kiln::{CompileOptions, CompiledGraph, DType, Options, Result, Tensor, TensorType};

/// Images in the dataset.
const IMAGES: usize = 60_000;
/// Images per batch.
const BATCH: usize = 250;

/// Writes the dataset unless a valid copy is already cached; returns the
/// images' and the labels' files.
pub fn dataset(dir: &Path) -> Result<(PathBuf, PathBuf)> {
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

/// The MLP's weights and biases, seeded and realized, so that a compiled
/// graph takes them as data.
pub fn layers() -> Result<Vec<(Tensor, Tensor)>> {
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
pub fn compiled(layers: &[(Tensor, Tensor)], fusion: bool) -> Result<CompiledGraph> {
    let spec = TensorType::new(DType::U8, [BATCH, 28, 28]);
    let options = CompileOptions {
        optimizer: Options {
            fusion,
            ..Options::default()
        },
        ..CompileOptions::default()
    };
    kiln::compile_with("mlp", &[spec], options, |x| {
        Ok(vec![forward(&x[0], layers)?])
    })
}

/// A loader over the images and labels: shuffled, whole batches only.
pub fn loader(images: &Path, labels: &Path) -> Result<DataLoader> {
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
