//! Random graphs for property tests, shared by the optimizer's test
//! (`ir/tests/optimize_prop.rs`), the CPU backend's (`tests/cpu_prop.rs`) and
//! the CUDA code generator's (`tests/cuda_codegen.rs`): elementwise ops,
//! broadcasts, identities, constants, comparisons, casts, reductions (sum,
//! max, and products of factors kept near 1) and the sum+broadcast pattern,
//! every view (sliding windows too), gathers at positions computed from the
//! data (out of range too), matmul, and detours through i64 and
//! f64 values (cast in, arithmetic with a 64-bit constant, maybe a
//! reduction, cast out); shapes full of 1s and some 0s; inputs with NaN,
//! infinities (but in `Mode::Continuous`, whose inputs, constants and pad
//! fills are finite) and -0. The graph's first output is f32. The same
//! seed gives the same graph.

use kiln_ir::{
    BinaryOp, DType, Data, Graph, NodeId, Op, ReduceOp, Scalar, Shape, SliceRange, TensorType,
    TrigOp, UnaryOp,
};
use smallvec::SmallVec;

use crate::gradcheck::Rng;

/// A deterministic stream of choices from one seed; its values (inputs,
/// constants, pad fills) finite (or NaN) where `finite`.
struct Choices {
    rng: Rng,
    finite: bool,
}

impl Choices {
    /// `Mode::Continuous` chooses no infinite value: an infinity times a
    /// difference that cancels to 0 in one order of a sum and to a residue
    /// in another is NaN on one side and infinite on the other (a sum of 4
    /// elements less another, by a matmul with an infinite input: the
    /// interpreter's NaN against the CPU's -inf), which no tolerance
    /// covers; its ops are continuous only in finite values.
    fn new(seed: u64, mode: Mode) -> Choices {
        Choices {
            rng: Rng(seed),
            finite: mode == Mode::Continuous,
        }
    }

    fn below(&mut self, n: usize) -> usize {
        self.rng.below(n)
    }

    fn dim(&mut self) -> usize {
        // Mostly small, often 1 (broadcast), sometimes 0 (empty).
        [1, 1, 2, 3, 4, 5, 7, 0][self.below(8)]
    }

    fn shape(&mut self) -> Vec<usize> {
        let rank = 1 + self.below(3);
        (0..rank).map(|_| self.dim()).collect()
    }

    fn value(&mut self) -> f32 {
        match self.below(40) {
            0 => f32::NAN,
            // The same draws either way: a seed gives the same graph, an
            // infinity replaced by the largest ordinary value.
            1 if self.finite => 4.0,
            1 => f32::INFINITY,
            2 => -0.0,
            _ => (self.below(2001) as f32 - 1000.0) / 250.0,
        }
    }
}

/// The unary ops a random graph of `mode` may use.
fn unary_ops(mode: Mode) -> &'static [UnaryOp] {
    use UnaryOp::*;
    match mode {
        Mode::All => &[
            Neg,
            Exp,
            Log,
            Sqrt,
            Recip,
            Relu,
            Sigmoid,
            Tanh,
            Abs,
            Trig(TrigOp::Sin),
            Trig(TrigOp::Atan),
        ],
        Mode::Exact => &[Neg, Sqrt, Recip, Relu, Abs],
        Mode::Continuous => &[
            Neg,
            Exp,
            Sqrt,
            Relu,
            Sigmoid,
            Tanh,
            Abs,
            Trig(TrigOp::Sin),
            Trig(TrigOp::Atan),
        ],
    }
}

/// Which ops a random graph may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every op the generator knows.
    All,
    /// Only ops a backend computes exactly as the interpreter: no
    /// transcendental function, no float sum or product (an i64 product
    /// wraps, exactly), no matmul.
    Exact,
    /// Only ops continuous in their inputs, so that small rounding
    /// differences stay small: no comparison, cast, division or log.
    Continuous,
}

/// A matmul weight as it is, or negated: elementwise work on an input that
/// the matmul computes as its operand's prologue.
fn weight_prologue(c: &mut Choices, g: &mut Graph, w: NodeId) -> NodeId {
    match c.below(3) {
        0 => g.push(Op::Unary(UnaryOp::Neg), &[w]).unwrap_or(w),
        _ => w,
    }
}

