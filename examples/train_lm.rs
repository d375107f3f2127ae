//! A small character-level transformer learns Latin.
//!
//! The text is the first book of Cicero's *De finibus* (`data/text/`,
//! public domain), 49,068 characters of 57 kinds, nine tenths to train on
//! and the last tenth held out. The model is GPT's shape at toy size:
//! token and position embeddings, two blocks of causal self-attention (four
//! heads) and a GELU MLP, each after a layer norm and added back, a final
//! layer norm, and the token embedding again as the output layer (tied).
//! One training step (the forward pass over a batch of windows,
//! cross-entropy at every position, the gradients, AdamW's update) is
//! compiled once with `kiln::compile_step`. Windows start anywhere in the
//! text; an epoch is as many steps as take as many characters as the
//! training text holds. After each epoch it prints the training loss
//! and the held-out loss, and at the end a sample, drawn character by
//! character from the model's distribution.
//!
//! Run with `cargo run --release --example train_lm`.

use std::path::Path;
use std::time::Instant;

use kiln::nn::{Embedding, LayerNorm, Linear, Module};
use kiln::optim::{AdamW, Optimizer};
use kiln::{CompiledStep, DType, Result, Tensor, TensorType};

/// Characters each window holds, and the model attends over.
const CONTEXT: usize = 64;
/// Windows per step.
const BATCH: usize = 32;
/// The width of every position's vector.
const WIDTH: usize = 64;
/// Attention heads per block.
const HEADS: usize = 4;
/// Transformer blocks.
const BLOCKS: usize = 2;
/// Epochs of training: about 1,000 steps.
const EPOCHS: usize = 48;

/// One block: attention and an MLP, each after a layer norm and added back.
#[derive(Clone, Debug)]
struct Block {
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    up: Linear,
    down: Linear,
}

/// The language model: embeddings, blocks, a final layer norm, and the
/// token embedding as the output layer.
#[derive(Clone, Debug)]
struct Lm {
    tokens: Embedding,
    positions: Tensor,
    blocks: Vec<Block>,
    ln: LayerNorm,
}

impl Block {
    fn new(seed: u64) -> Result<Block> {
        Ok(Block {
            ln1: LayerNorm::new(WIDTH)?,
            qkv: Linear::new(WIDTH, 3 * WIDTH, seed)?,
            proj: Linear::new(WIDTH, WIDTH, seed + 1)?,
            ln2: LayerNorm::new(WIDTH)?,
            up: Linear::new(WIDTH, 4 * WIDTH, seed + 2)?,
            down: Linear::new(4 * WIDTH, WIDTH, seed + 3)?,
        })
    }

    /// The block over `h` (`[batch, time, width]`), `causal` the `[time,
    /// time]` mask of the positions each may attend to.
    fn forward(&self, h: &Tensor, causal: &Tensor) -> Result<Tensor> {
        let (b, t) = (h.dims()[0], h.dims()[1]);
        let head = WIDTH / HEADS;
        let qkv = self.qkv.forward(&self.ln1.forward(h)?)?;
        let heads = |x: &Tensor| x.reshape([b, t, HEADS, head])?.permute(&[0, 2, 1, 3]);
        let parts = qkv.split(&[WIDTH; 3], -1)?;
        let (q, k, v) = (heads(&parts[0])?, heads(&parts[1])?, heads(&parts[2])?);
        let scores = (q.matmul(&k.transpose(-1, -2)?)? * (1.0 / (head as f32).sqrt()))?;
        let masked = causal.where_cond(&scores, &Tensor::scalar(f32::NEG_INFINITY))?;
        let mixed = masked.softmax(-1)?.matmul(&v)?;
        let merged = mixed.permute(&[0, 2, 1, 3])?.reshape([b, t, WIDTH])?;
        let h = (h + self.proj.forward(&merged)?)?;
        let up = self.up.forward(&self.ln2.forward(&h)?)?.gelu()?;
        &h + self.down.forward(&up)?
    }

    fn layers(&self) -> [(&str, &dyn Module); 6] {
        [
            ("ln1", &self.ln1),
            ("qkv", &self.qkv),
            ("proj", &self.proj),
            ("ln2", &self.ln2),
            ("up", &self.up),
            ("down", &self.down),
        ]
    }

    fn layers_mut(&mut self) -> [(&str, &mut dyn Module); 6] {
        [
            ("ln1", &mut self.ln1),
            ("qkv", &mut self.qkv),
            ("proj", &mut self.proj),
            ("ln2", &mut self.ln2),
            ("up", &mut self.up),
            ("down", &mut self.down),
        ]
    }
}

