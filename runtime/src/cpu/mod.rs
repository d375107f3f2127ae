//! The CPU backend: kernels lowered to Cranelift IR (`lower`, `math`),
//! compiled to machine code and called (`jit`), cached by their structural
//! hash (`cache`), and run in the order and memory plan of a schedule
//! (`executable`).

mod cache;
mod executable;
mod jit;
mod lower;
mod math;
#[cfg(target_arch = "x86_64")]
mod sgemm;

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
        Ok(Box::new(Executable::new(optimized, options.dump_code)?))
    }
}
