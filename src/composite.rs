//! Composite ops: functions of primitives, so that fusion sees through them
//! (softmax becomes a max, a sum and elementwise ops that fuse around them).

use kiln_ir::{DType, Scalar};

use crate::{Error, Result, Tensor};

impl Tensor {
    /// A constant for a composite of this tensor: `f64_value` where it is
    /// f64, else `f32_value` (each written in its own precision, so that
    /// an f32 composite's constants are what they always were).
    fn constant(&self, f32_value: f32, f64_value: f64) -> Tensor {
        match self.dtype() {
            DType::F64 => Tensor::scalar(Scalar::F64(f64_value)),
            _ => Tensor::scalar(f32_value),
        }
    }

    /// Softmax along `axis`: `exp(x - max) * (1 / sum(exp(x - max)))`, stable
    /// for large inputs. One reciprocal per row and a multiply per element,
    /// as PyTorch computes it: a division per element costs several
    /// multiplies, for at most one ulp of difference. The max is detached,
    /// as in JAX: the result does not depend on it, so neither does the
    /// gradient (see `kiln_ir::grad`).
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        let shifted = self.sub(&self.max(&[axis], true)?.detach()?)?;
        let e = shifted.exp()?;
        e.mul(&e.sum(&[axis], true)?.recip()?)
    }

    /// Log of the softmax along `axis`: `x - max - log(sum(exp(x - max)))`,
    /// the max detached as in `softmax`.
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        let shifted = self.sub(&self.max(&[axis], true)?.detach()?)?;
        shifted.sub(&shifted.exp()?.sum(&[axis], true)?.log()?)
    }

    /// Layer normalization over the last axis: `(x - mean) / sqrt(var + eps)`
    /// scaled by `weight` and shifted by `bias`, both of the last axis's length.
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f32) -> Result<Tensor> {
        let last = self.dims().last().copied().unwrap_or(1);
        for param in [weight, bias] {
            if param.dims() != [last] {
                return Err(kiln_ir::Error::ShapeMismatch {
                    op: "layer_norm",
                    lhs: self.shape().clone(),
                    rhs: param.shape().clone(),
                }
                .into());
            }
        }
        let centered = self.sub(&self.mean(&[-1], true)?)?;
        let var = centered.square()?.mean(&[-1], true)?;
        let eps = Tensor::scalar(Scalar::F32(eps).cast(self.dtype()));
        let inv_std = var.add(&eps)?.sqrt()?.recip()?;
        centered.mul(&inv_std)?.mul(weight)?.add(bias)
    }

    /// GELU with the tanh approximation,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, as `jax.nn.gelu` by default.
    pub fn gelu(&self) -> Result<Tensor> {
        let cube = self.square()?.mul(self)?;
        let inner = self.add(&cube.mul(&self.constant(0.044715, 0.044715))?)?;
        let scale = self.constant(
            (2.0 / std::f32::consts::PI).sqrt(),
            (2.0 / std::f64::consts::PI).sqrt(),
        );
        let t = inner.mul(&scale)?.tanh()?;
        self.mul(&self.constant(0.5, 0.5))?
            .mul(&t.add(&self.constant(1.0, 1.0))?)
    }

    /// Mean squared error against `target`, of the same shape, as a rank-0
    /// tensor.
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        // Of one shape: [N, 1] against [N] would broadcast to [N, N] and
        // average the wrong squares without a word.
        if self.shape() != target.shape() {
            return Err(kiln_ir::Error::ShapeMismatch {
                op: "mse_loss",
                lhs: self.shape().clone(),
                rhs: target.shape().clone(),
            }
            .into());
        }
        self.sub(target)?.square()?.mean_all()
    }

    /// Cross-entropy of logits `[batch, classes]` against i32 class indices
    /// `[batch]`, averaged over the batch. A class index outside `0..classes`
    /// makes the loss NaN rather than a plausible wrong number.
    pub fn cross_entropy(&self, targets: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 {
            return Err(Error::Rank {
                op: "cross_entropy",
                shape: self.shape().clone(),
                rank: 2,
            });
        }
        if targets.dtype() != DType::I32 {
            return Err(kiln_ir::Error::DType {
                op: "cross_entropy",
                dtype: targets.dtype(),
                expected: "i32 class indices",
            }
            .into());
        }
        if targets.dims() != [self.dims()[0]] {
            return Err(kiln_ir::Error::ShapeMismatch {
                op: "cross_entropy",
                lhs: self.shape().clone(),
                rhs: targets.shape().clone(),
            }
            .into());
        }
        let (batch, classes) = (self.dims()[0], self.dims()[1] as i32);
        // A mean over no rows, or of rows no index can pick, is NaN (as
        // PyTorch's); the weighed sum below would give 0 over nothing.
        if batch == 0 || classes == 0 {
            return Ok(self.constant(f32::NAN, f64::NAN));
        }
        let labels = targets.unsqueeze(1)?;
        let target = labels.eq(&Tensor::arange(0, classes))?;
        // Each row weighs -1/batch; a row whose index matches no class
        // weighs NaN, which the zero picked for it cannot cancel. One sum over
        // the whole batch, with nothing reduced per row first.
        let valid = labels.ge(&Tensor::scalar(0i32))?;
        let nan = self.constant(f32::NAN, f64::NAN);
        let share = self.constant(-1.0 / batch as f32, -1.0 / batch as f64);
        let weight = valid.where_cond(&share, &nan)?;
        let weight = labels
            .lt(&Tensor::scalar(classes))?
            .where_cond(&weight, &nan)?;
        // The target's log-probability selected, not multiplied by a one-hot
        // row: a class masked out with a logit of -inf has log-probability
        // -inf, and 0 * -inf would make the loss NaN.
        let picked = target.where_cond(&self.log_softmax(1)?, &self.constant(0.0, 0.0))?;
        picked.mul(&weight)?.sum_all()
    }
}