/// Builds a random graph; ops that do not type-check are skipped, so every
/// choice sequence yields a valid graph.
pub fn random_graph(seed: u64, steps: usize, mode: Mode) -> Graph {
    let mut c = Choices::new(seed, mode);
    let mut g = Graph::new("random");
    let mut nodes: Vec<NodeId> = Vec::new();
    for _ in 0..1 + c.below(3) {
        let shape = c.shape();
        nodes.push(g.input(TensorType::new(DType::F32, shape)));
    }
    for _ in 0..steps {
        let pick = |c: &mut Choices, nodes: &[NodeId]| {
            nodes[nodes.len() - 1 - c.below(nodes.len().min(4))]
        };
        let x = pick(&mut c, &nodes);
        let shape = g.node(x).ty.shape.clone();
        let rank = shape.rank();
        // Exact mode stops before the matmuls (14 and 15), Continuous
        // mode's gather is a matmul instead.
        let kinds = if mode == Mode::Exact { 14 } else { 16 };
        let built = match c.below(kinds) {
            // A detour through bf16 or f16 at times.
            0 if c.below(4) == 0 => {
                let half = [DType::BF16, DType::F16][c.below(2)];
                narrow(&mut c, &mut g, &mut nodes, x, half, mode)
            }
            0 => {
                let ops = unary_ops(mode);
                let op = ops[c.below(ops.len())];
                // Where results must agree closely, sin takes a bounded
                // argument: of a value grown through exp, its argument's
                // last bits move it anywhere in [-1, 1] (the case kept in
                // tests/cpu_prop.proptest-regressions).
                match (mode, op) {
                    (Mode::Continuous, UnaryOp::Trig(TrigOp::Sin)) => g
                        .push(Op::Unary(UnaryOp::Tanh), &[x])
                        .and_then(|t| g.push(Op::Unary(op), &[t])),
                    _ => g.push(Op::Unary(op), &[x]),
                }
            }
            1 | 2 => {
                let y = pick(&mut c, &nodes);
                use BinaryOp::*;
                let ops: &[BinaryOp] = match mode {
                    Mode::All | Mode::Exact => &[Add, Sub, Mul, Div, Max, Min, Rem],
                    Mode::Continuous => &[Add, Sub, Mul, Max, Min],
                };
                binary(&mut g, ops[c.below(ops.len())], x, y)
            }
            3 => {
                // Identities simplify removes: x*1, x+(-0), -(-x), relu(relu(x)).
                match c.below(4) {
                    0 => {
                        let one = constant(&mut g, 1.0);
                        binary(&mut g, BinaryOp::Mul, x, one)
                    }
                    1 => {
                        let zero = constant(&mut g, -0.0);
                        binary(&mut g, BinaryOp::Add, zero, x)
                    }
                    2 => g
                        .push(Op::Unary(UnaryOp::Neg), &[x])
                        .and_then(|n| g.push(Op::Unary(UnaryOp::Neg), &[n])),
                    _ => g
                        .push(Op::Unary(UnaryOp::Relu), &[x])
                        .and_then(|n| g.push(Op::Unary(UnaryOp::Relu), &[n])),
                }
            }
            4 => {
                let v = c.value();
                let k = constant(&mut g, v);
                match if mode == Mode::Continuous {
                    [0, 3][c.below(2)]
                } else {
                    c.below(5)
                } {
                    0 => binary(&mut g, BinaryOp::Mul, x, k),
                    // Through f64 (every mode) or i64 (not continuous).
                    3 => wide(&mut c, &mut g, &mut nodes, x, DType::F64, mode),
                    4 => wide(&mut c, &mut g, &mut nodes, x, DType::I64, mode),
                    // where(x > k, x, k): comparisons, bool values and select.
                    1 => binary(&mut g, BinaryOp::Gt, x, k).and_then(|m| {
                        let k = g.push(Op::Expand(shape.clone()), &[k])?;
                        g.push(Op::Where, &[m, x, k])
                    }),
                    // A round trip through i32 truncates and saturates; or
                    // Threefry of those i32s, the same draws on every path.
                    _ => g
                        .push(Op::Cast(DType::I32), &[x])
                        .and_then(|i| match c.below(2) {
                            0 => g.push(Op::Cast(DType::F32), &[i]),
                            _ => g.push(Op::Binary(BinaryOp::Uniform), &[i, i]),
                        }),
                }
            }
            5 | 6 => {
                use ReduceOp::{Max, Prod, Sum};
                let op = match mode {
                    Mode::Exact => Max,
                    Mode::All | Mode::Continuous => [Sum, Max, Prod][c.below(3)],
                };
                let axes = random_axes(&mut c, rank);
                let operand = match op {
                    Prod => factors(&mut g, x, &axes),
                    Sum | Max => Ok(x),
                };
                let r = operand.and_then(|f| g.push(Op::Reduce { op, axes }, &[f]));
                if c.below(2) == 0 {
                    // The sum+broadcast pattern: x - reduce(x), or x / reduce(x).
                    let op = match mode {
                        Mode::Continuous => BinaryOp::Sub,
                        Mode::All | Mode::Exact => [BinaryOp::Sub, BinaryOp::Div][c.below(2)],
                    };
                    r.and_then(|r| binary(&mut g, op, x, r))
                } else {
                    r
                }
            }
            7 => {
                let mut perm: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    perm.swap(i, c.below(i + 1));
                }
                g.push(Op::Permute(perm.into()), &[x])
            }
            8 => {
                let ranges: SmallVec<[SliceRange; 4]> = shape
                    .dims()
                    .iter()
                    .map(|&d| {
                        let start = c.below(d + 1);
                        let end = start + c.below(d - start + 1);
                        SliceRange {
                            start,
                            end,
                            step: 1 + c.below(3),
                        }
                    })
                    .collect();
                g.push(Op::Slice(ranges), &[x])
            }
            9 => {
                let pads = (0..rank).map(|_| (c.below(3), c.below(3))).collect();
                let fills = if c.finite { 2 } else { 3 };
                let value = Scalar::F32([0.0, -1.5, f32::NEG_INFINITY][c.below(fills)]);
                g.push(Op::Pad { pads, value }, &[x])
            }
            10 => {
                // Reshape: flatten, split the last axis, or add a size-1 axis.
                let dims = shape.dims();
                let to: Vec<usize> = match c.below(3) {
                    0 => vec![shape.numel()],
                    1 if dims.last().is_some_and(|&d| d % 2 == 0 && d > 0) => {
                        let mut v = dims.to_vec();
                        let last = v.pop().unwrap_or(2);
                        v.extend([2, last / 2]);
                        v
                    }
                    _ => {
                        let mut v = dims.to_vec();
                        v.insert(c.below(rank + 1), 1);
                        v
                    }
                };
                g.push(Op::Reshape(Shape::new(&to)), &[x])
            }
            11 => {
                let mut to = shape.dims().to_vec();
                for d in to.iter_mut() {
                    if *d == 1 {
                        *d = 1 + c.below(3);
                    }
                }
                if c.below(2) == 0 {
                    to.insert(0, 2);
                }
                g.push(Op::Expand(Shape::new(&to)), &[x])
            }
            12 => {
                // Sliding windows along a random axis: a window that fits
                // (of 1 at times), a step up to two past it (windows apart).
                let axis = c.below(rank);
                let size = 1 + c.below(shape.dims().get(axis).copied().unwrap_or(1));
                let step = 1 + c.below(size + 2);
                g.push(Op::Unfold { axis, size, step }, &[x])
            }
            13 if mode != Mode::Continuous => gathered(&mut c, &mut g, x),
            13..=15 => {
                // x @ w with a fresh weight, read transposed half the time.
                let dims = shape.dims();
                let k = dims.last().copied().unwrap_or(1);
                let n = 1 + c.below(4);
                let mut w_dims = dims.to_vec();
                let len = w_dims.len();
                if c.below(2) == 0 {
                    w_dims[len - 1] = k;
                    if len >= 2 {
                        w_dims[len - 2] = n;
                    }
                    let w = g.input(TensorType::new(DType::F32, w_dims.clone()));
                    let w = weight_prologue(&mut c, &mut g, w);
                    let mut perm: Vec<usize> = (0..len).collect();
                    if len >= 2 {
                        perm.swap(len - 1, len - 2);
                    }
                    g.push(Op::Permute(perm.into()), &[w])
                        .and_then(|wt| g.push(Op::MatMul, &[x, wt]))
                } else {
                    if len >= 2 {
                        w_dims[len - 2] = k;
                    }
                    w_dims[len - 1] = n;
                    let w = g.input(TensorType::new(DType::F32, w_dims));
                    let w = weight_prologue(&mut c, &mut g, w);
                    g.push(Op::MatMul, &[x, w])
                }
            }
            _ => unreachable!("below(16)"),
        };
        if let Ok(id) = built {
            nodes.push(id);
        }
    }
    // The first output is f32: a loss can be built on it (`grad_prop`).
    let mut last = *nodes.last().unwrap_or(&NodeId(0));
    if g.node(last).ty.dtype != DType::F32 {
        last = g.push(Op::Cast(DType::F32), &[last]).unwrap_or(last);
    }
    g.outputs.push(last);
    if nodes.len() > 2 && c.below(2) == 0 {
        g.outputs.push(nodes[c.below(nodes.len())]);
    }
    g
}

