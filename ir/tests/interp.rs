//! The reference interpreter against hand-computed values, op by op: the
//! oracle is only as good as these checks.

use kiln_ir::interp::eval;
use kiln_ir::{
    BinaryOp, DType, Data, Graph, Op, ReduceOp, Scalar, Shape, SliceRange, TensorType, UnaryOp,
};
use smallvec::smallvec;

const NAN: f32 = f32::NAN;
const INF: f32 = f32::INFINITY;

/// Evaluates `op` applied to `inputs` (data and shape each) and returns the
/// result's data and shape.
fn run(op: Op, inputs: &[(Data, &[usize])]) -> (Data, Shape) {
    let mut g = Graph::new("t");
    let ids: Vec<_> = inputs
        .iter()
        .map(|(d, s)| g.input(TensorType::new(d.dtype(), *s)))
        .collect();
    let out = g.push(op, &ids).expect("operands fit the op");
    g.outputs = vec![out];
    let data: Vec<&Data> = inputs.iter().map(|(d, _)| d).collect();
    let mut outs = eval(&g, &data).expect("evaluation succeeds");
    (outs.remove(0), g.node(out).ty.shape.clone())
}

fn f32s(v: &[f32]) -> Data {
    Data::F32(v.to_vec())
}

/// Compares bit patterns through `==`, except that any NaN equals any NaN.
fn assert_f32(actual: &Data, expected: &[f32]) {
    let Data::F32(actual) = actual else {
        panic!("expected f32 data, got {actual:?}")
    };
    assert_eq!(actual.len(), expected.len(), "length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        let same =
            (a.is_nan() && e.is_nan()) || (a == e && a.is_sign_negative() == e.is_sign_negative());
        assert!(
            same,
            "element {i}: got {a:?}, expected {e:?}\nall: {actual:?}"
        );
    }
}

fn unary(op: UnaryOp, x: &[f32]) -> Data {
    run(Op::Unary(op), &[(f32s(x), &[x.len()])]).0
}

#[test]
fn unary_ops_on_f32() {
    let x = [-2.0, -0.0, 0.0, 0.5, 4.0, INF, -INF, NAN];
    assert_f32(
        &unary(UnaryOp::Neg, &x),
        &[2.0, 0.0, -0.0, -0.5, -4.0, -INF, INF, NAN],
    );
    assert_f32(
        &unary(UnaryOp::Abs, &x),
        &[2.0, 0.0, 0.0, 0.5, 4.0, INF, INF, NAN],
    );
    assert_f32(
        &unary(UnaryOp::Relu, &x),
        &[0.0, 0.0, 0.0, 0.5, 4.0, INF, 0.0, NAN],
    );
    assert_f32(
        &unary(UnaryOp::Sqrt, &x),
        &[NAN, -0.0, 0.0, 0.70710677, 2.0, INF, NAN, NAN],
    );
    assert_f32(
        &unary(UnaryOp::Recip, &x),
        &[-0.5, -INF, INF, 2.0, 0.25, 0.0, -0.0, NAN],
    );
    assert_f32(
        &unary(UnaryOp::Exp, &[0.0, 1.0, -INF, INF, 100.0, NAN]),
        &[1.0, std::f32::consts::E, 0.0, INF, INF, NAN],
    );
    // f32's E is below e: its log is 1 - 3.05e-8, nearer 0.99999994 than 1.
    let log = unary(
        UnaryOp::Log,
        &[1.0, std::f32::consts::E, 0.0, -1.0, INF, NAN],
    );
    assert_f32(&log, &[0.0, 0.99999994, -INF, NAN, INF, NAN]);
    assert_f32(
        &unary(UnaryOp::Sigmoid, &[0.0, INF, -INF, 2.0, NAN]),
        &[0.5, 1.0, 0.0, 0.8807971, NAN],
    );
    assert_f32(
        &unary(UnaryOp::Tanh, &[0.0, INF, -INF, 0.5, NAN]),
        &[0.0, 1.0, -1.0, 0.46211717, NAN],
    );
}

#[test]
fn unary_ops_on_i32_wrap() {
    let x = Data::I32(vec![-3, 0, 7, i32::MIN]);
    let neg = run(Op::Unary(UnaryOp::Neg), &[(x.clone(), &[4])]).0;
    assert_eq!(neg, Data::I32(vec![3, 0, -7, i32::MIN]));
    let abs = run(Op::Unary(UnaryOp::Abs), &[(x.clone(), &[4])]).0;
    assert_eq!(abs, Data::I32(vec![3, 0, 7, i32::MIN]));
    let relu = run(Op::Unary(UnaryOp::Relu), &[(x, &[4])]).0;
    assert_eq!(relu, Data::I32(vec![0, 0, 7, 0]));
}

