//! ONNX's `RotaryEmbedding` (opset 23) as a kiln composite: each head's
//! first `rotary_embedding_dim` values (all of them by default) turned as
//! pairs of a complex number by the angle whose cosine and sine the caches
//! hold, per batch and position (picked by `position_ids` where given);
//! pairs are the two halves of the rotated part, or neighbours
//! (`interleaved`). Inputs of 4 axes (`[batch, heads, sequence, head
//! size]`) or of 3 (heads side by side, `num_heads` of them).

use super::one;
use crate::onnx::graph::{Node, Value};
use crate::{Result, Tensor};

/// The node's outputs, or `None` if the op is not `RotaryEmbedding`.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    (node.op() == "RotaryEmbedding").then(|| rotary(node))
}

fn rotary(node: &Node) -> Result<Vec<Value>> {
    let input = node.tensor(0)?;
    let shape = input.dims().to_vec();
    let heads = usize::try_from(node.attr_int("num_heads", 0)?).unwrap_or(0);
    // As [batch, sequence, heads, head size].
    let x = match shape.len() {
        4 if heads == 0 || heads == shape[1] => input.permute(&[0, 2, 1, 3])?,
        4 => {
            return Err(node.invalid(format!("num_heads {heads} for input {}", input.shape())));
        }
        3 => {
            if heads == 0 || !shape[2].is_multiple_of(heads) {
                return Err(node.invalid(format!(
                    "input {} of 3 axes needs num_heads dividing its last",
                    input.shape()
                )));
            }
            input.reshape([shape[0], shape[1], heads, shape[2] / heads])?
        }
        _ => {
            return Err(node.invalid(format!("input {} must have 3 or 4 axes", input.shape())));
        }
    };
    let d = x.dims().to_vec();
    let (batch, sequence, heads, head) = (d[0], d[1], d[2], d[3]);
    let rotary = match node.attr_int("rotary_embedding_dim", 0)? {
        0 => head,
        r if r > 0 && r as usize <= head && r % 2 == 0 => r as usize,
        r => {
            return Err(node.invalid(format!("rotary_embedding_dim {r} for heads of {head}")));
        }
    };
    let half = rotary / 2;
    // Each cache as [batch, sequence, 1, half], its rows picked by position.
    let positions = node.opt_tensor(3)?;
    let angles = |cache: Tensor| -> Result<Tensor> {
        let cache = match (&positions, cache.rank()) {
            (Some(ids), 2) => cache
                .index_select(0, &ids.reshape([batch * sequence])?)?
                .reshape([batch, sequence, cache.dims()[1]])?,
            (None, 3) => cache,
            _ => {
                return Err(node.invalid(format!(
                    "a cache of {} (2 axes with position_ids, else 3)",
                    cache.shape()
                )));
            }
        };
        if cache.dims() != [batch, sequence, half] {
            return Err(node.invalid(format!(
                "a cache of {} for {batch} batches of {sequence} positions and {half} pairs",
                cache.shape()
            )));
        }
        cache.unsqueeze(2)
    };
    let (cos, sin) = (angles(node.tensor(1)?)?, angles(node.tensor(2)?)?);
    let interleaved = node.attr_int("interleaved", 0)? != 0;
    let (x1, x2) = match interleaved {
        true => (x.slice(3, 0, rotary, 2)?, x.slice(3, 1, rotary, 2)?),
        false => (x.slice(3, 0, half, 1)?, x.slice(3, half, rotary, 1)?),
    };
    let real = cos.mul(&x1)?.sub(&sin.mul(&x2)?)?;
    let imaginary = sin.mul(&x1)?.add(&cos.mul(&x2)?)?;
    let turned = match interleaved {
        true => Tensor::cat(&[&real.unsqueeze(4)?, &imaginary.unsqueeze(4)?], 4)?
            .reshape([batch, sequence, heads, rotary])?,
        false => Tensor::cat(&[&real, &imaginary], 3)?,
    };
    let y = match rotary < head {
        true => Tensor::cat(&[&turned, &x.slice(3, rotary, head, 1)?], 3)?,
        false => turned,
    };
    one(match shape.len() {
        4 => y.permute(&[0, 2, 1, 3])?,
        _ => y.reshape(shape)?,
    })
}
