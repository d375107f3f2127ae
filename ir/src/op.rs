//! The operations of the IR, their two layers, and their typing rules.
//!
//! One `Op` enum covers every operation. Every stage that gives meaning to an op
//! (typing here, the printer, the verifier, the interpreter, later the passes
//! and the backends) matches on it exhaustively, so a new variant is a compile
//! error until every stage has decided what to do with it. The elementwise ops
//! and the typing rules that kernel bodies share with graph ops live in
//! `elementwise`; the rest of the typing is here.
//!
//! The ops come in two layers (`Op::layer`):
//!
//! - graph ops (`OpLayer::Graph`): what users record and what the first
//!   optimizer stages (`simplify`, `cse`, `split-reduce`) rewrite: `Input`,
//!   `Const`, `Unary`, `Binary`, `Where`, `Cast`, `Reshape`, `Permute`,
//!   `Expand`, `Slice`, `Pad`, `Reduce`, `MatMul`. Each has one meaning on
//!   tensors, so a pass that reasons about that meaning (reverse-mode
//!   differentiation, say) can handle every one;
//! - post-fusion ops (`OpLayer::Fused`): what the optimizer lowers a graph to,
//!   `View` (made by `fold-views`) and `Kernel` (made by `fuse`). They say how
//!   a backend reads and computes buffers, not what the user asked for.
//!
//! Both live in one enum so that one graph, one printer, one verifier and one
//! interpreter serve every stage of the pipeline. A pass that must see graph
//! ops only says so at its entry with `verify::verify_graph_ops`, which names
//! the first post-fusion node it finds; `optimize` does it for its input.
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
pub use crate::attention::Attention;
pub use crate::elementwise::{BinaryOp, ReduceOp, UnaryOp};
use crate::elementwise::{infer_matmul, infer_where};
use crate::kernel::Kernel;
use crate::types::{DType, Scalar, Shape, TensorType};
pub use crate::view::SliceRange;
use crate::view::View;

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
    /// Sliding windows along `axis`: that axis becomes the windows' starts
    /// (`(dim - size) / step + 1` of them, `step` apart) and a last axis of
    /// `size` walks each window, so that output `[.., i, .., j]` reads input
    /// `[.., i * step + j, ..]`. Windows overlap where `step < size`: one
    /// view of the input (PyTorch's `Tensor.unfold`), the im2col matrix of a
    /// convolution without a copy.
    Unfold {
        /// The windowed axis.
        axis: usize,
        /// Elements per window, at least 1 and at most the axis.
        size: usize,
        /// Distance between window starts, at least 1.
        step: usize,
    },
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
    /// `[..., m, k] @ [..., k, n] -> [..., m, n]` over equal batch dims, f32,
    /// bf16 or f16.
    MatMul,
    // Indexed reads.
    /// Elements picked along `axis` by run-time indices:
    /// `out[.., j, ..] = x[.., indices[.., j, ..], ..]` with `j` on `axis`.
    /// Operands `x` and the i32 or i64 `indices`, of one rank and equal on
    /// every other axis; the result has `indices`' shape and `x`'s dtype.
    /// An index counts from the end when negative; one outside `-len..len`
    /// reads NaN from floats and zero (false) from the other dtypes, so no
    /// index reads outside `x`.
    Gather {
        /// The indexed axis.
        axis: usize,
    },
    /// `Gather`'s transpose: `updates` summed at the positions `indices`
    /// give along `axis`, into zeros of `updates`' shape with `len` on
    /// `axis`: `out[.., p, ..]` is the sum of every `updates[.., j, ..]`
    /// whose index picks `p` (counted from the end when negative; one
    /// outside `-len..len` adds nowhere). Operands float `updates` and
    /// i32 or i64 `indices` of the same shape. Each sum is a sum as a
    /// reduction's is (the interpreter's exact, rounded once; a backend's
    /// within rounding of it), taken in the order of `j`, so a backend
    /// gives the same result on every run.
    ScatterAdd {
        /// The axis summed into.
        axis: usize,
        /// The output's length along `axis`.
        len: usize,
    },
    /// `softmax(q kᵀ · scale + bias) v` as one op: the ops it stands for,
    /// found by the `attention` pass where the target runs them as one
    /// kernel (see `attention`).
    Attention(Attention),
    // The post-fusion layer, produced by the passes.
    /// A chain of movement ops folded into one index map (`fold-views`).
    View(View),
    /// A fused kernel (`fuse`); its operands are the buffers it reads.
    Kernel(Box<Kernel>),
    /// Side output `k` of the kernel node that is its one operand (`fuse`);
    /// typed by that kernel, not by its operand's type (see `verify`).
    SideOutput(u32),
}

/// The layer of the IR an op belongs to (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpLayer {
    /// An op users record and the graph-level passes rewrite.
    Graph,
    /// An op only the optimizer makes, from `fold-views` on: `View`, `Kernel`.
    Fused,
}

