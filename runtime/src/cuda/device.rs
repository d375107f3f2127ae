//! The CUDA runtime: a device (context, stream, cuBLAS handles, the module
//! cache), a caching allocator, and fused graphs run on the device.
//!
//! With `nvrtc` and `blaslt`, the modules of the CUDA backend with `unsafe`:
//! device memory is made and handed to generated kernels and to cuBLAS as
//! raw pointers, and kernels are launched. Every launch is made safe by the
//! checks before it: buffer lengths against the kernel's types (the
//! generated code reads and writes only through index maps the verifier
//! bounded), and GEMM dimensions against the buffers they stride through.

#![allow(unsafe_code)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::cublas::{CudaBlas, sys::cublasOperation_t};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use kiln_ir::kernel::KernelKind;
use kiln_ir::pass::Optimized;
use kiln_ir::schedule::Location;
use kiln_ir::{Data, DataRef, Op, TensorType};

use super::blaslt;
use super::codegen::{self, FLAT_THREADS, Grid};
use super::plan::{self, Gemm as GemmPlan, GemmEpilogue, OperandSource};
use crate::{Error, check};

/// How a matmul computes its products in f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// TF32 tensor cores (10-bit mantissa products, f32 sums) through
    /// cuBLASLt, with its bias and bias+ReLU epilogues fused: fast, about
    /// 1e-3 relative error.
    #[default]
    Tf32,
    /// IEEE f32 through cuBLAS `sgemm`; epilogues are generated kernels.
    F32,
}

fn driver(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Cuda(format!("{what}: {e:?}"))
}

/// One GPU: its context and stream, cuBLAS handles, and every module loaded.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    name: String,
    lt: blaslt::Lt,
    blas: CudaBlas,
    /// Kernels by their CUDA C: a source compiles once per device.
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Freed device buffers by size, for the next allocation of that size.
    pool: Mutex<HashMap<usize, Vec<CudaSlice<u8>>>>,
}

/// The CUDA major version kiln's bindings are built for (cudarc's
/// `cuda-13000`): the driver must support it and the libraries must be it.
const CUDA_MAJOR: i32 = 13;

/// The versions of the driver, NVRTC, cuBLAS and cuBLASLt that were loaded:
/// an older driver or a library of another major version (cudarc also tries
/// `.so.12`, `.so.11` and unversioned names) is an `Err` saying what was found.
fn check_versions() -> Result<(), Error> {
    let (mut driver_version, mut nvrtc) = (0, (0, 0));
    let mut blas_major = 0;
    // SAFETY: each call writes the integers it is given; the libraries are
    // loaded (checked by the caller).
    let (lt_version, statuses) = unsafe {
        let d = cudarc::driver::sys::cuDriverGetVersion(&mut driver_version);
        let n = cudarc::nvrtc::sys::nvrtcVersion(&mut nvrtc.0, &mut nvrtc.1);
        let b = cudarc::cublas::sys::cublasGetProperty(
            cudarc::cublas::sys::libraryPropertyType::MAJOR_VERSION,
            &mut blas_major,
        );
        (
            cudarc::cublaslt::sys::cublasLtGetVersion(),
            (d.result().is_ok(), n.result().is_ok(), b.result().is_ok()),
        )
    };
    // A call that failed reports version 0, which no check accepts.
    let driver_version = if statuses.0 { driver_version } else { 0 };
    // cuBLASLt's version is major * 10000 + minor * 100 + patch.
    let libraries = [
        ("libnvrtc", if statuses.1 { nvrtc.0 } else { 0 }),
        ("libcublas", if statuses.2 { blas_major } else { 0 }),
        (
            "libcublasLt",
            i32::try_from(lt_version / 10000).unwrap_or(0),
        ),
    ];
    match version_problem(driver_version, &libraries) {
        Some(problem) => Err(Error::Cuda(problem)),
        None => Ok(()),
    }
}

