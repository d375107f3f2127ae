//! Gradient accumulation: an optimizer's update applied every `every`
//! calls, to the mean of the gradients since the last, as a loop of
//! `loss / k; backward()` and one `step()` does in PyTorch. The choice is
//! made inside the graph (a `where` on a count in the state), so a
//! compiled step accumulates without being traced or compiled again.

use kiln_ir::{DType, Scalar};

use super::{Optimizer, Rates, check_wrapped};
use crate::{Error, Result, Tensor};

/// `optimizer` applied every `every` updates to the mean of their
/// gradients; in between, the parameters and the optimizer's state stay
/// as they are.
pub struct Accumulate<O> {
    /// The optimizer applied.
    pub optimizer: O,
    /// Updates per application, at least 1.
    pub every: usize,
}

impl<O: Optimizer> Accumulate<O> {
    fn check(&self) -> Result<()> {
        match self.every {
            0 => Err(Error::Optimizer {
                op: "Accumulate",
                message: "every must be at least 1".to_string(),
            }),
            _ => Ok(()),
        }
    }
}

impl<O: Optimizer> Optimizer for Accumulate<O> {
    /// The updates since the last application (a scalar f32, 0), a sum of
    /// zeros like each parameter, then the optimizer's state.
    fn state(&self, params: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.check()?;
        let mut state = vec![Tensor::scalar(0.0f32)];
        for p in params {
            state.push(Tensor::zeros(p.shape().clone(), p.dtype())?);
        }
        state.extend(self.optimizer.state(params)?);
        Ok(state)
    }

    /// `accumulated`, then `grad_sum.{param}` per parameter, then the
    /// optimizer's names.
    fn state_names(&self, params: &[&str]) -> Vec<String> {
        let sums = params.iter().map(|p| format!("grad_sum.{p}"));
        std::iter::once("accumulated".to_string())
            .chain(sums)
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
        check_wrapped("Accumulate", params, grads, state, 1 + n)?;
        let count = (&state[0] + 1.0f32)?;
        let apply = count.ge(&Tensor::scalar(self.every as f32))?;
        let sums: Vec<Tensor> = (0..n)
            .map(|k| &state[1 + k] + &grads[k])
            .collect::<Result<_>>()?;
        // 1 / every in each sum's own type.
        let scale = |dtype: DType| match dtype {
            DType::F64 => Tensor::scalar(Scalar::F64(1.0 / self.every as f64)),
            _ => Tensor::scalar(1.0 / self.every as f32),
        };
        let means: Vec<Tensor> = (sums.iter())
            .map(|s| s.mul(&scale(s.dtype())))
            .collect::<Result<_>>()?;
        let inner = &state[1 + n..];
        let (updated, inner_new) = self.optimizer.update_at(params, &means, inner, rates)?;
        let pick = |new: &Tensor, old: &Tensor| apply.where_cond(new, old);
        let new_params = (updated.iter().zip(params))
            .map(|(new, old)| pick(new, old))
            .collect::<Result<_>>()?;
        let zero = Tensor::scalar(0.0f32);
        let mut new_state = vec![pick(&zero, &count)?];
        for s in &sums {
            new_state.push(apply.where_cond(&Tensor::zeros(s.shape().clone(), s.dtype())?, s)?);
        }
        for (new, old) in inner_new.iter().zip(inner) {
            new_state.push(pick(new, old)?);
        }
        Ok((new_params, new_state))
    }
}