/// `x` gathered along a random axis at positions cast from `x` itself,
/// maybe doubled, as i32 or i64 (negative ones, ones past the end, NaN read
/// as 0, infinities saturated), over all of that axis or all but its last
/// element.
fn gathered(c: &mut Choices, g: &mut Graph, x: NodeId) -> Result<NodeId, kiln_ir::Error> {
    let dims = g.node(x).ty.shape.dims().to_vec();
    let axis = c.below(dims.len());
    let scale = constant(g, [1.0, 2.0][c.below(2)]);
    let scaled = binary(g, BinaryOp::Mul, x, scale)?;
    let mut indices = g.push(Op::Cast([DType::I32, DType::I64][c.below(2)]), &[scaled])?;
    if dims[axis] > 1 && c.below(2) == 0 {
        let ranges = (0..dims.len())
            .map(|a| SliceRange {
                start: 0,
                end: dims[a] - usize::from(a == axis),
                step: 1,
            })
            .collect();
        indices = g.push(Op::Slice(ranges), &[indices])?;
    }
    g.push(Op::Gather { axis }, &[x, indices])
}

/// `x` (f32) cast to `wide` (i64 or f64), combined with a constant of that
/// type (beyond i32's range for i64) by an op `mode` allows, maybe reduced
/// over random axes (by max, or for i64 by a wrapping product), and cast
/// back to f32. The 64-bit value is kept in `nodes`, so that later steps
/// may read, view, reduce or output it. Every op is exact on both sides
/// (f64 arithmetic is IEEE's, i64's wraps), so `Mode::Exact` stays bit for
/// bit.
fn wide(
    c: &mut Choices,
    g: &mut Graph,
    nodes: &mut Vec<NodeId>,
    x: NodeId,
    wide: DType,
    mode: Mode,
) -> Result<NodeId, kiln_ir::Error> {
    let x = g.push(Op::Cast(wide), &[x])?;
    let k = match wide {
        DType::I64 => {
            let v = [3_000_000_000, -(1 << 40) + 7, 5, -2][c.below(4)];
            Scalar::I64(v)
        }
        _ => Scalar::F64(f64::from(c.value()) * 1.000_000_000_1),
    };
    let k = g.push_typed(
        Op::Const(k),
        SmallVec::new(),
        TensorType::new(wide, Shape::scalar()),
    );
    use BinaryOp::*;
    let ops: &[BinaryOp] = match (mode, wide) {
        (_, DType::I64) => &[Add, Sub, Mul, Max, Min, Rem],
        (Mode::Continuous, _) => &[Add, Sub, Mul, Max, Min],
        (Mode::All | Mode::Exact, _) => &[Add, Sub, Mul, Div, Max, Min, Rem],
    };
    let mut y = binary(g, ops[c.below(ops.len())], x, k)?;
    if wide == DType::F64 && c.below(2) == 0 {
        let ops = unary_ops(mode);
        y = g.push(Op::Unary(ops[c.below(ops.len())]), &[y])?;
    }
    if c.below(3) == 0 {
        let rank = g.node(y).ty.shape.rank();
        let axes = random_axes(c, rank);
        let op = match wide {
            DType::I64 => [ReduceOp::Max, ReduceOp::Prod][c.below(2)],
            _ => ReduceOp::Max,
        };
        // An empty axis has no max: then the detour goes on unreduced.
        if let Ok(r) = g.push(Op::Reduce { op, axes }, &[y]) {
            y = r;
        }
    }
    nodes.push(y);
    g.push(Op::Cast(DType::F32), &[y])
}

