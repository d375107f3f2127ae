//! The operations of the IR and their typing rules.
//!
//! One `Op` enum covers every operation. Every stage that gives meaning to an op
//! (typing here, the printer, the verifier, the interpreter, later the passes
//! and the backends) matches on it exhaustively, so a new variant is a compile
//! error until every stage has decided what to do with it.
//!
//! The IR is explicit where the user API is convenient: elementwise ops take
//! operands of one shape and one dtype, and broadcasting is an `Expand` node
//! that the API inserts. Reductions keep reduced axes as size 1; the API
//! reshapes them away when the user asks for `keepdim = false`.
//!
//! Numeric semantics, which the interpreter defines and every backend matches:
//! f32 ops are computed exactly and rounded once to f32; NaN propagates through
//! every op that takes a float (`max`, `min` and `relu` included, as in
//! PyTorch); integer arithmetic wraps; casts follow `Scalar::cast`.

use smallvec::SmallVec;

use crate::Error;
use crate::kernel::{Kernel, check_view};
use crate::types::{DType, Scalar, Shape, TensorType};
use crate::view::View;

/// Elementwise ops of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// -x
    Neg,
    /// e^x
    Exp,
    /// natural log; NaN below 0, -inf at 0
    Log,
    /// square root; NaN below 0
    Sqrt,
    /// 1/x
    Recip,
    /// max(x, 0), NaN propagates
    Relu,
    /// 1/(1+e^-x)
    Sigmoid,
    /// hyperbolic tangent
    Tanh,
    /// |x|
    Abs,
}

/// Elementwise ops of two operands of the same shape and dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b (floats only)
    Div,
    /// the larger, NaN propagates, +0 above -0
    Max,
    /// the smaller, NaN propagates, -0 below +0
    Min,
    /// a^b (floats only)
    Pow,
    /// a < b
    Lt,
    /// a <= b
    Le,
    /// a > b
    Gt,
    /// a >= b
    Ge,
    /// a == b
    Eq,
    /// a != b
    Ne,
}

/// How a reduction combines elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum; 0 over an empty axis.
    Sum,
    /// Largest element, NaN propagates; an empty axis is an error.
    Max,
}

/// The part of one axis that a slice keeps: `start..end` every `step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceRange {
    /// First index kept.
    pub start: usize,
    /// One past the last index considered; `start <= end <= dim`.
    pub end: usize,
    /// Distance between kept indices, at least 1.
    pub step: usize,
}

impl SliceRange {
    /// How many indices the range keeps.
    pub fn len(&self) -> usize {
        (self.end - self.start).div_ceil(self.step)
    }

    /// Whether the range keeps nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One tensor operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    // Sources.
    /// The graph input at `index`; its type is declared in the graph.
    Input {
        /// Position in the graph's input list.
        index: u32,
    },
    /// A rank-0 constant; `Expand` gives it a shape.
    Const(Scalar),
    // Elementwise.
    /// An elementwise op of one operand.
    Unary(UnaryOp),
    /// An elementwise op of two operands; comparisons give bool.
    Binary(BinaryOp),
    /// `cond ? a : b` elementwise, `cond` bool.
    Where,
    /// Conversion to another element type, as `Scalar::cast`.
    Cast(DType),
    // Movement: views, never copies.
    /// The same elements in row-major order under a new shape.
    Reshape(Shape),
    /// Axes reordered: output axis `i` is input axis `perm[i]`.
    Permute(SmallVec<[usize; 4]>),
    /// Broadcast to a shape by NumPy rules (leading axes may be added).
    Expand(Shape),
    /// A strided sub-range of every axis.
    Slice(SmallVec<[SliceRange; 4]>),
    /// `(before, after)` elements of `value` added around every axis.
    Pad {
        /// Padding per axis.
        pads: SmallVec<[(usize, usize); 4]>,
        /// The fill value, of the input's dtype.
        value: Scalar,
    },
    // Reductions and contractions.
    /// A reduction over sorted, distinct axes, kept as size 1.
    Reduce {
        /// How elements combine.
        op: ReduceOp,
        /// The reduced axes.
        axes: SmallVec<[usize; 4]>,
    },
    /// `[..., m, k] @ [..., k, n] -> [..., m, n]` over equal batch dims, f32.
    MatMul,
    // Produced by the passes.
    /// A chain of movement ops folded into one index map (`fold-views`).
    View(View),
    /// A fused kernel (`fuse`); its operands are the buffers it reads.
    Kernel(Box<Kernel>),
}

