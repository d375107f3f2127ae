//! Optimizers as graph ops: an update is recorded like any computation, so
//! in a compiled step each parameter's update fuses with the rest of the
//! step (into the kernel that computes its gradient where the fuser can)
//! and nothing runs outside the graph.
//!
//! An optimizer's state is a list of tensors (`state`), carried from step to
//! step by `kiln::compile_step` with the parameters; `update` takes the
//! parameters, their gradients and the state, and returns the new
//! parameters and the new state. Hyperparameters are constants of the
//! traced graph, but for the learning rate and the momentum (SGD's
//! momentum, AdamW's `beta1`), which `update_at` takes as tensors
//! (`Rates`): inputs of a compiled step, so that a `Schedule` moves them
//! every step and the step is never traced or compiled again. The formulas are
//! PyTorch's (`torch.optim.SGD`, `torch.optim.AdamW`), so that a model
//! trained in either moves the same way. Parameters are f32 or f64, each
//! updated in its own type; the hyperparameters are f32 values (widened
//! for f64 parameters).

mod accumulate;
mod groups;
mod scaler;
mod schedule;

pub use accumulate::Accumulate;
pub use groups::Groups;
pub use scaler::GradScaler;
pub use schedule::Schedule;

use crate::{DType, Error, Result, Scalar, Tensor};

/// An update rule for a list of parameters.
pub trait Optimizer {
    /// The initial state for `params`.
    fn state(&self, params: &[&Tensor]) -> Result<Vec<Tensor>>;

    /// A name for each tensor of the state, in its order, from the
    /// parameters' names, after the keys of PyTorch's optimizer state
    /// (`exp_avg.{param}`), so that a checkpoint (`nn::save`) holds the
    /// parameters and their optimizer state side by side, each found by
    /// name when a run resumes.
    fn state_names(&self, params: &[&str]) -> Vec<String>;

    /// Its own learning rate.
    fn lr(&self) -> f32;

    /// One step at `rates`: the new parameters and the new state. Where
    /// the rates are inputs of a compiled step, each call may give others.
    fn update_at(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        state: &[Tensor],
        rates: &Rates,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)>;

    /// One step at its own learning rate and momentum.
    fn update(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        state: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        self.update_at(params, grads, state, &Rates::lr(Tensor::scalar(self.lr())))
    }
}

/// The hyperparameters a `Schedule` moves from step to step, as scalar f32
/// tensors, so that they can be inputs of a compiled step.
#[derive(Clone, Debug)]
pub struct Rates {
    /// The learning rate.
    pub lr: Tensor,
    /// SGD's momentum or AdamW's `beta1`, where a schedule cycles it
    /// (`Schedule::momentum`, PyTorch's `OneCycleLR` with
    /// `cycle_momentum`); `None` keeps the optimizer's own.
    pub momentum: Option<Tensor>,
}

impl Rates {
    /// A learning rate, the optimizer's own momentum.
    pub fn lr(lr: Tensor) -> Rates {
        Rates { lr, momentum: None }
    }

    /// Both scalar f32 tensors, else an `Err` naming `op`.
    fn check(&self, op: &'static str) -> Result<()> {
        let rates = std::iter::once(("learning rate", &self.lr))
            .chain(self.momentum.iter().map(|m| ("momentum", m)));
        for (name, rate) in rates {
            if (rate.dtype(), rate.rank()) != (DType::F32, 0) {
                return Err(Error::Optimizer {
                    op,
                    message: format!("the {name} must be a scalar f32, not {}", rate.ty()),
                });
            }
        }
        Ok(())
    }

    /// The momentum in `dtype`: the scheduled one, else `own`.
    fn momentum(&self, own: f32, dtype: DType) -> Result<Tensor> {
        match &self.momentum {
            Some(m) => m.cast(dtype),
            None => constant(own, dtype),
        }
    }
}

/// Stochastic gradient descent with momentum, Nesterov momentum and weight
/// decay (L2, added to the gradient), as `torch.optim.SGD` with no
/// dampening.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    /// The learning rate.
    pub lr: f32,
    /// The momentum factor; 0 keeps no state.
    pub momentum: f32,
    /// Nesterov momentum (needs `momentum > 0`).
    pub nesterov: bool,
    /// The L2 penalty's factor.
    pub weight_decay: f32,
}

