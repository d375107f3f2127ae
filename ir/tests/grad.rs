//! Every graph op's gradient rule against central finite differences on the
//! interpreter (`kiln_support::gradcheck`, which states the tolerance):
//! random awkward shapes (1s, 0s, odd sizes), broadcasting on both sides of
//! every binary op, chains of views with strides and padding, batched and
//! broadcast matmuls, values read by several ops (their gradients add up),
//! ties of max and min, where a central difference sees the even split,
//! and products over rows holding no zero, one or several.
//! Every gradient graph also goes through the optimizer, fused and unfused,
//! and must give the same bits there.
//!
//! What differences cannot see is checked by value in `grad_rules.rs`:
//! three-way ties, relu and abs at 0, NaN rows, zeros for values the loss
//! does not read, and the errors.

use kiln_ir::pass::{Options, optimize};
use kiln_ir::{
    BinaryOp, DType, Data, Graph, NodeId, Op, ReduceOp, Scalar, Shape, SliceRange, TensorType,
    TrigOp, UnaryOp, grad, interp,
};
use kiln_support::gradcheck::{self, Rng};
use kiln_support::random_graph::same;
use proptest::prelude::*;
use smallvec::SmallVec;

/// A graph under construction, with the data of its inputs.
struct Case {
    g: Graph,
    data: Vec<Vec<f32>>,
    rng: Rng,
}

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
fn eval(graph: &Graph, inputs: &[Vec<f32>]) -> Result<Vec<Data>, String> {
    let data: Vec<Data> = inputs.iter().map(|v| Data::F32(v.clone())).collect();
    let refs: Vec<&Data> = data.iter().collect();
    interp::eval(graph, &refs).map_err(|e| format!("{e}\n{graph}"))
}

impl Case {
    fn new(seed: u64) -> Case {
        Case {
            g: Graph::new("case"),
            data: Vec::new(),
            rng: Rng(seed),
        }
    }

    /// A new f32 input of shape `dims`, its elements drawn by `draw`.
    fn input(&mut self, dims: &[usize], draw: impl FnMut(&mut Rng) -> f32) -> NodeId {
        let n = dims.iter().product();
        self.data.push(self.rng.fill(n, draw));
        self.g.input(f32s(dims))
    }

    fn push(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        let text = format!("{op:?}");
        self.g
            .push(op, inputs)
            .unwrap_or_else(|e| panic!("{text}: {e}\n{}", self.g))
    }

