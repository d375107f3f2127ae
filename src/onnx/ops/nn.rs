//! ONNX's neural-network ops as kiln composites: matmul and Gemm, softmax
//! and its relatives on any axis (with the 2-D coercion of opsets before
//! 13), the normalizations in inference, dropout at inference, one-hot
//! and the classification losses.

use kiln_ir::DType;

use super::{axes, axis, numel, one, scalar};
use crate::onnx::graph::{Node, Value};
use crate::ops::ramp;
use crate::{Result, Tensor};

/// The node's outputs, or `None` if the op is not one of these.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    Some(match node.op() {
        "MatMul" => node
            .tensor(0)
            .and_then(|a| one(a.matmul(&node.tensor(1)?)?)),
        "Gemm" => gemm(node),
        "Softmax" => softmax_like(node, Tensor::softmax),
        "LogSoftmax" => softmax_like(node, Tensor::log_softmax),
        "Hardmax" => softmax_like(node, hardmax),
        "LayerNormalization" => layer_norm(node),
        "RMSNormalization" => rms_norm(node),
        "BatchNormalization" => batch_norm(node),
        "InstanceNormalization" => instance_norm(node),
        "GroupNormalization" => group_norm(node),
        "LpNormalization" => lp_norm(node),
        "MeanVarianceNormalization" => mvn(node),
        "Dropout" => dropout(node),
        "OneHot" => one_hot(node),
        "NegativeLogLikelihoodLoss" => node
            .tensor(0)
            .and_then(|logp| Ok(vec![Value::Tensor(nll(node, &logp)?)])),
        "SoftmaxCrossEntropyLoss" => cross_entropy(node),
        _ => return None,
    })
}

fn gemm(node: &Node) -> Result<Vec<Value>> {
    let alpha = node.attr_float("alpha", 1.0)?;
    let beta = node.attr_float("beta", 1.0)?;
    let ta = node.attr_int("transA", 0)? != 0;
    let tb = node.attr_int("transB", 0)? != 0;
    // `broadcast` (before opset 7) only allowed what NumPy rules allow.
    node.attr_int("broadcast", 0)?;
    let (mut a, mut b) = (node.tensor(0)?, node.tensor(1)?);
    if a.rank() != 2 || b.rank() != 2 {
        return Err(node.invalid("A and B must be matrices"));
    }
    if ta {
        a = a.t()?;
    }
    if tb {
        b = b.t()?;
    }
    let mut y = a.matmul(&b)?;
    if alpha != 1.0 {
        y = y.mul(&Tensor::scalar(alpha))?;
    }
    if let Some(c) = node.opt_tensor(2)? {
        let c = if beta != 1.0 {
            c.mul(&Tensor::scalar(beta))?
        } else {
            c
        };
        let sum = y.add(&c)?;
        if sum.shape() != y.shape() {
            return Err(node.invalid("C does not broadcast to A B"));
        }
        y = sum;
    }
    one(y)
}

/// Softmax, LogSoftmax and Hardmax: one axis since opset 13 (default -1);
/// before, the input coerced to 2-D at `axis` (default 1) and the op
/// applied along the flattened second part.
fn softmax_like(node: &Node, f: fn(&Tensor, isize) -> Result<Tensor>) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    if node.opset >= 13 {
        let a = axis(node, node.attr_int("axis", -1)?, x.rank())?;
        return one(f(&x, a as isize)?);
    }
    let a = node.attr_int("axis", 1)?;
    let flat = super::shape::flatten_dims(node, x.dims(), a)?;
    one(f(&x.reshape(flat)?, 1)?.reshape(x.dims())?)
}

/// 1 at the first largest element along `axis`, 0 elsewhere.
fn hardmax(x: &Tensor, a: isize) -> Result<Tensor> {
    let axis = crate::ops::normalize_axis("Hardmax", a, x.rank())?;
    let first = x.argmax(a, true)?;
    let hit = first.eq(&ramp(0..x.dims()[axis] as i32, axis, x.rank())?)?;
    hit.cast(x.dtype())
}

