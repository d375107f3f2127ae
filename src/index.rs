//! Index ops. `argmax`/`argmin` are composites of graph ops, so that they
//! fuse with what surrounds them: a max, a compare, a `where` over an index
//! ramp and a second max, their indices i32 (exact for every axis an i32 can
//! index; in f32 they would be exact only below 2^24); `topk` is `k` of
//! them, each among the elements the ones before left. `gather` and
//! `index_select` are `Op::Gather`, an indexed read inside whatever kernel
//! reads its result: an embedding lookup reads the rows it picks and no
//! others.

use kiln_ir::{DType, Op, ReduceOp, Shape};

use crate::ops::{normalize_axis, ramp};
use crate::{Error, Result, Tensor};

/// The length of `axis` of `x`, checked to fit an i32 index.
fn indexable(op: &'static str, x: &Tensor, axis: usize) -> Result<i32> {
    let len = x.dims()[axis];
    i32::try_from(len).map_err(|_| Error::AxisTooLong { op, axis, len })
}

/// The first index along `axis` (of a non-empty axis) of the largest
/// element of `key` (a NaN where there is one) among those `taken` does
/// not mark, as i32; `keepdim` keeps the axis as size 1.
fn first_best(key: &Tensor, axis: usize, taken: Option<&Tensor>, keepdim: bool) -> Result<Tensor> {
    let len = key.dims()[axis] as i32;
    let key = match taken {
        // Taken elements out of the running: the type's least value.
        Some(t) => t.where_cond(&Tensor::scalar(ReduceOp::Max.init(key.dtype())), key)?,
        None => key.clone(),
    };
    let best = key.max(&[axis as isize], true)?;
    let mut hit = key.eq(&best)?;
    if key.dtype().is_float() {
        // A NaN makes the max NaN, which equals nothing: the NaNs
        // themselves are then the hits.
        hit = key.ne(&key)?.where_cond(&Tensor::scalar(true), &hit)?;
    }
    if let Some(t) = taken {
        // The least value may tie with an element still in the running.
        hit = t.where_cond(&Tensor::scalar(false), &hit)?;
    }
    // len - i at the hits and 0 elsewhere: the largest is len minus the
    // first hit's index.
    let countdown = ramp((1..=len).rev(), axis, key.rank())?;
    let score = hit.where_cond(&countdown, &Tensor::scalar(0i32))?;
    Tensor::scalar(len).sub(&score.max(&[axis as isize], keepdim)?)
}

