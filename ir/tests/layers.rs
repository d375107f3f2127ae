//! The two layers of ops: what users record is graph ops only, the optimizer
//! lowers it to post-fusion ops, and a pass that takes graph ops refuses a
//! post-fusion node by name.

use kiln_ir::pass::{Options, optimize};
use kiln_ir::view::View;
use kiln_ir::{
    BinaryOp, DType, Error, Graph, Op, OpLayer, ReduceOp, Scalar, Shape, SliceRange, TensorType,
    UnaryOp, verify_graph_ops,
};
use smallvec::{SmallVec, smallvec};

fn f32s(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

fn push(g: &mut Graph, op: Op, inputs: &[kiln_ir::NodeId]) -> kiln_ir::NodeId {
    g.push(op, inputs).expect("the test graph is well typed")
}

/// The message of a verifier error.
fn message(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::Verify { message, .. }) => message,
        other => panic!("expected a verifier error, got {other:?}"),
    }
}

/// A graph that records every graph op once.
fn every_graph_op() -> Graph {
    let mut g = Graph::new("every");
    let x = g.input(f32s(&[2, 3]));
    let w = g.input(f32s(&[3, 4]));
    let c = g.push_typed(Op::Const(Scalar::F32(0.5)), SmallVec::new(), f32s(&[]));
    let half = push(&mut g, Op::Expand(Shape::new(&[2, 3])), &[c]);
    let e = push(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let gt = push(&mut g, Op::Binary(BinaryOp::Gt), &[e, half]);
    let sel = push(&mut g, Op::Where, &[gt, e, half]);
    let int = push(&mut g, Op::Cast(DType::I32), &[sel]);
    let back = push(&mut g, Op::Cast(DType::F32), &[int]);
    let mm = push(&mut g, Op::MatMul, &[back, w]);
    let r = push(&mut g, Op::Reshape(Shape::new(&[4, 2])), &[mm]);
    let p = push(&mut g, Op::Permute(smallvec![1, 0]), &[r]);
    let ranges = smallvec![
        SliceRange {
            start: 0,
            end: 2,
            step: 1
        },
        SliceRange {
            start: 1,
            end: 4,
            step: 2
        },
    ];
    let s = push(&mut g, Op::Slice(ranges), &[p]);
    let padded = push(
        &mut g,
        Op::Pad {
            pads: smallvec![(1, 0), (0, 1)],
            value: Scalar::F32(0.0),
        },
        &[s],
    );
    let sum = push(
        &mut g,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: smallvec![1],
        },
        &[padded],
    );
    g.outputs.push(sum);
    g
}

#[test]
fn recorded_ops_are_graph_ops_and_the_optimizer_lowers_them() {
    let g = every_graph_op();
    assert!(g.nodes.iter().all(|n| n.op.layer() == OpLayer::Graph));
    verify_graph_ops(&g, "grad").expect("a recorded graph holds graph ops only");
    let optimized = optimize(&g, Options::default(), &mut |_, _| {}).expect("the graph optimizes");
    let layers: Vec<OpLayer> = optimized
        .graph
        .nodes
        .iter()
        .filter(|n| !matches!(n.op, Op::Input { .. }))
        .map(|n| n.op.layer())
        .collect();
    assert!(!layers.is_empty());
    assert!(layers.iter().all(|&l| l == OpLayer::Fused));
}

#[test]
fn post_fusion_ops_are_their_own_layer() {
    let view = Op::View(View::contiguous(&Shape::new(&[2])));
    assert_eq!(view.layer(), OpLayer::Fused);
    assert_eq!(Op::MatMul.layer(), OpLayer::Graph);
    assert_eq!(Op::Input { index: 0 }.layer(), OpLayer::Graph);
}

#[test]
fn a_graph_pass_refuses_a_fused_graph_by_node() {
    let mut g = Graph::new("fused");
    let x = g.input(f32s(&[4]));
    let y = push(&mut g, Op::Unary(UnaryOp::Relu), &[x]);
    g.outputs.push(y);
    let optimized = optimize(&g, Options::default(), &mut |_, _| {}).expect("the graph optimizes");
    assert_eq!(
        message(verify_graph_ops(&optimized.graph, "grad")),
        "grad takes graph ops only, but node #1 is a kernel node, which only the optimizer makes"
    );
    assert_eq!(
        message(optimize(
            &optimized.graph,
            Options::default(),
            &mut |_, _| {}
        )),
        "optimize takes graph ops only, but node #1 is a kernel node, which only the optimizer makes"
    );
}

#[test]
fn optimize_refuses_a_view_node() {
    let mut g = Graph::new("viewed");
    let x = g.input(f32s(&[2, 3]));
    let view = View::contiguous(&Shape::new(&[2, 3]));
    let v = push(&mut g, Op::View(view), &[x]);
    let y = push(&mut g, Op::Unary(UnaryOp::Neg), &[v]);
    g.outputs.push(y);
    kiln_ir::verify(&g).expect("the graph is well formed");
    assert_eq!(
        message(optimize(&g, Options::default(), &mut |_, _| {})),
        "optimize takes graph ops only, but node #1 is a view node, which only the optimizer makes"
    );
}
