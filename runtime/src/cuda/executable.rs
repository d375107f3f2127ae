//! A fused graph compiled for one GPU: each launch of its schedule made a
//! step (a generated kernel, a row group's kernel, or a matmul's prologues,
//! GEMM and epilogue), device buffers for its inputs and memory plan, and
//! runs: plain (`run_into`), timed (`launch_all`), or with the next inputs
//! staged while the current ones compute (`prepare`, `launch_prepared`,
//! `finish`).
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
use kiln_ir::schedule::Location;
use kiln_ir::{Data, DataRef, Op, TensorType};

use super::codegen::{self, FLAT_THREADS, Grid};
use super::context::{Gpu, driver};
use super::memory::{Buffer, Staging, fill, host_bytes};
use super::plan::{self, Gemm as GemmPlan, GemmEpilogue, GemmOperand, OperandSource};
use super::{blas, blaslt};
use crate::backend::Precision;
use crate::{Error, check};

/// The launch configuration of a generated kernel's grid.
fn launch_config(grid: Grid) -> Option<LaunchConfig> {
    let (blocks, threads) = match grid {
        Grid::Flat { steps } => {
            // A thread per step: on the H100 relu(a + b) over [4096, 4096]
            // took 73 us against 76 us with the grid capped at 16
            // blocks per multiprocessor (the grid-stride loop then making
            // each thread walk several vectors). Past the grid's limit the
            // loop covers the rest.
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

/// A fused graph compiled for one GPU, with device buffers for its inputs
/// and for every slot of its memory plan, reused by every run.
pub struct Executable {
    gpu: Arc<Gpu>,
    optimized: Optimized,
    precision: Precision,
    /// Each step with the launches of the schedule it runs.
    steps: Vec<(Range<usize>, Step)>,
    inputs: Vec<Buffer>,
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

    /// Copies `inputs` to the device, runs every launch on the device's
    /// stream, and copies the outputs back into `outputs`.
    /// Inputs are uploaded to device memory of their own, so this backend
    /// donates nothing (`Backend::donates`).
    fn run_donated(
        &mut self,
        donated: &mut [Data],
        inputs: &[DataRef<'_>],
        outputs: &mut [Data],
    ) -> Result<(), Error> {
        if !donated.is_empty() || !self.optimized.schedule.donated.is_empty() {
            return Err(Error::Launch(
                "the CUDA backend writes no output over an input".to_string(),
            ));
        }
        self.check_outputs(outputs)?;
        self.upload(inputs)?;
        self.launch_all()?;
        self.download(inputs, outputs)
    }

    fn device_time(&mut self) -> Result<Option<f64>, Error> {
        self.launch_all().map(Some)
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
        let mut steps = Vec::with_capacity(schedule.launches.len());
        for group in crate::rows::row_groups(graph, schedule) {
            if let Some(program) = codegen::row_group_of(&optimized, group.clone())? {
                let function = gpu.function(&program.code)?;
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
                                    (Some(gpu.function(&program.code)?), blaslt::Epilogue::None)
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
                                function: gpu.function(&program.code)?,
                                grid: program.grid,
                            }
                        }
                    },
                ));
            }
        }
        let inputs = graph
            .inputs
            .iter()
            .map(|t| gpu.alloc(t.shape.numel() * t.dtype.size()))
            .collect::<Result<_, Error>>()?;
        let slots = optimized
            .schedule
            .slots
            .iter()
            .map(|&bytes| gpu.alloc(bytes))
            .collect::<Result<_, Error>>()?;
        let outputs = graph.output_types();
        Ok(Executable {
            gpu,
            optimized,
            precision,
            steps,
            inputs,
            slots,
            outputs,
            staging: None,
        })
    }

    /// How its matmuls compute.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Copies `inputs` into the graph's device input buffers.
    pub fn upload(&mut self, inputs: &[DataRef<'_>]) -> Result<(), Error> {
        let graph = &self.optimized.graph;
        check(&graph.name, "input", &graph.inputs, inputs.iter().copied())?;
        self.gpu.bind()?;
        let stream = self.gpu.stream.clone();
        for (buffer, data) in self.inputs.iter_mut().zip(inputs) {
            let bytes = host_bytes(*data);
            if bytes.is_empty() {
                continue;
            }
            let mut dst = buffer
                .slice
                .as_mut()
                .ok_or_else(|| Error::Cuda("a freed device buffer".into()))?
                .slice_mut(..bytes.len());
            stream
                .memcpy_htod(bytes.as_ref(), &mut dst)
                .map_err(|e| driver("copying an input to the device", e))?;
        }
        Ok(())
    }

    /// Runs every launch on the inputs last uploaded, waits for the device,
    /// and returns the device's time from the first launch's start to the
    /// last one's end, in seconds: the work alone, as a benchmark times it.
    pub fn launch_all(&self) -> Result<f64, Error> {
        self.gpu.timed(|| self.enqueue())
    }

    /// Starts copying `inputs` to the device for the next `launch_prepared`,
    /// on a stream of their own: called while the current launch computes
    /// (after `launch_prepared`, before `finish`), the copy overlaps it. The
    /// host data goes through pinned memory, so the caller's buffers are
    /// free again when this returns.
    pub fn prepare(&mut self, inputs: &[DataRef<'_>]) -> Result<(), Error> {
        let graph = &self.optimized.graph;
        check(&graph.name, "input", &graph.inputs, inputs.iter().copied())?;
        self.gpu.bind()?;
        if self.staging.is_none() {
            self.staging = Some(Staging::new(&self.gpu, &graph.inputs)?);
        }
        let Some(staging) = self.staging.as_mut() else {
            return Err(Error::Cuda("no staging buffers".into()));
        };
        staging.stage(inputs)
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
        std::mem::swap(&mut self.inputs, &mut staging.standby);
        self.enqueue()
    }

    /// Waits for the last launch and copies its outputs into `outputs`;
    /// `inputs` are the ones it ran on (an output may be an input).
    pub fn finish(&self, inputs: &[DataRef<'_>], outputs: &mut [Data]) -> Result<(), Error> {
        self.check_outputs(outputs)?;
        self.download(inputs, outputs)?;
        self.gpu
            .stream
            .synchronize()
            .map_err(|e| driver("running the graph", e))
    }

    /// Enqueues every launch on the device's stream, reading the current
    /// input buffers.
    fn enqueue(&self) -> Result<(), Error> {
        self.gpu.bind()?;
        for (launches, step) in &self.steps {
            match step {
                Step::Kernel { function, grid } => {
                    let mut pointers = Vec::new();
                    for i in launches.clone() {
                        let Operands { args, out, side } = self.operands(i)?;
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
                    let Operands { args, out, side } = self.operands(launches.start)?;
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
        Ok(())
    }

    /// The buffers of launch `i`, each checked to hold its type.
    fn operands(&self, i: usize) -> Result<Operands<'_>, Error> {
        let graph = &self.optimized.graph;
        let launch = &self.optimized.schedule.launches[i];
        let args: Vec<&Buffer> = launch
            .inputs
            .iter()
            .map(|loc| match loc {
                Location::Input(i) => &self.inputs[*i as usize],
                Location::Slot(s) => &self.slots[*s],
            })
            .collect();
        let node = graph.node(launch.node);
        for (b, id) in args.iter().zip(&node.inputs) {
            let ty = &graph.node(*id).ty;
            if b.bytes < ty.shape.numel() * ty.dtype.size() {
                return Err(Error::Launch(format!(
                    "a buffer of {} bytes for {ty}",
                    b.bytes
                )));
            }
        }
        let out = &self.slots[launch.output];
        let side: Vec<&Buffer> = launch.side.iter().map(|&(_, s)| &self.slots[s]).collect();
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

    /// `outputs` must be buffers of the output types.
    fn check_outputs(&self, outputs: &[Data]) -> Result<(), Error> {
        let name = &self.optimized.graph.name;
        check(
            name,
            "output",
            &self.outputs,
            outputs.iter().map(DataRef::from),
        )
    }

    /// Copies the outputs of the last launch into `outputs` (of the output
    /// types, checked by the caller); an output that is a graph input is
    /// copied from `inputs`, the data last uploaded.
    fn download(&self, inputs: &[DataRef<'_>], outputs: &mut [Data]) -> Result<(), Error> {
        self.gpu.bind()?;
        let stream = &self.gpu.stream;
        let locations = outputs.iter_mut().zip(&self.optimized.schedule.outputs);
        for (k, (data, loc)) in locations.enumerate() {
            let bytes = data.len() * data.dtype().size();
            let mut host = kiln_ir::try_vec(bytes, 0u8).map_err(|e| {
                let what = format_args!("a host copy of output {k}");
                Error::from(e.in_op(self.optimized.graph.name.as_str(), what))
            })?;
            match loc {
                Location::Input(i) => host.copy_from_slice(&host_bytes(inputs[*i as usize])),
                Location::Slot(_) if bytes == 0 => {}
                Location::Slot(s) => {
                    let src = self.slots[*s].slice()?.slice(..bytes);
                    stream
                        .memcpy_dtoh(&src, &mut host)
                        .map_err(|e| driver("copying an output to the host", e))?;
                }
            }
            fill(data, &host);
        }
        Ok(())
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
