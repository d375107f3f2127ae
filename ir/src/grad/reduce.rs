//! The gradients of the reductions that are not linear: max, shared among
//! the elements equal to the maximum, and prod, the product of the other
//! elements, made exact (to the second order) where the reduced elements
//! hold zeros.

use smallvec::SmallVec;

use super::{binary, cast_like, like, push};
use crate::Error;
use crate::elementwise::{BinaryOp, ReduceOp};
use crate::graph::{Graph, NodeId};
use crate::op::Op;

/// The gradient of `y = max(x)` over `axes`: `dy` shared evenly among the
/// elements equal to the maximum, `dy * hit / count` as JAX writes it, so
/// that a row whose maximum is NaN (no element equal to it, a count of 0)
/// gets NaN everywhere, as in JAX and PyTorch: divergence shows.
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
    let count = push(g, Op::Expand(from.clone()), &[count])?;
    let dy = push(g, Op::Expand(from), &[dy])?;
    let hits = binary(g, BinaryOp::Mul, dy, ones)?;
    binary(g, BinaryOp::Div, hits, count)
}

/// The gradient of `y = prod(x)` over `axes`: for element `j`, `dy` times
/// the product of the other elements of its row, in a form whose own
/// gradient is exact too (second-order gradients, Hessian-vector products).
/// Dividing `y` by `x_j` would give NaN at a zero, so with `p` the product
/// of the row's non-zero elements (`x` with 1 standing in for each zero,
/// `safe`), `o` the count of the row's zeros other than `x_j` and `s` their
/// sum, it is `dy * p / safe_j` times 1 where `o` is 0, `s` where `o` is 1,
/// and 0 where it is more. `s` is 0, but its gradient is 1 at the one other
/// zero: the derivative of the product of the others with respect to that
/// zero, the product of the rest, is not 0, and a constant 0 in its place
/// would make the Hessian of `prod` asymmetric at zeros. Ordinary graph
/// ops, exact up to rounding.
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
    // The zeros as they are: 0 in value, with a gradient of 1.
    let zero_values = push(g, Op::Where, &[is_zero, x, zero])?;
    let zeros = cast_like(g, is_zero, x)?;
    let z = reduce(g, ReduceOp::Sum, axes, zeros)?;
    let s = reduce(g, ReduceOp::Sum, axes, zero_values)?;
    let dp = binary(g, BinaryOp::Mul, dy, p)?;
    let [dp, z, s] = [dp, z, s].map(|n| push(g, Op::Expand(from.clone()), &[n]));
    // Counts of zeros are small integers, exact in f32 and f64.
    let others = binary(g, BinaryOp::Sub, z?, zeros)?;
    let other_zeros = binary(g, BinaryOp::Sub, s?, zero_values)?;
    let none = binary(g, BinaryOp::Eq, others, zero)?;
    let single = binary(g, BinaryOp::Eq, others, one)?;
    let by_one = push(g, Op::Where, &[single, other_zeros, zero])?;
    let factor = push(g, Op::Where, &[none, one, by_one])?;
    let slope = binary(g, BinaryOp::Div, dp?, safe)?;
    binary(g, BinaryOp::Mul, slope, factor)
}

/// `op` over `axes` of `x`, the axes kept as size 1.
fn reduce(g: &mut Graph, op: ReduceOp, axes: &[usize], x: NodeId) -> Result<NodeId, Error> {
    let axes = SmallVec::from_slice(axes);
    push(g, Op::Reduce { op, axes }, &[x])
}
