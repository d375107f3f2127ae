//! The printed form of a graph: deterministic text for snapshots and humans.
//!
//! Values are numbered `%0, %1, ...`: the inputs first, in declaration order,
//! then every other node in arena (topological) order. Every line carries its
//! dtype and shape. Nothing depends on pointers, timings or hash order.
//!
//! ```text
//! graph @relu_add(%0: f32[4,4], %1: f32[4,4]) -> f32[4,4] {
//!   %2 = add %0, %1 : f32[4,4]
//!   %3 = relu %2 : f32[4,4]
//!   return %3
//! }
//! ```

use std::fmt::{self, Write};

use crate::graph::{Graph, NodeId};
use crate::op::Op;

impl Graph {
    /// The printed number of every node, indexed by arena position.
    fn numbering(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        // Inputs first, by declared index; a stable sort keeps arena order for the rest.
        order.sort_by_key(|&i| match self.nodes[i].op {
            Op::Input { index } => (0, index as usize),
            _ => (1, 0),
        });
        let mut number = vec![0; self.nodes.len()];
        for (n, &i) in order.iter().enumerate() {
            number[i] = n;
        }
        number
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let number = self.numbering();
        // An operand outside the arena prints as `%?`: the printer serves the
        // verifier, so it must show broken graphs too.
        let name = |id: &NodeId| match number.get(id.index()) {
            Some(n) => format!("%{n}"),
            None => format!("%?{}", id.0),
        };
        let mut inputs: Vec<(u32, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, node)| match node.op {
                Op::Input { index } => Some((index, i)),
                _ => None,
            })
            .collect();
        inputs.sort();
        write!(f, "graph @{}(", self.name)?;
        for (k, &(_, i)) in inputs.iter().enumerate() {
            let sep = if k > 0 { ", " } else { "" };
            write!(f, "{sep}%{}: {}", number[i], self.nodes[i].ty)?;
        }
        f.write_str(") -> ")?;
        let types: Vec<String> = self
            .outputs
            .iter()
            .map(|id| {
                self.nodes
                    .get(id.index())
                    .map_or("?".to_string(), |n| n.ty.to_string())
            })
            .collect();
        if types.len() == 1 {
            f.write_str(&types[0])?;
        } else {
            write!(f, "({})", types.join(", "))?;
        }
        f.write_str(" {\n")?;
        for (i, node) in self.nodes.iter().enumerate() {
            let operands: Vec<String> = node.inputs.iter().map(name).collect();
            let mut line = format!("  %{} = {}", number[i], node.op.name());
            if !operands.is_empty() {
                write!(line, " {}", operands.join(", "))?;
            }
            match &node.op {
                Op::Input { .. } => continue,
                Op::Const(v) => write!(line, " {v}")?,
                Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_) | Op::MatMul => {}
                Op::Reshape(s) | Op::Expand(s) => write!(line, " {}", compact(s.dims()))?,
                Op::Permute(p) => write!(line, " {}", compact(p))?,
                Op::Slice(ranges) => {
                    let parts: Vec<String> = ranges
                        .iter()
                        .map(|r| match r.step {
                            1 => format!("{}:{}", r.start, r.end),
                            s => format!("{}:{}:{s}", r.start, r.end),
                        })
                        .collect();
                    write!(line, " [{}]", parts.join(","))?;
                }
                Op::Pad { pads, value } => {
                    let parts: Vec<String> = pads.iter().map(|(b, a)| format!("{b}:{a}")).collect();
                    write!(line, " [{}] {value}", parts.join(","))?;
                }
                Op::Reduce { axes, .. } => write!(line, " axes {}", compact(axes))?,
            }
            writeln!(f, "{line} : {}", node.ty)?;
        }
        let outputs: Vec<String> = self.outputs.iter().map(name).collect();
        writeln!(f, "  return {}", outputs.join(", "))?;
        f.write_str("}\n")
    }
}

/// `[1,0]`: a list of numbers with no spaces, like the shapes in types.
fn compact(values: &[usize]) -> String {
    let parts: Vec<String> = values.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(","))
}
