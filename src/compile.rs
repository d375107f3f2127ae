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

use kiln_runtime::{BackendOptions, Executable};

use crate::backend::compile_graph;
use crate::tensor::{Source, capture_with_data};
use crate::{Device, Result, Tensor};

/// A traced and compiled function of tensors.
pub struct CompiledGraph {
    exec: Box<dyn Executable>,
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
    compile_on(
        Device::Cpu,
        name,
        specs,
        options,
        BackendOptions::default(),
        f,
    )
}

/// `compile_with` for `device`, with the backend's own options (how a GPU's
/// matmuls compute). On `Device::Reference` the interpreter runs the fused
/// graph.
pub fn compile_on(
    device: Device,
    name: &str,
    specs: &[TensorType],
    options: Options,
    backend_options: BackendOptions,
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
    let exec = compile_graph(&graph, options, backend_options, device)?;
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
        let mut outputs = self.exec.output_buffers()?;
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
        let args = arguments(&self.sources, &self.specs, self.exec.as_ref(), &inputs)?;
        Ok(self.exec.run_into(&args, outputs)?)
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
    pub fn output_buffers(&self) -> Result<Vec<Data>> {
        Ok(self.exec.output_buffers()?)
    }

    /// The types of the inputs a call takes.
    pub fn input_types(&self) -> &[TensorType] {
        &self.specs
    }

    /// The fused graph and its schedule.
    pub fn optimized(&self) -> &Optimized {
        self.exec.optimized()
    }

    /// Kernel launches per call (on a GPU a row group launches once, a
    /// matmul may launch several).
    pub fn launches(&self) -> usize {
        self.exec.launches()
    }

    /// For benchmarks: runs the kernels again on the inputs of the last
    /// call and returns the device's own time for them in seconds; `None`
    /// on the host, where a call is timed by the clock.
    pub fn device_time(&mut self) -> Result<Option<f64>> {
        Ok(self.exec.device_time()?)
    }
}

/// Every graph input: the call's arguments where the trace had placeholders,
/// the captured data elsewhere. Argument types are checked by the
/// executable; here only their number.
fn arguments<'a>(
    sources: &'a [Source],
    specs: &[TensorType],
    exec: &dyn Executable,
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
