//! Which buffer each launch of a schedule reads and writes in a run, for
//! every backend: graph inputs where the caller has them, graph outputs
//! straight into the buffers that hold them after the run (a donated
//! output's is its input's), and the values in between in the memory
//! plan's slots. Outputs that no kernel writes (an input returned as it is,
//! a value returned twice) are copied after the launches.

use std::fmt::Write;

use kiln_ir::pass::Optimized;
use kiln_ir::schedule::Location;
use kiln_ir::{NodeId, Op};

use crate::backend::{Place, Places};

/// A buffer of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Graph input `i`'s.
    Input(u32),
    /// Graph output `k`'s (for a donated output, its input's).
    Output(usize),
    /// Slot `s` of the memory plan.
    Slot(usize),
}

/// The buffers of one launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Its operands, in order.
    pub args: Vec<Bound>,
    /// Its output.
    pub out: Bound,
    /// Its side outputs, in order.
    pub side: Vec<Bound>,
}

/// The buffers of every launch of a schedule, and the outputs copied after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bindings {
    /// By launch.
    pub launches: Vec<Binding>,
    /// `(k, from)`: graph output `k` is a copy of `from`, made after the
    /// launches.
    pub copies: Vec<(usize, Bound)>,
    /// Per slot: whether a run holds a value in it (a slot that only holds
    /// graph outputs needs no memory of its own). A launch's scratch is
    /// the backend's to count: the CPU's kernels work in theirs, CUDA's
    /// GEMMs in scratch of their own.
    pub used: Vec<bool>,
}

impl Bindings {
    /// The bindings of `optimized`'s schedule.
    pub fn new(optimized: &Optimized) -> Bindings {
        let graph = &optimized.graph;
        let schedule = &optimized.schedule;
        let places = Places::new(optimized);
        let output_of = |id: NodeId| graph.outputs.iter().position(|&o| o == id);
        let slot = |s: usize, id: NodeId| match output_of(id) {
            Some(k) => Bound::Output(k),
            None => Bound::Slot(s),
        };
        let mut used = vec![false; schedule.slots.len()];
        let launches = (schedule.launches.iter())
            .map(|launch| {
                let node = graph.node(launch.node);
                let args = (launch.inputs.iter().zip(&node.inputs))
                    .map(|(loc, &id)| match *loc {
                        // Inputs are read where the caller has them, outputs or not.
                        Location::Input(i) => Bound::Input(i),
                        Location::Slot(s) => slot(s, id),
                    })
                    .collect();
                let binding = Binding {
                    args,
                    out: slot(launch.output, launch.node),
                    side: launch.side.iter().map(|&(id, s)| slot(s, id)).collect(),
                };
                let written = std::iter::once(binding.out).chain(binding.side.iter().copied());
                for bound in written {
                    if let Bound::Slot(s) = bound {
                        used[s] = true;
                    }
                }
                binding
            })
            .collect();
        let mut copies = Vec::new();
        for (k, &id) in graph.outputs.iter().enumerate() {
            match (&graph.node(id).op, output_of(id)) {
                (Op::Input { index }, _) => match places.outputs[k] {
                    // A donated input that is its own output is already there.
                    Place::Donated(_) => {}
                    Place::Own(_) => copies.push((k, Bound::Input(*index))),
                },
                (_, Some(first)) if first != k => copies.push((k, Bound::Output(first))),
                _ => {}
            }
        }
        Bindings {
            launches,
            copies,
            used,
        }
    }

    /// The printed form: a line per launch and per copy, naming buffers as
    /// `input i`, `output k` (with `= input i` where it is written over a
    /// donated input) and `slot s`.
    pub fn print(&self, optimized: &Optimized) -> String {
        let donated = &optimized.schedule.donated;
        let name = |b: &Bound| match *b {
            Bound::Input(i) => format!("input {i}"),
            Bound::Output(k) => match donated.iter().find(|p| p.1 as usize == k) {
                Some(&(i, _)) => format!("output {k} = input {i}"),
                None => format!("output {k}"),
            },
            Bound::Slot(s) => format!("slot {s}"),
        };
        let mut text = String::new();
        for (l, b) in self.launches.iter().enumerate() {
            let args: Vec<String> = b.args.iter().map(name).collect();
            let _ = write!(
                text,
                "launch {l}: ({}) -> {}",
                args.join(", "),
                name(&b.out)
            );
            for s in &b.side {
                let _ = write!(text, ", {}", name(s));
            }
            text.push('\n');
        }
        for (k, from) in &self.copies {
            let _ = writeln!(text, "copy {} -> output {k}", name(from));
        }
        text
    }
}
