//! Gradient rules by value where finite differences cannot see them (ties
//! of three, relu and abs at 0, NaN rows, products over zeros), zeros for values the loss does
//! not read, the errors of `grad`, and the printed backward pass of a layer.

use kiln_ir::pass::{Options, optimize};
use kiln_ir::{
    BinaryOp, DType, Data, Graph, NodeId, Op, ReduceOp, Scalar, Shape, TensorType, UnaryOp, grad,
    interp,
};
use smallvec::SmallVec;

fn f32s(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

fn f32_data(data: &Data) -> Vec<f32> {
    match data {
        Data::F32(v) => v.clone(),
        other => panic!("expected f32 data, got {other:?}"),
    }
}

/// Evaluates `graph` on f32 inputs.
fn eval(graph: &Graph, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let data: Vec<Data> = inputs.iter().map(|v| Data::F32(v.clone())).collect();
    let refs: Vec<&Data> = data.iter().collect();
    let out = interp::eval(graph, &refs).unwrap_or_else(|e| panic!("{e}\n{graph}"));
    out.iter().map(f32_data).collect()
}

/// The gradients of `sum(y)` (`y` made by `build` from inputs of `dims`
/// holding `values`) with respect to every input.
fn gradients_of_sum(
    inputs: &[(&[usize], &[f32])],
    build: impl FnOnce(&mut Graph, &[NodeId]) -> NodeId,
) -> Vec<Vec<f32>> {
    let mut g = Graph::new("t");
    let ids: Vec<NodeId> = inputs.iter().map(|(d, _)| g.input(f32s(d))).collect();
    let y = build(&mut g, &ids);
    let rank = g.node(y).ty.shape.rank();
    let loss = g
        .push(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: (0..rank).collect(),
            },
            &[y],
        )
        .expect("sums");
    g.outputs = grad(&mut g, loss, &ids).expect("differentiates");
    let data: Vec<Vec<f32>> = inputs.iter().map(|(_, v)| v.to_vec()).collect();
    eval(&g, &data)
}

fn op(g: &mut Graph, op: Op, inputs: &[NodeId]) -> NodeId {
    g.push(op, inputs).expect("well typed")
}

/// The max of `x` over `axes`.
fn max(g: &mut Graph, x: NodeId, axes: &[usize]) -> NodeId {
    let axes = SmallVec::from_slice(axes);
    op(
        g,
        Op::Reduce {
            op: ReduceOp::Max,
            axes,
        },
        &[x],
    )
}

#[test]
fn max_reductions_split_ties_evenly_and_give_nan_rows_nan() {
    let nan = f32::NAN;
    let max_over = |axes: &[usize], x: &[f32]| {
        gradients_of_sum(&[(&[2, 5], x)], |g, ids| max(g, ids[0], axes)).remove(0)
    };
    // Row 0: a three-way tie; row 1: its max is NaN, so nothing equals it
    // and its gradient is NaN, as JAX's and PyTorch's.
    let grads = max_over(&[1], &[1.0, 3.0, 3.0, 3.0, 2.0, 3.0, 3.0, 1.0, nan, 2.0]);
    let third = 1.0 / 3.0;
    assert_eq!(grads[..5], [0.0, third, third, third, 0.0]);
    assert!(grads[5..].iter().all(|g| g.is_nan()), "{grads:?}");
    // Over both axes: a five-way tie across the rows.
    let x = [1.0, 3.0, 3.0, 3.0, 2.0, 3.0, 3.0, 1.0, 0.0, 2.0];
    let grads = max_over(&[0, 1], &x);
    let fifth = 1.0 / 5.0;
    assert_eq!(
        grads,
        [0.0, fifth, fifth, fifth, 0.0, fifth, fifth, 0.0, 0.0, 0.0]
    );
    // Both maxima of the same values in one loss: their gradients add up.
    let both = gradients_of_sum(&[(&[2, 5], &x)], |g, ids| {
        let rows = max(g, ids[0], &[1]);
        let all = max(g, ids[0], &[0, 1]);
        let all = op(g, Op::Expand(Shape::new(&[2, 1])), &[all]);
        op(g, Op::Binary(BinaryOp::Add), &[rows, all])
    });
    let half = 0.5;
    let want: [f32; 10] = [0.0, third, third, third, 0.0, half, half, 0.0, 0.0, 0.0];
    let want: Vec<f32> = want.iter().zip(&grads).map(|(r, a)| r + 2.0 * a).collect();
    assert_eq!(both[0], want);
}

