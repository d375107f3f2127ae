//! Algebraic identities that hold for every input, NaN, infinities and signed
//! zeros included, and constant folding.
//!
//! `x + 0.0` is not among them: for `x = -0.0` it gives `+0.0`. The float
//! identity is `x + (-0.0) = x` (and `x - 0.0 = x`), which is what the rules use.
//! One rule reassociates a sum (`sum-of-products`), as `split-reduce` does.

use smallvec::SmallVec;

use super::{Rewrite, Rule};
use crate::elementwise::{BinaryOp, ReduceOp, UnaryOp};
use crate::graph::{Graph, Node, NodeId};
use crate::interp;
use crate::op::Op;
use crate::types::{DType, Scalar, Shape, TensorType};

/// The rules, tried in order on every node.
const RULES: &[Rule] = &[
    Rule {
        name: "fold-const",
        apply: fold_const,
    }, // op(c1, c2) -> c
    Rule {
        name: "mul-one",
        apply: mul_one,
    }, // x*1 -> x, 1*x -> x
    Rule {
        name: "add-zero",
        apply: add_zero,
    }, // x+(-0.0) -> x, x+0 -> x for integers
    Rule {
        name: "sub-zero",
        apply: sub_zero,
    }, // x-0 -> x
    Rule {
        name: "neg-neg",
        apply: neg_neg,
    }, // -(-x) -> x
    Rule {
        name: "detach",
        apply: detach,
    }, // detach(x) -> x: gradients are taken before optimizing
    Rule {
        name: "relu-relu",
        apply: relu_relu,
    }, // relu(relu(x)) -> relu(x)
    Rule {
        name: "reshape-reshape",
        apply: reshape_reshape,
    }, // reshape(reshape(x, a), b) -> reshape(x, b)
    Rule {
        name: "permute-permute",
        apply: permute_permute,
    }, // permute(permute(x, p), q) -> permute(x, p∘q)
    Rule {
        name: "expand-expand",
        apply: expand_expand,
    }, // expand(expand(x, a), b) -> expand(x, b)
    Rule {
        name: "view-noop",
        apply: view_noop,
    }, // reshape/permute/expand that changes nothing -> x
];

/// Runs the rules to a fixpoint on every node, then drops the nodes the
/// rewrites left unread; then `sum-of-products`, which needs each node's
/// readers, as a rule does not see them.
pub(crate) fn run(graph: &Graph) -> (Graph, Vec<String>) {
    let (rewritten, mut notes) = super::rewrite(graph, "simplify", RULES);
    let (merged, fired) = sums_of_products(&super::dce::run(&rewritten));
    if fired > 0 {
        notes.push(format!("simplify: sum-of-products x{fired}"));
    }
    (super::dce::run(&merged), notes)
}

/// The value of a node that is a constant everywhere: a `Const` or a
/// broadcast of one.
pub(super) fn constant(g: &Graph, id: NodeId) -> Option<Scalar> {
    let node = g.node(id);
    match &node.op {
        Op::Const(v) => Some(*v),
        Op::Expand(_) => constant(g, node.inputs[0]),
        _ => None,
    }
}

/// An elementwise op on constants is the constant it computes, evaluated by
/// the reference interpreter's own definition, broadcast to the node's shape.
fn fold_const(g: &mut Graph, op: &Op, inputs: &[NodeId], ty: &TensorType) -> Option<Rewrite> {
    match op {
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_) => {}
        _ => return None,
    }
    let values: Option<SmallVec<[Scalar; 3]>> = inputs.iter().map(|&id| constant(g, id)).collect();
    let value = interp::scalar_op(op, &values?)?;
    let c = g.push_typed(
        Op::Const(value),
        SmallVec::new(),
        TensorType::new(value.dtype(), Shape::scalar()),
    );
    Some(broadcast(c, &ty.shape))
}

fn broadcast(c: NodeId, shape: &Shape) -> Rewrite {
    if shape.rank() == 0 {
        Rewrite::To(c)
    } else {
        Rewrite::Node(Op::Expand(shape.clone()), SmallVec::from_slice(&[c]))
    }
}

fn is_value(g: &Graph, id: NodeId, want: Scalar) -> bool {
    constant(g, id) == Some(want)
}

fn one(ty: &TensorType) -> Scalar {
    Scalar::I32(1).cast(ty.dtype)
}

