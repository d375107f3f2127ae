//! A fused graph compiled for the CPU: its kernels in schedule order, run
//! over an arena sized by the memory plan, row group by row group.

use std::ops::Range;
use std::sync::Arc;

use kiln_ir::pass::Optimized;
use kiln_ir::schedule::Location;
use kiln_ir::{Data, DataRef, NodeId, Op, TensorType};

use super::cache::compile;
use super::jit::{self, Buffer, CompiledKernel};
use crate::{Error, check_run};

/// A fused graph compiled for the CPU: its kernels, and an arena sized by
/// the memory plan, reused by every run.
pub(crate) struct Executable {
    optimized: Optimized,
    kernels: Vec<Arc<CompiledKernel>>,
    /// Runs of launches that go row block by row block (`rows::row_groups`).
    groups: Vec<Range<usize>>,
    arena: Vec<Vec<u32>>,
    outputs: Vec<TensorType>,
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
                let words = if used { bytes.div_ceil(4) } else { 0 };
                kiln_ir::try_vec(words, 0u32).map_err(|e| {
                    let what = format_args!("intermediate buffer {s}");
                    e.in_op(optimized.graph.name.as_str(), what).into()
                })
            })
            .collect::<Result<_, Error>>()?;
        let outputs = optimized.graph.output_types();
        let groups = crate::rows::row_groups(&optimized.graph, &optimized.schedule);
        Ok(Executable {
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

    /// With outputs reused, a run allocates nothing.
    fn run_into(&mut self, inputs: &[DataRef<'_>], outputs: &mut [Data]) -> Result<(), Error> {
        let graph = &self.optimized.graph;
        check_run(graph, &self.outputs, inputs, outputs)?;
        // The graph output each node is written to, if any (first occurrence).
        let output_of = |id: NodeId| graph.outputs.iter().position(|&o| o == id);
        let schedule = &self.optimized.schedule;
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
                        (Location::Input(i), _) => Buffer::input(inputs[*i as usize]),
                        (Location::Slot(_), Some(k)) => Buffer::input((&outputs[k]).into()),
                        (Location::Slot(s), None) => Buffer::slot(&mut self.arena[*s]),
                    })
                    .collect();
                let mut out = match output_of(launch.node) {
                    Some(k) => Buffer::output(&mut outputs[k]),
                    None => Buffer::slot(&mut self.arena[launch.output]),
                };
                let mut side: Vec<Buffer> = launch
                    .side
                    .iter()
                    .map(|&(id, slot)| match output_of(id) {
                        Some(k) => Buffer::output(&mut outputs[k]),
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
        // Outputs that are inputs, or that repeat an earlier output, are copies.
        for (k, &id) in graph.outputs.iter().enumerate() {
            match (&graph.node(id).op, output_of(id)) {
                (Op::Input { index }, _) => outputs[k] = inputs[*index as usize].to_data(),
                (_, Some(first)) if first != k => outputs[k] = outputs[first].clone(),
                _ => {}
            }
        }
        Ok(())
    }
}