impl UnaryOp {
    /// The name in printed IR and errors.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Relu => "relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Abs => "abs",
        }
    }

    /// The dtypes the op accepts: the sign ops take signed numbers, the
    /// transcendental ones floats (cast integers first, as JAX asks).
    fn accepts(self, dtype: DType) -> Result<(), &'static str> {
        match self {
            UnaryOp::Neg | UnaryOp::Relu | UnaryOp::Abs => {
                accept(dtype, &[DType::F32, DType::I32], "f32 or i32")
            }
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sqrt
            | UnaryOp::Recip
            | UnaryOp::Sigmoid
            | UnaryOp::Tanh => accept(dtype, &[DType::F32], "f32"),
        }
    }
}

impl BinaryOp {
    /// The name in printed IR and errors.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Pow => "pow",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
        }
    }

    /// Whether the op compares and so yields bool.
    pub fn is_comparison(self) -> bool {
        match self {
            BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge
            | BinaryOp::Eq
            | BinaryOp::Ne => true,
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Max
            | BinaryOp::Min
            | BinaryOp::Pow => false,
        }
    }

    /// The dtypes the op accepts for its (equal) operand type.
    fn accepts(self, dtype: DType) -> Result<(), &'static str> {
        match self {
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min => {
                accept(dtype, &[DType::F32, DType::I32, DType::U8], "a number type")
            }
            BinaryOp::Div | BinaryOp::Pow => accept(dtype, &[DType::F32], "f32"),
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
                accept(dtype, &[DType::F32, DType::I32, DType::U8], "a number type")
            }
            BinaryOp::Eq | BinaryOp::Ne => Ok(()),
        }
    }
}

impl ReduceOp {
    /// The name in printed IR and errors.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        }
    }

    /// Sums need an accumulating type (cast u8 and bool first); max takes any
    /// number type.
    fn accepts(self, dtype: DType) -> Result<(), &'static str> {
        match self {
            ReduceOp::Sum => accept(dtype, &[DType::F32, DType::I32], "f32 or i32"),
            ReduceOp::Max => accept(dtype, &[DType::F32, DType::I32, DType::U8], "a number type"),
        }
    }
}

