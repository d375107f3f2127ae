//! Row groups: runs of reductions over the same rows, each reading what the
//! ones before it wrote only at its own row, which a backend may run row by
//! row instead of launch by launch. Shared by the CPU and CUDA backends.

use std::ops::Range;

use kiln_ir::kernel::{Expr, KernelKind};
use kiln_ir::schedule::{Location, Schedule};
use kiln_ir::view::View;
use kiln_ir::{Graph, Op, Shape};

/// Splits the launches into runs that can go row by row: a reduction joins
/// the run before it when it reduces the same axes of a space with the same
/// kept extents, reads what the run wrote only at its own rows, and writes
/// no slot the run reads. softmax's max and its sum of exponentials so read
/// each row from memory once: the CPU runs a group block of rows by block of
/// rows (`cpu::jit::run_rows`), a GPU as one kernel, a block per row.
pub fn row_groups(graph: &Graph, schedule: &Schedule) -> Vec<Range<usize>> {
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
    // A kernel with side outputs runs alone: `joins` follows what the group
    // wrote by launch outputs and kernel nodes, not side output nodes, and
    // CUDA's row functions take no side buffers.
    let reduction = |i: usize| match &graph.node(schedule.launches[i].node).op {
        Op::Kernel(k) if k.side.is_empty() => match &k.kind {
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
                    // Rows the index picks may not be written yet.
                    Expr::Gather { input: i, .. } => *i as usize != input,
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
    use kiln_ir::{NodeId, TensorType};
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
