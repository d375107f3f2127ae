//! Mixed precision (`Options::autocast`): every f32 matmul multiplies its
//! operands rounded to bf16 or f16, accumulates in f32 and keeps its
//! product in f32. Everything else stays as the graph computes it.
//!
//! What runs in 16 bits and what does not: `Autocast`'s docs.
//!
//! A value is rounded once, however many products read it (a layer's input,
//! read by its forward product and its weight's gradient), as
//! `cast(cast(x, half), f32)`: later passes fuse the rounding into the kernel
//! that computes `x` or into the product's operand, and a backend that holds
//! 16-bit operands reads the rounded value as 16 bits (`pass::widen`).

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
        let f32_product = matches!(node.op, Op::MatMul) && node.ty.dtype == DType::F32;
        let inputs = if f32_product {
            products += 1;
            inputs
                .iter()
                .map(|&x| {
                    if let Some(&r) = rounded.get(&x) {
                        return r;
                    }
                    let r = if holds(out, x, half) {
                        x
                    } else {
                        values += 1;
                        let shape = out.node(x).ty.shape.clone();
                        let narrow = TensorType::new(half, shape.clone());
                        let h = out.push_typed(Op::Cast(half), SmallVec::from_slice(&[x]), narrow);
                        let wide = TensorType::new(DType::F32, shape);
                        out.push_typed(Op::Cast(DType::F32), SmallVec::from_slice(&[h]), wide)
                    };
                    rounded.insert(x, r);
                    r
                })
                .collect()
        } else {
            inputs
        };
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

/// Whether `x` already holds values of `half`: it is a cast to f32 of one.
fn holds(graph: &Graph, x: NodeId, half: DType) -> bool {
    let node = graph.node(x);
    matches!(node.op, Op::Cast(DType::F32)) && graph.node(node.inputs[0]).ty.dtype == half
}
