//! Runs replayed as one CUDA graph launch. The launches of a run on the
//! same buffers as a recent run (the same device addresses for every input
//! and output) are captured once into a CUDA graph, on a stream kept for
//! capturing, and each later run on those buffers is one `cuGraphLaunch`
//! on the compute stream instead of a launch per kernel, GEMM and copy.
//!
//! Runs on host data reuse the executable's own buffers, and so does a
//! training step whose state is written in place and whose outputs were
//! let go before the next step: from their second run on, each is one
//! graph launch. A run on new buffers launches as it is, and is
//! remembered.
//!
//! Capturing goes on a stream of its own because work enqueued on a stream
//! being captured is recorded, not run: another thread's launches on the
//! compute stream would land in the graph. One capture runs at a time.
//!
//! An executable whose runs cannot be captured runs them as plain launches
//! and says why (`Replays::refused`, `KILN_DUMP=replay`): a run of no
//! kernel has nothing to replay, cuBLAS's `sgemm` (the IEEE f32 path) runs
//! on the handle's own stream, and a capture the driver refuses is not
//! tried again. (A run of one kernel replays: a one-node graph and a wait
//! took less host time than a launch and a wait, `benches/RESULTS-cuda.md`.) A run that fails while it is captured (a check, a
//! driver error) is that run's `Err`, as it would be uncaptured.

#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use super::context::{Gpu, driver};
use crate::Error;

/// Buffer sets remembered, and graphs kept, per executable: a fed step
/// alternates between the feed's two sets of input buffers.
const KEPT: usize = 4;

/// The graphs an executable's runs replay, by the device addresses of
/// their buffers.
pub(super) struct Replays {
    /// Addresses of recent runs not captured, the newest last.
    seen: VecDeque<Vec<u64>>,
    /// Captured runs by their addresses, the most recently used last.
    graphs: VecDeque<(Vec<u64>, Graph)>,
    /// Why this executable's runs are plain launches, if they are.
    refused: Option<String>,
    /// Print what is captured and refused (`KILN_DUMP=replay`).
    dump: bool,
    /// The graph's name, for what is printed.
    name: String,
}

impl Replays {
    /// For the runs of graph `name`; `refused` says why they cannot be
    /// captured, where that is known before the first.
    pub(super) fn new(name: &str, refused: Option<String>, dump: bool) -> Replays {
        if let (Some(why), true) = (&refused, dump) {
            eprintln!("// kiln: {name}: runs are not replayed: {why}");
        }
        Replays {
            seen: VecDeque::new(),
            graphs: VecDeque::new(),
            refused,
            dump,
            name: name.to_string(),
        }
    }

    /// Why runs are plain launches, where they are.
    pub(super) fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// Runs the launches `enqueue` makes on a stream, for a run on the
    /// buffers at `addresses`: one graph launch where a graph of them
    /// exists, captured into one where a recent run had these buffers,
    /// enqueued on the compute stream otherwise.
    pub(super) fn run(
        &mut self,
        gpu: &Gpu,
        addresses: Vec<u64>,
        enqueue: impl Fn(&Arc<CudaStream>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if self.refused.is_some() {
            return in_turn(gpu, &enqueue);
        }
        if let Some(at) = self.graphs.iter().position(|(a, _)| *a == addresses) {
            let Some(entry) = self.graphs.remove(at) else {
                return Err(crate::cuda("graph replay", "a kept graph went missing"));
            };
            let launched = entry.1.launch(gpu);
            self.graphs.push_back(entry);
            return launched;
        }
        let Some(at) = self.seen.iter().position(|a| *a == addresses) else {
            self.seen.push_back(addresses);
            if self.seen.len() > KEPT {
                self.seen.pop_front();
            }
            return in_turn(gpu, &enqueue);
        };
        self.seen.remove(at);
        match Graph::capture(gpu, &enqueue) {
            Captured::Graph(graph) => {
                if self.dump {
                    eprintln!(
                        "// kiln: {}: runs on these buffers replay as one graph launch",
                        self.name
                    );
                }
                graph.launch(gpu)?;
                self.graphs.push_back((addresses, graph));
                if self.graphs.len() > KEPT {
                    self.graphs.pop_front();
                }
                Ok(())
            }
            Captured::Refused(why) => {
                if self.dump {
                    eprintln!("// kiln: {}: runs are not replayed: {why}", self.name);
                }
                self.refused = Some(why);
                in_turn(gpu, &enqueue)
            }
            Captured::Failed(e) => Err(e),
        }
    }
}

/// The launches `enqueue` makes, on the compute stream in its turn
/// (`Gpu::turn`).
fn in_turn(
    gpu: &Gpu,
    enqueue: &impl Fn(&Arc<CudaStream>) -> Result<(), Error>,
) -> Result<(), Error> {
    let _turn = gpu.turn();
    enqueue(&gpu.stream)
}

/// What a capture made.
enum Captured {
    Graph(Graph),
    /// The driver would not capture or instantiate the run: why.
    Refused(String),
    /// The run itself failed as it was captured.
    Failed(Error),
}

/// A capture under way on a stream: ended when dropped, if not before.
struct Capturing<'a>(Option<&'a Arc<CudaStream>>);

