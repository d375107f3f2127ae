//! The CPU backend: kernels lowered to Cranelift IR (`lower`, `math`),
//! compiled to machine code and called (`jit`), cached by their structural
//! hash, and run in the order and memory plan of a schedule (`Executable`).

mod jit;
mod lower;
mod math;
#[cfg(target_arch = "x86_64")]
mod sgemm;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use kiln_ir::kernel::{Expr, KernelKind};
use kiln_ir::pass::Optimized;
use kiln_ir::schedule::{Location, Schedule};
use kiln_ir::view::View;
use kiln_ir::{Data, DataRef, Graph, NodeId, Op, Shape, TensorType};

use crate::{Error, check};
use jit::{Buffer, CompiledKernel};

/// Every kernel compiled in this process, by its structural identity: a
/// kernel with the same body, shapes and dtypes is never compiled twice.
static CACHE: LazyLock<Mutex<HashMap<kiln_ir::kernel::Kernel, Arc<CompiledKernel>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// How many kernels have been compiled (cache misses) in this process.
static COMPILED: AtomicUsize = AtomicUsize::new(0);

/// The number of kernels compiled so far in this process: a cache hit adds
/// nothing.
pub fn compiled_kernels() -> usize {
    COMPILED.load(Ordering::Relaxed)
}

