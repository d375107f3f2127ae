//! A GPU opened for kiln: the checks that its driver and libraries are
//! there and of CUDA 13, its context and compute stream, its cuBLAS and
//! cuBLASLt handles, the kernels compiled for it (by their CUDA C), and
//! timing by events on its stream.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, PinnedHostSlice};
use cudarc::nvrtc::Ptx;

use super::{blaslt, codegen};
use crate::Error;

/// A failed driver or library call, saying what it was doing.
pub(super) fn driver(what: &str, e: impl std::fmt::Debug) -> Error {
    crate::cuda(what, format!("{e:?}"))
}

/// One GPU: its context and stream, cuBLAS handles, and every module loaded.
pub struct Gpu {
    /// Its ordinal, as CUDA counts devices.
    pub(super) ordinal: usize,
    pub(super) ctx: Arc<CudaContext>,
    /// The compute stream: every launch, copy and free, in order.
    pub(super) stream: Arc<CudaStream>,
    /// The stream runs are captured on (`replay`), one capture at a time.
    pub(super) capture: Mutex<Arc<CudaStream>>,
    /// Held while a run's launches go onto the compute stream
    /// (`Gpu::turn`).
    turn: Mutex<()>,
    arch: String,
    name: String,
    pub(super) lt: blaslt::Lt,
    pub(super) blas: CudaBlas,
    /// Kernels by their CUDA C: a source compiles once per device.
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Freed device buffers by size, for the next allocation of that size.
    pub(super) pool: Mutex<HashMap<usize, Vec<CudaSlice<u8>>>>,
    /// Pinned host memory that feeds gave back, by size.
    pub(super) pinned: Mutex<HashMap<usize, Vec<PinnedHostSlice<u8>>>>,
    /// What it has copied, waited for and handed out.
    pub(super) counters: Counters,
    /// The graphs whose runs were enqueued since the host last waited:
    /// what a failure that the next wait finds is named by.
    enqueued: Mutex<Enqueued>,
}

/// Names of the graphs run since the last wait, the oldest first, at most
/// `NAMED` of them, and whether there were others.
#[derive(Default)]
struct Enqueued {
    names: Vec<String>,
    more: bool,
}

const NAMED: usize = 4;

impl Enqueued {
    /// What the work waited for was, as an error message says it.
    fn describe(&self) -> String {
        match (self.names.as_slice(), self.more) {
            ([], _) => "the work".into(),
            (names, false) => format!("the runs of {}", names.join(", ")),
            (names, true) => format!("the runs of {} and other graphs", names.join(", ")),
        }
    }
}

/// A GPU's traffic and memory counters (`crate::MemoryStats`).
#[derive(Default)]
pub(super) struct Counters {
    to_device: AtomicU64,
    to_host: AtomicU64,
    waits: AtomicU64,
    graphs: AtomicU64,
    in_use: AtomicU64,
    peak: AtomicU64,
}

