//! Learning-rate (and momentum) schedules, computed on the host for each
//! step and given to a compiled step as inputs (`Optimizer::update_at`,
//! `Rates`), as PyTorch's `torch.optim.lr_scheduler` moves a parameter
//! group's `lr` (and momentum) between steps: the step is traced and
//! compiled once, whatever the rates.

use std::cmp::Ordering;

use crate::{Error, Result};

/// The learning rate at each step, the first step being step 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    /// `lr` at every step.
    Constant {
        /// The rate.
        lr: f32,
    },
    /// `lr` times `gamma` for every `every` steps done: `StepLR`.
    Step {
        /// The first rate.
        lr: f32,
        /// Steps between decays, at least 1.
        every: usize,
        /// The factor of each decay.
        gamma: f32,
    },
    /// A linear warmup: `lr * (step + 1) / steps`, reaching `lr` at step
    /// `steps - 1` and keeping it.
    Warmup {
        /// The rate reached.
        lr: f32,
        /// Steps to reach it, at least 1.
        steps: usize,
    },
    /// A linear warmup from 0 at step 0 to `lr` at step `warmup`, then half
    /// a cosine down to `lr * floor` at step `total`, kept after: optax's
    /// `warmup_cosine_decay_schedule` (its `init_value` 0, `decay_steps`
    /// `total`).
    Cosine {
        /// The peak rate.
        lr: f32,
        /// Warmup steps (0 for none).
        warmup: usize,
        /// The step where the decay ends, past `warmup`.
        total: usize,
        /// The last rate's share of `lr`, in [0, 1].
        floor: f32,
    },
    /// PyTorch's `OneCycleLR` (cosine annealing, two phases): from
    /// `max / div` up to `max` at step `pct_start * total - 1`, then down
    /// to `max / (div * final_div)` at step `total - 1`, the last; the
    /// momentum, where cycled, the other way.
    OneCycle {
        /// The peak rate.
        max: f32,
        /// Steps in all.
        total: usize,
        /// The share of the steps going up, in (0, 1).
        pct_start: f32,
        /// The first rate is `max / div`.
        div: f32,
        /// The last rate is the first over `final_div`.
        final_div: f32,
        /// `[base, max]`: the momentum (SGD's, or AdamW's `beta1`) from
        /// `max` down to `base` as the rate rises, and back up as it falls
        /// (PyTorch's `cycle_momentum`); `None` leaves it alone.
        momentum: Option<[f32; 2]>,
    },
}

impl Schedule {
    /// `OneCycleLR`'s defaults: 30% of the steps up, from `max / 25`,
    /// down to `max / 25e4`, the momentum cycled between 0.85 and 0.95.
    pub fn one_cycle(max: f32, total: usize) -> Schedule {
        Schedule::OneCycle {
            max,
            total,
            pct_start: 0.3,
            div: 25.0,
            final_div: 1e4,
            momentum: Some([0.85, 0.95]),
        }
    }

    /// The rate at `step`, or an `Err` naming what is out of range.
    pub fn lr(&self, step: usize) -> Result<f32> {
        self.check(step)?;
        let t = step as f64;
        let rate = match *self {
            Schedule::Constant { lr } => f64::from(lr),
            Schedule::Step { lr, every, gamma } => {
                f64::from(lr) * f64::from(gamma).powi((step / every) as i32)
            }
            Schedule::Warmup { lr, steps } => f64::from(lr) * ((t + 1.0) / steps as f64).min(1.0),
            Schedule::Cosine {
                lr,
                warmup,
                total,
                floor,
            } => {
                let lr = f64::from(lr);
                if step < warmup {
                    lr * t / warmup as f64
                } else {
                    let pct = ((t - warmup as f64) / (total - warmup) as f64).min(1.0);
                    lr * cos_anneal(1.0, f64::from(floor), pct)
                }
            }
            Schedule::OneCycle {
                max,
                total,
                pct_start,
                div,
                final_div,
                ..
            } => {
                let max = f64::from(max);
                let first = max / f64::from(div);
                let ends = [first, max, first / f64::from(final_div)];
                one_cycle_at((total, pct_start), step, ends)
            }
        };
        Ok(rate as f32)
    }

    /// The momentum at `step` where the schedule cycles it (`OneCycle`
    /// with `momentum`), else `None`: give it to `Rates::momentum`.
    pub fn momentum(&self, step: usize) -> Result<Option<f32>> {
        self.check(step)?;
        Ok(match *self {
            Schedule::OneCycle {
                total,
                pct_start,
                momentum: Some([base, max]),
                ..
            } => {
                let (base, max) = (f64::from(base), f64::from(max));
                Some(one_cycle_at((total, pct_start), step, [max, base, max]) as f32)
            }
            _ => None,
        })
    }

    /// Its parameters in their ranges, and `step` inside a one-cycle.
    fn check(&self, step: usize) -> Result<()> {
        let bad = |message: String| {
            Err(Error::Optimizer {
                op: "Schedule",
                message,
            })
        };
        let (rate, fits, wants) = match *self {
            Schedule::Constant { lr } => (lr, true, ""),
            Schedule::Step { lr, every, gamma } => {
                (lr, every >= 1 && gamma >= 0.0, "every >= 1 and gamma >= 0")
            }
            Schedule::Warmup { lr, steps } => (lr, steps >= 1, "steps >= 1"),
            Schedule::Cosine {
                lr,
                warmup,
                total,
                floor,
            } => (
                lr,
                total > warmup && (0.0..=1.0).contains(&floor),
                "total past warmup and floor in [0, 1]",
            ),
            Schedule::OneCycle {
                max,
                total,
                pct_start,
                div,
                final_div,
                momentum,
            } => {
                let peak = f64::from(pct_start) * total as f64 - 1.0;
                let sides = peak > 0.0 && peak < total as f64 - 1.0;
                let momentum_fits =
                    momentum.is_none_or(|[base, max]| 0.0 <= base && base <= max && max < 1.0);
                (
                    max,
                    sides && div > 0.0 && final_div > 0.0 && momentum_fits,
                    "steps on both sides of its peak, div and final_div above 0, and momentum [base, max] with 0 <= base <= max < 1",
                )
            }
        };
        if !fits {
            return bad(format!("{self:?} needs {wants}"));
        }
        // (NaN is not 0 or more.)
        if !matches!(
            rate.partial_cmp(&0.0),
            Some(Ordering::Greater | Ordering::Equal)
        ) {
            return bad(format!("the rate must be 0 or more, not {rate}"));
        }
        match *self {
            Schedule::OneCycle { total, .. } if step >= total => bad(format!(
                "OneCycle has {total} steps; step {step} is past them"
            )),
            _ => Ok(()),
        }
    }
}

/// A one-cycle of `total` steps, `pct_start` of them going up: its value at
/// `step`, cosine-annealed from `[start, peak, end]`'s first to its second
/// at the peak step and to its third at the last step.
fn one_cycle_at(
    (total, pct_start): (usize, f32),
    step: usize,
    [start, peak, end]: [f64; 3],
) -> f64 {
    let t = step as f64;
    let top = f64::from(pct_start) * total as f64 - 1.0;
    let last = total as f64 - 1.0;
    if t <= top {
        cos_anneal(start, peak, t / top)
    } else {
        cos_anneal(peak, end, (t - top) / (last - top))
    }
}

/// Half a cosine from `from` at `pct` 0 to `to` at `pct` 1.
fn cos_anneal(from: f64, to: f64, pct: f64) -> f64 {
    to + (from - to) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0)
}
