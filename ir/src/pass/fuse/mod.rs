//! Fusion: groups the graph's ops into kernels, each computing one buffer
//! and, where the rules below allow, side outputs beside it.
//!
//! Nodes are decided from the outputs back, so every reader of a node is
//! decided before the node itself. A node joins the kernel of its readers
//! (is computed inside it, never stored) when:
//!
//! - it is elementwise, all its readers are in one kernel, and each reads it
//!   directly or through a broadcast or a transpose of one
//!   (`View::is_permuted_broadcast_of`), so the reader's index maps onto
//!   the node's own index;
//! - or it is a reduction or a matmul read by one kernel that has no core yet,
//!   directly (its epilogue) or, for a reduction, broadcast back along the
//!   reduced axes over the space it reduced (the sum+broadcast pattern:
//!   softmax, `x - mean(x)`);
//! - the operand of a reduction joins the reduction's prologue by the same
//!   rules, and may at once be part of the epilogue when that runs over the
//!   same space (`exp(x - m)` in softmax is recomputed there: the row is in
//!   cache, a second pass over memory is what fusion saves);
//! - an operand of a matmul that is elementwise work on graph inputs and
//!   constants alone (the cast and normalization of a batch of images)
//!   becomes that operand's prologue, computed once per element inside the
//!   matmul's kernel. An operand computed from a reduction or a matmul is
//!   stored instead: it is the epilogue of that kernel. Except mixed
//!   precision's rounding to 16 bits and back (`cast(cast(x, bf16), f32)`)
//!   of a value other kernels read too: each product rounds it in its
//!   operand's prologue, as it reads it, so the rounding costs no kernel
//!   and no buffer of its own (`rounding`).
//!
//! A gather joins its readers as an elementwise op does, its table always
//! a buffer: what it reads depends on indices known only at run time. A
//! scatter-add is always a kernel of its own, its sums stored with nothing
//! after them; its updates and indices join its prologue as a reduction's
//! operand does.
//!
//! A graph output that is elementwise and read only by one kernel at that
//! kernel's own index (the new moments an optimizer's update reads) is
//! computed inside that kernel and stored as a side output of it, unless
//! the kernel's epilogue runs over a reduction's whole space: so an update
//! writes the parameter and its optimizer state in one pass, in the
//! epilogue of the product or the sum that computes the gradient. And a
//! one-element output computed from graph inputs alone (an optimizer's step
//! count) is stored beside an earlier one-element kernel's (the loss).
//!
//! Everything else is materialized: the outputs, the other matmul operands,
//! values read by several kernels, values read through a non-broadcast view.
//! Exceptions keep values of graph inputs and constants alone unstored,
//! recomputed in every kernel that reads them: cheap elementwise ops (no
//! transcendental, no division) over inputs, constants and other such ops
//! (a one-hot row of labels), and any such value of one element (an
//! optimizer's bias corrections, computed once per launch). Constants are
//! inlined everywhere, except where padding or a matmul needs them as a
//! buffer. Each refusal is noted (`not fused: %7 has 2 readers in different
//! kernels`).
//!
//! A view node that cannot be folded into its reader (it is an output, is
//! read by another view, or pads a matmul operand) is a copy kernel.

mod build;
mod rounding;

use smallvec::SmallVec;

use super::Options;
use crate::Error;
use crate::elementwise::{BinaryOp, UnaryOp};
use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{DType, Shape};
use crate::view::View;

/// Where in a kernel a value is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Role {
    /// The body: at every output index.
    Main,
    /// A reduction's prologue: at every index of the reduced space.
    Prologue,
    /// The prologue of a matmul's operand 0 or 1: at every index of it.
    Operand(u8),
}

/// A node computed inside a kernel, and the index maps from its own shape to
/// that kernel's space under which it is computed there.
struct Membership {
    group: usize,
    role: Role,
    places: Vec<View>,
}