impl Counters {
    pub(super) fn copied_to_device(&self, bytes: usize) {
        self.to_device.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(super) fn copied_to_host(&self, bytes: usize) {
        self.to_host.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(super) fn waited(&self) {
        self.waits.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn replayed(&self) {
        self.graphs.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn handed_out(&self, bytes: usize) {
        let now = self.in_use.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    pub(super) fn given_back(&self, bytes: usize) {
        self.in_use.fetch_sub(bytes as u64, Ordering::Relaxed);
    }

    pub(super) fn read(&self) -> crate::MemoryStats {
        crate::MemoryStats {
            bytes_to_device: self.to_device.load(Ordering::Relaxed),
            bytes_to_host: self.to_host.load(Ordering::Relaxed),
            host_waits: self.waits.load(Ordering::Relaxed),
            graph_launches: self.graphs.load(Ordering::Relaxed),
            bytes_in_use: self.in_use.load(Ordering::Relaxed),
            peak_bytes_in_use: self.peak.load(Ordering::Relaxed),
        }
    }
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
        Some(problem) => Err(crate::cuda(
            "checking the driver's and libraries' versions",
            problem,
        )),
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

/// GPUs opened so far, by ordinal.
static GPUS: LazyLock<Mutex<HashMap<usize, Arc<Gpu>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// GPU `ordinal`, opened once per process. No driver, no device, no NVRTC or
/// no cuBLAS is an `Err` saying which (cudarc panics on a missing library;
/// each is checked first).
pub fn gpu(ordinal: usize) -> Result<Arc<Gpu>, Error> {
    let mut gpus = GPUS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = gpus.get(&ordinal) {
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
        return Err(crate::cuda(
            "loading libcuda",
            "libcuda.so is not loadable: no NVIDIA driver on this machine",
        ));
    }
    if !super::nvrtc::available() {
        return Err(crate::cuda(
            "loading NVRTC",
            "libnvrtc.so.13 is not on the library path (LD_LIBRARY_PATH)",
        ));
    }
    if !lt || !blas {
        return Err(crate::cuda(
            "loading cuBLAS",
            "libcublasLt.so.13 or libcublas.so.13 is not on the library path (LD_LIBRARY_PATH)",
        ));
    }
    check_versions()?;
    let count = CudaContext::device_count().map_err(|e| driver("counting devices", e))?;
    if ordinal >= count.max(0) as usize {
        return Err(crate::cuda(
            "choosing a device",
            format!("no device {ordinal}: this machine has {count}"),
        ));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| driver("opening the device", e))?;
    // SAFETY: every buffer of the device is used on its one compute stream,
    // where work runs in order, except a feed's values, which its copy
    // stream writes, ordered against the compute stream by the events the
    // `Feeder` records and waits on (`released`, `copied`); the capture
    // stream records launches and runs none (its graphs run on the compute
    // stream). cudarc's per-use events (recorded on every pointer taken)
    // would only cost time.
    unsafe { ctx.disable_event_tracking() };
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| driver("compute capability", e))?;
    let stream = ctx.default_stream();
    let capture = ctx
        .new_stream()
        .map_err(|e| driver("creating a capture stream", e))?;
    let d = Arc::new(Gpu {
        ordinal,
        name: ctx.name().map_err(|e| driver("device name", e))?,
        arch: format!("sm_{major}{minor}"),
        lt: blaslt::Lt::new(&stream, major)?,
        blas: CudaBlas::new(stream.clone()).map_err(|e| driver("cuBLAS", e))?,
        ctx,
        stream,
        capture: Mutex::new(capture),
        turn: Mutex::new(()),
        functions: Mutex::new(HashMap::new()),
        pool: Mutex::new(HashMap::new()),
        pinned: Mutex::new(HashMap::new()),
        counters: Counters::default(),
        enqueued: Mutex::new(Enqueued::default()),
    });
    gpus.insert(ordinal, d.clone());
    Ok(d)
}

impl Gpu {
    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `enqueue` between two events on the device's stream, waits for
    /// the second, and returns the device's time between them in seconds.
    pub(super) fn timed(&self, enqueue: impl FnOnce() -> Result<(), Error>) -> Result<f64, Error> {
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
    pub(super) fn bind(&self) -> Result<(), Error> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("binding the device's context to this thread", e))
    }

    /// The compute stream to itself, for one run's launches: cuBLASLt's
    /// products share one workspace and cuBLAS's another, and a product
    /// may be several kernels (partial products into the workspace, then
    /// their sum), so another thread's product enqueued between them would
    /// overwrite the partial products (`tests/cuda_device.rs`).
    pub(super) fn turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What it has copied, waited for and handed out since it was opened.
    pub fn stats(&self) -> crate::MemoryStats {
        self.counters.read()
    }

    /// Notes that a run of graph `name` was enqueued, for the error of the
    /// next wait if the run fails.
    pub(super) fn enqueued(&self, name: &str) {
        let mut enqueued = self.enqueued.lock().unwrap_or_else(|e| e.into_inner());
        if enqueued.names.iter().any(|n| n == name) {
            return;
        }
        match enqueued.names.len() < NAMED {
            true => enqueued.names.push(name.to_string()),
            false => enqueued.more = true,
        }
    }

    /// Waits for all the work enqueued on its stream: where a failed
    /// launch surfaces, as an `Err` naming the graphs run since the last
    /// wait and what the host was waiting for.
    pub(super) fn wait(&self, what: &str) -> Result<(), Error> {
        self.counters.waited();
        // Taken before: runs enqueued meanwhile are the next wait's.
        let enqueued =
            std::mem::take(&mut *self.enqueued.lock().unwrap_or_else(|e| e.into_inner()));
        let waited = self.stream.synchronize();
        waited.map_err(|e| driver(&format!("{} ({what})", enqueued.describe()), e))
    }

    /// The architecture kernels are compiled for (`sm_90`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The kernel of each of `codes`, compiled to a CUBIN for this device
    /// once: those not compiled before in this process are read from the
    /// CUBINs kept on disk or compiled together, in parallel
    /// (`nvrtc::compile_all`).
    pub(super) fn functions(&self, codes: &[String]) -> Result<Vec<CudaFunction>, Error> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        let mut new: Vec<&str> = (codes.iter())
            .filter(|c| !functions.contains_key(*c))
            .map(String::as_str)
            .collect();
        new.sort_unstable();
        new.dedup();
        for (code, cubin) in new.iter().zip(super::nvrtc::compile_all(&new, &self.arch)) {
            let module = self
                .ctx
                .load_module(Ptx::from_binary(cubin?))
                .map_err(|e| driver("loading a module", e))?;
            let f = module
                .load_function(codegen::ENTRY)
                .map_err(|e| driver("loading a kernel", e))?;
            functions.insert(code.to_string(), f);
        }
        (codes.iter())
            .map(|c| {
                (functions.get(c).cloned())
                    .ok_or_else(|| crate::cuda("the kernel cache", "a kernel missing from it"))
            })
            .collect()
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
