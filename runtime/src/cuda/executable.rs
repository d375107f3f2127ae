//! A fused graph compiled for one GPU: each launch of its schedule made a
//! step (a generated kernel, a row group's kernel, or a matmul's prologues,
//! GEMM and epilogue), device buffers for its memory plan, and every launch
//! enqueued on given input and output buffers (`enqueue`); `runs` has the
//! ways it is run.
//!
//! Kernels write each graph output straight into the buffer that holds it
//! after the run (a donated input's, for an output written over it), as on
//! the CPU, except small outputs of runs on storage, written into buffers of
//! the executable's own and copied out (`STAGED_BYTES`); the memory plan's
//! slots hold the values in between.
//!
//! Every launch is made safe by the checks before it: buffer lengths
//! against the kernel's types (the generated code reads and writes only
//! through index maps the verifier bounded), and GEMM dimensions against
//! the buffers they stride through.

#![allow(unsafe_code)]

use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use kiln_ir::kernel::KernelKind;
use kiln_ir::pass::Optimized;
use kiln_ir::{Op, TensorType};

use super::codegen::{self, FLAT_THREADS, Grid};
use super::context::{Gpu, driver};
use super::gemm::{self, Gemm, GemmOperand, OperandSource};
use super::memory::Buffer;
use super::replay::Replays;
use super::runs::HostBuffers;
use super::{blas, blaslt};
use crate::backend::{BackendOptions, Place, Places, Precision};
use crate::bind::{Bindings, Bound};
use crate::matmul::Epilogue;
use crate::{Error, Role};

/// Graph outputs of at most this many bytes (a training step's loss, a
/// batch's metrics) of runs on storage are written into buffers of the
/// executable's own and copied into the caller's after the run (runs on
/// host data have buffers of their own already). A caller that holds such
/// outputs from run to run (an epoch's losses, read at its end) gives each
/// run new ones: written in place, no two runs would have the same buffers
/// and none would replay; staged, they do, at the price of a copy of a few
/// bytes.
const STAGED_BYTES: usize = 1 << 16;

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
// `F` is the kernels' code while the steps are planned, and the compiled
// kernels once they are compiled together (`Gpu::functions`).
#[allow(clippy::large_enum_variant)]
pub(super) enum Step<F = CudaFunction> {
    /// A generated kernel: one launch's, or a row group's (its parameters
    /// are each launch's inputs, then its output, launch by launch).
    Kernel { function: F, grid: Grid },
    /// Operand prologues, a GEMM, and maybe an epilogue kernel, with the
    /// scratch memory they share.
    MatMul {
        prologues: Vec<(F, Grid)>,
        gemm: Gemm,
        /// The cuBLASLt product, in TF32.
        lt: Option<blaslt::Matmul>,
        epilogue: Epilogue,
        /// The epilogue kernel and its grid, where `epilogue` is one.
        epilogue_function: Option<(F, Grid)>,
        scratch: Buffer,
    },
}

impl<F> Step<F> {
    /// The step with each kernel `f` of it.
    fn map<G>(self, mut f: impl FnMut(F) -> G) -> Step<G> {
        match self {
            Step::Kernel { function, grid } => Step::Kernel {
                function: f(function),
                grid,
            },
            Step::MatMul {
                prologues,
                gemm,
                lt,
                epilogue,
                epilogue_function,
                scratch,
            } => Step::MatMul {
                prologues: prologues.into_iter().map(|(p, g)| (f(p), g)).collect(),
                gemm,
                lt,
                epilogue,
                epilogue_function: epilogue_function.map(|(e, g)| (f(e), g)),
                scratch,
            },
        }
    }
}

/// A fused graph compiled for one GPU, with device buffers for every slot
/// of its memory plan, and for the inputs and outputs of runs on host
/// data, reused by every run.
pub struct Executable {
    pub(super) gpu: Arc<Gpu>,
    pub(super) optimized: Optimized,
    pub(super) precision: Precision,
    /// Each step with the launches of the schedule it runs.
    pub(super) steps: Vec<(Range<usize>, Step)>,
    /// Where each run's inputs and outputs are, donated or not.
    pub(super) places: Places,
    /// Which buffer each launch reads and writes.
    pub(super) bindings: Bindings,
    /// The device buffers of runs on host data, once there has been one.
    pub(super) host: Option<HostBuffers>,
    pub(super) slots: Vec<Buffer>,
    pub(super) outputs: Vec<TensorType>,
    /// Runs on the buffers of an earlier run, replayed as one graph launch.
    pub(super) replays: Mutex<Replays>,
    /// By graph output: where a run writes it, when not straight into the
    /// caller's buffer (`STAGED_BYTES`).
    staged: Vec<Option<Buffer>>,
}

