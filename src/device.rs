//! Devices: where a tensor's graph is evaluated.

/// The machine that realizes a tensor.
///
/// An op's result lives on its operands' device; where they differ, the one
/// that is not the default wins, so a computation moved to `Reference` for
/// debugging stays there even as constants (made on the default device)
/// join it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host CPU: kernels compiled by Cranelift, cached, run on all cores.
    #[default]
    Cpu,
    /// The reference interpreter of kiln-ir: slow, exact (f64 accumulation),
    /// and the oracle every other backend is tested against. It runs the
    /// optimized graph, as the other devices do; that the optimizer never
    /// changes a result is checked by interpreting graphs before and after
    /// it (`ir/tests/optimize_prop.rs`).
    Reference,
    /// NVIDIA GPU `n`: kernels printed as CUDA C, compiled by NVRTC, matmuls
    /// through cuBLASLt (TF32, or f32 as `BackendOptions::precision` says).
    /// Tensors realized there keep their values in the GPU's memory until
    /// they are read (`to_vec`, `to_scalar`, `to(Device::Cpu)`), and
    /// launches are queued on its stream: the host waits only where it
    /// reads. In a kiln built without feature `cuda` the variant still
    /// exists, and using it is an `Err`.
    Cuda(usize),
}
