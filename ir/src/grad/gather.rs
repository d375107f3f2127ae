//! The gradients of the indexed ops, each the other's transpose: a
//! gather's sums its gradient into the positions it picked (a scatter-add,
//! deterministic, its work the size of the picks), and a scatter-add's
//! gathers its gradient from the positions it summed into.

use super::{binary, full, push};
use crate::Error;
use crate::elementwise::BinaryOp;
use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{DType, Scalar};

/// The gradient of `y = gather(x, indices)` along `axis` with respect to
/// `x`, for `dy` of `indices`' shape.
pub(super) fn gather_rule(
    g: &mut Graph,
    axis: usize,
    x: NodeId,
    indices: NodeId,
    dy: NodeId,
) -> Result<NodeId, Error> {
    let len = g.node(x).ty.shape.dims()[axis];
    push(g, Op::ScatterAdd { axis, len }, &[dy, indices])
}

/// The gradient of `y = scatter_add(updates, indices)` along `axis` into
/// `len` positions with respect to `updates`: `dy` where each update was
/// added, zero for an update whose index is outside `-len..len`.
pub(super) fn scatter_add_rule(
    g: &mut Graph,
    (axis, len): (usize, usize),
    updates: NodeId,
    indices: NodeId,
    dy: NodeId,
) -> Result<NodeId, Error> {
    let index = g.node(indices).ty.clone();
    let picked = push(g, Op::Gather { axis }, &[dy, indices])?;
    // Every i32 index is inside an axis longer than i32's range.
    if index.dtype == DType::I32 && len > i32::MAX as usize {
        return Ok(picked);
    }
    let bound = |g: &mut Graph, v: i64| full(g, Scalar::I64(v).cast(index.dtype), &index.shape);
    let (lo, hi) = (bound(g, -(len as i64))?, bound(g, len as i64)?);
    let above = binary(g, BinaryOp::Ge, indices, lo)?;
    let below = binary(g, BinaryOp::Lt, indices, hi)?;
    let zero = full(
        g,
        Scalar::I32(0).cast(g.node(updates).ty.dtype),
        &index.shape,
    )?;
    let kept = push(g, Op::Where, &[below, picked, zero])?;
    push(g, Op::Where, &[above, kept, zero])
}
