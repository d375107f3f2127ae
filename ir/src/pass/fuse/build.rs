//! Building the fused graph from the fusion walk's decisions: one kernel
//! node per group, its inputs the buffers its members read, its body the
//! members' values at the kernel's index, then the group's side outputs.

use std::collections::HashMap;

use smallvec::SmallVec;

use super::{Plan, Role};
use crate::Error;
use crate::graph::{Graph, NodeId};
use crate::kernel::{Block, Expr, Kernel, KernelKind, Operand, SideOutput, gather_fill};
use crate::op::Op;
use crate::view::View;

impl Plan<'_> {
    /// The fused graph: the inputs, then one kernel node per group, in order,
    /// each followed by the nodes of its side outputs.
    pub(super) fn build(&self) -> Result<Graph, Error> {
        let graph = self.graph;
        let mut out = Graph::new(graph.name.clone());
        out.inputs = graph.inputs.clone();
        let mut map: Vec<Option<NodeId>> = vec![None; graph.nodes.len()];
        // Inputs first: a side output may be read before its kernel's root
        // comes in the arena, and a host kernel may come before an input it reads.
        for (i, node) in graph.nodes.iter().enumerate() {
            if let Op::Input { .. } = node.op {
                map[i] = Some(out.push_typed(node.op.clone(), SmallVec::new(), node.ty.clone()));
            }
        }
        for i in 0..graph.nodes.len() {
            let node = &graph.nodes[i];
            if let Some(group) = self.root_of[i] {
                let mut b = Builder {
                    plan: self,
                    group,
                    reads: Vec::new(),
                    memo: HashMap::new(),
                };
                let kernel = b.kernel()?;
                let inputs = b
                    .reads
                    .iter()
                    .map(|&r| {
                        map[r]
                            .ok_or_else(|| internal(format!("node #{r} is read but not a buffer")))
                    })
                    .collect::<Result<_, _>>()?;
                let id = out.push_typed(Op::Kernel(Box::new(kernel)), inputs, node.ty.clone());
                map[i] = Some(id);
                for (k, &s) in self.groups[group].side.iter().enumerate() {
                    let ty = graph.nodes[s].ty.clone();
                    let op = Op::SideOutput(k as u32);
                    map[s] = Some(out.push_typed(op, SmallVec::from_elem(id, 1), ty));
                }
            }
        }
        out.outputs = graph
            .outputs
            .iter()
            .map(|id| map[id.index()].ok_or_else(|| internal(format!("output {id} has no kernel"))))
            .collect::<Result<_, _>>()?;
        Ok(out)
    }
}

fn internal(message: String) -> Error {
    Error::Malformed {
        op: "fuse",
        message,
    }
}

/// The operands of node `n`, of a two-operand op (a gather, a scatter-add).
fn two_operands(plan: &Plan, n: usize) -> Result<[(usize, View); 2], Error> {
    <[(usize, View); 2]>::try_from(plan.operands(n).into_vec()).map_err(|_| {
        let op = plan.graph.nodes[n].op.name();
        internal(format!("a {op} node has two operands"))
    })
}

/// Builds the kernel of one group.
struct Builder<'p, 'g> {
    plan: &'p Plan<'g>,
    group: usize,
    /// The nodes read as buffers, in kernel input order.
    reads: Vec<usize>,
    memo: HashMap<(usize, Role, View), u32>,
}

impl Builder<'_, '_> {
    fn kernel(&mut self) -> Result<Kernel, Error> {
        let plan = self.plan;
        let g = &plan.groups[self.group];
        let root = &plan.graph.nodes[g.root];
        let kind = match g.core.map(|c| (c, &plan.graph.nodes[c].op)) {
            None => KernelKind::Elementwise,
            Some((c, Op::Reduce { op, axes })) => {
                let Some((p, view)) = plan.operands(c).into_iter().next() else {
                    return Err(internal("a reduction has no operand".to_string()));
                };
                let mut prologue = Block::default();
                self.emit(&mut prologue, Role::Prologue, p, &view)?;
                KernelKind::Reduce {
                    op: *op,
                    axes: axes.clone(),
                    shape: view.shape.clone(),
                    prologue,
                }
            }
            Some((c, Op::MatMul)) => {
                let mut sides = SmallVec::<[Operand; 2]>::new();
                for (side, (p, view)) in plan.operands(c).into_iter().enumerate() {
                    sides.push(self.operand(side as u8, p, view)?);
                }
                match <[Operand; 2]>::try_from(sides.into_vec()) {
                    Ok([a, b]) => KernelKind::MatMul { a, b },
                    Err(_) => return Err(internal("a matmul has two operands".to_string())),
                }
            }
            Some((c, Op::ScatterAdd { axis, .. })) => {
                let [(updates, at), (indices, view)] = two_operands(plan, c)?;
                let mut prologue = Block::default();
                let index = self.emit(&mut prologue, Role::Prologue, indices, &view)?;
                let update = self.emit(&mut prologue, Role::Prologue, updates, &at)?;
                // The update is the prologue's result: its last value.
                if update as usize + 1 != prologue.values.len() {
                    let dtype = prologue.values[update as usize].dtype;
                    prologue.push(Expr::Cast(update), dtype);
                }
                KernelKind::Scatter {
                    axis: *axis,
                    shape: at.shape.clone(),
                    prologue,
                    index,
                }
            }
            Some((c, Op::Attention(op))) => KernelKind::Attention {
                op: *op,
                operands: (plan.operands(c).into_iter())
                    .map(|(p, view)| (self.read(p), view))
                    .collect(),
            },
            Some((c, _)) => return Err(internal(format!("node #{c} cannot be a kernel core"))),
        };
        let mut body = Block::default();
        let result = self.emit(
            &mut body,
            Role::Main,
            g.root,
            &View::contiguous(&root.ty.shape),
        )?;
        let mut side = Vec::with_capacity(g.side.len());
        for &s in &g.side {
            let place = plan.members[s]
                .iter()
                .find(|m| m.group == self.group)
                .and_then(|m| m.places.first())
                .ok_or_else(|| internal(format!("side output #{s} has no place")))?;
            side.push(SideOutput {
                ty: plan.graph.nodes[s].ty.clone(),
                value: self.emit(&mut body, Role::Main, s, place)?,
            });
        }
        // The result is the last value: after a side value the root does not
        // read (a hosted scalar's), a copy of it.
        if result as usize + 1 != body.values.len() {
            body.push(Expr::Cast(result), root.ty.dtype);
        }
        Ok(Kernel {
            inputs: self
                .reads
                .iter()
                .map(|&r| plan.graph.nodes[r].ty.clone())
                .collect(),
            out: root.ty.clone(),
            kind,
            body,
            side,
        })
    }

