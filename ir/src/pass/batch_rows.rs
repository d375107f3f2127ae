//! `batch-rows`: a batched product whose right operand is one matrix
//! broadcast over the batch as one product of the batch's rows. It runs
//! after `attention`, which matches attention's two batched products as
//! they are written (a key or value shared by every head is such a
//! right operand).

use smallvec::SmallVec;

use super::{Rewrite, Rule};
use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{Shape, TensorType};

/// `graph` with every such product rewritten, and the notes; `None` where
/// it has none, so that the stage shows only where it changes something.
pub(crate) fn run(graph: &Graph) -> Option<(Graph, Vec<String>)> {
    let candidate = |node: &crate::graph::Node| {
        node.op == Op::MatMul && matches!(graph.node(node.inputs[1]).op, Op::Expand(_))
    };
    graph.nodes.iter().any(candidate).then(|| {
        let rule = Rule {
            name: "batch-rows",
            apply: batch_rows,
        };
        let (rewritten, notes) = super::rewrite(graph, "batch-rows", &[rule]);
        (super::dce::run(&rewritten), notes)
    })
}

/// A batched product whose right operand is one matrix broadcast over
/// the batch (`a [b.., m, k] @ expand(w [k, n])`: a linear layer over
/// `[batch, tokens, features]`, an LSTM's input projection over its steps)
/// as one product of the batch's rows, `reshape(a, [b * m, k]) @ w`:
/// every element is the same dot product, and the weight is read (and
/// packed, and computed where it is a computed operand) once rather than
/// once per batch entry.
fn batch_rows(g: &mut Graph, op: &Op, inputs: &[NodeId], ty: &TensorType) -> Option<Rewrite> {
    let Op::MatMul = op else {
        return None;
    };
    let dims = ty.shape.dims();
    let rank = dims.len();
    let b = g.node(inputs[1]);
    let Op::Expand(_) = b.op else {
        return None;
    };
    let w = b.inputs[0];
    let w_dims = g.node(w).ty.shape.dims().to_vec();
    let k = *g.node(inputs[0]).ty.shape.dims().last()?;
    let n = dims[rank - 1];
    let (w_batch, w_matrix) = w_dims.split_at(w_dims.len().checked_sub(2)?);
    if rank < 3 || w_matrix != [k, n] || w_batch.iter().any(|&d| d != 1) {
        return None;
    }
    let rows = dims[..rank - 1].iter().product::<usize>();
    let a = g
        .push(Op::Reshape(Shape::new(&[rows, k])), &[inputs[0]])
        .ok()?;
    let w = match w_batch.is_empty() {
        true => w,
        false => g.push(Op::Reshape(Shape::new(&[k, n])), &[w]).ok()?,
    };
    let c = g.push(Op::MatMul, &[a, w]).ok()?;
    Some(Rewrite::Node(
        Op::Reshape(ty.shape.clone()),
        SmallVec::from_slice(&[c]),
    ))
}