/// What is wrong with a driver of `driver_version` (`cuDriverGetVersion`'s
/// 1000 * major + 10 * minor) and libraries of the given major versions.
fn version_problem(driver_version: i32, libraries: &[(&str, i32)]) -> Option<String> {
    if driver_version < CUDA_MAJOR * 1000 {
        return Some(format!(
            "the NVIDIA driver supports CUDA {}.{}; kiln needs {CUDA_MAJOR}.0 or newer",
            driver_version / 1000,
            driver_version % 1000 / 10
        ));
    }
    libraries.iter().find(|(_, major)| *major != CUDA_MAJOR).map(|(library, major)| {
        format!(
            "{library} of CUDA {major} was loaded; kiln needs {library}.so.{CUDA_MAJOR} (put CUDA {CUDA_MAJOR}'s libraries first on LD_LIBRARY_PATH)"
        )
    })
}

/// Devices opened so far, by ordinal.
static DEVICES: LazyLock<Mutex<HashMap<usize, Arc<Device>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// GPU `ordinal`, opened once per process. No driver, no device, no NVRTC or
/// no cuBLAS is an `Err` saying which (cudarc panics on a missing library;
/// each is checked first).
pub fn device(ordinal: usize) -> Result<Arc<Device>, Error> {
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = devices.get(&ordinal) {
        return Ok(d.clone());
    }
    // SAFETY: each only tries to dlopen its library.
    let (cuda, lt, blas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::cublaslt::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    if !cuda {
        return Err(Error::Cuda(
            "libcuda.so is not loadable: no NVIDIA driver on this machine".into(),
        ));
    }
    if !super::nvrtc::available() {
        return Err(Error::Cuda(
            "libnvrtc.so.13 is not on the library path (LD_LIBRARY_PATH)".into(),
        ));
    }
    if !lt || !blas {
        return Err(Error::Cuda(
            "libcublasLt.so.13 or libcublas.so.13 is not on the library path (LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    check_versions()?;
    let count = CudaContext::device_count().map_err(|e| driver("counting devices", e))?;
    if ordinal >= count.max(0) as usize {
        return Err(Error::Cuda(format!(
            "no device {ordinal}: this machine has {count}"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| driver("opening the device", e))?;
    // SAFETY: every buffer of the device is used on its one compute stream,
    // where work runs in order, except the standby input buffers, which a
    // copy stream writes, ordered against the compute stream by the events
    // `Staging` records and waits on (`copied`, `released`); cudarc's per-use
    // events (recorded on every pointer taken) would only cost time.
    unsafe { ctx.disable_event_tracking() };
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| driver("compute capability", e))?;
    let stream = ctx.default_stream();
    let d = Arc::new(Device {
        name: ctx.name().map_err(|e| driver("device name", e))?,
        arch: format!("sm_{major}{minor}"),
        lt: blaslt::Lt::new(&stream, major)?,
        blas: CudaBlas::new(stream.clone()).map_err(|e| driver("cuBLAS", e))?,
        ctx,
        stream,
        functions: Mutex::new(HashMap::new()),
        pool: Mutex::new(HashMap::new()),
    });
    devices.insert(ordinal, d.clone());
    Ok(d)
}

impl Device {
    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `enqueue` between two events on the device's stream, waits for
    /// the second, and returns the device's time between them in seconds.
    fn timed(&self, enqueue: impl FnOnce() -> Result<(), Error>) -> Result<f64, Error> {
        self.bind()?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = || {
            self.stream
                .record_event(timing)
                .map_err(|e| driver("recording a timing event", e))
        };
        let start = event()?;
        enqueue()?;
        let end = event()?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| driver("running on the device", e))?;
        Ok(f64::from(ms) / 1e3)
    }

    /// Makes the device's context current on the calling thread: an
    /// `Executable` is `Send`, and cuBLAS, cuBLASLt and raw driver calls use
    /// the thread's current context.
    fn bind(&self) -> Result<(), Error> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("binding the device's context to this thread", e))
    }

    /// The architecture kernels are compiled for (`sm_90`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Two device buffers of `bytes` and a copy between them: the device's
    /// copy bandwidth, the yardstick of memory-bound kernels.
    pub fn copier(self: &Arc<Device>, bytes: usize) -> Result<Copier, Error> {
        Ok(Copier {
            from: self.alloc(bytes)?,
            to: self.alloc(bytes)?,
        })
    }

    /// The kernel of `code`, compiled to a CUBIN for this device once.
    fn function(&self, code: &str) -> Result<CudaFunction, Error> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = functions.get(code) {
            return Ok(f.clone());
        }
        let cubin = super::nvrtc::compile(code, &self.arch)?;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| driver("loading a module", e))?;
        let f = module
            .load_function(codegen::ENTRY)
            .map_err(|e| driver("loading a kernel", e))?;
        functions.insert(code.to_string(), f.clone());
        Ok(f)
    }

    /// `bytes` of device memory, from the pool when a buffer of that size
    /// was freed; contents undefined (every buffer is written before read).
    fn alloc(self: &Arc<Device>, bytes: usize) -> Result<Buffer, Error> {
        let size = bytes.max(1).next_power_of_two().max(256);
        let reused = self
            .pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&size)
            .and_then(Vec::pop);
        let slice = match reused {
            Some(s) => s,
            None => self
                .stream
                .alloc_zeros::<u8>(size)
                .map_err(|e| driver("allocating device memory", e))?,
        };
        Ok(Buffer {
            slice: Some(slice),
            bytes,
            device: self.clone(),
        })
    }
}

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