fn binary(op: BinaryOp, a: Data, b: Data) -> Data {
    let n = a.len();
    run(Op::Binary(op), &[(a, &[n]), (b, &[n])]).0
}

#[test]
fn binary_arithmetic_on_f32() {
    let a = f32s(&[1.0, -2.0, 3.0, INF, INF, NAN, 0.0]);
    let b = f32s(&[0.5, 4.0, -3.0, 1.0, -INF, 1.0, 0.0]);
    assert_f32(
        &binary(BinaryOp::Add, a.clone(), b.clone()),
        &[1.5, 2.0, 0.0, INF, NAN, NAN, 0.0],
    );
    assert_f32(
        &binary(BinaryOp::Sub, a.clone(), b.clone()),
        &[0.5, -6.0, 6.0, INF, INF, NAN, 0.0],
    );
    assert_f32(
        &binary(BinaryOp::Mul, a.clone(), b.clone()),
        &[0.5, -8.0, -9.0, INF, -INF, NAN, 0.0],
    );
    assert_f32(
        &binary(BinaryOp::Div, a.clone(), b.clone()),
        &[2.0, -0.5, -1.0, INF, NAN, NAN, NAN],
    );
    assert_f32(
        &binary(BinaryOp::Max, a.clone(), b.clone()),
        &[1.0, 4.0, 3.0, INF, INF, NAN, 0.0],
    );
    assert_f32(
        &binary(BinaryOp::Min, a.clone(), b.clone()),
        &[0.5, -2.0, -3.0, 1.0, -INF, NAN, 0.0],
    );
    // NaN propagates from either side of max and min.
    assert_f32(&binary(BinaryOp::Max, f32s(&[1.0]), f32s(&[NAN])), &[NAN]);
    assert_f32(&binary(BinaryOp::Min, f32s(&[NAN]), f32s(&[1.0])), &[NAN]);
    let pow = binary(
        BinaryOp::Pow,
        f32s(&[2.0, 4.0, -8.0, 0.0, NAN]),
        f32s(&[3.0, 0.5, 1.0 / 3.0, 0.0, 0.0]),
    );
    assert_f32(&pow, &[8.0, 2.0, NAN, 1.0, 1.0]);
}

#[test]
fn f32_arithmetic_rounds_once() {
    // 1 + 2^-24 is not an f32: rounding to even gives 1.0.
    let sum = binary(BinaryOp::Add, f32s(&[1.0]), f32s(&[f32::EPSILON / 2.0]));
    assert_f32(&sum, &[1.0]);
    // 0.1 + 0.2 in f32 is 0.3 rounded from the exact sum of the two f32 values.
    let sum = binary(BinaryOp::Add, f32s(&[0.1]), f32s(&[0.2]));
    assert_f32(&sum, &[0.1f32 + 0.2f32]);
}

#[test]
fn integer_arithmetic_wraps() {
    let add = binary(
        BinaryOp::Add,
        Data::I32(vec![i32::MAX, -5]),
        Data::I32(vec![1, 3]),
    );
    assert_eq!(add, Data::I32(vec![i32::MIN, -2]));
    let mul = binary(
        BinaryOp::Mul,
        Data::I32(vec![65536, -7]),
        Data::I32(vec![65536, 6]),
    );
    assert_eq!(mul, Data::I32(vec![0, -42]));
    let sub = binary(
        BinaryOp::Sub,
        Data::U8(vec![3, 200]),
        Data::U8(vec![5, 100]),
    );
    assert_eq!(sub, Data::U8(vec![254, 100]));
    let add = binary(BinaryOp::Add, Data::U8(vec![250]), Data::U8(vec![10]));
    assert_eq!(add, Data::U8(vec![4]));
    let max = binary(
        BinaryOp::Max,
        Data::I32(vec![-1, 9]),
        Data::I32(vec![2, -9]),
    );
    assert_eq!(max, Data::I32(vec![2, 9]));
    let min = binary(BinaryOp::Min, Data::U8(vec![1, 9]), Data::U8(vec![2, 3]));
    assert_eq!(min, Data::U8(vec![1, 3]));
}