impl Capturing<'_> {
    /// Ends the capture and instantiates what it recorded.
    fn end(&mut self) -> Result<Option<CudaGraph>, cudarc::driver::DriverError> {
        match self.0.take() {
            Some(stream) => stream.end_capture(CUgraphInstantiate_flags(0)),
            None => Ok(None),
        }
    }
}

impl Drop for Capturing<'_> {
    fn drop(&mut self) {
        // Unwinding: the stream must not stay capturing; the graph goes.
        let _ = self.end();
    }
}

/// A run's launches, captured and instantiated.
struct Graph(CudaGraph);

// SAFETY: CUDA graphs may be used from any thread, one call at a time; a
// graph is reached only through its executable's `Replays`, behind a
// `Mutex`.
unsafe impl Send for Graph {}

impl Graph {
    /// The launches `enqueue` makes, captured on `gpu`'s capture stream.
    /// Nothing runs: the device is left as it was, whatever happens, the
    /// capture ended even where `enqueue` panics.
    fn capture(gpu: &Gpu, enqueue: &impl Fn(&Arc<CudaStream>) -> Result<(), Error>) -> Captured {
        let stream = gpu.capture.lock().unwrap_or_else(|e| e.into_inner());
        // Thread-local: calls of other threads that would break a capture
        // (a synchronize, an allocation) are theirs to make meanwhile.
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        if let Err(e) = stream.begin_capture(mode) {
            return Captured::Refused(format!("beginning a capture: {e:?}"));
        }
        let mut capturing = Capturing(Some(&stream));
        let enqueued = enqueue(&stream);
        let ended = capturing.end();
        match (enqueued, ended) {
            (Ok(()), Ok(Some(graph))) => Captured::Graph(Graph(graph)),
            (Ok(()), Ok(None)) => Captured::Refused("the capture recorded no graph".into()),
            (Ok(()), Err(e)) => Captured::Refused(format!("ending the capture: {e:?}")),
            // A launch the capture refused is the driver's, not the run's.
            (Err(e), _) if e.to_string().contains("STREAM_CAPTURE") => {
                Captured::Refused(format!("capturing the launches: {e}"))
            }
            (Err(e), _) => Captured::Failed(e),
        }
    }

    /// Enqueues the graph on the compute stream, and counts it.
    fn launch(&self, gpu: &Gpu) -> Result<(), Error> {
        // A graph launch is one operation of the stream: nothing comes
        // between its kernels, but the turn keeps it from coming between
        // those of a product that another thread is enqueueing.
        let _turn = gpu.turn();
        // SAFETY: the executable graph is live (its `CudaGraph` owns it) and
        // was made in the context of `gpu`'s stream; the buffers it reads
        // and writes are those of the run it replays (the same addresses),
        // checked by the caller to hold their types.
        unsafe {
            cudarc::driver::result::graph::launch(self.0.cu_graph_exec(), gpu.stream.cu_stream())
        }
        .map_err(|e| driver("launching a graph", e))?;
        gpu.counters.replayed();
        Ok(())
    }
}
