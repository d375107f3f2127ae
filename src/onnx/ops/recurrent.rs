//! ONNX's recurrent layers, `RNN`, `GRU` and `LSTM`, unrolled over the
//! sequence while tracing: the input's products with `W` for every step at
//! once, then per step the product of the hidden state with `R` and the
//! cell's elementwise work, which fuse into a kernel or two. Directions
//! forward, reverse and bidirectional, both layouts, initial states, LSTM's
//! peepholes, `clip`, GRU's `linear_before_reset`, and the activations
//! Sigmoid, Tanh and Relu, and `sequence_lens` (a batch element's state
//! kept and its output zero past its length). LSTM's `input_forget` and
//! other activations are refused as unsupported.

use super::one;
use crate::onnx::graph::{Node, Value};
use crate::{Result, Scalar, Tensor};

/// The mapping of `node`, if it is a recurrent layer.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    let cell = match node.op() {
        "RNN" => Cell::Rnn,
        "GRU" => Cell::Gru,
        "LSTM" => Cell::Lstm,
        _ => return None,
    };
    Some(recurrent(node, cell))
}

#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    /// Gates per hidden unit in `W`, `R` and each half of `B`.
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }

    /// Activations per direction, and their defaults.
    fn activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

#[derive(Clone, Copy)]
enum Activation {
    Sigmoid,
    Tanh,
    Relu,
}

impl Activation {
    fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Sigmoid => x.sigmoid(),
            Activation::Tanh => x.tanh(),
            Activation::Relu => x.relu(),
        }
    }
}

/// One direction's weights: `x @ W^T` for every step (with `W`'s bias),
/// `R^T`, `R`'s bias, the peepholes and the initial states.
struct Direction {
    inputs: Tensor,
    recurrent: Tensor,
    recurrent_bias: Option<Tensor>,
    peepholes: Option<[Tensor; 3]>,
    h: Tensor,
    c: Tensor,
}