/// The steps with their kernels compiled, all at once: one at a time,
/// NVRTC took most of a training step's first compile.
fn compile_together(
    gpu: &Gpu,
    steps: Vec<(Range<usize>, Step<String>)>,
) -> Result<Vec<(Range<usize>, Step)>, Error> {
    let mut codes = Vec::new();
    let steps: Vec<(Range<usize>, Step<usize>)> = (steps.into_iter())
        .map(|(launches, step)| {
            let step = step.map(|code| {
                codes.push(code);
                codes.len() - 1
            });
            (launches, step)
        })
        .collect();
    let functions = gpu.functions(&codes)?;
    Ok((steps.into_iter())
        .map(|(launches, step)| (launches, step.map(|k| functions[k].clone())))
        .collect())
}

/// The buffers one launch reads and writes.
struct Operands<'a> {
    args: Vec<&'a Buffer>,
    out: &'a Buffer,
    side: Vec<&'a Buffer>,
}

impl Executable {
    /// Generates and plans every kernel of `optimized` for `gpu`, then
    /// compiles them together (or takes them from the device's cache).
    pub fn new(
        optimized: Optimized,
        gpu: Arc<Gpu>,
        options: BackendOptions,
    ) -> Result<Executable, Error> {
        let precision = options.precision;
        gpu.bind()?;
        let graph = &optimized.graph;
        let schedule = &optimized.schedule;
        let kernel = |i: usize| match &graph.node(schedule.launches[i].node).op {
            Op::Kernel(kernel) => Ok(kernel.as_ref()),
            _ => Err(crate::launch(
                graph.name.as_str(),
                format!("{} is not a kernel", schedule.launches[i].node),
            )),
        };
        let bindings = Bindings::new(&optimized);
        let places = Places::new(&optimized);
        // The kernel of launches that write an output over a donated input
        // (which they read) is compiled for aliased parameters.
        let over_input = |b: &Bound| matches!(b, Bound::Output(k) if matches!(places.outputs[*k], Place::Donated(_)));
        let compiled = |program: &codegen::Program, launches: Range<usize>| {
            let aliased = bindings.launches[launches.clone()]
                .iter()
                .any(|b| over_input(&b.out) || b.side.iter().any(over_input));
            let program = match aliased {
                true => program.aliased(),
                false => program.clone(),
            };
            if options.dump_code {
                eprintln!("// kiln: code of launches {launches:?}\n{}", program.code);
            }
            program.code
        };
        let mut steps = Vec::with_capacity(schedule.launches.len());
        for group in crate::rows::row_groups(graph, schedule) {
            if let Some(program) = codegen::row_group_of(&optimized, group.clone())? {
                let function = compiled(&program, group.clone());
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
                            let matmul = gemm::matmul(kernel, precision == Precision::Tf32)?;
                            let prologues = (matmul.prologues.iter())
                                .map(|p| (p.code.clone(), p.grid))
                                .collect();
                            let epilogue_function =
                                (matmul.epilogue.as_ref()).map(|p| (compiled(p, i..i + 1), p.grid));
                            let g = &matmul.gemm;
                            let lt = (precision == Precision::Tf32
                                && [g.m, g.n, g.k, g.batches].iter().all(|&d| d > 0))
                            .then(|| {
                                let types = [g.a.dtype, g.product];
                                blaslt::Matmul::new(g.column_major(), &matmul.plan.epilogue, types)
                            })
                            .transpose()?;
                            Step::MatMul {
                                prologues,
                                lt,
                                scratch: gpu.alloc(matmul.plan.scratch_bytes)?,
                                gemm: matmul.gemm,
                                epilogue: matmul.plan.epilogue,
                                epilogue_function,
                            }
                        }
                        KernelKind::Elementwise
                        | KernelKind::Reduce { .. }
                        | KernelKind::Scatter { .. }
                        | KernelKind::Attention { .. } => {
                            let program = codegen::kernel(kernel)?;
                            Step::Kernel {
                                function: compiled(&program, i..i + 1),
                                grid: program.grid,
                            }
                        }
                    },
                ));
            }
        }
        let steps = compile_together(&gpu, steps)?;
        // Graph outputs are written into the buffers that hold them after
        // the run: a slot that only they use needs no memory here.
        let slots = (optimized.schedule.slots.iter().zip(&bindings.used))
            .map(|(&bytes, &used)| gpu.alloc(if used { bytes } else { 0 }))
            .collect::<Result<_, Error>>()?;
        let outputs = graph.output_types();
        let launches = launch_count(&steps);
        let sgemm = precision == Precision::F32
            && steps.iter().any(|(_, s)| matches!(s, Step::MatMul { .. }));
        // A graph of even one kernel is worth replaying: one graph launch
        // and a wait took less host time than one kernel launch and a wait
        // (`benches/RESULTS-cuda.md`).
        let refused = match (launches == 0, sgemm) {
            (true, _) => Some("a run of no kernel has nothing to replay".into()),
            (_, true) => Some("cuBLAS's sgemm (F32 precision) runs on its handle's stream".into()),
            _ => None,
        };
        let staged = (places.outputs.iter().zip(&outputs))
            .map(|(place, ty)| {
                let bytes = ty.shape.numel() * ty.dtype.size();
                let staged =
                    refused.is_none() && matches!(place, Place::Own(_)) && bytes <= STAGED_BYTES;
                staged.then(|| gpu.alloc(bytes)).transpose()
            })
            .collect::<Result<_, Error>>()?;
        let replays = Replays::new(&graph.name, refused, options.dump_replay);
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
            replays: Mutex::new(replays),
            staged,
        })
    }

    /// Why its runs are plain launches rather than replays of a CUDA
    /// graph, where they are (`replay`).
    pub fn replay_refused(&self) -> Option<String> {
        let replays = self.replays.lock().unwrap_or_else(|e| e.into_inner());
        replays.refused().map(str::to_string)
    }

    /// How its matmuls compute.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Enqueues every launch on the device's stream, reading graph input
    /// `i` from `inputs[i]` and writing graph output `k` into
    /// `outputs[k]` (through its staged buffer, where `stage` asks and it
    /// has one), then copies the outputs that no kernel writes (graph
    /// inputs, and values that are an earlier output too) on the device:
    /// as one graph launch where a recent run had the same buffers
    /// (`replay`).
    pub(super) fn enqueue(
        &self,
        inputs: &[&Buffer],
        outputs: &[&Buffer],
        stage: bool,
    ) -> Result<(), Error> {
        self.gpu.bind()?;
        let graph = &self.optimized.graph;
        if inputs.len() != graph.inputs.len() || outputs.len() != graph.outputs.len() {
            return Err(crate::launch(
                graph.name.as_str(),
                format!(
                    "{} inputs and {} outputs for a graph of {} and {}",
                    inputs.len(),
                    outputs.len(),
                    graph.inputs.len(),
                    graph.outputs.len()
                ),
            ));
        }
        // Every launch's buffers found and checked before the first is
        // enqueued: a run that fails leaves its outputs and donated inputs
        // unwritten.
        let staged: Vec<Option<&Buffer>> = (self.staged.iter())
            .map(|s| s.as_ref().filter(|_| stage))
            .collect();
        for ((out, staged), ty) in outputs.iter().zip(&staged).zip(&self.outputs) {
            if staged.is_some_and(|s| out.bytes < s.bytes) {
                return Err(crate::launch(
                    graph.name.as_str(),
                    format!("an output of {} bytes for {ty}", out.bytes),
                ));
            }
        }
        let written: Vec<&Buffer> = (outputs.iter().zip(&staged))
            .map(|(&out, staged)| staged.unwrap_or(out))
            .collect();
        let bound: Vec<Operands> = (0..self.optimized.schedule.launches.len())
            .map(|i| self.operands(i, inputs, &written))
            .collect::<Result<_, _>>()?;
        let addresses = (inputs.iter().chain(&written))
            .map(|b| b.address(0))
            .collect::<Result<_, _>>()?;
        self.gpu.enqueued(&graph.name);
        // Held to the last copy out: another thread's run of this
        // executable writes the same staged buffers.
        let mut replays = self.replays.lock().unwrap_or_else(|e| e.into_inner());
        replays.run(&self.gpu, addresses, |stream| {
            self.enqueue_on(stream, &bound, inputs, &written)
        })?;
        for (out, staged) in outputs.iter().zip(staged) {
            if let Some(staged) = staged {
                out.copy_from(staged, staged.bytes, &self.gpu.stream)?;
            }
        }
        Ok(())
    }

    /// Enqueues every launch of a run on `stream`, on the buffers `bound`
    /// (by launch), `inputs` and `outputs` (checked by `enqueue`).
    fn enqueue_on(
        &self,
        stream: &Arc<CudaStream>,
        bound: &[Operands],
        inputs: &[&Buffer],
        outputs: &[&Buffer],
    ) -> Result<(), Error> {
        for (launches, step) in &self.steps {
            match step {
                Step::Kernel { function, grid } => {
                    let mut pointers = Vec::new();
                    for i in launches.clone() {
                        let Operands { args, out, side } = &bound[i];
                        for b in args.iter().chain([out]).chain(side) {
                            pointers.push(b.address(0)?);
                        }
                    }
                    launch(stream, function, *grid, &pointers)?;
                }
                Step::MatMul {
                    prologues,
                    gemm,
                    lt,
                    epilogue,
                    epilogue_function,
                    scratch,
                } => {
                    let Operands { args, out, side } = &bound[launches.start];
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
                        launch(stream, function, *grid, &args)?;
                    }
                    let product = match epilogue {
                        Epilogue::Kernel { acc: Some(acc) } => (scratch, *acc),
                        Epilogue::Kernel { acc: None } => {
                            return Err(crate::launch(
                                self.optimized.graph.name.as_str(),
                                "an epilogue with no product",
                            ));
                        }
                        Epilogue::Product | Epilogue::Bias { .. } => (*out, 0),
                    };
                    let plan = (gemm, lt.as_ref(), epilogue);
                    self.gemm(stream, plan, args, scratch, product)?;
                    if let Some((function, grid)) = epilogue_function {
                        let mut args = pointers.clone();
                        args.push(scratch.address(product.1)?);
                        args.push(out.address(0)?);
                        for b in side {
                            args.push(b.address(0)?);
                        }
                        launch(stream, function, *grid, &args)?;
                    }
                }
            }
        }
        for &(k, from) in &self.bindings.copies {
            let ty = &self.outputs[k];
            let bytes = ty.shape.numel() * ty.dtype.size();
            outputs[k].copy_from(self.buffer(from, inputs, outputs), bytes, stream)?;
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
        let out = buffer(&binding.out);
        let side: Vec<&Buffer> = binding.side.iter().map(buffer).collect();
        let roles = (0..args.len()).map(Role::Input).chain([Role::Output]);
        let roles = roles.chain((0..side.len()).map(Role::Side));
        let values = node.inputs.iter().chain([&launch.node]);
        let values = values.chain(launch.side.iter().map(|(id, _)| id));
        let buffers = args.iter().chain([&out]).chain(&side);
        for ((b, id), role) in buffers.zip(values).zip(roles) {
            let ty = &graph.node(*id).ty;
            if b.bytes < ty.shape.numel() * ty.dtype.size() {
                let kernel = match &node.op {
                    Op::Kernel(kernel) => crate::label(kernel),
                    _ => format!("launch {i} of {}", graph.name),
                };
                return Err(Error::Fit {
                    kernel,
                    buffer: role,
                    bytes: b.bytes,
                    needs: ty.shape.numel() * ty.dtype.size(),
                });
            }
        }
        Ok(Operands { args, out, side })
    }

    /// The GEMM of `plan` into `product` (a buffer and a byte offset), with
    /// cuBLASLt's epilogue when `epilogue` is one (`lt`, the plan's cuBLASLt
    /// matmul on the TF32 path).
    fn gemm(
        &self,
        stream: &CudaStream,
        (plan, lt, epilogue): (&Gemm, Option<&blaslt::Matmul>, &Epilogue),
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
                    *args.get(i as usize).ok_or_else(|| {
                        crate::launch(self.optimized.graph.name.as_str(), format!("no input {i}"))
                    })?,
                    0,
                ),
                OperandSource::Scratch(at) => (scratch, at),
            };
            let last = o.offset
                + (batches - 1) * o.batch_stride
                + rows.saturating_sub(1) * o.row_stride
                + cols.saturating_sub(1) * o.col_stride;
            let size = o.dtype.size();
            if base + (last + 1) * size > buffer.bytes {
                return Err(crate::launch(
                    self.optimized.graph.name.as_str(),
                    format!(
                        "a GEMM operand reads element {last} of a {}-byte buffer",
                        buffer.bytes
                    ),
                ));
            }
            buffer.address(base + o.offset * size)
        };
        let (c, c_at) = product;
        let c_bytes = batches * m * n * plan.product.size();
        if c_at + c_bytes > c.bytes {
            return Err(Error::Fit {
                kernel: format!("a GEMM of {}", self.optimized.graph.name),
                buffer: Role::Output,
                bytes: c.bytes.saturating_sub(c_at),
                needs: c_bytes,
            });
        }
        let c = c.address(c_at)?;
        if k == 0 {
            // An empty sum: cuBLAS takes no k = 0 product, and none is needed.
            // SAFETY: the product's bytes lie in `c`'s buffer (checked above).
            return unsafe {
                cudarc::driver::result::memset_d8_async(c, 0, c_bytes, stream.cu_stream())
            }
            .map_err(|e| driver("zeroing an empty product", e));
        }
        let (a, b) = (operand(&plan.a, m, k)?, operand(&plan.b, k, n)?);
        let bias = match epilogue {
            Epilogue::Bias {
                bias: Some(bias), ..
            } => {
                let buffer = *args.get(*bias as usize).ok_or_else(|| {
                    crate::launch(
                        self.optimized.graph.name.as_str(),
                        format!("no bias input {bias}"),
                    )
                })?;
                if buffer.bytes < n * 4 {
                    return Err(Error::Fit {
                        kernel: format!("a GEMM of {}", self.optimized.graph.name),
                        buffer: Role::Input(*bias as usize),
                        bytes: buffer.bytes,
                        needs: n * 4,
                    });
                }
                Some(buffer.address(0)?)
            }
            // A bias-less epilogue fails its compile (`gemm::matmul`).
            Epilogue::Product | Epilogue::Kernel { .. } | Epilogue::Bias { bias: None, .. } => None,
        };
        let shape = plan.column_major();
        match (self.precision, lt) {
            (Precision::Tf32, Some(lt)) => {
                // SAFETY: every matrix the product describes lies inside its
                // buffer and the bias holds a row (checked above); the product
                // is written to its own slot or scratch part, which no operand
                // of the same kernel is.
                unsafe { lt.run((&self.gpu.lt, stream), [b, a, c], bias) }
            }
            (Precision::Tf32, None) => Err(crate::launch(
                self.optimized.graph.name.as_str(),
                "a TF32 matmul with no plan",
            )),
            (Precision::F32, _) => {
                // Refused by `Replays` for that reason: the handle enqueues
                // on the compute stream, which a capture would not record.
                if stream.cu_stream() != self.gpu.stream.cu_stream() {
                    return Err(crate::launch(
                        self.optimized.graph.name.as_str(),
                        "sgemm captured on another stream",
                    ));
                }
                if bias.is_some() {
                    return Err(crate::launch(
                        self.optimized.graph.name.as_str(),
                        "sgemm has no bias epilogue",
                    ));
                }
                // SAFETY: as for cuBLASLt above; the handle's stream is the
                // device's, and every pointer is a device address of its context.
                unsafe { blas::sgemm(&self.gpu.blas, &shape, [b, a, c]) }
            }
        }
    }
}

/// Kernel launches per run: a row group is one, a matmul its operand
/// prologues, its GEMM and its epilogue kernel if it has one.
pub(super) fn launch_count(steps: &[(Range<usize>, Step)]) -> usize {
    (steps.iter())
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

/// Enqueues `function` on `grid` on `stream`, with `pointers` as its
/// parameters; a grid with no block launches nothing.
fn launch(
    stream: &CudaStream,
    function: &CudaFunction,
    grid: Grid,
    pointers: &[u64],
) -> Result<(), Error> {
    let Some(config) = launch_config(grid) else {
        return Ok(());
    };
    let mut builder = stream.launch_builder(function);
    for p in pointers {
        builder.arg(p);
    }
    // SAFETY: the pointers are the kernel's inputs then its output, in the
    // order of its parameters, each checked to hold its type
    // (`Executable::operands`); the generated code reads and writes only
    // inside those types.
    unsafe { builder.launch(config) }
        .map(|_| ())
        .map_err(|e| driver("launching a kernel", e))
}
