//! `bench_report`'s training steps: `train_sgd` and `train_adam`, the MLP
//! step of `../shared/anchors/train_anchor.py`, `train_cnn`, the CNN step
//! of `benches/cnn_anchor.py`, and `train_fed`, an epoch of MLP steps fed
//! by a data loader.

use std::sync::Arc;

use kiln::data::{DataError, DataLoader, Dataset, LoaderOptions};
use kiln::optim::{AdamW, Optimizer, Sgd};
use kiln::{
    CompileOptions, CompiledStep, DType, Device, Options, Pool2d, Result, Tensor, TensorType,
};

use crate::{Backend, max_rel_err, target, time};

/// One training step to time: its parameters, a batch, its loss, and the
/// flops its products compute.
struct Case {
    shape: &'static str,
    params: Vec<Tensor>,
    images: Tensor,
    labels: Tensor,
    loss: fn(&[Tensor], &Tensor, &Tensor) -> Result<Tensor>,
    flops: u64,
}

/// Bytes to the normalized pixels MNIST models expect.
fn pixels(x: &Tensor) -> Result<Tensor> {
    ((x.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081)
}

/// A weight drawn normal times sqrt(2 / fan-in), the anchors' init.
fn he(dims: &[usize], fan_in: usize, seed: u64) -> Result<Tensor> {
    Tensor::randn(dims, seed)? * (2.0 / fan_in as f32).sqrt()
}

/// Seeded u8 images and i32 labels of a batch.
fn batch(n: usize, image: &[usize]) -> Result<(Tensor, Tensor)> {
    let pixels: usize = image.iter().product();
    let images: Vec<u8> = (0..n * pixels).map(|i| (i * 7919 % 256) as u8).collect();
    let mut dims = vec![n];
    dims.extend_from_slice(image);
    let labels: Vec<i32> = (0..n as i32).map(|i| i * 31 % 10).collect();
    Ok((
        Tensor::from_vec(images, dims)?,
        Tensor::from_vec(labels, [n])?,
    ))
}

/// The MLP 784-256-256-10 of `train_anchor.py` on a batch of 250: the
/// products forward, each weight's gradient, and each layer's input
/// gradient but the first's (the images have none), 302 MFLOP.
fn mlp() -> Result<Case> {
    let sizes = [784usize, 256, 256, 10];
    let mut params = Vec::new();
    for (i, pair) in sizes.windows(2).enumerate() {
        params.push(he(&[pair[0], pair[1]], pair[0], i as u64)?);
        params.push(Tensor::zeros([pair[1]], DType::F32)?);
    }
    let (images, labels) = batch(250, &[784])?;
    let macs: usize = sizes.windows(2).map(|p| p[0] * p[1]).sum();
    Ok(Case {
        shape: "250x784-256-256-10",
        params,
        images,
        labels,
        loss: |p, x, y| {
            let mut h = pixels(x)?;
            for (i, layer) in p.chunks(2).enumerate() {
                h = (h.matmul(&layer[0])? + &layer[1])?;
                if i + 1 < p.len() / 2 {
                    h = h.relu()?;
                }
            }
            h.cross_entropy(y)
        },
        flops: (2 * 250 * (3 * macs - sizes[0] * sizes[1])) as u64,
    })
}

/// The CNN of `examples/train_cnn.rs` without its batch norms, and of
/// `cnn_anchor.py`, on a batch of
/// 100: 5x5 convolutions to 16 and 32 channels, each with ReLU and 2x2 max
/// pooling, and a linear layer to 10 classes. Its flops: each layer's
/// products forward and for its weight's gradient, and for its input's
/// gradient but the first's, 587 MFLOP.
fn cnn() -> Result<Case> {
    let params = vec![
        he(&[16, 1, 5, 5], 25, 0)?,
        Tensor::zeros([16], DType::F32)?,
        he(&[32, 16, 5, 5], 400, 1)?,
        Tensor::zeros([32], DType::F32)?,
        he(&[512, 10], 512, 2)?,
        Tensor::zeros([10], DType::F32)?,
    ];
    let (images, labels) = batch(100, &[28, 28])?;
    let conv1 = 100 * 16 * 24 * 24 * 25;
    let conv2 = 100 * 32 * 8 * 8 * 16 * 25;
    let linear = 100 * 512 * 10;
    Ok(Case {
        shape: "100x1x28x28-c16-c32-10",
        params,
        images,
        labels,
        loss: |p, x, y| {
            let pool = Pool2d::new([2, 2]);
            let layer = |h: &Tensor, w: &Tensor, b: &Tensor| -> Result<Tensor> {
                let c = h.conv2d(w, Some(b), [1, 1], [(0, 0); 2], [1, 1], 1)?;
                c.relu()?.max_pool2d(&pool)
            };
            let h = pixels(x)?.reshape([100, 1, 28, 28])?;
            let h = layer(&layer(&h, &p[0], &p[1])?, &p[2], &p[3])?;
            let logits = (h.reshape([100, 512])?.matmul(&p[4])? + &p[5])?;
            logits.cross_entropy(y)
        },
        flops: (2 * (2 * conv1 + 3 * conv2 + 3 * linear)) as u64,
    })
}

/// The training step of `case` with `optimizer`, compiled with `options`.
fn compile(
    id: &str,
    case: &Case,
    optimizer: &dyn Optimizer,
    options: CompileOptions,
) -> Result<CompiledStep> {
    let params = &case.params;
    let refs: Vec<&Tensor> = params.iter().collect();
    let mut state = params.clone();
    state.extend(optimizer.state(&refs)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let specs = [
        TensorType::new(DType::U8, case.images.shape().clone()),
        TensorType::new(DType::I32, case.labels.shape().clone()),
    ];
    let n = params.len();
    kiln::compile_step_with(id, &state, &specs, options, |s, b| {
        let (p, opt) = s.split_at(n);
        let loss = (case.loss)(p, &b[0], &b[1])?;
        let grads = kiln::grad(&loss, &p.iter().collect::<Vec<_>>())?;
        let (p, opt) = optimizer.update(p, &grads, opt)?;
        Ok((vec![loss], p.into_iter().chain(opt).collect()))
    })
}

/// A training step (`train_sgd`: SGD with momentum 0.9 at 0.05;
/// `train_adam` and `train_cnn`: Adam at 1e-3) compiled with
/// `kiln::compile_step_with` for `backend`, fused and unfused taking turns.
/// The batch is on the step's device, as the anchors have it; a timed step
/// reads its loss, so that on a GPU it is the host's time for a step
/// through the loss on the host. Checked: the first step's loss against
/// the interpreter's.
pub(crate) fn train(id: &'static str, quick: bool, backend: Backend) -> Result<()> {
    eprintln!("{id}");
    let case = if id == "train_cnn" { cnn()? } else { mlp()? };
    let sgd = Sgd {
        momentum: 0.9,
        ..Sgd::new(0.05)
    };
    let adam = AdamW {
        weight_decay: 0.0,
        ..AdamW::new(1e-3)
    };
    let optimizer: &dyn Optimizer = if id == "train_sgd" { &sgd } else { &adam };
    let (device, backend_options) = target(backend);
    // On the step's device, as the anchors have it.
    let batch = [case.images.to(device)?, case.labels.to(device)?];
    let batch: Vec<&Tensor> = batch.iter().collect();
    let mut steps = Vec::new();
    for fusion in [true, false] {
        let options = CompileOptions {
            device,
            optimizer: Options {
                fusion,
                ..Options::default()
            },
            backend: backend_options,
        };
        let mut step = compile(id, &case, optimizer, options)?;
        let first = step.call(&batch)?[0].to_scalar::<f32>()?;
        steps.push((if fusion { "fused" } else { "unfused" }, step, first));
    }
    let params = &case.params;
    let on_reference: Vec<Tensor> = params
        .iter()
        .map(|p| p.to(Device::Reference))
        .collect::<Result<_>>()?;
    let x = case.images.to(Device::Reference)?;
    let y = case.labels.to(Device::Reference)?;
    let want = f64::from((case.loss)(&on_reference, &x, &y)?.to_scalar::<f32>()?);
    let timings = time(quick, steps.len(), |v| {
        steps[v].1.call(&batch)?[0].to_scalar::<f32>().map(|_| None)
    })?;
    for ((variant, step, first), timing) in steps.iter().zip(timings) {
        println!(
            "{{\"workload\":\"{id}\",\"shape\":\"{}\",\"variant\":\"{variant}\",\"backend\":\"{}\",{},\"kernels\":{},\"bytes\":0,\"flops\":{},\"max_rel_err\":{:.2e}}}",
            case.shape,
            backend.name(),
            timing.fields(),
            step.graph().launches(),
            case.flops,
            max_rel_err(&[*first], &[want])
        );
    }
    Ok(())
}

/// Batches of `EPOCH_STEPS` per epoch of `train_fed`.
const EPOCH_STEPS: usize = 16;

/// The MLP case's batch repeated as a dataset of `EPOCH_STEPS` batches:
/// item `i` is row `i % 250` of its images and labels.
struct Repeated {
    images: Vec<u8>,
    labels: Vec<i32>,
}

impl Dataset for Repeated {
    fn len(&self) -> usize {
        self.labels.len() * EPOCH_STEPS
    }

    fn fields(&self) -> Vec<TensorType> {
        vec![
            TensorType::new(DType::U8, [784]),
            TensorType::new(DType::I32, []),
        ]
    }

    fn read(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let row = index % self.labels.len();
        match field {
            0 => out.copy_from_slice(&self.images[row * 784..(row + 1) * 784]),
            _ => out.copy_from_slice(&self.labels[row].to_le_bytes()),
        }
        Ok(())
    }
}

/// `train_fed`: an epoch of `EPOCH_STEPS` fused `train_sgd` steps fed by a
/// `DataLoader` through `Epoch::to_device` (variant `fed`), against the
/// same steps on one batch already on the device (`on_device`), the loss
/// of every step read at the epoch's end. On a GPU, `fed` copies each batch
/// in while the step before runs; the target is `fed` within 10% of
/// `on_device`. Checked: the epochs' last losses agree.
pub(crate) fn fed(quick: bool, backend: Backend) -> Result<()> {
    eprintln!("train_fed");
    let case = mlp()?;
    let sgd = Sgd {
        momentum: 0.9,
        ..Sgd::new(0.05)
    };
    let (device, backend_options) = target(backend);
    let options = CompileOptions {
        device,
        backend: backend_options,
        ..CompileOptions::default()
    };
    let mut steps = [
        compile("train_fed", &case, &sgd, options)?,
        compile("train_fed", &case, &sgd, options)?,
    ];
    let data = Repeated {
        images: case.images.to_vec()?,
        labels: case.labels.to_vec()?,
    };
    let loader_options = LoaderOptions {
        batch_size: data.labels.len(),
        ..LoaderOptions::default()
    };
    let mut loader = DataLoader::new(Arc::new(data), loader_options)?;
    let batch = [case.images.to(device)?, case.labels.to(device)?];
    let mut last = [0.0f32; 2];
    let mut epoch = |v: usize| -> Result<Option<f64>> {
        let mut losses = Vec::with_capacity(EPOCH_STEPS);
        if v == 0 {
            for fed in loader.epoch(0).to_device(device)? {
                let fed = fed?;
                losses.push(steps[0].call(&[&fed[0], &fed[1]])?.remove(0));
            }
        } else {
            for _ in 0..EPOCH_STEPS {
                losses.push(steps[1].call(&[&batch[0], &batch[1]])?.remove(0));
            }
        }
        for loss in &losses {
            last[v] = loss.to_scalar::<f32>()?;
        }
        Ok(None)
    };
    let timings = time(quick, 2, &mut epoch)?;
    for (variant, timing) in ["fed", "on_device"].iter().zip(timings) {
        println!(
            "{{\"workload\":\"train_fed\",\"shape\":\"{EPOCH_STEPS}x{}\",\"variant\":\"{variant}\",\"backend\":\"{}\",{},\"kernels\":{},\"bytes\":0,\"flops\":{},\"max_rel_err\":{:.2e}}}",
            case.shape,
            backend.name(),
            timing.fields(),
            steps[0].graph().launches(),
            case.flops * EPOCH_STEPS as u64,
            max_rel_err(&[last[0]], &[f64::from(last[1])])
        );
    }
    Ok(())
}
