//! The CUDA backend: kernels printed as CUDA C (`codegen`) from the same
//! kernel IR as the CPU backend's, compiled by NVRTC to a CUBIN for the
//! device's own architecture (feature `cuda`).

#[cfg(feature = "cuda")]
pub mod blaslt;
pub mod codegen;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod nvrtc;

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
        let gpu = device::device(self.ordinal)?;
        Ok(Box::new(device::Executable::new(
            optimized,
            gpu,
            options.precision,
        )?))
    }
}

#[cfg(feature = "cuda")]
impl crate::Executable for device::Executable {
    fn optimized(&self) -> &kiln_ir::pass::Optimized {
        device::Executable::optimized(self)
    }

    fn output_types(&self) -> &[kiln_ir::TensorType] {
        device::Executable::output_types(self)
    }

    fn launches(&self) -> usize {
        device::Executable::launches(self)
    }

    fn run_into(
        &mut self,
        inputs: &[kiln_ir::DataRef<'_>],
        outputs: &mut [kiln_ir::Data],
    ) -> Result<(), crate::Error> {
        device::Executable::run_into(self, inputs, outputs)
    }

    fn device_time(&mut self) -> Result<Option<f64>, crate::Error> {
        self.launch_all().map(Some)
    }
}