impl Op {
    /// Which layer the op belongs to. Exhaustive, so a new op must pick one.
    pub fn layer(&self) -> OpLayer {
        match self {
            Op::Input { .. }
            | Op::Const(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Cast(_)
            | Op::Reshape(_)
            | Op::Permute(_)
            | Op::Expand(_)
            | Op::Slice(_)
            | Op::Unfold { .. }
            | Op::Pad { .. }
            | Op::Reduce { .. }
            | Op::MatMul
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Attention(_) => OpLayer::Graph,
            Op::View(_) | Op::Kernel(_) | Op::SideOutput(_) => OpLayer::Fused,
        }
    }

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
            Op::Unfold { .. } => "unfold",
            Op::Pad { .. } => "pad",
            Op::Reduce { op, .. } => op.name(),
            Op::MatMul => "matmul",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Attention(_) => "attention",
            Op::View(_) => "view",
            Op::Kernel(_) => "kernel",
            Op::SideOutput(_) => "side_output",
        }
    }

    /// Whether the op only moves or broadcasts its operand's elements (the
    /// graph's views, which `fold-views` folds). Exhaustive, so a new op
    /// must say.
    pub fn is_movement(&self) -> bool {
        match self {
            Op::Reshape(_)
            | Op::Permute(_)
            | Op::Expand(_)
            | Op::Slice(_)
            | Op::Unfold { .. }
            | Op::Pad { .. } => true,
            Op::Input { .. }
            | Op::Const(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Cast(_)
            | Op::Reduce { .. }
            | Op::MatMul
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Attention(_)
            | Op::View(_)
            | Op::Kernel(_)
            | Op::SideOutput(_) => false,
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
            | Op::Unfold { .. }
            | Op::Pad { .. }
            | Op::Reduce { .. }
            | Op::View(_)
            | Op::SideOutput(_) => 1,
            Op::Binary(_) | Op::MatMul | Op::Gather { .. } | Op::ScatterAdd { .. } => 2,
            Op::Where => 3,
            Op::Kernel(k) => k.inputs.len(),
            Op::Attention(a) => a.arity(),
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
            Op::Unary(u) => u.infer(args[0]),
            Op::Binary(b) => b.infer(args[0], args[1]),
            Op::Where => infer_where(args[0], args[1], args[2]),
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
            Op::Unfold { axis, size, step } => {
                let shape = &args[0].shape;
                let dims = shape.dims();
                if *axis >= dims.len() {
                    return Err(Error::Axis {
                        op,
                        axis: *axis as isize,
                        rank: dims.len(),
                    });
                }
                if *size == 0 || *step == 0 || *size > dims[*axis] {
                    return Err(Error::Unfold {
                        shape: shape.clone(),
                        axis: *axis,
                        size: *size,
                        step: *step,
                    });
                }
                let mut out = dims.to_vec();
                out[*axis] = (dims[*axis] - size) / step + 1;
                out.push(*size);
                Ok(TensorType::new(args[0].dtype, out))
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
            Op::Reduce { op: r, axes } => r.infer(axes, args[0]),
            Op::MatMul => infer_matmul(args[0], args[1]),
            Op::Gather { axis } => infer_gather(*axis, args[0], args[1]),
            Op::ScatterAdd { axis, len } => infer_scatter_add(*axis, *len, args[0], args[1]),
            Op::View(view) => {
                view.check(args[0], &view.shape)
                    .map_err(|message| Error::Malformed { op, message })?;
                Ok(TensorType::new(args[0].dtype, view.shape.clone()))
            }
            Op::Attention(a) => a.infer(args),
            Op::Kernel(kernel) => kernel.check(args),
            // `verify` types it from the kernel node it reads.
            Op::SideOutput(_) => Err(Error::Malformed {
                op,
                message: "a side output is typed by its kernel, not by an operand".to_string(),
            }),
        }
    }
}

/// The type of `x` gathered along `axis` by `indices` (`Op::Gather`).
fn infer_gather(axis: usize, x: &TensorType, indices: &TensorType) -> Result<TensorType, Error> {
    let op = "gather";
    if !matches!(indices.dtype, DType::I32 | DType::I64) {
        return Err(Error::DType {
            op,
            dtype: indices.dtype,
            expected: "i32 or i64 indices",
        });
    }
    if axis >= x.shape.rank() {
        return Err(Error::Axis {
            op,
            axis: axis as isize,
            rank: x.shape.rank(),
        });
    }
    let others_equal = x.shape.rank() == indices.shape.rank()
        && (0..x.shape.rank()).all(|a| a == axis || x.shape.dims()[a] == indices.shape.dims()[a]);
    if !others_equal {
        return Err(Error::ShapeMismatch {
            op,
            lhs: x.shape.clone(),
            rhs: indices.shape.clone(),
        });
    }
    Ok(TensorType::new(x.dtype, indices.shape.clone()))
}

/// The type of `updates` summed into `len` positions along `axis` by
/// `indices` (`Op::ScatterAdd`).
fn infer_scatter_add(
    axis: usize,
    len: usize,
    updates: &TensorType,
    indices: &TensorType,
) -> Result<TensorType, Error> {
    let op = "scatter_add";
    if !updates.dtype.is_float() {
        return Err(Error::DType {
            op,
            dtype: updates.dtype,
            expected: "float updates",
        });
    }
    if !matches!(indices.dtype, DType::I32 | DType::I64) {
        return Err(Error::DType {
            op,
            dtype: indices.dtype,
            expected: "i32 or i64 indices",
        });
    }
    if updates.shape != indices.shape {
        return Err(Error::ShapeMismatch {
            op,
            lhs: updates.shape.clone(),
            rhs: indices.shape.clone(),
        });
    }
    if axis >= updates.shape.rank() {
        return Err(Error::Axis {
            op,
            axis: axis as isize,
            rank: updates.shape.rank(),
        });
    }
    let mut dims = updates.shape.dims().to_vec();
    dims[axis] = len;
    Ok(TensorType::new(updates.dtype, dims))
}
