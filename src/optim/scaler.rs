//! Dynamic loss scaling, as PyTorch's `GradScaler`: the loss is multiplied
//! by a scale before differentiating, so that gradients flowing through
//! f16 values stay above f16's smallest normals, and the optimizer is given
//! the gradients divided by it. A step whose gradients hold an infinity or
//! a NaN (the scale was too large) leaves the parameters and the
//! optimizer's state as they are and halves the scale; after a run of
//! clean steps the scale doubles. Every choice is a `where` on the scale
//! and a count kept in the state, so a compiled step scales without a
//! trip to the host and without being traced or compiled again.

use super::{Optimizer, Rates, check_wrapped};
use crate::{DType, Error, Result, Tensor};

/// `optimizer` given the gradients of a scaled loss (`GradScaler::loss`),
/// unscaled, and applied only where they are all finite. PyTorch's
/// defaults: `GradScaler::new`.
pub struct GradScaler<O> {
    /// The optimizer applied.
    pub optimizer: O,
    /// The first scale (65536).
    pub init_scale: f32,
    /// The scale's factor after `growth_interval` clean steps (2).
    pub growth_factor: f32,
    /// The scale's factor after a step with non-finite gradients (0.5).
    pub backoff_factor: f32,
    /// Clean steps before the scale grows (2000).
    pub growth_interval: usize,
}

impl<O: Optimizer> GradScaler<O> {
    /// `optimizer` behind PyTorch's defaults: a scale of 65536, halved on
    /// overflow, doubled after 2000 clean steps.
    pub fn new(optimizer: O) -> GradScaler<O> {
        GradScaler {
            optimizer,
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }

    /// `loss` times the scale this step's `state` holds: what to
    /// differentiate.
    pub fn loss(&self, loss: &Tensor, state: &[Tensor]) -> Result<Tensor> {
        let scale = state.first().ok_or_else(|| Error::Optimizer {
            op: "GradScaler",
            message: "the loss is scaled by the first state tensor: none given".to_string(),
        })?;
        loss.mul(&scale.cast(loss.dtype())?)
    }

    fn check(&self) -> Result<()> {
        let fail = |message: String| {
            Err(Error::Optimizer {
                op: "GradScaler",
                message,
            })
        };
        if !(self.init_scale.is_finite() && self.init_scale > 0.0) {
            return fail(format!(
                "init_scale must be positive and finite, not {}",
                self.init_scale
            ));
        }
        if !(self.growth_factor >= 1.0 && self.growth_factor.is_finite()) {
            return fail(format!(
                "growth_factor must be at least 1, not {}",
                self.growth_factor
            ));
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return fail(format!(
                "backoff_factor must be in (0, 1), not {}",
                self.backoff_factor
            ));
        }
        if self.growth_interval == 0 {
            return fail("growth_interval must be at least 1".to_string());
        }
        Ok(())
    }
}

impl<O: Optimizer> Optimizer for GradScaler<O> {
    /// The scale and the clean steps since it last changed (scalar f32s),
    /// then the optimizer's state.
    fn state(&self, params: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.check()?;
        let mut state = vec![Tensor::scalar(self.init_scale), Tensor::scalar(0.0f32)];
        state.extend(self.optimizer.state(params)?);
        Ok(state)
    }

    /// `scale` and `growth_tracker` (PyTorch's names), then the optimizer's.
    fn state_names(&self, params: &[&str]) -> Vec<String> {
        ["scale".to_string(), "growth_tracker".to_string()]
            .into_iter()
            .chain(self.optimizer.state_names(params))
            .collect()
    }

    fn lr(&self) -> f32 {
        self.optimizer.lr()
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
        check_wrapped("GradScaler", params, grads, state, 2)?;
        // As PyTorch's: gradients divided by a scale of up to 2^24 and more
        // would fall below f16's range; mixed precision keeps f32 master
        // weights, whose gradients are f32.
        if let Some(g) = grads.iter().find(|g| g.dtype() != DType::F32) {
            return Err(Error::Optimizer {
                op: "GradScaler",
                message: format!(
                    "gradients are unscaled in f32: keep f32 parameters (master weights), not {}",
                    g.ty()
                ),
            });
        }
        let (scale, clean, inner) = (&state[0], &state[1], &state[2..]);
        let inverse = Tensor::scalar(1.0f32).div(scale)?;
        // x * 0 is 0 for every finite x, NaN for an infinity or a NaN.
        let zero = Tensor::scalar(0.0f32);
        let mut bad = zero.clone();
        let mut unscaled = Vec::with_capacity(n);
        for g in grads {
            let u = g.mul(&inverse)?;
            let flagged = u.mul(&zero)?.ne(&zero)?.cast(DType::F32)?.sum_all()?;
            bad = (bad + flagged)?;
            unscaled.push(u);
        }
        let ok = bad.eq(&Tensor::scalar(0.0f32))?;
        let (updated, inner_new) = self.optimizer.update_at(params, &unscaled, inner, rates)?;
        let pick = |new: &Tensor, old: &Tensor| ok.where_cond(new, old);
        let new_params = (updated.iter().zip(params))
            .map(|(new, old)| pick(new, old))
            .collect::<Result<_>>()?;
        let counted = (clean + 1.0f32)?;
        let grow = counted.ge(&Tensor::scalar(self.growth_interval as f32))?;
        let grown = grow.where_cond(&(scale * self.growth_factor)?, scale)?;
        let new_scale = ok.where_cond(&grown, &(scale * self.backoff_factor)?)?;
        let new_clean = ok.where_cond(&grow.where_cond(&zero, &counted)?, &zero)?;
        let mut new_state = vec![new_scale, new_clean];
        for (new, old) in inner_new.iter().zip(inner) {
            new_state.push(pick(new, old)?);
        }
        Ok((new_params, new_state))
    }
}
