//! kiln-runtime: the backends that run fused graphs.
//!
//! - `backend`: the contract each keeps (`Backend` compiles an `Optimized`
//!   graph into an `Executable`), and the reference interpreter as a backend;
//! - `bind`: which buffer each launch reads and writes in a run, for every
//!   backend;
//! - `cpu`: kernels lowered to Cranelift IR, compiled, cached by structural
//!   hash, and run in schedule order over an arena sized by the memory plan;
//! - `cuda`: kernels printed as CUDA C (always, so that they can be checked
//!   anywhere), compiled by NVRTC and run with cuBLAS/cuBLASLt matmuls (with
//!   feature `cuda`);
//! - `loops`: a kernel's loop plan (its nests, a reduction's strategy, what
//!   runs in lanes, a prologue value reused), made for both backends from
//!   what their loops can do;
//! - `matmul`: a matmul kernel's plan (operands in place or written into
//!   scratch first, the epilogue the GEMM applies), made for both backends
//!   from what their GEMMs take;
//! - `nest`: loop nests, a kernel's space split into rows and an inner loop
//!   with each access's strides over them, and a reduction's rows, for both
//!   backends;
//! - `rows`: which reductions can run row by row, for both backends;
//! - `storage`: where realized values live (host data, GPU memory) and
//!   what a backend has copied.
//!
//! `unsafe` is confined to where machine code is made and called (the CPU
//! backend's JIT, `cpu::jit`) and to the CUDA libraries and device memory;
//! each module that holds it says so in its doc. The machine kernels the
//! CPU backend calls (GEMM cores, row functions, the thread team) are
//! `kiln_machine`'s, behind its safe API.
//!
//! No function here takes more than six parameters or runs over 120 lines
//! (`clippy.toml`).

#![warn(clippy::too_many_lines)]

pub mod backend;
pub mod bind;
pub mod cpu;
pub mod cuda;
pub mod loops;
pub mod matmul;
pub(crate) mod nest;
pub mod rows;
pub mod storage;

pub use backend::{Backend, BackendOptions, Executable, Precision, Reference};
pub use kiln_ir::interp::eval as eval_reference;
pub use storage::{Arg, Feed, MemoryStats, Storage};

use kiln_ir::TensorType;
use kiln_ir::pass::Optimized;

/// What can go wrong when compiling or running a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An error of the IR: a bad graph or a verifier failure.
    #[error(transparent)]
    Ir(#[from] kiln_ir::Error),
    /// A kernel that code generation (Cranelift, or CUDA C) refused: a
    /// compiler bug.
    #[error("code generation for {kernel}: {problem}")]
    Codegen {
        /// The kernel (`label`).
        kernel: String,
        /// What went wrong.
        problem: String,
    },
    /// The CUDA backend is unavailable (no driver, no device, no NVRTC) or a
    /// call of it failed.
    #[error("cuda: {call}: {problem}")]
    Cuda {
        /// The call that failed, or the step (`nvrtc`, a copy, a kernel's
        /// launch).
        call: String,
        /// What the driver or library said, or what is missing.
        problem: String,
    },
    /// A machine kernel (`kiln_machine`) refused its operands, or
    /// `KILN_CPU_ISA` names no path or one the CPU lacks.
    #[error("{kernel}: {error}")]
    Machine {
        /// The kernel (`label`), or the step that asked for the path.
        kernel: String,
        /// What the machine kernel said.
        error: kiln_machine::Error,
    },
    /// A buffer too small for what a kernel (or a copy) reads or writes
    /// there: a runtime bug.
    #[error("{kernel}: {buffer} holds {bytes} bytes, {needs} needed")]
    Fit {
        /// The kernel (`label`), or the step that copies.
        kernel: String,
        /// Which of its buffers.
        buffer: Role,
        /// Its bytes.
        bytes: usize,
        /// The bytes needed.
        needs: usize,
    },
    /// A launch whose parts disagree with its kernel, its plan or the state
    /// of its values: a runtime bug.
    #[error("{kernel}: {problem}")]
    Launch {
        /// The kernel (`label`), or the step that failed.
        kernel: String,
        /// What disagrees.
        problem: String,
    },
    /// A compiled graph called with the wrong number of buffers.
    #[error("{graph}: expected {expected} {what}s, got {got}")]
    Count {
        /// The graph's name.
        graph: String,
        /// `input` or `output`.
        what: &'static str,
        /// What it was compiled for.
        expected: usize,
        /// What it was given.
        got: usize,
    },
    /// A compiled graph called with a buffer of the wrong type or length.
    #[error("{graph}: {what} {index} must be {expected}, got {got}")]
    Buffer {
        /// The graph's name.
        graph: String,
        /// `input` or `output`.
        what: &'static str,
        /// Its position.
        index: usize,
        /// The type it was compiled for.
        expected: String,
        /// What it was given.
        got: String,
    },
}

/// A buffer of a launch, as errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The kernel's input at this position.
    Input(usize),
    /// Its output.
    Output,
    /// Its side output at this position.
    Side(usize),
    /// Its scratch.
    Scratch,
    /// A matmul's operand written before the product (0 for `a`, 1 for
    /// `b`).
    Operand(usize),
    /// A buffer on the host, copied from or into.
    Host,
    /// A buffer on a device, copied from or into.
    Device,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Input(i) => write!(f, "input {i}"),
            Role::Output => f.write_str("the output"),
            Role::Side(i) => write!(f, "side output {i}"),
            Role::Scratch => f.write_str("the scratch"),
            Role::Operand(i) => write!(f, "written operand {}", ["a", "b"][(*i).min(1)]),
            Role::Host => f.write_str("the host buffer"),
            Role::Device => f.write_str("the device buffer"),
        }
    }
}

