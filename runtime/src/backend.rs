//! The contract every backend keeps: a `Backend` keeps values in its
//! storage (allocate, copy in, report what it moved) and compiles an
//! optimized graph into an `Executable`, which runs it on storage or on
//! host buffers. The CPU, the CUDA backend and the reference interpreter
//! are reached through these two traits only.

use std::sync::Arc;

use kiln_ir::pass::Optimized;
use kiln_ir::{Data, DataRef, TensorType};

use crate::storage::{Arg, Feed, HostFeed, MemoryStats, Storage, host_buffer};
use crate::{Error, check_data_run};

/// How a matmul computes its products in f32 where the backend has a choice
/// (the CUDA backend); the CPU and the interpreter always compute in f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// TF32 tensor cores (10-bit mantissa products, f32 sums) through
    /// cuBLASLt, with its bias and bias+ReLU epilogues fused: fast, about
    /// 1e-3 relative error.
    #[default]
    Tf32,
    /// IEEE f32 (cuBLAS `sgemm`); epilogues are generated kernels.
    F32,
}

/// What a backend is told besides the graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BackendOptions {
    /// How matmuls compute in f32.
    pub precision: Precision,
    /// Print the code generated for each kernel compiled to stderr (the
    /// Cranelift IR and machine code on the CPU, the CUDA C on a GPU).
    pub dump_code: bool,
    /// Print, for each executable of the CUDA backend, whether its runs
    /// replay as one CUDA graph launch, and why not where they do not.
    pub dump_replay: bool,
    /// Time each launch of the CPU backend's executables and print, when
    /// one is dropped, the time per run of each, the longest first.
    pub dump_profile: bool,
}

/// A place that runs fused graphs.
pub trait Backend {
    /// Compiles every kernel of `optimized` (kernels compiled before come
    /// from the backend's cache).
    fn compile(
        &self,
        optimized: Optimized,
        options: BackendOptions,
    ) -> Result<Box<dyn Executable>, Error>;

    /// Whether its executables write outputs over donated inputs
    /// (`Executable::run_donated` with `schedule.donated` not empty).
    fn donates(&self) -> bool {
        false
    }

    /// How many pieces of work it runs at once (threads, GPU blocks): the
    /// optimizer's `Options::parallel` for the graphs it compiles. One for
    /// a backend that runs a kernel on one thread.
    fn parallel(&self) -> usize {
        1
    }

    /// Whether it runs attention (`Op::Attention`) as one kernel, so that
    /// the optimizer finds it (`Options::attention`). False where attention
    /// runs as the ops it stands for.
    fn attention(&self) -> bool {
        false
    }

    /// Storage for a value of `ty`, its contents to be written by a run;
    /// running out of memory is an `Err` naming `op`, `ty` and the bytes.
    /// On the host: a buffer from the host pool (`storage::recycle`), else
    /// zeroed `Data`.
    fn alloc(&self, op: &str, ty: &TensorType) -> Result<Storage, Error> {
        let (dtype, len) = (ty.dtype, ty.shape.numel());
        let data = match host_buffer(dtype, len) {
            Some(data) => data,
            None => Data::zeros(dtype, len).map_err(|e| e.in_op(op, ty))?,
        };
        Ok(Storage::Host(Arc::new(data)))
    }

    /// `data`, a value of `ty`, as this backend keeps it: shared, not
    /// copied, on the host; copied into a GPU's memory once.
    fn store(&self, _ty: &TensorType, data: Arc<Data>) -> Result<Storage, Error> {
        Ok(Storage::Host(data))
    }

    /// Whether `storage` is where this backend keeps values (else a run
    /// copies it in, and `store` moves it).
    fn holds(&self, storage: &Storage) -> bool {
        matches!(storage, Storage::Host(_))
    }

    /// A feed of batches into its storage, one ahead of their use.
    fn feed(&self) -> Result<Box<dyn Feed>, Error> {
        Ok(Box::new(HostFeed::default()))
    }