/// Empties the kernel cache, so that the next compile is cold: for
/// benchmarks of compile latency.
pub fn clear_kernel_cache() {
    CACHE.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

fn compile(
    kernel: &kiln_ir::kernel::Kernel,
    name: &str,
    dump: bool,
) -> Result<Arc<CompiledKernel>, Error> {
    // A poisoned cache only means another thread panicked mid-insert; its map is intact.
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = cache.get(kernel) {
        return Ok(k.clone());
    }
    let mut print = |code: &str| eprintln!("// kiln: code {name}\n{code}");
    let compiled = Arc::new(CompiledKernel::new(
        kernel,
        dump.then_some(&mut print as &mut dyn FnMut(&str)),
    )?);
    COMPILED.fetch_add(1, Ordering::Relaxed);
    cache.insert(kernel.clone(), compiled.clone());
    Ok(compiled)
}

/// A fused graph compiled for the CPU: its kernels, and an arena sized by
/// the memory plan, reused by every run.
pub struct Executable {
    optimized: Optimized,
    kernels: Vec<Arc<CompiledKernel>>,
    /// Runs of launches that go row block by row block (`row_groups`).
    groups: Vec<Range<usize>>,
    arena: Vec<Vec<u32>>,
    outputs: Vec<TensorType>,
}

impl Executable {
    /// Compiles every kernel of `optimized` (or takes it from the cache);
    /// `dump_code` prints the Cranelift IR of each kernel compiled.
    pub fn new(optimized: Optimized, dump_code: bool) -> Result<Executable, Error> {
        let mut kernels = Vec::with_capacity(optimized.schedule.launches.len());
        for (k, launch) in optimized.schedule.launches.iter().enumerate() {
            let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
                return Err(Error::Launch(format!("launch {k} is not a kernel")));
            };
            kernels.push(compile(kernel, &format!("@k{k}"), dump_code)?);
        }
        let arena = optimized
            .schedule
            .slots
            .iter()
            .map(|&bytes| vec![0u32; bytes.div_ceil(4)])
            .collect();
        let outputs = optimized.graph.output_types();
        let groups = row_groups(&optimized.graph, &optimized.schedule);
        Ok(Executable {
            optimized,
            kernels,
            groups,
            arena,
            outputs,
        })
    }

    /// The fused graph and its schedule.
    pub fn optimized(&self) -> &Optimized {
        &self.optimized
    }

    /// The types of the outputs.
    pub fn output_types(&self) -> &[TensorType] {
        &self.outputs
    }

    /// Zeroed buffers of the output types, for `run_into`.
    pub fn output_buffers(&self) -> Vec<Data> {
        self.output_types()
            .iter()
            .map(|t| Data::zeros(t.dtype, t.shape.numel()))
            .collect()
    }

    /// Runs the graph on `inputs` and returns fresh outputs.
    pub fn run(&mut self, inputs: &[DataRef<'_>]) -> Result<Vec<Data>, Error> {
        let mut outputs = self.output_buffers();
        self.run_into(inputs, &mut outputs)?;
        Ok(outputs)
    }

    /// Runs the graph on `inputs`, writing into `outputs` (of the output
    /// types): with outputs reused, a run allocates nothing.
    pub fn run_into(&mut self, inputs: &[DataRef<'_>], outputs: &mut [Data]) -> Result<(), Error> {
        let graph = &self.optimized.graph;
        check(&graph.name, "input", &graph.inputs, inputs.iter().copied())?;
        check(
            &graph.name,
            "output",
            &self.outputs,
            outputs.iter().map(DataRef::from),
        )?;
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
                let mut scratch = match launch.scratch {
                    Some(s) => Buffer::slot(&mut self.arena[s]),
                    None => Buffer::empty(),
                };
                let refs: Vec<&Buffer> = args.iter().collect();
                if group.len() == 1 {
                    kernel.run(&refs, &mut out, &mut scratch)?;
                } else {
                    bound.push(kernel.bind(&refs, &mut out, &mut scratch)?);
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

/// Splits the launches into runs that go row block by row block
/// (`jit::run_rows`): a reduction joins the run before it when it reduces
/// the same axes of a space with the same kept extents, reads what the run
/// wrote only at its own rows, and writes no slot the run reads. softmax's
/// max and its sum of exponentials so read each row from memory once.
fn row_groups(graph: &Graph, schedule: &Schedule) -> Vec<Range<usize>> {
    let mut groups: Vec<Range<usize>> = Vec::new();
    for next in 0..schedule.launches.len() {
        match groups.last_mut() {
            Some(group) if joins(graph, schedule, group, next) => group.end = next + 1,
            _ => groups.push(next..next + 1),
        }
    }
    groups
}

/// Whether launch `next` can run row block by row block after `group`.
fn joins(graph: &Graph, schedule: &Schedule, group: &Range<usize>, next: usize) -> bool {
    let reduction = |i: usize| match &graph.node(schedule.launches[i].node).op {
        Op::Kernel(k) => match &k.kind {
            KernelKind::Reduce {
                axes,
                shape,
                prologue,
                ..
            } => Some((k.as_ref(), axes, shape, prologue)),
            _ => None,
        },
        _ => None,
    };
    let (Some((kernel, axes, shape, prologue)), Some((_, first_axes, first_shape, _))) =
        (reduction(next), reduction(group.start))
    else {
        return false;
    };
    let kept = |shape: &Shape| -> Vec<usize> {
        let dims = shape.dims();
        (0..dims.len())
            .filter(|a| !axes.contains(a))
            .map(|a| dims[a])
            .collect()
    };
    if axes != first_axes || shape.rank() != first_shape.rank() || kept(shape) != kept(first_shape)
    {
        return false;
    }
    let launch = &schedule.launches[next];
    let members = &schedule.launches[group.clone()];
    if members
        .iter()
        .any(|m| m.inputs.contains(&Location::Slot(launch.output)))
    {
        return false;
    }
    let node = graph.node(launch.node);
    node.inputs.iter().enumerate().all(|(input, id)| {
        !members.iter().any(|m| m.node == *id)
            || prologue
                .values
                .iter()
                .chain(&kernel.body.values)
                .all(|v| match &v.expr {
                    Expr::Load { input: i, view } if *i as usize == input => {
                        row_local(view, &graph.node(*id).ty.shape)
                    }
                    _ => true,
                })
    })
}

/// Whether `view` reads a contiguous buffer of shape `written`, the output
/// of a reduction over the same rows, only at the row it is at: along each
/// axis it steps as the buffer does, or stays put where the buffer has
/// extent 1.
fn row_local(view: &View, written: &Shape) -> bool {
    let (dims, out) = (view.shape.dims(), written.dims());
    let strides = written.strides();
    view.mask.is_none()
        && view.offset == 0
        && dims.len() == out.len()
        && (0..dims.len()).all(|a| {
            dims[a] == 1
                || if out[a] == 1 {
                    view.strides[a] == 0
                } else {
                    out[a] == dims[a] && view.strides[a] == strides[a]
                }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::pass::{Options, optimize};
    use kiln_ir::{BinaryOp, DType, ReduceOp, UnaryOp};
    use smallvec::smallvec;

    /// The row groups of `build`'s graph over inputs of `inputs`, fused.
    fn groups(
        inputs: &[&[usize]],
        build: impl FnOnce(&mut Graph, &[NodeId]) -> Result<NodeId, kiln_ir::Error>,
    ) -> Vec<Range<usize>> {
        let mut g = Graph::new("g");
        let ids: Vec<NodeId> = inputs
            .iter()
            .map(|dims| g.input(TensorType::new(DType::F32, Shape::new(dims))))
            .collect();
        let out = build(&mut g, &ids).unwrap();
        g.outputs.push(out);
        let optimized = optimize(&g, Options::default(), &mut |_, _| {}).unwrap();
        row_groups(&optimized.graph, &optimized.schedule)
    }

    fn reduce(g: &mut Graph, op: ReduceOp, axis: usize, x: NodeId) -> NodeId {
        let op = Op::Reduce {
            op,
            axes: smallvec![axis],
        };
        g.push(op, &[x]).unwrap()
    }

    fn expand(g: &mut Graph, x: NodeId, dims: &[usize]) -> NodeId {
        g.push(Op::Expand(Shape::new(dims)), &[x]).unwrap()
    }

    #[test]
    fn softmax_runs_its_two_reductions_row_by_row() {
        let found = groups(&[&[6, 9]], |g, x| {
            let m = reduce(g, ReduceOp::Max, 1, x[0]);
            let m = expand(g, m, &[6, 9]);
            let d = g.push(Op::Binary(BinaryOp::Sub), &[x[0], m])?;
            let e = g.push(Op::Unary(UnaryOp::Exp), &[d])?;
            let s = reduce(g, ReduceOp::Sum, 1, e);
            let s = expand(g, s, &[6, 9]);
            g.push(Op::Binary(BinaryOp::Div), &[e, s])
        });
        assert_eq!(found, vec![0..2]);
    }

    #[test]
    fn reductions_over_other_rows_run_apart() {
        // The second sums over the rows the first keeps.
        let found = groups(&[&[6, 9]], |g, x| {
            let m = reduce(g, ReduceOp::Max, 1, x[0]);
            let m = expand(g, m, &[6, 9]);
            let d = g.push(Op::Binary(BinaryOp::Sub), &[x[0], m])?;
            Ok(reduce(g, ReduceOp::Sum, 0, d))
        });
        assert_eq!(found, vec![0..1, 1..2]);
    }

    #[test]
    fn a_reduction_writing_where_the_group_reads_runs_apart() {
        // `y`'s slot is free once the max has read it, and the sum's output
        // takes it: run row block by row block, the sum would overwrite rows
        // of `y` that the max has yet to read.
        let found = groups(&[&[6, 5], &[5, 9], &[6, 9]], |g, x| {
            let y = g.push(Op::MatMul, &[x[0], x[1]])?;
            let m = reduce(g, ReduceOp::Max, 1, y);
            let m = expand(g, m, &[6, 9]);
            let d = g.push(Op::Binary(BinaryOp::Sub), &[x[2], m])?;
            Ok(reduce(g, ReduceOp::Sum, 1, d))
        });
        assert_eq!(found, vec![0..1, 1..2, 2..3]);
    }
}