fn mul_one(g: &mut Graph, op: &Op, inputs: &[NodeId], ty: &TensorType) -> Option<Rewrite> {
    let Op::Binary(BinaryOp::Mul) = op else {
        return None;
    };
    let (a, b) = (inputs[0], inputs[1]);
    if is_value(g, b, one(ty)) {
        Some(Rewrite::To(a))
    } else if is_value(g, a, one(ty)) {
        Some(Rewrite::To(b))
    } else {
        None
    }
}

/// The zero that leaves every value unchanged when added: -0.0 for floats.
fn additive_identity(ty: &TensorType) -> Scalar {
    if ty.dtype.is_float() {
        Scalar::F32(-0.0).cast(ty.dtype)
    } else {
        Scalar::I32(0).cast(ty.dtype)
    }
}

fn add_zero(g: &mut Graph, op: &Op, inputs: &[NodeId], ty: &TensorType) -> Option<Rewrite> {
    let Op::Binary(BinaryOp::Add) = op else {
        return None;
    };
    let (a, b) = (inputs[0], inputs[1]);
    let zero = additive_identity(ty);
    if is_value(g, b, zero) {
        Some(Rewrite::To(a))
    } else if is_value(g, a, zero) {
        Some(Rewrite::To(b))
    } else {
        None
    }
}

fn sub_zero(g: &mut Graph, op: &Op, inputs: &[NodeId], ty: &TensorType) -> Option<Rewrite> {
    let Op::Binary(BinaryOp::Sub) = op else {
        return None;
    };
    // x - (+0) = x + (-0) = x for every x.
    is_value(g, inputs[1], Scalar::I32(0).cast(ty.dtype)).then_some(Rewrite::To(inputs[0]))
}

/// The single operand's node, for rules on ops of one operand.
fn operand<'g>(g: &'g Graph, inputs: &[NodeId]) -> Option<&'g Node> {
    match inputs {
        &[x] => Some(g.node(x)),
        _ => None,
    }
}

fn neg_neg(g: &mut Graph, op: &Op, inputs: &[NodeId], _: &TensorType) -> Option<Rewrite> {
    let inner = operand(g, inputs)?;
    match (op, &inner.op) {
        (Op::Unary(UnaryOp::Neg), Op::Unary(UnaryOp::Neg)) => Some(Rewrite::To(inner.inputs[0])),
        _ => None,
    }
}

fn detach(_: &mut Graph, op: &Op, inputs: &[NodeId], _: &TensorType) -> Option<Rewrite> {
    (*op == Op::Unary(UnaryOp::Detach)).then(|| Rewrite::To(inputs[0]))
}

fn relu_relu(g: &mut Graph, op: &Op, inputs: &[NodeId], _: &TensorType) -> Option<Rewrite> {
    match (op, &operand(g, inputs)?.op) {
        (Op::Unary(UnaryOp::Relu), Op::Unary(UnaryOp::Relu)) => Some(Rewrite::To(inputs[0])),
        _ => None,
    }
}

fn reshape_reshape(g: &mut Graph, op: &Op, inputs: &[NodeId], _: &TensorType) -> Option<Rewrite> {
    let inner = operand(g, inputs)?;
    match (op, &inner.op) {
        (Op::Reshape(to), Op::Reshape(_)) => {
            Some(Rewrite::Node(Op::Reshape(to.clone()), inner.inputs.clone()))
        }
        _ => None,
    }
}

fn permute_permute(g: &mut Graph, op: &Op, inputs: &[NodeId], _: &TensorType) -> Option<Rewrite> {
    let inner = operand(g, inputs)?;
    match (op, &inner.op) {
        (Op::Permute(outer), Op::Permute(first)) => {
            // Output axis i is inner axis outer[i], which is source axis first[outer[i]].
            let composed = outer.iter().map(|&p| first[p]).collect();
            Some(Rewrite::Node(Op::Permute(composed), inner.inputs.clone()))
        }
        _ => None,
    }
}

fn expand_expand(g: &mut Graph, op: &Op, inputs: &[NodeId], _: &TensorType) -> Option<Rewrite> {
    let inner = operand(g, inputs)?;
    match (op, &inner.op) {
        (Op::Expand(to), Op::Expand(_)) => {
            Some(Rewrite::Node(Op::Expand(to.clone()), inner.inputs.clone()))
        }
        _ => None,
    }
}

