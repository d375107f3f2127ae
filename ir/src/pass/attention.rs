//! `attention`: `softmax(q kᵀ · scale + bias) v` as one op
//! (`Op::Attention`), where the target runs it as one kernel
//! (`Options::attention`) that never stores the scores whole.
//!
//! It finds, after `simplify` and `cse`, the ops that
//! `Tensor::scaled_dot_product_attention` writes and those of a plain
//! softmax between two products (`Tensor::softmax`, ONNX's `Softmax`):
//!
//! ```text
//! x = q @ kt, times or over a constant, plus a bias (each where there is one)
//! m = max(x) along the last axis        (or where(m == -inf, 0, m))
//! e = exp(x - m)
//! d = sum(e) along the last axis        (or where(d == 0, 1, d))
//! y = (e * recip(d)) @ v
//! ```
//!
//! where nothing else reads a value in between: a training step, which
//! reads the softmax again for its gradient, keeps its ops. The op means
//! exactly these (`Attention::evaluate`), so the reference gives the same
//! bits; a backend's kernel sums in another order.

use smallvec::SmallVec;

use super::simplify::constant;
use crate::attention::{Attention, Scale, transposed};
use crate::elementwise::{BinaryOp, ReduceOp, UnaryOp};
use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{DType, Scalar};

/// Scores per batch below which the ops stay: attention over a few keys
/// costs more as a kernel of its own than its scores cost in memory.
const MIN_SCORES: usize = 1 << 12;

/// Scores per batch below which an attention without a bias keeps its ops:
/// they stay in L2, where the batched products and softmax took less time
/// than the kernel (ViT-B's 197 patches, `benches/RESULTS-cpu.md`). With a
/// bias the kernel skips the blocks it hides (a causal mask's half).
const MIN_UNBIASED_SCORES: usize = 1 << 16;

/// `graph` with each attention found as one op, and a note of how many.
pub(crate) fn run(graph: &Graph) -> (Graph, Vec<String>) {
    let readers = super::readers(graph);
    let found: Vec<Option<Found>> = (0..graph.nodes.len())
        .map(|i| find(graph, NodeId(i as u32), &readers))
        .collect();
    if found.iter().all(Option::is_none) {
        return (graph.clone(), Vec::new());
    }
    let mut count = 0;
    let mut out = Graph::new(graph.name.clone());
    out.inputs = graph.inputs.clone();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.nodes.len());
    for (node, found) in graph.nodes.iter().zip(&found) {
        let inputs: SmallVec<[NodeId; 2]> = node.inputs.iter().map(|id| map[id.index()]).collect();
        // The types were checked while matching; the ops stay if not.
        let id = match found.as_ref().and_then(|f| attention(&mut out, f, &map)) {
            Some(id) => {
                count += 1;
                id
            }
            None => out.push_typed(node.op.clone(), inputs, node.ty.clone()),
        };
        map.push(id);
    }
    out.outputs = graph.outputs.iter().map(|id| map[id.index()]).collect();
    let note = format!("attention: {count} softmax products as one op");
    (super::dce::run(&out), vec![note])
}

/// An attention found at a product: its op, and its operands in the
/// graph: queries, keys transposed (`[.., e, s]`), values, the bias.
struct Found {
    op: Attention,
    operands: SmallVec<[NodeId; 4]>,
}

/// The attention node of `found` in `out`, its keys `kt` transposed back.
fn attention(out: &mut Graph, found: &Found, map: &[NodeId]) -> Option<NodeId> {
    let mut operands: SmallVec<[NodeId; 4]> =
        found.operands.iter().map(|id| map[id.index()]).collect();
    let rank = out.node(operands[1]).ty.shape.rank();
    operands[1] = out
        .push(Op::Permute(transposed(rank)), &[operands[1]])
        .ok()?;
    out.push(Op::Attention(found.op), &operands).ok()
}

/// The attention whose last product is node `root`, if it is one.
fn find(g: &Graph, root: NodeId, readers: &[usize]) -> Option<Found> {
    let mut walk = Walk {
        g,
        inner: Vec::new(),
    };
    let node = g.node(root);
    if node.op != Op::MatMul || node.ty.dtype != DType::F32 {
        return None;
    }
    let [w, v] = [node.inputs[0], node.inputs[1]];
    let (e, r) = walk.either(w, |walk, a, b| {
        walk.op(a, &Op::Unary(UnaryOp::Exp))?;
        let r = walk.broadcast(b);
        walk.op(r, &Op::Unary(UnaryOp::Recip)).map(|_| (a, r))
    })?;
    walk.op(w, &Op::Binary(BinaryOp::Mul))?;
    let (d, sum_guarded) = walk.guarded(g.node(r).inputs[0], (0.0, 1.0));
    walk.reduce(d, ReduceOp::Sum, e)?;
    let sub = walk.op(g.node(e).inputs[0], &Op::Binary(BinaryOp::Sub))?;
    let [x, shift] = [sub[0], walk.broadcast(sub[1])];
    let (m, max_guarded) = walk.guarded(shift, (f32::NEG_INFINITY, 0.0));
    walk.reduce(m, ReduceOp::Max, x)?;
    if sum_guarded != max_guarded {
        return None;
    }
    let (scaled, bias) = match g.node(x).op {
        Op::Binary(BinaryOp::Add) => {
            walk.inner.push(x);
            walk.either(x, |walk, a, b| walk.scaled(a).map(|s| (s, Some(b))))?
        }
        _ => (walk.scaled(x)?, None),
    };
    let (product, scale) = scaled;
    let scores = &g.node(product).ty.shape;
    let [l, s] = [
        scores.dims()[scores.rank() - 2],
        scores.dims()[scores.rank() - 1],
    ];
    let least = match bias {
        Some(_) => MIN_SCORES,
        None => MIN_UNBIASED_SCORES,
    };
    if l * s < least || g.node(x).ty.dtype != DType::F32 {
        return None;
    }
    // Every value in between is read by these ops alone.
    walk.inner.sort_unstable();
    walk.inner.dedup();
    let reads = |id: NodeId| {
        let by = walk
            .inner
            .iter()
            .chain([&root])
            .flat_map(|&n| &g.node(n).inputs);
        by.filter(|&&i| i == id).count()
    };
    if walk
        .inner
        .iter()
        .any(|&n| n != root && readers[n.index()] != reads(n))
    {
        return None;
    }
    let mut operands: SmallVec<[NodeId; 4]> = SmallVec::from_slice(&g.node(product).inputs);
    operands.push(v);
    operands.extend(bias);
    // An operand the pattern computes itself (`x = p + p`) would keep
    // its scores.
    if operands.iter().any(|o| walk.inner.binary_search(o).is_ok()) {
        return None;
    }
    let op = Attention {
        scale,
        bias: bias.is_some(),
        guarded: max_guarded,
    };
    Some(Found { op, operands })
}