    /// Matmul operand `side`, node `p` read through `view`: computed by a
    /// block when `p` joined the operand's prologue, else read.
    fn operand(&mut self, side: u8, p: usize, view: View) -> Result<Operand, Error> {
        let role = Role::Operand(side);
        let plan = self.plan;
        let member = plan.members[p]
            .iter()
            .any(|m| m.group == self.group && m.role == role);
        if !plan.inline[p] && !member {
            return Ok(Operand::Read {
                input: self.read(p),
                view,
            });
        }
        // A view whose axes the product merges: read where its source lies.
        if let Op::View(fine) = &plan.graph.nodes[p].op {
            let source = plan.graph.nodes[p].inputs[0].index();
            return Ok(Operand::Merged {
                input: self.read(source),
                view: fine.clone(),
                shape: view.shape,
            });
        }
        let mut block = Block::default();
        self.emit(&mut block, role, p, &view)?;
        Ok(Operand::Computed {
            shape: view.shape,
            block,
        })
    }

    /// The kernel input index of buffer node `p`.
    fn read(&mut self, p: usize) -> u32 {
        let index = self.reads.iter().position(|&r| r == p).unwrap_or_else(|| {
            self.reads.push(p);
            self.reads.len() - 1
        });
        index as u32
    }

    /// The value of node `n` at the block's index, `place` mapping `n`'s own
    /// shape onto the block's space.
    fn emit(
        &mut self,
        block: &mut Block,
        role: Role,
        n: usize,
        place: &View,
    ) -> Result<u32, Error> {
        let key = (n, role, place.clone());
        if let Some(&v) = self.memo.get(&key) {
            return Ok(v);
        }
        let plan = self.plan;
        let node = &plan.graph.nodes[n];
        let member = plan.members[n]
            .iter()
            .any(|m| m.group == self.group && m.role == role);
        let dtype = node.ty.dtype;
        let v = if plan.groups[self.group].core == Some(n) && role == Role::Main {
            block.push(Expr::Acc, dtype)
        } else if let (Op::Gather { axis }, true) = (&node.op, member) {
            self.gather(block, role, n, *axis, place)?
        } else if plan.inline[n] || member {
            let mut args: SmallVec<[u32; 3]> = SmallVec::new();
            for (p, view) in plan.operands(n) {
                args.push(self.emit(block, role, p, &view.under(place))?);
            }
            let expr = match (&node.op, args.as_slice()) {
                (Op::Const(c), []) => Expr::Const(*c),
                (Op::Unary(u), &[x]) => Expr::Unary(*u, x),
                (Op::Binary(b), &[x, y]) => Expr::Binary(*b, x, y),
                (Op::Where, &[c, x, y]) => Expr::Where(c, x, y),
                (Op::Cast(_), &[x]) => Expr::Cast(x),
                // A computed view is its source read through it.
                (Op::View(_), &[x]) => {
                    self.memo.insert(key, x);
                    return Ok(x);
                }
                (op, _) => return Err(internal(format!("a {} node cannot be inlined", op.name()))),
            };
            block.push(expr, dtype)
        } else {
            let input = self.read(n);
            block.push(
                Expr::Load {
                    input,
                    view: place.clone(),
                },
                dtype,
            )
        };
        self.memo.insert(key, v);
        Ok(v)
    }

    /// Gather node `n` along `axis` at the block's index: its indices
    /// computed there, its table read as a buffer at the positions they give.
    fn gather(
        &mut self,
        block: &mut Block,
        role: Role,
        n: usize,
        axis: usize,
        place: &View,
    ) -> Result<u32, Error> {
        let node = &self.plan.graph.nodes[n];
        let len = self.plan.graph.nodes[node.inputs[0].index()]
            .ty
            .shape
            .dims()[axis];
        if len == 0 {
            // Every index is outside an empty axis.
            return Ok(block.push(Expr::Const(gather_fill(node.ty.dtype)), node.ty.dtype));
        }
        let [(table, from), (indices, view)] = two_operands(self.plan, n)?;
        let index = self.emit(block, role, indices, &view.under(place))?;
        let picks = node.ty.shape.dims()[axis];
        let (view, stride) = from
            .gathered(axis, picks)
            .ok_or_else(|| internal(format!("node #{n} gathers through padding")))?;
        let expr = Expr::Gather {
            input: self.read(table),
            view: view.under(place),
            index,
            stride,
            len,
        };
        Ok(block.push(expr, node.ty.dtype))
    }
}
