//! The CPU backend: kernels lowered to Cranelift IR (`lower`, `math`, and
//! `f64_math`, the f64 functions the code calls), compiled to machine code
//! and called (`jit`) with the machine kernels of `kiln_machine` (the GEMM
//! cores, the 256-bit row functions, the thread team), cached by their
//! structural hash (`cache`), and run in the order and memory plan of a
//! schedule (`executable`).

mod cache;
mod executable;
mod f64_math;
mod jit;
mod lower;
mod math;
mod taps;

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
        crate::cpu_isa()?;
        Ok(Box::new(Executable::new(optimized, options)?))
    }

    fn donates(&self) -> bool {
        true
    }

    /// Its threads (`KILN_THREADS`, else a thread per core).
    fn parallel(&self) -> usize {
        kiln_machine::team::threads()
    }

    /// By `kiln_machine::attention`.
    fn attention(&self) -> bool {
        true
    }
}

/// Whether the CPU sums a depthwise convolution's window of `taps` taps by
/// its machine kernel (`kiln_machine::taps`), which pads each plane as it
/// stages it: such a convolution's input is best read through its padding,
/// not stored padded first.
pub fn sums_taps(taps: usize) -> bool {
    kiln_machine::taps::supports(taps)
}

/// The ReLU and cap the machine kernel applies to a depthwise
/// convolution's sums (`taps_of`).
pub use kiln_machine::taps::Activation;

/// How many taps of `kernel`'s sum the CPU runs by its machine kernel
/// (`kiln_machine::taps`) on kiln's own paths (every `KILN_CPU_ISA` but
/// `generic`): a depthwise convolution's window, where the kernel has that
/// form; and the ReLU and cap the machine kernel applies to the sums, where
/// they are all that follows them. `KILN_DUMP=code` says so too.
pub fn taps_of(kernel: &kiln_ir::kernel::Kernel) -> Option<(usize, Activation)> {
    taps::plan(kernel).map(|(plan, _)| (plan.taps.len(), plan.activation))
}

/// The GEMM path this process's matmuls take: `amx` (kiln's AMX core for
/// bf16 products, its AVX-512 core for f32 ones), `avx512` or `avx2`
/// (kiln's cores), or `generic` (the `gemm` crate); the fastest the CPU runs
/// unless `KILN_CPU_ISA` names another.
pub fn gemm_path() -> Result<&'static str, Error> {
    Ok(crate::cpu_isa()?.name())
}

/// Every GEMM path, from the fastest down, and whether this CPU runs it:
/// the values `KILN_CPU_ISA` takes.
pub fn gemm_paths() -> Vec<(&'static str, bool)> {
    kiln_machine::Isa::ALL
        .into_iter()
        .map(|isa| (isa.name(), isa.available()))
        .collect()
}