/// (x - mean) / sqrt(var + eps) over `norm` axes, with the mean and the
/// inverse deviation (reduced axes kept).
fn normalize(x: &Tensor, norm: &[isize], eps: f32) -> Result<(Tensor, Tensor, Tensor)> {
    let mean = x.mean(norm, true)?;
    let centered = x.sub(&mean)?;
    let var = centered.square()?.mean(norm, true)?;
    let inv_std = var.add(&Tensor::scalar(eps))?.sqrt()?.recip()?;
    Ok((centered.mul(&inv_std)?, mean, inv_std))
}

fn stash_f32(node: &Node) -> Result<()> {
    match node.attr_int("stash_type", 1)? {
        1 => Ok(()),
        t => Err(node.unsupported(format!("stash_type {t}"))),
    }
}

fn layer_norm(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node, node.attr_int("axis", -1)?, x.rank())?;
    let eps = node.attr_float("epsilon", 1e-5)?;
    stash_f32(node)?;
    let norm: Vec<isize> = (a..x.rank()).map(|a| a as isize).collect();
    let (y, mean, inv_std) = normalize(&x, &norm, eps)?;
    let mut y = y.mul(&node.tensor(1)?)?;
    if let Some(b) = node.opt_tensor(2)? {
        y = y.add(&b)?;
    }
    Ok(vec![
        Value::Tensor(y),
        Value::Tensor(mean),
        Value::Tensor(inv_std),
    ])
}

fn rms_norm(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node, node.attr_int("axis", -1)?, x.rank())?;
    let eps = node.attr_float("epsilon", 1e-5)?;
    stash_f32(node)?;
    let norm: Vec<isize> = (a..x.rank()).map(|a| a as isize).collect();
    let inv_rms = x
        .square()?
        .mean(&norm, true)?
        .add(&Tensor::scalar(eps))?
        .sqrt()?
        .recip()?;
    one(x.mul(&inv_rms)?.mul(&node.tensor(1)?)?)
}

/// A per-channel parameter `[C]` shaped `[C, 1, ..]` to broadcast along
/// axis 1 of a tensor of rank `rank` (at least 2).
fn per_channel(node: &Node, i: usize, rank: usize) -> Result<Tensor> {
    channel_axis(&node.tensor(i)?, rank)
}

fn channel_axis(p: &Tensor, rank: usize) -> Result<Tensor> {
    let mut dims = vec![1; rank.max(2) - 1];
    dims[0] = p.numel();
    p.reshape(dims)
}

fn batch_norm(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    if node.attr_int("training_mode", 0)? != 0 {
        return Err(node.unsupported("training_mode"));
    }
    if node.attr_int("is_test", 1)? == 0 {
        return Err(node.unsupported("is_test = 0 (training)"));
    }
    if node.attr_int("spatial", 1)? == 0 {
        return Err(node.unsupported("spatial = 0"));
    }
    let eps = node.attr_float("epsilon", 1e-5)?;
    node.attr_float("momentum", 0.9)?;
    node.attr_ints("consumed_inputs")?;
    if node.proto.outputs.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(node.unsupported("running statistics outputs (training)"));
    }
    if x.rank() < 2 {
        return Err(node.invalid(format!("input {} has no channel axis", x.shape())));
    }
    let rank = x.rank();
    let [scale, bias, mean, var] = [1, 2, 3, 4].map(|i| per_channel(node, i, rank));
    let inv_std = var?.add(&Tensor::scalar(eps))?.sqrt()?.recip()?;
    let y = x.sub(&mean?)?.mul(&inv_std)?.mul(&scale?)?.add(&bias?)?;
    one(y)
}

fn instance_norm(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let eps = node.attr_float("epsilon", 1e-5)?;
    let spatial: Vec<isize> = (2..x.rank() as isize).collect();
    let (y, _, _) = normalize(&x, &spatial, eps)?;
    let rank = x.rank();
    one(y
        .mul(&per_channel(node, 1, rank)?)?
        .add(&per_channel(node, 2, rank)?)?)
}

