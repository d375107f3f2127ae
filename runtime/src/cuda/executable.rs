//! A fused graph compiled for one GPU: each launch of its schedule made a
//! step (a generated kernel, a row group's kernel, or a matmul's prologues,
//! GEMM and epilogue), device buffers for its memory plan, and runs: on
//! values that live on the device (`run_stored`: enqueued, nothing copied
//! but host inputs, no wait), on host data (`run_donated`: copied in and
//! out), timed (`launch_all`), or with the next inputs staged while the
//! current ones compute (`prepare`, `launch_prepared`, `finish`).
//!
//! Kernels write each graph output straight into the buffer that holds it
//! after the run (a donated input's, for an output written over it), as on
//! the CPU; the memory plan's slots hold the values in between.
//!
//! Every launch is made safe by the checks before it: buffer lengths
//! against the kernel's types (the generated code reads and writes only
//! through index maps the verifier bounded), and GEMM dimensions against
//! the buffers they stride through.

#![allow(unsafe_code)]

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use kiln_ir::kernel::KernelKind;
use kiln_ir::pass::Optimized;
use kiln_ir::{Data, DataRef, Op, TensorType};

use super::codegen::{self, FLAT_THREADS, Grid};
use super::context::{Gpu, driver};
use super::memory::{Buffer, Resident, Staging, fill, host_bytes};
use super::plan::{self, Gemm as GemmPlan, GemmEpilogue, GemmOperand, OperandSource};
use super::{blas, blaslt};
use crate::backend::{Place, Places, Precision};
use crate::bind::{Bindings, Bound};
use crate::storage::{Arg, Storage};
use crate::{Error, check, check_run, sizes};