fn accept(dtype: DType, allowed: &[DType], expected: &'static str) -> Result<(), &'static str> {
    if allowed.contains(&dtype) {
        Ok(())
    } else {
        Err(expected)
    }
}

impl Op {
    /// The op's name in printed IR and in errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Const(_) => "const",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Where => "where",
            Op::Cast(_) => "cast",
            Op::Reshape(_) => "reshape",
            Op::Permute(_) => "permute",
            Op::Expand(_) => "expand",
            Op::Slice(_) => "slice",
            Op::Pad { .. } => "pad",
            Op::Reduce { op, .. } => op.name(),
            Op::MatMul => "matmul",
            Op::View(_) => "view",
            Op::Kernel(_) => "kernel",
        }
    }

    /// How many operands the op takes.
    pub fn arity(&self) -> usize {
        match self {
            Op::Input { .. } | Op::Const(_) => 0,
            Op::Unary(_)
            | Op::Cast(_)
            | Op::Reshape(_)
            | Op::Permute(_)
            | Op::Expand(_)
            | Op::Slice(_)
            | Op::Pad { .. }
            | Op::Reduce { .. }
            | Op::View(_) => 1,
            Op::Binary(_) | Op::MatMul => 2,
            Op::Where => 3,
            Op::Kernel(k) => k.inputs.len(),
        }
    }

    /// The type of the op's result from the types of its operands, or the
    /// user-facing error that says why the operands do not fit. `graph_inputs`
    /// are the declared types of the graph's inputs, which type `Input`.
    pub fn infer(
        &self,
        args: &[&TensorType],
        graph_inputs: &[TensorType],
    ) -> Result<TensorType, Error> {
        self.infer_shape(args, graph_inputs)?.checked(self.name())
    }

    fn infer_shape(
        &self,
        args: &[&TensorType],
        graph_inputs: &[TensorType],
    ) -> Result<TensorType, Error> {
        let op = self.name();
        if args.len() != self.arity() {
            return Err(Error::Arity {
                op,
                expected: self.arity(),
                got: args.len(),
            });
        }
        match self {
            Op::Input { index } => {
                graph_inputs
                    .get(*index as usize)
                    .cloned()
                    .ok_or(Error::InputIndex {
                        index: *index as usize,
                        count: graph_inputs.len(),
                    })
            }
            Op::Const(v) => Ok(TensorType::new(v.dtype(), Shape::scalar())),
            Op::Unary(u) => {
                check_dtype(op, args[0].dtype, u.accepts(args[0].dtype))?;
                Ok(args[0].clone())
            }
            Op::Binary(b) => {
                let (l, r) = (args[0], args[1]);
                if l.dtype != r.dtype {
                    return Err(Error::DTypeMismatch {
                        op,
                        lhs: l.dtype,
                        rhs: r.dtype,
                    });
                }
                same_shape(op, &l.shape, &r.shape)?;
                check_dtype(op, l.dtype, b.accepts(l.dtype))?;
                let dtype = if b.is_comparison() {
                    DType::Bool
                } else {
                    l.dtype
                };
                Ok(TensorType::new(dtype, l.shape.clone()))
            }
            Op::Where => {
                let (c, a, b) = (args[0], args[1], args[2]);
                check_dtype(op, c.dtype, accept(c.dtype, &[DType::Bool], "bool"))?;
                if a.dtype != b.dtype {
                    return Err(Error::DTypeMismatch {
                        op,
                        lhs: a.dtype,
                        rhs: b.dtype,
                    });
                }
                same_shape(op, &c.shape, &a.shape)?;
                same_shape(op, &a.shape, &b.shape)?;
                Ok(a.clone())
            }
            Op::Cast(to) => Ok(TensorType::new(*to, args[0].shape.clone())),
            Op::Reshape(to) => {
                let from = &args[0].shape;
                if from.numel() != to.numel() {
                    return Err(Error::Reshape {
                        from: from.clone(),
                        to: to.clone(),
                    });
                }
                Ok(TensorType::new(args[0].dtype, to.clone()))
            }
            Op::Permute(perm) => {
                let shape = &args[0].shape;
                let mut seen: SmallVec<[bool; 4]> = SmallVec::from_elem(false, shape.rank());
                let valid = perm.len() == shape.rank()
                    && perm
                        .iter()
                        .all(|&p| p < shape.rank() && !std::mem::replace(&mut seen[p], true));
                if !valid {
                    return Err(Error::Permute {
                        shape: shape.clone(),
                        perm: perm.to_vec(),
                    });
                }
                let dims: Vec<usize> = perm.iter().map(|&p| shape.dims()[p]).collect();
                Ok(TensorType::new(args[0].dtype, dims))
            }
            Op::Expand(to) => {
                let from = &args[0].shape;
                if !from.broadcasts_to(to) {
                    return Err(Error::Expand {
                        from: from.clone(),
                        to: to.clone(),
                    });
                }
                Ok(TensorType::new(args[0].dtype, to.clone()))
            }
            Op::Slice(ranges) => {
                let shape = &args[0].shape;
                if ranges.len() != shape.rank() {
                    return Err(Error::Rank {
                        op,
                        shape: shape.clone(),
                        given: ranges.len(),
                    });
                }
                for (axis, (r, &dim)) in ranges.iter().zip(shape.dims()).enumerate() {
                    if r.step == 0 || r.start > r.end || r.end > dim {
                        return Err(Error::Slice {
                            shape: shape.clone(),
                            axis,
                            start: r.start,
                            end: r.end,
                            step: r.step,
                        });
                    }
                }
                let dims: Vec<usize> = ranges.iter().map(SliceRange::len).collect();
                Ok(TensorType::new(args[0].dtype, dims))
            }
            Op::Pad { pads, value } => {
                let shape = &args[0].shape;
                if pads.len() != shape.rank() {
                    return Err(Error::Rank {
                        op,
                        shape: shape.clone(),
                        given: pads.len(),
                    });
                }
                if value.dtype() != args[0].dtype {
                    return Err(Error::DTypeMismatch {
                        op,
                        lhs: args[0].dtype,
                        rhs: value.dtype(),
                    });
                }
                let dims: Option<Vec<usize>> = pads
                    .iter()
                    .zip(shape.dims())
                    .map(|(&(b, a), &d)| b.checked_add(d)?.checked_add(a))
                    .collect();
                let dims = dims.ok_or_else(|| Error::TooLarge {
                    op,
                    shape: shape.clone(),
                })?;
                Ok(TensorType::new(args[0].dtype, dims))
            }
            Op::Reduce { op: r, axes } => {
                let shape = &args[0].shape;
                check_dtype(op, args[0].dtype, r.accepts(args[0].dtype))?;
                for (i, &axis) in axes.iter().enumerate() {
                    if axis >= shape.rank() {
                        return Err(Error::Axis {
                            op,
                            axis: axis as isize,
                            rank: shape.rank(),
                        });
                    }
                    if i > 0 && axes[i - 1] >= axis {
                        return Err(Error::Axes {
                            op,
                            axes: axes.to_vec(),
                        });
                    }
                    if *r == ReduceOp::Max && shape.dims()[axis] == 0 {
                        return Err(Error::EmptyReduce {
                            op,
                            shape: shape.clone(),
                            axis,
                        });
                    }
                }
                let mut dims = shape.0.clone();
                for &axis in axes {
                    dims[axis] = 1;
                }
                Ok(TensorType::new(args[0].dtype, Shape(dims)))
            }
            Op::MatMul => {
                let (l, r) = (args[0], args[1]);
                if l.dtype != r.dtype {
                    return Err(Error::DTypeMismatch {
                        op,
                        lhs: l.dtype,
                        rhs: r.dtype,
                    });
                }
                check_dtype(op, l.dtype, accept(l.dtype, &[DType::F32], "f32"))?;
                let (ls, rs) = (l.shape.dims(), r.shape.dims());
                let rank = ls.len();
                if rank < 2
                    || rs.len() != rank
                    || ls[..rank - 2] != rs[..rank - 2]
                    || ls[rank - 1] != rs[rank - 2]
                {
                    return Err(Error::MatMul {
                        lhs: l.shape.clone(),
                        rhs: r.shape.clone(),
                    });
                }
                let mut dims = l.shape.0.clone();
                dims[rank - 1] = rs[rank - 1];
                Ok(TensorType::new(l.dtype, Shape(dims)))
            }
            Op::View(view) => {
                check_view(view, args[0], &view.shape)
                    .map_err(|message| Error::Malformed { op, message })?;
                Ok(TensorType::new(args[0].dtype, view.shape.clone()))
            }
            Op::Kernel(kernel) => kernel.check(args),
        }
    }
}

fn check_dtype(
    op: &'static str,
    dtype: DType,
    accepted: Result<(), &'static str>,
) -> Result<(), Error> {
    accepted.map_err(|expected| Error::DType {
        op,
        dtype,
        expected,
    })
}

fn same_shape(op: &'static str, lhs: &Shape, rhs: &Shape) -> Result<(), Error> {
    if lhs == rhs {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op,
            lhs: lhs.clone(),
            rhs: rhs.clone(),
        })
    }
}
