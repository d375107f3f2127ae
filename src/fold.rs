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

use kiln_ir::{Data, DataRef, Graph, Node, NodeId, Op};
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
        while graph.nodes[at].op.is_movement() {
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
    let name = format!("{}:captured", graph.name);
    let (sub, captured) = cone(graph, name, folded, |_, node| match node.op {
        Op::Input { index } => Some(sources[index as usize].clone()),
        _ => None,
    });
    // Every input of the cone is a captured host value (`foldable`); were
    // one not, the run would refuse the inputs' count.
    let inputs: Vec<DataRef> = (captured.iter())
        .filter_map(|s| match s {
            Source::Data(Storage::Host(d)) => Some(d.as_ref().into()),
            _ => None,
        })
        .collect();
    let on = match device {
        Device::Reference => Device::Reference,
        _ => Device::Cpu,
    };
    let mut exec = compile_graph(&sub, CompileOptions::on(on), &[])?;
    let mut values = exec.output_buffers()?;
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
    let mut value: Vec<Option<Data>> = (0..graph.nodes.len()).map(|_| None).collect();
    for (f, v) in folded.iter().zip(values) {
        value[f.index()] = Some(v);
    }
    cone(
        graph,
        graph.name.clone(),
        &graph.outputs,
        |i, node| match (value[i].take(), &node.op) {
            (Some(v), _) => Some(Source::Data(Storage::Host(Arc::new(v)))),
            (None, Op::Input { index }) => Some(sources[*index as usize].clone()),
            (None, _) => None,
        },
    )
}

/// What `roots` read of `graph`, as a graph `name` of its own returning
/// the roots: a node that `input` gives a source for is an input with that
/// source (and what it reads is not copied), every other the same op on
/// its operands' copies. The inputs' sources, in order.
fn cone(
    graph: &Graph,
    name: String,
    roots: &[NodeId],
    mut input: impl FnMut(usize, &Node) -> Option<Source>,
) -> (Graph, Vec<Source>) {
    let n = graph.nodes.len();
    let mut given: Vec<Option<Source>> = graph
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| input(i, node))
        .collect();
    let mut read = vec![false; n];
    for r in roots {
        read[r.index()] = true;
    }
    for i in (0..n).rev() {
        if read[i] && given[i].is_none() {
            for p in &graph.nodes[i].inputs {
                read[p.index()] = true;
            }
        }
    }
    let mut out = Graph::new(name);
    let mut sources = Vec::new();
    // A node not copied maps past the arena, which the verifier refuses
    // should a copied node read it.
    let mut at = vec![NodeId(u32::MAX); n];
    for (i, node) in graph.nodes.iter().enumerate().filter(|(i, _)| read[*i]) {
        at[i] = match given[i].take() {
            Some(source) => {
                sources.push(source);
                out.input(node.ty.clone())
            }
            None => {
                let inputs = node.inputs.iter().map(|p| at[p.index()]).collect();
                out.push_typed(node.op.clone(), inputs, node.ty.clone())
            }
        };
    }
    out.outputs = roots.iter().map(|r| at[r.index()]).collect();
    (out, sources)
}
