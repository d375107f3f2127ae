//! Mixed precision (`Options::autocast`): every f32 matmul multiplies its
//! operands rounded to bf16 or f16, accumulates in f32 and keeps its
//! product in f32. Everything else stays as the graph computes it.
//!
//! What runs in 16 bits and what does not: `Autocast`'s docs.
//!
//! A value is rounded once, however many products read it or views of it
//! (a layer's input, read by its forward product and, transposed, by its
//! weight's gradient), as `cast(cast(x, half), f32)`: fusion puts the
//! rounding into the kernel that computes `x` or into each product's
//! operand (`fuse`'s module doc), and a backend whose GEMM multiplies
//! 16-bit operands reads the rounded value as 16 bits.

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{DType, TensorType};

use super::Autocast;

/// `graph` with the operands of its f32 matmuls rounded to `to`'s type; the
/// notes say how many products and values.
pub(crate) fn run(graph: &Graph, to: Autocast) -> (Graph, Vec<String>) {
    let half = to.dtype();
    // A node of `out` and its value rounded, once made.
    let mut rounded: HashMap<NodeId, NodeId> = HashMap::new();
    let mut products = 0;
    let mut values = 0;
    let out = super::rebuild(graph, |out, node, inputs| {
        if !(matches!(node.op, Op::MatMul) && node.ty.dtype == DType::F32) {
            return out.push_typed(node.op.clone(), inputs, node.ty.clone());
        }
        products += 1;
        let inputs = inputs
            .iter()
            .map(|&x| operand(out, x, half, &mut rounded, &mut values))
            .collect();
        out.push_typed(node.op.clone(), inputs, node.ty.clone())
    });
    let notes = match products {
        0 => Vec::new(),
        n => vec![format!(
            "{n} f32 products on operands rounded to {half}: {values} values rounded"
        )],
    };
    (out, notes)
}

/// Operand `x` of a product rounded to `half`, once for every product that
/// reads it or the same views of it, beneath the views that fusion
/// computes through: the value beneath transposes and broadcasts (`x` and
/// `x.T`, a weight broadcast over a batch are one rounding), the views
/// made again over it; and beneath a convolution's windows (and the
/// reshapes and slices around them) the image's padded copy (or the image,
/// where it is computed from graph inputs alone), which the product reads
/// where it lies once a kernel has stored it rounded.
/// Other views stay above the rounding, where a kernel reads through them
/// (a reshape or padding of a rounding would have it stored first).
/// `values` counts the values rounded.
fn operand(
    out: &mut Graph,
    x: NodeId,
    half: DType,
    rounded: &mut HashMap<NodeId, NodeId>,
    values: &mut usize,
) -> NodeId {
    let windows = beneath(out, x).any(|op| matches!(op, Op::Unfold { .. }));
    // Views of 16-bit values (padded with zeros, which they hold too) are
    // rounded already.
    let mut source = x;
    for _ in beneath(out, x) {
        source = out.node(source).inputs[0];
    }
    if holds(out, source, half) {
        return x;
    }
    round(out, x, half, windows, rounded, values)
}

/// The ops of the views beneath `x`, from `x` down.
fn beneath(graph: &Graph, mut x: NodeId) -> impl Iterator<Item = &Op> {
    std::iter::from_fn(move || {
        let node = graph.node(x);
        let view = matches!(
            node.op,
            Op::Reshape(_)
                | Op::Permute(_)
                | Op::Expand(_)
                | Op::Slice(_)
                | Op::Pad { .. }
                | Op::Unfold { .. }
        );
        view.then(|| {
            x = node.inputs[0];
            &node.op
        })
    })
}

/// `operand`'s rounding of `x`, through the views around windows where
/// `windows`.
fn round(
    out: &mut Graph,
    x: NodeId,
    half: DType,
    windows: bool,
    rounded: &mut HashMap<NodeId, NodeId>,
    values: &mut usize,
) -> NodeId {
    if let Some(&r) = rounded.get(&x) {
        return r;
    }
    let node = out.node(x).clone();
    let through = match node.op {
        Op::Permute(_) | Op::Expand(_) => true,
        Op::Reshape(_) | Op::Slice(_) | Op::Unfold { .. } => windows,
        // A rounding of graph inputs alone is computed inside each kernel
        // that reads it, never stored, so the product could not read the
        // windows where they lie: rounded beneath the padding, the image
        // is stored rounded, and padded by the copy that padding is.
        Op::Pad { .. } => windows && fed(out, node.inputs[0]),
        _ => false,
    };
    let r = if through {
        let source = round(out, node.inputs[0], half, windows, rounded, values);
        out.push_typed(node.op, SmallVec::from_slice(&[source]), node.ty)
    } else if holds(out, x, half) {
        x
    } else {
        *values += 1;
        let shape = node.ty.shape;
        let narrow = TensorType::new(half, shape.clone());
        let h = out.push_typed(Op::Cast(half), SmallVec::from_slice(&[x]), narrow);
        let wide = TensorType::new(DType::F32, shape);
        out.push_typed(Op::Cast(DType::F32), SmallVec::from_slice(&[h]), wide)
    };
    rounded.insert(x, r);
    r
}

/// Whether `x` is computed elementwise from graph inputs and constants
/// alone.
fn fed(graph: &Graph, x: NodeId) -> bool {
    let node = graph.node(x);
    match node.op {
        Op::Input { .. } | Op::Const(_) => true,
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_) => {
            node.inputs.iter().all(|&i| fed(graph, i))
        }
        _ => false,
    }
}

/// Whether `x` already holds values of `half`: it is a cast to f32 of one.
fn holds(graph: &Graph, x: NodeId, half: DType) -> bool {
    let node = graph.node(x);
    matches!(node.op, Op::Cast(DType::F32)) && graph.node(node.inputs[0]).ty.dtype == half
}