fn group_norm(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let eps = node.attr_float("epsilon", 1e-5)?;
    stash_f32(node)?;
    let groups = usize::try_from(node.attr_int("num_groups", 0)?).unwrap_or(0);
    let dims = x.dims().to_vec();
    if dims.len() < 2 || groups == 0 || dims[1] % groups != 0 {
        return Err(node.invalid(format!("{groups} groups for input {dims:?}")));
    }
    // [N, C, ..] -> [N, G, C/G * ..], normalized over the last axis.
    let grouped = x.reshape([dims[0], groups, numel(&dims[1..]) / groups])?;
    let (y, _, _) = normalize(&grouped, &[2], eps)?;
    let (scale, bias) = (node.tensor(1)?, node.tensor(2)?);
    // Opset 21 scales each channel; opset 18 each group.
    let (y, shape) = match scale.numel() == dims[1] {
        true => (y.reshape(dims.clone())?, dims.len() + 1),
        false => (y.reshape([dims[0], groups, numel(&dims[1..]) / groups])?, 4),
    };
    let to_axis = |p: &Tensor| -> Result<Tensor> {
        let mut d = vec![1; shape - 2];
        d[0] = p.numel();
        p.reshape(d)
    };
    let y = y.mul(&to_axis(&scale)?)?.add(&to_axis(&bias)?)?;
    one(y.reshape(dims)?)
}

fn lp_norm(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node, node.attr_int("axis", -1)?, x.rank())? as isize;
    let norm = match node.attr_int("p", 2)? {
        1 => x.abs()?.sum(&[a], true)?,
        2 => x.square()?.sum(&[a], true)?.sqrt()?,
        p => return Err(node.invalid(format!("p = {p}"))),
    };
    // A zero norm gives 0, not 0/0, as onnx's reference.
    let zero = norm.eq(&Tensor::scalar(0.0f32))?;
    one(zero.where_cond(&Tensor::scalar(0.0f32), &x.div(&norm)?)?)
}

/// (x - E x) / (sqrt(E x^2 - (E x)^2) + 1e-9), as ONNX's function body.
fn mvn(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let list = node.attr_ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
    let norm: Vec<isize> = axes(node, &list, x.rank())?
        .into_iter()
        .map(|a| a as isize)
        .collect();
    let mean = x.mean(&norm, true)?;
    let var = x.square()?.mean(&norm, true)?.sub(&mean.square()?)?;
    let std = var.sqrt()?.add(&Tensor::scalar(1e-9f32))?;
    one(x.sub(&mean)?.div(&std)?)
}

/// Dropout at inference: the input unchanged and a mask of all true.
/// Training with a nonzero ratio draws random numbers kiln cannot match.
fn dropout(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    node.attr_int("seed", 0)?;
    node.attr_int("is_test", 0)?;
    let training = match node.has(2) {
        true => match node.known(2).map(|a| &a.data) {
            Some(d) if d.len() == 1 => d.get(0).to_f64() != 0.0,
            _ => return Err(node.unsupported("a training_mode computed at run time")),
        },
        false => false,
    };
    // Outside training the ratio, known or not, changes nothing.
    let ratio = match node.opset < 12 {
        true => Some(f64::from(node.attr_float("ratio", 0.5)?)),
        false => match node.has(1) {
            true => node.known(1).map(|a| &a.data).and_then(|d| match d.len() {
                1 => Some(d.get(0).to_f64()),
                _ => None,
            }),
            false => Some(0.5),
        },
    };
    match ratio {
        _ if !training => {}
        Some(0.0) => {}
        Some(_) => return Err(node.unsupported("training mode: random masks")),
        None => return Err(node.unsupported("a ratio computed at run time")),
    }
    let mask = Tensor::full(x.dims(), true)?;
    Ok(vec![Value::Tensor(x), Value::Tensor(mask)])
}

/// Class indices as i32: known ones (i64 or i32) checked to fit, run-time
/// i32 ones as they are and i64 ones narrowed (`narrow_indices`).
fn class_indices(node: &Node, i: usize) -> Result<Tensor> {
    match node.known(i) {
        Some(a) => {
            let values = a
                .ints()
                .ok_or_else(|| node.invalid(format!("input {i} is not integers")))?;
            let narrow = values
                .iter()
                .map(|&v| i32::try_from(v).map_err(|_| node.invalid(format!("index {v}"))))
                .collect::<Result<Vec<i32>>>()?;
            Tensor::from_vec(narrow, a.dims.clone())
        }
        None => {
            let t = node.tensor(i)?;
            match t.dtype() {
                DType::I32 => Ok(t),
                DType::I64 => narrow_indices(&t),
                other => Err(node.unsupported(format!("indices of {other}"))),
            }
        }
    }
}

