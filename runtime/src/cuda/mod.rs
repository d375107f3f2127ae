//! The CUDA backend: kernels printed as CUDA C from the same kernel IR as
//! the CPU backend's, compiled by NVRTC to a CUBIN for the device's own
//! architecture, with matmuls through cuBLASLt or cuBLAS (the runtime with
//! feature `cuda`; the code generation is always built, for its tests).
//!
//! - `codegen`: the CUDA C of elementwise, reduction and row-group kernels;
//! - `gemm`: a matmul's plan rendered as prologue kernels, a GEMM and an
//!   epilogue kernel;
//! - `context`: a GPU opened (`gpu`), its stream, library handles and
//!   compiled kernels;
//! - `memory`: the caching allocator, device buffers, and the feed of
//!   batches through pinned memory;
//! - `executable`: a fused graph compiled for a GPU, its launches enqueued;
//! - `runs`: its runs, on device storage or on host data;
//! - `replay`: runs on the buffers of an earlier run, replayed as one
//!   CUDA graph launch;
//! - `blaslt`, `blas`: the GEMM through cuBLASLt (TF32) or cuBLAS (f32);
//! - `nvrtc`: CUDA C to CUBIN;
//! - `cubin_cache`: CUBINs kept on disk from process to process.
//!
//! `context`, `memory`, `executable`, `replay`, `blas`, `blaslt` and `nvrtc`
//! are the modules of the CUDA backend with `unsafe`: device memory is made
//! and handed to generated kernels and to the BLAS libraries as raw
//! pointers, and kernels and graphs are launched.

#[cfg(feature = "cuda")]
mod blas;
#[cfg(feature = "cuda")]
pub mod blaslt;
pub mod codegen;
#[cfg(feature = "cuda")]
mod context;
#[cfg(feature = "cuda")]
pub mod cubin_cache;
#[cfg(feature = "cuda")]
mod executable;
pub mod gemm;
#[cfg(feature = "cuda")]
mod memory;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
mod replay;
#[cfg(feature = "cuda")]
mod runs;

#[cfg(feature = "cuda")]
pub use context::{Gpu, gpu};
#[cfg(feature = "cuda")]
pub use executable::Executable;
#[cfg(feature = "cuda")]
pub use memory::{Copier, Feeder, Resident};

/// GPU `ordinal` as a backend.
#[cfg(feature = "cuda")]
pub struct Cuda {
    /// The device's ordinal, as CUDA counts them.
    pub ordinal: usize,
}

#[cfg(feature = "cuda")]
impl crate::Backend for Cuda {
    fn compile(
        &self,
        optimized: kiln_ir::pass::Optimized,
        options: crate::BackendOptions,
    ) -> Result<Box<dyn crate::Executable>, crate::Error> {
        let gpu = gpu(self.ordinal)?;
        Ok(Box::new(Executable::new(optimized, gpu, options)?))
    }

    /// Its executables write each donated output over its input, on the
    /// device as the CPU does on the host.
    fn donates(&self) -> bool {
        true
    }

    /// Blocks enough for every multiprocessor of an H100 or H200 (132) to
    /// hold several: `sum(x)` over `[4096, 4096]` split in 32 kept 32
    /// blocks busy and read far below the memory's bandwidth
    /// (`benches/RESULTS-cuda.md`).
    fn parallel(&self) -> usize {
        1024
    }

    fn alloc(&self, op: &str, ty: &kiln_ir::TensorType) -> Result<crate::Storage, crate::Error> {
        let value = Resident::alloc(&gpu(self.ordinal)?, op, ty)?;
        Ok(crate::Storage::Cuda(std::sync::Arc::new(value)))
    }

    /// Copies `data` into the device's memory, on its compute stream.
    fn store(
        &self,
        ty: &kiln_ir::TensorType,
        data: std::sync::Arc<kiln_ir::Data>,
    ) -> Result<crate::Storage, crate::Error> {
        let value = Resident::upload(&gpu(self.ordinal)?, data.as_ref().into(), ty, "to")?;
        Ok(crate::Storage::Cuda(std::sync::Arc::new(value)))
    }

    /// Batches copied in through pinned memory on a copy stream.
    fn feed(&self) -> Result<Box<dyn crate::Feed>, crate::Error> {
        Ok(Box::new(Feeder::new(gpu(self.ordinal)?)?))
    }

    fn holds(&self, storage: &crate::Storage) -> bool {
        matches!(storage, crate::Storage::Cuda(v) if v.ordinal() == self.ordinal)
    }

    fn synchronize(&self) -> Result<(), crate::Error> {
        let gpu = gpu(self.ordinal)?;
        gpu.bind()?;
        gpu.wait("synchronizing")
    }

    fn stats(&self) -> Result<crate::MemoryStats, crate::Error> {
        Ok(gpu(self.ordinal)?.stats())
    }
}
