//! Donated inputs: a graph output written into the buffer of the input it
//! replaces (a training step's new parameter over the old one, as JAX's
//! donated buffers), where that cannot change what any kernel reads.
//!
//! Output `o` may overwrite input `i` when the two have one type and
//!
//! - `o` is input `i` itself (a state the step leaves as it is: nothing is
//!   written), or the value of a kernel, stored nowhere else among the
//!   outputs, and input `i` is no output of its own;
//! - that kernel reads input `i` only in its body, at its own output index
//!   (the load's view is the output's own contiguous one): each element is
//!   read before it is overwritten, by the same thread, and no other
//!   element of it is read at all;
//! - no launch after it reads input `i`.
//!
//! A matmul or a reduction accumulates into its output buffer before its
//! body runs, which would overwrite input `i` before the body reads it, so
//! where the kernel's output is the one donated its body is rewritten: the
//! kernel's output becomes the raw accumulator (a temporary of the arena)
//! and the old result one more side output, written by the epilogue as the
//! rest are. A kernel with side outputs runs outside row groups, so no
//! reduction grouped with it reads rows it has overwritten. Pairs that fail
//! a condition are left to the caller, who keeps a second buffer for them;
//! the pass says why in its notes.

use crate::Error;
use crate::graph::{Graph, NodeId};
use crate::kernel::{Expr, Kernel, KernelKind, Operand, SideOutput};
use crate::op::Op;
use crate::schedule::{Location, Schedule};
use crate::types::DType;
use crate::verify::verify;
use crate::view::View;

use super::Optimized;

/// Rewrites `optimized` so that output `pair.1` is written over input
/// `pair.0` for each pair where that is safe (see the module doc), records
/// those in `schedule.donated` and returns the result with one note per
/// pair.
pub fn donate(
    optimized: &Optimized,
    pairs: &[(u32, u32)],
) -> Result<(Optimized, Vec<String>), Error> {
    let graph = &optimized.graph;
    let mut notes = Vec::with_capacity(pairs.len());
    let mut honored: Vec<(u32, u32)> = Vec::new();
    // Kernels whose own output is donated: rebuilt with the accumulator as
    // their output.
    let mut accumulate_apart = vec![false; graph.nodes.len()];
    for &(input, output) in pairs {
        let taken = honored.iter().any(|&(i, o)| i == input || o == output);
        let verdict = if taken {
            Err("its input or output is in another pair".to_string())
        } else {
            check(graph, input, output)
        };
        match verdict {
            Ok(apart) => {
                if let Some(kernel) = apart {
                    accumulate_apart[kernel.index()] = true;
                }
                honored.push((input, output));
                notes.push(format!("output {output} is written over input {input}"));
            }
            Err(why) => notes.push(format!(
                "output {output} is not written over input {input}: {why}"
            )),
        }
    }
    let graph = if accumulate_apart.contains(&true) {
        rebuild(graph, &accumulate_apart)
    } else {
        graph.clone()
    };
    verify(&graph)?;
    let mut schedule = Schedule::plan(&graph).map_err(|id| Error::Verify {
        message: format!("node {id} lost its place rebuilding for donated inputs"),
        dump: graph.to_string(),
    })?;
    for &(input, output) in &honored {
        schedule.outputs[output as usize] = Location::Input(input);
    }
    schedule.donated = honored;
    Ok((Optimized { graph, schedule }, notes))
}

/// Whether output `output` may overwrite input `input`; `Some(kernel)` when
/// that kernel must then keep its accumulator apart.
fn check(graph: &Graph, input: u32, output: u32) -> Result<Option<NodeId>, String> {
    let (Some(&value), Some(ty)) = (
        graph.outputs.get(output as usize),
        graph.inputs.get(input as usize),
    ) else {
        return Err("no such input or output".to_string());
    };
    let node_of_input = graph
        .nodes
        .iter()
        .position(|n| matches!(n.op, Op::Input { index } if index == input))
        .map(|i| NodeId(i as u32));
    let repeated = graph.outputs.iter().filter(|&&o| o == value).count() > 1;
    if node_of_input == Some(value) {
        // The state is left as it was: its buffer already holds the output.
        return match repeated {
            true => Err("the input is another output too".to_string()),
            false => Ok(None),
        };
    }
    if graph.node(value).ty != *ty {
        return Err(format!("{} is not {ty}", graph.node(value).ty));
    }
    if repeated {
        return Err("the value is another output too".to_string());
    }
    if node_of_input.is_some_and(|id| graph.outputs.contains(&id)) {
        return Err("the input is an output too".to_string());
    }
    // The kernel that stores the value: its own node, or a side output's.
    let node = graph.node(value);
    let (writer, primary) = match (&node.op, node.inputs.as_slice()) {
        (Op::Kernel(_), _) => (value, true),
        (Op::SideOutput(_), [kernel]) => (*kernel, false),
        _ => return Err(format!("the value is a {} node", node.op.name())),
    };
    let Op::Kernel(kernel) = &graph.node(writer).op else {
        return Err("a side output of no kernel".to_string());
    };
    // A matmul, an attention or a reduction accumulates into its output
    // before the body runs. (A scatter's body is its sums alone, written
    // where they lie.)
    let apart = primary
        && matches!(
            kernel.kind,
            KernelKind::Reduce { .. } | KernelKind::MatMul { .. } | KernelKind::Attention { .. }
        );
    if let KernelKind::Reduce {
        shape, prologue, ..
    } = &kernel.kind
    {
        if shape.numel() == kernel.out.shape.numel() {
            return Err("a reduction broadcast over its space writes it".to_string());
        }
        if apart && prologue.dtype() != Some(kernel.out.dtype) {
            return Err("the reduction accumulates in another dtype".to_string());
        }
    }
    // A product is f32; a kernel whose output is of another type (a bf16
    // product's rounding) keeps it apart, a case this check does not
    // follow further: refused.
    if apart && matches!(kernel.kind, KernelKind::MatMul { .. }) && kernel.out.dtype != DType::F32 {
        return Err("the product accumulates in another dtype".to_string());
    }
    if let Some(node_of_input) = node_of_input {
        let later = graph.nodes[writer.index() + 1..]
            .iter()
            .any(|n| !matches!(n.op, Op::SideOutput(_)) && n.inputs.contains(&node_of_input));
        if later {
            return Err("a later kernel reads the input".to_string());
        }
        let operands = graph.node(writer).inputs.iter().enumerate();
        for (k, _) in operands.filter(|&(_, &id)| id == node_of_input) {
            reads_at_own_index(kernel, k as u32)?;
        }
    }
    Ok(apart.then_some(writer))
}

