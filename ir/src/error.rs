//! The errors of kiln-ir: a user mistake names the op and the shapes or types
//! involved; a verifier failure is a compiler bug and carries the graph dump.

use crate::types::{DType, Shape};

/// Everything that can go wrong while building, checking or evaluating a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Two shapes that do not broadcast under NumPy rules.
    #[error("{op}: shapes {lhs} and {rhs} do not broadcast")]
    Broadcast {
        /// The operation.
        op: &'static str,
        /// Left operand's shape.
        lhs: Shape,
        /// Right operand's shape.
        rhs: Shape,
    },
    /// Two shapes that must be equal and are not.
    #[error("{op}: shapes {lhs} and {rhs} differ")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// Left operand's shape.
        lhs: Shape,
        /// Right operand's shape.
        rhs: Shape,
    },
    /// Two operands of different dtypes where one is required.
    #[error("{op}: dtypes {lhs} and {rhs} differ (cast one of them first)")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// Left operand's dtype.
        lhs: DType,
        /// Right operand's dtype.
        rhs: DType,
    },
    /// An operand of a dtype the op does not take.
    #[error("{op}: expected {expected}, got {dtype}")]
    DType {
        /// The operation.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
        /// What the op takes.
        expected: &'static str,
    },
    /// An axis outside the tensor's rank.
    #[error("{op}: axis {axis} is out of range for rank {rank}")]
    Axis {
        /// The operation.
        op: &'static str,
        /// The axis given, as the user wrote it.
        axis: isize,
        /// The tensor's rank.
        rank: usize,
    },
    /// A list of axes that names an axis twice or is out of order.
    #[error("{op}: axes {axes:?} must be distinct and sorted")]
    Axes {
        /// The operation.
        op: &'static str,
        /// The axes given.
        axes: Vec<usize>,
    },
    /// A reduction with no identity over an axis of size 0.
    #[error("{op}: cannot reduce axis {axis} of shape {shape}: it is empty")]
    EmptyReduce {
        /// The operation.
        op: &'static str,
        /// The operand's shape.
        shape: Shape,
        /// The empty axis.
        axis: usize,
    },
    /// A per-axis argument whose length is not the operand's rank.
    #[error("{op}: {given} per-axis entries given for shape {shape}")]
    Rank {
        /// The operation.
        op: &'static str,
        /// The operand's shape.
        shape: Shape,
        /// How many entries the argument has.
        given: usize,
    },
    /// Matrix product of shapes whose inner or batch dimensions disagree.
    #[error("matmul: shapes {lhs} and {rhs} do not fit (need [.., m, k] @ [.., k, n])")]
    MatMul {
        /// Left operand's shape.
        lhs: Shape,
        /// Right operand's shape.
        rhs: Shape,
    },
    /// A buffer the allocator could not give.
    #[error("{op}: out of memory: {bytes} bytes for {what}")]
    OutOfMemory {
        /// The operation, or the graph, that needed it.
        op: String,
        /// What the buffer was for: its type, or which buffer.
        what: String,
        /// The bytes asked for.
        bytes: usize,
    },
    /// A result with more bytes than an address space holds.
    #[error("{op}: the result of shape {shape} is too large to address")]
    TooLarge {
        /// The operation.
        op: &'static str,
        /// The shape (for pad, the operand's).
        shape: Shape,
    },
    /// Reshape to a different number of elements.
    #[error("reshape: cannot reshape {from} ({} elements) to {to} ({} elements)", from.numel(), to.numel())]
    Reshape {
        /// The operand's shape.
        from: Shape,
        /// The requested shape.
        to: Shape,
    },
    /// An axis order that is not a permutation of the operand's axes.
    #[error("permute: {perm:?} is not a permutation of the axes of {shape}")]
    Permute {
        /// The operand's shape.
        shape: Shape,
        /// The order given.
        perm: Vec<usize>,
    },
    /// Expand to a shape the operand does not broadcast to.
    #[error("expand: shape {from} does not broadcast to {to}")]
    Expand {
        /// The operand's shape.
        from: Shape,
        /// The requested shape.
        to: Shape,
    },
    /// A slice range outside the axis.
    #[error(
        "slice: range {start}..{end} step {step} is out of bounds for axis {axis} of shape {shape}"
    )]
    Slice {
        /// The operand's shape.
        shape: Shape,
        /// The axis.
        axis: usize,
        /// First index.
        start: usize,
        /// One past the last index.
        end: usize,
        /// Step.
        step: usize,
    },
    /// Windows that do not fit their axis.
    #[error(
        "unfold: windows of {size} every {step} do not fit axis {axis} of shape {shape} (size and step at least 1, size at most the axis)"
    )]
    Unfold {
        /// The operand's shape.
        shape: Shape,
        /// The axis.
        axis: usize,
        /// Elements per window.
        size: usize,
        /// Distance between window starts.
        step: usize,
    },
    /// An op given the wrong number of operands.
    #[error("{op}: expected {expected} operands, got {got}")]
    Arity {
        /// The operation.
        op: &'static str,
        /// How many it takes.
        expected: usize,
        /// How many it got.
        got: usize,
    },
    /// An `Input` node whose index the graph does not declare.
    #[error("input: index {index} is out of range for {count} graph inputs")]
    InputIndex {
        /// The index.
        index: usize,
        /// How many inputs the graph declares.
        count: usize,
    },
    /// A graph fed the wrong number of inputs.
    #[error("graph @{graph}: expects {expected} inputs, got {got}")]
    InputCount {
        /// The graph's name.
        graph: String,
        /// How many it declares.
        expected: usize,
        /// How many were given.
        got: usize,
    },
    /// A value fed to a graph input that does not match its declared type.
    #[error("input {index}: expected {expected}, got {got}")]
    InputData {
        /// The input's position.
        index: usize,
        /// The declared type.
        expected: String,
        /// What was given.
        got: String,
    },
    /// A gradient asked of, or with respect to, a value that has none: one
    /// of an integer or bool type.
    #[error(
        "grad: the {op} node that makes the {role} gives {dtype}; only float values (f32, f64, bf16, f16) have gradients"
    )]
    NoGradient {
        /// `loss` or `value to differentiate`.
        role: &'static str,
        /// The op that made the value.
        op: &'static str,
        /// Its dtype.
        dtype: DType,
    },
    /// A loss of more than one element (or none).
    #[error("grad: the loss must be one value, but the {op} node that makes it has shape {shape}")]
    LossShape {
        /// The op that made the loss.
        op: &'static str,
        /// Its shape.
        shape: Shape,
    },
    /// A view or kernel that a pass built wrong: a compiler bug.
    #[error("{op}: {message}")]
    Malformed {
        /// `view` or `kernel`.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A graph that breaks an IR invariant: a compiler bug, not a user mistake.
    #[error("verifier: {message}\n{dump}")]
    Verify {
        /// What is wrong, naming the node.
        message: String,
        /// The graph as printed.
        dump: String,
    },
}
