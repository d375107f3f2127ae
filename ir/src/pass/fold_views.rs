//! Movement ops become index maps: every chain of reshape, permute, expand,
//! slice and pad over a value becomes one `View` node on that value, which
//! `fuse` turns into the read of the kernel that consumes it. Nothing is
//! copied unless a kernel needs it.
//!
//! Where a movement op cannot join the view below it (a reshape across axes
//! whose strides do not merge, a reshape of a padded view, padding with a
//! second value), the view below stays a node of its own and the new view
//! reads it; `fuse` materializes such a view as a copy.

use smallvec::SmallVec;

use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{Shape, TensorType};
use crate::view::View;

/// Folds every movement chain into one view, then drops the partial views
/// the chains left unread.
pub(crate) fn run(graph: &Graph) -> Graph {
    let folded = super::rebuild(graph, |g, node, inputs| {
        let movement = match node.op {
            Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) | Op::Slice(_) | Op::Pad { .. } => true,
            Op::Input { .. }
            | Op::Const(_)
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Cast(_)
            | Op::Reduce { .. }
            | Op::MatMul
            | Op::View(_)
            | Op::Kernel(_) => false,
        };
        if !movement {
            return g.push_typed(node.op.clone(), inputs, node.ty.clone());
        }
        let src = inputs[0];
        let folded = match &g.node(src).op {
            Op::View(view) => view.apply(&node.op).map(|v| (g.node(src).inputs[0], v)),
            _ => None,
        };
        let own = || {
            View::contiguous(&g.node(src).ty.shape)
                .apply(&node.op)
                .map(|v| (src, v))
        };
        match folded.or_else(own) {
            Some((base, view)) => push_view(g, base, view, &node.ty),
            // A contiguous view takes every movement op; keep the op if not, and
            // the verifier and `fuse` will say so.
            None => g.push_typed(node.op.clone(), inputs, node.ty.clone()),
        }
    });
    super::dce::run(&folded)
}

/// `base` read through `view`: nothing when the view is the identity, a
/// broadcast constant when it reads only padding.
fn push_view(g: &mut Graph, base: NodeId, view: View, ty: &TensorType) -> NodeId {
    if let Some(fill) = view.only_fill() {
        let c = g.push_typed(
            Op::Const(fill),
            SmallVec::new(),
            TensorType::new(fill.dtype(), Shape::scalar()),
        );
        let broadcast = View::contiguous(&Shape::scalar()).apply(&Op::Expand(ty.shape.clone()));
        return match broadcast {
            Some(v) if ty.shape.rank() > 0 => {
                g.push_typed(Op::View(v), SmallVec::from_slice(&[c]), ty.clone())
            }
            _ => c,
        };
    }
    if view.is_contiguous() && view.shape == g.node(base).ty.shape {
        return base;
    }
    g.push_typed(Op::View(view), SmallVec::from_slice(&[base]), ty.clone())
}
