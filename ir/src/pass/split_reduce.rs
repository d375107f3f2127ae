//! A reduction with few outputs over many elements becomes two: partial
//! results over chunks of the reduced axes, then the reduction of those.
//!
//! `sum(x)` over `[4096, 4096]` has one output: as one kernel it is one row,
//! which one thread walks alone. `sum(x, axis 0)` has 4096 outputs, but a
//! kernel splits them across threads by columns, so each thread reads a few
//! KiB of every row: page after page that prefetchers do not follow. Split,
//! the first kernel reads `CHUNKS` contiguous blocks of rows (up to the
//! target's parallelism where the outputs are few), one row of its output each, across
//! threads (or GPU blocks); the second reduces those partial results.
//!
//! A sum's additions and a product's multiplications are reassociated: the
//! result differs from the reference's order by rounding only, as the vector
//! accumulators of one kernel already do (an integer's wrapping sum or
//! product is exact in any order). A max is exact in any order.

use smallvec::smallvec;

use super::Rewrite;
use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{Shape, TensorType};

/// Reductions over fewer elements than this stay one kernel.
const MIN_ELEMENTS: usize = 1 << 18;

/// Reductions with this many independent outer rows or more already have
/// rows for every thread, each a contiguous read.
const FEW_ROWS: usize = 16;

/// The most chunks the reduced axes are cut into: rows for many threads,
/// few values left for the second kernel.
const CHUNKS: usize = 32;

/// Elements of one chunk at least, so that each partial result is real work.
const MIN_CHUNK: usize = 4096;

/// The pass, for a target that runs `parallel` pieces of work at once
/// (`Options::parallel`): a reduction whose kept axes give fewer partial
/// results than that is cut into up to `parallel` chunks in all, rather
/// than `CHUNKS`, so that every thread or GPU block has one (`sum(x)` over
/// `[4096, 4096]` in 32 chunks kept 32 of a GPU's blocks busy:
/// `benches/RESULTS-cuda.md`). Each partial result still sums `MIN_CHUNK`
/// elements or more.
pub(crate) fn run(graph: &Graph, parallel: usize) -> (Graph, Vec<String>) {
    let rule = move |g: &mut Graph, op: &Op, inputs: &[NodeId], ty: &TensorType| {
        split(g, op, inputs, ty, parallel)
    };
    super::rewrite_with(graph, "split-reduce", &[("split-reduce", &rule)])
}

/// `reduce(x, axes)` over a run of adjacent axes, seen as `[outer, reduced,
/// inner]`, as `reshape(reduce(reduce(x as [outer, c, reduced / c, inner],
/// 2), 1))` with `c` the largest divisor of `reduced` up to `CHUNKS` (or
/// `parallel / (outer * inner)` where that is more) that leaves
/// `MIN_CHUNK` elements per chunk.
fn split(
    g: &mut Graph,
    op: &Op,
    inputs: &[NodeId],
    ty: &TensorType,
    parallel: usize,
) -> Option<Rewrite> {
    let Op::Reduce { op: reduce, axes } = op else {
        return None;
    };
    let dims = g.node(inputs[0]).ty.shape.dims();
    let (&first, &last) = (axes.first()?, axes.last()?);
    if last - first + 1 != axes.len() {
        return None;
    }
    let outer: usize = dims[..first].iter().product();
    let reduced: usize = dims[first..=last].iter().product();
    let inner: usize = dims[last + 1..].iter().product();
    if outer >= FEW_ROWS || outer * reduced * inner < MIN_ELEMENTS {
        return None;
    }
    let most = CHUNKS.max(parallel / (outer * inner));
    let chunks = (2..=most)
        .rev()
        .find(|&c| reduced.is_multiple_of(c) && reduced / c * inner >= MIN_CHUNK)?;
    // Size-1 axes left out, so that a reduction over everything stays one
    // over the innermost axis, which backends run a row at a time.
    let mut split = Shape(smallvec![chunks, reduced / chunks]);
    let c = usize::from(outer > 1);
    if c == 1 {
        split.0.insert(0, outer);
    }
    if inner > 1 {
        split.0.push(inner);
    }
    let x = g.push(Op::Reshape(split), &[inputs[0]]).ok()?;
    let partial = g
        .push(
            Op::Reduce {
                op: *reduce,
                axes: smallvec![c + 1],
            },
            &[x],
        )
        .ok()?;
    let total = g
        .push(
            Op::Reduce {
                op: *reduce,
                axes: smallvec![c],
            },
            &[partial],
        )
        .ok()?;
    Some(Rewrite::Node(
        Op::Reshape(ty.shape.clone()),
        smallvec![total],
    ))
}
