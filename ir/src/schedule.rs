//! The schedule: the order of kernel launches and the memory plan.
//!
//! Every kernel output lives in a slot of one arena. A slot is free again
//! once the last launch that reads its value has run, and a later output
//! takes the smallest free slot that fits it, so the arena's size, the peak
//! memory of a run, is known before the first launch. Outputs keep their
//! slots: they are handed to the caller. A kernel that needs working memory
//! (a matmul's computed operands, and a product its output cannot hold)
//! gets a slot for the length of its launch.

use std::fmt::Write;

use crate::graph::{Graph, NodeId};
use crate::op::Op;

/// Where a value lives during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// The caller's input buffer at this index.
    Input(u32),
    /// A slot of the arena.
    Slot(usize),
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The kernel node.
    pub node: NodeId,
    /// Where its operands are, in order.
    pub inputs: Vec<Location>,
    /// The slot it writes.
    pub output: usize,
    /// The slots of its side outputs, in order, and the `SideOutput` nodes
    /// that stand for them.
    pub side: Vec<(NodeId, usize)>,
    /// The slot of its working memory, if it needs any.
    pub scratch: Option<usize>,
    /// The slots whose last reader this launch is, free after it.
    pub frees: Vec<usize>,
}

/// The launches of a fused graph, in order, and its memory plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Launches in execution order.
    pub launches: Vec<Launch>,
    /// The size in bytes of every arena slot.
    pub slots: Vec<usize>,
    /// Where each graph output is found after the run.
    pub outputs: Vec<Location>,
    /// `(input, output)`: outputs written into the buffer of an input, which
    /// the caller donates to the run (`pass::donate`).
    pub donated: Vec<(u32, u32)>,
}

impl Schedule {
    /// Plans `graph`, a fused graph (inputs, kernels and their side outputs
    /// only, as `optimize` returns), or returns the node that is none of them.
    pub fn plan(graph: &Graph) -> Result<Schedule, NodeId> {
        let n = graph.nodes.len();
        // The last launch (by node position) that reads each value; a side
        // output node is no launch, and no reader of its kernel's output.
        let mut last_read = vec![None; n];
        // The side output nodes of each kernel node, in order.
        let mut side_nodes: Vec<Vec<(u32, NodeId)>> = vec![Vec::new(); n];
        for (i, node) in graph.nodes.iter().enumerate() {
            if let (Op::SideOutput(k), [kernel]) = (&node.op, node.inputs.as_slice()) {
                side_nodes[kernel.index()].push((*k, NodeId(i as u32)));
                continue;
            }
            for id in &node.inputs {
                last_read[id.index()] = Some(i);
            }
        }
        let mut keep = vec![false; n];
        for id in &graph.outputs {
            keep[id.index()] = true;
        }
        let mut location: Vec<Option<Location>> = vec![None; n];
        let mut slots: Vec<usize> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut launches = Vec::new();
        for (i, node) in graph.nodes.iter().enumerate() {
            match &node.op {
                Op::Input { index } => location[i] = Some(Location::Input(*index)),
                Op::Kernel(kernel) => {
                    let inputs: Vec<Location> = node
                        .inputs
                        .iter()
                        .map(|id| location[id.index()].ok_or(*id))
                        .collect::<Result<_, _>>()?;
                    let bytes = node.ty.shape.numel() * node.ty.dtype.size();
                    let output = take_slot(&mut slots, &mut free, bytes);
                    location[i] = Some(Location::Slot(output));
                    let mut side = Vec::with_capacity(kernel.side.len());
                    for (k, s) in kernel.side.iter().enumerate() {
                        // `fuse` gives every side output one node.
                        let id = side_nodes[i]
                            .iter()
                            .find(|(j, _)| *j as usize == k)
                            .map(|&(_, id)| id);
                        let slot = take_slot(
                            &mut slots,
                            &mut free,
                            s.ty.shape.numel() * s.ty.dtype.size(),
                        );
                        match id {
                            Some(id) => {
                                location[id.index()] = Some(Location::Slot(slot));
                                side.push((id, slot));
                            }
                            None => return Err(NodeId(i as u32)),
                        }
                    }
                    let scratch = match kernel.scratch_bytes() {
                        0 => None,
                        bytes => Some(take_slot(&mut slots, &mut free, bytes)),
                    };
                    // Operands read for the last time here are free after this launch.
                    let mut frees: Vec<usize> = node
                        .inputs
                        .iter()
                        .filter(|id| last_read[id.index()] == Some(i) && !keep[id.index()])
                        .filter_map(|id| match location[id.index()] {
                            Some(Location::Slot(s)) => Some(s),
                            _ => None,
                        })
                        .collect();
                    frees.extend(scratch);
                    // An output nothing reads (a matmul's accumulator kept
                    // apart by `pass::donate`, a side output whose reader
                    // was simplified away) is free after its launch.
                    let written =
                        std::iter::once((NodeId(i as u32), output)).chain(side.iter().copied());
                    frees.extend(
                        written
                            .filter(|(id, _)| last_read[id.index()].is_none() && !keep[id.index()])
                            .map(|(_, slot)| slot),
                    );
                    frees.sort_unstable();
                    frees.dedup();
                    free.extend(&frees);
                    launches.push(Launch {
                        node: NodeId(i as u32),
                        inputs,
                        output,
                        side,
                        scratch,
                        frees,
                    });
                }
                // Placed by its kernel's launch.
                Op::SideOutput(_) if location[i].is_some() => {}
                _ => return Err(NodeId(i as u32)),
            }
        }
        let outputs = graph
            .outputs
            .iter()
            .map(|id| location[id.index()].ok_or(*id))
            .collect::<Result<_, _>>()?;
        Ok(Schedule {
            launches,
            slots,
            outputs,
            donated: Vec::new(),
        })
    }