/// One kernel being formed: its output node, its reduction or matmul (if
/// any), and the space its body runs over (the output's shape).
struct Group {
    root: usize,
    core: Option<usize>,
    space: Shape,
    /// Graph outputs computed in the body and stored besides the root.
    side: Vec<usize>,
}

/// A node `consumer` reading another node as its operand `slot`, through
/// `view` (which presents the consumer's operand shape).
struct Edge {
    consumer: usize,
    slot: usize,
    view: View,
}

/// The decisions of the fusion walk.
struct Plan<'g> {
    graph: &'g Graph,
    /// View nodes read through rather than computed.
    transparent: Vec<bool>,
    /// Elementwise work on graph inputs and constants alone.
    input_fed: Vec<bool>,
    /// Input-fed values recomputed in every kernel that reads them rather
    /// than stored: cheap ops, or one element (see the module doc).
    cheap: Vec<bool>,
    /// Mixed precision's roundings that the products reading them compute
    /// in their operands' prologues (`rounding`).
    rounding: Vec<bool>,
    members: Vec<Vec<Membership>>,
    inline: Vec<bool>,
    root_of: Vec<Option<usize>>,
    groups: Vec<Group>,
}

/// Builds the kernels. With fusion off every op is a kernel of its own.
pub(crate) fn run(graph: &Graph, options: Options) -> Result<(Graph, Vec<String>), Error> {
    let mut plan = Plan::new(graph);
    let notes = plan.decide(options);
    let out = plan.build()?;
    Ok((out, notes))
}