/// The ops of a match so far, their nodes collected as they are met.
struct Walk<'g> {
    g: &'g Graph,
    inner: Vec<NodeId>,
}

impl Walk<'_> {
    /// The operands of `id` where it is `op`, the node counted in.
    fn op(&mut self, id: NodeId, op: &Op) -> Option<SmallVec<[NodeId; 2]>> {
        let node = self.g.node(id);
        (node.op == *op).then(|| {
            self.inner.push(id);
            node.inputs.clone()
        })
    }

    /// `f` on the operands of binary node `id` in their order, then
    /// swapped, the nodes it met kept from the first that matches.
    fn either<T>(
        &mut self,
        id: NodeId,
        mut f: impl FnMut(&mut Self, NodeId, NodeId) -> Option<T>,
    ) -> Option<T> {
        let node = self.g.node(id);
        let &[a, b] = node.inputs.as_slice() else {
            return None;
        };
        let before = self.inner.len();
        for (a, b) in [(a, b), (b, a)] {
            if let Some(t) = f(self, a, b) {
                return Some(t);
            }
            self.inner.truncate(before);
        }
        None
    }

    /// `id`, or what it broadcasts, an expand counted in.
    fn broadcast(&mut self, id: NodeId) -> NodeId {
        let node = self.g.node(id);
        match node.op {
            Op::Expand(_) => {
                self.inner.push(id);
                node.inputs[0]
            }
            _ => id,
        }
    }

    /// `x` in `where(x == when, then, x)` (and whether it was guarded so),
    /// else `id` itself.
    fn guarded(&mut self, id: NodeId, (when, then): (f32, f32)) -> (NodeId, bool) {
        let node = self.g.node(id);
        let is = |id: NodeId, c: f32| constant(self.g, id) == Some(Scalar::F32(c));
        if let (Op::Where, &[cond, a, x]) = (&node.op, node.inputs.as_slice()) {
            let eq = self.g.node(cond);
            if eq.op == Op::Binary(BinaryOp::Eq) && is(a, then) {
                let [p, q] = [eq.inputs[0], eq.inputs[1]];
                if (p == x && is(q, when)) || (q == x && is(p, when)) {
                    self.inner.extend([id, cond]);
                    return (x, true);
                }
            }
        }
        (id, false)
    }

    /// Whether `id` reduces `of` by `op` along its last axis.
    fn reduce(&mut self, id: NodeId, op: ReduceOp, of: NodeId) -> Option<()> {
        let node = self.g.node(id);
        let last = node.ty.shape.rank().checked_sub(1)?;
        let Op::Reduce { op: o, axes } = &node.op else {
            return None;
        };
        (*o == op && axes.as_slice() == [last] && node.inputs[0] == of).then(|| self.inner.push(id))
    }

    /// The product `id` is, or is times or over a constant: the product
    /// and the scale.
    fn scaled(&mut self, id: NodeId) -> Option<(NodeId, Option<Scale>)> {
        let node = self.g.node(id);
        let f32_constant = |g, c| constant(g, c).filter(|c| c.dtype() == DType::F32);
        match node.op {
            Op::MatMul => {
                self.inner.push(id);
                Some((id, None))
            }
            Op::Binary(BinaryOp::Div) => {
                let [p, c] = [node.inputs[0], node.inputs[1]];
                // A divisor whose reciprocal overflows is not a factor.
                let scale = Scale::Over(f32_constant(self.g, c)?);
                if !scale.factor().is_finite() {
                    return None;
                }
                self.inner.push(id);
                self.op(p, &Op::MatMul).map(|_| (p, Some(scale)))
            }
            Op::Binary(BinaryOp::Mul) => {
                self.inner.push(id);
                self.either(id, |walk, p, c| {
                    let c = f32_constant(walk.g, c)?;
                    walk.op(p, &Op::MatMul).map(|_| (p, Some(Scale::Times(c))))
                })
            }
            _ => None,
        }
    }
}
