//! kiln-runtime: where graphs meet machines. It will hold host and device
//! buffers, the Cranelift CPU backend, the CUDA backend (feature `cuda`) and
//! the kernel cache; it is the only kiln crate allowed `unsafe`.
//!
//! Until the first native backend lands, kiln evaluates graphs with the
//! reference interpreter of kiln-ir, re-exported here so that the user-facing
//! crate reaches every backend through this one.

pub use kiln_ir::interp::eval as eval_reference;