/// The launch configuration of a generated kernel's grid.
fn launch_config(grid: Grid) -> Option<LaunchConfig> {
    let (blocks, threads) = match grid {
        Grid::Flat { steps } => {
            // A thread per step: no slower than a grid capped at 16 blocks per
            // multiprocessor, whose grid-stride loop makes each thread walk
            // several vectors (`benches/RESULTS-cuda.md`). Past the grid's
            // limit the loop covers the rest.
            let most = i32::MAX as usize;
            (
                steps.div_ceil(FLAT_THREADS as usize).min(most),
                FLAT_THREADS,
            )
        }
        Grid::Rows { rows, threads } => (rows.min(1 << 20), threads),
    };
    (blocks > 0).then_some(LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// What runs the launches of the schedule it covers (`Executable::steps`).
// Steps are made once per compiled graph; boxing the matmul's plan would
// only add an indirection to every run.
#[allow(clippy::large_enum_variant)]
enum Step {
    /// A generated kernel: one launch's, or a row group's (its parameters
    /// are each launch's inputs, then its output, launch by launch).
    Kernel { function: CudaFunction, grid: Grid },
    /// Operand prologues, a GEMM, and maybe an epilogue kernel, with the
    /// scratch memory they share.
    MatMul {
        prologues: Vec<(CudaFunction, Grid)>,
        gemm: GemmPlan,
        /// The cuBLASLt product, in TF32.
        lt: Option<blaslt::Matmul>,
        epilogue: GemmEpilogue,
        epilogue_function: Option<CudaFunction>,
        scratch: Buffer,
    },
}

/// A fused graph compiled for one GPU, with device buffers for every slot
/// of its memory plan, and for the inputs and outputs of runs on host
/// data, reused by every run.
pub struct Executable {
    gpu: Arc<Gpu>,
    optimized: Optimized,
    precision: Precision,
    /// Each step with the launches of the schedule it runs.
    steps: Vec<(Range<usize>, Step)>,
    /// Where each run's inputs and outputs are, donated or not.
    places: Places,
    /// Which buffer each launch reads and writes.
    bindings: Bindings,
    /// The device buffers of runs on host data, once there has been one.
    host: Option<HostBuffers>,
    slots: Vec<Buffer>,
    outputs: Vec<TensorType>,
    /// The next run's inputs, on their way to the device (`prepare`).
    staging: Option<Staging>,
}

impl crate::Executable for Executable {
    fn optimized(&self) -> &Optimized {
        &self.optimized
    }

    /// Kernel launches per run: a row group is one, a matmul its operand
    /// prologues, its GEMM and its epilogue kernel if it has one.
    fn launches(&self) -> usize {
        self.steps
            .iter()
            .map(|(_, step)| match step {
                Step::Kernel { .. } => 1,
                Step::MatMul {
                    prologues,
                    epilogue_function,
                    ..
                } => prologues.len() + 1 + usize::from(epilogue_function.is_some()),
            })
            .sum()
    }

    fn output_types(&self) -> &[TensorType] {
        &self.outputs
    }

    /// Copies the inputs (donated or not) to the device, runs every launch
    /// on the device's stream, and copies the outputs back, each donated
    /// one into its input.
    fn run_donated(
        &mut self,
        donated: &mut [&mut Data],
        inputs: &[DataRef<'_>],
        outputs: &mut [&mut Data],
    ) -> Result<(), Error> {
        let given = inputs.iter().map(|d| (d.dtype(), d.len()));
        check_run(
            &self.optimized,
            &self.outputs,
            sizes(donated),
            given,
            sizes(outputs),
        )?;
        let given: Vec<DataRef<'_>> = (self.places.inputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => DataRef::from(&*donated[j]),
                Place::Own(m) => inputs[m],
            })
            .collect();
        self.upload(&given)?;
        self.enqueue_host()?;
        self.download(donated, outputs)
    }

    /// Runs every launch on the device's storage, waiting for nothing:
    /// host inputs are copied in (into buffers that go back to the pool,
    /// in the stream's order, after the run), device values are read where
    /// they are, and each output is written into device memory of its own
    /// (`outputs[m]`, replaced by new memory where another holder shares
    /// it) or over its donated input (`donated[j]`, copied on the device
    /// first where another holder shares it).
    fn run_stored(
        &mut self,
        donated: &mut [Storage],
        inputs: &[Arg<'_>],
        outputs: &mut [Storage],
    ) -> Result<(), Error> {
        let name = self.optimized.graph.name.clone();
        let size = |s: &Storage| (s.dtype(), s.len());
        let given = inputs.iter().map(|a| (a.dtype(), a.len()));
        let (donated_sizes, output_sizes) = (donated.iter().map(size), outputs.iter().map(size));
        check_run(
            &self.optimized,
            &self.outputs,
            donated_sizes,
            given,
            output_sizes,
        )?;
        self.gpu.bind()?;
        for (j, storage) in donated.iter_mut().enumerate() {
            let ty = &self.optimized.graph.inputs[self.optimized.schedule.donated[j].0 as usize];
            self.own(storage, ty, &name, true)?;
        }
        let own_outputs: Vec<&TensorType> = (self.places.outputs.iter())
            .zip(&self.outputs)
            .filter(|(p, _)| matches!(p, Place::Own(_)))
            .map(|(_, t)| t)
            .collect();
        for (storage, ty) in outputs.iter_mut().zip(own_outputs) {
            self.own(storage, ty, &name, false)?;
        }
        // Host inputs, and values of another device, copied in.
        let mut copied: Vec<Buffer> = Vec::new();
        for arg in inputs {
            copied.extend(self.copied_in(arg, &name)?);
        }
        let mut copied = copied.iter();
        let mut given: Vec<&Buffer> = Vec::with_capacity(inputs.len());
        for arg in inputs {
            given.push(match arg {
                Arg::Stored(Storage::Cuda(v)) if v.ordinal() == self.gpu.ordinal => &v.buffer,
                _ => copied
                    .next()
                    .ok_or_else(|| Error::Launch("an input lost on its way in".into()))?,
            });
        }
        let donated: Vec<&Buffer> = donated.iter().map(resident).collect::<Result<_, _>>()?;
        let own: Vec<&Buffer> = outputs.iter().map(resident).collect::<Result<_, _>>()?;
        let input_at: Vec<&Buffer> = (self.places.inputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => donated[j],
                Place::Own(m) => given[m],
            })
            .collect();
        let output_at: Vec<&Buffer> = (self.places.outputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => donated[j],
                Place::Own(m) => own[m],
            })
            .collect();
        self.enqueue(&input_at, &output_at)
    }

    fn device_time(&mut self) -> Result<Option<f64>, Error> {
        self.launch_all().map(Some)
    }
}