/// i64 indices as i32, those outside i32's range clamped to its ends,
/// where they stay outside every axis kiln can index (and so pick what an
/// index out of range picks) instead of wrapping into it.
fn narrow_indices(t: &Tensor) -> Result<Tensor> {
    t.maximum(&Tensor::scalar(i64::from(i32::MIN)))?
        .minimum(&Tensor::scalar(i64::from(i32::MAX)))?
        .cast(DType::I32)
}

fn one_hot(node: &Node) -> Result<Vec<Value>> {
    let depth = node.int(1)?;
    let depth = usize::try_from(depth).map_err(|_| node.invalid(format!("depth {depth}")))?;
    let indices = match node.known(0) {
        Some(_) => class_indices(node, 0)?,
        None => {
            let t = node.tensor(0)?;
            match t.dtype() {
                DType::I64 => narrow_indices(&t)?,
                _ => t.cast(DType::I32)?,
            }
        }
    };
    let values = node.tensor(2)?;
    if values.numel() != 2 {
        return Err(node.invalid("values must hold [off, on]"));
    }
    let rank = indices.rank() + 1;
    let a = axis(node, node.attr_int("axis", -1)?, rank)?;
    // Negative indices count from the end of the depth.
    let wrapped = indices.add(&Tensor::scalar(depth as i32))?;
    let indices = indices
        .lt(&Tensor::scalar(0i32))?
        .where_cond(&wrapped, &indices)?;
    let hit = indices
        .unsqueeze(a as isize)?
        .eq(&ramp(0..depth as i32, a, rank)?)?;
    let off = values.slice(0, 0, 1, 1)?.reshape([])?;
    let on = values.slice(0, 1, 2, 1)?.reshape([])?;
    one(hit.where_cond(&on, &off)?)
}

/// The negative log-likelihood of log-probabilities `logp` `[N, C, ..]`
/// at the class indices of input 1, weighted, with ONNX's reductions.
fn nll(node: &Node, logp: &Tensor) -> Result<Tensor> {
    let target = class_indices(node, 1)?;
    let reduction = node.attr_string("reduction", "mean")?;
    let ignore = node.attr("ignore_index").map(|a| a.i);
    if logp.rank() < 2 || target.rank() + 1 != logp.rank() {
        return Err(node.invalid(format!(
            "input {} and target {} do not fit",
            logp.shape(),
            target.shape()
        )));
    }
    let classes = logp.dims()[1];
    // Ignored entries pick class 0 and weigh nothing.
    let (target, keep) = match ignore {
        Some(i) => {
            let i = i32::try_from(i).unwrap_or(i32::MIN);
            let keep = target.ne(&Tensor::scalar(i))?;
            (keep.where_cond(&target, &Tensor::scalar(0i32))?, Some(keep))
        }
        None => (target, None),
    };
    let picked = logp
        .gather(1, &target.unsqueeze(1)?)?
        .reshape(target.dims())?;
    let mut weight = match node.opt_tensor(2)? {
        Some(w) if w.dims() == [classes] => w
            .index_select(0, &target.reshape([target.numel()])?)?
            .reshape(target.dims())?,
        Some(w) => return Err(node.invalid(format!("weight {} for {classes} classes", w.shape()))),
        None => Tensor::ones(target.dims(), DType::F32)?,
    };
    if let Some(keep) = keep {
        weight = keep.where_cond(&weight, &scalar(0.0, DType::F32))?;
    }
    let loss = picked.neg()?.mul(&weight)?;
    match reduction.as_str() {
        "none" => Ok(loss),
        "sum" => loss.sum_all(),
        "mean" => loss.sum_all()?.div(&weight.sum_all()?),
        other => Err(node.invalid(format!("reduction '{other}'"))),
    }
}

fn cross_entropy(node: &Node) -> Result<Vec<Value>> {
    let scores = node.tensor(0)?;
    let logp = scores.log_softmax(1)?;
    let loss = nll(node, &logp)?;
    Ok(vec![Value::Tensor(loss), Value::Tensor(logp)])
}