impl<'g> Plan<'g> {
    fn new(graph: &'g Graph) -> Plan<'g> {
        let n = graph.nodes.len();
        let mut output = vec![false; n];
        for id in &graph.outputs {
            output[id.index()] = true;
        }
        // A view is read through unless something needs it as a buffer.
        let mut transparent: Vec<bool> = graph
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| matches!(node.op, Op::View(_)) && !output[i])
            .collect();
        for node in &graph.nodes {
            for (slot, id) in node.inputs.iter().enumerate() {
                let source = graph.node(*id);
                let needs_buffer = match (&node.op, &source.op) {
                    (Op::View(_), _) => true,
                    (Op::MatMul | Op::Attention(_), Op::View(v)) => v.mask.is_some(),
                    // A gather reads through no padding along its axis.
                    (Op::Gather { axis }, Op::View(v)) => {
                        slot == 0 && v.gathered(*axis, node.ty.shape.dims()[*axis]).is_none()
                    }
                    _ => false,
                };
                if needs_buffer {
                    transparent[id.index()] = false;
                }
            }
        }
        let mut plan = Plan {
            graph,
            transparent,
            input_fed: vec![false; n],
            cheap: vec![false; n],
            rounding: rounding::rounding(graph),
            members: (0..n).map(|_| Vec::new()).collect(),
            inline: vec![false; n],
            root_of: vec![None; n],
            groups: Vec::new(),
        };
        for i in 0..n {
            plan.input_fed[i] = match graph.nodes[i].op {
                Op::Input { .. } | Op::Const(_) => true,
                Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_) => {
                    plan.operands(i).iter().all(|(p, _)| plan.input_fed[*p])
                }
                _ => false,
            };
            plan.cheap[i] = plan.input_fed[i] && plan.recomputable(i);
        }
        plan
    }

    /// The node an operand really reads, and through which view: a
    /// transparent view is looked through.
    fn resolve(&self, id: NodeId) -> (usize, View) {
        let node = self.graph.node(id);
        match &node.op {
            Op::View(view) if self.transparent[id.index()] => {
                (node.inputs[0].index(), view.clone())
            }
            _ => (id.index(), View::contiguous(&node.ty.shape)),
        }
    }

    /// The operands of node `i` as (node read, view), views looked through.
    fn operands(&self, i: usize) -> SmallVec<[(usize, View); 3]> {
        let node = &self.graph.nodes[i];
        match &node.op {
            // A view that is computed reads its source through itself.
            Op::View(view) => SmallVec::from_elem((node.inputs[0].index(), view.clone()), 1),
            _ => node.inputs.iter().map(|&id| self.resolve(id)).collect(),
        }
    }

    /// Decides every node, outputs first; returns the notes on refusals.
    fn decide(&mut self, options: Options) -> Vec<String> {
        let graph = self.graph;
        let mut edges: Vec<Vec<Edge>> = (0..graph.nodes.len()).map(|_| Vec::new()).collect();
        for (i, node) in graph.nodes.iter().enumerate() {
            if !self.transparent[i] && !matches!(node.op, Op::Input { .. }) {
                for (slot, (p, view)) in self.operands(i).into_iter().enumerate() {
                    edges[p].push(Edge {
                        consumer: i,
                        slot,
                        view,
                    });
                }
            }
        }
        let mut output = vec![false; graph.nodes.len()];
        for id in &graph.outputs {
            output[id.index()] = true;
        }
        let number = graph.numbering();
        let mut notes = Vec::new();
        if !options.fusion {
            notes.push("fuse: fusion is off: one kernel per op".to_string());
        }
        for i in (0..graph.nodes.len()).rev() {
            let node = &graph.nodes[i];
            if matches!(node.op, Op::Input { .. }) || self.transparent[i] {
                continue;
            }
            // Readers that were themselves dropped (dead) do not count.
            let live: Vec<&Edge> = edges[i]
                .iter()
                .filter(|e| !self.members[e.consumer].is_empty())
                .collect();
            if live.is_empty() && !output[i] {
                continue;
            }
            let decision = if output[i] && options.fusion {
                self.side_output(i, &live)
            } else if output[i] {
                Err("is a graph output".to_string())
            } else if let Op::Const(_) = node.op {
                self.constant(&live)
            } else if !options.fusion {
                Err(String::new())
            } else {
                self.join(i, &live)
            };
            match decision {
                Ok(members) if members.is_empty() => self.inline[i] = true,
                Ok(members) => {
                    for m in &members {
                        if matches!(node.op, Op::Reduce { .. } | Op::MatMul) {
                            self.groups[m.group].core = Some(i);
                        }
                        if output[i] {
                            self.groups[m.group].side.push(i);
                        }
                    }
                    self.members[i] = members;
                }
                Err(reason) => {
                    if !live.is_empty() && !reason.is_empty() {
                        notes.push(format!("not fused: %{} {reason}", number[i]));
                    }
                    self.root(i);
                }
            }
        }
        if options.fusion {
            self.host_scalars(&edges);
        }
        // Decided from the outputs back; read in graph order.
        notes.reverse();
        notes
    }

    /// Moves each graph output of one element computed from graph inputs
    /// and constants alone (an optimizer's step count, `t + 1`), a kernel of
    /// its own so far, into an earlier kernel of one element (the loss) as a
    /// side output, when that kernel comes before every kernel that reads it.
    fn host_scalars(&mut self, edges: &[Vec<Edge>]) {
        let graph = self.graph;
        let alone: Vec<bool> = (0..self.groups.len())
            .map(|own| {
                let r = self.groups[own].root;
                let node = &graph.nodes[r];
                self.root_of[r] == Some(own)
                    && self.groups[own].core.is_none()
                    && self.input_fed[r]
                    && node.ty.shape.numel() == 1
                    && elementwise(&node.op)
                    // Inputs, and constants inlined (not a kernel of their own,
                    // which might come after the host).
                    && self.operands(r).iter().all(|(p, _)| match graph.nodes[*p].op {
                        Op::Input { .. } => true,
                        Op::Const(_) => self.inline[*p],
                        _ => false,
                    })
            })
            .collect();
        // Only a kernel that stays is a host.
        for own in (0..self.groups.len()).filter(|&g| alone[g]) {
            let r = self.groups[own].root;
            let node = &graph.nodes[r];
            // The first kernel (by its root's position) that reads the value.
            let first_reader = edges[r]
                .iter()
                .flat_map(|e| &self.members[e.consumer])
                .map(|m| self.groups[m.group].root)
                .min()
                .unwrap_or(usize::MAX);
            let host = (0..self.groups.len()).find(|&h| {
                let g = &self.groups[h];
                !alone[h]
                    && self.root_of[g.root] == Some(h)
                    && g.root < first_reader
                    && g.space.numel() == 1
                    && self.may_host(h, node.ty.dtype)
                    && !g.core.is_some_and(|c| {
                        self.broadcast_reduction(c, &g.space)
                            || matches!(
                                self.graph.nodes[c].op,
                                Op::ScatterAdd { .. } | Op::Attention(_)
                            )
                    })
            });
            if let Some(h) = host {
                self.root_of[r] = None;
                self.members[r] = vec![Membership {
                    group: h,
                    role: Role::Main,
                    places: vec![View::contiguous(&self.groups[h].space)],
                }];
                self.groups[h].side.push(r);
            }
        }
    }

    /// Makes node `i` the output of a kernel of its own.
    fn root(&mut self, i: usize) {
        let node = &self.graph.nodes[i];
        let core = matches!(
            node.op,
            Op::Reduce { .. } | Op::MatMul | Op::ScatterAdd { .. } | Op::Attention(_)
        )
        .then_some(i);
        self.root_of[i] = Some(self.groups.len());
        self.members[i] = vec![Membership {
            group: self.groups.len(),
            role: Role::Main,
            places: vec![View::contiguous(&node.ty.shape)],
        }];
        self.groups.push(Group {
            root: i,
            core,
            space: node.ty.shape.clone(),
            side: Vec::new(),
        });
    }

    /// Where the readers of a node would compute it: (kernel, role, place)
    /// per reader and place, or why it must be a buffer.
    fn candidates(&self, live: &[&Edge]) -> Result<Vec<(usize, Role, View)>, String> {
        let mut out = Vec::new();
        for e in live {
            match self.graph.nodes[e.consumer].op {
                Op::Gather { .. } if e.slot == 0 => {
                    return Err("is gathered from, at positions known only at run time".to_string());
                }
                Op::Attention(_) => return Err("is an attention's operand".to_string()),
                _ => {}
            }
            for m in &self.members[e.consumer] {
                if self.groups[m.group].core == Some(e.consumer) {
                    let role = match self.graph.nodes[e.consumer].op {
                        Op::MatMul => Role::Operand(e.slot as u8),
                        _ => Role::Prologue,
                    };
                    out.push((m.group, role, e.view.clone()));
                } else {
                    for place in &m.places {
                        out.push((m.group, m.role, e.view.under(place)));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Graph output `i` as a side output of the one kernel that reads it, at
    /// that kernel's own index, or why it is a kernel's output of its own.
    fn side_output(&self, i: usize, live: &[&Edge]) -> Result<Vec<Membership>, String> {
        let refused = || Err("is a graph output".to_string());
        let node = &self.graph.nodes[i];
        if !elementwise(&node.op) {
            return refused();
        }
        let candidates = self.candidates(live)?;
        let Some(&(group, _, ref place)) = candidates.first() else {
            return refused();
        };
        let g = &self.groups[group];
        let at_own_index = candidates
            .iter()
            .all(|c| c.0 == group && c.1 == Role::Main && c.2 == *place)
            && *place == View::contiguous(&g.space)
            && place.is_broadcast_of(&node.ty.shape)
            && node.ty.shape.numel() == g.space.numel();
        let broadcast = g
            .core
            .is_some_and(|c| self.broadcast_reduction(c, &g.space));
        if !at_own_index || broadcast || !self.may_host(group, node.ty.dtype) {
            return refused();
        }
        Ok(vec![Membership {
            group,
            role: Role::Main,
            places: vec![place.clone()],
        }])
    }

    /// Whether kernel `group` may store side outputs of `dtype`: those of
    /// its output only.
    fn may_host(&self, group: usize, dtype: DType) -> bool {
        self.graph.nodes[self.groups[group].root].ty.dtype == dtype
    }

    /// Whether node `c` is a reduction whose epilogue would run over `space`
    /// as the space it reduces (broadcast back): such a kernel has no side
    /// outputs.
    fn broadcast_reduction(&self, c: usize, space: &Shape) -> bool {
        let node = &self.graph.nodes[c];
        matches!(node.op, Op::Reduce { .. }) && self.graph.node(node.inputs[0]).ty.shape == *space
    }

    /// A constant is inlined unless it is read through padding or by a matmul.
    fn constant(&self, live: &[&Edge]) -> Result<Vec<Membership>, String> {
        let candidates = self.candidates(live)?;
        if candidates.iter().any(|(_, _, place)| place.mask.is_some()) {
            return Err("is read through padding".to_string());
        }
        Ok(Vec::new())
    }

    /// The kernels node `i` joins, or why it is materialized.
    fn join(&self, i: usize, live: &[&Edge]) -> Result<Vec<Membership>, String> {
        let node = &self.graph.nodes[i];
        let candidates = self.candidates(live)?;
        if let Some(member) = self.merged_operand(i, &candidates) {
            return Ok(vec![member]);
        }
        let operand = candidates.iter().any(|c| matches!(c.1, Role::Operand(_)));
        if operand && !self.input_fed[i] && !self.rounding[i] {
            return Err("is a matmul operand".to_string());
        }
        let mut groups: SmallVec<[usize; 2]> = candidates.iter().map(|c| c.0).collect();
        groups.sort_unstable();
        groups.dedup();
        let readers = live.len();
        match &node.op {
            // A gather is computed at its reader's index as elementwise ops
            // are, its table read where it lies.
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_) | Op::Gather { .. } => {
                if groups.len() > 1 && !self.cheap[i] && !self.rounding[i] {
                    return Err(format!("has {readers} readers in different kernels"));
                }
                if candidates
                    .iter()
                    .any(|(_, _, place)| !place.is_permuted_broadcast_of(&node.ty.shape))
                {
                    return Err(
                        "is read through a view that is not a broadcast or a transpose".to_string(),
                    );
                }
                let mut members: Vec<Membership> = Vec::new();
                for (group, role, place) in candidates {
                    match members
                        .iter_mut()
                        .find(|m| m.group == group && m.role == role)
                    {
                        Some(m) if m.places.contains(&place) => {}
                        Some(m) => m.places.push(place),
                        None => members.push(Membership {
                            group,
                            role,
                            places: vec![place],
                        }),
                    }
                }
                Ok(members)
            }
            Op::Reduce { .. } | Op::MatMul => {
                let &[group] = groups.as_slice() else {
                    return Err(format!("has {readers} readers in different kernels"));
                };
                let g = &self.groups[group];
                if g.core.is_some() {
                    return Err(format!(
                        "would be a second reduction or matmul in the kernel of %{}",
                        self.graph.numbering()[g.root]
                    ));
                }
                if candidates.iter().any(|c| c.1 == Role::Prologue) {
                    return Err("feeds the prologue of a reduction".to_string());
                }
                if !g.side.is_empty() && self.broadcast_reduction(i, &g.space) {
                    return Err("would be broadcast in a kernel with side outputs".to_string());
                }
                let shape = &node.ty.shape;
                // The epilogue over the output itself (or a reshape adding or
                // dropping size-1 axes; for a product, any reshape, element
                // `i` reading product `i`: a convolution's product lands in
                // NCHW order as `[N, groups, O / groups, H * W]`), or over
                // the reduced space, broadcast back.
                let reshaped = |place: &View| {
                    matches!(node.op, Op::MatMul)
                        && place.is_contiguous()
                        && place.shape.numel() == shape.numel()
                };
                let direct = g.space.numel() == shape.numel()
                    && candidates
                        .iter()
                        .all(|c| c.2.is_broadcast_of(shape) || reshaped(&c.2));
                let broadcast = match node.op {
                    Op::Reduce { .. } => {
                        let reduced = &self.graph.node(node.inputs[0]).ty.shape;
                        let back = View::contiguous(shape).expand(reduced);
                        g.space == *reduced && candidates.iter().all(|c| c.2 == back)
                    }
                    _ => false,
                };
                if !direct && !broadcast {
                    return Err("is read through a view that is not its epilogue's".to_string());
                }
                Ok(vec![Membership {
                    group,
                    role: Role::Main,
                    places: candidates.into_iter().map(|c| c.2).collect(),
                }])
            }
            Op::ScatterAdd { .. } => Err("is a scatter-add, which stores its sums".to_string()),
            Op::Attention(_) => Err("is an attention, which stores its result".to_string()),
            Op::View(_) => Err("is a view that no reader can fold".to_string()),
            Op::Input { .. }
            | Op::Const(_)
            | Op::Reshape(_)
            | Op::Permute(_)
            | Op::Expand(_)
            | Op::Slice(_)
            | Op::Unfold { .. }
            | Op::Pad { .. }
            | Op::Kernel(_)
            | Op::SideOutput(_) => Err(format!(
                "is a {} node, which fusion does not take",
                node.op.name()
            )),
        }
    }

    /// View node `i` as a matmul operand read where its source lies
    /// (`Operand::Merged`), when the one matmul that reads it merges its
    /// axes in row-major order and its source is a buffer: the windows of a
    /// convolution, which would otherwise be copied out as the im2col
    /// matrix first.
    fn merged_operand(&self, i: usize, candidates: &[(usize, Role, View)]) -> Option<Membership> {
        let node = &self.graph.nodes[i];
        let Op::View(view) = &node.op else {
            return None;
        };
        let (group, role, place) = candidates.first()?;
        let same = candidates
            .iter()
            .all(|c| c.0 == *group && c.1 == *role && c.2 == *place);
        // The source is stored: a graph input, or a value that no kernel
        // computes inside another (a view read by a view, a reduction or a
        // product, elementwise work on more than graph inputs), never a
        // constant (inlined) or an operand's prologue.
        let source = node.inputs[0].index();
        let stored = match self.graph.nodes[source].op {
            Op::Input { .. } | Op::View(_) | Op::Reduce { .. } | Op::MatMul => true,
            ref op => elementwise(op) && !self.input_fed[source],
        };
        let merges = place.is_contiguous() && View::runs(&view.shape, &place.shape).is_some();
        (same && matches!(role, Role::Operand(_)) && view.mask.is_none() && stored && merges).then(
            || Membership {
                group: *group,
                role: *role,
                places: vec![place.clone()],
            },
        )
    }

    /// Whether recomputing input-fed node `i` in each of its readers costs
    /// less than storing it: it is one element, or a cheap op over graph
    /// inputs, constants and values that are themselves cheap.
    fn recomputable(&self, i: usize) -> bool {
        let node = &self.graph.nodes[i];
        let cheap_op = match node.op {
            Op::Unary(u) => matches!(u, UnaryOp::Neg | UnaryOp::Relu | UnaryOp::Abs),
            Op::Binary(b) => !matches!(
                b,
                BinaryOp::Div | BinaryOp::Pow | BinaryOp::Rem | BinaryOp::Uniform
            ),
            Op::Where | Op::Cast(_) => true,
            _ => false,
        };
        let cheap_operand = |p: usize| {
            matches!(self.graph.nodes[p].op, Op::Input { .. } | Op::Const(_)) || self.cheap[p]
        };
        node.ty.shape.numel() == 1
            || (cheap_op && self.operands(i).iter().all(|(p, _)| cheap_operand(*p)))
    }
}

/// Whether `op` is elementwise: computed at an index from its operands there.
fn elementwise(op: &Op) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_))
}