/// The device buffers of runs on host data: one per graph input, one per
/// graph output (empty for a donated output, which is written into its
/// input's buffer).
struct HostBuffers {
    inputs: Vec<Buffer>,
    outputs: Vec<Buffer>,
}

/// The device buffer of storage made this GPU's own (`Executable::own`).
fn resident(storage: &Storage) -> Result<&Buffer, Error> {
    match storage {
        Storage::Cuda(v) => Ok(&v.buffer),
        Storage::Host(_) => Err(Error::Launch("a host value among device outputs".into())),
    }
}

/// The buffers one launch reads and writes.
struct Operands<'a> {
    args: Vec<&'a Buffer>,
    out: &'a Buffer,
    side: Vec<&'a Buffer>,
}

impl Executable {
    /// Generates, compiles (or takes from the device's cache) and plans
    /// every kernel of `optimized` for `gpu`.
    pub fn new(
        optimized: Optimized,
        gpu: Arc<Gpu>,
        precision: Precision,
    ) -> Result<Executable, Error> {
        gpu.bind()?;
        let graph = &optimized.graph;
        let schedule = &optimized.schedule;
        let kernel = |i: usize| match &graph.node(schedule.launches[i].node).op {
            Op::Kernel(kernel) => Ok(kernel.as_ref()),
            _ => Err(Error::Launch(format!(
                "{} is not a kernel",
                schedule.launches[i].node
            ))),
        };
        let bindings = Bindings::new(&optimized);
        let places = Places::new(&optimized);
        // The kernel of launches that write an output over a donated input
        // (which they read) is compiled for aliased parameters.
        let over_input = |b: &Bound| matches!(b, Bound::Output(k) if matches!(places.outputs[*k], Place::Donated(_)));
        let compiled = |program: &codegen::Program, launches: Range<usize>| {
            let aliased = bindings.launches[launches]
                .iter()
                .any(|b| over_input(&b.out) || b.side.iter().any(over_input));
            match aliased {
                true => gpu.function(&program.aliased().code),
                false => gpu.function(&program.code),
            }
        };
        let mut steps = Vec::with_capacity(schedule.launches.len());
        for group in crate::rows::row_groups(graph, schedule) {
            if let Some(program) = codegen::row_group_of(&optimized, group.clone())? {
                let function = compiled(&program, group.clone())?;
                let grid = program.grid;
                steps.push((group, Step::Kernel { function, grid }));
                continue;
            }
            for i in group {
                let kernel = kernel(i)?;
                steps.push((
                    i..i + 1,
                    match kernel.kind {
                        KernelKind::MatMul { .. } => {
                            let plan = plan::matmul(kernel, precision == Precision::Tf32)?;
                            let prologues = plan
                                .prologues
                                .iter()
                                .map(|p| Ok((gpu.function(&p.code)?, p.grid)))
                                .collect::<Result<_, Error>>()?;
                            let (epilogue_function, fused) = match &plan.epilogue {
                                GemmEpilogue::Kernel { program, .. } => {
                                    (Some(compiled(program, i..i + 1)?), blaslt::Epilogue::None)
                                }
                                GemmEpilogue::None => (None, blaslt::Epilogue::None),
                                GemmEpilogue::Bias { relu: false, .. } => {
                                    (None, blaslt::Epilogue::Bias)
                                }
                                GemmEpilogue::Bias { relu: true, .. } => {
                                    (None, blaslt::Epilogue::BiasRelu)
                                }
                            };
                            let g = &plan.gemm;
                            let lt = (precision == Precision::Tf32
                                && [g.m, g.n, g.k, g.batches].iter().all(|&d| d > 0))
                            .then(|| blaslt::Matmul::new(g.column_major(), fused))
                            .transpose()?;
                            Step::MatMul {
                                prologues,
                                lt,
                                scratch: gpu.alloc(plan.scratch_bytes)?,
                                gemm: plan.gemm,
                                epilogue: plan.epilogue,
                                epilogue_function,
                            }
                        }
                        KernelKind::Elementwise | KernelKind::Reduce { .. } => {
                            let program = codegen::kernel(kernel)?;
                            Step::Kernel {
                                function: compiled(&program, i..i + 1)?,
                                grid: program.grid,
                            }
                        }
                    },
                ));
            }
        }
        // Graph outputs are written into the buffers that hold them after
        // the run: a slot that only they use needs no memory here.
        let slots = (optimized.schedule.slots.iter().zip(&bindings.used))
            .map(|(&bytes, &used)| gpu.alloc(if used { bytes } else { 0 }))
            .collect::<Result<_, Error>>()?;
        let outputs = graph.output_types();
        Ok(Executable {
            gpu,
            places,
            optimized,
            precision,
            steps,
            bindings,
            host: None,
            slots,
            outputs,
            staging: None,
        })
    }