/// An `Err` unless kernel input `k` is read only by the body, at the
/// output's own index.
fn reads_at_own_index(kernel: &Kernel, k: u32) -> Result<(), String> {
    let own = View::contiguous(&kernel.out.shape);
    match &kernel.kind {
        KernelKind::Elementwise => {}
        KernelKind::Reduce { prologue, .. } => {
            if loads(&prologue.values).any(|(input, _)| input == k) {
                return Err("the reduction reads the input in its prologue".to_string());
            }
        }
        KernelKind::Scatter { prologue, .. } => {
            if loads(&prologue.values).any(|(input, _)| input == k) {
                return Err("the scatter reads the input in its prologue".to_string());
            }
        }
        KernelKind::Attention { operands, .. } => {
            if operands.iter().any(|(input, _)| *input == k) {
                return Err("the attention reads the input as an operand".to_string());
            }
        }
        KernelKind::MatMul { a, b } => {
            for operand in [a, b] {
                let read = match operand {
                    Operand::Read { input, .. } | Operand::Merged { input, .. } => *input == k,
                    Operand::Computed { block, .. } => {
                        loads(&block.values).any(|(input, _)| input == k)
                    }
                };
                if read {
                    return Err("the product reads the input as an operand".to_string());
                }
            }
        }
    }
    let gathered = kernel
        .body
        .values
        .iter()
        .any(|v| matches!(v.expr, Expr::Gather { input, .. } if input == k));
    if gathered {
        return Err("the kernel gathers from the input".to_string());
    }
    match loads(&kernel.body.values).find(|&(input, view)| input == k && *view != own) {
        Some((_, view)) => Err(format!("the kernel reads the input through {view:?}")),
        None => Ok(()),
    }
}

/// The reads of a block (loads and gathers): which input, through which view.
fn loads(values: &[crate::kernel::Value]) -> impl Iterator<Item = (u32, &View)> {
    values.iter().filter_map(|v| v.expr.read())
}

/// `graph` with each kernel marked in `apart` storing its accumulator as
/// its output and its old result as one more side output, which stands
/// where the kernel's node stood.
fn rebuild(graph: &Graph, apart: &[bool]) -> Graph {
    let mut out = Graph::new(graph.name.clone());
    out.inputs = graph.inputs.clone();
    // What readers of each node read, and what a side output node of it reads.
    let mut value = vec![NodeId(0); graph.nodes.len()];
    let mut kernel_of = vec![NodeId(0); graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        match (&node.op, apart[i]) {
            (Op::Kernel(kernel), true) => {
                let mut kernel = kernel.as_ref().clone();
                let result = kernel.body.values.len() as u32 - 1;
                kernel.side.push(SideOutput {
                    ty: kernel.out.clone(),
                    value: result,
                });
                kernel.body.push(Expr::Acc, kernel.out.dtype);
                let k = kernel.side.len() as u32 - 1;
                let inputs = node.inputs.iter().map(|id| value[id.index()]).collect();
                let id = out.push_typed(Op::Kernel(Box::new(kernel)), inputs, node.ty.clone());
                kernel_of[i] = id;
                value[i] =
                    out.push_typed(Op::SideOutput(k), smallvec::smallvec![id], node.ty.clone());
            }
            (Op::SideOutput(_), _) => {
                let inputs = node.inputs.iter().map(|id| kernel_of[id.index()]).collect();
                value[i] = out.push_typed(node.op.clone(), inputs, node.ty.clone());
            }
            _ => {
                let inputs = node.inputs.iter().map(|id| value[id.index()]).collect();
                value[i] = out.push_typed(node.op.clone(), inputs, node.ty.clone());
                kernel_of[i] = value[i];
            }
        }
    }
    out.outputs = graph.outputs.iter().map(|id| value[id.index()]).collect();
    out
}