/// `x` (f32) rounded to `half` (bf16 or f16), combined with a constant of
/// that type, maybe through a unary op and a max over random axes, and
/// widened back to f32. Every op on the 16-bit values is one that rounds
/// correctly: the backends compute in f32 and round to 16 bits, which for
/// these gives what the interpreter's f64 rounded to 16 bits gives, so
/// `Mode::Exact` stays bit for bit. Only there is the 16-bit value kept in
/// `nodes` for later steps, whose other modes' ops (exp, sums) would round
/// in f32 and then to 16 bits where the interpreter rounds once, a unit of
/// the 16-bit type apart, past those modes' f32 tolerances.
fn narrow(
    c: &mut Choices,
    g: &mut Graph,
    nodes: &mut Vec<NodeId>,
    x: NodeId,
    half: DType,
    mode: Mode,
) -> Result<NodeId, kiln_ir::Error> {
    let x = g.push(Op::Cast(half), &[x])?;
    let k = g.push_typed(
        Op::Const(Scalar::F64(f64::from(c.value())).cast(half)),
        SmallVec::new(),
        TensorType::new(half, Shape::scalar()),
    );
    use BinaryOp::*;
    let ops: &[BinaryOp] = match mode {
        Mode::Continuous => &[Add, Sub, Mul, Max, Min],
        Mode::All | Mode::Exact => &[Add, Sub, Mul, Div, Max, Min, Rem],
    };
    let mut y = binary(g, ops[c.below(ops.len())], x, k)?;
    if c.below(2) == 0 {
        use UnaryOp::*;
        let ops = [Neg, Sqrt, Relu, Abs];
        y = g.push(Op::Unary(ops[c.below(ops.len())]), &[y])?;
    }
    if c.below(3) == 0 {
        let rank = g.node(y).ty.shape.rank();
        let axes = random_axes(c, rank);
        if let Ok(r) = g.push(
            Op::Reduce {
                op: ReduceOp::Max,
                axes,
            },
            &[y],
        ) {
            y = r;
        }
    }
    if mode == Mode::Exact {
        nodes.push(y);
    }
    g.push(Op::Cast(DType::F32), &[y])
}

