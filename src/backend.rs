//! Device dispatch: the one place that maps a `Device` to the backend that
//! runs it, and `compile_graph`, which optimizes a captured graph (printing
//! the stages `KILN_DUMP` asks for) and compiles it there. Everything else
//! in kiln reaches a backend through `kiln_runtime::Backend` and
//! `kiln_runtime::Executable` from here.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use kiln_ir::pass::{Optimized, Options};
use kiln_ir::{Data, Graph, TensorType};
use kiln_runtime::{Backend, BackendOptions, Executable, MemoryStats, Storage};

use crate::{CompileOptions, Device, Result};

/// The backend that runs `device`, or an `Err` where this build of kiln
/// cannot (a GPU without feature `cuda`).
pub(crate) fn backend(device: Device) -> Result<Box<dyn Backend>> {
    Ok(match device {
        Device::Cpu => Box::new(kiln_runtime::cpu::Cpu),
        Device::Reference => Box::new(kiln_runtime::Reference),
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => Box::new(kiln_runtime::cuda::Cuda { ordinal }),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => {
            return Err(crate::Error::NotBuilt {
                device,
                feature: "cuda",
            });
        }
    })
}

/// `storage`, a value of `ty`, where `device` keeps values: as it is if it
/// is there already (host data on the CPU and the interpreter, which share
/// it), else copied out to the host and, for a GPU, copied in.
pub(crate) fn store(device: Device, ty: &TensorType, storage: Storage) -> Result<Storage> {
    let backend = backend(device)?;
    if backend.holds(&storage) {
        return Ok(storage);
    }
    let data: Arc<Data> = storage.to_host()?;
    Ok(backend.store(ty, data)?)
}

/// What `device`'s backend has copied between the host and the device,
/// how often the host waited for it, and the device memory it holds now
/// and at most, since the process started (as `torch.cuda.memory_stats`).
/// The CPU and the interpreter keep values in host memory: all zeros. A
/// GPU is opened by the call.
pub fn memory_stats(device: Device) -> Result<MemoryStats> {
    Ok(backend(device)?.stats()?)
}

/// Waits until everything enqueued on `device` so far has run (as
/// `torch.cuda.synchronize`): a failed launch surfaces here as an `Err`
/// naming the graphs run since the last wait. Reading a value waits by
/// itself; this is for timing and for errors at a point of one's choosing.
/// Nothing to wait for on the CPU and the interpreter.
pub fn synchronize(device: Device) -> Result<()> {
    Ok(backend(device)?.synchronize()?)
}

/// Optimizes `graph` and compiles its kernels for `device` (kernels
/// already compiled come from the backend's cache). Output `o` of each pair
/// `(i, o)` of `donate` is written over input `i` where the backend can and
/// `pass::donate` finds it safe (`schedule.donated` says where).
pub(crate) fn compile_graph(
    graph: &Graph,
    options: CompileOptions,
    donate: &[(u32, u32)],
) -> Result<Box<dyn Executable>> {
    let backend = backend(options.device)?;
    if dump_requested("graph") {
        eprintln!("// kiln: graph\n{graph}");
    }
    let facts = Options {
        parallel: backend.parallel(),
        attention: backend.attention(),
        ..options.optimizer
    };
    let mut optimized = optimize_with_dumps(graph, facts)?;
    if !donate.is_empty() && backend.donates() {
        let notes;
        (optimized, notes) = kiln_ir::pass::donate(&optimized, donate)?;
        if dump_requested("donate") {
            let notes: String = notes.iter().map(|n| format!("// {n}\n")).collect();
            let schedule = optimized.schedule.print(&optimized.graph);
            let buffers = kiln_runtime::bind::Bindings::new(&optimized).print(&optimized);
            eprintln!(
                "// kiln: donate\n{}{schedule}{buffers}{notes}",
                optimized.graph
            );
        }
    }
    let backend_options = BackendOptions {
        dump_code: options.backend.dump_code || dump_requested("code"),
        dump_replay: options.backend.dump_replay || dump_requested("replay"),
        dump_profile: options.backend.dump_profile || profile_requested(),
        ..options.backend
    };
    Ok(backend.compile(optimized, backend_options)?)
}