impl Tensor {
    /// Index of the largest element along `axis` as i32: the first one on
    /// ties, and the first NaN where there is one, as NumPy's `argmax`;
    /// `keepdim` keeps the axis as size 1. An empty axis is an `Err`.
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.first_extreme("argmax", axis, keepdim, false)
    }

    /// Index of the smallest element along `axis` as i32: the first one on
    /// ties, and the first NaN where there is one, as NumPy's `argmin`;
    /// `keepdim` keeps the axis as size 1. An empty axis is an `Err`.
    pub fn argmin(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.first_extreme("argmin", axis, keepdim, true)
    }

    /// The first index of the largest (or smallest) element along `axis`.
    fn first_extreme(
        &self,
        op: &'static str,
        axis: isize,
        keepdim: bool,
        smallest: bool,
    ) -> Result<Tensor> {
        let axis = normalize_axis(op, axis, self.rank())?;
        let len = indexable(op, self, axis)?;
        if len == 0 {
            return Err(kiln_ir::Error::EmptyReduce {
                op,
                shape: self.shape().clone(),
                axis,
            }
            .into());
        }
        first_best(&self.order_key(smallest)?, axis, None, keepdim)
    }

    /// A key whose largest element is the one wanted: the tensor itself,
    /// or for the smallest, its order reversed without overflow (-x for
    /// floats, NaN staying NaN; -1 - x, bitwise not, for i32 and i64; 255 -
    /// x for u8). Bools count as u8.
    fn order_key(&self, smallest: bool) -> Result<Tensor> {
        let x = match self.dtype() {
            DType::Bool => self.cast(DType::U8)?,
            _ => self.clone(),
        };
        match (x.dtype(), smallest) {
            (_, false) => Ok(x),
            (d, true) if d.is_float() => x.neg(),
            (DType::I32, true) => Tensor::scalar(-1i32).sub(&x),
            (DType::I64, true) => Tensor::scalar(-1i64).sub(&x),
            (_, true) => Tensor::scalar(u8::MAX).sub(&x),
        }
    }

    /// The `k` largest (or, not `largest`, smallest) elements along `axis`
    /// and their i64 indices, largest (smallest) first, as PyTorch's
    /// `topk` and ONNX's `TopK`: of equal elements the first (ONNX's rule).
    /// NaNs come first either way, as `argmax` and `argmin` pick them
    /// (PyTorch puts them last among the smallest). Each of the `k` picks
    /// is a pass over the axis: for the small `k` of a top-5 or a beam, not
    /// for a sort.
    pub fn topk(&self, k: usize, axis: isize, largest: bool) -> Result<(Tensor, Tensor)> {
        const OP: &str = "topk";
        let axis = normalize_axis(OP, axis, self.rank())?;
        let len = indexable(OP, self, axis)?;
        if k > len as usize {
            return Err(Error::Argument {
                op: OP,
                message: format!("k = {k} of {} along axis {axis}", self.shape()),
            });
        }
        if k == 0 {
            let mut dims = self.dims().to_vec();
            dims[axis] = k;
            return Ok((
                self.slice(axis as isize, 0, 0, 1)?,
                Tensor::zeros(dims, DType::I64)?,
            ));
        }
        let key = self.order_key(!largest)?;
        let positions = ramp(0..len, axis, self.rank())?;
        let mut taken: Option<Tensor> = None;
        let mut picks = Vec::with_capacity(k);
        for _ in 0..k {
            let first = first_best(&key, axis, taken.as_ref(), true)?;
            let hit = positions.eq(&first)?;
            taken = Some(match taken {
                Some(t) => hit.where_cond(&Tensor::scalar(true), &t)?,
                None => hit,
            });
            picks.push(first);
        }
        let indices = Tensor::cat(&picks.iter().collect::<Vec<_>>(), axis as isize)?;
        Ok((
            self.gather(axis as isize, &indices)?,
            indices.cast(DType::I64)?,
        ))
    }

    /// Elements picked along `axis` by the i32 or i64 `indices`, as PyTorch's
    /// `gather` and NumPy's `take_along_axis`:
    /// `out[.., j, ..] = self[.., indices[.., j, ..], ..]` with `j` on `axis`.
    /// `indices` has the same rank as `self`; its other axes broadcast
    /// against `self`'s (NumPy's rule), and the result has that broadcast
    /// shape with `indices`' length on `axis`.
    ///
    /// Each element is read where it lies (`Op::Gather`): the work is the
    /// output's size, whatever the length of `axis`. A negative index counts
    /// from the end, as in NumPy. Indices are data, so one outside
    /// `-len..len` cannot be an `Err`: it picks NaN from floats (as
    /// `cross_entropy`'s bad label makes the loss NaN) and 0 (false) from the
    /// other dtypes, and never reads outside `self`. The gradient flows to
    /// the picked elements only.
    pub fn gather(&self, axis: isize, indices: &Tensor) -> Result<Tensor> {
        let op = "gather";
        let index_type = indices.dtype();
        if !matches!(index_type, DType::I32 | DType::I64) {
            return Err(kiln_ir::Error::DType {
                op,
                dtype: index_type,
                expected: "i32 or i64 indices",
            }
            .into());
        }
        let mismatch = || -> Error {
            kiln_ir::Error::Broadcast {
                op,
                lhs: self.shape().clone(),
                rhs: indices.shape().clone(),
            }
            .into()
        };
        if indices.rank() != self.rank() {
            return Err(mismatch());
        }
        let axis = normalize_axis(op, axis, self.rank())?;
        // The other axes must broadcast; `axis` itself may differ.
        let (mut a, mut b) = (self.dims().to_vec(), indices.dims().to_vec());
        (a[axis], b[axis]) = (1, 1);
        let common =
            Shape::broadcast(op, &Shape::new(&a), &Shape::new(&b)).map_err(|_| mismatch())?;
        let along = |len: usize| -> Shape {
            let mut dims = common.dims().to_vec();
            dims[axis] = len;
            Shape::new(&dims)
        };
        let table = self.expand(along(self.dims()[axis]))?;
        let indices = indices.expand(along(indices.dims()[axis]))?;
        Tensor::lazy(Op::Gather { axis }, &[&table, &indices])
    }

    /// `self` with `src` added at the positions `indices` give along `axis`,
    /// as PyTorch's `scatter_add`: `out[.., indices[.., j, ..], ..] +=
    /// src[.., j, ..]` with `j` on `axis`. `src` (f32 or f64, `self`'s
    /// dtype) and the i32 or i64 `indices` have one shape, equal to
    /// `self`'s off `axis`. A negative index counts from the end; one
    /// outside `-len..len` adds nowhere. Repeated indices add up, in the
    /// order of `j`, so every run gives the same sums. The gradient of
    /// `src` is the output's gradient gathered back (zero where nothing
    /// was added); `self`'s passes through.
    pub fn scatter_add(&self, axis: isize, indices: &Tensor, src: &Tensor) -> Result<Tensor> {
        let op = "scatter_add";
        let axis = normalize_axis(op, axis, self.rank())?;
        let fits = src.rank() == self.rank()
            && (0..self.rank()).all(|a| a == axis || src.dims()[a] == self.dims()[a]);
        if src.dtype() != self.dtype() {
            return Err(kiln_ir::Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: src.dtype(),
            }
            .into());
        }
        if !fits {
            return Err(kiln_ir::Error::ShapeMismatch {
                op,
                lhs: self.shape().clone(),
                rhs: src.shape().clone(),
            }
            .into());
        }
        let len = self.dims()[axis];
        let sums = Tensor::lazy(Op::ScatterAdd { axis, len }, &[src, indices])?;
        self.add(&sums)
    }

    /// The slices at the i32 or i64 `indices` (rank 1) along `axis`, as
    /// PyTorch's `index_select` and NumPy's `take`: the result is `self`
    /// with `axis` of `indices`' length. An embedding lookup is
    /// `table.index_select(0, &ids)`, one row read per id. Negative indices
    /// and indices outside the axis act as in `gather`.
    pub fn index_select(&self, axis: isize, indices: &Tensor) -> Result<Tensor> {
        if indices.rank() != 1 {
            return Err(Error::Rank {
                op: "index_select",
                shape: indices.shape().clone(),
                rank: 1,
            });
        }
        let axis = normalize_axis("index_select", axis, self.rank())?;
        let mut dims = vec![1; self.rank()];
        dims[axis] = indices.numel();
        self.gather(axis as isize, &indices.reshape(dims)?)
    }
}
