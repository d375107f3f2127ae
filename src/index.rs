//! Index ops as composites of graph ops, so that they fuse with what
//! surrounds them and differentiate through their parts with no IR op of
//! their own: `argmax`/`argmin` are a max, a compare, a `where` over an index
//! ramp and a second max; `gather`/`index_select` are a one-hot compare of an
//! index ramp with the indices, a `where` and a sum.
//!
//! Indices are i32 from end to end, so they are exact for every axis an i32
//! can index (in f32 they would be exact only below 2^24). The one-hot form
//! reads every element of the gathered axis once per index: what a fused
//! reduction does at the cost of a matmul by a one-hot matrix, and fine for
//! picking labels or a batch's embeddings from a table of thousands of rows.

use kiln_ir::{DType, Scalar, Shape};

use crate::ops::normalize_axis;
use crate::{Error, Result, Tensor};

/// The length of `axis` of `x`, checked to fit an i32 index.
fn indexable(op: &'static str, x: &Tensor, axis: usize) -> Result<i32> {
    let len = x.dims()[axis];
    i32::try_from(len).map_err(|_| Error::AxisTooLong { op, axis, len })
}

/// `values` as i32 along `axis` of a tensor of rank `rank`, every other
/// axis of size 1 so that it broadcasts against that tensor.
fn ramp(values: Vec<i32>, axis: usize, rank: usize) -> Result<Tensor> {
    let mut dims = vec![1; rank];
    dims[axis] = values.len();
    Tensor::from_vec(values, dims)
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
        // A key whose largest element is the one wanted. For the smallest,
        // the order reversed without overflow: -x for floats (NaN stays
        // NaN), -1 - x (bitwise not) for i32 and i64, 255 - x for u8.
        let x = match self.dtype() {
            DType::Bool => self.cast(DType::U8)?,
            _ => self.clone(),
        };
        let key = match (x.dtype(), smallest) {
            (_, false) => x,
            (DType::F32 | DType::F64, true) => x.neg()?,
            (DType::I32, true) => Tensor::scalar(-1i32).sub(&x)?,
            (DType::I64, true) => Tensor::scalar(-1i64).sub(&x)?,
            (_, true) => Tensor::scalar(u8::MAX).sub(&x)?,
        };
        let best = key.max(&[axis as isize], true)?;
        let mut hit = key.eq(&best)?;
        if key.dtype().is_float() {
            // A NaN makes the max NaN, which equals nothing: the NaNs
            // themselves are then the hits.
            hit = key.ne(&key)?.where_cond(&Tensor::scalar(true), &hit)?;
        }
        // len - i at the hits and 0 elsewhere: the largest is len minus the
        // first hit's index.
        let countdown = ramp((1..=len).rev().collect(), axis, self.rank())?;
        let score = hit.where_cond(&countdown, &Tensor::scalar(0i32))?;
        Tensor::scalar(len).sub(&score.max(&[axis as isize], keepdim)?)
    }

    /// Elements picked along `axis` by the i32 or i64 `indices`, as PyTorch's
    /// `gather` and NumPy's `take_along_axis`:
    /// `out[.., j, ..] = self[.., indices[.., j, ..], ..]` with `j` on `axis`.
    /// `indices` has the same rank as `self`; its other axes broadcast
    /// against `self`'s (NumPy's rule), and the result has that broadcast
    /// shape with `indices`' length on `axis`.
    ///
    /// Indices are data, so one outside `0..len` cannot be an `Err`: it picks
    /// NaN from floats (as `cross_entropy`'s bad label makes the loss NaN) and 0
    /// (false) from the other dtypes; negative indices do not count from the
    /// end. A -0.0 is picked as +0.0 (the pick is a sum of zeros and the
    /// element). The gradient flows to the picked elements only.
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
        let len = indexable(op, self, axis)?;
        // The other axes must broadcast; `axis` itself may differ.
        let (mut a, mut b) = (self.dims().to_vec(), indices.dims().to_vec());
        (a[axis], b[axis]) = (1, 1);
        Shape::broadcast(op, &Shape::new(&a), &Shape::new(&b)).map_err(|_| mismatch())?;
        // [.., k, 1, ..] == [1.., n, ..] -> a one-hot [.., k, n, ..] whose row
        // j marks the index at j; where it holds, the element of `self`
        // (unsqueezed to [.., 1, n, ..]), summed over the n axis.
        let positions = ramp((0..len).collect(), axis + 1, self.rank() + 1)?;
        let one_hot = indices
            .unsqueeze(axis as isize + 1)?
            .eq(&positions.cast(index_type)?)?;
        // Sums need a signed type; u8 and bool go through i32 and back, exactly.
        let summed = match self.dtype() {
            DType::F32 | DType::F64 | DType::I32 | DType::I64 => self.clone(),
            DType::U8 | DType::Bool => self.cast(DType::I32)?,
        };
        let index = |v: i32| Tensor::scalar(Scalar::I32(v).cast(index_type));
        let zero = Tensor::scalar(Scalar::I32(0).cast(summed.dtype()));
        let picked = one_hot
            .where_cond(&summed.unsqueeze(axis as isize)?, &zero)?
            .sum(&[axis as isize + 1], false)?;
        match self.dtype() {
            dtype @ (DType::F32 | DType::F64) => {
                let nan = Tensor::scalar(Scalar::F32(f32::NAN).cast(dtype));
                let out_of_range = indices.lt(&index(0))?;
                let picked = out_of_range.where_cond(&nan, &picked)?;
                indices.ge(&index(len))?.where_cond(&nan, &picked)
            }
            DType::I32 | DType::I64 => Ok(picked),
            dtype => picked.cast(dtype),
        }
    }

    /// The slices at the i32 `indices` (rank 1) along `axis`, as PyTorch's
    /// `index_select` and NumPy's `take`: the result is `self` with `axis`
    /// of `indices`' length. An embedding lookup is
    /// `table.index_select(0, &ids)`. Indices outside `0..len` act as in
    /// `gather`.
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