    /// Waits for every run enqueued so far to end: where a failed launch
    /// surfaces. Host backends run before they return: nothing to wait for.
    fn synchronize(&self) -> Result<(), Error> {
        Ok(())
    }

    /// What it has copied, waited for and allocated so far.
    fn stats(&self) -> Result<MemoryStats, Error> {
        Ok(MemoryStats::default())
    }
}

/// A fused graph compiled by a backend.
pub trait Executable: Send {
    /// The fused graph and its schedule.
    fn optimized(&self) -> &Optimized;

    /// The types of the outputs, in order.
    fn output_types(&self) -> &[TensorType];

    /// Buffers of the output types, to pass to `run_into`; an `Err` naming
    /// the graph, the output and the bytes where memory runs out.
    fn output_buffers(&self) -> Result<Vec<Data>, Error> {
        let name = &self.optimized().graph.name;
        let buffer = |(k, t): (usize, &TensorType)| {
            Data::zeros(t.dtype, t.shape.numel()).map_err(|e| {
                e.in_op(name.as_str(), format_args!("output {k}, {t}"))
                    .into()
            })
        };
        self.output_types().iter().enumerate().map(buffer).collect()
    }

    /// Kernel launches per run.
    fn launches(&self) -> usize {
        self.optimized().schedule.kernels()
    }

