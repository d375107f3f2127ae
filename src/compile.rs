//! `kiln::compile`: trace a function once, run it many times.
//!
//! The function is called once on placeholder tensors of the given types;
//! what it records is optimized and compiled for the CPU. Each call of the
//! `CompiledGraph` then only checks its inputs and launches the kernels, with
//! intermediate buffers reused from the memory plan: no tracing, optimizing,
//! compiling or intermediate allocation per call. Tensors the function
//! captures (weights) are baked in as the values they hold at compile time.

use std::sync::Arc;

use smallvec::SmallVec;

use kiln_ir::pass::{Optimized, Options};
use kiln_ir::{Data, DataRef, TensorType};

use crate::tensor::{Source, capture_with_data, compile_graph};
use crate::{Device, Result, Tensor};

/// A fused graph compiled for one device.
pub(crate) enum Executable {
    Cpu(kiln_runtime::cpu::Executable),
    #[cfg(feature = "cuda")]
    Cuda(kiln_runtime::cuda::Executable),
}

impl Executable {
    pub(crate) fn run_into(&mut self, inputs: &[DataRef<'_>], outputs: &mut [Data]) -> Result<()> {
        match self {
            Executable::Cpu(e) => e.run_into(inputs, outputs)?,
            #[cfg(feature = "cuda")]
            Executable::Cuda(e) => e.run_into(inputs, outputs)?,
        }
        Ok(())
    }

    pub(crate) fn output_types(&self) -> &[TensorType] {
        match self {
            Executable::Cpu(e) => e.output_types(),
            #[cfg(feature = "cuda")]
            Executable::Cuda(e) => e.output_types(),
        }
    }

    pub(crate) fn output_buffers(&self) -> Vec<Data> {
        self.output_types()
            .iter()
            .map(|t| Data::zeros(t.dtype, t.shape.numel()))
            .collect()
    }

    fn optimized(&self) -> &Optimized {
        match self {
            Executable::Cpu(e) => e.optimized(),
            #[cfg(feature = "cuda")]
            Executable::Cuda(e) => e.optimized(),
        }
    }
}

/// A traced and compiled function of tensors.
pub struct CompiledGraph {
    exec: Executable,
    /// Per graph input: a call argument (by position) or captured data.
    sources: Vec<Source>,
    specs: Vec<TensorType>,
}

/// Traces `f` on placeholders of `specs` and compiles the result with the
/// default options (fusion on).
pub fn compile(
    name: &str,
    specs: &[TensorType],
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<CompiledGraph> {
    compile_with(name, specs, Options::default(), f)
}

/// `compile` with explicit optimizer options (`Options { fusion: false }`
/// for the unfused baseline of benchmarks).
pub fn compile_with(
    name: &str,
    specs: &[TensorType],
    options: Options,
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<CompiledGraph> {
    compile_on(Device::Cpu, name, specs, options, f)
}

/// `compile_with` for `device` (the CPU, or with feature `cuda` a GPU);
/// `Device::Reference` only interprets and is an `Err`.
pub fn compile_on(
    device: Device,
    name: &str,
    specs: &[TensorType],
    options: Options,
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<CompiledGraph> {
    let placeholders: Vec<Tensor> = specs
        .iter()
        .enumerate()
        .map(|(i, ty)| Ok(Tensor::placeholder(ty.clone().checked("compile")?, i)))
        .collect::<Result<_>>()?;
    let outputs = f(&placeholders)?;
    let refs: Vec<&Tensor> = outputs.iter().collect();
    let (graph, sources) = capture_with_data(name, &refs);
    let exec = compile_graph(&graph, options, device)?;
    Ok(CompiledGraph {
        exec,
        sources,
        specs: specs.to_vec(),
    })
}

impl CompiledGraph {
    /// Runs the graph on `inputs` (of the compiled types, in order: `&Data`,
    /// or `DataRef`s such as a loader's batch) and returns fresh output
    /// buffers.
    pub fn run<'a>(&mut self, inputs: &[impl Into<DataRef<'a>> + Copy]) -> Result<Vec<Data>> {
        let mut outputs = self.exec.output_buffers();
        self.run_into(inputs, &mut outputs)?;
        Ok(outputs)
    }

    /// Runs the graph on `inputs`, writing into `outputs` (made once by
    /// `output_buffers`): a call that allocates nothing.
    pub fn run_into<'a>(
        &mut self,
        inputs: &[impl Into<DataRef<'a>> + Copy],
        outputs: &mut [Data],
    ) -> Result<()> {
        let inputs: SmallVec<[DataRef; 4]> = inputs.iter().map(|&i| i.into()).collect();
        let args = arguments(&self.sources, &self.specs, &self.exec, &inputs)?;
        self.exec.run_into(&args, outputs)
    }

    /// Runs the graph on tensors, realizing them first.
    pub fn call(&mut self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let data: Vec<Arc<Data>> = inputs
            .iter()
            .map(|t| t.data_of_any_dtype())
            .collect::<Result<_>>()?;
        let refs: Vec<&Data> = data.iter().map(|d| d.as_ref()).collect();
        let outputs = self.run(&refs)?;
        let types = self.exec.output_types().to_vec();
        Ok(outputs
            .into_iter()
            .zip(types)
            .map(|(d, ty)| Tensor::from_data(ty, d))
            .collect())
    }

    /// Output buffers of the right types, to pass to `run_into`.
    pub fn output_buffers(&self) -> Vec<Data> {
        self.exec.output_buffers()
    }

    /// The types of the inputs a call takes.
    pub fn input_types(&self) -> &[TensorType] {
        &self.specs
    }

    /// The fused graph and its schedule.
    pub fn optimized(&self) -> &Optimized {
        self.exec.optimized()
    }
}

/// Every graph input: the call's arguments where the trace had placeholders,
/// the captured data elsewhere. Argument types are checked by the
/// executable; here only their number.
fn arguments<'a>(
    sources: &'a [Source],
    specs: &[TensorType],
    exec: &Executable,
    inputs: &[DataRef<'a>],
) -> Result<Vec<DataRef<'a>>> {
    if inputs.len() != specs.len() {
        return Err(kiln_runtime::Error::Count {
            graph: exec.optimized().graph.name.clone(),
            what: "argument",
            expected: specs.len(),
            got: inputs.len(),
        }
        .into());
    }
    Ok(sources
        .iter()
        .map(|s| match s {
            Source::Data(d) => d.as_ref().into(),
            Source::Placeholder(i) => inputs[*i],
        })
        .collect())
}
