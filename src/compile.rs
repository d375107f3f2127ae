//! `kiln::compile`: trace a function once, run it many times.
//!
//! The function is called once on placeholder tensors of the given types;
//! what it records is optimized and compiled for a device (the CPU unless
//! told otherwise). Each call of the `CompiledGraph` then only checks its
//! inputs and launches the kernels, with intermediate buffers reused from
//! the memory plan: no tracing, optimizing, compiling or intermediate
//! allocation per call. Tensors the function captures (weights) are baked
//! in as the values they hold at compile time, moved to the device once;
//! what it computes from captured values alone (a weight reordered or
//! scaled) is computed then too, once, on the CPU (`fold`).

use std::sync::Arc;

use smallvec::SmallVec;

use kiln_ir::pass::{Optimized, Options};
use kiln_ir::{Data, DataRef, TensorType};

use kiln_runtime::{Arg, BackendOptions, Executable, Storage};

use crate::backend::{backend, compile_graph, store};
use crate::tensor::{Source, capture_with_data};
use crate::{Device, Result, Tensor, fold};

/// A traced and compiled function of tensors.
pub struct CompiledGraph {
    exec: Box<dyn Executable>,
    device: Device,
    /// Per graph input: a call's argument (by spec) or a captured value.
    inputs: Vec<Input>,
    specs: Vec<TensorType>,
    /// Per spec: its position among a call's arguments, or the donated
    /// buffer it is (`run_stored`).
    args: Vec<Argument>,
}

/// Where the value of a graph input comes from.
enum Input {
    /// The call's argument for this spec.
    Spec(usize),
    /// A value the function captured: as the tensor held it (read on the
    /// host by runs on host data) and where the device keeps it (read by
    /// runs on storage); on the CPU both are the same `Arc`.
    Captured { given: Storage, stored: Storage },
}

/// How a call passes the value of one spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Argument {
    /// Among the arguments, at this position.
    At(usize),
    /// As donated buffer `j`, which the run overwrites with an output.
    Donated(usize),
}

/// Where and how a traced function is compiled, in one value (as JAX's
/// `jit(f, device=...)`): the device it runs on, what the optimizer may do
/// (`fusion: false`, the unfused baseline of benchmarks; the backend sets
/// `parallel` from its own facts), and how the backend computes (a GPU's matmul precision). The default is the
/// CPU with fusion on. On `Device::Reference` the interpreter runs the
/// fused graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileOptions {
    /// Where the compiled graph runs.
    pub device: Device,
    /// What the optimizer may do.
    pub optimizer: Options,
    /// How the backend computes.
    pub backend: BackendOptions,
}

impl CompileOptions {
    /// The default options on `device`.
    pub fn on(device: Device) -> CompileOptions {
        CompileOptions {
            device,
            ..CompileOptions::default()
        }
    }
}

