//! Captured values computed on once, when a graph is compiled: a part of a
//! traced graph that reads only values the function captured (a model's
//! weights) and constants, and computes something from them (an ONNX
//! LSTM's gates gathered into one matrix, a weight scaled), runs once in
//! `kiln::compile` and its result is captured in its place, as onnxruntime
//! folds a model's initializers. Left in the graph, it ran on every call:
//! the LSTM's gathered weights took half of each call
//! (`benches/RESULTS-cpu.md`).
//!
//! What is folded: each value computed from captured values that a value
//! computed from a call's inputs reads (or that the graph returns), below
//! any broadcast (a broadcast stays a view over the folded value), where
//! it computes something (views of a captured value alone cost nothing
//! where they are read) and holds no more elements than the captured values
//! it reads (a folded value never multiplies memory). Values of constants
//! alone (a causal mask from index ramps) stay in the graph: the kernels
//! that read them compute them in registers.

use std::sync::Arc;

use kiln_ir::{Data, DataRef, Graph, NodeId, Op};
use kiln_runtime::Storage;

use crate::backend::compile_graph;
use crate::tensor::Source;
use crate::{CompileOptions, Device, Result};

/// `graph` and its inputs' `sources` with every part that `fold` folds
/// computed on `device` (the interpreter for `Device::Reference`, else the
/// CPU) and captured; `None` where there is none.
pub(crate) fn captured(
    graph: &Graph,
    sources: &[Source],
    device: Device,
) -> Result<Option<(Graph, Vec<Source>)>> {
    let folded = foldable(graph, sources);
    if folded.is_empty() {
        return Ok(None);
    }
    let values = evaluate(graph, sources, &folded, device)?;
    Ok(Some(replaced(graph, sources, &folded, values)))
}

/// Whether `op` only moves or broadcasts its operand's elements.
fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape(_)
            | Op::Permute(_)
            | Op::Expand(_)
            | Op::Slice(_)
            | Op::Unfold { .. }
            | Op::Pad { .. }
    )
}

/// The nodes to fold, in the graph's order.
fn foldable(graph: &Graph, sources: &[Source]) -> Vec<NodeId> {
    let n = graph.nodes.len();
    // Per node: computed from captured host values and constants alone;
    // reads a captured value; computes (not only views); the elements of
    // the captured values it reads (a value read along two paths twice).
    let (mut constant, mut captured) = (vec![false; n], vec![false; n]);
    let (mut computes, mut read) = (vec![false; n], vec![0usize; n]);
    for (i, node) in graph.nodes.iter().enumerate() {
        let ins = || node.inputs.iter().map(|p| p.index());
        match node.op {
            Op::Input { index } => {
                let host = matches!(sources[index as usize], Source::Data(Storage::Host(_)));
                (constant[i], captured[i]) = (host, host);
                read[i] = node.ty.shape.numel();
            }
            Op::Const(_) => constant[i] = true,
            _ => {
                constant[i] = !node.inputs.is_empty() && ins().all(|p| constant[p]);
                captured[i] = ins().any(|p| captured[p]);
                computes[i] = !is_view(&node.op) || ins().any(|p| computes[p]);
                read[i] = ins().map(|p| read[p]).sum();
            }
        }
    }
    // Constant values read by values computed per call, or returned.
    let mut frontier = vec![false; n];
    for (i, node) in graph.nodes.iter().enumerate() {
        if !constant[i] {
            for p in &node.inputs {
                frontier[p.index()] |= constant[p.index()];
            }
        }
    }
    for o in &graph.outputs {
        frontier[o.index()] |= constant[o.index()];
    }
    let mut folded: Vec<NodeId> = Vec::new();
    for i in (0..n).filter(|&i| frontier[i]) {
        let mut at = i;
        while let Op::Expand(_) = graph.nodes[at].op {
            at = graph.nodes[at].inputs[0].index();
        }
        let node = &graph.nodes[at];
        let fits = node.ty.shape.numel() <= read[at];
        if captured[at] && computes[at] && fits && !folded.iter().any(|f| f.index() == at) {
            folded.push(NodeId(at as u32));
        }
    }
    folded.sort_by_key(|f| f.index());
    folded
}

