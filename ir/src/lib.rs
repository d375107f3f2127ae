//! kiln-ir: the graph IR of kiln and everything that is pure data and
//! transformation: ops and their typing rules, the graph arena, the printed
//! form, the verifier, the reference interpreter, reverse-mode
//! differentiation and the optimizer's passes.
//!
//! This crate has no `unsafe` and links no system library: a graph can be
//! built, printed, checked and evaluated anywhere.

pub mod attention;
mod data;
pub mod elementwise;
mod error;
pub mod grad;
pub mod graph;
pub mod interp;
pub mod kernel;
pub mod op;
pub mod pass;
mod print;
pub mod random;
pub mod schedule;
pub mod types;
pub mod verify;
pub mod view;

pub use elementwise::{BinaryOp, ReduceOp, TrigOp, UnaryOp};
pub use error::Error;
pub use grad::grad;
pub use graph::{Graph, Node, NodeId};
pub use half::{bf16, f16};
pub use op::{Op, OpLayer};
pub use types::{
    DType, Data, DataRef, Element, OutOfMemory, Scalar, Shape, TensorType, try_capacity, try_vec,
};
pub use verify::{verify, verify_graph_ops};
pub use view::SliceRange;
