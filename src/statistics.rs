//! Reductions and bounds that PyTorch users reach for, as composites of
//! graph ops (so they fuse and differentiate through their parts): `min`,
//! `var`, `std`, `logsumexp`, `cumsum`, `cumprod` and `clamp`.

use kiln_ir::{DType, ReduceOp, Scalar};

use crate::{Result, Tensor};

impl Tensor {
    /// Smallest element over `axes`, as `max` of an order-reversing key: -x
    /// for floats (NaN propagates, -0 below +0), -1 - x for i32 and i64
    /// (no overflow), 255 - x for u8, `all` for bool. An empty axis is an
    /// error, as for `max`. The gradient goes to the smallest elements.
    pub fn min(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let flip = |x: &Tensor| -> Result<Tensor> {
            match x.dtype() {
                DType::F32 | DType::F64 | DType::BF16 | DType::F16 => x.neg(),
                DType::I32 => Tensor::scalar(-1i32).sub(x),
                DType::I64 => Tensor::scalar(-1i64).sub(x),
                DType::U8 => Tensor::scalar(u8::MAX).sub(x),
                DType::Bool => x.eq(&Tensor::scalar(false)),
            }
        };
        flip(&flip(self)?.max(axes, keepdim)?)
    }

    /// Variance over `axes`: the mean squared distance from the mean, times
    /// `n / (n - correction)` for `n` elements per result (1: the unbiased
    /// estimate, PyTorch's default; 0: the population's). NaN or infinite
    /// where `n <= correction`, as in PyTorch. Floats; 16-bit ones computed in
    /// f32 and rounded once.
    pub fn var(&self, axes: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.in_f32(|x| {
            let mean = x.mean(axes, true)?;
            let n = x.numel() / mean.numel().max(1);
            let squares = x.sub(&mean)?.square()?.mean(axes, keepdim)?;
            let scale = n as f64 / (n as f64 - correction as f64);
            squares.mul(&Tensor::scalar(Scalar::F64(scale).cast(x.dtype())))
        })
    }

    /// Standard deviation over `axes`: the root of `var`.
    pub fn std(&self, axes: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.var(axes, correction, keepdim)?.sqrt()
    }

    /// `log(sum(exp(x)))` over `axes`, shifted by the (detached) max so that
    /// large inputs do not overflow; an infinite max is not shifted by, so
    /// rows of -inf give -inf and a row holding +inf gives +inf, as
    /// PyTorch's. Floats; 16-bit ones computed in f32 and rounded once.
    pub fn logsumexp(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.in_f32(|x| {
            let zero = Tensor::scalar(Scalar::F32(0.0).cast(x.dtype()));
            let inf = Tensor::scalar(Scalar::F32(f32::INFINITY).cast(x.dtype()));
            let max = x.max(axes, true)?.detach()?;
            let shift = max.abs()?.eq(&inf)?.where_cond(&zero, &max)?;
            let sum = x.sub(&shift)?.exp()?.sum(axes, keepdim)?;
            // The shift has the reduced axes as size 1; the sum, as asked.
            sum.log()?.add(&shift.reshape(sum.shape().clone())?)
        })
    }

    /// Running sums along `axis` (negative counts from the end): element `i`
    /// is the sum of elements `0..=i`, as PyTorch's `cumsum`. f32, f64, i32
    /// or i64 (integers wrap). Each output element sums its prefix as a
    /// reduction over a `[len, len]` triangle of the axis, so the work grows
    /// with the square of the axis's length: for the axes of masks and
    /// positions, not for a million-element scan. The gradient is the
    /// running sum of the output's gradient from the other end.
    pub fn cumsum(&self, axis: isize) -> Result<Tensor> {
        self.running(ReduceOp::Sum, axis, (false, false))
    }

    /// Running products along `axis`, as PyTorch's `cumprod`: element `i`
    /// is the product of elements `0..=i`, a reduction over the same
    /// triangle as `cumsum`'s (the elements outside it count as 1). f32,
    /// f64, i32 or i64 (integers wrap); its gradient is `prod`'s.
    pub fn cumprod(&self, axis: isize) -> Result<Tensor> {
        self.running(ReduceOp::Prod, axis, (false, false))
    }

    /// `cumsum` (`op` `Sum`) or `cumprod` (`Prod`), and the variants ONNX's
    /// `CumSum` and `CumProd` name: `exclusive` leaves element `i` itself
    /// out, `reverse` runs from the axis's other end.
    pub(crate) fn running(
        &self,
        op: ReduceOp,
        axis: isize,
        (exclusive, reverse): (bool, bool),
    ) -> Result<Tensor> {
        let name = match op {
            ReduceOp::Sum => "cumsum",
            ReduceOp::Prod => "cumprod",
            ReduceOp::Max => "cummax",
        };
        if !matches!(
            self.dtype(),
            DType::F32 | DType::F64 | DType::I32 | DType::I64
        ) {
            return Err(kiln_ir::Error::DType {
                op: name,
                dtype: self.dtype(),
                expected: "f32, f64, i32 or i64",
            }
            .into());
        }
        let axis = crate::ops::normalize_axis(name, axis, self.rank())?;
        let len = self.dims()[axis];
        let positions = i32::try_from(len).map_err(|_| crate::Error::AxisTooLong {
            op: name,
            axis,
            len,
        })?;
        // [.., i, j, ..]: element j of the axis counts toward output i when j <= i
        // (j < i exclusive; j >= i or j > i reversed).
        let mut along = vec![1; self.rank() + 1];
        along[axis] = len;
        let rows = Tensor::arange(0, positions).reshape(along.clone())?;
        along[axis] = 1;
        along[axis + 1] = len;
        let columns = Tensor::arange(0, positions).reshape(along)?;
        let counted = match (exclusive, reverse) {
            (false, false) => columns.le(&rows)?,
            (true, false) => columns.lt(&rows)?,
            (false, true) => columns.ge(&rows)?,
            (true, true) => columns.gt(&rows)?,
        };
        // What an element outside the triangle adds: nothing.
        let none = Tensor::scalar(op.init(self.dtype()));
        let spread = self.unsqueeze(axis as isize)?;
        let triangle = counted.where_cond(&spread, &none)?;
        triangle.reduce(op, &[axis as isize + 1], false)
    }

    /// Each element bounded to `[min, max]` (`min` first: where `min >
    /// max`, every element becomes `max`, as in PyTorch's `clamp`); NaN
    /// stays NaN. The gradient passes where the element is inside the
    /// bounds, the bounds included, and is zero outside. Bounds are cast to
    /// the tensor's dtype; pass infinities for one side alone.
    pub fn clamp(&self, min: f64, max: f64) -> Result<Tensor> {
        let bound = |v: f64| Tensor::scalar(Scalar::F64(v).cast(self.dtype()));
        let (lo, hi) = (bound(min), bound(max));
        let above = self.lt(&lo)?.where_cond(&lo, self)?;
        self.gt(&hi)?.where_cond(&hi, &above)
    }
}