impl Lm {
    fn new(vocabulary: usize) -> Result<Lm> {
        Ok(Lm {
            tokens: Embedding {
                weight: (Tensor::randn([vocabulary, WIDTH], 1)? * 0.02f32)?,
            },
            positions: (Tensor::randn([CONTEXT, WIDTH], 2)? * 0.02f32)?,
            blocks: (0..BLOCKS)
                .map(|i| Block::new(10 * i as u64 + 3))
                .collect::<Result<_>>()?,
            ln: LayerNorm::new(WIDTH)?,
        })
    }

    /// The logits of the next character after each position of `ids`
    /// (`[batch, time]`, i32): `[batch, time, vocabulary]`.
    fn logits(&self, ids: &Tensor) -> Result<Tensor> {
        let t = ids.dims()[1];
        let rows: Vec<i32> = (0..t as i32).collect();
        let rows = Tensor::from_vec(rows, [t, 1])?;
        let causal = rows.ge(&rows.reshape([1, t])?)?;
        let mut h = (self.tokens.forward(ids)? + self.positions.slice(0, 0, t, 1)?)?;
        for block in &self.blocks {
            h = block.forward(&h, &causal)?;
        }
        self.ln.forward(&h)?.matmul(&self.tokens.weight.t()?)
    }
}

impl Module for Lm {
    /// The logits of every position, as `logits`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits(ids)
    }

    fn parameters(&self) -> Vec<(String, &Tensor)> {
        let mut all = vec![
            ("tokens.weight".to_string(), &self.tokens.weight),
            ("positions".to_string(), &self.positions),
        ];
        for (i, block) in self.blocks.iter().enumerate() {
            for (name, layer) in block.layers() {
                for (p, t) in layer.parameters() {
                    all.push((format!("blocks.{i}.{name}.{p}"), t));
                }
            }
        }
        all.extend(
            self.ln
                .parameters()
                .into_iter()
                .map(|(p, t)| (format!("ln.{p}"), t)),
        );
        all
    }

    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut all = vec![
            ("tokens.weight".to_string(), &mut self.tokens.weight),
            ("positions".to_string(), &mut self.positions),
        ];
        for (i, block) in self.blocks.iter_mut().enumerate() {
            for (name, layer) in block.layers_mut() {
                for (p, t) in layer.parameters_mut() {
                    all.push((format!("blocks.{i}.{name}.{p}"), t));
                }
            }
        }
        let ln = self.ln.parameters_mut().into_iter();
        all.extend(ln.map(|(p, t)| (format!("ln.{p}"), t)));
        all
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(self.clone())
    }
}

/// The mean cross-entropy of the next character at every position of
/// `windows` (`[batch, time + 1]`, i32).
fn loss(model: &Lm, windows: &Tensor) -> Result<Tensor> {
    let (b, t) = (windows.dims()[0], windows.dims()[1] - 1);
    let inputs = windows.slice(1, 0, t, 1)?;
    let targets = windows.slice(1, 1, t + 1, 1)?.reshape([b * t])?;
    let logits = model.logits(&inputs)?;
    let vocabulary = logits.dims()[2];
    logits.reshape([b * t, vocabulary])?.cross_entropy(&targets)
}