/// The values of `folded`, computed from the captured values they read on
/// `device`.
fn evaluate(
    graph: &Graph,
    sources: &[Source],
    folded: &[NodeId],
    device: Device,
) -> Result<Vec<Data>> {
    let mut needed = vec![false; graph.nodes.len()];
    for f in folded {
        needed[f.index()] = true;
    }
    for i in (0..graph.nodes.len()).rev() {
        if needed[i] {
            for p in &graph.nodes[i].inputs {
                needed[p.index()] = true;
            }
        }
    }
    let mut sub = Graph::new(format!("{}:captured", graph.name));
    let mut at: Vec<Option<NodeId>> = vec![None; graph.nodes.len()];
    let mut data: Vec<Arc<Data>> = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate().filter(|(i, _)| needed[*i]) {
        at[i] = Some(match node.op {
            Op::Input { index } => {
                let Source::Data(Storage::Host(d)) = &sources[index as usize] else {
                    unreachable!("`foldable` folds values of captured host values alone")
                };
                data.push(d.clone());
                sub.input(node.ty.clone())
            }
            _ => {
                let inputs = node.inputs.iter().map(|p| at[p.index()].expect("earlier"));
                sub.push_typed(node.op.clone(), inputs.collect(), node.ty.clone())
            }
        });
    }
    sub.outputs = folded
        .iter()
        .map(|f| at[f.index()].expect("needed"))
        .collect();
    let on = match device {
        Device::Reference => Device::Reference,
        _ => Device::Cpu,
    };
    let mut exec = compile_graph(&sub, CompileOptions::on(on), &[])?;
    let mut values = exec.output_buffers()?;
    let inputs: Vec<DataRef> = data.iter().map(|d| d.as_ref().into()).collect();
    exec.run_into(&inputs, &mut values)?;
    Ok(values)
}

/// `graph` with each of `folded` a captured input holding its value, and
/// what no longer reaches an output dropped.
fn replaced(
    graph: &Graph,
    sources: &[Source],
    folded: &[NodeId],
    values: Vec<Data>,
) -> (Graph, Vec<Source>) {
    let n = graph.nodes.len();
    let mut value: Vec<Option<Data>> = (0..n).map(|_| None).collect();
    for (f, v) in folded.iter().zip(values) {
        value[f.index()] = Some(v);
    }
    let mut live = vec![false; n];
    for o in &graph.outputs {
        live[o.index()] = true;
    }
    for i in (0..n).rev() {
        if live[i] && value[i].is_none() {
            for p in &graph.nodes[i].inputs {
                live[p.index()] = true;
            }
        }
    }
    let mut out = Graph::new(graph.name.clone());
    let mut new_sources = Vec::new();
    let mut at: Vec<Option<NodeId>> = vec![None; n];
    for (i, node) in graph.nodes.iter().enumerate().filter(|(i, _)| live[*i]) {
        at[i] = Some(match (value[i].take(), &node.op) {
            (Some(v), _) => {
                new_sources.push(Source::Data(Storage::Host(Arc::new(v))));
                out.input(node.ty.clone())
            }
            (None, Op::Input { index }) => {
                new_sources.push(sources[*index as usize].clone());
                out.input(node.ty.clone())
            }
            (None, op) => {
                let inputs = node.inputs.iter().map(|p| at[p.index()].expect("earlier"));
                out.push_typed(op.clone(), inputs.collect(), node.ty.clone())
            }
        });
    }
    out.outputs = graph
        .outputs
        .iter()
        .map(|o| at[o.index()].expect("live"))
        .collect();
    (out, new_sources)
}
