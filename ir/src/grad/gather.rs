//! The gradient of a gather: each picked element receives the gradient of
//! every output that picked it, as a one-hot comparison of the positions
//! picked with a ramp of the gathered axis, summed over the picks. Exact
//! and deterministic; its cost is that of the dense one-hot product,
//! `picks x len` per column.

use smallvec::SmallVec;

use super::{binary, full, push, reshape};
use crate::Error;
use crate::elementwise::{BinaryOp, ReduceOp};
use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{Scalar, Shape};
use crate::view::SliceRange;

/// The gradient of `y = gather(x, indices)` along `axis` with respect to
/// `x`, for `dy` of `indices`' shape.
pub(super) fn gather_rule(
    g: &mut Graph,
    axis: usize,
    x: NodeId,
    indices: NodeId,
    dy: NodeId,
) -> Result<NodeId, Error> {
    let from = g.node(x).ty.shape.clone();
    let index = g.node(indices).ty.clone();
    let len = from.dims()[axis];
    // The position each index picks: negative ones count from the end.
    let zero = full(g, Scalar::I32(0).cast(index.dtype), &index.shape)?;
    let n = full(g, Scalar::I64(len as i64).cast(index.dtype), &index.shape)?;
    let negative = binary(g, BinaryOp::Lt, indices, zero)?;
    let wrapped = binary(g, BinaryOp::Add, indices, n)?;
    let position = push(g, Op::Where, &[negative, wrapped, indices])?;
    // [.., k, 1, ..] against [.., 1, len, ..]: the picks along the new axis
    // `axis + 1`.
    let mut wide = index.shape.dims().to_vec();
    wide.insert(axis + 1, len);
    let wide = Shape::new(&wide);
    let mut picks = index.shape.dims().to_vec();
    picks.insert(axis + 1, 1);
    let mut along = vec![1; wide.rank()];
    along[axis + 1] = len;
    let ramp = ramp(g, len, index.dtype)?;
    let ramp = reshape(g, ramp, &Shape::new(&along))?;
    let ramp = push(g, Op::Expand(wide.clone()), &[ramp])?;
    let position = reshape(g, position, &Shape::new(&picks))?;
    let position = push(g, Op::Expand(wide.clone()), &[position])?;
    let hit = binary(g, BinaryOp::Eq, position, ramp)?;
    let dy = reshape(g, dy, &Shape::new(&picks))?;
    let dy = push(g, Op::Expand(wide.clone()), &[dy])?;
    let zero = full(g, Scalar::I32(0).cast(g.node(dy).ty.dtype), &wide)?;
    let picked = push(g, Op::Where, &[hit, dy, zero])?;
    let axes: SmallVec<[usize; 4]> = SmallVec::from_elem(axis, 1);
    let summed = push(
        g,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes,
        },
        &[picked],
    )?;
    reshape(g, summed, &from)
}

/// `0, 1, .., len - 1` as a rank-1 tensor of `index`'s dtype, from
/// constants alone: the binary digits of each position, as `[0, 1]` along
/// each axis of a `[2, 2, ..]` block, weighted and summed, then cut to
/// `len`. `log2(len)` operations per element, fused into their reader.
fn ramp(g: &mut Graph, len: usize, index: crate::types::DType) -> Result<NodeId, Error> {
    let bits = len.next_power_of_two().trailing_zeros() as usize;
    let block = Shape::new(&vec![2; bits]);
    let one = push(g, Op::Const(Scalar::I32(1).cast(index)), &[])?;
    let one = reshape(g, one, &Shape::new(&[1]))?;
    let pads: SmallVec<[(usize, usize); 4]> = SmallVec::from_elem((1, 0), 1);
    let digit = push(
        g,
        Op::Pad {
            pads,
            value: Scalar::I32(0).cast(index),
        },
        &[one],
    )?;
    let mut sum = full(g, Scalar::I32(0).cast(index), &block)?;
    for k in 0..bits {
        let mut at = vec![1; bits];
        at[k] = 2;
        let d = reshape(g, digit, &Shape::new(&at))?;
        let d = push(g, Op::Expand(block.clone()), &[d])?;
        let weight = Scalar::I64(1 << (bits - 1 - k)).cast(index);
        let weight = full(g, weight, &block)?;
        let term = binary(g, BinaryOp::Mul, d, weight)?;
        sum = binary(g, BinaryOp::Add, sum, term)?;
    }
    let flat = reshape(g, sum, &Shape::new(&[1 << bits]))?;
    let keep: SmallVec<[SliceRange; 4]> = SmallVec::from_elem(
        SliceRange {
            start: 0,
            end: len,
            step: 1,
        },
        1,
    );
    push(g, Op::Slice(keep), &[flat])
}