#[test]
fn comparisons_give_bool_and_nan_compares_false() {
    let a = f32s(&[1.0, 2.0, 3.0, NAN, -0.0]);
    let b = f32s(&[2.0, 2.0, 2.0, NAN, 0.0]);
    let cases = [
        (BinaryOp::Lt, [true, false, false, false, false]),
        (BinaryOp::Le, [true, true, false, false, true]),
        (BinaryOp::Gt, [false, false, true, false, false]),
        (BinaryOp::Ge, [false, true, true, false, true]),
        (BinaryOp::Eq, [false, true, false, false, true]),
        (BinaryOp::Ne, [true, false, true, true, false]),
    ];
    for (op, expected) in cases {
        assert_eq!(
            binary(op, a.clone(), b.clone()),
            Data::Bool(expected.to_vec()),
            "{op:?}"
        );
    }
    let ints = binary(BinaryOp::Lt, Data::I32(vec![-1, 5]), Data::I32(vec![0, 5]));
    assert_eq!(ints, Data::Bool(vec![true, false]));
    let bools = binary(
        BinaryOp::Eq,
        Data::Bool(vec![true, false]),
        Data::Bool(vec![true, true]),
    );
    assert_eq!(bools, Data::Bool(vec![true, false]));
}

#[test]
fn where_selects() {
    let c = Data::Bool(vec![true, false, true]);
    let (a, b) = (f32s(&[1.0, 2.0, 3.0]), f32s(&[-1.0, -2.0, NAN]));
    let out = run(Op::Where, &[(c, &[3]), (a, &[3]), (b, &[3])]).0;
    assert_f32(&out, &[1.0, -2.0, 3.0]);
}

#[test]
fn casts() {
    let x = f32s(&[1.7, -1.7, NAN, 1e10, -1e10, 300.0, 0.0]);
    let to_i32 = run(Op::Cast(DType::I32), &[(x.clone(), &[7])]).0;
    assert_eq!(
        to_i32,
        Data::I32(vec![1, -1, 0, i32::MAX, i32::MIN, 300, 0])
    );
    let to_u8 = run(Op::Cast(DType::U8), &[(x.clone(), &[7])]).0;
    assert_eq!(to_u8, Data::U8(vec![1, 0, 0, 255, 0, 255, 0]));
    let to_bool = run(Op::Cast(DType::Bool), &[(x, &[7])]).0;
    assert_eq!(
        to_bool,
        Data::Bool(vec![true, true, true, true, true, true, false])
    );
    let wrap = run(Op::Cast(DType::U8), &[(Data::I32(vec![256, -1, 77]), &[3])]).0;
    assert_eq!(wrap, Data::U8(vec![0, 255, 77]));
    let widen = run(Op::Cast(DType::F32), &[(Data::U8(vec![0, 255]), &[2])]).0;
    assert_f32(&widen, &[0.0, 255.0]);
    let from_bool = run(
        Op::Cast(DType::I32),
        &[(Data::Bool(vec![true, false]), &[2])],
    )
    .0;
    assert_eq!(from_bool, Data::I32(vec![1, 0]));
    let big = run(Op::Cast(DType::F32), &[(Data::I32(vec![16_777_217]), &[1])]).0;
    assert_f32(&big, &[16_777_216.0]);
}

#[test]
fn const_is_a_rank0_value() {
    let (out, shape) = run(Op::Const(Scalar::F32(2.5)), &[]);
    assert_f32(&out, &[2.5]);
    assert_eq!(shape, Shape::scalar());
}

// ----- Views. -----

/// 0..n as f32, for views whose result is easy to read off.
fn iota(n: usize) -> Data {
    f32s(&(0..n).map(|i| i as f32).collect::<Vec<_>>())
}