#[test]
fn products_give_each_element_the_product_of_the_others_with_zeros_exact() {
    // Rows with no zero, one zero (-0 counts), two zeros; then the columns.
    let x = [2.0, 3.0, 4.0, 5.0, 2.0, -0.0, 4.0, 5.0, 0.0, 3.0, 0.0, 5.0];
    let prod = |g: &mut Graph, x: NodeId, axes: &[usize]| {
        let axes = SmallVec::from_slice(axes);
        op(
            g,
            Op::Reduce {
                op: ReduceOp::Prod,
                axes,
            },
            &[x],
        )
    };
    let grads = gradients_of_sum(&[(&[3, 4], &x)], |g, ids| prod(g, ids[0], &[1]));
    assert_eq!(
        grads[0],
        [
            60.0, 40.0, 30.0, 24.0, 0.0, 40.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        ]
    );
    // Over axis 0, each column's product broadcast back against x: column
    // 0 holds one zero, column 1 one (-0), column 2 one, column 3 none.
    let grads = gradients_of_sum(&[(&[3, 4], &x)], |g, ids| prod(g, ids[0], &[0]));
    assert_eq!(
        grads[0],
        [
            0.0, 0.0, 0.0, 25.0, 0.0, 9.0, 0.0, 25.0, 4.0, 0.0, 16.0, 25.0
        ]
    );
    // Over every axis: more than one zero, so nothing flows; a row of a NaN
    // and no zero has a NaN product, and so is every slope of its elements.
    let grads = gradients_of_sum(&[(&[3, 4], &x)], |g, ids| prod(g, ids[0], &[0, 1]));
    assert_eq!(grads[0], [0.0; 12]);
    let grads = gradients_of_sum(&[(&[1, 3], &[f32::NAN, 2.0, 3.0])], |g, ids| {
        prod(g, ids[0], &[1])
    });
    assert!(grads[0].iter().all(|v| v.is_nan()), "{:?}", grads[0]);
}

#[test]
fn maximum_and_minimum_split_ties_in_half() {
    let a = [1.0, 2.0, -0.0, f32::NAN, 4.0];
    let b = [1.0, 3.0, 0.0, 1.0, 4.0];
    for (bop, da, db) in [
        (
            BinaryOp::Max,
            [0.5, 0.0, 0.5, 0.0, 0.5],
            [0.5, 1.0, 0.5, 0.0, 0.5],
        ),
        (
            BinaryOp::Min,
            [0.5, 1.0, 0.5, 0.0, 0.5],
            [0.5, 0.0, 0.5, 0.0, 0.5],
        ),
    ] {
        let grads = gradients_of_sum(&[(&[5], &a), (&[5], &b)], |g, ids| {
            op(g, Op::Binary(bop), &[ids[0], ids[1]])
        });
        assert_eq!(
            (grads[0].as_slice(), grads[1].as_slice()),
            (&da[..], &db[..]),
            "{bop:?}"
        );
    }
}

#[test]
fn relu_and_abs_have_slope_zero_at_zero_and_abs_nan_at_nan() {
    let x = [-0.0, 0.0, -2.0, 2.0, f32::NAN];
    let relu = gradients_of_sum(&[(&[5], &x)], |g, ids| {
        op(g, Op::Unary(UnaryOp::Relu), &[ids[0]])
    });
    assert_eq!(relu[0], [0.0, 0.0, 0.0, 1.0, 0.0]);
    let abs = gradients_of_sum(&[(&[5], &x)], |g, ids| {
        op(g, Op::Unary(UnaryOp::Abs), &[ids[0]])
    });
    // NaN's sign is NaN, as JAX's and PyTorch's: the gradient shows it.
    assert_eq!(abs[0][..4], [0.0, 0.0, -1.0, 1.0]);
    assert!(abs[0][4].is_nan(), "{:?}", abs[0]);
}

#[test]
fn no_gradient_flows_through_detach() {
    // sum(detach(x) * x + detach(x)): d/dx is detach(x) alone, x's value.
    let x = [1.5f32, -2.0, 0.0];
    let grads = gradients_of_sum(&[(&[3], &x)], |g, ids| {
        let d = op(g, Op::Unary(UnaryOp::Detach), &[ids[0]]);
        let p = op(g, Op::Binary(BinaryOp::Mul), &[d, ids[0]]);
        op(g, Op::Binary(BinaryOp::Add), &[p, d])
    });
    assert_eq!(grads, [x.to_vec()]);
    // A detached loss has no gradient at all: zeros, as for an unread value.
    let grads = gradients_of_sum(&[(&[3], &x)], |g, ids| {
        op(g, Op::Unary(UnaryOp::Detach), &[ids[0]])
    });
    assert_eq!(grads, [vec![0.0; 3]]);
}

