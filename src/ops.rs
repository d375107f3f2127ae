//! The primitive ops as `Tensor` methods, with the conveniences users expect:
//! NumPy broadcasting, negative axes, `keepdim`, and matmul of vectors and of
//! batches with broadcast batch dimensions. Each method records IR ops; the
//! IR itself stays explicit (equal shapes, size-1 reduced axes).

use kiln_ir::{BinaryOp, DType, Op, ReduceOp, Scalar, Shape, SliceRange, TrigOp, UnaryOp};
use smallvec::SmallVec;

use crate::{Error, Result, Tensor};

/// i32 `values` along `axis` of a tensor of rank `rank`, the other axes of
/// size 1: a position index to compare against or add up, broadcast to a
/// shape by the op that reads it.
pub(crate) fn ramp(
    values: impl IntoIterator<Item = i32>,
    axis: usize,
    rank: usize,
) -> Result<Tensor> {
    let values: Vec<i32> = values.into_iter().collect();
    let mut dims = vec![1; rank];
    dims[axis] = values.len();
    Tensor::from_vec(values, dims)
}

/// `axis` counted from the end when negative, checked against `rank`.
pub(crate) fn normalize_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let resolved = if axis < 0 { axis + rank as isize } else { axis };
    if (0..rank as isize).contains(&resolved) {
        Ok(resolved as usize)
    } else {
        Err(kiln_ir::Error::Axis { op, axis, rank }.into())
    }
}

