//! Captured values computed on once, when a graph is compiled: a part of a
//! traced graph that reads only values the function captured (a model's
//! weights) and constants, and computes something from them (an ONNX
//! LSTM's gates gathered into one matrix, a weight scaled or flipped), runs
//! once in `kiln::compile` and its result is captured in its place, as
//! onnxruntime folds a model's initializers. Left in the graph, it ran on
//! every call (an exported LSTM's: `benches/RESULTS-cpu.md`).
//!
//! What is folded: each value computed from captured values that a value
//! computed from a call's inputs reads (or that the graph returns), below
//! the views over it (which stay views, reading the folded value where it
//! lies as they read the captured one: views alone cost nothing where they
//! are read), where it holds no more elements than the distinct captured
//! values it reads: a value built by broadcasting (a causal mask from two
//! index ramps) stays in the kernels that compute it in registers. Values
//! of constants alone are no captured values and stay.
//! The fold runs on the CPU (the interpreter for `Device::Reference`),
//! in f32 where the graph is f32, whatever the target's precision.

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
    // reads a captured value.
    let (mut constant, mut captured) = (vec![false; n], vec![false; n]);
    for (i, node) in graph.nodes.iter().enumerate() {
        let ins = || node.inputs.iter().map(|p| p.index());
        match node.op {
            Op::Input { index } => {
                let host = matches!(sources[index as usize], Source::Data(Storage::Host(_)));
                (constant[i], captured[i]) = (host, host);
            }
            Op::Const(_) => constant[i] = true,
            _ => {
                constant[i] = ins().all(|p| constant[p]);
                captured[i] = ins().any(|p| captured[p]);
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
        // Views stay views over the folded value: they read it where it
        // lies, as they read the captured value (a transposed weight, which
        // a product reads in place), and are never larger than it.
        let mut at = i;
        while is_view(&graph.nodes[at].op) {
            at = graph.nodes[at].inputs[0].index();
        }
        let computed = !matches!(graph.nodes[at].op, Op::Input { .. } | Op::Const(_));
        let fits = || graph.nodes[at].ty.shape.numel() <= captured_elements(graph, at);
        if captured[at] && computed && !folded.iter().any(|f| f.index() == at) && fits() {
            folded.push(NodeId(at as u32));
        }
    }
    folded.sort_by_key(|f| f.index());
    folded
}

/// The elements of the distinct captured values (graph inputs) that node
/// `at` reads.
fn captured_elements(graph: &Graph, at: usize) -> usize {
    let mut seen = vec![false; at + 1];
    let mut stack = vec![at];
    let mut elements = 0usize;
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        let node = &graph.nodes[i];
        match node.op {
            Op::Input { .. } => elements = elements.saturating_add(node.ty.shape.numel()),
            _ => stack.extend(node.inputs.iter().map(|p| p.index())),
        }
    }
    elements
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
