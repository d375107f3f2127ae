//! Dead code elimination: nodes no output depends on are dropped (inputs stay,
//! since they are the graph's signature; a kept kernel's side outputs stay,
//! since the kernel stores them).

use crate::graph::{Graph, NodeId};
use crate::op::Op;

/// Keeps the inputs, the nodes some output depends on, and the side
/// outputs of the kernels kept.
pub(crate) fn run(graph: &Graph) -> Graph {
    let mut live = vec![false; graph.nodes.len()];
    for id in &graph.outputs {
        live[id.index()] = true;
    }
    for (i, node) in graph.nodes.iter().enumerate().rev() {
        if live[i] {
            for id in &node.inputs {
                live[id.index()] = true;
            }
        }
    }
    // A side output reads only its kernel: kept with it, it keeps nothing else.
    for (i, node) in graph.nodes.iter().enumerate() {
        if matches!(node.op, Op::SideOutput(_)) && live[node.inputs[0].index()] {
            live[i] = true;
        }
    }
    let mut out = Graph::new(graph.name.clone());
    out.inputs = graph.inputs.clone();
    // A dropped node is read by no kept node, so its entry is never looked up.
    let mut map = vec![NodeId(0); graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if live[i] || matches!(node.op, Op::Input { .. }) {
            let inputs = node.inputs.iter().map(|id| map[id.index()]).collect();
            map[i] = out.push_typed(node.op.clone(), inputs, node.ty.clone());
        }
    }
    out.outputs = graph.outputs.iter().map(|id| map[id.index()]).collect();
    out
}