    /// The device buffers of runs on host data, made at the first.
    fn host_buffers(&mut self) -> Result<&mut HostBuffers, Error> {
        if self.host.is_none() {
            let bytes = |t: &TensorType| t.shape.numel() * t.dtype.size();
            let inputs = (self.optimized.graph.inputs.iter())
                .map(|t| self.gpu.alloc(bytes(t)))
                .collect::<Result<_, Error>>()?;
            // A donated output is written into its input's buffer.
            let outputs = (self.places.outputs.iter().zip(&self.outputs))
                .map(|(place, t)| match place {
                    Place::Own(_) => self.gpu.alloc(bytes(t)),
                    Place::Donated(_) => self.gpu.alloc(0),
                })
                .collect::<Result<_, Error>>()?;
            self.host = Some(HostBuffers { inputs, outputs });
        }
        self.host
            .as_mut()
            .ok_or_else(|| Error::Cuda("no host run buffers".into()))
    }

    /// The buffers of runs on host data, by graph input and by graph
    /// output (a donated output's is its input's).
    fn host_run(&self) -> Result<(Vec<&Buffer>, Vec<&Buffer>), Error> {
        let host = (self.host.as_ref())
            .ok_or_else(|| Error::Launch("a run on host data before any input".into()))?;
        let inputs: Vec<&Buffer> = host.inputs.iter().collect();
        let donated = &self.optimized.schedule.donated;
        let outputs: Vec<&Buffer> = (self.places.outputs.iter().zip(&host.outputs))
            .map(|(place, own)| match *place {
                Place::Donated(j) => &host.inputs[donated[j].0 as usize],
                Place::Own(_) => own,
            })
            .collect();
        Ok((inputs, outputs))
    }

    /// Enqueues every launch on the buffers of runs on host data.
    fn enqueue_host(&self) -> Result<(), Error> {
        let (inputs, outputs) = self.host_run()?;
        self.enqueue(&inputs, &outputs)
    }

    /// Makes `storage` device memory of this GPU for a value of `ty` that
    /// no one else holds: new memory where it is not, holding a copy of
    /// the value where `keep` asks for it (a donated input).
    fn own(
        &self,
        storage: &mut Storage,
        ty: &TensorType,
        op: &str,
        keep: bool,
    ) -> Result<(), Error> {
        let mine = match storage {
            Storage::Cuda(v) => {
                v.ordinal() == self.gpu.ordinal && std::sync::Arc::get_mut(v).is_some()
            }
            Storage::Host(_) => false,
        };
        if mine {
            return Ok(());
        }
        let value = match (&*storage, keep) {
            (Storage::Cuda(v), true) if v.ordinal() == self.gpu.ordinal => v.duplicate(op)?,
            (_, true) => Resident::upload(&self.gpu, storage.to_host()?.as_ref().into(), ty, op)?,
            (_, false) => Resident::alloc(&self.gpu, op, ty)?,
        };
        *storage = Storage::Cuda(std::sync::Arc::new(value));
        Ok(())
    }