    /// `a op b`, both broadcast to their common shape as the API records it.
    fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        let (sa, sb) = (&self.g.node(a).ty.shape, &self.g.node(b).ty.shape);
        let to = Shape::broadcast(op.name(), sa, sb).expect("the shapes broadcast");
        let a = self.expand(a, &to);
        let b = self.expand(b, &to);
        self.push(Op::Binary(op), &[a, b])
    }

    fn expand(&mut self, x: NodeId, to: &Shape) -> NodeId {
        if &self.g.node(x).ty.shape == to {
            return x;
        }
        self.push(Op::Expand(to.clone()), &[x])
    }

    /// Dims of `rank` awkward sizes; 0 only where `empty` allows.
    fn dims(&mut self, rank: usize, empty: bool) -> Vec<usize> {
        let sizes: &[usize] = if empty {
            &[1, 2, 3, 5, 7, 1, 2, 3, 0]
        } else {
            &[1, 2, 3, 5, 7]
        };
        (0..rank)
            .map(|_| sizes[self.rng.below(sizes.len())])
            .collect()
    }

    /// `dims` with some axes made 1 and some leading axes dropped: a shape
    /// that broadcasts to `dims`.
    fn broadcast_from(&mut self, dims: &[usize]) -> Vec<usize> {
        let drop = self.rng.below(dims.len() + 1).min(self.rng.below(3));
        dims[drop..]
            .iter()
            .map(|&d| if self.rng.below(3) == 0 { 1 } else { d })
            .collect()
    }

    /// Differentiates `sum(y * r)` for a random `r` with respect to every
    /// input, and checks the result against finite differences of `y` and
    /// against the optimized gradient graph.
    fn check(self, y: NodeId) -> Result<(), TestCaseError> {
        let Case {
            mut g,
            data,
            mut rng,
        } = self;
        let mut forward = g.clone();
        forward.outputs = vec![y];
        let ty = g.node(y).ty.clone();
        let r = rng.fill(ty.shape.numel(), |rng| rng.uniform(-1.0, 1.0));
        let rid = g.input(ty.clone());
        let product = g.push(Op::Binary(BinaryOp::Mul), &[y, rid]).map_err(fail)?;
        let loss = match ty.shape.rank() {
            0 => product,
            rank => {
                let op = Op::Reduce {
                    op: ReduceOp::Sum,
                    axes: (0..rank).collect(),
                };
                g.push(op, &[product]).map_err(fail)?
            }
        };
        let wrt: Vec<NodeId> = (0..data.len()).map(|i| input_node(&g, i)).collect();
        let grads = grad(&mut g, loss, &wrt).map_err(fail)?;
        g.outputs = grads;
        let mut all = data.clone();
        all.push(r.clone());
        let analytic = eval(&g, &all).map_err(TestCaseError::fail)?;
        for fusion in [true, false] {
            let optimized = optimize(
                &g,
                Options {
                    fusion,
                    ..Options::default()
                },
                &mut |_, _| {},
            )
            .map_err(fail)?;
            let again = eval(&optimized.graph, &all).map_err(TestCaseError::fail)?;
            for (k, (want, have)) in analytic.iter().zip(&again).enumerate() {
                prop_assert!(
                    same(want, have),
                    "gradient {k} changes under the optimizer (fusion {fusion}):\n{g}"
                );
            }
        }
        let analytic: Vec<Vec<f32>> = analytic.iter().map(f32_data).collect();
        let wrt: Vec<usize> = (0..data.len()).collect();
        gradcheck::check(&data, &wrt, &r, &analytic, |inputs| {
            Ok(f32_data(&eval(&forward, inputs)?[0]))
        })
        .map_err(|e| TestCaseError::fail(format!("{e}\n{g}")))
    }
}

fn fail(e: kiln_ir::Error) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// The node of graph input `index`.
fn input_node(g: &Graph, index: usize) -> NodeId {
    let at = g
        .nodes
        .iter()
        .position(|n| {
            n.op == Op::Input {
                index: index as u32,
            }
        })
        .expect("every input has a node");
    NodeId(at as u32)
}

/// Values on a grid of step 0.5, offset so that none is within 0.1 of an
/// integer or of 0: ties among them are exact, other pairs 0.5 apart.
fn grid(rng: &mut Rng) -> f32 {
    rng.below(9) as f32 * 0.5 - 1.9
}

/// The same grid shifted by 0.25: never equal to a `grid` value.
fn grid_between(rng: &mut Rng) -> f32 {
    grid(rng) + 0.25
}

fn unary_case(seed: u64) -> Result<(), TestCaseError> {
    use UnaryOp::*;
    let mut c = Case::new(seed);
    let ops = [Neg, Exp, Log, Sqrt, Recip, Relu, Sigmoid, Tanh, Abs];
    let ops: Vec<UnaryOp> = ops.into_iter().chain(TrigOp::ALL.map(Trig)).collect();
    let op = ops[c.rng.below(ops.len())];
    let rank = c.rng.below(4);
    let dims = c.dims(rank, false);
    let x = c.input(&dims, |rng| match op {
        Log | Sqrt => rng.uniform(0.2, 3.0),
        Recip => rng.signed(0.3, 3.0),
        Relu | Abs => rng.signed(0.1, 3.0),
        // Detach is not drawn: its gradient is zero by definition, not the
        // slope a difference sees (`grad_rules.rs` checks it).
        Neg | Exp | Sigmoid | Tanh | Detach => rng.uniform(-3.0, 3.0),
        Trig(TrigOp::Sin | TrigOp::Cos | TrigOp::Atan) => rng.uniform(-3.0, 3.0),
        Trig(TrigOp::Sinh | TrigOp::Cosh | TrigOp::Asinh) => rng.uniform(-3.0, 3.0),
        Trig(TrigOp::Tan) => rng.uniform(-1.2, 1.2),
        Trig(TrigOp::Asin | TrigOp::Acos | TrigOp::Atanh) => rng.uniform(-0.9, 0.9),
        Trig(TrigOp::Acosh) => rng.uniform(1.2, 3.0),
    });
    let mut y = c.push(Op::Unary(op), &[x]);
    if c.rng.below(2) == 0 {
        // A second reader of x: the two contributions add up.
        y = c.binary(BinaryOp::Mul, y, x);
    }
    c.check(y)
}