    /// Runs the graph on `inputs` (of the graph's input types), writing into
    /// `outputs` (of the output types).
    fn run_into(&mut self, inputs: &[DataRef<'_>], outputs: &mut [Data]) -> Result<(), Error> {
        let mut outputs: Vec<&mut Data> = outputs.iter_mut().collect();
        self.run_donated(&mut [], inputs, &mut outputs)
    }

    /// Runs the graph with the inputs that `schedule.donated` names given up
    /// to the outputs written over them: `donated[j]` holds input
    /// `schedule.donated[j].0` on entry and output `schedule.donated[j].1`
    /// on return. `inputs` are the other inputs and `outputs` the other
    /// outputs, each in order.
    fn run_donated(
        &mut self,
        donated: &mut [&mut Data],
        inputs: &[DataRef<'_>],
        outputs: &mut [&mut Data],
    ) -> Result<(), Error>;

    /// `run_donated` on storage: `donated` and `outputs` are storage this
    /// backend keeps (from `Backend::alloc` or an earlier run; storage
    /// another holder shares is replaced, never written), and each output
    /// stays where the backend computed it. On a GPU the run is only
    /// enqueued: the host waits where a value is read. Here, for the
    /// backends that compute on the host, every value is host data.
    fn run_stored(
        &mut self,
        donated: &mut [Storage],
        inputs: &[Arg<'_>],
        outputs: &mut [Storage],
    ) -> Result<(), Error> {
        let name = self.optimized().graph.name.clone();
        let held: Vec<Arc<Data>> = (inputs.iter())
            .filter_map(|a| match a {
                Arg::Stored(s) => Some(s.to_host()),
                Arg::Host(_) => None,
            })
            .collect::<Result<_, _>>()?;
        let mut held = held.iter();
        let refs: Vec<DataRef<'_>> = (inputs.iter())
            .map(|a| match a {
                Arg::Host(d) => Ok(*d),
                Arg::Stored(_) => {
                    (held.next().map(|d| DataRef::from(d.as_ref()))).ok_or_else(|| {
                        crate::launch("the interpreter", "an input lost on its way to the host")
                    })
                }
            })
            .collect::<Result<_, Error>>()?;
        let mut donated: Vec<&mut Data> = (donated.iter_mut())
            .map(|s| s.host_to_update(&name))
            .collect::<Result<_, _>>()?;
        let mut outputs: Vec<&mut Data> = (outputs.iter_mut())
            .map(|s| s.host_to_write(&name))
            .collect::<Result<_, _>>()?;
        self.run_donated(&mut donated, &refs, &mut outputs)
    }

    /// Graph input `input` is `value` on every run from now on (a captured
    /// weight, which stays as it is while it is held): the executable may
    /// prepare what it reads of it once, as the CPU's packs the right
    /// operand of a product for its GEMM. A run that passes another buffer
    /// for it is run as if this had not been called.
    fn constant(&mut self, _input: usize, _value: &Arc<Data>) -> Result<(), Error> {
        Ok(())
    }

    /// For benchmarks: runs the kernels again on the inputs of the last
    /// `run_into` and returns the device's own time for them in seconds.
    /// `None` where kernels run on the host: time `run_into` by the clock.
    fn device_time(&mut self) -> Result<Option<f64>, Error> {
        Ok(None)
    }
}

/// Where a run with donated inputs (`Executable::run_donated`) finds each
/// graph input and writes each graph output: among the donated buffers or
/// among the others, by position.
pub(crate) struct Places {
    pub(crate) inputs: Vec<Place>,
    pub(crate) outputs: Vec<Place>,
}

/// One buffer of a run: `donated[j]` or the `m`th of the others.
#[derive(Clone, Copy)]
pub(crate) enum Place {
    Donated(usize),
    Own(usize),
}

impl Places {
    pub(crate) fn new(optimized: &Optimized) -> Places {
        let pairs = &optimized.schedule.donated;
        let graph = &optimized.graph;
        Places {
            inputs: number(graph.inputs.len(), |i| pairs.iter().position(|p| p.0 == i)),
            outputs: number(graph.outputs.len(), |k| pairs.iter().position(|p| p.1 == k)),
        }
    }
}

/// `count` places: `donated(k)`'s where it names one, else the next of
/// the others.
fn number(count: usize, donated: impl Fn(u32) -> Option<usize>) -> Vec<Place> {
    let mut own = 0;
    (0..count as u32)
        .map(|k| match donated(k) {
            Some(j) => Place::Donated(j),
            None => {
                own += 1;
                Place::Own(own - 1)
            }
        })
        .collect()
}

/// The reference interpreter as a backend: it evaluates the fused graph's
/// kernel nodes one by one, exactly (f64 accumulation), with no code
/// generated. Slow; the oracle of every numeric test.
pub struct Reference;

impl Backend for Reference {
    fn compile(
        &self,
        optimized: Optimized,
        _options: BackendOptions,
    ) -> Result<Box<dyn Executable>, Error> {
        let outputs = optimized.graph.output_types();
        let places = Places::new(&optimized);
        Ok(Box::new(Interpreted {
            optimized,
            outputs,
            places,
        }))
    }

    fn donates(&self) -> bool {
        true
    }
}

/// A fused graph the interpreter runs.
struct Interpreted {
    optimized: Optimized,
    outputs: Vec<TensorType>,
    places: Places,
}

impl Executable for Interpreted {
    fn optimized(&self) -> &Optimized {
        &self.optimized
    }

    fn output_types(&self) -> &[TensorType] {
        &self.outputs
    }

    /// Every input is copied before the interpreter runs, so a donated
    /// buffer is only where a result lands.
    fn run_donated(
        &mut self,
        donated: &mut [&mut Data],
        inputs: &[DataRef<'_>],
        outputs: &mut [&mut Data],
    ) -> Result<(), Error> {
        check_data_run(&self.optimized, &self.outputs, donated, inputs, outputs)?;
        let graph = &self.optimized.graph;
        let owned: Vec<Data> = (self.places.inputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => donated[j].clone(),
                Place::Own(m) => inputs[m].to_data(),
            })
            .collect();
        let refs: Vec<&Data> = owned.iter().collect();
        let values = kiln_ir::interp::eval(graph, &refs)?;
        for (place, value) in self.places.outputs.iter().zip(values) {
            match *place {
                Place::Donated(j) => *donated[j] = value,
                Place::Own(m) => *outputs[m] = value,
            }
        }
        Ok(())
    }
}
