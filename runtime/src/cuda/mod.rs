//! The CUDA backend: kernels printed as CUDA C (`codegen`) from the same
//! kernel IR as the CPU backend's, a matmul planned as prologue kernels, a
//! GEMM and an epilogue (`plan`), compiled by NVRTC to a CUBIN for the
//! device's own architecture (feature `cuda`).

#[cfg(feature = "cuda")]
pub mod blaslt;
pub mod codegen;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod nvrtc;
pub mod plan;