/// A kernel as errors and profiles name it: its kind (a reduction by its
/// op) and what it writes (`sum kernel of f32[64,10]`).
pub fn label(kernel: &kiln_ir::kernel::Kernel) -> String {
    use kiln_ir::kernel::KernelKind;
    let kind = match kernel.kind {
        KernelKind::Elementwise => "elementwise",
        KernelKind::Reduce { op, .. } => op.name(),
        KernelKind::Scatter { .. } => "scatter",
        KernelKind::MatMul { .. } => "matmul",
        KernelKind::Attention { .. } => "attention",
    };
    format!("{kind} kernel of {}", kernel.out)
}

/// `Error::Launch` of `kernel` (a label or a step) for `problem`.
pub(crate) fn launch(kernel: impl Into<String>, problem: impl Into<String>) -> Error {
    Error::Launch {
        kernel: kernel.into(),
        problem: problem.into(),
    }
}

/// The path this process's CPU code takes (`kiln_machine::isa`).
pub(crate) fn cpu_isa() -> Result<kiln_machine::Isa, Error> {
    kiln_machine::isa().map_err(|error| Error::Machine {
        kernel: "the CPU backend".into(),
        error,
    })
}

/// `Error::Codegen` of `kernel` for `problem`.
pub(crate) fn codegen(kernel: impl Into<String>, problem: impl Into<String>) -> Error {
    Error::Codegen {
        kernel: kernel.into(),
        problem: problem.into(),
    }
}

/// `Error::Cuda` of `call` for `problem`.
#[cfg(feature = "cuda")]
pub(crate) fn cuda(call: impl Into<String>, problem: impl Into<String>) -> Error {
    Error::Cuda {
        call: call.into(),
        problem: problem.into(),
    }
}

/// A run's buffers (`Executable::run_donated`, `run_stored`), each given
/// by its dtype and length: `donated` of the types of the inputs
/// `schedule.donated` names, in its order; `inputs` of the other inputs'
/// types and `outputs` of the other outputs' types, in order.
pub(crate) fn check_run(
    optimized: &Optimized,
    output_types: &[TensorType],
    donated: impl ExactSizeIterator<Item = (kiln_ir::DType, usize)>,
    inputs: impl ExactSizeIterator<Item = (kiln_ir::DType, usize)>,
    outputs: impl ExactSizeIterator<Item = (kiln_ir::DType, usize)>,
) -> Result<(), Error> {
    let graph = &optimized.graph;
    let pairs = &optimized.schedule.donated;
    let given = pairs.iter().map(|&(i, _)| graph.inputs[i as usize].clone());
    let given: Vec<TensorType> = given.collect();
    check(&graph.name, "donated input", &given, donated)?;
    let kept = |types: &[TensorType], donated: &dyn Fn(usize) -> bool| -> Vec<TensorType> {
        let types = types.iter().enumerate().filter(|&(k, _)| !donated(k));
        types.map(|(_, t)| t.clone()).collect()
    };
    let inputs_kept = kept(&graph.inputs, &|k| pairs.iter().any(|p| p.0 as usize == k));
    check(&graph.name, "input", &inputs_kept, inputs)?;
    let outputs_kept = kept(output_types, &|k| pairs.iter().any(|p| p.1 as usize == k));
    check(&graph.name, "output", &outputs_kept, outputs)
}

/// `check_run` for a run on host data (`Executable::run_donated`).
pub(crate) fn check_data_run(
    optimized: &Optimized,
    output_types: &[TensorType],
    donated: &[&mut kiln_ir::Data],
    inputs: &[kiln_ir::DataRef<'_>],
    outputs: &[&mut kiln_ir::Data],
) -> Result<(), Error> {
    let sizes = |data: &[&mut kiln_ir::Data]| -> Vec<(kiln_ir::DType, usize)> {
        data.iter().map(|d| (d.dtype(), d.len())).collect()
    };
    let given = inputs.iter().map(|d| (d.dtype(), d.len()));
    let (donated, outputs) = (sizes(donated), sizes(outputs));
    check_run(
        optimized,
        output_types,
        donated.into_iter(),
        given,
        outputs.into_iter(),
    )
}

/// Each buffer, given by its dtype and length, must be of the declared type.
pub(crate) fn check(
    graph: &str,
    what: &'static str,
    types: &[TensorType],
    buffers: impl ExactSizeIterator<Item = (kiln_ir::DType, usize)>,
) -> Result<(), Error> {
    if buffers.len() != types.len() {
        return Err(Error::Count {
            graph: graph.to_string(),
            what,
            expected: types.len(),
            got: buffers.len(),
        });
    }
    for (index, ((dtype, len), ty)) in buffers.zip(types).enumerate() {
        if dtype != ty.dtype || len != ty.shape.numel() {
            return Err(Error::Buffer {
                graph: graph.to_string(),
                what,
                index,
                expected: ty.to_string(),
                got: format!("{len} values of {dtype}"),
            });
        }
    }
    Ok(())
}
