//! One pass, one rule at a time: the graph after the stage, as inline
//! snapshots, for every simplify rule, CSE, the split of large reductions,
//! view folding and the fusion decisions that the mission's patterns do not
//! show (refusals, the cheap recompute, copies of views that cannot fold,
//! side outputs and where they are refused).

use kiln_ir::pass::{Options, optimize};
use kiln_ir::{
    BinaryOp, DType, Data, Graph, NodeId, Op, ReduceOp, Scalar, Shape, TensorType, UnaryOp,
};
use smallvec::SmallVec;

/// The printed graph (with notes) after `stage`.
fn after(graph: &Graph, stage: &str) -> String {
    let mut text = String::new();
    optimize(graph, Options::default(), &mut |name, print| {
        if name == stage {
            text = print();
        }
    })
    .expect("the pipeline accepts the graph");
    text
}

fn f32s(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

fn constant(g: &mut Graph, v: f32, dims: &[usize]) -> NodeId {
    let c = g.push_typed(Op::Const(Scalar::F32(v)), SmallVec::new(), f32s(&[]));
    g.push(Op::Expand(Shape::new(dims)), &[c])
        .expect("a scalar broadcasts")
}

fn push(g: &mut Graph, op: Op, inputs: &[NodeId]) -> NodeId {
    g.push(op, inputs).expect("the test graph is well typed")
}

#[test]
fn identities_vanish_and_signed_zero_is_kept() {
    let mut g = Graph::new("identities");
    let x = g.input(f32s(&[4]));
    let one = constant(&mut g, 1.0, &[4]);
    let minus_zero = constant(&mut g, -0.0, &[4]);
    let zero = constant(&mut g, 0.0, &[4]);
    let a = push(&mut g, Op::Binary(BinaryOp::Mul), &[x, one]);
    let b = push(&mut g, Op::Binary(BinaryOp::Add), &[minus_zero, a]);
    let c = push(&mut g, Op::Binary(BinaryOp::Sub), &[b, zero]);
    let d = push(&mut g, Op::Unary(UnaryOp::Neg), &[c]);
    let e = push(&mut g, Op::Unary(UnaryOp::Neg), &[d]);
    let f = push(&mut g, Op::Unary(UnaryOp::Relu), &[e]);
    let h = push(&mut g, Op::Unary(UnaryOp::Relu), &[f]);
    // x + 0.0 is not x when x is -0.0, so it stays.
    let kept = push(&mut g, Op::Binary(BinaryOp::Add), &[h, zero]);
    g.outputs.push(kept);
    insta::assert_snapshot!(after(&g, "dce"), @r"
    graph @identities(%0: f32[4]) -> f32[4] {
      %1 = kernel @k0 elementwise (%0) : f32[4] {
        %2 = load %0 strides [1] : f32[4]
        %3 = relu %2 : f32[4]
        %4 = const 0.0 : f32[4]
        %5 = add %3, %4 : f32[4]
        yield %5
      }
      return %1
    }
    ");
}

#[test]
fn constants_fold_through_broadcasts() {
    let mut g = Graph::new("fold");
    let x = g.input(f32s(&[2, 3]));
    let two = constant(&mut g, 2.0, &[2, 3]);
    let three = constant(&mut g, 3.0, &[2, 3]);
    let six = push(&mut g, Op::Binary(BinaryOp::Mul), &[two, three]);
    let e = push(&mut g, Op::Unary(UnaryOp::Exp), &[six]);
    let y = push(&mut g, Op::Binary(BinaryOp::Mul), &[x, e]);
    g.outputs.push(y);
    let text = after(&g, "simplify");
    assert!(text.contains("const 403.4288"), "{text}");
    assert!(text.contains("// simplify: fold-const x2"), "{text}");
}

#[test]
fn movement_chains_compose() {
    let mut g = Graph::new("views");
    let x = g.input(f32s(&[2, 3, 4]));
    let r1 = push(&mut g, Op::Reshape(Shape::new(&[6, 4])), &[x]);
    let r2 = push(&mut g, Op::Reshape(Shape::new(&[2, 12])), &[r1]);
    let p1 = push(&mut g, Op::Permute(SmallVec::from_slice(&[1, 0])), &[r2]);
    let p2 = push(&mut g, Op::Permute(SmallVec::from_slice(&[1, 0])), &[p1]);
    let u = push(&mut g, Op::Reshape(Shape::new(&[2, 1, 12])), &[p2]);
    let e1 = push(&mut g, Op::Expand(Shape::new(&[2, 5, 12])), &[u]);
    let e2 = push(&mut g, Op::Expand(Shape::new(&[3, 2, 5, 12])), &[e1]);
    let y = push(&mut g, Op::Unary(UnaryOp::Abs), &[e2]);
    g.outputs.push(y);
    insta::assert_snapshot!(after(&g, "simplify"), @r"
    graph @views(%0: f32[2,3,4]) -> f32[3,2,5,12] {
      %1 = reshape %0 [2,1,12] : f32[2,1,12]
      %2 = expand %1 [3,2,5,12] : f32[3,2,5,12]
      %3 = abs %2 : f32[3,2,5,12]
      return %3
    }
    // simplify: reshape-reshape x2
    // simplify: permute-permute x1
    // simplify: expand-expand x1
    // simplify: view-noop x1
    // simplify: stopped at a fixpoint
    ");
    insta::assert_snapshot!(after(&g, "fold-views"), @r"
    graph @views(%0: f32[2,3,4]) -> f32[3,2,5,12] {
      %1 = view %0 strides [0,12,0,1] : f32[3,2,5,12]
      %2 = abs %1 : f32[3,2,5,12]
      return %2
    }
    ");
}

#[test]
fn equal_subgraphs_are_computed_once() {
    let mut g = Graph::new("cse");
    let x = g.input(f32s(&[8]));
    let a = push(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let b = push(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let y = push(&mut g, Op::Binary(BinaryOp::Add), &[a, b]);
    g.outputs.push(y);
    insta::assert_snapshot!(after(&g, "cse"), @r"
    graph @cse(%0: f32[8]) -> f32[8] {
      %1 = exp %0 : f32[8]
      %2 = add %1, %1 : f32[8]
      return %2
    }
    ");
}

#[test]
fn a_costly_value_read_by_two_kernels_is_stored_once() {
    let mut g = Graph::new("shared");
    let x = g.input(f32s(&[4, 8]));
    let e = push(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let s = push(
        &mut g,
        Op::Reduce {
            op: kiln_ir::ReduceOp::Sum,
            axes: SmallVec::from_slice(&[0]),
        },
        &[e],
    );
    let t = push(&mut g, Op::Unary(UnaryOp::Tanh), &[e]);
    g.outputs.extend([s, t]);
    let text = after(&g, "fuse");
    assert!(
        text.contains("// not fused: %1 has 2 readers in different kernels"),
        "{text}"
    );
    assert_eq!(text.matches("= kernel").count(), 3, "{text}");
}

#[test]
fn a_cheap_value_read_by_two_kernels_is_recomputed() {
    let mut g = Graph::new("cheap");
    let x = g.input(f32s(&[4, 8]));
    let y = g.input(f32s(&[4, 8]));
    let d = push(&mut g, Op::Binary(BinaryOp::Sub), &[x, y]);
    let s = push(
        &mut g,
        Op::Reduce {
            op: kiln_ir::ReduceOp::Max,
            axes: SmallVec::from_slice(&[1]),
        },
        &[d],
    );
    let a = push(&mut g, Op::Unary(UnaryOp::Abs), &[d]);
    g.outputs.extend([s, a]);
    let text = after(&g, "fuse");
    assert_eq!(text.matches("= kernel").count(), 2, "{text}");
    assert_eq!(text.matches("= sub").count(), 2, "{text}");
}

#[test]
fn a_view_that_cannot_fold_is_copied_once() {
    // Flattening a transpose needs a copy: the strides do not merge.
    let mut g = Graph::new("copy");
    let x = g.input(f32s(&[3, 4]));
    let t = push(&mut g, Op::Permute(SmallVec::from_slice(&[1, 0])), &[x]);
    let flat = push(&mut g, Op::Reshape(Shape::new(&[12])), &[t]);
    let y = push(&mut g, Op::Unary(UnaryOp::Neg), &[flat]);
    g.outputs.push(y);
    insta::assert_snapshot!(after(&g, "fuse"), @r"
    graph @copy(%0: f32[3,4]) -> f32[12] {
      %1 = kernel @k0 elementwise (%0) : f32[4,3] {
        %2 = load %0 strides [1,4] : f32[4,3]
        yield %2
      }
      %3 = kernel @k1 elementwise (%1) : f32[12] {
        %4 = load %1 strides [1] : f32[12]
        %5 = neg %4 : f32[12]
        yield %5
      }
      return %3
    }
    // not fused: %1 is a view that no reader can fold
    ");
}

#[test]
fn a_transpose_moves_below_the_elementwise_ops_it_alone_reads() {
    // relu(x * 2).T computes as relu(x.T * 2): one kernel reading x strided.
    // `s` is also read by a second output, so the transpose of `s` stays a read.
    let mut g = Graph::new("sink");
    let x = g.input(f32s(&[3, 4]));
    let two = constant(&mut g, 2.0, &[3, 4]);
    let y = push(&mut g, Op::Binary(BinaryOp::Mul), &[x, two]);
    let r = push(&mut g, Op::Unary(UnaryOp::Relu), &[y]);
    let t = push(&mut g, Op::Permute(SmallVec::from_slice(&[1, 0])), &[r]);
    let s = push(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let st = push(&mut g, Op::Permute(SmallVec::from_slice(&[1, 0])), &[s]);
    let flat = push(&mut g, Op::Reshape(Shape::new(&[12])), &[st]);
    g.outputs.extend([t, s, flat]);
    insta::assert_snapshot!(after(&g, "fuse"), @r"
    graph @sink(%0: f32[3,4]) -> (f32[4,3], f32[3,4], f32[12]) {
      %1 = kernel @k0 elementwise (%0) : f32[4,3] {
        %2 = load %0 strides [1,4] : f32[4,3]
        %3 = const 2.0 : f32[4,3]
        %4 = mul %2, %3 : f32[4,3]
        %5 = relu %4 : f32[4,3]
        yield %5
      }
      %6 = kernel @k1 elementwise (%0) : f32[3,4] {
        %7 = load %0 strides [4,1] : f32[3,4]
        %8 = exp %7 : f32[3,4]
        yield %8
      }
      %9 = kernel @k2 elementwise (%6) : f32[4,3] {
        %10 = load %6 strides [1,4] : f32[4,3]
        yield %10
      }
      %11 = kernel @k3 elementwise (%9) : f32[12] {
        %12 = load %9 strides [1] : f32[12]
        yield %12
      }
      return %1, %6, %11
    }
    // not fused: %6 is a graph output
    // not fused: %7 is a view that no reader can fold
    ");
}

#[test]
fn a_reduction_with_few_outputs_splits_in_two() {
    // A sum of everything and a max over the leading axis of [4096, 1024]
    // become partial results, then their reduction: 1024 of 4096 elements
    // (a GPU's blocks) for the one output, 32 per column for the 1024
    // columns (already many outputs); the sum over
    // rows has 4096 outputs already, and 1021 rows (a prime) cannot be cut
    // into chunks: both stay one reduction.
    let mut g = Graph::new("split");
    let reduce = |g: &mut Graph, op, axes: &[usize], x| {
        let axes = SmallVec::from_slice(axes);
        push(g, Op::Reduce { op, axes }, &[x])
    };
    let x = g.input(f32s(&[4096, 1024]));
    let all = reduce(&mut g, ReduceOp::Sum, &[0, 1], x);
    let cols = reduce(&mut g, ReduceOp::Max, &[0], x);
    let rows = reduce(&mut g, ReduceOp::Sum, &[1], x);
    let y = g.input(f32s(&[1021, 1024]));
    let prime = reduce(&mut g, ReduceOp::Sum, &[0], y);
    g.outputs.extend([all, cols, rows, prime]);
    insta::assert_snapshot!(after(&g, "split-reduce"), @r"
    graph @split(%0: f32[4096,1024], %1: f32[1021,1024]) -> (f32[1,1], f32[1,1024], f32[4096,1], f32[1,1024]) {
      %2 = reshape %0 [1024,4096] : f32[1024,4096]
      %3 = sum %2 axes [1] : f32[1024,1]
      %4 = sum %3 axes [0] : f32[1,1]
      %5 = reshape %4 [1,1] : f32[1,1]
      %6 = reshape %0 [32,128,1024] : f32[32,128,1024]
      %7 = max %6 axes [1] : f32[32,1,1024]
      %8 = max %7 axes [0] : f32[1,1,1024]
      %9 = reshape %8 [1,1024] : f32[1,1024]
      %10 = sum %0 axes [1] : f32[4096,1]
      %11 = sum %1 axes [0] : f32[1,1024]
      return %5, %9, %10, %11
    }
    // split-reduce: split-reduce x2
    // split-reduce: stopped at a fixpoint
    ");
}

/// Kernel launches and side output nodes of `graph` fused.
fn kernels_and_sides(graph: &Graph) -> (usize, usize) {
    let optimized = optimize(graph, Options::default(), &mut |_, _| {})
        .expect("the pipeline accepts the graph");
    let sides = optimized
        .graph
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::SideOutput(_)))
        .count();
    (optimized.schedule.kernels(), sides)
}

#[test]
fn an_output_read_at_its_readers_own_index_is_a_side_output() {
    // m = 0.9 x and p = x - m, both outputs: one kernel writes both.
    let mut g = Graph::new("momentum");
    let x = g.input(f32s(&[3, 5]));
    let c = constant(&mut g, 0.9, &[3, 5]);
    let m = push(&mut g, Op::Binary(BinaryOp::Mul), &[x, c]);
    let p = push(&mut g, Op::Binary(BinaryOp::Sub), &[x, m]);
    g.outputs = vec![m, p];
    assert_eq!(kernels_and_sides(&g), (1, 1));
}

#[test]
fn an_output_read_elsewhere_than_its_readers_index_is_a_kernel_of_its_own() {
    // Read through a transpose, or by a sum's prologue: stored by its own kernel.
    let mut g = Graph::new("elsewhere");
    let x = g.input(f32s(&[3, 4]));
    let y = g.input(f32s(&[4, 3]));
    let e = push(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let t = push(&mut g, Op::Permute(SmallVec::from_slice(&[1, 0])), &[e]);
    let p = push(&mut g, Op::Binary(BinaryOp::Add), &[t, y]);
    g.outputs = vec![e, p];
    assert_eq!(kernels_and_sides(&g), (2, 0));
    let mut g = Graph::new("summed");
    let x = g.input(f32s(&[3, 4]));
    let e = push(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let sum = Op::Reduce {
        op: ReduceOp::Sum,
        axes: SmallVec::from_slice(&[0, 1]),
    };
    let s = push(&mut g, sum, &[e]);
    g.outputs = vec![e, s];
    assert_eq!(kernels_and_sides(&g), (2, 0));
}

#[test]
fn a_one_element_output_of_inputs_is_stored_beside_an_earlier_scalar_kernel() {
    // A loss, then a step count t + 1 read by a later update: the count is
    // written by the loss's kernel, not a kernel of its own.
    let mut g = Graph::new("count");
    let x = g.input(f32s(&[5]));
    let t = g.input(f32s(&[]));
    let sum = Op::Reduce {
        op: ReduceOp::Sum,
        axes: SmallVec::from_slice(&[0]),
    };
    let loss = push(&mut g, sum, &[x]);
    let one = constant(&mut g, 1.0, &[]);
    let next = push(&mut g, Op::Binary(BinaryOp::Add), &[t, one]);
    let scale = push(&mut g, Op::Expand(Shape::new(&[5])), &[next]);
    let e = push(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let update = push(&mut g, Op::Binary(BinaryOp::Mul), &[e, scale]);
    g.outputs = vec![loss, next, update];
    assert_eq!(kernels_and_sides(&g), (2, 1));
}

#[test]
fn a_sum_over_the_batch_of_products_is_one_product() {
    // Summed over both batch axes: one product of depth 4 x 8 x 16. Left as
    // they are: a product read twice, a sum that keeps a batch axis of 4,
    // and a merged product too thin for the threads (16 x 25 outputs).
    let mut g = Graph::new("sums");
    let sum = |g: &mut Graph, axes: &[usize], x| {
        let axes = SmallVec::from_slice(axes);
        push(
            g,
            Op::Reduce {
                op: ReduceOp::Sum,
                axes,
            },
            &[x],
        )
    };
    let product = |g: &mut Graph, a: &[usize], b: &[usize]| {
        let (a, b) = (g.input(f32s(a)), g.input(f32s(b)));
        push(g, Op::MatMul, &[a, b])
    };
    let merged = product(&mut g, &[4, 8, 64, 16], &[4, 8, 16, 64]);
    let merged = sum(&mut g, &[0, 1], merged);
    let read_twice = product(&mut g, &[4, 1, 64, 16], &[4, 1, 16, 64]);
    let summed_once = sum(&mut g, &[0], read_twice);
    let kept = product(&mut g, &[4, 8, 64, 16], &[4, 8, 16, 64]);
    let kept = sum(&mut g, &[0], kept);
    let thin = product(&mut g, &[200, 16, 8], &[200, 8, 25]);
    let thin = sum(&mut g, &[0], thin);
    g.outputs
        .extend([merged, summed_once, read_twice, kept, thin]);
    insta::assert_snapshot!(after(&g, "simplify"), @r"
    graph @sums(%0: f32[4,8,64,16], %1: f32[4,8,16,64], %2: f32[4,1,64,16], %3: f32[4,1,16,64], %4: f32[4,8,64,16], %5: f32[4,8,16,64], %6: f32[200,16,8], %7: f32[200,8,25]) -> (f32[1,1,64,64], f32[1,1,64,64], f32[4,1,64,64], f32[1,8,64,64], f32[1,16,25]) {
      %8 = permute %0 [2,0,1,3] : f32[64,4,8,16]
      %9 = reshape %8 [64,512] : f32[64,512]
      %10 = reshape %1 [512,64] : f32[512,64]
      %11 = matmul %9, %10 : f32[64,64]
      %12 = reshape %11 [1,1,64,64] : f32[1,1,64,64]
      %13 = matmul %2, %3 : f32[4,1,64,64]
      %14 = sum %13 axes [0] : f32[1,1,64,64]
      %15 = matmul %4, %5 : f32[4,8,64,64]
      %16 = sum %15 axes [0] : f32[1,8,64,64]
      %17 = matmul %6, %7 : f32[200,16,25]
      %18 = sum %17 axes [0] : f32[1,16,25]
      return %12, %14, %13, %16, %18
    }
    // simplify: stopped at a fixpoint
    // simplify: sum-of-products x1
    ");
    // The same values as the graph as written, to rounding.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let inputs: Vec<Data> = (g.inputs.iter())
        .map(|ty| {
            let n = ty.shape.numel();
            Data::F32(
                (0..n)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        (seed % 2001) as f32 / 1000.0 - 1.0
                    })
                    .collect(),
            )
        })
        .collect();
    let refs: Vec<&Data> = inputs.iter().collect();
    let want = kiln_ir::interp::eval(&g, &refs).expect("evaluates");
    let optimized = optimize(&g, Options::default(), &mut |_, _| {}).expect("optimizes");
    let got = kiln_ir::interp::eval(&optimized.graph, &refs).expect("evaluates");
    for (k, (w, h)) in want.iter().zip(&got).enumerate() {
        let (Data::F32(w), Data::F32(h)) = (w, h) else {
            panic!("f32 outputs")
        };
        for (x, y) in w.iter().zip(h) {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + x.abs()),
                "output {k}: {x} against {y}"
            );
        }
    }
}

#[test]
fn a_product_with_one_matrix_over_the_batch_is_one_product_of_its_rows() {
    // `x [4, 3, 8] @ w [8, 5]` broadcast, and with `w [1, 8, 5]`: one
    // product of 12 rows each. Left as they are: a right operand that
    // differs along the batch, and a left one broadcast over it.
    let mut g = Graph::new("rows");
    let x = g.input(f32s(&[4, 3, 8]));
    let w = g.input(f32s(&[8, 5]));
    let w1 = g.input(f32s(&[1, 8, 5]));
    let batched = g.input(f32s(&[4, 8, 5]));
    let broadcast = |g: &mut Graph, w| push(g, Op::Expand(Shape::new(&[4, 8, 5])), &[w]);
    let (wide, wide1) = (broadcast(&mut g, w), broadcast(&mut g, w1));
    let y = push(&mut g, Op::MatMul, &[x, wide]);
    let y1 = push(&mut g, Op::MatMul, &[x, wide1]);
    let kept = push(&mut g, Op::MatMul, &[x, batched]);
    let row = g.input(f32s(&[3, 8]));
    let rows = push(&mut g, Op::Expand(Shape::new(&[4, 3, 8])), &[row]);
    let left = push(&mut g, Op::MatMul, &[rows, batched]);
    g.outputs.extend([y, y1, kept, left]);
    insta::assert_snapshot!(after(&g, "batch-rows"), @r"
    graph @rows(%0: f32[4,3,8], %1: f32[8,5], %2: f32[1,8,5], %3: f32[4,8,5], %4: f32[3,8]) -> (f32[4,3,5], f32[4,3,5], f32[4,3,5], f32[4,3,5]) {
      %5 = reshape %0 [12,8] : f32[12,8]
      %6 = matmul %5, %1 : f32[12,5]
      %7 = reshape %6 [4,3,5] : f32[4,3,5]
      %8 = reshape %0 [12,8] : f32[12,8]
      %9 = reshape %2 [8,5] : f32[8,5]
      %10 = matmul %8, %9 : f32[12,5]
      %11 = reshape %10 [4,3,5] : f32[4,3,5]
      %12 = matmul %0, %3 : f32[4,3,5]
      %13 = expand %4 [4,3,8] : f32[4,3,8]
      %14 = matmul %13, %3 : f32[4,3,5]
      return %7, %11, %12, %14
    }
    // batch-rows: batch-rows x2
    // batch-rows: stopped at a fixpoint
    ");
    // Each element is the same dot product, so the same bits.
    let inputs: Vec<Data> = (g.inputs.iter())
        .enumerate()
        .map(|(i, ty)| {
            let n = ty.shape.numel();
            Data::F32(
                (0..n)
                    .map(|j| ((j * 7 + i * 3) % 11) as f32 * 0.37 - 1.5)
                    .collect(),
            )
        })
        .collect();
    let refs: Vec<&Data> = inputs.iter().collect();
    let want = kiln_ir::interp::eval(&g, &refs).expect("evaluates");
    let optimized = optimize(&g, Options::default(), &mut |_, _| {}).expect("optimizes");
    assert_eq!(
        kiln_ir::interp::eval(&optimized.graph, &refs).expect("evaluates"),
        want
    );
}

#[test]
fn attention_over_values_shared_by_the_batch_stays_one_op() {
    // The values broadcast over the batch (one head's, shared): the
    // product of the weights and the values is a batched product of one
    // matrix, which `attention` finds before `batch-rows` would take it.
    let mut g = Graph::new("shared");
    let (q, k) = (g.input(f32s(&[2, 64, 16])), g.input(f32s(&[2, 80, 16])));
    let v = g.input(f32s(&[80, 8]));
    let v = push(&mut g, Op::Expand(Shape::new(&[2, 80, 8])), &[v]);
    let bias = g.input(f32s(&[2, 64, 80]));
    let (y, _) = attention(
        &mut g,
        [q, k, v],
        Some((BinaryOp::Mul, 0.25)),
        Some(bias),
        true,
    );
    g.outputs.push(y);
    let options = Options {
        attention: true,
        ..Options::default()
    };
    let optimized = optimize(&g, options, &mut |_, _| {}).expect("optimizes");
    let attention_kernel = |n: &kiln_ir::Node| match &n.op {
        Op::Kernel(k) => matches!(k.kind, kiln_ir::kernel::KernelKind::Attention { .. }),
        _ => false,
    };
    assert!(
        optimized.graph.nodes.iter().any(attention_kernel),
        "{}",
        optimized.graph
    );
}

/// `softmax(q kᵀ · scale + bias) v` as `Tensor::scaled_dot_product_attention`
/// writes it (the shift and the sum guarded) where `guarded`, else a plain
/// softmax's ops; the scores times or over a constant and biased where
/// given.
fn attention(
    g: &mut Graph,
    [q, k, v]: [NodeId; 3],
    scale: Option<(BinaryOp, f32)>,
    bias: Option<NodeId>,
    guarded: bool,
) -> (NodeId, NodeId) {
    let rank = g.node(q).ty.shape.rank();
    let mut perm: SmallVec<[usize; 4]> = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    let kt = push(g, Op::Permute(perm), &[k]);
    let mut x = push(g, Op::MatMul, &[q, kt]);
    let scores = g.node(x).ty.shape.dims().to_vec();
    let mut rows = scores.clone();
    rows[rank - 1] = 1;
    if let Some((op, c)) = scale {
        let c = constant(g, c, &scores);
        x = push(g, Op::Binary(op), &[x, c]);
    }
    if let Some(b) = bias {
        x = push(g, Op::Binary(BinaryOp::Add), &[b, x]);
    }
    let reduce = |g: &mut Graph, op, x| {
        let axes = SmallVec::from_slice(&[rank - 1]);
        push(g, Op::Reduce { op, axes }, &[x])
    };
    let guard = |g: &mut Graph, x, when: f32, then: f32| {
        if !guarded {
            return x;
        }
        let (when, then) = (constant(g, when, &rows), constant(g, then, &rows));
        let hit = push(g, Op::Binary(BinaryOp::Eq), &[x, when]);
        push(g, Op::Where, &[hit, then, x])
    };
    let m = reduce(g, ReduceOp::Max, x);
    let shift = guard(g, m, f32::NEG_INFINITY, 0.0);
    let shift = push(g, Op::Expand(Shape::new(&scores)), &[shift]);
    let shifted = push(g, Op::Binary(BinaryOp::Sub), &[x, shift]);
    let e = push(g, Op::Unary(UnaryOp::Exp), &[shifted]);
    let d = reduce(g, ReduceOp::Sum, e);
    let d = guard(g, d, 0.0, 1.0);
    let r = push(g, Op::Unary(UnaryOp::Recip), &[d]);
    let r = push(g, Op::Expand(Shape::new(&scores)), &[r]);
    let w = push(g, Op::Binary(BinaryOp::Mul), &[r, e]);
    (push(g, Op::MatMul, &[w, v]), w)
}

#[test]
fn softmax_between_two_products_is_one_attention() {
    // Found: kiln's guarded form with a scale and a bias, and a plain
    // softmax of 2^16 scores over a constant. Kept: a softmax read again,
    // and one of few scores without a bias.
    let mut g = Graph::new("attention");
    let qkv = |g: &mut Graph, l: usize, s: usize| {
        [[l, 16], [s, 16], [s, 8]].map(|[n, e]| g.input(f32s(&[2, n, e])))
    };
    let t = qkv(&mut g, 64, 80);
    let bias = g.input(f32s(&[2, 64, 80]));
    let (found, _) = attention(&mut g, t, Some((BinaryOp::Mul, 0.25)), Some(bias), true);
    let t = qkv(&mut g, 256, 256);
    let (plain, _) = attention(&mut g, t, Some((BinaryOp::Div, 8.0)), None, false);
    let t = qkv(&mut g, 64, 80);
    let (read_again, w) = attention(&mut g, t, Some((BinaryOp::Mul, 0.25)), Some(bias), false);
    let t = qkv(&mut g, 64, 80);
    let (few, _) = attention(&mut g, t, None, None, true);
    g.outputs.extend([found, plain, read_again, w, few]);
    let options = Options {
        attention: true,
        ..Options::default()
    };
    let mut text = String::new();
    let optimized = optimize(&g, options, &mut |name, print| {
        if name == "attention" {
            text = print();
        }
    })
    .expect("optimizes");
    let found: Vec<&str> = text.lines().filter(|l| l.contains("= attention")).collect();
    insta::assert_snapshot!(found.join("\n"), @r"
    %23 = attention %0, %22, %2, %3 scale 0.25 guarded : f32[2,64,8]
    %26 = attention %4, %25, %6 over 8.0 : f32[2,256,8]
    ");
    // The same bits as the graph as written: the op is its ops.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut inputs: Vec<Data> = (g.inputs.iter())
        .map(|ty| {
            let values = (0..ty.shape.numel()).map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed % 2001) as f32 / 500.0 - 2.0
            });
            Data::F32(values.collect())
        })
        .collect();
    // Queries every key is hidden from: zeros where guarded.
    if let Data::F32(bias) = &mut inputs[3] {
        bias[5 * 80..6 * 80].fill(f32::NEG_INFINITY);
        bias[70 * 80..71 * 80].fill(f32::NEG_INFINITY);
    }
    let refs: Vec<&Data> = inputs.iter().collect();
    let want = kiln_ir::interp::eval(&g, &refs).expect("evaluates");
    let got = kiln_ir::interp::eval(&optimized.graph, &refs).expect("evaluates");
    let bits = |d: &Data| match d {
        Data::F32(v) => v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(),
        _ => panic!("f32 outputs"),
    };
    for (k, (want, got)) in want.iter().zip(&got).enumerate() {
        assert_eq!(bits(want), bits(got), "output {k}");
    }
    let Data::F32(found) = &got[0] else {
        panic!("f32 outputs")
    };
    assert!(found[5 * 8..6 * 8].iter().all(|&x| x == 0.0));
}
