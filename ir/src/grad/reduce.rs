//! The gradients of the reductions that are not linear: max, shared among
//! the elements equal to the maximum, and prod, the product of the other
//! elements, made exact where the reduced elements hold zeros.

use smallvec::SmallVec;

use super::{binary, cast_like, like, push};
use crate::Error;
use crate::elementwise::{BinaryOp, ReduceOp};
use crate::graph::{Graph, NodeId};
use crate::op::Op;

/// The gradient of `y = max(x)` over `axes`: `dy` shared evenly among the
/// elements equal to the maximum.
pub(super) fn max_rule(
    g: &mut Graph,
    axes: &[usize],
    x: NodeId,
    y: NodeId,
    dy: NodeId,
) -> Result<NodeId, Error> {
    let from = g.node(x).ty.shape.clone();
    let ye = push(g, Op::Expand(from.clone()), &[y])?;
    let hit = binary(g, BinaryOp::Eq, x, ye)?;
    let ones = cast_like(g, hit, x)?;
    let count = reduce(g, ReduceOp::Sum, axes, ones)?;
    let share = binary(g, BinaryOp::Div, dy, count)?;
    let share = push(g, Op::Expand(from), &[share])?;
    let zero = like(g, 0.0, x)?;
    push(g, Op::Where, &[hit, share, zero])
}

/// The gradient of `y = prod(x)` over `axes`: for element `i`, `dy` times
/// the product of the other elements of its row. Dividing `y` by `x_i`
/// would give NaN at a zero, so with `z` the row's count of zeros and `p`
/// the product of its non-zero elements (`x` with 1 standing in for each
/// zero), it is `dy * p / x_i` where the row holds no zero other than
/// `x_i` (with `x_i` itself a zero, `x_i` reads as 1: `dy * p`), and 0
/// where it holds one (`z - [x_i == 0] > 0`): ordinary graph ops, exact
/// up to rounding.
pub(super) fn prod_rule(
    g: &mut Graph,
    axes: &[usize],
    x: NodeId,
    dy: NodeId,
) -> Result<NodeId, Error> {
    let from = g.node(x).ty.shape.clone();
    let zero = like(g, 0.0, x)?;
    let one = like(g, 1.0, x)?;
    let is_zero = binary(g, BinaryOp::Eq, x, zero)?;
    let safe = push(g, Op::Where, &[is_zero, one, x])?;
    let p = reduce(g, ReduceOp::Prod, axes, safe)?;
    let zeros = cast_like(g, is_zero, x)?;
    let z = reduce(g, ReduceOp::Sum, axes, zeros)?;
    let dp = binary(g, BinaryOp::Mul, dy, p)?;
    let dp = push(g, Op::Expand(from.clone()), &[dp])?;
    let z = push(g, Op::Expand(from), &[z])?;
    // Counts of zeros are small integers, exact in f32 and f64.
    let others = binary(g, BinaryOp::Sub, z, zeros)?;
    let alone = binary(g, BinaryOp::Eq, others, zero)?;
    let slope = binary(g, BinaryOp::Div, dp, safe)?;
    push(g, Op::Where, &[alone, slope, zero])
}

/// `op` over `axes` of `x`, the axes kept as size 1.
fn reduce(g: &mut Graph, op: ReduceOp, axes: &[usize], x: NodeId) -> Result<NodeId, Error> {
    let axes = SmallVec::from_slice(axes);
    push(g, Op::Reduce { op, axes }, &[x])
}