impl Tensor {
    fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        Tensor::lazy(Op::Unary(op), &[self])
    }

    /// -x
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }

    /// e^x
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }

    /// Square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }

    /// 1/x
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip)
    }

    /// max(x, 0); NaN stays NaN.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }

    /// 1/(1+e^-x)
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }

    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }

    /// Sine (radians).
    pub fn sin(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Sin))
    }

    /// Cosine (radians).
    pub fn cos(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Cos))
    }

    /// Tangent (radians).
    pub fn tan(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Tan))
    }

    /// Arcsine, in [-π/2, π/2]; NaN outside [-1, 1].
    pub fn asin(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Asin))
    }

    /// Arccosine, in [0, π]; NaN outside [-1, 1].
    pub fn acos(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Acos))
    }

    /// Arctangent, in (-π/2, π/2).
    pub fn atan(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Atan))
    }

    /// Hyperbolic sine.
    pub fn sinh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Sinh))
    }

    /// Hyperbolic cosine.
    pub fn cosh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Cosh))
    }

    /// Inverse hyperbolic sine.
    pub fn asinh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Asinh))
    }

    /// Inverse hyperbolic cosine; NaN below 1.
    pub fn acosh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Acosh))
    }

    /// Inverse hyperbolic tangent; NaN outside [-1, 1], infinite at ±1.
    pub fn atanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Trig(TrigOp::Atanh))
    }

    /// |x|
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }

    /// The same value, through which `kiln::grad` passes no gradient
    /// (PyTorch's `detach`, JAX's `stop_gradient`). It costs nothing: the
    /// optimizer removes it once gradients are taken.
    pub fn detach(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Detach)
    }

    /// x*x
    pub fn square(&self) -> Result<Tensor> {
        self.mul(self)
    }

    /// An elementwise op of two operands broadcast to a common shape.
    fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        let shape = Shape::broadcast(op.name(), self.shape(), rhs.shape())?;
        Tensor::lazy(
            Op::Binary(op),
            &[&self.expand(&shape)?, &rhs.expand(&shape)?],
        )
    }

    /// a + b, broadcasting.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Add, rhs)
    }

    /// a - b, broadcasting.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Sub, rhs)
    }

    /// a * b, broadcasting.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Mul, rhs)
    }

    /// a / b, broadcasting (floats).
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Div, rhs)
    }

    /// The larger of a and b elementwise, broadcasting; NaN propagates.
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Max, rhs)
    }

    /// The smaller of a and b elementwise, broadcasting; NaN propagates.
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Min, rhs)
    }

    /// a^b, broadcasting (floats).
    pub fn pow(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Pow, rhs)
    }

    /// The remainder of a / b, the quotient truncated toward zero,
    /// broadcasting: the sign of a, as `torch.fmod` and Rust's `%` (exact
    /// for floats). An integer remainder by 0 is 0.
    pub fn fmod(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Rem, rhs)
    }

    /// a < b as bool, broadcasting.
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Lt, rhs)
    }

    /// a <= b as bool, broadcasting.
    pub fn le(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Le, rhs)
    }

    /// a > b as bool, broadcasting.
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Gt, rhs)
    }

    /// a >= b as bool, broadcasting.
    pub fn ge(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Ge, rhs)
    }

    /// a == b as bool, broadcasting.
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Eq, rhs)
    }

    /// a != b as bool, broadcasting.
    pub fn ne(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Ne, rhs)
    }

    /// `on_true` where this bool tensor holds, else `on_false`; all three broadcast.
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let shape = Shape::broadcast("where", self.shape(), on_true.shape())?;
        let shape = Shape::broadcast("where", &shape, on_false.shape())?;
        Tensor::lazy(
            Op::Where,
            &[
                &self.expand(&shape)?,
                &on_true.expand(&shape)?,
                &on_false.expand(&shape)?,
            ],
        )
    }

    /// The elements converted to `dtype`: floats to integers truncate toward
    /// zero and saturate (NaN to 0), integers wrap, nonzero is true.
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        Tensor::lazy(Op::Cast(dtype), &[self])
    }

    // ----- Movement: views, never copies. -----

    /// The same elements, in row-major order, under a new shape.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        Tensor::lazy(Op::Reshape(shape), &[self])
    }

    /// Axes reordered: output axis `i` is input axis `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        Tensor::lazy(Op::Permute(SmallVec::from_slice(perm)), &[self])
    }

    /// Axes `a` and `b` swapped (negative counts from the end).
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (
            normalize_axis("transpose", a, self.rank())?,
            normalize_axis("transpose", b, self.rank())?,
        );
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// The last two axes swapped: the matrix transpose.
    pub fn t(&self) -> Result<Tensor> {
        self.transpose(-2, -1)
    }

    /// Broadcast to `shape` by NumPy rules, as a view.
    pub fn expand(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        Tensor::lazy(Op::Expand(shape), &[self])
    }

    /// A size-1 axis inserted at `axis` (negative counts from the end of the result).
    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        let axis = normalize_axis("unsqueeze", axis, self.rank() + 1)?;
        let mut dims = self.dims().to_vec();
        dims.insert(axis, 1);
        self.reshape(dims)
    }

    /// Indices `start..end` of `axis`, every `step`-th, as a view. A range
    /// outside the axis is an error, not a silent clamp.
    pub fn slice(&self, axis: isize, start: usize, end: usize, step: usize) -> Result<Tensor> {
        let axis = normalize_axis("slice", axis, self.rank())?;
        let ranges = self
            .dims()
            .iter()
            .enumerate()
            .map(|(a, &dim)| match a == axis {
                true => SliceRange { start, end, step },
                false => SliceRange {
                    start: 0,
                    end: dim,
                    step: 1,
                },
            })
            .collect();
        Tensor::lazy(Op::Slice(ranges), &[self])
    }

    /// Sliding windows of `size` elements along `axis`, `step` apart, as a
    /// view (PyTorch's `unfold`): the axis becomes the windows' starts and a
    /// new last axis of `size` walks each window, so element `[.., i, ..,
    /// j]` is `self[.., i * step + j, ..]`. Windows overlap where `step <
    /// size`; none is copied.
    pub fn unfold(&self, axis: isize, size: usize, step: usize) -> Result<Tensor> {
        let axis = normalize_axis("unfold", axis, self.rank())?;
        Tensor::lazy(Op::Unfold { axis, size, step }, &[self])
    }

    /// `(before, after)` elements of `value` added around each axis.
    pub fn pad(&self, pads: &[(usize, usize)], value: impl Into<Scalar>) -> Result<Tensor> {
        Tensor::lazy(
            Op::Pad {
                pads: SmallVec::from_slice(pads),
                value: value.into(),
            },
            &[self],
        )
    }

    // ----- Reductions. -----

    pub(crate) fn reduce(&self, op: ReduceOp, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let mut resolved = axes
            .iter()
            .map(|&a| normalize_axis(op.name(), a, self.rank()))
            .collect::<Result<SmallVec<[usize; 4]>>>()?;
        resolved.sort_unstable();
        if let Some(pair) = resolved.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::DuplicateAxis {
                op: op.name(),
                axis: pair[0],
            });
        }
        let reduced = Tensor::lazy(
            Op::Reduce {
                op,
                axes: resolved.clone(),
            },
            &[self],
        )?;
        if keepdim {
            return Ok(reduced);
        }
        let dims: Vec<usize> = (0..self.rank())
            .filter(|a| !resolved.contains(a))
            .map(|a| self.dims()[a])
            .collect();
        reduced.reshape(dims)
    }

    /// Sum over `axes` (negative counts from the end); `keepdim` keeps them as size 1.
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }

    /// Largest element over `axes`; NaN propagates; an empty axis is an error.
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }

    /// Product over `axes`; 1 over an empty axis; integers wrap, as `mul` does.
    pub fn prod(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Prod, axes, keepdim)
    }

    /// Mean over `axes` (of floats): the sum times 1/n. NaN over an empty
    /// axis, as in NumPy.
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(kiln_ir::Error::DType {
                op: "mean",
                dtype: self.dtype(),
                expected: "a float type",
            }
            .into());
        }
        self.in_f32(|x| {
            // `sum` checks the axes, so indexing by them below is in bounds.
            let sum = x.sum(axes, keepdim)?;
            let count: usize = axes
                .iter()
                .map(|&a| Ok(x.dims()[normalize_axis("mean", a, x.rank())?]))
                .product::<Result<usize>>()?;
            match x.dtype() {
                DType::F64 => sum.mul(&Tensor::scalar(Scalar::F64(1.0 / count as f64))),
                _ => sum.mul(&Tensor::scalar(1.0 / count as f32)),
            }
        })
    }

    /// Sum of every element, as a rank-0 tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        let axes: Vec<isize> = (0..self.rank() as isize).collect();
        self.sum(&axes, false)
    }

    /// Mean of every element, as a rank-0 tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        let axes: Vec<isize> = (0..self.rank() as isize).collect();
        self.mean(&axes, false)
    }

    // ----- Contraction. -----

    /// Matrix product with NumPy's `matmul` rules: `[.., m, k] @ [.., k, n]`
    /// with batch dimensions broadcast; a 1-D operand is a row (left) or a
    /// column (right) vector whose axis is dropped from the result.
    ///
    /// f32, bf16 and f16 run as GEMMs. f64, i32 and i64 are products
    /// summed over `k` (one reduction, differentiable as any composite;
    /// fused, it reads the operands in place, unfused it stores the
    /// `[.., m, k, n]` products first): f64 in f64 throughout, the integers wrapping, as
    /// PyTorch's CPU products of those types. u8 (whose sums kiln does not
    /// accumulate) and bool have none: cast them first.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let mismatch = || kiln_ir::Error::MatMul {
            lhs: self.shape().clone(),
            rhs: rhs.shape().clone(),
        };
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(mismatch().into());
        }
        if self.dtype() != rhs.dtype() {
            return Err(kiln_ir::Error::DTypeMismatch {
                op: "matmul",
                lhs: self.dtype(),
                rhs: rhs.dtype(),
            }
            .into());
        }
        let lhs = if self.rank() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let rhs2 = if rhs.rank() == 1 {
            rhs.unsqueeze(1)?
        } else {
            rhs.clone()
        };
        let (ld, rd) = (lhs.dims(), rhs2.dims());
        let (m, k) = (ld[ld.len() - 2], ld[ld.len() - 1]);
        let (k2, n) = (rd[rd.len() - 2], rd[rd.len() - 1]);
        if k != k2 {
            return Err(mismatch().into());
        }
        let batch = Shape::broadcast(
            "matmul",
            &Shape::new(&ld[..ld.len() - 2]),
            &Shape::new(&rd[..rd.len() - 2]),
        )
        .map_err(|_| mismatch())?;
        let with = |tail: [usize; 2]| -> Shape {
            let mut dims = batch.dims().to_vec();
            dims.extend(tail);
            dims.into()
        };
        let (a, b) = (lhs.expand(with([m, k]))?, rhs2.expand(with([k, n]))?);
        let product = match self.dtype() {
            DType::F32 | DType::BF16 | DType::F16 => Tensor::lazy(Op::MatMul, &[&a, &b])?,
            // [.., m, k, 1] * [.., 1, k, n], summed over k.
            DType::F64 | DType::I32 | DType::I64 => {
                (a.unsqueeze(-1)? * b.unsqueeze(-3)?)?.sum(&[-2], false)?
            }
            dtype @ (DType::U8 | DType::Bool) => {
                return Err(kiln_ir::Error::DType {
                    op: "matmul",
                    dtype,
                    expected: "f32, f64, bf16, f16, i32 or i64",
                }
                .into());
            }
        };
        let mut dims = batch.dims().to_vec();
        if self.rank() > 1 {
            dims.push(m);
        }
        if rhs.rank() > 1 {
            dims.push(n);
        }
        product.reshape(dims)
    }
}