    /// The bytes the arena needs: the peak memory of a run beyond its inputs.
    pub fn peak_bytes(&self) -> usize {
        self.slots.iter().sum()
    }

    /// How many kernels a run launches.
    pub fn kernels(&self) -> usize {
        self.launches.len()
    }

    /// The printed form, naming kernels and values as `graph` prints them.
    pub fn print(&self, graph: &Graph) -> String {
        let number = graph.numbering();
        let kernel_names: Vec<usize> = graph
            .nodes
            .iter()
            .scan(0, |k, node| {
                let name = *k;
                if let Op::Kernel(_) = node.op {
                    *k += 1;
                }
                Some(name)
            })
            .collect();
        let loc = |l: &Location| match l {
            Location::Input(i) => format!("%{i}"),
            Location::Slot(s) => format!("slot {s}"),
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "schedule @{}: launches {}, slots {}, peak {} bytes",
            graph.name,
            self.launches.len(),
            self.slots.len(),
            self.peak_bytes()
        );
        for launch in &self.launches {
            let node = graph.node(launch.node);
            let args: Vec<String> = launch.inputs.iter().map(loc).collect();
            let _ = write!(
                out,
                "  @k{} %{} ({}) -> slot {} : {} ({} bytes)",
                kernel_names[launch.node.index()],
                number[launch.node.index()],
                args.join(", "),
                launch.output,
                node.ty,
                node.ty.shape.numel() * node.ty.dtype.size()
            );
            for (id, slot) in &launch.side {
                let ty = &graph.node(*id).ty;
                let bytes = ty.shape.numel() * ty.dtype.size();
                let _ = write!(
                    out,
                    ", %{} -> slot {slot} ({bytes} bytes)",
                    number[id.index()]
                );
            }
            if let Some(s) = launch.scratch {
                let _ = write!(out, ", scratch slot {s}");
            }
            if !launch.frees.is_empty() {
                let freed: Vec<String> = launch.frees.iter().map(|s| format!("slot {s}")).collect();
                let _ = write!(out, "; free {}", freed.join(", "));
            }
            out.push('\n');
        }
        let outputs: Vec<String> = self.outputs.iter().map(loc).collect();
        let _ = writeln!(out, "  return {}", outputs.join(", "));
        if !self.donated.is_empty() {
            let pairs: Vec<String> = self
                .donated
                .iter()
                .map(|(i, o)| format!("output {o} over %{i}"))
                .collect();
            let _ = writeln!(out, "  in place: {}", pairs.join(", "));
        }
        out
    }
}

/// The smallest free slot of at least `bytes`, or a new one.
fn take_slot(slots: &mut Vec<usize>, free: &mut Vec<usize>, bytes: usize) -> usize {
    let best = free
        .iter()
        .enumerate()
        .filter(|&(_, &s)| slots[s] >= bytes)
        .min_by_key(|&(_, &s)| slots[s])
        .map(|(k, _)| k);
    match best {
        Some(k) => free.swap_remove(k),
        None => {
            slots.push(bytes);
            slots.len() - 1
        }
    }
}
