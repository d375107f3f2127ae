//! Parameter groups: parameters split into runs, each updated by an
//! optimizer of its own, as PyTorch's `param_groups` (weight decay on the
//! weights, none on biases and norms).

use std::ops::Range;

use super::{Optimizer, Rates};
use crate::{Error, Result, Tensor};

/// One group's optimizer, its parameters' range and its state's.
type Group<'a> = (&'a dyn Optimizer, Range<usize>, Range<usize>);

/// Runs of parameters, in order, each with its optimizer: `update` takes
/// the parameters of every group one after another, and the state of every
/// group one after another. The groups share the rates `update_at` is
/// given (one schedule moves them all): the learning rate, and a scheduled
/// momentum, where given, in place of every group's momentum or `beta1`
/// (an `Err` for an SGD group without one); every other hyperparameter is
/// each group's own.
pub struct Groups {
    groups: Vec<(Box<dyn Optimizer>, usize)>,
}

impl Groups {
    /// Groups of `(optimizer, how many parameters)`, in the parameters' order.
    pub fn new(groups: Vec<(Box<dyn Optimizer>, usize)>) -> Groups {
        Groups { groups }
    }

    /// Each group's optimizer with its parameters' and its state's ranges.
    fn split(&self, params: usize, state: Option<usize>) -> Result<Vec<Group<'_>>> {
        let total: usize = self.groups.iter().map(|(_, n)| n).sum();
        if total != params {
            return Err(Error::Optimizer {
                op: "Groups",
                message: format!("groups of {total} parameters given {params}"),
            });
        }
        let (mut p, mut s) = (0, 0);
        let mut out = Vec::with_capacity(self.groups.len());
        for (optimizer, n) in &self.groups {
            let names: Vec<String> = (0..*n).map(|k| k.to_string()).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let len = optimizer.state_names(&refs).len();
            out.push((optimizer.as_ref(), p..p + n, s..s + len));
            (p, s) = (p + n, s + len);
        }
        if let Some(given) = state
            && given != s
        {
            return Err(Error::Optimizer {
                op: "Groups",
                message: format!("expected {s} state tensors, got {given}"),
            });
        }
        Ok(out)
    }
}

impl Optimizer for Groups {
    /// Every group's state, one group after another.
    fn state(&self, params: &[&Tensor]) -> Result<Vec<Tensor>> {
        let mut state = Vec::new();
        for (optimizer, p, _) in self.split(params.len(), None)? {
            state.extend(optimizer.state(&params[p])?);
        }
        Ok(state)
    }

    /// Every group's state names, one group after another, each under
    /// `groups.{k}.` (two AdamW groups both keep a `step`).
    fn state_names(&self, params: &[&str]) -> Vec<String> {
        let mut names = Vec::new();
        let mut rest = params;
        for (k, (optimizer, n)) in self.groups.iter().enumerate() {
            let (group, next) = rest.split_at((*n).min(rest.len()));
            names.extend(
                optimizer
                    .state_names(group)
                    .into_iter()
                    .map(|s| format!("groups.{k}.{s}")),
            );
            rest = next;
        }
        names
    }

    /// The first group's rate (0 without groups).
    fn lr(&self) -> f32 {
        self.groups.first().map_or(0.0, |(o, _)| o.lr())
    }

    fn update_at(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        state: &[Tensor],
        rates: &Rates,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        if grads.len() != params.len() {
            return Err(Error::Optimizer {
                op: "Groups",
                message: format!("{} parameters, {} gradients", params.len(), grads.len()),
            });
        }
        let (mut new_params, mut new_state) = (Vec::new(), Vec::new());
        for (optimizer, p, s) in self.split(params.len(), Some(state.len()))? {
            let (ps, ss) = optimizer.update_at(&params[p.clone()], &grads[p], &state[s], rates)?;
            new_params.extend(ps);
            new_state.extend(ss);
        }
        Ok((new_params, new_state))
    }
}