fn binary_case(seed: u64) -> Result<(), TestCaseError> {
    use BinaryOp::*;
    let mut c = Case::new(seed);
    let op = [Add, Sub, Mul, Div, Max, Min, Pow, Rem][c.rng.below(8)];
    let rank = c.rng.below(4);
    let dims = c.dims(rank, true);
    let (da, db) = (c.broadcast_from(&dims), c.broadcast_from(&dims));
    let a = c.input(&da, |rng| match op {
        Pow => rng.uniform(0.3, 2.5),
        // a / b within (2.1, 2.95) of either sign: away from the jumps at
        // whole quotients, where truncating and flooring differ.
        Rem => rng.signed(2.2, 2.8),
        Max | Min => grid(rng),
        Add | Sub | Mul | Div => rng.uniform(-3.0, 3.0),
        Lt | Le | Gt | Ge | Eq | Ne | Uniform => unreachable!("not drawn"),
    });
    let b = if c.rng.below(5) == 0 {
        // The same value on both sides: max(x, x) ties everywhere.
        a
    } else {
        c.input(&db, |rng| match op {
            Pow => rng.uniform(-2.0, 2.0),
            Rem => rng.signed(0.95, 1.05),
            Div => rng.signed(0.5, 2.0),
            Max | Min => grid(rng),
            Add | Sub | Mul => rng.uniform(-3.0, 3.0),
            Lt | Le | Gt | Ge | Eq | Ne | Uniform => unreachable!("not drawn"),
        })
    };
    let y = c.binary(op, a, b);
    c.check(y)
}

/// `where` on a comparison, and a round trip through i32: the condition,
/// the comparison's operands and the integer path carry no gradient.
fn select_case(seed: u64) -> Result<(), TestCaseError> {
    use BinaryOp::*;
    let mut c = Case::new(seed);
    let rank = c.rng.below(4);
    let dims = c.dims(rank, true);
    let shapes: Vec<Vec<usize>> = (0..4).map(|_| c.broadcast_from(&dims)).collect();
    let a = c.input(&shapes[0], grid);
    let b = c.input(&shapes[1], grid_between);
    let x = c.input(&shapes[2], |rng| rng.uniform(-2.0, 2.0));
    let z = c.input(&shapes[3], |rng| rng.uniform(-2.0, 2.0));
    let cmp = [Lt, Le, Gt, Ge, Eq, Ne][c.rng.below(6)];
    let cond = c.binary(cmp, a, b);
    let xa = c.binary(Mul, x, a);
    let to = c.g.node(cond).ty.shape.clone();
    let to = Shape::broadcast("where", &to, &c.g.node(xa).ty.shape).expect("broadcasts");
    let to = Shape::broadcast("where", &to, &c.g.node(z).ty.shape).expect("broadcasts");
    let (cond, xa, ze) = (c.expand(cond, &to), c.expand(xa, &to), c.expand(z, &to));
    let mut y = c.push(Op::Where, &[cond, xa, ze]);
    if c.rng.below(2) == 0 {
        let i = c.push(Op::Cast(DType::I32), &[a]);
        let back = c.push(Op::Cast(DType::F32), &[i]);
        let same = c.push(Op::Cast(DType::F32), &[back]);
        let scaled = c.binary(Mul, same, x);
        y = c.binary(Add, y, scaled);
    }
    c.check(y)
}

