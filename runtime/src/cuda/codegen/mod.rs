//! CUDA C from the kernel IR: one `__global__` function per kernel, with
//! shapes and strides baked in as constants (a kernel is specialized to its
//! types, as the CPU backend's are), for NVRTC to compile. Each kernel is a
//! `Program`: its text and the `Grid` it expects.
//!
//! - `elementwise`: a grid-stride loop over the output, four f32 elements
//!   a step;
//! - `reduce`: a reduction by rows (a block to a row) or by columns (a
//!   thread to an output), with its broadcast epilogue;
//! - `row_group`: the reductions of a row group as one kernel;
//! - `scatter`: a scatter-add, a thread per column of its output;
//! - `writer`: the C text of values, loads, helpers and signatures that
//!   the others share.
//!
//! The matmul's prologue and epilogue kernels are elementwise kernels that
//! `plan` asks for. Which axes a kernel steps along and a reduction's rows
//! come from `crate::nest`, as the CPU backend's loops do.
//!
//! Values follow the interpreter's semantics: IEEE f32 and f64 arithmetic
//! with no contraction into FMA (compiled with `--fmad=false`),
//! NaN-propagating max/min with +0 above -0, saturating float-to-integer
//! casts, wrapping integer arithmetic (i64 through `unsigned long long`, so
//! that overflow is defined). exp, log, tanh and the trigonometric and
//! hyperbolic functions are CUDA's (at most 2-4 ulp in f32, 1-2 in f64,
//! where the CPU calls Rust's), f32's pow is computed in double.

mod elementwise;
mod reduce;
mod row_group;
mod scatter;
mod writer;

use kiln_ir::kernel::{Kernel, KernelKind};

use crate::Error;

pub(crate) use elementwise::elementwise;
use reduce::reduce;
pub use reduce::reduction_rows;
pub use row_group::row_group_of;

/// The name every generated kernel function has.
pub const ENTRY: &str = "kiln_kernel";

/// Threads per block of flat kernels.
pub const FLAT_THREADS: u32 = 256;

/// A generated kernel: its CUDA C and the grid to launch it on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Program {
    /// CUDA C defining `extern "C" __global__ void kiln_kernel(...)`, whose
    /// parameters are the kernel's inputs in order, then its output.
    pub code: String,
    /// The grid it expects.
    pub grid: Grid,
}

impl Program {
    /// The same kernel for parameters that may alias (an output written
    /// over an input it reads, `kiln_ir::pass::donate`): without
    /// `__restrict__`, which would let the compiler move a thread's read of
    /// an element past its write of it.
    pub fn aliased(&self) -> Program {
        Program {
            code: self.code.replace(" __restrict__", ""),
            grid: self.grid,
        }
    }
}

/// The grid a generated kernel is launched on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grid {
    /// A grid-stride loop over `steps` units of `FLAT_THREADS`-thread blocks:
    /// any grid size is correct, `steps / FLAT_THREADS` blocks cover it once.
    Flat {
        /// Loop trips over the whole grid.
        steps: usize,
    },
    /// One block of `threads` per output row (blocks stride over the rows,
    /// so fewer are correct too).
    Rows {
        /// Output rows.
        rows: usize,
        /// Threads per block, a multiple of 32.
        threads: u32,
    },
}

/// The CUDA C of an elementwise or reduction kernel.
pub fn kernel(kernel: &Kernel) -> Result<Program, Error> {
    match &kernel.kind {
        KernelKind::Elementwise => elementwise(
            &kernel.inputs,
            None,
            &kernel.body,
            &kernel.out,
            &kernel.side,
        ),
        KernelKind::Reduce { .. } => reduce(kernel),
        KernelKind::Scatter {
            axis,
            shape,
            prologue,
            index,
        } => scatter::scatter(kernel, *axis, shape, prologue, *index),
        KernelKind::MatMul { .. } => Err(crate::codegen(
            crate::label(kernel),
            "a matmul kernel is a plan, not one source",
        )),
        // The backend states no attention kernel (`Backend::attention`),
        // so the optimizer keeps attention's ops.
        KernelKind::Attention { .. } => Err(crate::codegen(
            crate::label(kernel),
            "the CUDA backend runs attention as the ops it stands for",
        )),
    }
}