/// The factors a product over `axes` of `x` reads: `x` clamped to [-2, 2]
/// where the axes hold at most 8 elements (zeros, -0 and NaN stay), else
/// `1 + clamp(x, -1, 1) / 128`, so that a product of thousands stays
/// finite and f32's rounding at each step stays within the tolerance.
/// Clamping by max and min is exact on every backend.
fn factors(g: &mut Graph, x: NodeId, axes: &[usize]) -> Result<NodeId, kiln_ir::Error> {
    let dims = g.node(x).ty.shape.dims().to_vec();
    let count: usize = axes.iter().map(|&a| dims[a]).product();
    let bound = if count <= 8 { 2.0 } else { 1.0 };
    let (hi, lo) = (constant(g, bound), constant(g, -bound));
    let clamped = binary(g, BinaryOp::Max, x, lo)?;
    let clamped = binary(g, BinaryOp::Min, clamped, hi)?;
    if count <= 8 {
        return Ok(clamped);
    }
    let (scale, one) = (constant(g, 1.0 / 128.0), constant(g, 1.0));
    let small = binary(g, BinaryOp::Mul, clamped, scale)?;
    binary(g, BinaryOp::Add, small, one)
}

fn constant(g: &mut Graph, v: f32) -> NodeId {
    g.push_typed(
        Op::Const(Scalar::F32(v)),
        SmallVec::new(),
        TensorType::new(DType::F32, Shape::scalar()),
    )
}