/// One random view of `x`, or `x` where the view does not fit.
fn random_view(c: &mut Case, x: NodeId) -> NodeId {
    let shape = c.g.node(x).ty.shape.clone();
    let dims = shape.dims().to_vec();
    let rank = dims.len();
    let op = match c.rng.below(5) {
        0 => {
            let mut perm: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                perm.swap(i, c.rng.below(i + 1));
            }
            Op::Permute(perm.into())
        }
        1 => {
            let to = match c.rng.below(3) {
                0 => vec![shape.numel()],
                1 if dims.last().is_some_and(|&d| d % 2 == 0 && d > 0) => {
                    let mut v = dims.clone();
                    let last = v.pop().unwrap_or(2);
                    v.extend([2, last / 2]);
                    v
                }
                _ => {
                    let mut v = dims.clone();
                    v.insert(c.rng.below(rank + 1), 1);
                    v
                }
            };
            Op::Reshape(Shape::new(&to))
        }
        2 => {
            let mut to: Vec<usize> = dims
                .iter()
                .map(|&d| if d == 1 { 1 + c.rng.below(3) } else { d })
                .collect();
            if c.rng.below(2) == 0 {
                to.insert(0, 2);
            }
            Op::Expand(Shape::new(&to))
        }
        3 => {
            let ranges: SmallVec<[SliceRange; 4]> = dims
                .iter()
                .map(|&d| {
                    let start = c.rng.below(d + 1).min(c.rng.below(d + 1));
                    let end = start + c.rng.below(d - start + 1).max(c.rng.below(d - start + 1));
                    SliceRange {
                        start,
                        end,
                        step: 1 + c.rng.below(3),
                    }
                })
                .collect();
            Op::Slice(ranges)
        }
        _ => {
            let pads = (0..rank)
                .map(|_| (c.rng.below(3), c.rng.below(3)))
                .collect();
            // Not -inf: a second reader multiplies it, and the gradient
            // of -inf * v is rightly inf - inf there.
            let value = Scalar::F32([0.0, 1.5, -0.5][c.rng.below(3)]);
            Op::Pad { pads, value }
        }
    };
    c.g.push(op, &[x]).unwrap_or(x)
}

fn view_case(seed: u64) -> Result<(), TestCaseError> {
    let mut c = Case::new(seed);
    let rank = 1 + c.rng.below(3);
    let dims = c.dims(rank, true);
    let x = c.input(&dims, |rng| rng.uniform(-2.0, 2.0));
    let mut y = x;
    for _ in 0..1 + c.rng.below(3) {
        y = random_view(&mut c, y);
    }
    if c.rng.below(3) == 0 {
        // Another reader of x, through another view.
        let other = random_view(&mut c, x);
        let axes = (0..c.g.node(other).ty.shape.rank()).collect();
        let scalar = c.push(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes,
            },
            &[other],
        );
        let flat = c.push(Op::Reshape(Shape::scalar()), &[scalar]);
        y = c.binary(BinaryOp::Mul, y, flat);
    }
    c.check(y)
}

/// Windows along one or two axes, overlapping (step below the size),
/// touching or apart, then a random view: every input element read by
/// zero, one or several windows.
fn unfold_case(seed: u64) -> Result<(), TestCaseError> {
    let mut c = Case::new(seed);
    let rank = 1 + c.rng.below(3);
    let dims: Vec<usize> = (0..rank).map(|_| 1 + c.rng.below(6)).collect();
    let x = c.input(&dims, |rng| rng.uniform(-2.0, 2.0));
    let mut y = x;
    for _ in 0..1 + c.rng.below(2) {
        let axis = c.rng.below(rank);
        let d = c.g.node(y).ty.shape.dims()[axis];
        let size = 1 + c.rng.below(d);
        let step = 1 + c.rng.below(3);
        y = c.push(Op::Unfold { axis, size, step }, &[y]);
    }
    if c.rng.below(2) == 0 {
        y = random_view(&mut c, y);
    }
    c.check(y)
}

fn reduce_case(seed: u64) -> Result<(), TestCaseError> {
    let mut c = Case::new(seed);
    let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Prod][c.rng.below(3)];
    let rank = 1 + c.rng.below(3);
    let dims = match op {
        ReduceOp::Sum | ReduceOp::Prod => c.dims(rank, true),
        ReduceOp::Max => (0..rank).map(|_| [1, 2, 3, 5][c.rng.below(4)]).collect(),
    };
    // Max sees distinct values 0.1 apart, more than a difference's step
    // (at most 0.07 for these at most 125 values).
    let n: usize = dims.iter().product();
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, c.rng.below(i + 1));
    }
    let mut next = order.into_iter();
    let x = c.input(&dims, |rng| match op {
        ReduceOp::Sum => rng.uniform(-2.0, 2.0),
        ReduceOp::Max => (next.next().unwrap_or(0) as f32 - n as f32 / 2.0) * 0.1,
        // Products of up to 343 factors near 1 stay normal f32 values. One
        // element in five is 0, so that rows hold no zero, one or several:
        // a product is linear in each element, so a central difference sees
        // the exact slope at a zero too.
        ReduceOp::Prod => match rng.below(5) {
            0 => 0.0,
            _ => rng.signed(0.8, 1.25),
        },
    });
    let axes: SmallVec<[usize; 4]> = (0..rank).filter(|_| c.rng.below(2) == 0).collect();
    let axes = if axes.is_empty() {
        SmallVec::from_elem(c.rng.below(rank), 1)
    } else {
        axes
    };
    let mut y = c.push(Op::Reduce { op, axes }, &[x]);
    if c.rng.below(2) == 0 {
        // The pattern of softmax's shift: x - reduce(x), x read twice.
        y = c.binary(BinaryOp::Sub, x, y);
    }
    c.check(y)
}

