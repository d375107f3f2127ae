//! 16-bit floats computed in f32: every op that computes on bf16 or f16
//! values takes its operands cast to f32 and casts its result back, so that
//! a backend holds 16-bit values in f32 registers and only loads, stores
//! and casts know their width.
//!
//! An op's result is rounded to its 16-bit type, as the interpreter rounds
//! it, so elementwise results are unchanged: for `+ - * /` and `sqrt`, f32
//! holds more than twice a 16-bit significand plus two bits, and rounding
//! through it gives the directly rounded result. Sums, products and matmuls
//! accumulate in f32 and round once at the end, as PyTorch and JAX do on
//! 16-bit data: within f32 rounding of the interpreter's f64 sums.
//!
//! Ops that move values without computing (views, `where`, gathers) keep
//! their 16-bit types. Casts go through f32 (from a 16-bit type) or f64
//! (to one, from an integer or f64), so a backend casts 16-bit values only
//! to and from f32 and from f64.

use smallvec::SmallVec;

use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::types::{DType, TensorType};

/// `graph` with every computing op on 16-bit floats widened to f32; the
/// notes say how many.
pub(crate) fn run(graph: &Graph) -> (Graph, Vec<String>) {
    let mut out = Graph::new(graph.name.clone());
    out.inputs = graph.inputs.clone();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.nodes.len());
    // Each value cast to f32 once, however many ops read it widened.
    let mut widened: Vec<Option<NodeId>> = Vec::with_capacity(graph.nodes.len());
    let mut count = 0;
    for node in &graph.nodes {
        let inputs: SmallVec<[NodeId; 2]> = node.inputs.iter().map(|id| map[id.index()]).collect();
        let halves = node
            .inputs
            .iter()
            .any(|id| graph.node(*id).ty.dtype.is_half())
            || node.ty.dtype.is_half();
        let id = match &node.op {
            Op::Cast(to) if halves => {
                count += 1;
                let from = graph.node(node.inputs[0]).ty.dtype;
                cast(&mut out, inputs[0], from, *to)
            }
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Reduce { .. }
            | Op::MatMul
            | Op::ScatterAdd { .. }
                if halves =>
            {
                count += 1;
                let args: SmallVec<[NodeId; 2]> = node
                    .inputs
                    .iter()
                    .zip(&inputs)
                    .map(|(old, &new)| {
                        let ty = &graph.node(*old).ty;
                        if !ty.dtype.is_half() {
                            return new;
                        }
                        *widened[old.index()].get_or_insert_with(|| {
                            let f32 = TensorType::new(DType::F32, ty.shape.clone());
                            out.push_typed(Op::Cast(DType::F32), SmallVec::from_slice(&[new]), f32)
                        })
                    })
                    .collect();
                let wide = if node.ty.dtype.is_half() {
                    DType::F32
                } else {
                    node.ty.dtype
                };
                let ty = TensorType::new(wide, node.ty.shape.clone());
                let result = out.push_typed(node.op.clone(), args, ty);
                if node.ty.dtype.is_half() {
                    out.push_typed(
                        Op::Cast(node.ty.dtype),
                        SmallVec::from_slice(&[result]),
                        node.ty.clone(),
                    )
                } else {
                    result
                }
            }
            _ => out.push_typed(node.op.clone(), inputs, node.ty.clone()),
        };
        map.push(id);
        widened.push(None);
    }
    out.outputs = graph.outputs.iter().map(|id| map[id.index()]).collect();
    let notes = if count == 0 {
        Vec::new()
    } else {
        vec![format!("{count} ops on 16-bit floats computed in f32")]
    };
    (out, notes)
}

/// `x` of `from` cast to `to` where one of them is 16-bit: through f32 from
/// a 16-bit type (exact), through f64 into one from anything but f32 (exact
/// for every integer up to 2^53), so that each step a backend makes is a
/// cast it has: 16-bit to and from f32, f64 to 16-bit.
fn cast(out: &mut Graph, x: NodeId, from: DType, to: DType) -> NodeId {
    let shape = out.node(x).ty.shape.clone();
    let mut step = |x: NodeId, to: DType| {
        let ty = TensorType::new(to, shape.clone());
        out.push_typed(Op::Cast(to), SmallVec::from_slice(&[x]), ty)
    };
    if from == to || matches!((from, to), (DType::F32, _) | (_, DType::F32)) {
        return step(x, to);
    }
    if from.is_half() {
        let wide = step(x, DType::F32);
        return step(wide, to);
    }
    // Into a 16-bit type from an integer, bool or f64.
    let wide = if from == DType::F64 {
        x
    } else {
        step(x, DType::F64)
    };
    step(wide, to)
}
