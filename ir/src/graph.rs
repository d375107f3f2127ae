//! The graph: an arena of plain-data nodes in topological order.
//!
//! A node only refers to nodes pushed before it, so the arena order is a
//! topological order and every pass can walk it front to back.
//!
//! One `Graph` type holds both layers of ops (see `op`): what users record
//! is a graph of graph ops, and the optimizer lowers it, stage by stage, to
//! a graph of inputs and kernels (`pass::Optimized`). A pass that must see
//! graph ops only checks its input with `verify::verify_graph_ops`.

use std::fmt;

use smallvec::SmallVec;

use crate::Error;
use crate::op::Op;
use crate::types::TensorType;

/// The position of a node in its graph's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The arena index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One operation applied to earlier nodes, with its result type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// Operands, all earlier in the arena.
    pub inputs: SmallVec<[NodeId; 2]>,
    /// The result type.
    pub ty: TensorType,
}

/// A computation: typed inputs, nodes, and the nodes it returns.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Graph {
    /// The name printed after `graph @`.
    pub name: String,
    /// Declared types of the inputs, by `Op::Input` index.
    pub inputs: Vec<TensorType>,
    /// The arena, in topological order.
    pub nodes: Vec<Node>,
    /// The results, in order.
    pub outputs: Vec<NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            inputs: Vec::new(),
            nodes: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// Declares the next input and returns its node.
    pub fn input(&mut self, ty: TensorType) -> NodeId {
        let index = self.inputs.len() as u32;
        self.inputs.push(ty.clone());
        self.push_typed(Op::Input { index }, SmallVec::new(), ty)
    }

    /// Appends `op` applied to `inputs`, typing it; a mistake in the operands
    /// is an `Err` that names the op and the shapes.
    pub fn push(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId, Error> {
        let mut args: SmallVec<[&TensorType; 3]> = SmallVec::new();
        for &id in inputs {
            let node = self.nodes.get(id.index()).ok_or_else(|| Error::Verify {
                message: format!("{}: operand {id} is not in the graph", op.name()),
                dump: self.to_string(),
            })?;
            args.push(&node.ty);
        }
        let ty = op.infer(&args, &self.inputs)?;
        drop(args);
        Ok(self.push_typed(op, SmallVec::from_slice(inputs), ty))
    }

    /// Appends a node whose type the caller already knows (a pass rewriting a
    /// node, or a front end that typed it when it was recorded). The verifier
    /// checks the type after every stage.
    pub fn push_typed(&mut self, op: Op, inputs: SmallVec<[NodeId; 2]>, ty: TensorType) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node { op, inputs, ty });
        id
    }

    /// The node at `id`.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// The types of the outputs, in order.
    pub fn output_types(&self) -> Vec<TensorType> {
        self.outputs
            .iter()
            .map(|&id| self.node(id).ty.clone())
            .collect()
    }
}