#[test]
fn unread_values_get_zeros_and_intermediate_values_their_gradient() {
    let mut g = Graph::new("t");
    let x = g.input(f32s(&[3]));
    let w = g.input(f32s(&[2, 2]));
    let h = op(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let hh = op(&mut g, Op::Binary(BinaryOp::Add), &[h, h]);
    let loss = op(
        &mut g,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: SmallVec::from_slice(&[0]),
        },
        &[hh],
    );
    // A node after the loss, which the loss cannot depend on.
    let after = op(&mut g, Op::Unary(UnaryOp::Neg), &[loss]);
    g.outputs = grad(&mut g, loss, &[w, h, x, after]).expect("differentiates");
    let xs = [0.0f32, 1.0, -1.0];
    let out = eval(&g, &[xs.to_vec(), vec![1.0; 4]]);
    assert_eq!(out[0], [0.0; 4]);
    assert_eq!(out[1], [2.0; 3]);
    let exp2: Vec<f32> = xs
        .iter()
        .map(|&v| ((v as f64).exp() as f32) * 2.0)
        .collect();
    assert_eq!(out[2], exp2);
    assert_eq!(out[3], [0.0]);
}

#[test]
fn values_without_gradients_are_errors_that_name_the_op() {
    let mut g = Graph::new("t");
    let x = g.input(f32s(&[2, 3]));
    let i = op(&mut g, Op::Cast(DType::I32), &[x]);
    let rows = op(
        &mut g,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: SmallVec::from_slice(&[1]),
        },
        &[x],
    );
    let all = op(
        &mut g,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: SmallVec::from_slice(&[0]),
        },
        &[rows],
    );
    let zero = g.push(Op::Const(Scalar::F32(0.0)), &[]).expect("const");
    let zero = op(&mut g, Op::Expand(Shape::new(&[1, 1])), &[zero]);
    let positive = op(&mut g, Op::Binary(BinaryOp::Gt), &[all, zero]);
    let before = g.clone();
    let errors = [
        grad(&mut g, all, &[i]),
        grad(&mut g, positive, &[x]),
        grad(&mut g, rows, &[x]),
    ];
    let text: Vec<String> = errors
        .iter()
        .map(|e| e.as_ref().expect_err("no gradient").to_string())
        .collect();
    assert_eq!(
        text,
        [
            "grad: the cast node that makes the value to differentiate gives i32; only float values (f32, f64, bf16, f16) have gradients",
            "grad: the gt node that makes the loss gives bool; only float values (f32, f64, bf16, f16) have gradients",
            "grad: the loss must be one value, but the sum node that makes it has shape [2, 1]",
        ]
    );
    assert_eq!(g, before, "a failed grad leaves the graph as it was");
}

#[test]
fn a_fused_graph_is_an_error_naming_its_first_kernel() {
    let mut g = Graph::new("t");
    let x = g.input(f32s(&[4]));
    let e = op(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let s = op(
        &mut g,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: SmallVec::from_slice(&[0]),
        },
        &[e],
    );
    g.outputs = vec![s];
    let mut fused = optimize(&g, Options::default(), &mut |_, _| {})
        .expect("optimizes")
        .graph;
    let loss = fused.outputs[0];
    let err = grad(&mut fused, loss, &[NodeId(0)]).expect_err("fused");
    let text = err.to_string();
    assert!(
        text.starts_with("verifier: grad takes graph ops only, but node #1 is a kernel node"),
        "{text}"
    );
}

#[test]
fn the_backward_pass_of_a_layer_is_graph_ops() {
    let mut g = Graph::new("layer");
    let x = g.input(f32s(&[2, 3]));
    let w = g.input(f32s(&[3, 4]));
    let b = g.input(f32s(&[4]));
    let xw = op(&mut g, Op::MatMul, &[x, w]);
    let be = op(&mut g, Op::Expand(Shape::new(&[2, 4])), &[b]);
    let z = op(&mut g, Op::Binary(BinaryOp::Add), &[xw, be]);
    let y = op(&mut g, Op::Unary(UnaryOp::Relu), &[z]);
    let loss = op(
        &mut g,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: SmallVec::from_slice(&[0, 1]),
        },
        &[y],
    );
    g.outputs = grad(&mut g, loss, &[w, b]).expect("differentiates");
    insta::assert_snapshot!(g.to_string(), @r"
    graph @layer(%0: f32[2,3], %1: f32[3,4], %2: f32[4]) -> (f32[3,4], f32[4]) {
      %3 = matmul %0, %1 : f32[2,4]
      %4 = expand %2 [2,4] : f32[2,4]
      %5 = add %3, %4 : f32[2,4]
      %6 = relu %5 : f32[2,4]
      %7 = sum %6 axes [0,1] : f32[1,1]
      %8 = const 1.0 : f32[]
      %9 = expand %8 [1,1] : f32[1,1]
      %10 = expand %9 [2,4] : f32[2,4]
      %11 = const 0.0 : f32[]
      %12 = expand %11 [2,4] : f32[2,4]
      %13 = gt %6, %12 : bool[2,4]
      %14 = where %13, %10, %12 : f32[2,4]
      %15 = sum %14 axes [0] : f32[1,4]
      %16 = reshape %15 [4] : f32[4]
      %17 = permute %0 [1,0] : f32[3,2]
      %18 = matmul %17, %14 : f32[3,4]
      return %18, %16
    }
    ");
}