impl Sgd {
    /// Plain SGD at learning rate `lr`.
    pub fn new(lr: f32) -> Sgd {
        Sgd {
            lr,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
}

impl Optimizer for Sgd {
    /// One momentum buffer of zeros per parameter, or nothing without
    /// momentum. (PyTorch starts the buffer at the first gradient; with no
    /// dampening, starting from zeros gives the same buffer.)
    fn state(&self, params: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.check()?;
        if self.momentum == 0.0 {
            return Ok(Vec::new());
        }
        params.iter().map(|p| zeros_like(p)).collect()
    }

    /// `momentum_buffer.{param}` per parameter (none without momentum).
    fn state_names(&self, params: &[&str]) -> Vec<String> {
        match self.momentum == 0.0 {
            true => Vec::new(),
            false => params
                .iter()
                .map(|p| format!("momentum_buffer.{p}"))
                .collect(),
        }
    }

    fn lr(&self) -> f32 {
        self.lr
    }

    fn update_at(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        state: &[Tensor],
        rates: &Rates,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        self.check()?;
        check_counts("Sgd", params, grads, state, self.state_len(params))?;
        rates.check("Sgd")?;
        if rates.momentum.is_some() && self.momentum == 0.0 {
            return Err(Error::Optimizer {
                op: "Sgd",
                message: "a scheduled momentum needs a momentum above 0 (and its buffers)"
                    .to_string(),
            });
        }
        let mut new_params = Vec::with_capacity(params.len());
        let mut new_state = Vec::with_capacity(state.len());
        for (k, (p, g)) in params.iter().zip(grads).enumerate() {
            let c = |v: f32| constant(v, p.dtype());
            let mut g = g.clone();
            if self.weight_decay != 0.0 {
                g = (g + (p * c(self.weight_decay)?)?)?;
            }
            if self.momentum != 0.0 {
                let momentum = rates.momentum(self.momentum, p.dtype())?;
                let buf = ((&state[k] * &momentum)? + &g)?;
                g = if self.nesterov {
                    (g + (&buf * &momentum)?)?
                } else {
                    buf.clone()
                };
                new_state.push(buf);
            }
            new_params.push((p - (g * rates.lr.cast(p.dtype())?)?)?);
        }
        Ok((new_params, new_state))
    }
}

impl Sgd {
    /// Its hyperparameters in their ranges, as `torch.optim.SGD` checks
    /// them: a learning rate, momentum and weight decay of 0 or more, and
    /// Nesterov momentum only with a momentum.
    fn check(&self) -> Result<()> {
        at_least_zero("Sgd", "lr", self.lr)?;
        at_least_zero("Sgd", "momentum", self.momentum)?;
        at_least_zero("Sgd", "weight_decay", self.weight_decay)?;
        if self.nesterov && self.momentum == 0.0 {
            return Err(Error::Optimizer {
                op: "Sgd",
                message: "nesterov needs a momentum above 0".to_string(),
            });
        }
        Ok(())
    }

    fn state_len(&self, params: &[Tensor]) -> usize {
        if self.momentum == 0.0 {
            0
        } else {
            params.len()
        }
    }
}

/// Adam with decoupled weight decay, as `torch.optim.AdamW`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// The learning rate.
    pub lr: f32,
    /// The first moment's decay.
    pub beta1: f32,
    /// The second moment's decay.
    pub beta2: f32,
    /// Added to the second moment's root.
    pub eps: f32,
    /// The decoupled weight decay's factor (times `lr`).
    pub weight_decay: f32,
}

impl AdamW {
    /// AdamW at learning rate `lr` with PyTorch's defaults: betas (0.9,
    /// 0.999), eps 1e-8, weight decay 0.01.
    pub fn new(lr: f32) -> AdamW {
        AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl Optimizer for AdamW {
    /// The step count (a scalar f32, 0), then the first moments, then the
    /// second moments (zeros like each parameter).
    fn state(&self, params: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.check()?;
        let mut state = vec![Tensor::scalar(0.0f32)];
        for _moment in 0..2 {
            for p in params {
                state.push(zeros_like(p)?);
            }
        }
        Ok(state)
    }

    /// `step`, then `exp_avg.{param}` and `exp_avg_sq.{param}` per parameter.
    fn state_names(&self, params: &[&str]) -> Vec<String> {
        let moments = ["exp_avg", "exp_avg_sq"];
        let per_param = moments
            .iter()
            .flat_map(|m| params.iter().map(move |p| format!("{m}.{p}")));
        std::iter::once("step".to_string())
            .chain(per_param)
            .collect()
    }

    fn lr(&self) -> f32 {
        self.lr
    }

    fn update_at(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        state: &[Tensor],
        rates: &Rates,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        self.check()?;
        let n = params.len();
        check_counts("AdamW", params, grads, state, 1 + 2 * n)?;
        rates.check("AdamW")?;
        let t = (&state[0] + 1.0f32)?;
        // Per dtype of the parameters, made at its first parameter.
        let mut scalars: Vec<(DType, [Tensor; 5])> = Vec::new();
        let mut new_params = Vec::with_capacity(n);
        let mut new_m = Vec::with_capacity(n);
        let mut new_v = Vec::with_capacity(n);
        for (k, (p, g)) in params.iter().zip(grads).enumerate() {
            let c = |v: f32| constant(v, p.dtype());
            let at = match scalars.iter().position(|(d, _)| *d == p.dtype()) {
                Some(at) => at,
                None => {
                    scalars.push((p.dtype(), self.scalars(&t, rates, p.dtype())?));
                    scalars.len() - 1
                }
            };
            let [beta1, rest1, step_size, decay, correction2_root] = &scalars[at].1;
            let (m, v) = (&state[1 + k], &state[1 + n + k]);
            let m = ((m * beta1)? + (g * rest1)?)?;
            let v = ((v * c(self.beta2)?)? + (g.square()? * c(1.0 - self.beta2)?)?)?;
            // p (1 - lr wd) - lr m̂ / (sqrt(v̂) + eps), with m̂ = m / c1 and
            // v̂ = v / c2: lr m̂ / (sqrt(v̂) + eps) = step_size m / (sqrt(v) + eps sqrt(c2)).
            let decayed = (p * decay)?;
            let denominator = (v.sqrt()? + (correction2_root * c(self.eps)?)?)?;
            let p = (decayed - ((&m * step_size)? / denominator)?)?;
            new_params.push(p);
            new_m.push(m);
            new_v.push(v);
        }
        let mut new_state = vec![t];
        new_state.extend(new_m);
        new_state.extend(new_v);
        Ok((new_params, new_state))
    }
}

impl AdamW {
    /// At step `t` and `rates`, in `dtype`: `beta1` and `1 - beta1`, the
    /// step size (the bias corrections folded in, the first `1 - beta1^t`
    /// with this step's `beta1`, as PyTorch computes it under a schedule,
    /// not the product of the betas so far), the weight decay's factor, and
    /// the root of the second moment's correction.
    fn scalars(&self, t: &Tensor, rates: &Rates, dtype: DType) -> Result<[Tensor; 5]> {
        let c = |v: f32| constant(v, dtype);
        let (t, lr) = (t.cast(dtype)?, rates.lr.cast(dtype)?);
        let beta1 = rates.momentum(self.beta1, dtype)?;
        // A constant where no schedule moves beta1: the graph as before
        // `Rates` had a momentum.
        let rest1 = match rates.momentum {
            Some(_) => (c(1.0)? - &beta1)?,
            None => c(1.0 - self.beta1)?,
        };
        let correction1 = (c(1.0)? - beta1.pow(&t)?)?;
        let correction2 = (c(1.0)? - c(self.beta2)?.pow(&t)?)?;
        let step_size = ((correction2.sqrt()? / correction1)? * &lr)?;
        let decay = (c(1.0)? - (&lr * c(self.weight_decay)?)?)?;
        Ok([beta1, rest1, step_size, decay, correction2.sqrt()?])
    }

    /// Its hyperparameters in their ranges, as `torch.optim.AdamW` checks
    /// them: a learning rate, eps and weight decay of 0 or more, and betas
    /// in [0, 1).
    fn check(&self) -> Result<()> {
        at_least_zero("AdamW", "lr", self.lr)?;
        at_least_zero("AdamW", "eps", self.eps)?;
        at_least_zero("AdamW", "weight_decay", self.weight_decay)?;
        for (name, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(Error::Optimizer {
                    op: "AdamW",
                    message: format!("{name} must be in [0, 1), not {beta}"),
                });
            }
        }
        Ok(())
    }
}

/// Hyperparameter `value` as a scalar of the parameters' `dtype`: in f64,
/// the f32 value widened (0.9 is 0.8999999761581421, as the f32
/// optimizer has it).
fn constant(value: f32, dtype: DType) -> Result<Tensor> {
    Tensor::scalar(value).cast(dtype)
}

/// `value` of hyperparameter `name` must be 0 or more (NaN is not).
fn at_least_zero(op: &'static str, name: &str, value: f32) -> Result<()> {
    match value >= 0.0 {
        true => Ok(()),
        false => Err(Error::Optimizer {
            op,
            message: format!("{name} must be 0 or more, not {value}"),
        }),
    }
}

/// `grads` scaled together so that their global L2 norm is at most
/// `max_norm`, and that norm before scaling, as PyTorch's
/// `clip_grad_norm_`: each gradient times `min(1, max_norm / (norm +
/// 1e-6))`. Graph ops like the rest of a step, so inside a compiled step
/// the sums of squares are its reductions and the scaling fuses into each
/// update. A NaN norm makes every gradient NaN; an infinite one makes the
/// finite gradients 0 and the infinite ones NaN, as PyTorch's (unless
/// asked to raise) does. Gradients are f32 or f64; each one's squares sum
/// in its own type, the norm is f64 where any gradient is.
pub fn clip_grad_norm(grads: &[Tensor], max_norm: f32) -> Result<(Vec<Tensor>, Tensor)> {
    at_least_zero("clip_grad_norm", "max_norm", max_norm)?;
    if let Some(g) = grads
        .iter()
        .find(|g| !matches!(g.dtype(), DType::F32 | DType::F64))
    {
        return Err(Error::Optimizer {
            op: "clip_grad_norm",
            message: format!("gradients must be f32 or f64, not {}", g.ty()),
        });
    }
    // The norm in the widest type among the gradients; each scaled in its own.
    let wide = match grads.iter().any(|g| g.dtype() == DType::F64) {
        true => DType::F64,
        false => DType::F32,
    };
    let mut squares = constant(0.0, wide)?;
    for g in grads {
        squares = (squares + g.square()?.sum_all()?.cast(wide)?)?;
    }
    let norm = squares.sqrt()?;
    // PyTorch's 1e-6, in f64 as it is there (not the f32 widened).
    let eps = match wide {
        DType::F64 => Tensor::scalar(Scalar::F64(1e-6)),
        _ => Tensor::scalar(1e-6f32),
    };
    let scale = constant(max_norm, wide)?.div(&(norm.clone() + eps)?)?;
    let scale = scale.minimum(&constant(1.0, wide)?)?;
    let clipped = (grads.iter())
        .map(|g| g.mul(&scale.cast(g.dtype())?))
        .collect::<Result<_>>()?;
    Ok((clipped, norm))
}

/// Zeros of `p`'s type, lazily.
fn zeros_like(p: &Tensor) -> Result<Tensor> {
    Tensor::zeros(p.shape().clone(), p.dtype())
}

/// A gradient per parameter, and at least the `own` state tensors an
/// optimizer that wraps another keeps before the inner one's (which checks
/// its own).
fn check_wrapped(
    op: &'static str,
    params: &[Tensor],
    grads: &[Tensor],
    state: &[Tensor],
    own: usize,
) -> Result<()> {
    if grads.len() == params.len() && state.len() >= own {
        return Ok(());
    }
    Err(Error::Optimizer {
        op,
        message: format!(
            "{} parameters, {} gradients and {} state tensors",
            params.len(),
            grads.len(),
            state.len()
        ),
    })
}

fn check_counts(
    op: &'static str,
    params: &[Tensor],
    grads: &[Tensor],
    state: &[Tensor],
    state_len: usize,
) -> Result<()> {
    let mismatch = |message: String| Err(Error::Optimizer { op, message });
    if grads.len() != params.len() {
        return mismatch(format!(
            "{} parameters, {} gradients",
            params.len(),
            grads.len()
        ));
    }
    if state.len() != state_len {
        return mismatch(format!(
            "expected {state_len} state tensors, got {}",
            state.len()
        ));
    }
    for (k, (p, g)) in params.iter().zip(grads).enumerate() {
        if !matches!(p.dtype(), DType::F32 | DType::F64) || g.ty() != p.ty() {
            return mismatch(format!(
                "parameter {k} is {} and its gradient {}; both must be the same f32 or f64 type",
                p.ty(),
                g.ty()
            ));
        }
    }
    Ok(())
}