/// `a op b` with NumPy broadcasting, as the Tensor API records it.
fn binary(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, kiln_ir::Error> {
    let to = Shape::broadcast(op.name(), &g.node(a).ty.shape, &g.node(b).ty.shape)?;
    let expand = |g: &mut Graph, x: NodeId| {
        if g.node(x).ty.shape == to {
            Ok(x)
        } else {
            g.push(Op::Expand(to.clone()), &[x])
        }
    };
    let (a, b) = (expand(g, a)?, expand(g, b)?);
    g.push(Op::Binary(op), &[a, b])
}

fn random_axes(c: &mut Choices, rank: usize) -> SmallVec<[usize; 4]> {
    let axes: SmallVec<[usize; 4]> = (0..rank).filter(|_| c.below(2) == 0).collect();
    if axes.is_empty() {
        SmallVec::from_elem(c.below(rank), 1)
    } else {
        axes
    }
}

/// Seeded inputs for `graph`, a graph of `mode`, one per graph input, with
/// NaN, infinities (but in `Mode::Continuous`) and -0 among ordinary values.
pub fn inputs(graph: &Graph, seed: u64, mode: Mode) -> Vec<Data> {
    let mut c = Choices::new(seed ^ 0xDA7A, mode);
    graph
        .inputs
        .iter()
        .map(|ty| Data::F32((0..ty.shape.numel()).map(|_| c.value()).collect()))
        .collect()
}

/// Whether two results are equal bit for bit, all NaNs counted equal (their
/// payloads are not part of the semantics).
pub fn same(a: &Data, b: &Data) -> bool {
    a.len() == b.len()
        && (0..a.len()).all(|i| match (a.get(i), b.get(i)) {
            (Scalar::F32(x), Scalar::F32(y)) => {
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
            }
            (Scalar::F64(x), Scalar::F64(y)) => {
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
            }
            (Scalar::BF16(x), Scalar::BF16(y)) => {
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
            }
            (Scalar::F16(x), Scalar::F16(y)) => {
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
            }
            (x, y) => x == y,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of 300 graphs of `mode` hold a value of `dtype`.
    fn holding(mode: Mode, dtype: DType) -> usize {
        (0..300)
            .filter(|&seed| {
                let g = random_graph(seed, 8, mode);
                g.nodes.iter().any(|n| n.ty.dtype == dtype)
            })
            .count()
    }

    #[test]
    fn graphs_pass_through_64_and_16_bit_values() {
        for mode in [Mode::All, Mode::Exact, Mode::Continuous] {
            assert!(holding(mode, DType::F64) >= 20, "{mode:?}: f64");
        }
        for mode in [Mode::All, Mode::Exact] {
            assert!(holding(mode, DType::I64) >= 20, "{mode:?}: i64");
        }
        for mode in [Mode::All, Mode::Exact, Mode::Continuous] {
            for half in [DType::BF16, DType::F16] {
                assert!(holding(mode, half) >= 10, "{mode:?}: {half}");
            }
        }
        assert_eq!(holding(Mode::Continuous, DType::I64), 0);
    }

    /// How many of 300 graphs of `mode` hold a node that `is`.
    fn with(mode: Mode, is: impl Fn(&kiln_ir::Node) -> bool) -> usize {
        (0..300)
            .filter(|&seed| random_graph(seed, 8, mode).nodes.iter().any(&is))
            .count()
    }

    #[test]
    fn graphs_hold_windows_products_and_draws() {
        let prod = |dtype: DType| {
            move |n: &kiln_ir::Node| {
                matches!(
                    n.op,
                    Op::Reduce {
                        op: ReduceOp::Prod,
                        ..
                    }
                ) && n.ty.dtype == dtype
            }
        };
        let unfold = |n: &kiln_ir::Node| matches!(n.op, Op::Unfold { .. });
        for mode in [Mode::All, Mode::Exact, Mode::Continuous] {
            assert!(with(mode, unfold) >= 20, "{mode:?}: unfold");
        }
        let gather = |n: &kiln_ir::Node| matches!(n.op, Op::Gather { .. });
        for mode in [Mode::All, Mode::Exact] {
            assert!(with(mode, gather) >= 20, "{mode:?}: gather");
        }
        for mode in [Mode::All, Mode::Continuous] {
            assert!(with(mode, prod(DType::F32)) >= 20, "{mode:?}: f32 prod");
        }
        // Float products round in the backend's order: never in Exact.
        assert_eq!(with(Mode::Exact, prod(DType::F32)), 0);
        assert!(with(Mode::Exact, prod(DType::I64)) >= 5, "Exact: i64 prod");
        let uniform = |n: &kiln_ir::Node| matches!(n.op, Op::Binary(BinaryOp::Uniform));
        for mode in [Mode::All, Mode::Exact] {
            assert!(with(mode, uniform) >= 10, "{mode:?}: uniform");
        }
        assert_eq!(with(Mode::Continuous, uniform), 0);
    }

    #[test]
    fn the_first_output_is_f32() {
        for seed in 0..300 {
            let g = random_graph(seed, 8, Mode::All);
            assert_eq!(g.node(g.outputs[0]).ty.dtype, DType::F32, "seed {seed}");
        }
    }
}
