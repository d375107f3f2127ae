//! `pass::donate`, one condition at a time: which outputs are written over
//! the inputs they replace, which are refused and why (the pass's notes),
//! and the kernels rebuilt so that a product or a sum can write over an
//! input its epilogue reads.

use kiln_ir::pass::{Optimized, Options, donate, optimize};
use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Scalar, Shape, TensorType};
use smallvec::{SmallVec, smallvec};

fn f32s(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

fn push(g: &mut Graph, op: Op, inputs: &[NodeId]) -> NodeId {
    g.push(op, inputs).expect("the test graph is well typed")
}

fn constant(g: &mut Graph, v: f32, dims: &[usize]) -> NodeId {
    let c = g.push_typed(Op::Const(Scalar::F32(v)), SmallVec::new(), f32s(&[]));
    push(g, Op::Expand(Shape::new(dims)), &[c])
}

/// `graph` optimized, then `pairs` donated: the result and the notes.
fn donated(graph: &Graph, pairs: &[(u32, u32)]) -> (Optimized, Vec<String>) {
    let optimized = optimize(graph, Options::default(), &mut |_, _| {}).expect("optimizes");
    donate(&optimized, pairs).expect("donates")
}

#[test]
fn an_elementwise_update_is_written_over_its_input() {
    // x' = x - 0.1 g
    let mut g = Graph::new("sgd");
    let x = g.input(f32s(&[7, 3]));
    let grad = g.input(f32s(&[7, 3]));
    let lr = constant(&mut g, 0.1, &[7, 3]);
    let step = push(&mut g, Op::Binary(BinaryOp::Mul), &[grad, lr]);
    let next = push(&mut g, Op::Binary(BinaryOp::Sub), &[x, step]);
    g.outputs = vec![next];
    let (optimized, notes) = donated(&g, &[(0, 0)]);
    assert_eq!(notes, ["output 0 is written over input 0"]);
    assert_eq!(optimized.schedule.donated, [(0, 0)]);
    assert_eq!(optimized.schedule.kernels(), 1);
}

#[test]
fn a_product_keeps_its_accumulator_apart_to_write_over_an_input_it_reads() {
    // w' = w - 0.1 (a @ b): the product is accumulated into a buffer of the
    // arena and the new weight stored beside it by the epilogue.
    let mut g = Graph::new("gemm_update");
    let w = g.input(f32s(&[5, 3]));
    let a = g.input(f32s(&[5, 4]));
    let b = g.input(f32s(&[4, 3]));
    let prod = push(&mut g, Op::MatMul, &[a, b]);
    let lr = constant(&mut g, 0.1, &[5, 3]);
    let step = push(&mut g, Op::Binary(BinaryOp::Mul), &[prod, lr]);
    let next = push(&mut g, Op::Binary(BinaryOp::Sub), &[w, step]);
    g.outputs = vec![next];
    let (optimized, notes) = donated(&g, &[(0, 0)]);
    assert_eq!(notes, ["output 0 is written over input 0"]);
    let printed = format!("{}", optimized.graph);
    assert!(printed.contains("yield %"), "{printed}");
    let Op::Kernel(kernel) = &optimized.graph.node(optimized.schedule.launches[0].node).op else {
        panic!("a kernel");
    };
    let last = kernel.body.values.last().expect("a body");
    assert_eq!(last.expr, kiln_ir::kernel::Expr::Acc, "{printed}");
    assert_eq!(kernel.side.len(), 1, "{printed}");
    assert_eq!(
        optimized.schedule.outputs[0],
        kiln_ir::schedule::Location::Input(0)
    );
}

#[test]
fn a_bf16_product_held_apart_is_not_written_over_its_input() {
    // w' = bf16(w - 0.1 (a @ b)) on bf16 values: the update's rounding
    // lands in the matmul's kernel, whose bf16 output cannot hold the f32
    // product. Refused, and the graph still verifies.
    let bf16s = |dims: &[usize]| TensorType::new(DType::BF16, dims);
    let mut g = Graph::new("bf16_update");
    let w = g.input(bf16s(&[5, 3]));
    let a = g.input(bf16s(&[5, 4]));
    let b = g.input(bf16s(&[4, 3]));
    let prod = push(&mut g, Op::MatMul, &[a, b]);
    let lr = g.push_typed(
        Op::Const(Scalar::F32(0.1).cast(DType::BF16)),
        SmallVec::new(),
        bf16s(&[]),
    );
    let lr = push(&mut g, Op::Expand(Shape::new(&[5, 3])), &[lr]);
    let step = push(&mut g, Op::Binary(BinaryOp::Mul), &[prod, lr]);
    let next = push(&mut g, Op::Binary(BinaryOp::Sub), &[w, step]);
    g.outputs = vec![next];
    let optimized = optimize(&g, Options::default(), &mut |_, _| {}).expect("optimizes");
    assert_eq!(optimized.schedule.kernels(), 1, "{}", optimized.graph);
    let (optimized, notes) = donate(&optimized, &[(0, 0)]).expect("donates");
    assert_eq!(
        notes,
        ["output 0 is not written over input 0: the product accumulates in another dtype"]
    );
    assert!(optimized.schedule.donated.is_empty());
}

#[test]
fn a_sum_keeps_its_accumulator_apart_to_write_over_an_input_it_reads() {
    // b' = b - sum over rows of g
    let mut g = Graph::new("bias_update");
    let b = g.input(f32s(&[3]));
    let grad = g.input(f32s(&[6, 3]));
    let sum = push(
        &mut g,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: smallvec![0],
        },
        &[grad],
    );
    let sum = push(&mut g, Op::Reshape(Shape::new(&[3])), &[sum]);
    let next = push(&mut g, Op::Binary(BinaryOp::Sub), &[b, sum]);
    g.outputs = vec![next];
    let (optimized, notes) = donated(&g, &[(0, 0)]);
    assert_eq!(notes, ["output 0 is written over input 0"]);
    assert_eq!(optimized.schedule.donated, [(0, 0)]);
}

