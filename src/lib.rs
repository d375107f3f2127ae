//! kiln: a JIT-compiling tensor compiler for Rust.
//!
//! Tensor operations look eager but only record nodes into a lazy graph:
//!
//! ```
//! use kiln::Tensor;
//! # fn main() -> kiln::Result<()> {
//! let x = Tensor::randn([4, 3], 0)?;
//! let w = Tensor::randn([3, 2], 1)?;
//! let b = Tensor::from_vec(vec![0.5f32, -0.5], [2])?;
//! let y = (x.matmul(&w)? + &b)?.relu()?; // nothing computed yet
//! let values: Vec<f32> = y.to_vec()?;    // capture, evaluate, read back
//! assert_eq!(values.len(), 8);
//! # Ok(())
//! # }
//! ```
//!
//! When a value is needed (`realize`, `to_vec`, `to_scalar`) the graph that
//! leads to it is captured as `kiln_ir::Graph` and evaluated on the tensor's
//! device. `KILN_DUMP=graph` prints each captured graph to stderr;
//! `KILN_DUMP=fuse` (or any optimizer stage: `simplify`, `cse`, `split-reduce`,
//! `fold-views`, `fuse`, `dce`, `schedule`; a comma list; or `all`) prints
//! the optimizer's stages, and `kiln::explain` returns the same text.
//!
//! `kiln::grad` differentiates a loss with respect to tensors, in reverse
//! mode, by appending the backward pass to the same lazy graph: the
//! gradients are tensors like any other, and the forward and backward
//! passes fuse together when they are realized or compiled.

mod attention;
mod backend;
mod compile;
mod composite;
mod conv;
pub mod data;
mod device;
mod error;
mod fold;
mod grad;
mod index;
mod join;
pub mod nn;
pub mod onnx;
mod ops;
pub mod optim;
mod overload;
mod random;
mod rng;
mod statistics;
mod step;
mod tensor;

pub use backend::{memory_stats, synchronize};
pub use compile::{CompileOptions, CompiledGraph, compile, compile_with};
pub use composite::CrossEntropy;
pub use conv::Pool2d;
pub use device::Device;
pub use error::{Error, Result};
pub use grad::{grad, value_and_grad};
pub use kiln_ir::pass::{Autocast, Optimized, Options};
pub use kiln_ir::{DType, Data, DataRef, Element, Graph, Scalar, Shape, TensorType, bf16, f16};
pub use kiln_runtime::{BackendOptions, MemoryStats, Precision};
pub use step::{CompiledStep, compile_step, compile_step_with};
pub use tensor::{Tensor, capture, explain, optimize, realize};

/// The README's usage snippet, compiled and run as a doctest so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
