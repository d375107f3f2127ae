//! Common subexpression elimination: a node equal to an earlier one (same op,
//! same operands) is that node, so equal subgraphs are computed once.

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::graph::{Graph, NodeId};
use crate::op::Op;

/// Merges equal nodes. Operands are merged before their readers, so equal
/// subgraphs of any depth collapse in one front-to-back walk.
pub(crate) fn run(graph: &Graph) -> Graph {
    let mut seen: HashMap<(Op, SmallVec<[NodeId; 2]>), NodeId> = HashMap::new();
    super::rebuild(graph, |g, node, inputs| {
        let key = (node.op.clone(), inputs);
        if let Some(&id) = seen.get(&key) {
            return id;
        }
        let id = g.push_typed(key.0.clone(), key.1.clone(), node.ty.clone());
        seen.insert(key, id);
        id
    })
}