fn matmul_case(seed: u64) -> Result<(), TestCaseError> {
    let mut c = Case::new(seed);
    let batch_rank = c.rng.below(3);
    let batch = c.dims(batch_rank, false);
    let (m, n) = (1 + c.rng.below(5), 1 + c.rng.below(5));
    let k = [0, 1, 2, 3, 5, 7][c.rng.below(6)];
    let (ba, bb) = (c.broadcast_from(&batch), c.broadcast_from(&batch));
    let with = |b: &[usize], tail: [usize; 2]| -> Vec<usize> {
        let mut v = b.to_vec();
        v.extend(tail);
        v
    };
    let a = c.input(&with(&ba, [m, k]), |rng| rng.uniform(-2.0, 2.0));
    // The right operand stored transposed half the time, as a weight is.
    let b = if c.rng.below(2) == 0 {
        let bt = c.input(&with(&bb, [n, k]), |rng| rng.uniform(-2.0, 2.0));
        let r = bb.len() + 2;
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 1, r - 2);
        c.push(Op::Permute(perm.into()), &[bt])
    } else {
        c.input(&with(&bb, [k, n]), |rng| rng.uniform(-2.0, 2.0))
    };
    let full_batch =
        Shape::broadcast("matmul", &Shape::new(&ba), &Shape::new(&bb)).expect("batches broadcast");
    let a = c.expand(a, &Shape::new(&with(full_batch.dims(), [m, k])));
    let b = c.expand(b, &Shape::new(&with(full_batch.dims(), [k, n])));
    let y = c.push(Op::MatMul, &[a, b]);
    c.check(y)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn unary_rules_match_differences(seed in any::<u64>()) {
        unary_case(seed)?;
    }

    #[test]
    fn binary_rules_match_differences_broadcasting_both_sides(seed in any::<u64>()) {
        binary_case(seed)?;
    }

    #[test]
    fn where_comparisons_and_casts_match_differences(seed in any::<u64>()) {
        select_case(seed)?;
    }

    #[test]
    fn view_rules_match_differences(seed in any::<u64>()) {
        view_case(seed)?;
    }

    #[test]
    fn unfold_rule_matches_differences(seed in any::<u64>()) {
        unfold_case(seed)?;
    }

    #[test]
    fn reduction_rules_match_differences(seed in any::<u64>()) {
        reduce_case(seed)?;
    }

    #[test]
    fn matmul_rules_match_differences(seed in any::<u64>()) {
        matmul_case(seed)?;
    }
}

/// Products over rows that hold no zero, one, and two, by rows, by columns
/// (one zero each but the last) and over everything (three zeros); alone
/// or broadcast back against their operand (`x - prod(x)`).
#[test]
fn products_over_rows_with_no_one_and_two_zeros_match_differences() -> Result<(), TestCaseError> {
    let x = [
        1.2, -0.9, 1.1, 0.8, //
        1.3, 0.0, -1.1, 0.9, //
        0.0, 1.2, 0.0, -0.85,
    ];
    for axes in [&[1][..], &[0], &[0, 1]] {
        for back in [false, true] {
            let mut c = Case::new(axes.len() as u64);
            let id = c.input(&[3, 4], |_| 0.0);
            c.data[0] = x.to_vec();
            let op = Op::Reduce {
                op: ReduceOp::Prod,
                axes: SmallVec::from_slice(axes),
            };
            let mut y = c.push(op, &[id]);
            if back {
                y = c.binary(BinaryOp::Sub, id, y);
            }
            c.check(y)?;
        }
    }
    Ok(())
}