#[test]
fn reshape_keeps_row_major_order() {
    let (out, shape) = run(Op::Reshape(Shape::new(&[3, 2])), &[(iota(6), &[2, 3])]);
    assert_f32(&out, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(shape.dims(), &[3, 2]);
}

#[test]
fn permute_transposes() {
    let (out, shape) = run(Op::Permute(smallvec![1, 0]), &[(iota(6), &[2, 3])]);
    assert_f32(&out, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(shape.dims(), &[3, 2]);
    // [2,3,2] -> [2,2,3]: out[i][j][k] = in[i][k][j].
    let (out, _) = run(Op::Permute(smallvec![0, 2, 1]), &[(iota(12), &[2, 3, 2])]);
    assert_f32(
        &out,
        &[0.0, 2.0, 4.0, 1.0, 3.0, 5.0, 6.0, 8.0, 10.0, 7.0, 9.0, 11.0],
    );
}

#[test]
fn expand_broadcasts_size_one_axes_and_adds_leading_ones() {
    let (out, _) = run(
        Op::Expand(Shape::new(&[2, 3])),
        &[(f32s(&[1.0, 2.0, 3.0]), &[3])],
    );
    assert_f32(&out, &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    let (out, _) = run(
        Op::Expand(Shape::new(&[2, 3])),
        &[(f32s(&[1.0, 2.0]), &[2, 1])],
    );
    assert_f32(&out, &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    let (out, _) = run(Op::Expand(Shape::new(&[2, 2])), &[(f32s(&[7.0]), &[])]);
    assert_f32(&out, &[7.0; 4]);
    // Broadcast binary op: [2,1] + [3] -> [2,3] through two expands.
    let mut g = Graph::new("t");
    let a = g.input(TensorType::new(DType::F32, [2, 1]));
    let b = g.input(TensorType::new(DType::F32, [3]));
    let ea = g.push(Op::Expand(Shape::new(&[2, 3])), &[a]).unwrap();
    let eb = g.push(Op::Expand(Shape::new(&[2, 3])), &[b]).unwrap();
    let sum = g.push(Op::Binary(BinaryOp::Add), &[ea, eb]).unwrap();
    g.outputs = vec![sum];
    let out = eval(&g, &[&f32s(&[10.0, 20.0]), &f32s(&[1.0, 2.0, 3.0])]).unwrap();
    assert_f32(&out[0], &[11.0, 12.0, 13.0, 21.0, 22.0, 23.0]);
}

#[test]
fn slice_with_steps() {
    let ranges = smallvec![
        SliceRange {
            start: 1,
            end: 3,
            step: 1
        },
        SliceRange {
            start: 0,
            end: 4,
            step: 2
        },
    ];
    let (out, shape) = run(Op::Slice(ranges), &[(iota(12), &[3, 4])]);
    assert_f32(&out, &[4.0, 6.0, 8.0, 10.0]);
    assert_eq!(shape.dims(), &[2, 2]);
    // Steps that do not divide the range keep the partial last step: 0, 3, 6.
    let ranges = smallvec![SliceRange {
        start: 0,
        end: 7,
        step: 3
    }];
    let (out, _) = run(Op::Slice(ranges), &[(iota(7), &[7])]);
    assert_f32(&out, &[0.0, 3.0, 6.0]);
    // An empty range gives an empty axis.
    let ranges = smallvec![SliceRange {
        start: 2,
        end: 2,
        step: 1
    }];
    let (out, shape) = run(Op::Slice(ranges), &[(iota(4), &[4])]);
    assert!(out.is_empty());
    assert_eq!(shape.dims(), &[0]);
}

#[test]
fn unfold_reads_overlapping_windows() {
    // Windows of 3 every 2 along the last axis of [2, 7]: starts 0, 2, 4.
    let op = Op::Unfold {
        axis: 1,
        size: 3,
        step: 2,
    };
    let (out, shape) = run(op, &[(iota(14), &[2, 7])]);
    assert_eq!(shape.dims(), &[2, 3, 3]);
    assert_f32(
        &out,
        &[
            0.0, 1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 5.0, 6.0, //
            7.0, 8.0, 9.0, 9.0, 10.0, 11.0, 11.0, 12.0, 13.0,
        ],
    );
    // Along a leading axis the window axis still comes last: [3, 2] by 2
    // every 1 is [2, 2, 2], element (i, j, w) = x[i + w, j].
    let op = Op::Unfold {
        axis: 0,
        size: 2,
        step: 1,
    };
    let (out, shape) = run(op, &[(iota(6), &[3, 2])]);
    assert_eq!(shape.dims(), &[2, 2, 2]);
    assert_f32(&out, &[0.0, 2.0, 1.0, 3.0, 2.0, 4.0, 3.0, 5.0]);
}

#[test]
fn pad_fills_around() {
    let op = Op::Pad {
        pads: smallvec![(1, 0), (0, 2)],
        value: Scalar::F32(-1.0),
    };
    let (out, shape) = run(op, &[(f32s(&[1.0, 2.0, 3.0, 4.0]), &[2, 2])]);
    assert_eq!(shape.dims(), &[3, 4]);
    assert_f32(
        &out,
        &[
            -1.0, -1.0, -1.0, -1.0, 1.0, 2.0, -1.0, -1.0, 3.0, 4.0, -1.0, -1.0,
        ],
    );
}

#[test]
fn views_compose() {
    // transpose then slice then expand: a chain of index maps.
    let mut g = Graph::new("t");
    let x = g.input(TensorType::new(DType::F32, [2, 3]));
    let t = g.push(Op::Permute(smallvec![1, 0]), &[x]).unwrap(); // [3,2]
    let s = g
        .push(
            Op::Slice(smallvec![
                SliceRange {
                    start: 1,
                    end: 3,
                    step: 1
                },
                SliceRange {
                    start: 1,
                    end: 2,
                    step: 1
                }
            ]),
            &[t],
        )
        .unwrap(); // [2,1] = [[4],[5]]
    let e = g.push(Op::Expand(Shape::new(&[2, 2, 3])), &[s]).unwrap();
    g.outputs = vec![e];
    let out = eval(&g, &[&iota(6)]).unwrap();
    assert_f32(
        &out[0],
        &[4.0, 4.0, 4.0, 5.0, 5.0, 5.0, 4.0, 4.0, 4.0, 5.0, 5.0, 5.0],
    );
}

// ----- Reductions. -----

fn reduce(op: ReduceOp, axes: &[usize], x: Data, shape: &[usize]) -> (Data, Shape) {
    run(
        Op::Reduce {
            op,
            axes: axes.into(),
        },
        &[(x, shape)],
    )
}

#[test]
fn sum_over_axes_keeps_them_as_size_one() {
    let (out, shape) = reduce(ReduceOp::Sum, &[1], iota(6), &[2, 3]);
    assert_f32(&out, &[3.0, 12.0]);
    assert_eq!(shape.dims(), &[2, 1]);
    let (out, shape) = reduce(ReduceOp::Sum, &[0], iota(6), &[2, 3]);
    assert_f32(&out, &[3.0, 5.0, 7.0]);
    assert_eq!(shape.dims(), &[1, 3]);
    let (out, shape) = reduce(ReduceOp::Sum, &[0, 2], iota(12), &[2, 3, 2]);
    // out[j] = sum over i, k of 6i + 2j + k.
    assert_f32(&out, &[14.0, 22.0, 30.0]);
    assert_eq!(shape.dims(), &[1, 3, 1]);
    // Reducing a size-1 axis, and reducing no axis, leave values as they are.
    let (out, _) = reduce(ReduceOp::Sum, &[1], f32s(&[1.5, 2.5]), &[2, 1]);
    assert_f32(&out, &[1.5, 2.5]);
    let (out, _) = reduce(ReduceOp::Sum, &[], f32s(&[1.5, 2.5]), &[2]);
    assert_f32(&out, &[1.5, 2.5]);
    // An empty axis sums to 0.
    let (out, shape) = reduce(ReduceOp::Sum, &[1], f32s(&[]), &[2, 0]);
    assert_f32(&out, &[0.0, 0.0]);
    assert_eq!(shape.dims(), &[2, 1]);
}

#[test]
fn sum_accumulates_in_f64() {
    // In f32, 1e8 + 1 + 1 + ... loses every 1; in f64 they add up before rounding.
    let mut x = vec![1.0f32; 1001];
    x[0] = 1e8;
    let (out, _) = reduce(ReduceOp::Sum, &[0], f32s(&x), &[1001]);
    assert_f32(&out, &[100_001_000.0]);
    let (out, _) = reduce(ReduceOp::Sum, &[0], f32s(&[1.0, INF, 2.0]), &[3]);
    assert_f32(&out, &[INF]);
    let (out, _) = reduce(ReduceOp::Sum, &[0], f32s(&[INF, -INF]), &[2]);
    assert_f32(&out, &[NAN]);
    let (out, _) = reduce(ReduceOp::Sum, &[0], Data::I32(vec![i32::MAX, 1, 5]), &[3]);
    assert_eq!(out, Data::I32(vec![i32::MIN + 5]));
}

#[test]
fn max_reduction() {
    let (out, _) = reduce(
        ReduceOp::Max,
        &[1],
        f32s(&[1.0, -3.0, 2.0, -INF, -INF, -5.0]),
        &[2, 3],
    );
    assert_f32(&out, &[2.0, -5.0]);
    let (out, _) = reduce(ReduceOp::Max, &[0], f32s(&[1.0, NAN, 2.0]), &[3]);
    assert_f32(&out, &[NAN]);
    let (out, _) = reduce(ReduceOp::Max, &[0], f32s(&[-INF, -INF]), &[2]);
    assert_f32(&out, &[-INF]);
    let (out, _) = reduce(
        ReduceOp::Max,
        &[0, 1],
        Data::U8(vec![3, 250, 7, 0]),
        &[2, 2],
    );
    assert_eq!(out, Data::U8(vec![250]));
    let (out, _) = reduce(ReduceOp::Max, &[0], Data::I32(vec![-7, -3]), &[2]);
    assert_eq!(out, Data::I32(vec![-3]));
}

#[test]
fn prod_reduction_wraps_integers_and_gives_one_over_an_empty_axis() {
    let (out, shape) = reduce(ReduceOp::Prod, &[1], iota(6), &[2, 3]);
    assert_f32(&out, &[0.0, 60.0]);
    assert_eq!(shape.dims(), &[2, 1]);
    let (out, _) = reduce(ReduceOp::Prod, &[0, 2], iota(12), &[2, 3, 2]);
    // out[j] = the product over i, k of 6i + 2j + k.
    assert_f32(&out, &[0.0, 2.0 * 3.0 * 8.0 * 9.0, 4.0 * 5.0 * 10.0 * 11.0]);
    let (out, shape) = reduce(ReduceOp::Prod, &[1], f32s(&[]), &[2, 0]);
    assert_f32(&out, &[1.0, 1.0]);
    assert_eq!(shape.dims(), &[2, 1]);
    let (out, _) = reduce(ReduceOp::Prod, &[], f32s(&[1.5, -2.5]), &[2]);
    assert_f32(&out, &[1.5, -2.5]);
    // Rounded once from f64: 1e30 * 1e30 * 1e-30 is 1e30, not inf.
    let (out, _) = reduce(ReduceOp::Prod, &[0], f32s(&[1e30, 1e30, 1e-30]), &[3]);
    assert_f32(&out, &[1e30]);
    let (out, _) = reduce(ReduceOp::Prod, &[0], f32s(&[INF, 0.0]), &[2]);
    assert_f32(&out, &[NAN]);
    let (out, _) = reduce(ReduceOp::Prod, &[0], f32s(&[-1.0, 0.0]), &[2]);
    assert!(matches!(out, Data::F32(v) if v[0].to_bits() == (-0.0f32).to_bits()));
    let (out, _) = reduce(
        ReduceOp::Prod,
        &[0],
        Data::I32(vec![1 << 20, 1 << 12, 3]),
        &[3],
    );
    assert_eq!(out, Data::I32(vec![0]));
    let (out, _) = reduce(
        ReduceOp::Prod,
        &[0],
        Data::I32(vec![65537, 65537, -1]),
        &[3],
    );
    assert_eq!(
        out,
        Data::I32(vec![65537i32.wrapping_mul(65537).wrapping_neg()])
    );
    let (out, _) = reduce(
        ReduceOp::Prod,
        &[0],
        Data::I64(vec![1 << 40, 1 << 30, 7]),
        &[3],
    );
    assert_eq!(
        out,
        Data::I64(vec![(1i64 << 40).wrapping_mul(1 << 30).wrapping_mul(7)])
    );
    let (out, _) = reduce(
        ReduceOp::Prod,
        &[0, 1],
        Data::U8(vec![3, 250, 7, 1]),
        &[2, 2],
    );
    assert_eq!(out, Data::U8(vec![(3u8).wrapping_mul(250).wrapping_mul(7)]));
    let (out, shape) = reduce(ReduceOp::Prod, &[0], Data::I64(vec![-4]), &[1]);
    assert_eq!((out, shape.dims()), (Data::I64(vec![-4]), &[1][..]));
}

#[test]
fn prod_refuses_bool() {
    let mut g = Graph::new("t");
    let x = g.input(TensorType::new(DType::Bool, [2]));
    let op = Op::Reduce {
        op: ReduceOp::Prod,
        axes: smallvec![0],
    };
    let e = g.push(op, &[x]).expect_err("bool has no product");
    assert!(e.to_string().contains("prod"), "{e}");
}

// ----- Matmul. -----

#[test]
fn matmul_2d() {
    // [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] = [[4,5],[10,11]]
    let a = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32s(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let (out, shape) = run(Op::MatMul, &[(a, &[2, 3]), (b, &[3, 2])]);
    assert_f32(&out, &[4.0, 5.0, 10.0, 11.0]);
    assert_eq!(shape.dims(), &[2, 2]);
}

#[test]
fn matmul_batched() {
    // Batch 0: identity times [[1,2],[3,4]]; batch 1: 2*identity times [[5,6],[7,8]].
    let a = f32s(&[1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0]);
    let b = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let (out, shape) = run(Op::MatMul, &[(a, &[2, 2, 2]), (b, &[2, 2, 2])]);
    assert_f32(&out, &[1.0, 2.0, 3.0, 4.0, 10.0, 12.0, 14.0, 16.0]);
    assert_eq!(shape.dims(), &[2, 2, 2]);
}

#[test]
fn matmul_edge_shapes_and_specials() {
    // k = 1 is an outer product; NaN and inf propagate through the dot product.
    let (out, _) = run(
        Op::MatMul,
        &[(f32s(&[1.0, 2.0]), &[2, 1]), (f32s(&[3.0, INF]), &[1, 2])],
    );
    assert_f32(&out, &[3.0, INF, 6.0, INF]);
    let (out, _) = run(
        Op::MatMul,
        &[(f32s(&[1.0, NAN]), &[1, 2]), (f32s(&[1.0, 1.0]), &[2, 1])],
    );
    assert_f32(&out, &[NAN]);
    // k = 0 gives zeros.
    let (out, shape) = run(Op::MatMul, &[(f32s(&[]), &[2, 0]), (f32s(&[]), &[0, 3])]);
    assert_f32(&out, &[0.0; 6]);
    assert_eq!(shape.dims(), &[2, 3]);
}

// ----- Inputs and the verifier. -----

#[test]
fn eval_rejects_inputs_that_do_not_match_the_signature() {
    let mut g = Graph::new("t");
    let x = g.input(TensorType::new(DType::F32, [2, 2]));
    g.outputs = vec![x];
    let err = eval(&g, &[&f32s(&[1.0, 2.0, 3.0])]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "input 0: expected f32[2,2], got 3 values of f32"
    );
    let err = eval(&g, &[&Data::I32(vec![1, 2, 3, 4])]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "input 0: expected f32[2,2], got 4 values of i32"
    );
    let err = eval(&g, &[]).unwrap_err();
    assert_eq!(err.to_string(), "graph @t: expects 1 inputs, got 0");
}

#[test]
fn verifier_catches_broken_graphs() {
    let mut g = Graph::new("broken");
    let x = g.input(TensorType::new(DType::F32, [2]));
    let r = g.push(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    g.outputs = vec![r];
    kiln_ir::verify(&g).expect("a well-formed graph verifies");

    let mut wrong_type = g.clone();
    wrong_type.nodes[1].ty = TensorType::new(DType::F32, [3]);
    let err = kiln_ir::verify(&wrong_type).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "verifier: node #1 (relu) is stored as f32[3] but its operands make it f32[2]"
        ),
        "{err}"
    );
    assert!(
        err.contains("graph @broken(%0: f32[2]) -> f32[3] {"),
        "the error carries the dump: {err}"
    );

    let mut forward = g.clone();
    forward.nodes[1].inputs[0] = kiln_ir::NodeId(1);
    let err = kiln_ir::verify(&forward).unwrap_err().to_string();
    assert!(
        err.starts_with("verifier: node #1 (relu) reads #1, which does not come before it"),
        "{err}"
    );

    let mut dangling = g.clone();
    dangling.outputs = vec![kiln_ir::NodeId(9)];
    let err = kiln_ir::verify(&dangling).unwrap_err().to_string();
    assert!(
        err.starts_with("verifier: output #9 is not in the graph"),
        "{err}"
    );

    let mut twice = g.clone();
    twice.nodes.push(twice.nodes[0].clone());
    let err = kiln_ir::verify(&twice).unwrap_err().to_string();
    assert!(
        err.starts_with("verifier: input 0 has more than one node"),
        "{err}"
    );

    let mut undeclared = g;
    undeclared.inputs.push(TensorType::new(DType::U8, [1]));
    let err = kiln_ir::verify(&undeclared).unwrap_err().to_string();
    assert!(
        err.starts_with("verifier: input 1 is declared but has no node"),
        "{err}"
    );
}
