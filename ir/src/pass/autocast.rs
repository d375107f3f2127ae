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
    let mut rounder = Rounder {
        half: to.dtype(),
        rounded: HashMap::new(),
        fed: HashMap::new(),
        values: 0,
    };
    let mut products = 0;
    let out = super::rebuild(graph, |out, node, inputs| {
        if !(matches!(node.op, Op::MatMul) && node.ty.dtype == DType::F32) {
            return out.push_typed(node.op.clone(), inputs, node.ty.clone());
        }
        products += 1;
        let inputs = inputs.iter().map(|&x| rounder.operand(out, x)).collect();
        out.push_typed(node.op.clone(), inputs, node.ty.clone())
    });
    let notes = match products {
        0 => Vec::new(),
        n => vec![format!(
            "{n} f32 products on operands rounded to {}: {} values rounded",
            rounder.half, rounder.values
        )],
    };
    (out, notes)
}

/// The roundings made so far, by the node of the graph being built that
/// each rounds.
struct Rounder {
    half: DType,
    /// A node and its value rounded, once made.
    rounded: HashMap<NodeId, NodeId>,
    /// Whether a node is computed from graph inputs and constants alone.
    fed: HashMap<NodeId, bool>,
    /// How many values were rounded.
    values: usize,
}

impl Rounder {
    /// Operand `x` of a product rounded, once for every product that reads
    /// it or the same views of it, beneath the views that fusion computes
    /// through: the value beneath transposes and broadcasts (`x` and `x.T`,
    /// a weight broadcast over a batch are one rounding), the views made
    /// again over it; and beneath a convolution's windows (and the reshapes
    /// and slices around them) the image's padded copy (or the image, where
    /// it is computed from graph inputs alone), which the product reads
    /// where it lies once a kernel has stored it rounded. Other views stay
    /// above the rounding, where a kernel reads through them (a reshape or
    /// padding of a rounding would have it stored first).
    fn operand(&mut self, out: &mut Graph, x: NodeId) -> NodeId {
        // Down the views rounding commutes with: whether they hold windows,
        // and the value beneath them.
        let (mut source, mut windows) = (x, false);
        while self.commutes(&out.node(source).op) {
            windows |= matches!(out.node(source).op, Op::Unfold { .. });
            source = out.node(source).inputs[0];
        }
        // Views of 16-bit values (padded with values they hold) are rounded
        // already.
        if holds(out, source, self.half) {
            return x;
        }
        self.round(out, x, windows)
    }

    /// Whether `op` is a view that rounding commutes with: padding only
    /// with a value of the 16-bit type.
    fn commutes(&self, op: &Op) -> bool {
        match op {
            Op::Pad { value, .. } => value.cast(self.half).to_f64() == value.to_f64(),
            op => op.is_movement(),
        }
    }

    /// `operand`'s rounding of `x`, through the views around windows where
    /// `windows`.
    fn round(&mut self, out: &mut Graph, x: NodeId, windows: bool) -> NodeId {
        if let Some(&r) = self.rounded.get(&x) {
            return r;
        }
        let node = out.node(x).clone();
        let through = self.commutes(&node.op)
            && match node.op {
                Op::Permute(_) | Op::Expand(_) => true,
                Op::Reshape(_) | Op::Slice(_) | Op::Unfold { .. } => windows,
                // A rounding of graph inputs alone is computed inside each
                // kernel that reads it, never stored, so the product could
                // not read the windows where they lie: rounded beneath the
                // padding, the image is stored rounded, and padded by the
                // copy that padding is.
                Op::Pad { .. } => windows && self.fed(out, node.inputs[0]),
                _ => false,
            };
        let r = if through {
            let source = self.round(out, node.inputs[0], windows);
            out.push_typed(node.op, SmallVec::from_slice(&[source]), node.ty)
        } else {
            self.values += 1;
            let shape = node.ty.shape;
            let narrow = TensorType::new(self.half, shape.clone());
            let h = out.push_typed(Op::Cast(self.half), SmallVec::from_slice(&[x]), narrow);
            let wide = TensorType::new(DType::F32, shape);
            out.push_typed(Op::Cast(DType::F32), SmallVec::from_slice(&[h]), wide)
        };
        self.rounded.insert(x, r);
        r
    }

    /// Whether `x` is computed from graph inputs and constants alone,
    /// elementwise and through views, as fusion's input-fed values are
    /// (each node decided once, without recursion).
    fn fed(&mut self, graph: &Graph, x: NodeId) -> bool {
        let mut stack = vec![x];
        while let Some(&id) = stack.last() {
            if self.fed.contains_key(&id) {
                stack.pop();
                continue;
            }
            let node = graph.node(id);
            let through = match node.op {
                Op::Input { .. } | Op::Const(_) => Some(true),
                Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_) => None,
                ref op if op.is_movement() => None,
                _ => Some(false),
            };
            let pending = node.inputs.iter().find(|i| !self.fed.contains_key(i));
            match (through, pending) {
                (Some(known), _) => {
                    self.fed.insert(id, known);
                    stack.pop();
                }
                (None, Some(&next)) => stack.push(next),
                (None, None) => {
                    let all = node.inputs.iter().all(|i| self.fed[i]);
                    self.fed.insert(id, all);
                    stack.pop();
                }
            }
        }
        self.fed[&x]
    }
}

/// Whether `x` already holds values of `half`: it is a cast to f32 of one.
fn holds(graph: &Graph, x: NodeId, half: DType) -> bool {
    let node = graph.node(x);
    matches!(node.op, Op::Cast(DType::F32)) && graph.node(node.inputs[0]).ty.dtype == half
}
