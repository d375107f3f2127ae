//! Scaled dot-product attention, as PyTorch's
//! `F.scaled_dot_product_attention`: `softmax(q kᵀ · scale + bias) v`,
//! composed of two products, a softmax and a bias, which the optimizer
//! fuses as it fuses any composite. The bias is the masks' (`bias`), which
//! ONNX's `Attention` shares.

use kiln_ir::{DType, Scalar};

use crate::ops::ramp;
use crate::{Error, Result, Tensor};

impl Tensor {
    /// Attention of these queries (`[.., L, E]`) over `key` (`[.., S, E]`)
    /// and `value` (`[.., S, Ev]`): `softmax(q kᵀ · scale + bias) v`, of
    /// shape `[.., L, Ev]`, the leading axes broadcast. `mask`, broadcast to
    /// `[.., L, S]`, is bool (a key takes part where it is true) or of the
    /// queries' type (added to the scores); `causal` hides from query `i`
    /// every key after `i` (PyTorch's `is_causal`, which takes no mask
    /// beside it); `scale` is `1 / sqrt(E)` unless given. A query every key
    /// is hidden from gets zeros, as in PyTorch (since 2.5), not NaN: one
    /// padded query would otherwise spread NaN through every gradient.
    pub fn scaled_dot_product_attention(
        &self,
        key: &Tensor,
        value: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        const OP: &str = "scaled_dot_product_attention";
        let dtype = self.dtype();
        for t in [key, value] {
            if !dtype.is_float() || t.dtype() != dtype {
                return Err(kiln_ir::Error::DTypeMismatch {
                    op: OP,
                    lhs: dtype,
                    rhs: t.dtype(),
                }
                .into());
            }
        }
        let (q, k) = (self.dims(), key.dims());
        if q.len() < 2 || k.len() < 2 || q[q.len() - 1] != k[k.len() - 1] {
            return Err(mismatch(OP, self, key));
        }
        if value.rank() < 2 {
            return Err(mismatch(OP, key, value));
        }
        if causal && mask.is_some() {
            return Err(Error::Argument {
                op: OP,
                message: "a mask and causal both (PyTorch takes one or the other)".into(),
            });
        }
        let (l, s) = (q[q.len() - 2], k[k.len() - 2]);
        let e = q[q.len() - 1];
        let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
        let scores = self.matmul(&key.transpose(-2, -1)?)?;
        let scores = scores.mul(&Tensor::scalar(Scalar::F64(scale).cast(dtype)))?;
        let scores = match bias(dtype, [l, s], mask, causal.then_some(0))? {
            Some(bias) => scores.add(&bias)?,
            None => scores,
        };
        // A query whose every score is -inf weighs no value: its softmax's
        // shift is 0 where its max is -inf, and its sum 1 where it is 0, so
        // that neither the weights nor their gradient is NaN. 16-bit scores
        // are weighed in f32, as `softmax` does.
        let weights = scores.in_f32(|x| {
            let dtype = x.dtype();
            let [zero, one] = [0, 1].map(|c| Scalar::I32(c).cast(dtype));
            let neg_inf = Scalar::F64(f64::NEG_INFINITY).cast(dtype);
            let guard = |x: &Tensor, when: Scalar, then: Scalar| {
                x.eq(&Tensor::scalar(when))?
                    .where_cond(&Tensor::scalar(then), x)
            };
            let shift = guard(&x.max(&[-1], true)?.detach()?, neg_inf, zero)?;
            let e = x.sub(&shift)?.exp()?;
            let sum = guard(&e.sum(&[-1], true)?, zero, one)?;
            e.mul(&sum.recip()?)
        })?;
        weights.matmul(value)
    }
}

/// The additive bias of attention scores `[.., l, s]` in `dtype`: a bool
/// mask's false entries -inf and its true ones 0, a mask of `dtype` as it
/// is; with `causal` at offset `o`, -inf too where key `j` comes after
/// query `i` plus `o` (`j > i + o`: ONNX aligns a query block after `o`
/// keys of a cache). `None` without either.
pub(crate) fn bias(
    dtype: DType,
    [l, s]: [usize; 2],
    mask: Option<&Tensor>,
    causal: Option<usize>,
) -> Result<Option<Tensor>> {
    let (zero, hidden) = (
        Tensor::scalar(Scalar::I32(0).cast(dtype)),
        Tensor::scalar(Scalar::F64(f64::NEG_INFINITY).cast(dtype)),
    );
    let masked = match mask {
        Some(m) if m.dtype() == DType::Bool => Some(m.where_cond(&zero, &hidden)?),
        Some(m) if m.dtype() == dtype => Some(m.clone()),
        Some(m) => {
            return Err(kiln_ir::Error::DType {
                op: "attention mask",
                dtype: m.dtype(),
                expected: "bool or the queries' type",
            }
            .into());
        }
        None => None,
    };
    let causal = match causal {
        Some(offset) => {
            let i = ramp((0..l as i32).map(|i| i + offset as i32), 0, 2)?;
            let j = ramp(0..s as i32, 1, 2)?;
            Some(j.le(&i)?.where_cond(&zero, &hidden)?)
        }
        None => None,
    };
    Ok(match (masked, causal) {
        (Some(m), Some(c)) => Some(m.add(&c)?),
        (m, c) => m.or(c),
    })
}

fn mismatch(op: &'static str, lhs: &Tensor, rhs: &Tensor) -> Error {
    kiln_ir::Error::ShapeMismatch {
        op,
        lhs: lhs.shape().clone(),
        rhs: rhs.shape().clone(),
    }
    .into()
}
