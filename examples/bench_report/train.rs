//! `bench_report`'s training steps: `train_sgd` and `train_adam`, the MLP
//! step of `../shared/anchors/train_anchor.py`, `train_cnn`, the CNN step
//! of `benches/cnn_anchor.py`, `train_lm`, the transformer step of
//! `benches/lm_anchor.py`, `train_mixed`, a wide MLP's step in f32 and in
//! bf16 mixed precision, the step of `benches/mixed_anchor.py`, and
//! `train_fed`, an epoch of MLP steps fed by a data loader.

use std::sync::Arc;

use kiln::data::{DataError, DataLoader, Dataset, LoaderOptions};
use kiln::nn::Module;
use kiln::optim::{AdamW, Optimizer, Sgd};
use kiln::{Autocast, CompileOptions, CompiledStep, DType, Device, Result, Tensor, TensorType};
use kiln_support::digits_cnn;

use crate::{Backend, max_rel_err, options, target, time};

/// A case's loss of its parameters, buffers, images and labels, and the
/// buffers' next values.
type Loss = fn(&[Tensor], &[Tensor], &Tensor, &Tensor) -> Result<(Tensor, Vec<Tensor>)>;

/// One training step to time: its parameters, the buffers a step moves on
/// (running statistics, a dropout key), a batch, its loss, and the flops its
/// products compute.
struct Case {
    shape: &'static str,
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
    images: Tensor,
    labels: Tensor,
    loss: Loss,
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
        buffers: Vec::new(),
        images,
        labels,
        loss: |p, _, x, y| {
            let mut h = pixels(x)?;
            for (i, layer) in p.chunks(2).enumerate() {
                h = (h.matmul(&layer[0])? + &layer[1])?;
                if i + 1 < p.len() / 2 {
                    h = h.relu()?;
                }
            }
            Ok((h.cross_entropy(y)?, Vec::new()))
        },
        flops: (2 * 250 * (3 * macs - sizes[0] * sizes[1])) as u64,
    })
}

/// Rows of `train_mixed`'s batch, and its MLP's widths.
const WIDE: (usize, [usize; 4]) = (1024, [4096, 4096, 4096, 10]);

/// The MLP 4096-4096-4096-10 of `benches/mixed_anchor.py` on a batch of
/// 1024 normal rows (the size where a GPU's tensor cores, not its
/// launches, take the time): the same products as `mlp`'s, 172 GFLOP.
fn wide_mlp() -> Result<Case> {
    let (rows, sizes) = WIDE;
    let mut params = Vec::new();
    for (i, pair) in sizes.windows(2).enumerate() {
        params.push(he(&[pair[0], pair[1]], pair[0], i as u64)?);
        params.push(Tensor::zeros([pair[1]], DType::F32)?);
    }
    let labels: Vec<i32> = (0..rows as i32).map(|i| i * 31 % 10).collect();
    let macs: usize = sizes.windows(2).map(|p| p[0] * p[1]).sum();
    Ok(Case {
        shape: "1024x4096-4096-4096-10",
        params,
        buffers: Vec::new(),
        images: Tensor::randn([rows, sizes[0]], 7)?,
        labels: Tensor::from_vec(labels, [rows])?,
        loss: |p, _, x, y| {
            let mut h = x.clone();
            for (i, layer) in p.chunks(2).enumerate() {
                h = (h.matmul(&layer[0])? + &layer[1])?;
                if i + 1 < p.len() / 2 {
                    h = h.relu()?;
                }
            }
            Ok((h.cross_entropy(y)?, Vec::new()))
        },
        flops: (2 * rows * (3 * macs - sizes[0] * sizes[1])) as u64,
    })
}

/// The CNN of `examples/train_cnn.rs` (`kiln_support::digits_cnn`) and of
/// `cnn_anchor.py` in training mode (each batch norm by the batch's
/// statistics, moving its running ones; a new dropout mask each step), on a
/// batch of 100, its weights drawn as the anchor's (the
/// biases are `nn`'s, the anchor's zeros: the same work either way). Its
/// flops: each layer's products forward and for its weight's gradient, and
/// for its input's gradient but the first's, 587 MFLOP.
fn cnn() -> Result<Case> {
    let net = digits_cnn::network()?;
    let params = (net.parameters().into_iter())
        .map(|(name, p)| match name.as_str() {
            "layers.0.weight" => he(&[16, 1, 5, 5], 25, 0),
            "layers.4.weight" => he(&[32, 16, 5, 5], 400, 1),
            "layers.10.weight" => he(&[512, 10], 512, 2),
            _ => Ok(p.clone()),
        })
        .collect::<Result<Vec<_>>>()?;
    let buffers = net.buffers().into_iter().map(|(_, b)| b.clone()).collect();
    let (images, labels) = batch(100, &[28, 28])?;
    let conv1 = 100 * 16 * 24 * 24 * 25;
    let conv2 = 100 * 32 * 8 * 8 * 16 * 25;
    let linear = 100 * 512 * 10;
    Ok(Case {
        shape: "100x1x28x28-c16bn-c32bn-d-10",
        params,
        buffers,
        images,
        labels,
        loss: |p, b, x, y| {
            let net = digits_cnn::network()?.with_parameters(p)?.with_buffers(b)?;
            let mut next = Vec::new();
            let h = pixels(x)?.reshape([100, 1, 28, 28])?;
            let logits = net.forward_train(&h, &mut next)?;
            Ok((logits.cross_entropy(y)?, next))
        },
        flops: (2 * (2 * conv1 + 3 * conv2 + 3 * linear)) as u64,
    })
}