/// Device memory that goes back to its device's pool when dropped.
struct Buffer {
    slice: Option<CudaSlice<u8>>,
    /// The bytes asked for (the slice may be larger).
    bytes: usize,
    device: Arc<Device>,
}

impl Buffer {
    fn slice(&self) -> Result<&CudaSlice<u8>, Error> {
        self.slice
            .as_ref()
            .ok_or_else(|| Error::Cuda("a freed device buffer".into()))
    }

    /// The raw device address of byte `at`, for a kernel argument.
    fn address(&self, at: usize) -> Result<u64, Error> {
        let slice = self.slice()?;
        if at > self.bytes {
            return Err(Error::Launch(format!(
                "byte {at} of a {}-byte buffer",
                self.bytes
            )));
        }
        let (ptr, _sync) = slice.device_ptr(&self.device.stream);
        Ok(ptr + at as u64)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            let mut pool = self.device.pool.lock().unwrap_or_else(|e| e.into_inner());
            pool.entry(slice.len()).or_default().push(slice);
        }
    }
}

/// A device-to-device copy, for measuring bandwidth.
pub struct Copier {
    from: Buffer,
    to: Buffer,
}

impl Copier {
    /// Copies the buffer once, waits for it, and returns the device's time
    /// for the copy in seconds.
    pub fn run(&mut self) -> Result<f64, Error> {
        let device = self.from.device.clone();
        let bytes = self.from.bytes;
        let src = self.from.slice()?.slice(..bytes);
        let mut dst = self
            .to
            .slice
            .as_mut()
            .ok_or_else(|| Error::Cuda("a freed device buffer".into()))?
            .slice_mut(..bytes);
        device.timed(|| {
            device
                .stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(|e| driver("copying on the device", e))
        })
    }
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
    device: Arc<Device>,
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

/// Inputs staged for the next launch: copied into pinned host memory, then
/// to a second set of device input buffers on a copy stream, while the
/// current launch computes on the first set.
struct Staging {
    copy: Arc<CudaStream>,
    pinned: Vec<PinnedHostSlice<u8>>,
    standby: Vec<Buffer>,
    /// Recorded on the copy stream after the last copy into `standby`.
    copied: Option<CudaEvent>,
    /// Recorded on the compute stream when the work that read the buffers
    /// now in `standby` was enqueued in full, and first when they were
    /// allocated (and zeroed) there: a pooled buffer may still be read by
    /// the work of an executable that was dropped, and a new one's zeroing
    /// is stream-ordered; the copy stream waits for either.
    released: CudaEvent,
    /// Whether `standby` holds inputs that no launch has taken yet.
    ready: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // With cudarc's event tracking off, freeing pinned memory waits on
        // nothing: a copy still reading it (or writing a standby buffer that
        // goes back to the pool) must end first. A failure leaves nothing
        // better to do than to free.
        let _ = self.copy.synchronize();
    }
}

