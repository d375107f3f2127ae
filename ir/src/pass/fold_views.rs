//! Movement ops become index maps: every chain of reshape, permute, expand,
//! slice, unfold and pad over a value becomes one `View` node on that value, which
//! `fuse` turns into the read of the kernel that consumes it. Nothing is
//! copied unless a kernel needs it.
//!
//! Where a movement op cannot join the view below it (a reshape across axes
//! whose strides do not merge, a reshape of a padded view, windows along a
//! padded axis, padding with a second value), the view below stays a node of its own and the new view
//! reads it; `fuse` materializes such a view as a copy.
//!
//! A reshape or permute (which moves elements without repeating or dropping
//! any) of an elementwise value that nothing else reads moves below the op
//! where every operand that is a view takes it: `relu(x).T` becomes
//! `relu(x.T)`, and a chain of such ops takes the view down to where it can
//! fold into a read. (An operand view that did not take it would be a copy
//! the size of the result: a `cat` of 64 parts, read as rows, had 64.) The
//! chain then computes in its reader's order, so `fuse` can take it whole:
//! the normalization of images before the reshape that feeds a first layer,
//! a transposed activation returned as an output.

use smallvec::SmallVec;

use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{Shape, TensorType};
use crate::view::View;

/// Folds every movement chain into one view, then drops the partial views
/// the chains left unread.
pub(crate) fn run(graph: &Graph) -> Graph {
    let mut folder = Folder {
        g: Graph::new(graph.name.clone()),
        readers: Vec::new(),
    };
    folder.g.inputs = graph.inputs.clone();
    let readers = super::readers(graph);
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.nodes.len());
    for (i, node) in graph.nodes.iter().enumerate() {
        let inputs: SmallVec<[NodeId; 2]> = node.inputs.iter().map(|id| map[id.index()]).collect();
        let id = if node.op.is_movement() {
            folder.movement(&node.op, inputs[0], &node.ty)
        } else {
            folder.push(node.op.clone(), inputs, node.ty.clone())
        };
        folder.readers[id.index()] += readers[i].saturating_sub(1);
        map.push(id);
    }
    folder.g.outputs = graph.outputs.iter().map(|id| map[id.index()]).collect();
    super::dce::run(&folder.g)
}

/// `view` after the movement op `op`, or `None` when the result is not one
/// view (a reshape across non-mergeable strides, a reshape of a padded view,
/// an unfold along a padded axis, or a pad of a view padded with another
/// value) or `op` does not move.
fn moved(view: &View, op: &Op) -> Option<View> {
    match op {
        Op::Reshape(to) => view.reshape(to),
        Op::Permute(perm) => Some(view.permute(perm)),
        Op::Expand(to) => Some(view.expand(to)),
        Op::Slice(ranges) => Some(view.slice(ranges)),
        Op::Unfold { axis, size, step } => view.unfold(*axis, *size, *step),
        Op::Pad { pads, value } => view.pad(pads, *value),
        Op::Input { .. }
        | Op::Const(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Where
        | Op::Cast(_)
        | Op::Reduce { .. }
        | Op::MatMul
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::Attention(_)
        | Op::View(_)
        | Op::Kernel(_)
        | Op::SideOutput(_) => None,
    }
}

/// The graph being built, and how many readers each of its nodes has.
struct Folder {
    g: Graph,
    readers: Vec<usize>,
}

impl Folder {
    /// Pushes a node read once.
    fn push(&mut self, op: Op, inputs: SmallVec<[NodeId; 2]>, ty: TensorType) -> NodeId {
        let id = self.g.push_typed(op, inputs, ty);
        self.readers.push(1);
        id
    }

    /// `src` moved by `op` (of result type `ty`).
    fn movement(&mut self, op: &Op, src: NodeId, ty: &TensorType) -> NodeId {
        if let Some(sunk) = self.sink(op, src, &ty.shape) {
            return sunk;
        }
        let node = self.g.node(src);
        let folded = match &node.op {
            Op::View(view) => moved(view, op).map(|v| (node.inputs[0], v)),
            _ => None,
        };
        let own = || moved(&View::contiguous(&self.g.node(src).ty.shape), op).map(|v| (src, v));
        match folded.or_else(own) {
            Some((base, view)) => self.push_view(base, view, ty),
            // A contiguous view takes every movement op; keep the op if not, and
            // the verifier and `fuse` will say so.
            None => self.push(op.clone(), SmallVec::from_slice(&[src]), ty.clone()),
        }
    }

    /// `op` applied to the operands of `src` and `src`'s op to the results,
    /// when `op` only moves elements, `src` is elementwise and read by
    /// nothing else, and every operand view of `src` takes `op`; `None`
    /// otherwise.
    fn sink(&mut self, op: &Op, src: NodeId, shape: &Shape) -> Option<NodeId> {
        let node = self.g.node(src).clone();
        let moves = matches!(op, Op::Reshape(_) | Op::Permute(_));
        let elementwise = matches!(
            node.op,
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_)
        );
        if !moves || !elementwise || self.readers[src.index()] != 1 {
            return None;
        }
        // Else the result is stored once and its reader folds the move.
        let folds = |&x: &NodeId| match &self.g.node(x).op {
            Op::View(view) => moved(view, op).is_some(),
            _ => true,
        };
        if !node.inputs.iter().all(folds) {
            return None;
        }
        let mut moved: SmallVec<[NodeId; 2]> = SmallVec::new();
        for (k, &x) in node.inputs.iter().enumerate() {
            // An operand read twice (`x * x`) is moved once.
            let m = match node.inputs[..k].iter().position(|&y| y == x) {
                Some(j) => moved[j],
                None => {
                    let ty = TensorType::new(self.g.node(x).ty.dtype, shape.clone());
                    self.movement(op, x, &ty)
                }
            };
            moved.push(m);
        }
        // `src` is no longer read; the moved op takes its place.
        self.readers[src.index()] = 0;
        Some(self.push(
            node.op,
            moved,
            TensorType::new(node.ty.dtype, shape.clone()),
        ))
    }

    /// `base` read through `view`: nothing when the view is the identity, a
    /// broadcast constant when it reads only padding.
    fn push_view(&mut self, base: NodeId, view: View, ty: &TensorType) -> NodeId {
        if let Some(fill) = view.only_fill() {
            let c = self.push(
                Op::Const(fill),
                SmallVec::new(),
                TensorType::new(fill.dtype(), Shape::scalar()),
            );
            if ty.shape.rank() == 0 {
                return c;
            }
            let broadcast = View::contiguous(&Shape::scalar()).expand(&ty.shape);
            return self.push(Op::View(broadcast), SmallVec::from_slice(&[c]), ty.clone());
        }
        if view.is_contiguous() && view.shape == self.g.node(base).ty.shape {
            return base;
        }
        self.push(Op::View(view), SmallVec::from_slice(&[base]), ty.clone())
    }
}
