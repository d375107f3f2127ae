//! `kiln::Error`: every mistake a user can make, as a value that names the op
//! and the shapes involved. The IR's errors are wrapped unchanged.

use kiln_ir::{DType, Shape, TensorType};

/// The result type of every fallible kiln operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in kiln.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An error of the graph IR: shapes, dtypes, axes, or a verifier failure.
    #[error(transparent)]
    Ir(#[from] kiln_ir::Error),
    /// An error of a backend: compiling or running kernels, or a compiled
    /// graph called with buffers of the wrong types.
    #[error(transparent)]
    Runtime(#[from] kiln_runtime::Error),
    /// A data file that cannot be read or is corrupt.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// An ONNX model that cannot be read, or that needs what kiln lacks.
    #[error(transparent)]
    Onnx(#[from] crate::onnx::OnnxError),
    /// Realizing a value that depends on a placeholder of `kiln::compile`
    /// outside the compiled graph.
    #[error("realize: the value depends on placeholder input {index} of a compiled graph")]
    Placeholder {
        /// The placeholder's position among the compiled graph's inputs.
        index: usize,
    },
    /// A device this build of kiln has no backend for.
    #[error("{device:?}: kiln was built without feature `{feature}`")]
    NotBuilt {
        /// The device asked for.
        device: crate::Device,
        /// The cargo feature that adds its backend.
        feature: &'static str,
    },
    /// An optimizer given parameters, gradients or state that do not fit.
    #[error("{op}: {message}")]
    Optimizer {
        /// The optimizer.
        op: &'static str,
        /// What does not fit.
        message: String,
    },
    /// A compiled step's new state that does not match its state.
    #[error("compile_step: state {index} must be {expected}, got {got}")]
    StepState {
        /// The state tensor's position.
        index: usize,
        /// What the state holds.
        expected: String,
        /// What was given.
        got: String,
    },
    /// Host data whose length does not match the shape it is given.
    #[error("{op}: {len} values do not fill shape {shape} ({} elements)", shape.numel())]
    DataLength {
        /// The constructor.
        op: &'static str,
        /// How many values were given.
        len: usize,
        /// The shape asked for.
        shape: Shape,
    },
    /// Reading a tensor back as an element type it does not hold.
    #[error("{op}: the tensor holds {actual}, not {requested}")]
    ReadDType {
        /// The read.
        op: &'static str,
        /// The tensor's dtype.
        actual: DType,
        /// The dtype asked for.
        requested: DType,
    },
    /// A list of axes that names one axis twice.
    #[error("{op}: axis {axis} is named twice")]
    DuplicateAxis {
        /// The operation.
        op: &'static str,
        /// The repeated axis, counted from the front.
        axis: usize,
    },
    /// An argument of the wrong rank.
    #[error("{op}: expected a tensor of rank {rank}, got shape {shape}")]
    Rank {
        /// The operation.
        op: &'static str,
        /// The argument's shape.
        shape: Shape,
        /// The rank required.
        rank: usize,
    },
    /// `to_scalar` on a tensor of more than one element.
    #[error("to_scalar: shape {shape} holds {} elements, not 1", shape.numel())]
    NotScalar {
        /// The tensor's shape.
        shape: Shape,
    },
    /// An axis too long for i32 indices to name every position of it.
    #[error("{op}: axis {axis} has {len} elements, more than i32 indices can name")]
    AxisTooLong {
        /// The operation.
        op: &'static str,
        /// The axis, counted from the front.
        axis: usize,
        /// Its length.
        len: usize,
    },
    /// An argument outside its range (a loss's option, say).
    #[error("{op}: {message}")]
    Argument {
        /// The operation.
        op: &'static str,
        /// Which argument, its value and its range.
        message: String,
    },
    /// A convolution or pooling whose operands or window do not fit: the
    /// message names the shapes.
    #[error("{op}: {message}")]
    Window {
        /// The operation.
        op: &'static str,
        /// What does not fit, with the shapes involved.
        message: String,
    },
    /// A gradient asked of a tensor that reaches the loss through a value
    /// already computed and read, which forgot the ops that made it.
    #[error(
        "grad: tensor {index} of wrt ({ty}) reaches the loss through a value already computed (by to_vec, to_scalar, realize or to), which forgot the ops that made it; take the gradients before reading values, or read the loss with them from value_and_grad"
    )]
    GradThroughRead {
        /// Its position in `wrt`.
        index: usize,
        /// Its type.
        ty: TensorType,
    },
    /// Setting a model's parameters by name from values that do not fit it.
    #[error("parameter '{name}': {message}")]
    Parameter {
        /// The parameter, or the value's name where no parameter has it.
        name: String,
        /// What is wrong.
        message: String,
    },
}
