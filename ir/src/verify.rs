//! The verifier: checks the invariants every pass relies on, and runs after
//! every stage. A failure is a compiler bug, so it carries the graph dump.
//! `verify_graph_ops` checks the one invariant that holds only before
//! lowering: the graph holds graph ops, no post-fusion node.

use crate::Error;
use crate::graph::Graph;
use crate::op::{Op, OpLayer};

/// Checks that `graph` is well formed:
/// - every operand refers to an earlier node (the arena is topological);
/// - every node's stored type is what its op infers from its operands (a
///   side output's, what its kernel declares);
/// - every side output of a kernel has exactly one node;
/// - every declared input has exactly one `Input` node;
/// - every output is in the arena.
pub fn verify(graph: &Graph) -> Result<(), Error> {
    let fail = |message: String| Error::Verify {
        message,
        dump: graph.to_string(),
    };
    let mut input_seen = vec![false; graph.inputs.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if let Some(bad) = node.inputs.iter().find(|id| id.index() >= i) {
            return Err(fail(format!(
                "node #{i} ({}) reads {bad}, which does not come before it",
                node.op.name()
            )));
        }
        let args: Vec<_> = node
            .inputs
            .iter()
            .map(|id| &graph.nodes[id.index()].ty)
            .collect();
        let ty = match (&node.op, node.inputs.as_slice()) {
            (Op::SideOutput(k), [kernel]) => match &graph.nodes[kernel.index()].op {
                Op::Kernel(kernel) => kernel.side.get(*k as usize).map(|s| s.ty.clone()),
                _ => None,
            }
            .ok_or_else(|| fail(format!("node #{i} is side output {k} of no kernel")))?,
            _ => node
                .op
                .infer(&args, &graph.inputs)
                .map_err(|e| fail(format!("node #{i} is ill-typed: {e}")))?,
        };
        if ty != node.ty {
            return Err(fail(format!(
                "node #{i} ({}) is stored as {} but its operands make it {ty}",
                node.op.name(),
                node.ty
            )));
        }
        if let Op::Input { index } = node.op {
            // `infer` has checked that the index is declared.
            if std::mem::replace(&mut input_seen[index as usize], true) {
                return Err(fail(format!("input {index} has more than one node")));
            }
        }
    }
    // Each side output of a kernel has exactly one node.
    let mut side_nodes: Vec<Vec<u32>> = vec![Vec::new(); graph.nodes.len()];
    for node in &graph.nodes {
        if let (Op::SideOutput(k), [kernel]) = (&node.op, node.inputs.as_slice()) {
            side_nodes[kernel.index()].push(*k);
        }
    }
    for (i, (node, mut nodes)) in graph.nodes.iter().zip(side_nodes).enumerate() {
        let side = match &node.op {
            Op::Kernel(k) => k.side.len() as u32,
            _ => 0,
        };
        nodes.sort_unstable();
        if !nodes.iter().copied().eq(0..side) {
            return Err(fail(format!(
                "node #{i} has {side} side outputs but side output nodes {nodes:?}"
            )));
        }
    }
    if let Some(missing) = input_seen.iter().position(|seen| !seen) {
        return Err(fail(format!("input {missing} is declared but has no node")));
    }
    if let Some(bad) = graph
        .outputs
        .iter()
        .find(|id| id.index() >= graph.nodes.len())
    {
        return Err(fail(format!("output {bad} is not in the graph")));
    }
    Ok(())
}

/// Checks that `graph` holds graph ops only (`OpLayer::Graph`), no `View` or
/// `Kernel`: what a pass that works on recorded graphs may be handed. `pass`
/// names that pass in the error, which names the first post-fusion node.
pub fn verify_graph_ops(graph: &Graph, pass: &str) -> Result<(), Error> {
    let Some(i) = graph
        .nodes
        .iter()
        .position(|node| node.op.layer() != OpLayer::Graph)
    else {
        return Ok(());
    };
    Err(Error::Verify {
        message: format!(
            "{pass} takes graph ops only, but node #{i} is a {} node, which only the optimizer makes",
            graph.nodes[i].op.name()
        ),
        dump: graph.to_string(),
    })
}