/// Traces `f` on placeholders of `specs` and compiles the result for the
/// CPU with fusion on.
pub fn compile(
    name: &str,
    specs: &[TensorType],
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<CompiledGraph> {
    compile_with(name, specs, CompileOptions::default(), f)
}

/// `compile` where and how `options` says.
pub fn compile_with(
    name: &str,
    specs: &[TensorType],
    options: CompileOptions,
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<CompiledGraph> {
    compile_donating(name, specs, options, 0, f)
}

/// `compile_with` for a step: the last `state` outputs are the new values of
/// the first `state` arguments, each written over the argument it replaces
/// where the backend can and the graph allows it (`kiln_ir::pass::donate`).
/// Those arguments are passed to `run_stored` as storage it overwrites.
pub(crate) fn compile_donating(
    name: &str,
    specs: &[TensorType],
    options: CompileOptions,
    state: usize,
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<CompiledGraph> {
    let device = options.device;
    let placeholders: Vec<Tensor> = specs
        .iter()
        .enumerate()
        .map(|(i, ty)| Ok(Tensor::placeholder(ty.clone().checked("compile")?, i)))
        .collect::<Result<_>>()?;
    let outputs = f(&placeholders)?;
    let refs: Vec<&Tensor> = outputs.iter().collect();
    let (graph, sources) = capture_with_data(name, &refs);
    let (graph, sources) = match fold::captured(&graph, &sources, device)? {
        Some(folded) => folded,
        None => (graph, sources),
    };
    let input_of = |spec: usize| {
        let placeholder = |s: &Source| matches!(s, Source::Placeholder(i) if *i == spec);
        sources.iter().position(placeholder)
    };
    // A spec the function never reads is no graph input: nothing to donate.
    let first_new = outputs.len().saturating_sub(state);
    let pairs: Vec<(u32, u32)> = (0..state)
        .filter_map(|k| input_of(k).map(|i| (i as u32, (first_new + k) as u32)))
        .collect();
    let mut exec = compile_graph(&graph, options, &pairs)?;
    let inputs = (sources.iter().zip(&graph.inputs))
        .map(|(source, ty)| {
            Ok(match source {
                Source::Placeholder(spec) => Input::Spec(*spec),
                Source::Data(storage) => Input::Captured {
                    stored: store(device, ty, storage.clone())?,
                    given: storage.clone(),
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // A captured value on the host is the same buffer on every run, held
    // unchanged while this graph holds it: the executable may prepare what
    // it reads of it once (the CPU packs a weight for its GEMM).
    for (i, input) in inputs.iter().enumerate() {
        if let Input::Captured { stored, .. } = input
            && let Some(value) = stored.as_host()
        {
            exec.constant(i, value)?;
        }
    }
    let donated = &exec.optimized().schedule.donated;
    let mut passed = 0;
    let args = (0..specs.len())
        .map(|spec| {
            let given = input_of(spec).and_then(|i| donated.iter().position(|p| p.0 as usize == i));
            match given {
                Some(j) => Argument::Donated(j),
                None => {
                    passed += 1;
                    Argument::At(passed - 1)
                }
            }
        })
        .collect();
    Ok(CompiledGraph {
        exec,
        device,
        inputs,
        specs: specs.to_vec(),
        args,
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
    /// `output_buffers`): a call that allocates no tensor memory. On a GPU
    /// the inputs are copied in and the outputs out; `call` keeps values
    /// on the device.
    pub fn run_into<'a>(
        &mut self,
        inputs: &[impl Into<DataRef<'a>> + Copy],
        outputs: &mut [Data],
    ) -> Result<()> {
        let inputs: SmallVec<[DataRef; 4]> = inputs.iter().map(|&i| i.into()).collect();
        // Shared where the captured values are on the host, copied out of
        // a device where they are there.
        let captured: Vec<Arc<Data>> = (self.inputs.iter())
            .filter_map(|input| match input {
                Input::Captured { given, .. } => Some(given.to_host()),
                Input::Spec(_) => None,
            })
            .collect::<std::result::Result<_, _>>()?;
        let captured: Vec<DataRef> = captured.iter().map(|d| d.as_ref().into()).collect();
        let args = arguments(
            &self.inputs,
            &self.args,
            self.exec.as_ref(),
            &inputs,
            &captured,
        )?;
        let mut outputs: SmallVec<[&mut Data; 4]> = outputs.iter_mut().collect();
        Ok(self.exec.run_donated(&mut [], &args, &mut outputs)?)
    }

    /// A run on storage (`Executable::run_stored`): `donated` holds the
    /// values of the donated arguments (in the order of `donated_specs`)
    /// and receives the outputs written over them; `inputs` are the other
    /// arguments and `outputs` the other outputs, kept where the device
    /// keeps values.
    pub(crate) fn run_stored(
        &mut self,
        donated: &mut [Storage],
        inputs: &[Arg<'_>],
        outputs: &mut [Storage],
    ) -> Result<()> {
        let captured: Vec<Arg> = (self.inputs.iter())
            .filter_map(|input| match input {
                Input::Captured { stored, .. } => Some(Arg::Stored(stored)),
                Input::Spec(_) => None,
            })
            .collect();
        let args = arguments(
            &self.inputs,
            &self.args,
            self.exec.as_ref(),
            inputs,
            &captured,
        )?;
        Ok(self.exec.run_stored(donated, &args, outputs)?)
    }

    /// Storage on the graph's device for each output not written over a
    /// donated argument: the `outputs` of `run_stored`.
    pub(crate) fn output_storage(&self) -> Result<Vec<Storage>> {
        let backend = backend(self.device)?;
        let optimized = self.exec.optimized();
        let donated = |k: usize| optimized.schedule.donated.iter().any(|p| p.1 as usize == k);
        (self.exec.output_types().iter().enumerate())
            .filter(|&(k, _)| !donated(k))
            .map(|(_, ty)| Ok(backend.alloc(&optimized.graph.name, ty)?))
            .collect()
    }

    /// The device it runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Per spec: the donated storage `run_stored` takes its value in, if any.
    pub(crate) fn donated_specs(&self) -> Vec<Option<usize>> {
        let donated = |&a: &Argument| match a {
            Argument::Donated(j) => Some(j),
            Argument::At(_) => None,
        };
        self.args.iter().map(donated).collect()
    }

    /// Runs the graph on tensors, realizing them first, and returns its
    /// outputs as tensors on the graph's device. On a GPU nothing waits:
    /// inputs already there are read there, others are copied in, and the
    /// outputs stay there until they are read.
    pub fn call(&mut self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let stored: Vec<Storage> = inputs.iter().map(|t| t.storage()).collect::<Result<_>>()?;
        let args: Vec<Arg> = stored.iter().map(Arg::Stored).collect();
        let mut outputs = self.output_storage()?;
        self.run_stored(&mut [], &args, &mut outputs)?;
        let types = self.exec.output_types().to_vec();
        Ok(outputs
            .into_iter()
            .zip(types)
            .map(|(storage, ty)| Tensor::from_storage(ty, storage, self.device))
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
    /// `run_into` and returns the device's own time for them in seconds;
    /// `None` on the host, where a call is timed by the clock.
    pub fn device_time(&mut self) -> Result<Option<f64>> {
        Ok(self.exec.device_time()?)
    }
}

/// Every graph input the executable is given: the call's arguments where
/// the trace had placeholders (donated ones aside), the captured values
/// (`captured`, in order) elsewhere. Argument types are checked by the
/// executable; here only their number.
fn arguments<T: Copy>(
    sources: &[Input],
    args: &[Argument],
    exec: &dyn Executable,
    inputs: &[T],
    captured: &[T],
) -> Result<Vec<T>> {
    let expected = args.iter().filter(|a| matches!(a, Argument::At(_))).count();
    if inputs.len() != expected {
        return Err(kiln_runtime::Error::Count {
            graph: exec.optimized().graph.name.clone(),
            what: "argument",
            expected,
            got: inputs.len(),
        }
        .into());
    }
    let mut captured = captured.iter();
    Ok(sources
        .iter()
        .filter_map(|s| match s {
            Input::Captured { .. } => captured.next().copied(),
            Input::Spec(i) => match args[*i] {
                Argument::At(k) => Some(inputs[k]),
                Argument::Donated(_) => None,
            },
        })
        .collect())
}