fn view_noop(g: &mut Graph, op: &Op, inputs: &[NodeId], ty: &TensorType) -> Option<Rewrite> {
    let same_shape = operand(g, inputs)?.ty.shape == ty.shape;
    let noop = match op {
        Op::Reshape(_) | Op::Expand(_) => same_shape,
        Op::Permute(perm) => perm.iter().enumerate().all(|(i, &p)| i == p),
        _ => false,
    };
    noop.then_some(Rewrite::To(inputs[0]))
}

/// Batched products of fewer elements than this stay as they are, summed.
const MIN_PRODUCTS: usize = 1 << 16;

/// Merged products with fewer outputs than this stay batched: the GEMM
/// shares a product among threads by its outputs, never along its depth,
/// so a long thin product would run on one thread where the batch ran on
/// all.
const MIN_OUTPUTS: usize = 1 << 12;

/// `graph` with every sum over the batch of a batched product that nothing
/// else reads as one product (`sum_of_products`), and how many there were.
fn sums_of_products(graph: &Graph) -> (Graph, usize) {
    let readers = super::readers(graph);
    let mut fired = 0;
    let merged = super::rebuild(graph, |g, node, inputs| {
        let alone = node.inputs.first().is_some_and(|p| readers[p.index()] == 1);
        if alone && let Some(id) = sum_of_products(g, &node.op, &inputs, &node.ty) {
            fired += 1;
            return id;
        }
        g.push_typed(node.op.clone(), inputs, node.ty.clone())
    });
    (merged, fired)
}

/// A sum over batch axes of a batched product, every batch axis it leaves
/// of size 1, as one product over the batch: `sum_i a[i] @ b[i]` is `[a[0]
/// .. a[S-1]] @ [b[0]; ..; b[S-1]]`, the batch merged into the depth. One
/// GEMM of depth `S * K` in place of `S` products and a pass over their
/// sum: the gradient of a weight broadcast over a batch (a convolution's
/// over its images, a linear layer's on 3-axis input). f32 only (halves,
/// not yet widened here, round each product): one accumulator sums the
/// same terms in another order, so the result differs from the reference's
/// by rounding only, as `split-reduce`'s sums do; and only where the
/// batched product is large enough for the pass over it to matter.
fn sum_of_products(g: &mut Graph, op: &Op, inputs: &[NodeId], ty: &TensorType) -> Option<NodeId> {
    let Op::Reduce {
        op: ReduceOp::Sum,
        axes,
    } = op
    else {
        return None;
    };
    let product = operand(g, inputs)?;
    if !matches!(product.op, Op::MatMul) || product.ty.dtype != DType::F32 {
        return None;
    }
    let dims = product.ty.shape.dims().to_vec();
    let (a, b) = (product.inputs[0], product.inputs[1]);
    let batch = dims.len() - 2;
    let summed = |axis: usize| axes.contains(&axis);
    let (m, n) = (dims[batch], dims[batch + 1]);
    if axes.is_empty()
        || product.ty.shape.numel() < MIN_PRODUCTS
        || m * n < MIN_OUTPUTS
        || axes.iter().any(|&axis| axis >= batch)
        || (0..batch).any(|x| !summed(x) && dims[x] != 1)
    {
        return None;
    }
    let depth = dims[..batch].iter().product::<usize>() * g.node(a).ty.shape.dims()[batch + 1];
    // a: [batch.., m, k] -> [m, batch.., k] -> [m, batch * k], its rows in
    // the order of b's: [batch.., k, n] -> [batch * k, n].
    let mut to_rows: SmallVec<[usize; 4]> = SmallVec::from_slice(&[batch]);
    to_rows.extend(0..batch);
    to_rows.push(batch + 1);
    let a = g.push(Op::Permute(to_rows), &[a]).ok()?;
    let a = g.push(Op::Reshape(Shape::new(&[m, depth])), &[a]).ok()?;
    let b = g.push(Op::Reshape(Shape::new(&[depth, n])), &[b]).ok()?;
    let c = g.push(Op::MatMul, &[a, b]).ok()?;
    g.push(Op::Reshape(ty.shape.clone()), &[c]).ok()
}