impl Executable {
    /// Generates, compiles (or takes from the device's cache) and plans
    /// every kernel of `optimized` for `device`.
    pub fn new(
        optimized: Optimized,
        device: Arc<Device>,
        precision: Precision,
    ) -> Result<Executable, Error> {
        device.bind()?;
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
                let function = device.function(&program.code)?;
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
                                .map(|p| Ok((device.function(&p.code)?, p.grid)))
                                .collect::<Result<_, Error>>()?;
                            let (epilogue_function, fused) = match &plan.epilogue {
                                GemmEpilogue::Kernel { program, .. } => (
                                    Some(device.function(&program.code)?),
                                    blaslt::Epilogue::None,
                                ),
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
                                scratch: device.alloc(plan.scratch_bytes)?,
                                gemm: plan.gemm,
                                epilogue: plan.epilogue,
                                epilogue_function,
                            }
                        }
                        KernelKind::Elementwise | KernelKind::Reduce { .. } => {
                            let program = codegen::kernel(kernel)?;
                            Step::Kernel {
                                function: device.function(&program.code)?,
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
            .map(|t| device.alloc(t.shape.numel() * t.dtype.size()))
            .collect::<Result<_, Error>>()?;
        let slots = optimized
            .schedule
            .slots
            .iter()
            .map(|&bytes| device.alloc(bytes))
            .collect::<Result<_, Error>>()?;
        let outputs = graph.output_types();
        Ok(Executable {
            device,
            optimized,
            precision,
            steps,
            inputs,
            slots,
            outputs,
            staging: None,
        })
    }

    /// The fused graph and its schedule.
    pub fn optimized(&self) -> &Optimized {
        &self.optimized
    }

    /// Kernel launches per run: a row group is one, a matmul its operand
    /// prologues, its GEMM and its epilogue kernel if it has one.
    pub fn launches(&self) -> usize {
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

    /// How its matmuls compute.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The types of the outputs.
    pub fn output_types(&self) -> &[TensorType] {
        &self.outputs
    }

    /// Copies `inputs` to the device, runs every launch on the device's
    /// stream, and copies the outputs back into `outputs`.
    pub fn run_into(&mut self, inputs: &[DataRef<'_>], outputs: &mut [Data]) -> Result<(), Error> {
        self.check_outputs(outputs)?;
        self.upload(inputs)?;
        self.launch_all()?;
        self.download(inputs, outputs)
    }

    /// Copies `inputs` into the graph's device input buffers.
    pub fn upload(&mut self, inputs: &[DataRef<'_>]) -> Result<(), Error> {
        let graph = &self.optimized.graph;
        check(&graph.name, "input", &graph.inputs, inputs.iter().copied())?;
        self.device.bind()?;
        let stream = self.device.stream.clone();
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
        self.device.timed(|| self.enqueue())
    }

    /// Starts copying `inputs` to the device for the next `launch_prepared`,
    /// on a stream of their own: called while the current launch computes
    /// (after `launch_prepared`, before `finish`), the copy overlaps it. The
    /// host data goes through pinned memory, so the caller's buffers are
    /// free again when this returns.
    pub fn prepare(&mut self, inputs: &[DataRef<'_>]) -> Result<(), Error> {
        let graph = &self.optimized.graph;
        check(&graph.name, "input", &graph.inputs, inputs.iter().copied())?;
        self.device.bind()?;
        if self.staging.is_none() {
            let copy = self
                .device
                .ctx
                .new_stream()
                .map_err(|e| driver("creating a copy stream", e))?;
            let mut pinned = Vec::with_capacity(inputs.len());
            let mut standby = Vec::with_capacity(inputs.len());
            for ty in &graph.inputs {
                let bytes = ty.shape.numel() * ty.dtype.size();
                // SAFETY: the memory is written in full (below) before any read.
                // Flags 0: cached host memory, fast for the CPU to write. At
                // least a byte: cuMemHostAlloc of 0 bytes may leave the
                // pointer unwritten.
                let host = unsafe {
                    self.device
                        .ctx
                        .alloc_pinned_with_flags::<u8>(bytes.max(1), 0)
                }
                .map_err(|e| driver("allocating pinned memory", e))?;
                pinned.push(host);
                standby.push(self.device.alloc(bytes)?);
            }
            let released = self
                .device
                .stream
                .record_event(None)
                .map_err(|e| driver("recording the standby buffers' allocation", e))?;
            self.staging = Some(Staging {
                copy,
                pinned,
                standby,
                copied: None,
                released,
                ready: false,
            });
        }
        let Some(staging) = self.staging.as_mut() else {
            return Err(Error::Cuda("no staging buffers".into()));
        };
        // The pinned buffers are reused: the last copy out of them must be done.
        if let Some(copied) = &staging.copied {
            copied
                .synchronize()
                .map_err(|e| driver("waiting for a copy", e))?;
        }
        // The device buffers are reused: the launch that read them must be done.
        staging
            .copy
            .wait(&staging.released)
            .map_err(|e| driver("ordering a copy after a launch", e))?;
        // Until the copies below are all enqueued, no launch may take them.
        staging.ready = false;
        for ((host, device), data) in staging
            .pinned
            .iter_mut()
            .zip(&mut staging.standby)
            .zip(inputs)
        {
            let bytes = host_bytes(*data);
            if bytes.is_empty() {
                continue;
            }
            let host = &mut host
                .as_mut_slice()
                .map_err(|e| driver("writing pinned memory", e))?[..bytes.len()];
            host.copy_from_slice(&bytes);
            let mut dst = device
                .slice
                .as_mut()
                .ok_or_else(|| Error::Cuda("a freed device buffer".into()))?
                .slice_mut(..bytes.len());
            staging
                .copy
                .memcpy_htod(&*host, &mut dst)
                .map_err(|e| driver("copying an input to the device", e))?;
        }
        staging.copied = Some(
            staging
                .copy
                .record_event(None)
                .map_err(|e| driver("recording a copy", e))?,
        );
        staging.ready = true;
        Ok(())
    }

    /// Launches the graph on the inputs of the last `prepare`, without
    /// waiting for it: `prepare` the next inputs meanwhile, then `finish`.
    /// Each `prepare` serves one launch: a second launch without one would
    /// run on inputs from two batches ago, and is an `Err`.
    pub fn launch_prepared(&mut self) -> Result<(), Error> {
        let stream = self.device.stream.clone();
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
        self.device.bind()?;
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
        self.device
            .stream
            .synchronize()
            .map_err(|e| driver("running the graph", e))
    }

    /// Enqueues every launch on the device's stream, reading the current
    /// input buffers.
    fn enqueue(&self) -> Result<(), Error> {
        self.device.bind()?;
        for (launches, step) in &self.steps {
            match step {
                Step::Kernel { function, grid } => {
                    let mut pointers = Vec::new();
                    for i in launches.clone() {
                        let (args, out) = self.operands(i)?;
                        for b in args.iter().chain([&out]) {
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
                    let (args, out) = self.operands(launches.start)?;
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
                        self.launch(function, program.grid, &args)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The input buffers and the output buffer of launch `i`, each checked
    /// to hold its type.
    fn operands(&self, i: usize) -> Result<(Vec<&Buffer>, &Buffer), Error> {
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
        if out.bytes < node.ty.shape.numel() * node.ty.dtype.size() {
            return Err(Error::Launch(format!(
                "an output of {} bytes for {}",
                out.bytes, node.ty
            )));
        }
        Ok((args, out))
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
        self.device.bind()?;
        let stream = &self.device.stream;
        for (data, loc) in outputs.iter_mut().zip(&self.optimized.schedule.outputs) {
            let bytes = data.len() * data.dtype().size();
            let mut host = vec![0u8; bytes];
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
        let mut builder = self.device.stream.launch_builder(function);
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
        let operand = |o: &plan::GemmOperand, rows: usize, cols: usize| {
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
        let stream = &self.device.stream;
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
                unsafe { lt.run(&self.device.lt, [b, a, c], bias) }
            }
            (Precision::Tf32, None) => Err(Error::Launch("a TF32 matmul with no plan".into())),
            (Precision::F32, _) => {
                if bias.is_some() {
                    return Err(Error::Launch("sgemm has no bias epilogue".into()));
                }
                let op = |t: bool| {
                    if t {
                        cublasOperation_t::CUBLAS_OP_T
                    } else {
                        cublasOperation_t::CUBLAS_OP_N
                    }
                };
                let (one, zero) = (1.0f32, 0.0f32);
                let int = |v: usize| {
                    i32::try_from(v)
                        .map_err(|_| Error::Launch(format!("sgemm takes no dimension of {v}")))
                };
                let [sa, sb, sc] = shape.batch_strides;
                // SAFETY: as for cuBLASLt above; the handle's stream is the
                // device's, and every pointer is a device address of its context.
                unsafe {
                    cudarc::cublas::result::sgemm_strided_batched(
                        *self.device.blas.handle(),
                        op(shape.transa),
                        op(shape.transb),
                        int(shape.m)?,
                        int(shape.n)?,
                        int(shape.k)?,
                        &one,
                        b as *const f32,
                        int(shape.lda)?,
                        sa as i64,
                        a as *const f32,
                        int(shape.ldb)?,
                        sb as i64,
                        &zero,
                        c as *mut f32,
                        int(shape.ldc)?,
                        sc as i64,
                        int(batches)?,
                    )
                }
                .map_err(|e| driver("cuBLAS sgemm", e))
            }
        }
    }
}

/// The bytes of host elements as the device holds them (bool as 0/1 bytes).
fn host_bytes(data: DataRef<'_>) -> Cow<'_, [u8]> {
    match data {
        DataRef::F32(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        DataRef::I32(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        DataRef::U8(v) => Cow::Borrowed(v),
        DataRef::Bool(v) => Cow::Owned(v.iter().map(|&b| u8::from(b)).collect()),
    }
}

/// Host elements from the bytes the device wrote.
fn fill(data: &mut Data, bytes: &[u8]) {
    let word = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    match data {
        Data::F32(v) => {
            for (x, c) in v.iter_mut().zip(bytes.chunks_exact(4)) {
                *x = f32::from_le_bytes(word(c));
            }
        }
        Data::I32(v) => {
            for (x, c) in v.iter_mut().zip(bytes.chunks_exact(4)) {
                *x = i32::from_le_bytes(word(c));
            }
        }
        Data::U8(v) => v.copy_from_slice(bytes),
        Data::Bool(v) => {
            for (x, &b) in v.iter_mut().zip(bytes) {
                *x = b != 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::version_problem;

    #[test]
    fn versions_are_checked_against_cuda_13() {
        let thirteen = [("libnvrtc", 13), ("libcublas", 13), ("libcublasLt", 13)];
        assert_eq!(version_problem(13000, &thirteen), None);
        assert_eq!(version_problem(13020, &thirteen), None);
        let old = version_problem(12080, &thirteen).unwrap_or_default();
        assert!(old.contains("supports CUDA 12.8; kiln needs 13.0"), "{old}");
        let twelve = [("libnvrtc", 13), ("libcublas", 12), ("libcublasLt", 13)];
        let found = version_problem(13000, &twelve).unwrap_or_default();
        assert!(
            found.starts_with("libcublas of CUDA 12 was loaded"),
            "{found}"
        );
        let failed = version_problem(0, &thirteen).unwrap_or_default();
        assert!(failed.contains("supports CUDA 0.0"), "{failed}");
    }
}