fn recurrent(node: &Node, cell: Cell) -> Result<Vec<Value>> {
    let batch_first = node.attr_int("layout", 0)? == 1;
    let x = node.tensor(0)?;
    if x.rank() != 3 {
        return Err(node.invalid(format!("input {} is not [seq, batch, input]", x.shape())));
    }
    let x = if batch_first {
        x.permute(&[1, 0, 2])?
    } else {
        x
    };
    let (seq, batch) = (x.dims()[0], x.dims()[1]);
    let (w, r) = (node.tensor(1)?, node.tensor(2)?);
    let hidden = r.dims().get(2).copied().unwrap_or(0);
    let given_hidden = node.attr_int("hidden_size", hidden as i64)?;
    if given_hidden != hidden as i64 {
        return Err(node.invalid(format!("R {} for hidden_size {given_hidden}", r.shape())));
    }
    let reverse: Vec<bool> = match node.attr_string("direction", "forward")?.as_str() {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        other => return Err(node.invalid(format!("direction '{other}'"))),
    };
    // Per batch element, how many steps it has: past them its state stays
    // and its output is zero (reversed, it starts at its own last step).
    let lens = node
        .opt_tensor(4)?
        .map(|l| l.reshape([batch, 1]))
        .transpose()?;
    if cell == Cell::Lstm && node.attr_int("input_forget", 0)? != 0 {
        return Err(node.unsupported("input_forget"));
    }
    if node.attr_floats("activation_alpha")?.is_some()
        || node.attr_floats("activation_beta")?.is_some()
    {
        return Err(node.unsupported("activation_alpha and activation_beta"));
    }
    let per_direction = cell.activations().len();
    let names = match node.attr_strings("activations")? {
        Some(names) => names,
        None => (0..reverse.len())
            .flat_map(|_| cell.activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    if names.len() != per_direction * reverse.len() {
        return Err(node.invalid(format!(
            "{} activations for {} directions",
            names.len(),
            reverse.len()
        )));
    }
    let activations: Vec<Activation> = names
        .iter()
        .map(|n| match n.to_ascii_lowercase().as_str() {
            "sigmoid" => Ok(Activation::Sigmoid),
            "tanh" => Ok(Activation::Tanh),
            "relu" => Ok(Activation::Relu),
            _ => Err(node.unsupported(format!("activation '{n}'"))),
        })
        .collect::<Result<_>>()?;
    let clip = match node.attr("clip") {
        Some(_) => Some(node.attr_float("clip", 0.0)?),
        None => None,
    };
    let layer = Layer {
        cell,
        clip,
        linear_before_reset: cell == Cell::Gru && node.attr_int("linear_before_reset", 0)? != 0,
        hidden,
    };
    let (b, h0) = (node.opt_tensor(3)?, node.opt_tensor(5)?);
    let (c0, p) = match cell {
        Cell::Lstm => (node.opt_tensor(6)?, node.opt_tensor(7)?),
        _ => (None, None),
    };
    // Every operand's shape, before any is sliced.
    let (dirs, gates) = (reverse.len(), cell.gates() * hidden);
    let state_dims = match batch_first {
        true => [batch, dirs, hidden],
        false => [dirs, batch, hidden],
    };
    let expected: [(&str, Option<&Tensor>, Vec<usize>); 7] = [
        ("W", Some(&w), vec![dirs, gates, x.dims()[2]]),
        ("R", Some(&r), vec![dirs, gates, hidden]),
        ("B", b.as_ref(), vec![dirs, 2 * gates]),
        ("initial_h", h0.as_ref(), state_dims.to_vec()),
        ("initial_c", c0.as_ref(), state_dims.to_vec()),
        ("P", p.as_ref(), vec![dirs, 3 * hidden]),
        ("sequence_lens", lens.as_ref(), vec![batch, 1]),
    ];
    for (name, t, dims) in expected {
        if let Some(t) = t
            && t.dims() != dims
        {
            return Err(node.invalid(format!("{name} {} where {dims:?} fits", t.shape())));
        }
    }
    let zeros = Tensor::zeros([batch, hidden], x.dtype())?;
    let g = cell.gates() * hidden;
    let mut ys = Vec::new();
    let (mut hs, mut cs) = (Vec::new(), Vec::new());
    for (d, &backward) in reverse.iter().enumerate() {
        let pick = |t: &Tensor| -> Result<Tensor> {
            t.slice(0, d, d + 1, 1)?.reshape(t.dims()[1..].to_vec())
        };
        let state = |t: &Option<Tensor>| -> Result<Tensor> {
            let t = match t {
                Some(t) if batch_first => t.permute(&[1, 0, 2])?,
                Some(t) => t.clone(),
                None => return Ok(zeros.clone()),
            };
            pick(&t)
        };
        let mut inputs = x.matmul(&pick(&w)?.t()?)?;
        let mut recurrent_bias = None;
        if let Some(b) = &b {
            let b = pick(b)?;
            inputs = inputs.add(&b.slice(0, 0, g, 1)?)?;
            recurrent_bias = Some(b.slice(0, g, 2 * g, 1)?);
        }
        let peepholes = match &p {
            Some(p) => {
                let p = pick(p)?;
                let part = |k: usize| p.slice(0, k * hidden, (k + 1) * hidden, 1);
                Some([part(0)?, part(1)?, part(2)?])
            }
            None => None,
        };
        let mut dir = Direction {
            inputs,
            recurrent: pick(&r)?.t()?,
            recurrent_bias,
            peepholes,
            h: state(&h0)?,
            c: state(&c0)?,
        };
        let acts = &activations[d * per_direction..(d + 1) * per_direction];
        let mut outputs = vec![None; seq];
        let order: Vec<usize> = if backward {
            (0..seq).rev().collect()
        } else {
            (0..seq).collect()
        };
        for t in order {
            let step = dir.inputs.slice(0, t, t + 1, 1)?.reshape([batch, g])?;
            let (h, c) = (dir.h.clone(), dir.c.clone());
            step_cell(layer, &mut dir, &step, acts)?;
            let mut y = dir.h.clone();
            if let Some(lens) = &lens {
                let live = lens.gt(&Tensor::scalar(Scalar::I64(t as i64).cast(lens.dtype())))?;
                y = live.where_cond(&dir.h, &zeros)?;
                dir.h = live.where_cond(&dir.h, &h)?;
                dir.c = live.where_cond(&dir.c, &c)?;
            }
            outputs[t] = Some(y.unsqueeze(0)?);
        }
        ys.push(outputs.into_iter().flatten().collect::<Vec<_>>());
        hs.push(dir.h.unsqueeze(0)?);
        cs.push(dir.c.unsqueeze(0)?);
    }
    // Y: [seq, directions, batch, hidden]; Y_h and Y_c: [directions, batch, hidden].
    let steps: Vec<Tensor> = (0..seq)
        .map(|t| {
            let per: Vec<Tensor> = ys.iter().map(|y| y[t].clone()).collect();
            Tensor::cat(&per.iter().collect::<Vec<_>>(), 0)?.unsqueeze(0)
        })
        .collect::<Result<_>>()?;
    let y = match steps.is_empty() {
        true => Tensor::zeros([0, reverse.len(), batch, hidden], x.dtype())?,
        false => Tensor::cat(&steps.iter().collect::<Vec<_>>(), 0)?,
    };
    let (y_h, y_c) = (
        Tensor::cat(&hs.iter().collect::<Vec<_>>(), 0)?,
        Tensor::cat(&cs.iter().collect::<Vec<_>>(), 0)?,
    );
    let (y, y_h, y_c) = match batch_first {
        true => (
            y.permute(&[2, 0, 1, 3])?,
            y_h.permute(&[1, 0, 2])?,
            y_c.permute(&[1, 0, 2])?,
        ),
        false => (y, y_h, y_c),
    };
    let mut out = one(y)?;
    out.push(Value::Tensor(y_h));
    if cell == Cell::Lstm {
        out.push(Value::Tensor(y_c));
    }
    Ok(out)
}

/// What every step of every direction shares: the cell, its clip, GRU's
/// `linear_before_reset`, and the hidden size.
#[derive(Clone, Copy)]
struct Layer {
    cell: Cell,
    clip: Option<f32>,
    linear_before_reset: bool,
    hidden: usize,
}

/// One step of `layer`'s cell from `x @ W^T + Wb` (`step`, [batch, gates * hidden]).
fn step_cell(layer: Layer, dir: &mut Direction, step: &Tensor, acts: &[Activation]) -> Result<()> {
    let Layer {
        cell,
        clip,
        linear_before_reset,
        hidden,
    } = layer;
    let part = |t: &Tensor, k: usize| t.slice(1, k * hidden, (k + 1) * hidden, 1);
    let clipped = |t: Tensor| -> Result<Tensor> {
        match clip {
            Some(c) => t.clamp(-f64::from(c), f64::from(c)),
            None => Ok(t),
        }
    };
    // `h @ R^T + Rb`, of every gate (of z and r alone for a GRU that
    // multiplies after the reset).
    let width = match (cell, linear_before_reset) {
        (Cell::Gru, false) => 2 * hidden,
        _ => cell.gates() * hidden,
    };
    let mut hr = dir.h.matmul(&dir.recurrent.slice(1, 0, width, 1)?)?;
    if let Some(rb) = &dir.recurrent_bias {
        hr = hr.add(&rb.slice(0, 0, width, 1)?)?;
    }
    match cell {
        Cell::Rnn => dir.h = acts[0].apply(&clipped(step.add(&hr)?)?)?,
        Cell::Gru => {
            let z = acts[0].apply(&clipped(part(step, 0)?.add(&part(&hr, 0)?)?)?)?;
            let r = acts[0].apply(&clipped(part(step, 1)?.add(&part(&hr, 1)?)?)?)?;
            let candidate = if linear_before_reset {
                part(step, 2)?.add(&r.mul(&part(&hr, 2)?)?)?
            } else {
                // (r * h) @ Rh^T + Rbh: the product after the reset.
                let rh = dir.recurrent.slice(1, 2 * hidden, 3 * hidden, 1)?;
                let mut reset = r.mul(&dir.h)?.matmul(&rh)?;
                if let Some(rb) = &dir.recurrent_bias {
                    reset = reset.add(&rb.slice(0, 2 * hidden, 3 * hidden, 1)?)?;
                }
                part(step, 2)?.add(&reset)?
            };
            let candidate = acts[1].apply(&clipped(candidate)?)?;
            // (1 - z) * candidate + z * h
            dir.h = candidate.add(&z.mul(&dir.h.sub(&candidate)?)?)?;
        }
        Cell::Lstm => {
            let gate = |k: usize| -> Result<Tensor> { part(step, k)?.add(&part(&hr, k)?) };
            let peep = |k: usize, c: &Tensor, pre: Tensor| -> Result<Tensor> {
                match &dir.peepholes {
                    Some(p) => pre.add(&p[k].mul(c)?),
                    None => Ok(pre),
                }
            };
            let i = acts[0].apply(&clipped(peep(0, &dir.c, gate(0)?)?)?)?;
            let f = acts[0].apply(&clipped(peep(2, &dir.c, gate(2)?)?)?)?;
            let c_hat = acts[1].apply(&clipped(gate(3)?)?)?;
            let c = f.mul(&dir.c)?.add(&i.mul(&c_hat)?)?;
            let o = acts[0].apply(&clipped(peep(1, &c, gate(1)?)?)?)?;
            dir.h = o.mul(&acts[2].apply(&c)?)?;
            dir.c = c;
        }
    }
    Ok(())
}
