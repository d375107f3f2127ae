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

    /// `f` of this tensor, computed in f32 where it holds 16-bit floats and
    /// rounded back once: what PyTorch does for the softmax, norms and
    /// means of half tensors, whose steps rounded each to 16 bits would
    /// each add a rounding error.
    pub(crate) fn in_f32(&self, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        if !self.dtype().is_half() {
            return f(self);
        }
        f(&self.cast(DType::F32)?)?.cast(self.dtype())
    }

    /// Softmax along `axis`: `exp(x - max) * (1 / sum(exp(x - max)))`, stable
    /// for large inputs. One reciprocal per row and a multiply per element,
    /// as PyTorch computes it: a division per element costs several
    /// multiplies, for at most one ulp of difference. The max is detached,
    /// as in JAX: the result does not depend on it, so neither does the
    /// gradient (see `kiln_ir::grad`).
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        self.in_f32(|x| {
            let shifted = x.sub(&x.max(&[axis], true)?.detach()?)?;
            let e = shifted.exp()?;
            e.mul(&e.sum(&[axis], true)?.recip()?)
        })
    }

    /// Log of the softmax along `axis`: `x - max - log(sum(exp(x - max)))`,
    /// the max detached as in `softmax`.
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        self.in_f32(|x| {
            let shifted = x.sub(&x.max(&[axis], true)?.detach()?)?;
            shifted.sub(&shifted.exp()?.sum(&[axis], true)?.log()?)
        })
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
        self.in_f32(|x| {
            let centered = x.sub(&x.mean(&[-1], true)?)?;
            let var = centered.square()?.mean(&[-1], true)?;
            let eps = Tensor::scalar(Scalar::F32(eps).cast(x.dtype()));
            let inv_std = var.add(&eps)?.sqrt()?.recip()?;
            // 16-bit parameters of 16-bit data compute in f32 with it.
            let wide = |p: &Tensor| {
                if p.dtype().is_half() {
                    p.cast(x.dtype())
                } else {
                    Ok(p.clone())
                }
            };
            centered
                .mul(&inv_std)?
                .mul(&wide(weight)?)?
                .add(&wide(bias)?)
        })
    }

    /// GELU with the tanh approximation,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, as `jax.nn.gelu` by default.
    pub fn gelu(&self) -> Result<Tensor> {
        self.in_f32(|x| {
            let cube = x.square()?.mul(x)?;
            let inner = x.add(&cube.mul(&x.constant(0.044715, 0.044715))?)?;
            let scale = x.constant(
                (2.0 / std::f32::consts::PI).sqrt(),
                (2.0 / std::f64::consts::PI).sqrt(),
            );
            let t = inner.mul(&scale)?.tanh()?;
            x.mul(&x.constant(0.5, 0.5))?
                .mul(&t.add(&x.constant(1.0, 1.0))?)
        })
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
        self.cross_entropy_with(targets, &CrossEntropy::default())
    }

    /// `cross_entropy` with PyTorch's options (`F.cross_entropy`, mean
    /// reduction): each row's loss weighs `weight[target]`, the mean is over
    /// the weights of the rows counted, rows whose target is `ignore_index`
    /// count for nothing (every row ignored: NaN), and `label_smoothing`
    /// mixes in the mean over the classes (each weighed by its class's
    /// weight) at that share. A target outside `0..classes` that is not
    /// ignored makes the loss NaN.
    pub fn cross_entropy_with(&self, targets: &Tensor, options: &CrossEntropy) -> Result<Tensor> {
        let op = "cross_entropy";
        if self.rank() != 2 {
            return Err(Error::Rank {
                op,
                shape: self.shape().clone(),
                rank: 2,
            });
        }
        if targets.dtype() != DType::I32 {
            return Err(kiln_ir::Error::DType {
                op,
                dtype: targets.dtype(),
                expected: "i32 class indices",
            }
            .into());
        }
        let mismatch = |rhs: &Tensor| -> Error {
            kiln_ir::Error::ShapeMismatch {
                op,
                lhs: self.shape().clone(),
                rhs: rhs.shape().clone(),
            }
            .into()
        };
        if targets.dims() != [self.dims()[0]] {
            return Err(mismatch(targets));
        }
        let (batch, classes) = (self.dims()[0], self.dims()[1] as i32);
        if let Some(w) = options.weight {
            if w.dtype() != self.dtype() {
                return Err(kiln_ir::Error::DTypeMismatch {
                    op,
                    lhs: self.dtype(),
                    rhs: w.dtype(),
                }
                .into());
            }
            if w.dims() != [classes as usize] {
                return Err(mismatch(w));
            }
        }
        let smoothing = options.label_smoothing;
        if !(0.0..=1.0).contains(&smoothing) {
            return Err(Error::Argument {
                op,
                message: format!("label_smoothing must be in [0, 1], not {smoothing}"),
            });
        }
        // A mean over no rows, or of rows no index can pick, is NaN (as
        // PyTorch's); the weighed sums below would give 0 over nothing.
        if batch == 0 || classes == 0 {
            return Ok(self.constant(f32::NAN, f64::NAN));
        }
        let labels = targets.unsqueeze(1)?;
        let mut target = labels.eq(&Tensor::arange(0, classes))?;
        let nan = self.constant(f32::NAN, f64::NAN);
        let zero = self.constant(0.0, 0.0);
        // `x` in a row whose index is a class, NaN in one whose index
        // matches no class: the zero picked for it cannot cancel a NaN.
        let or_nan = |x: &Tensor| -> Result<Tensor> {
            let x = labels.ge(&Tensor::scalar(0i32))?.where_cond(x, &nan)?;
            labels.lt(&Tensor::scalar(classes))?.where_cond(&x, &nan)
        };
        // Each row's share of the mean (negated): -1/batch, or with weights
        // or ignored rows, its target's weight (0 ignored) over their sum.
        // `keep` is the share of a row, `pick` that of its target's term.
        let ignored = options
            .ignore_index
            .map(|i| labels.eq(&Tensor::scalar(i)))
            .transpose()?;
        let (keep, pick) = if options.weight.is_none() && ignored.is_none() {
            let share = or_nan(&self.constant(-1.0 / batch as f32, -1.0 / batch as f64))?;
            (share.clone(), share)
        } else {
            let mut counted = or_nan(&self.constant(1.0, 1.0))?;
            if let Some(ignored) = &ignored {
                target = ignored.where_cond(&Tensor::scalar(false), &target)?;
                counted = ignored.where_cond(&zero, &counted)?;
            }
            let weighed = match options.weight {
                Some(w) => counted.mul(
                    &target
                        .where_cond(&w.unsqueeze(0)?, &zero)?
                        .sum(&[1], true)?,
                )?,
                None => counted.clone(),
            };
            let per_weight = weighed.sum_all()?.recip()?.neg()?;
            (counted.mul(&per_weight)?, weighed.mul(&per_weight)?)
        };
        // The target's log-probability selected, not multiplied by a one-hot
        // row: a class masked out with a logit of -inf has log-probability
        // -inf, and 0 * -inf would make the loss NaN.
        let log_p = self.log_softmax(1)?;
        let picked = target.where_cond(&log_p, &zero)?;
        let nll = picked.mul(&pick)?.sum_all()?;
        if smoothing == 0.0 {
            return Ok(nll);
        }
        let spread = match options.weight {
            Some(w) => log_p.mul(&w.unsqueeze(0)?)?,
            None => log_p,
        };
        // An ignored row spreads nothing, whatever its logits (a class
        // masked with -inf would make 0 * -inf).
        let mut spread = spread.sum(&[1], true)?;
        if let Some(ignored) = &ignored {
            spread = ignored.where_cond(&zero, &spread)?;
        }
        let spread = spread.mul(&keep)?.sum_all()?;
        let (kept, shared) = (1.0 - smoothing, smoothing / classes as f32);
        let kept = self.constant(kept, 1.0 - f64::from(smoothing));
        let shared = self.constant(shared, f64::from(smoothing) / f64::from(classes));
        nll.mul(&kept)?.add(&spread.mul(&shared)?)
    }
}

/// The options of `Tensor::cross_entropy_with`: PyTorch's `weight`,
/// `ignore_index` and `label_smoothing`, none by default.
#[derive(Clone, Copy, Debug, Default)]
pub struct CrossEntropy<'a> {
    /// A weight per class, of the logits' dtype.
    pub weight: Option<&'a Tensor>,
    /// A target that counts for nothing (PyTorch's default is -100).
    pub ignore_index: Option<i32>,
    /// The share of the loss spread over every class, in [0, 1].
    pub label_smoothing: f32,
}