/// The training step: state = parameters, then AdamW's state; argument = a
/// batch of windows; output = its loss.
fn training_step(model: &Lm, optimizer: &AdamW) -> Result<CompiledStep> {
    let params: Vec<&Tensor> = model.parameters().into_iter().map(|(_, p)| p).collect();
    let mut state: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    state.extend(optimizer.state(&params)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let n = params.len();
    let batch = [TensorType::new(DType::I32, [BATCH, CONTEXT + 1])];
    kiln::compile_step("train_lm", &state, &batch, |state, batch| {
        let (params, moments) = state.split_at(n);
        let loss = loss(&model.with_parameters(params)?, &batch[0])?;
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = kiln::grad(&loss, &refs)?;
        let (params, moments) = optimizer.update(params, &grads, moments)?;
        Ok((vec![loss], params.into_iter().chain(moments).collect()))
    })
}

/// SplitMix64, for the windows and the sample: reproducible anywhere.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// In [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// `BATCH` windows of `CONTEXT + 1` ids starting anywhere in `ids`.
fn windows(ids: &[i32], draws: &mut Draws) -> Result<Tensor> {
    let mut batch = Vec::with_capacity(BATCH * (CONTEXT + 1));
    for _ in 0..BATCH {
        let start = draws.below(ids.len() - CONTEXT);
        batch.extend_from_slice(&ids[start..start + CONTEXT + 1]);
    }
    Tensor::from_vec(batch, [BATCH, CONTEXT + 1])
}

fn main() -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/text/liber-primus.txt");
    let text = std::fs::read_to_string(&path).map_err(|e| kiln::data::DataError::Io {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let mut vocabulary: Vec<char> = text.chars().collect();
    vocabulary.sort_unstable();
    vocabulary.dedup();
    let ids: Vec<i32> = (text.chars())
        .map(|c| vocabulary.binary_search(&c).unwrap_or(0) as i32)
        .collect();
    let split = ids.len() * 9 / 10;
    let (train, held_out) = ids.split_at(split);

    let model = Lm::new(vocabulary.len())?;
    let optimizer = AdamW {
        weight_decay: 0.01,
        ..AdamW::new(3e-3)
    };
    let start = Instant::now();
    let mut step = training_step(&model, &optimizer)?;
    println!(
        "training a transformer ({BLOCKS} blocks, {HEADS} heads, width {WIDTH}, context {CONTEXT}, {} parameters) on {} characters of Cicero, batches of {BATCH}, AdamW: {} kernels per step, traced and compiled in {:.0} ms",
        model
            .parameters()
            .iter()
            .map(|(_, p)| p.numel())
            .sum::<usize>(),
        train.len(),
        step.graph().launches(),
        start.elapsed().as_secs_f64() * 1e3
    );
    let mut draws = Draws(7);
    let mut held = Draws(8);
    let held_out_batches: Vec<Tensor> = (0..4)
        .map(|_| windows(held_out, &mut held))
        .collect::<Result<_>>()?;
    let mut training = std::time::Duration::ZERO;
    let steps_per_epoch = train.len() / (BATCH * CONTEXT);
    for e in 1..=EPOCHS {
        let started = Instant::now();
        let losses = (0..steps_per_epoch)
            .map(|_| Ok(step.call(&[&windows(train, &mut draws)?])?.remove(0)))
            .collect::<Result<Vec<_>>>()?;
        // Reading the losses waits for the steps: their time is training's.
        let mut train_loss = 0.0;
        for l in &losses {
            train_loss += l.to_scalar::<f32>()? / losses.len() as f32;
        }
        training += started.elapsed();
        let state = step.state()?;
        let trained = model.with_parameters(&state[..model.parameters().len()])?;
        let mut held_loss = 0.0;
        for b in &held_out_batches {
            held_loss += loss(&trained, b)?.to_scalar::<f32>()? / held_out_batches.len() as f32;
        }
        println!(
            "epoch {e:>2}: loss {train_loss:.3}, held-out loss {held_loss:.3}, {:.0} characters/s",
            (e * steps_per_epoch * BATCH * CONTEXT) as f64 / training.as_secs_f64()
        );
    }

    // A sample: each next character drawn from the model's distribution
    // after the last CONTEXT characters, the held-out text's opening as
    // the prompt.
    let state = step.state()?;
    let trained = model.with_parameters(&state[..model.parameters().len()])?;
    let spec = [TensorType::new(DType::I32, [1, CONTEXT])];
    let mut next = kiln::compile("sample", &spec, |x| {
        Ok(vec![
            trained
                .logits(&x[0])?
                .slice(1, CONTEXT - 1, CONTEXT, 1)?
                .softmax(-1)?,
        ])
    })?;
    let mut context: Vec<i32> = held_out[..CONTEXT].to_vec();
    let mut sample = String::new();
    let mut pick = Draws(9);
    for _ in 0..300 {
        let window = Tensor::from_vec(context[context.len() - CONTEXT..].to_vec(), [1, CONTEXT])?;
        let probabilities = next.call(&[&window])?.remove(0).to_vec::<f32>()?;
        let (mut u, mut c) = (pick.unit(), 0);
        while c + 1 < probabilities.len() && u >= probabilities[c] {
            u -= probabilities[c];
            c += 1;
        }
        context.push(c as i32);
        sample.push(vocabulary[c]);
    }
    let prompt: String = held_out[..CONTEXT]
        .iter()
        .map(|&i| vocabulary[i as usize])
        .collect();
    println!("sample after \"{}\":\n{sample}", prompt.replace('\n', " "));
    Ok(())
}
