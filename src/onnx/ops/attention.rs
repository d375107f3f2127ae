//! ONNX's `Attention` (opsets 23 and 24) as a kiln composite: queries,
//! keys and values of 4 axes (`[batch, heads, sequence, head size]`) or of
//! 3 (heads side by side in the last axis), a key and value cache (`past_`
//! and `present_`), grouped queries (fewer key and value heads, each
//! serving consecutive query heads), bool or additive masks, causal
//! masking aligned after the cache, keys past each batch's length
//! (`nonpad_kv_seqlen`), a soft cap, and the scores at any of the four
//! stages `qk_matmul_output_mode` names.

use kiln_ir::{DType, Scalar};

use crate::attention::bias;
use crate::onnx::graph::{Node, Value};
use crate::ops::ramp;
use crate::{Result, Tensor};

/// The node's outputs, or `None` if the op is not `Attention`.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    (node.op() == "Attention").then(|| attention(node))
}

fn attention(node: &Node) -> Result<Vec<Value>> {
    let (q, k, v) = (node.tensor(0)?, node.tensor(1)?, node.tensor(2)?);
    let rank = q.rank();
    if !matches!(rank, 3 | 4) || k.rank() != rank || v.rank() != rank {
        return Err(node.invalid(format!(
            "Q {}, K {} and V {} must all have 3 or 4 axes",
            q.shape(),
            k.shape(),
            v.shape()
        )));
    }
    if let Some(p) = node.attr("softmax_precision") {
        // kiln's softmax runs 16-bit and f32 scores in f32 (FLOAT, 1), and
        // f64 ones in f64 (DOUBLE, 11).
        let precision = match q.dtype() {
            DType::F64 => 11,
            _ => 1,
        };
        if p.i != precision {
            return Err(node.unsupported(format!("softmax_precision {} for {}", p.i, q.dtype())));
        }
    }
    let dtype = q.dtype();
    let (q, k, v) = match rank {
        3 => {
            let heads = |name: &str| -> Result<usize> {
                match node.attr_int(name, 0)? {
                    h if h > 0 => Ok(h as usize),
                    _ => Err(node.invalid(format!("3-axis inputs need {name}"))),
                }
            };
            let (qh, kvh) = (heads("q_num_heads")?, heads("kv_num_heads")?);
            (
                split(node, &q, qh)?,
                split(node, &k, kvh)?,
                split(node, &v, kvh)?,
            )
        }
        _ => (q, k, v),
    };
    let (past_key, past_value) = (node.opt_tensor(4)?, node.opt_tensor(5)?);
    let cached = |past: Option<Tensor>, now: &Tensor| match past {
        Some(p) => Tensor::cat(&[&p, now], 2),
        None => Ok(now.clone()),
    };
    let new_keys = k.dims()[2];
    let (k, v) = (cached(past_key, &k)?, cached(past_value, &v)?);
    let past = k.dims()[2] - new_keys;
    let (qd, kd) = (q.dims(), k.dims());
    let ([batch, q_heads, l, e], [_, kv_heads, s, _]) = (four(qd), four(kd));
    if kv_heads == 0 || !q_heads.is_multiple_of(kv_heads) || v.dims()[1] != kv_heads || kd[3] != e {
        return Err(node.invalid(format!(
            "Q {}, K {} and V {} do not fit",
            q.shape(),
            k.shape(),
            v.shape()
        )));
    }
    // A mask shorter than the keys hides the rest.
    let mask = match node.opt_tensor(3)? {
        Some(m) if m.dims().last().is_some_and(|&last| last < s) => {
            let last = m.dims()[m.rank() - 1];
            let mut pads = vec![(0, 0); m.rank()];
            pads[m.rank() - 1] = (0, s - last);
            let fill = match m.dtype() {
                DType::Bool => Scalar::Bool(false),
                d => Scalar::F64(f64::NEG_INFINITY).cast(d),
            };
            Some(m.pad(&pads, fill)?)
        }
        m => m,
    };
    let causal = (node.attr_int("is_causal", 0)? != 0).then_some(past);
    let mut masks = bias(dtype, [l, s], mask.as_ref(), causal)?;
    if let Some(lengths) = node.opt_tensor(6)? {
        // nonpad_kv_seqlen: keys at or past a batch's length are hidden.
        let keys = ramp(0..s as i32, 3, 4)?.cast(lengths.dtype())?;
        let valid = keys.lt(&lengths.reshape([batch, 1, 1, 1])?)?;
        let padding = bias(dtype, [l, s], Some(&valid), None)?;
        masks = match (masks, padding) {
            (Some(b), Some(p)) => Some(b.add(&p)?),
            (b, p) => b.or(p),
        };
    }
    // Grouped queries: each key and value head serves `group` consecutive
    // query heads.
    let group = q_heads / kv_heads;
    let repeated = |t: &Tensor| -> Result<Tensor> {
        if group == 1 {
            return Ok(t.clone());
        }
        let d = t.dims();
        t.unsqueeze(2)?
            .expand([d[0], d[1], group, d[2], d[3]])?
            .reshape([d[0], d[1] * group, d[2], d[3]])
    };
    // The scale's root on each side, as ONNX's function body has it.
    let scale = match node.attr("scale") {
        Some(_) => f64::from(node.attr_float("scale", 0.0)?),
        None => 1.0 / (e as f64).sqrt(),
    };
    let root = Tensor::scalar(Scalar::F64(scale.sqrt()).cast(dtype));
    let qk = q
        .mul(&root)?
        .matmul(&repeated(&k)?.mul(&root)?.transpose(-2, -1)?)?;
    let softcap = node.attr_float("softcap", 0.0)?;
    let qk = match softcap > 0.0 {
        true => {
            let cap = Tensor::scalar(Scalar::F32(softcap).cast(dtype));
            qk.div(&cap)?.tanh()?.mul(&cap)?
        }
        false => qk,
    };
    let biased = match &masks {
        Some(b) => qk.add(b)?,
        None => qk.clone(),
    };
    let probabilities = biased.softmax(-1)?;
    let y = probabilities.matmul(&repeated(&v)?)?;
    let y = match rank {
        3 => {
            let d = y.dims();
            y.permute(&[0, 2, 1, 3])?
                .reshape([d[0], d[2], d[1] * d[3]])?
        }
        _ => y,
    };
    // Modes 0 and 1 both give the product after the soft cap, as ONNX
    // 1.22's reference computes them.
    let scores = match node.attr_int("qk_matmul_output_mode", 0)? {
        0 | 1 => qk,
        2 => biased,
        3 => probabilities,
        mode => return Err(node.invalid(format!("qk_matmul_output_mode {mode}"))),
    };
    Ok([y, k, v, scores].map(Value::Tensor).into())
}

/// `[batch, sequence, heads * size]` as `[batch, heads, sequence, size]`.
fn split(node: &Node, t: &Tensor, heads: usize) -> Result<Tensor> {
    let d = t.dims();
    if !d[2].is_multiple_of(heads) {
        return Err(node.invalid(format!("{} is not {heads} heads", t.shape())));
    }
    t.reshape([d[0], d[1], heads, d[2] / heads])?
        .permute(&[0, 2, 1, 3])
}

/// The four axes of a rank-4 shape.
fn four(d: &[usize]) -> [usize; 4] {
    [d[0], d[1], d[2], d[3]]
}