    /// A device buffer holding an argument that is not on this GPU (host
    /// data, or a value of another device copied out), or `None` where it
    /// is.
    fn copied_in(&self, arg: &Arg<'_>, op: &str) -> Result<Option<Buffer>, Error> {
        match arg {
            Arg::Stored(Storage::Cuda(v)) if v.ordinal() == self.gpu.ordinal => Ok(None),
            Arg::Stored(s) => self.gpu.upload(s.to_host()?.as_ref().into(), op).map(Some),
            Arg::Host(d) => self.gpu.upload(*d, op).map(Some),
        }
    }

    /// How its matmuls compute.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Copies `inputs` (every graph input, donated or not) into the
    /// device buffers of runs on host data.
    pub fn upload(&mut self, inputs: &[DataRef<'_>]) -> Result<(), Error> {
        let graph = &self.optimized.graph;
        let given = inputs.iter().map(|d| (d.dtype(), d.len()));
        check(&graph.name, "input", &graph.inputs, given)?;
        self.gpu.bind()?;
        for (buffer, data) in self.host_buffers()?.inputs.iter_mut().zip(inputs) {
            buffer.write(&host_bytes(*data))?;
        }
        Ok(())
    }

    /// Runs every launch on the inputs last uploaded, waits for the device,
    /// and returns the device's time from the first launch's start to the
    /// last one's end, in seconds: the work alone, as a benchmark times it.
    pub fn launch_all(&self) -> Result<f64, Error> {
        self.gpu.timed(|| self.enqueue_host())
    }

    /// Starts copying `inputs` to the device for the next `launch_prepared`,
    /// on a stream of their own: called while the current launch computes
    /// (after `launch_prepared`, before `finish`), the copy overlaps it. The
    /// host data goes through pinned memory, so the caller's buffers are
    /// free again when this returns.
    pub fn prepare(&mut self, inputs: &[DataRef<'_>]) -> Result<(), Error> {
        self.undonated()?;
        let graph = &self.optimized.graph;
        let given = inputs.iter().map(|d| (d.dtype(), d.len()));
        check(&graph.name, "input", &graph.inputs, given)?;
        self.gpu.bind()?;
        self.host_buffers()?;
        if self.staging.is_none() {
            let types = &self.optimized.graph.inputs;
            self.staging = Some(Staging::new(&self.gpu, types)?);
        }
        let Some(staging) = self.staging.as_mut() else {
            return Err(Error::Cuda("no staging buffers".into()));
        };
        staging.stage(inputs)
    }

    /// Staged runs are for graphs with no donated input: a run writes a
    /// donated input, and a standby copy of it would be stale.
    fn undonated(&self) -> Result<(), Error> {
        match self.optimized.schedule.donated.is_empty() {
            true => Ok(()),
            false => Err(Error::Launch(format!(
                "{}: a graph with donated inputs runs on storage, not on staged inputs",
                self.optimized.graph.name
            ))),
        }
    }

    /// Launches the graph on the inputs of the last `prepare`, without
    /// waiting for it: `prepare` the next inputs meanwhile, then `finish`.
    /// Each `prepare` serves one launch: a second launch without one would
    /// run on inputs from two batches ago, and is an `Err`.
    pub fn launch_prepared(&mut self) -> Result<(), Error> {
        let stream = self.gpu.stream.clone();
        let staging = match self.staging.as_mut() {
            Some(s) if s.ready => s,
            _ => {
                return Err(Error::Launch(
                    "launch_prepared without a prepare since the last launch".into(),
                ));
            }
        };
        let Some(copied) = &staging.copied else {
            return Err(Error::Launch("launch_prepared before prepare".into()));
        };
        self.gpu.bind()?;
        stream
            .wait(copied)
            .map_err(|e| driver("ordering a launch after its copy", e))?;
        // Everything enqueued so far read the buffers that now go to standby.
        staging.released = stream
            .record_event(None)
            .map_err(|e| driver("recording a launch", e))?;
        staging.ready = false;
        let host = (self.host.as_mut())
            .ok_or_else(|| Error::Launch("launch_prepared before prepare".into()))?;
        std::mem::swap(&mut host.inputs, &mut staging.standby);
        self.enqueue_host()
    }

    /// Waits for the last launch and copies its outputs into `outputs`.
    pub fn finish(&self, outputs: &mut [Data]) -> Result<(), Error> {
        self.undonated()?;
        let mut outputs: Vec<&mut Data> = outputs.iter_mut().collect();
        let name = &self.optimized.graph.name;
        let given = outputs.iter().map(|d| (d.dtype(), d.len()));
        check(name, "output", &self.outputs, given)?;
        self.download(&mut [], &mut outputs)
    }

    /// Enqueues every launch on the device's stream, reading graph input
    /// `i` from `inputs[i]` and writing graph output `k` into
    /// `outputs[k]`, then copies the outputs that no kernel writes (graph
    /// inputs, and values that are an earlier output too) on the device.
    fn enqueue(&self, inputs: &[&Buffer], outputs: &[&Buffer]) -> Result<(), Error> {
        self.gpu.bind()?;
        let graph = &self.optimized.graph;
        if inputs.len() != graph.inputs.len() || outputs.len() != graph.outputs.len() {
            return Err(Error::Launch(format!(
                "{}: {} inputs and {} outputs for a graph of {} and {}",
                graph.name,
                inputs.len(),
                outputs.len(),
                graph.inputs.len(),
                graph.outputs.len()
            )));
        }
        // Every launch's buffers checked before the first is enqueued: a
        // run that fails leaves its outputs and donated inputs unwritten.
        for i in 0..self.optimized.schedule.launches.len() {
            self.operands(i, inputs, outputs)?;
        }
        for (launches, step) in &self.steps {
            match step {
                Step::Kernel { function, grid } => {
                    let mut pointers = Vec::new();
                    for i in launches.clone() {
                        let Operands { args, out, side } = self.operands(i, inputs, outputs)?;
                        for b in args.iter().chain([&out]).chain(&side) {
                            pointers.push(b.address(0)?);
                        }
                    }
                    self.launch(function, *grid, &pointers)?;
                }
                Step::MatMul {
                    prologues,
                    gemm,
                    lt,
                    epilogue,
                    epilogue_function,
                    scratch,
                } => {
                    let Operands { args, out, side } =
                        self.operands(launches.start, inputs, outputs)?;
                    let pointers: Vec<u64> = args
                        .iter()
                        .map(|b| b.address(0))
                        .collect::<Result<_, _>>()?;
                    let operands = [&gemm.a, &gemm.b]
                        .iter()
                        .filter(|o| matches!(o.source, OperandSource::Scratch(_)))
                        .map(|o| match o.source {
                            OperandSource::Scratch(at) => at,
                            OperandSource::Input(_) => 0,
                        })
                        .collect::<Vec<_>>();
                    for ((function, grid), at) in prologues.iter().zip(&operands) {
                        let mut args = pointers.clone();
                        args.push(scratch.address(*at)?);
                        self.launch(function, *grid, &args)?;
                    }
                    let product = match epilogue {
                        GemmEpilogue::Kernel { acc, .. } => (scratch, *acc),
                        GemmEpilogue::None | GemmEpilogue::Bias { .. } => (out, 0),
                    };
                    self.gemm(gemm, lt.as_ref(), epilogue, &args, scratch, product)?;
                    if let (GemmEpilogue::Kernel { acc, program }, Some(function)) =
                        (epilogue, epilogue_function)
                    {
                        let mut args = pointers.clone();
                        args.push(scratch.address(*acc)?);
                        args.push(out.address(0)?);
                        for b in &side {
                            args.push(b.address(0)?);
                        }
                        self.launch(function, program.grid, &args)?;
                    }
                }
            }
        }
        for &(k, from) in &self.bindings.copies {
            let ty = &self.outputs[k];
            let bytes = ty.shape.numel() * ty.dtype.size();
            outputs[k].copy_from(self.buffer(from, inputs, outputs), bytes)?;
        }
        Ok(())
    }

    /// The buffer `bound` names: graph input `i` in `inputs`, graph
    /// output `k` in `outputs`, a slot of the memory plan.
    fn buffer<'a>(
        &'a self,
        bound: Bound,
        inputs: &[&'a Buffer],
        outputs: &[&'a Buffer],
    ) -> &'a Buffer {
        match bound {
            Bound::Input(i) => inputs[i as usize],
            Bound::Output(k) => outputs[k],
            Bound::Slot(s) => &self.slots[s],
        }
    }

    /// The buffers of launch `i`, each checked to hold its type: graph
    /// inputs in `inputs`, graph outputs in `outputs` (by index), the
    /// values in between in the memory plan's slots.
    fn operands<'a>(
        &'a self,
        i: usize,
        inputs: &[&'a Buffer],
        outputs: &[&'a Buffer],
    ) -> Result<Operands<'a>, Error> {
        let graph = &self.optimized.graph;
        let launch = &self.optimized.schedule.launches[i];
        let node = graph.node(launch.node);
        let binding = &self.bindings.launches[i];
        let buffer = |b: &Bound| self.buffer(*b, inputs, outputs);
        let args: Vec<&Buffer> = binding.args.iter().map(buffer).collect();
        for (b, id) in args.iter().zip(&node.inputs) {
            let ty = &graph.node(*id).ty;
            if b.bytes < ty.shape.numel() * ty.dtype.size() {
                return Err(Error::Launch(format!(
                    "a buffer of {} bytes for {ty}",
                    b.bytes
                )));
            }
        }
        let out = buffer(&binding.out);
        let side: Vec<&Buffer> = binding.side.iter().map(buffer).collect();
        let outs = std::iter::once((out, launch.node)).chain(
            side.iter()
                .copied()
                .zip(launch.side.iter().map(|&(id, _)| id)),
        );
        for (b, id) in outs {
            let ty = &graph.node(id).ty;
            if b.bytes < ty.shape.numel() * ty.dtype.size() {
                return Err(Error::Launch(format!(
                    "an output of {} bytes for {ty}",
                    b.bytes
                )));
            }
        }
        Ok(Operands { args, out, side })
    }

    /// Copies the outputs of the last run on host data into `donated`
    /// (those written over an input) and `outputs` (the others), of the
    /// output types (checked by the caller).
    fn download(&self, donated: &mut [&mut Data], outputs: &mut [&mut Data]) -> Result<(), Error> {
        self.gpu.bind()?;
        let name = &self.optimized.graph.name;
        let (_, buffers) = self.host_run()?;
        for (place, buffer) in self.places.outputs.iter().zip(buffers) {
            let data = match *place {
                Place::Donated(j) => &mut *donated[j],
                Place::Own(m) => &mut *outputs[m],
            };
            let bytes = buffer.read(data.len() * data.dtype().size(), name)?;
            fill(data, &bytes);
        }
        self.gpu.wait(name)
    }

    fn launch(&self, function: &CudaFunction, grid: Grid, pointers: &[u64]) -> Result<(), Error> {
        let Some(config) = launch_config(grid) else {
            return Ok(());
        };
        let mut builder = self.gpu.stream.launch_builder(function);
        for p in pointers {
            builder.arg(p);
        }
        // SAFETY: the pointers are the kernel's inputs then its output, in the
        // order of its parameters, each checked above to hold its type; the
        // generated code reads and writes only inside those types.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(|e| driver("launching a kernel", e))
    }

    /// The GEMM of `plan` into `product` (a buffer and a byte offset), with
    /// cuBLASLt's epilogue when `epilogue` is one (`lt`, the TF32 path).
    fn gemm(
        &self,
        plan: &GemmPlan,
        lt: Option<&blaslt::Matmul>,
        epilogue: &GemmEpilogue,
        args: &[&Buffer],
        scratch: &Buffer,
        product: (&Buffer, usize),
    ) -> Result<(), Error> {
        let (m, n, k, batches) = (plan.m, plan.n, plan.k, plan.batches);
        if m == 0 || n == 0 || batches == 0 {
            return Ok(());
        }
        // The device address of an operand, after checking that the last
        // element the GEMM reads lies in its buffer.
        let operand = |o: &GemmOperand, rows: usize, cols: usize| {
            let (buffer, base) = match o.source {
                OperandSource::Input(i) => (
                    *args
                        .get(i as usize)
                        .ok_or_else(|| Error::Launch(format!("no input {i}")))?,
                    0,
                ),
                OperandSource::Scratch(at) => (scratch, at),
            };
            let last = o.offset
                + (batches - 1) * o.batch_stride
                + rows.saturating_sub(1) * o.row_stride
                + cols.saturating_sub(1) * o.col_stride;
            if base + (last + 1) * 4 > buffer.bytes {
                return Err(Error::Launch(format!(
                    "a GEMM operand reads element {last} of a {}-byte buffer",
                    buffer.bytes
                )));
            }
            buffer.address(base + o.offset * 4)
        };
        let (c, c_at) = product;
        if c_at + batches * m * n * 4 > c.bytes {
            return Err(Error::Launch("the GEMM's product does not fit".into()));
        }
        let c = c.address(c_at)?;
        let stream = &self.gpu.stream;
        if k == 0 {
            // An empty sum: cuBLAS takes no k = 0 product, and none is needed.
            // SAFETY: the product's bytes lie in `c`'s buffer (checked above).
            return unsafe {
                cudarc::driver::result::memset_d8_async(
                    c,
                    0,
                    batches * m * n * 4,
                    stream.cu_stream(),
                )
            }
            .map_err(|e| driver("zeroing an empty product", e));
        }
        let (a, b) = (operand(&plan.a, m, k)?, operand(&plan.b, k, n)?);
        let bias = match epilogue {
            GemmEpilogue::Bias { bias, .. } => {
                let buffer = *args
                    .get(*bias as usize)
                    .ok_or_else(|| Error::Launch(format!("no bias input {bias}")))?;
                if buffer.bytes < n * 4 {
                    return Err(Error::Launch("a bias shorter than a row".into()));
                }
                Some(buffer.address(0)?)
            }
            GemmEpilogue::None | GemmEpilogue::Kernel { .. } => None,
        };
        let shape = plan.column_major();
        match (self.precision, lt) {
            (Precision::Tf32, Some(lt)) => {
                // SAFETY: every matrix the product describes lies inside its
                // buffer and the bias holds a row (checked above); the product
                // is written to its own slot or scratch part, which no operand
                // of the same kernel is.
                unsafe { lt.run(&self.gpu.lt, [b, a, c], bias) }
            }
            (Precision::Tf32, None) => Err(Error::Launch("a TF32 matmul with no plan".into())),
            (Precision::F32, _) => {
                if bias.is_some() {
                    return Err(Error::Launch("sgemm has no bias epilogue".into()));
                }
                // SAFETY: as for cuBLASLt above; the handle's stream is the
                // device's, and every pointer is a device address of its context.
                unsafe { blas::sgemm(&self.gpu.blas, &shape, [b, a, c]) }
            }
        }
    }
}