/// Runs `run` on the executable that realizes `graph` on `device`: the one
/// compiled for the same graph before, where the realize cache keeps it,
/// so that eager code in a loop optimizes and compiles its graph once.
/// With `KILN_DUMP` naming a stage every realize compiles anew, printing it.
pub(crate) fn with_realized(
    graph: &Graph,
    device: Device,
    run: impl FnOnce(&mut dyn Executable) -> Result<()>,
) -> Result<()> {
    // A stage's dump compiles anew each time, to print it; a profile does
    // not need that.
    let dumping = dump_names(|name| name != "profile");
    // Taken out while it runs: a thread realizing the same graph meanwhile
    // compiles its own.
    let cached = (!dumping).then(|| realized().take(device, graph)).flatten();
    let (key, mut exec) = match cached {
        Some(entry) => entry,
        None => {
            let exec = compile_graph(graph, CompileOptions::on(device), &[])?;
            ((device, graph.clone()), exec)
        }
    };
    run(exec.as_mut())?;
    if !dumping {
        realized().keep(key, exec);
    }
    Ok(())
}

/// The realize cache: executables by device and graph, the most recently
/// used last, at most `REALIZED_ENTRIES` of them and `REALIZED_BYTES` of
/// memory plans in all, so that it holds small graphs (eager ops) and
/// never pins much memory.
struct Realized(VecDeque<Entry>);

type Entry = ((Device, Graph), Box<dyn Executable>);

const REALIZED_ENTRIES: usize = 64;
const REALIZED_BYTES: usize = 64 << 20;

fn realized() -> std::sync::MutexGuard<'static, Realized> {
    static CACHE: Mutex<Realized> = Mutex::new(Realized(VecDeque::new()));
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The memory an executable's plan holds between runs.
fn plan_bytes(exec: &dyn Executable) -> usize {
    exec.optimized().schedule.peak_bytes()
}

impl Realized {
    fn take(&mut self, device: Device, graph: &Graph) -> Option<Entry> {
        let at = (self.0.iter()).position(|((d, g), _)| *d == device && g == graph)?;
        self.0.remove(at)
    }

    fn keep(&mut self, key: (Device, Graph), exec: Box<dyn Executable>) {
        let bytes = plan_bytes(exec.as_ref());
        // One per graph: another thread may have put its own back meanwhile.
        if bytes > REALIZED_BYTES || self.0.iter().any(|(k, _)| *k == key) {
            return;
        }
        let mut total: usize = self.0.iter().map(|(_, e)| plan_bytes(e.as_ref())).sum();
        while self.0.len() == REALIZED_ENTRIES || total + bytes > REALIZED_BYTES {
            match self.0.pop_front() {
                Some((_, oldest)) => total -= plan_bytes(oldest.as_ref()),
                None => break,
            }
        }
        self.0.push_back((key, exec));
    }
}

/// Optimizes `graph`, printing the stages `KILN_DUMP` asks for.
fn optimize_with_dumps(graph: &Graph, options: Options) -> Result<Optimized> {
    Ok(kiln_ir::pass::optimize(
        graph,
        options,
        &mut |stage, print| {
            if dump_requested(stage) {
                eprintln!("// kiln: {stage}\n{}", print());
            }
        },
    )?)
}

/// Whether `KILN_DUMP` names `profile`: by name only, `all` prints stages.
fn profile_requested() -> bool {
    dump_names(|name| name == "profile")
}

/// Whether `KILN_DUMP` (a comma-separated list of stages, or `all`) names `stage`.
fn dump_requested(stage: &str) -> bool {
    dump_names(|name| name == stage || name == "all")
}

/// Whether a name `KILN_DUMP` lists (comma-separated) is one `wanted` takes.
fn dump_names(wanted: impl Fn(&str) -> bool) -> bool {
    std::env::var("KILN_DUMP").is_ok_and(|v| v.split(',').any(|s| wanted(s.trim())))
}
