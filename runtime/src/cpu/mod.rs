//! The CPU backend: kernels lowered to Cranelift IR (`lower`, `math`,
//! with `exp_row` and `row_ops`, 256-bit exp, max, sum and scale over a row
//! that the code calls, and `f64_math`, the f64 functions it calls),
//! compiled to machine code and called (`jit`), cached by their structural
//! hash (`cache`), and run in the order and memory plan of a schedule
//! (`executable`).

mod cache;
mod executable;
#[cfg(target_arch = "x86_64")]
mod exp_row;
mod f64_math;
mod gemm;
mod jit;
mod lower;
mod math;
#[cfg(target_arch = "x86_64")]
mod row_ops;
mod team;

use kiln_ir::pass::Optimized;

use crate::Error;
use crate::backend::{Backend, BackendOptions};
pub use cache::{clear_kernel_cache, compiled_kernels};
use executable::Executable;

/// The host CPU as a backend: kernels compiled by Cranelift, run on every
/// core.
pub struct Cpu;

impl Backend for Cpu {
    fn compile(
        &self,
        optimized: Optimized,
        options: BackendOptions,
    ) -> Result<Box<dyn crate::Executable>, Error> {
        // A `KILN_CPU_ISA` that cannot be honoured fails here, before any
        // work.
        gemm::isa()?;
        Ok(Box::new(Executable::new(optimized, options.dump_code)?))
    }

    fn donates(&self) -> bool {
        true
    }

    /// Its threads (`KILN_THREADS`, else a thread per core).
    fn parallel(&self) -> usize {
        team::threads()
    }
}

/// The GEMM path this process's matmuls take: `avx512` or `avx2` (kiln's
/// cores), or `generic` (the `gemm` crate); the fastest the CPU runs unless
/// `KILN_CPU_ISA` names another.
pub fn gemm_path() -> Result<&'static str, Error> {
    gemm::isa().map(gemm::Isa::name)
}

/// Every GEMM path, from the fastest down, and whether this CPU runs it:
/// the values `KILN_CPU_ISA` takes.
pub fn gemm_paths() -> Vec<(&'static str, bool)> {
    gemm::Isa::ALL
        .into_iter()
        .map(|isa| (isa.name(), isa.available()))
        .collect()
}