#[test]
fn a_state_left_as_it_is_needs_no_write() {
    let mut g = Graph::new("frozen");
    let x = g.input(f32s(&[4]));
    g.outputs = vec![x];
    let (optimized, notes) = donated(&g, &[(0, 0)]);
    assert_eq!(notes, ["output 0 is written over input 0"]);
    assert_eq!(optimized.schedule.kernels(), 0);
}

#[test]
fn an_input_read_after_it_is_overwritten_is_not_donated() {
    // x' = 2 x, and x' @ x read after it.
    let mut g = Graph::new("late_reader");
    let x = g.input(f32s(&[4, 4]));
    let two = constant(&mut g, 2.0, &[4, 4]);
    let next = push(&mut g, Op::Binary(BinaryOp::Mul), &[x, two]);
    let late = push(&mut g, Op::MatMul, &[next, x]);
    g.outputs = vec![late, next];
    let (optimized, notes) = donated(&g, &[(0, 1)]);
    assert_eq!(
        notes,
        ["output 1 is not written over input 0: a later kernel reads the input"]
    );
    assert!(optimized.schedule.donated.is_empty());
}

#[test]
fn an_input_read_elsewhere_than_the_written_index_is_not_donated() {
    // x' = x + xᵀ reads x transposed: element (i, j) is read after (j, i)
    // is written.
    let mut g = Graph::new("transposed");
    let x = g.input(f32s(&[3, 3]));
    let xt = push(&mut g, Op::Permute(smallvec![1, 0]), &[x]);
    let next = push(&mut g, Op::Binary(BinaryOp::Add), &[x, xt]);
    g.outputs = vec![next];
    let (_, notes) = donated(&g, &[(0, 0)]);
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].starts_with(
            "output 0 is not written over input 0: the kernel reads the input through"
        ),
        "{notes:?}"
    );
}

#[test]
fn a_softmax_shift_over_its_input_is_not_donated() {
    // x' = x - max(x) over rows: a reduction broadcast back over its space.
    let mut g = Graph::new("shift");
    let x = g.input(f32s(&[4, 9]));
    let max = push(
        &mut g,
        Op::Reduce {
            op: ReduceOp::Max,
            axes: smallvec![1],
        },
        &[x],
    );
    let wide = push(&mut g, Op::Expand(Shape::new(&[4, 9])), &[max]);
    let next = push(&mut g, Op::Binary(BinaryOp::Sub), &[x, wide]);
    g.outputs = vec![next];
    let (_, notes) = donated(&g, &[(0, 0)]);
    assert_eq!(
        notes,
        ["output 0 is not written over input 0: a reduction broadcast over its space writes it"]
    );
}

#[test]
fn an_input_that_is_an_output_too_or_of_another_type_is_not_donated() {
    let mut g = Graph::new("kept");
    let x = g.input(f32s(&[4]));
    // Input 1, of another type than output 1.
    g.input(f32s(&[5]));
    let one = constant(&mut g, 1.0, &[4]);
    let next = push(&mut g, Op::Binary(BinaryOp::Add), &[x, one]);
    g.outputs = vec![x, next];
    let (_, notes) = donated(&g, &[(0, 1), (1, 1)]);
    assert_eq!(
        notes,
        [
            "output 1 is not written over input 0: the input is an output too",
            "output 1 is not written over input 1: f32[4] is not f32[5]",
        ]
    );
}
