//! A fused graph compiled for the CPU: its kernels in schedule order, run
//! over an arena sized by the memory plan, row group by row group.

use std::ops::Range;
use std::sync::Arc;

use kiln_ir::pass::Optimized;
use kiln_ir::schedule::Location;
use kiln_ir::{Data, DataRef, NodeId, Op, TensorType};

use super::cache::compile;
use super::jit::{self, Buffer, CompiledKernel};
use crate::backend::{Place, Places};
use crate::{Error, check_run};

/// A fused graph compiled for the CPU: its kernels, and an arena sized by
/// the memory plan, reused by every run.
pub(crate) struct Executable {
    optimized: Optimized,
    kernels: Vec<Arc<CompiledKernel>>,
    /// Runs of launches that go row block by row block (`rows::row_groups`).
    groups: Vec<Range<usize>>,
    arena: Vec<Vec<u64>>,
    outputs: Vec<TensorType>,
    places: Places,
}

impl Executable {
    /// Compiles every kernel of `optimized` (or takes it from the cache);
    /// `dump_code` prints the Cranelift IR of each kernel compiled.
    pub(crate) fn new(optimized: Optimized, dump_code: bool) -> Result<Executable, Error> {
        let mut kernels = Vec::with_capacity(optimized.schedule.launches.len());
        for (k, launch) in optimized.schedule.launches.iter().enumerate() {
            let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
                return Err(Error::Launch(format!("launch {k} is not a kernel")));
            };
            kernels.push(compile(kernel, &format!("@k{k}"), dump_code)?);
        }
        // Graph outputs are written straight into the caller's buffers: a
        // slot that only they and no intermediate or scratch use needs no
        // memory here.
        let schedule = &optimized.schedule;
        let mut used = vec![false; schedule.slots.len()];
        for launch in &schedule.launches {
            if !optimized.graph.outputs.contains(&launch.node) {
                used[launch.output] = true;
            }
            for (id, slot) in &launch.side {
                if !optimized.graph.outputs.contains(id) {
                    used[*slot] = true;
                }
            }
            if let Some(s) = launch.scratch {
                used[s] = true;
            }
        }
        let arena = schedule
            .slots
            .iter()
            .zip(&used)
            .enumerate()
            .map(|(s, (&bytes, &used))| {
                let words = if used { bytes.div_ceil(8) } else { 0 };
                kiln_ir::try_vec(words, 0u64).map_err(|e| {
                    let what = format_args!("intermediate buffer {s}");
                    e.in_op(optimized.graph.name.as_str(), what).into()
                })
            })
            .collect::<Result<_, Error>>()?;
        let outputs = optimized.graph.output_types();
        let groups = crate::rows::row_groups(&optimized.graph, &optimized.schedule);
        Ok(Executable {
            places: Places::new(&optimized),
            optimized,
            kernels,
            groups,
            arena,
            outputs,
        })
    }
}

impl crate::Executable for Executable {
    fn optimized(&self) -> &Optimized {
        &self.optimized
    }

    fn output_types(&self) -> &[TensorType] {
        &self.outputs
    }

    /// With outputs reused, a run allocates no tensor memory. A donated
    /// buffer is both the input a kernel reads and the output it writes:
    /// `pass::donate` guarantees each element is read before it is
    /// overwritten and never after.
    ///
    /// The launches run on a thread of rayon's pool, so that each kernel's
    /// parallel loop hands its work to the other threads from there, rather
    /// than the caller waking the pool and sleeping until it is done, once
    /// per launch (the training step of `bench_report` took 1.06x as long).
    fn run_donated(
        &mut self,
        donated: &mut [Data],
        inputs: &[DataRef<'_>],
        outputs: &mut [Data],
    ) -> Result<(), Error> {
        check_run(&self.optimized, &self.outputs, donated, inputs, outputs)?;
        rayon::scope(|_| self.launch(donated, inputs, outputs))
    }
}

impl Executable {
    /// Every launch of the schedule over the arena and the run's buffers,
    /// checked by `check_run`.
    fn launch(
        &mut self,
        donated: &mut [Data],
        inputs: &[DataRef<'_>],
        outputs: &mut [Data],
    ) -> Result<(), Error> {
        let graph = &self.optimized.graph;
        let schedule = &self.optimized.schedule;
        // Every buffer of the run, by graph input and graph output.
        let given: Vec<Buffer> = donated.iter_mut().map(Buffer::output).collect();
        let input_at: Vec<Buffer> = (self.places.inputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => given[j].alias(),
                Place::Own(m) => Buffer::input(inputs[m]),
            })
            .collect();
        let own: Vec<Buffer> = outputs.iter_mut().map(Buffer::output).collect();
        let output_at: Vec<Buffer> = (self.places.outputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => given[j].alias(),
                Place::Own(m) => own[m].alias(),
            })
            .collect();
        // The graph output each node is written to, if any (first occurrence).
        let output_of = |id: NodeId| graph.outputs.iter().position(|&o| o == id);
        for group in &self.groups {
            let mut bound = Vec::with_capacity(group.len());
            for (launch, kernel) in schedule.launches[group.clone()]
                .iter()
                .zip(&self.kernels[group.clone()])
            {
                let node = graph.node(launch.node);
                let args: Vec<Buffer> = node
                    .inputs
                    .iter()
                    .zip(&launch.inputs)
                    .map(|(&id, loc)| match (loc, output_of(id)) {
                        // Inputs are read where the caller has them, outputs or not.
                        (Location::Input(i), _) => input_at[*i as usize].alias(),
                        (Location::Slot(_), Some(k)) => output_at[k].alias(),
                        (Location::Slot(s), None) => Buffer::slot(&mut self.arena[*s]),
                    })
                    .collect();
                let mut out = match output_of(launch.node) {
                    Some(k) => output_at[k].alias(),
                    None => Buffer::slot(&mut self.arena[launch.output]),
                };
                let mut side: Vec<Buffer> = launch
                    .side
                    .iter()
                    .map(|&(id, slot)| match output_of(id) {
                        Some(k) => output_at[k].alias(),
                        None => Buffer::slot(&mut self.arena[slot]),
                    })
                    .collect();
                let mut scratch = match launch.scratch {
                    Some(s) => Buffer::slot(&mut self.arena[s]),
                    None => Buffer::empty(),
                };
                let refs: Vec<&Buffer> = args.iter().collect();
                if group.len() == 1 {
                    kernel.run(&refs, &mut out, &mut side, &mut scratch)?;
                } else {
                    bound.push(kernel.bind(&refs, &mut out, &mut side, &mut scratch)?);
                }
            }
            jit::run_rows(&bound)?;
        }
        // Outputs that are inputs, or that repeat an earlier output, are
        // copies; a donated input that is its own output is already there.
        let places = &self.places;
        for (k, &id) in graph.outputs.iter().enumerate() {
            let value = match (&graph.node(id).op, output_of(id)) {
                (Op::Input { index }, _) => match places.inputs[*index as usize] {
                    Place::Own(m) => inputs[m].to_data(),
                    Place::Donated(_) => continue,
                },
                (_, Some(first)) if first != k => match places.outputs[first] {
                    Place::Own(m) => outputs[m].clone(),
                    Place::Donated(j) => donated[j].clone(),
                },
                _ => continue,
            };
            match places.outputs[k] {
                Place::Own(m) => outputs[m] = value,
                Place::Donated(j) => donated[j] = value,
            }
        }
        Ok(())
    }
}
