//! Mixed precision's roundings (`pass::autocast`) that fusion lets the
//! products reading them compute in their operands' prologues.

use crate::graph::Graph;
use crate::op::Op;
use crate::types::DType;

/// Per node of `graph`: whether it is mixed precision's rounding of an f32
/// value `x`, `cast(cast(x, half), f32)`, or its narrowing half, that the
/// products reading it compute in their operands' prologues:
///
/// - the narrowing, where `x` (or the value beneath its unmasked views) is
///   stored anyway (other kernels read it, or it is an attention's or a
///   scatter-add's result, which their kernels store as they are): each
///   product rounds `x` as it reads it, and no kernel or buffer holds the
///   rounded value;
/// - the widening, always: where the narrowing is not the products', the
///   kernel that computes `x` stores it narrowed, 16 bits, which the
///   products read where it lies (a product landing in a 16-bit output
///   as well: every backend holds a product apart from an output that
///   cannot hold it, `Kernel::holds_product`).
pub(super) fn rounding(graph: &Graph) -> Vec<bool> {
    let n = graph.nodes.len();
    // Live nodes only: dead ones (dropped at `dce`) read nothing.
    let mut live = vec![false; n];
    for id in &graph.outputs {
        live[id.index()] = true;
    }
    let mut readers = vec![0usize; n];
    for i in (0..n).rev() {
        if !live[i] {
            continue;
        }
        for id in &graph.nodes[i].inputs {
            live[id.index()] = true;
            readers[id.index()] += 1;
        }
    }
    for id in &graph.outputs {
        readers[id.index()] += 1;
    }
    // The narrowings that only widenings read: (narrowing, widening).
    let pairs: Vec<(usize, usize)> = (0..n)
        .filter(|&i| live[i] && graph.nodes[i].op == Op::Cast(DType::F32))
        .filter_map(|i| {
            let narrow = graph.nodes[i].inputs[0];
            let node = graph.node(narrow);
            let rounds = matches!(node.op, Op::Cast(to) if to.is_half())
                && graph.node(node.inputs[0]).ty.dtype == DType::F32;
            rounds.then_some((narrow.index(), i))
        })
        .collect();
    let mut widened = vec![0usize; n];
    for &(narrow, _) in &pairs {
        widened[narrow] += 1;
    }
    let mut out = vec![false; n];
    for (narrow, wide) in pairs {
        let x = graph.nodes[narrow].inputs[0];
        // Beneath unmasked views (a product's operand reshaped by
        // `batch-rows`), the value other kernels may read too.
        let mut source = x;
        while let Op::View(view) = &graph.node(source).op
            && view.mask.is_none()
        {
            source = graph.node(source).inputs[0];
        }
        let stored = readers[x.index()] > 1
            || readers[source.index()] > 1
            || matches!(
                graph.node(source).op,
                Op::Attention(_) | Op::ScatterAdd { .. }
            );
        out[narrow] = stored && widened[narrow] == readers[narrow];
        out[wide] = true;
    }
    out
}