/// The context (positions of the position table), width, heads and blocks
/// of `train_lm`.
const LM: (usize, usize, usize, usize) = (64, 64, 4, 2);
/// Windows per step and characters per window of `train_lm`.
const LM_BATCH: (usize, usize) = (32, 64);
/// `train_lm`'s vocabulary: the characters of `data/text/liber-primus.txt`.
const LM_VOCABULARY: usize = 57;

/// The transformer of `examples/train_lm.rs` and `benches/lm_anchor.py`
/// (token and position embeddings, two blocks of four-head causal
/// self-attention and a GELU MLP after layer norms, a final layer norm, the
/// token embedding as the output layer) on 32 windows of 64 characters,
/// cross-entropy at every position. Its flops: every product forward and
/// twice backward, the attention's included.
fn lm() -> Result<Case> {
    let (context, width, _, blocks) = LM;
    let (b, t) = LM_BATCH;
    let v = LM_VOCABULARY;
    let mut params = vec![
        (Tensor::randn([v, width], 1)? * 0.02f32)?,
        (Tensor::randn([context, width], 2)? * 0.02f32)?,
    ];
    let ones = |n: usize| Tensor::from_vec(vec![1.0f32; n], [n]);
    for i in 0..blocks as u64 {
        for (k, (inputs, outputs)) in [
            (width, 3 * width),
            (width, width),
            (width, 4 * width),
            (4 * width, width),
        ]
        .into_iter()
        .enumerate()
        {
            if k % 2 == 0 {
                params.push(ones(width)?);
                params.push(Tensor::zeros([width], DType::F32)?);
            }
            let scale = 1.0 / (inputs as f32).sqrt();
            params.push((Tensor::randn([inputs, outputs], 10 * i + k as u64 + 3)? * scale)?);
            params.push(Tensor::zeros([outputs], DType::F32)?);
        }
    }
    params.push(ones(width)?);
    params.push(Tensor::zeros([width], DType::F32)?);
    let ids: Vec<i32> = (0..b * (t + 1)).map(|i| (i * 7919 % v) as i32).collect();
    let windows = Tensor::from_vec(ids, [b, t + 1])?;
    // Per token and block: the four products, and attention's two over
    // the context; per token: the tied output layer.
    let per_block = 2 * width * (3 * width + width + 8 * width) + 2 * 2 * t * width;
    Ok(Case {
        shape: "32x64-2x4x64",
        params,
        buffers: Vec::new(),
        images: windows.slice(1, 0, t, 1)?,
        labels: windows.slice(1, 1, t + 1, 1)?,
        loss: |p, _, x, y| {
            let (_, width, heads, blocks) = LM;
            let (b, t) = (x.dims()[0], x.dims()[1]);
            let head = width / heads;
            let rows = Tensor::from_vec((0..t as i32).collect::<Vec<_>>(), [t, 1])?;
            let causal = rows.ge(&rows.reshape([1, t])?)?;
            let flat = x.reshape([b * t])?;
            let tokens = p[0].index_select(0, &flat)?.reshape([b, t, width])?;
            let mut h = (tokens + p[1].slice(0, 0, t, 1)?)?;
            for i in 0..blocks {
                let w = &p[2 + 12 * i..14 + 12 * i];
                let a = h.layer_norm(&w[0], &w[1], 1e-5)?;
                let qkv = (a.matmul(&w[2])? + &w[3])?;
                let split = |x: &Tensor| x.reshape([b, t, heads, head])?.permute(&[0, 2, 1, 3]);
                let parts = qkv.split(&[width; 3], -1)?;
                let (q, k, v) = (split(&parts[0])?, split(&parts[1])?, split(&parts[2])?);
                let scores = (q.matmul(&k.transpose(-1, -2)?)? * (1.0 / (head as f32).sqrt()))?;
                let masked = causal.where_cond(&scores, &Tensor::scalar(f32::NEG_INFINITY))?;
                let mixed = masked.softmax(-1)?.matmul(&v)?.permute(&[0, 2, 1, 3])?;
                h = (&h + (mixed.reshape([b, t, width])?.matmul(&w[4])? + &w[5])?)?;
                let a = h.layer_norm(&w[6], &w[7], 1e-5)?;
                let up = (a.matmul(&w[8])? + &w[9])?.gelu()?;
                h = (&h + (up.matmul(&w[10])? + &w[11])?)?;
            }
            let n = p.len();
            let h = h.layer_norm(&p[n - 2], &p[n - 1], 1e-5)?;
            let logits = h.matmul(&p[0].t()?)?;
            let v = logits.dims()[2];
            let loss = (logits.reshape([b * t, v])?).cross_entropy(&y.reshape([b * t])?)?;
            Ok((loss, Vec::new()))
        },
        flops: (3 * b * t * (blocks * per_block + 2 * width * v)) as u64,
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
    state.extend(case.buffers.iter().cloned());
    state.extend(optimizer.state(&refs)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let specs = [
        TensorType::new(case.images.dtype(), case.images.shape().clone()),
        TensorType::new(case.labels.dtype(), case.labels.shape().clone()),
    ];
    let (n, m) = (params.len(), case.buffers.len());
    kiln::compile_step_with(id, &state, &specs, options, |s, b| {
        let (p, rest) = s.split_at(n);
        let (buffers, opt) = rest.split_at(m);
        let (loss, buffers) = (case.loss)(p, buffers, &b[0], &b[1])?;
        let grads = kiln::grad(&loss, &p.iter().collect::<Vec<_>>())?;
        let (p, opt) = optimizer.update(p, &grads, opt)?;
        Ok((
            vec![loss],
            p.into_iter().chain(buffers).chain(opt).collect(),
        ))
    })
}

/// A training step (`train_sgd`: SGD with momentum 0.9 at 0.05;
/// `train_adam`, `train_cnn`, `train_lm` and `train_mixed`: Adam at 1e-3)
/// compiled with `kiln::compile_step_with` for `backend`, fused and unfused
/// taking turns (`train_mixed`: fused, in f32 and in bf16 mixed precision,
/// `Options::autocast`). The batch is on the step's device, as the anchors
/// have it; a timed step reads its loss, so that on a GPU it is the host's
/// time for a step through the loss on the host. `compile_s` is the step's
/// compile time (tracing, optimizing, code generation). Checked: the first
/// step's loss against the interpreter's (`train_mixed`: against the f32
/// step's, which says how far mixed precision moves it).
pub(crate) fn train(id: &'static str, quick: bool, backend: Backend) -> Result<()> {
    eprintln!("{id}");
    let case = match id {
        "train_cnn" => cnn()?,
        "train_lm" => lm()?,
        "train_mixed" => wide_mlp()?,
        _ => mlp()?,
    };
    let sgd = Sgd {
        momentum: 0.9,
        ..Sgd::new(0.05)
    };
    let adam = AdamW {
        weight_decay: 0.0,
        ..AdamW::new(1e-3)
    };
    let optimizer: &dyn Optimizer = if id == "train_sgd" { &sgd } else { &adam };
    let (device, _) = target(backend);
    // On the step's device, as the anchors have it.
    let batch = [case.images.to(device)?, case.labels.to(device)?];
    let batch: Vec<&Tensor> = batch.iter().collect();
    let mixed = CompileOptions {
        optimizer: kiln::Options {
            autocast: Some(Autocast::BF16),
            ..options(backend, true).optimizer
        },
        ..options(backend, true)
    };
    let variants = match id {
        "train_mixed" => [("f32", options(backend, true)), ("bf16", mixed)],
        _ => [
            ("fused", options(backend, true)),
            ("unfused", options(backend, false)),
        ],
    };
    let mut steps = Vec::new();
    for (variant, options) in variants {
        let start = std::time::Instant::now();
        let mut step = compile(id, &case, optimizer, options)?;
        let compile_s = start.elapsed().as_secs_f64();
        let first = step.call(&batch)?[0].to_scalar::<f32>()?;
        steps.push((variant, step, first, compile_s));
    }
    let want = match id {
        // The interpreter's f64 products of 1024x4096x4096 would take
        // minutes.
        "train_mixed" => f64::from(steps[0].2),
        _ => reference_loss(&case)?,
    };
    let timings = time(quick, steps.len(), |v| {
        steps[v].1.call(&batch)?[0].to_scalar::<f32>().map(|_| None)
    })?;
    for ((variant, step, first, compile_s), timing) in steps.iter().zip(timings) {
        println!(
            "{{\"workload\":\"{id}\",\"shape\":\"{}\",\"variant\":\"{variant}\",\"backend\":\"{}\",{},\"compile_s\":{compile_s:.3},\"kernels\":{},\"bytes\":0,\"flops\":{},\"max_rel_err\":{:.2e}}}",
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

/// The first step's loss of `case`, by the interpreter.
fn reference_loss(case: &Case) -> Result<f64> {
    let on_reference = |values: &[Tensor]| -> Result<Vec<Tensor>> {
        values.iter().map(|v| v.to(Device::Reference)).collect()
    };
    let (params, buffers) = (on_reference(&case.params)?, on_reference(&case.buffers)?);
    let x = case.images.to(Device::Reference)?;
    let y = case.labels.to(Device::Reference)?;
    let loss = (case.loss)(&params, &buffers, &x, &y)?.0;
    Ok(f64::from(loss.to_scalar::<f32>()?))
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

/// `train_fed`: two epochs of `EPOCH_STEPS` fused `train_sgd` steps fed
/// by a `DataLoader` through `Epoch::to_device`, against the same steps on
/// one batch already on the device (`on_device`), the loss of every step
/// read at the end. On a GPU, a fed epoch copies each batch in while the
/// step before runs, and its first while the epoch before ends; the target
/// is `fed` within 10% of `on_device`. Variants:
/// - `fed`: epochs in a row, as training runs them, from call to call
///   (epochs 0, 1, then 2, 3, ...): each call's first epoch was read ahead
///   and its first batch put in the feed while the last call ended, and its
///   last step waits for the worker that reads the next epoch's first
///   batch, so that no reading is left to the untimed time between calls
///   but for the next epoch's second to fourth batch.
/// - `fed_cold`: the same, its first epoch one not read ahead (epochs 0,
///   1, then 3, 4, ...): what a loader's first epoch costs, read from its
///   first batch on.
///
/// Checked: the last losses agree.
pub(crate) fn fed(quick: bool, backend: Backend) -> Result<()> {
    eprintln!("train_fed");
    let case = mlp()?;
    let sgd = Sgd {
        momentum: 0.9,
        ..Sgd::new(0.05)
    };
    let (device, _) = target(backend);
    let options = options(backend, true);
    let variants = ["fed", "on_device", "fed_cold"];
    let mut steps = (variants.iter())
        .map(|_| compile("train_fed", &case, &sgd, options))
        .collect::<Result<Vec<_>>>()?;
    let data = Arc::new(Repeated {
        images: case.images.to_vec()?,
        labels: case.labels.to_vec()?,
    });
    let loader_options = LoaderOptions {
        batch_size: data.labels.len(),
        ..LoaderOptions::default()
    };
    let mut loaders = [
        DataLoader::new(data.clone(), loader_options)?,
        DataLoader::new(data, loader_options)?,
    ];
    let batch = [case.images.to(device)?, case.labels.to(device)?];
    let mut last = [0.0f32; 3];
    let mut calls = [0u64; 3];
    let mut epoch = |v: usize| -> Result<Option<f64>> {
        let mut losses = Vec::with_capacity(2 * EPOCH_STEPS);
        let c = calls[v];
        calls[v] += 1;
        if v == 1 {
            for _ in 0..2 * EPOCH_STEPS {
                losses.push(steps[1].call(&[&batch[0], &batch[1]])?.remove(0));
            }
        } else {
            // `fed` goes on where its last call stopped; `fed_cold` skips one.
            let first = if v == 0 { 2 * c } else { 3 * c };
            for e in [first, first + 1] {
                for fed in loaders[v / 2].epoch(e).to_device(device)? {
                    let fed = fed?;
                    losses.push(steps[v].call(&[&fed[0], &fed[1]])?.remove(0));
                }
            }
        }
        for loss in &losses {
            last[v] = loss.to_scalar::<f32>()?;
        }
        Ok(None)
    };
    let timings = time(quick, variants.len(), &mut epoch)?;
    for ((variant, timing), loss) in variants.iter().zip(timings).zip(last) {
        println!(
            "{{\"workload\":\"train_fed\",\"shape\":\"2x{EPOCH_STEPS}x{}\",\"variant\":\"{variant}\",\"backend\":\"{}\",{},\"kernels\":{},\"bytes\":0,\"flops\":{},\"max_rel_err\":{:.2e}}}",
            case.shape,
            backend.name(),
            timing.fields(),
            steps[0].graph().launches(),
            case.flops * 2 * EPOCH_STEPS as u64,
            max_rel_err(&[loss], &[f64::from(last[1])])
        );
    }
    Ok(())
}
