//! Joining tensors and taking them apart along an axis, as PyTorch's `cat`,
//! `stack`, `split` and `chunk`: `cat` is one fused kernel, each part
//! padded to the whole axis and a `where` over a position ramp picking
//! the part that covers each position (exact: no sum of zeros turns -0
//! into +0); the parts of `split` and `chunk` are views.

use kiln_ir::Scalar;

use crate::ops::{normalize_axis, ramp};
use crate::{Error, Result, Tensor};

impl Tensor {
    /// `parts` joined along `axis`: every part of one dtype and rank, the
    /// same size along every other axis. Parts empty along `axis` add
    /// nothing. No part is an `Err`.
    pub fn cat(parts: &[&Tensor], axis: isize) -> Result<Tensor> {
        const OP: &str = "cat";
        let Some(first) = parts.first() else {
            return Err(Error::Argument {
                op: OP,
                message: "no tensors to join".into(),
            });
        };
        let a = normalize_axis(OP, axis, first.rank())?;
        for p in &parts[1..] {
            if p.dtype() != first.dtype() {
                return Err(kiln_ir::Error::DTypeMismatch {
                    op: OP,
                    lhs: first.dtype(),
                    rhs: p.dtype(),
                }
                .into());
            }
            let fits = p.rank() == first.rank()
                && (p.dims().iter().zip(first.dims()).enumerate())
                    .all(|(i, (x, y))| i == a || x == y);
            if !fits {
                return Err(kiln_ir::Error::ShapeMismatch {
                    op: OP,
                    lhs: first.shape().clone(),
                    rhs: p.shape().clone(),
                }
                .into());
            }
        }
        let total = (parts.iter())
            .try_fold(0usize, |n, p| n.checked_add(p.dims()[a]))
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| Error::Argument {
                op: OP,
                message: format!("the joined axis {a} is longer than an i32 counts"),
            })?;
        if total == 0 || parts.iter().all(|p| p.numel() == 0) {
            // Nothing to pick between: the joined shape, empty.
            let mut dims = first.dims().to_vec();
            dims[a] = total as usize;
            return Tensor::scalar(0i32).cast(first.dtype())?.expand(dims);
        }
        let total = total as usize;
        let zero = Scalar::I32(0).cast(first.dtype());
        let position = ramp(0..total as i32, a, first.rank())?;
        let mut joined: Option<Tensor> = None;
        let mut offset = 0;
        for p in parts {
            let len = p.dims()[a];
            if len == 0 {
                continue;
            }
            let mut pads = vec![(0, 0); p.rank()];
            pads[a] = (offset, total - offset - len);
            let padded = p.pad(&pads, zero)?;
            joined = Some(match joined {
                None => padded,
                Some(before) => position
                    .ge(&Tensor::scalar(offset as i32))?
                    .where_cond(&padded, &before)?,
            });
            offset += len;
        }
        joined.ok_or_else(|| Error::Argument {
            op: OP,
            message: "no part to join".into(),
        })
    }

    /// `parts`, each of one shape, joined along a new axis `axis` (counted
    /// among the result's axes).
    pub fn stack(parts: &[&Tensor], axis: isize) -> Result<Tensor> {
        let Some(first) = parts.first() else {
            return Err(Error::Argument {
                op: "stack",
                message: "no tensors to join".into(),
            });
        };
        let a = normalize_axis("stack", axis, first.rank() + 1)?;
        for p in &parts[1..] {
            if p.shape() != first.shape() {
                return Err(kiln_ir::Error::ShapeMismatch {
                    op: "stack",
                    lhs: first.shape().clone(),
                    rhs: p.shape().clone(),
                }
                .into());
            }
        }
        let raised: Vec<Tensor> = (parts.iter())
            .map(|p| p.unsqueeze(a as isize))
            .collect::<Result<_>>()?;
        Tensor::cat(&raised.iter().collect::<Vec<_>>(), a as isize)
    }

    /// Views of consecutive pieces of `axis`, of the given `sizes`, which
    /// must add up to its length.
    pub fn split(&self, sizes: &[usize], axis: isize) -> Result<Vec<Tensor>> {
        let a = normalize_axis("split", axis, self.rank())?;
        let len = self.dims()[a];
        if sizes.iter().try_fold(0usize, |n, &s| n.checked_add(s)) != Some(len) {
            return Err(Error::Argument {
                op: "split",
                message: format!(
                    "sizes {sizes:?} do not add up to axis {a} of {}",
                    self.shape()
                ),
            });
        }
        let mut start = 0;
        (sizes.iter())
            .map(|&size| {
                start += size;
                self.slice(a as isize, start - size, start, 1)
            })
            .collect()
    }

    /// `axis` cut into `chunks` views of equal length, the last shorter
    /// where the length does not divide (PyTorch's `chunk`, which may give
    /// fewer pieces: `ceil(len / ceil(len / chunks))`; an empty axis gives
    /// `chunks` empty pieces, as PyTorch's does).
    pub fn chunk(&self, chunks: usize, axis: isize) -> Result<Vec<Tensor>> {
        let a = normalize_axis("chunk", axis, self.rank())?;
        if chunks == 0 || i32::try_from(chunks).is_err() {
            return Err(Error::Argument {
                op: "chunk",
                message: format!("{chunks} chunks"),
            });
        }
        let len = self.dims()[a];
        let step = len.div_ceil(chunks).max(1);
        let sizes: Vec<usize> = match len {
            0 => vec![0; chunks],
            _ => (0..len).step_by(step).map(|s| step.min(len - s)).collect(),
        };
        self.split(&sizes, axis)
    }
}
