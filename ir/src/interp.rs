//! The reference interpreter: evaluates any graph naively, one element at a
//! time, exactly as the op definitions in `op.rs` say.
//!
//! It is the oracle of every numeric test in kiln, so it favours being
//! obviously right over being fast: every value is materialized densely, every
//! f32 operation is computed in f64 and rounded once (which for `+ - * / sqrt`
//! is exactly IEEE f32 arithmetic), f64 operations are f64's own, integers
//! are computed exactly in i64 (wrapping, as i64 arithmetic itself does), and
//! sums and matrix products accumulate in f64 or i64 before one final rounding
//! or wrap.

use smallvec::SmallVec;

use crate::Error;
use crate::elementwise::{BinaryOp, ReduceOp, UnaryOp};
use crate::graph::Graph;
use crate::kernel::{Block, Expr, Kernel, KernelKind, Operand, gather_fill, gather_position};
use crate::op::Op;
use crate::types::{DType, Data, OutOfMemory, Scalar, Shape, cast_f64, cast_int, try_vec};
use crate::verify::verify;
use crate::view::View;

/// Evaluates `graph` on `inputs`, one per declared graph input, and returns its
/// outputs in order. The graph is verified first; inputs whose dtype or length
/// does not match the declaration are an `Err`.
pub fn eval(graph: &Graph, inputs: &[&Data]) -> Result<Vec<Data>, Error> {
    verify(graph)?;
    if inputs.len() != graph.inputs.len() {
        return Err(Error::InputCount {
            graph: graph.name.clone(),
            expected: graph.inputs.len(),
            got: inputs.len(),
        });
    }
    for (index, (data, ty)) in inputs.iter().zip(&graph.inputs).enumerate() {
        if data.dtype() != ty.dtype || data.len() != ty.shape.numel() {
            return Err(Error::InputData {
                index,
                expected: ty.to_string(),
                got: format!("{} values of {}", data.len(), data.dtype()),
            });
        }
    }
    let mut values: Vec<Data> = Vec::with_capacity(graph.nodes.len());
    // The side outputs of each kernel node, by node.
    let mut sides: Vec<Vec<Data>> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let mut side = Vec::new();
        let arg = |k: usize| &values[node.inputs[k].index()];
        let arg_shape = |k: usize| &graph.node(node.inputs[k]).ty.shape;
        let out = &node.ty;
        let n = out.shape.numel();
        let value = match &node.op {
            Op::Input { index } => Ok(inputs[*index as usize].clone()),
            Op::Const(v) => Data::from_fn(v.dtype(), 1, |_| *v),
            Op::Unary(op) => {
                let x = arg(0);
                Data::from_fn(out.dtype, n, |i| unary(*op, x.get(i)))
            }
            Op::Binary(op) => {
                let (a, b) = (arg(0), arg(1));
                Data::from_fn(out.dtype, n, |i| binary(*op, a.get(i), b.get(i)))
            }
            Op::Where => {
                let (c, a, b) = (arg(0), arg(1), arg(2));
                Data::from_fn(out.dtype, n, |i| {
                    if c.get(i) == Scalar::Bool(true) {
                        a.get(i)
                    } else {
                        b.get(i)
                    }
                })
            }
            Op::Cast(to) => {
                let x = arg(0);
                Data::from_fn(*to, n, |i| x.get(i).cast(*to))
            }
            Op::Reshape(_) => Ok(arg(0).clone()),
            Op::Permute(perm) => {
                let in_strides = arg_shape(0).strides();
                let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
                gather(arg(0), &out.shape, |coords| dot(coords, &strides))
            }
            Op::Expand(_) => {
                let from = arg_shape(0);
                let lead = out.shape.rank() - from.rank();
                // A size-1 axis is read at index 0 whatever the output index: stride 0.
                let strides: Vec<usize> = (0..out.shape.rank())
                    .map(|a| match a.checked_sub(lead) {
                        Some(a) if from.dims()[a] != 1 => from.strides()[a],
                        _ => 0,
                    })
                    .collect();
                gather(arg(0), &out.shape, |coords| dot(coords, &strides))
            }
            Op::Slice(ranges) => {
                let strides = arg_shape(0).strides();
                gather(arg(0), &out.shape, |coords| {
                    let starts = coords
                        .iter()
                        .zip(ranges)
                        .map(|(&c, r)| r.start + c * r.step);
                    starts.zip(&strides).map(|(c, &s)| c * s).sum()
                })
            }
            Op::Unfold { axis, step, .. } => {
                let strides = arg_shape(0).strides();
                let (axis, step) = (*axis, *step);
                gather(arg(0), &out.shape, |coords| {
                    // The last coordinate walks the window along `axis`.
                    let (within, rest) = coords.split_last().unwrap_or((&0, coords));
                    let mut flat = dot(rest, &strides);
                    flat += (rest[axis] * (step - 1) + within) * strides[axis];
                    flat
                })
            }
            Op::Pad { pads, value } => {
                let from = arg_shape(0);
                let strides = from.strides();
                let x = arg(0);
                let out_shape = &out.shape;
                Data::from_fn(out.dtype, n, |i| {
                    let coords = unravel(i, out_shape);
                    let mut flat = 0;
                    for (a, &c) in coords.iter().enumerate() {
                        let (before, dim) = (pads[a].0, from.dims()[a]);
                        if c < before || c >= before + dim {
                            return *value;
                        }
                        flat += (c - before) * strides[a];
                    }
                    x.get(flat)
                })
            }
            Op::Reduce { op, axes } => reduce(*op, axes, arg(0), arg_shape(0), &out.shape),
            Op::MatMul => matmul(arg(0), arg(1), arg_shape(0), arg_shape(1), &out.shape),
            Op::Gather { axis } => {
                let (x, indices) = (arg(0), arg(1));
                let strides = arg_shape(0).strides();
                let len = arg_shape(0).dims()[*axis];
                let out_shape = &out.shape;
                Data::from_fn(out.dtype, n, |i| {
                    let mut coords = unravel(i, out_shape);
                    match gather_position(index_value(indices.get(i)), len) {
                        Some(at) => {
                            coords[*axis] = at;
                            x.get(dot(&coords, &strides))
                        }
                        None => gather_fill(out.dtype),
                    }
                })
            }
            Op::ScatterAdd { axis, len } => scatter_add(arg(0), arg(1), arg_shape(0), *axis, *len),
            Op::Attention(a) => {
                let args: SmallVec<[&Data; 4]> = (0..node.inputs.len()).map(arg).collect();
                let shapes: SmallVec<[&Shape; 4]> = (0..node.inputs.len()).map(arg_shape).collect();
                a.evaluate(&args, &shapes)
            }
            Op::View(view) => materialize(arg(0), view),
            Op::Kernel(k) => {
                let args: Vec<&Data> = node.inputs.iter().map(|id| &values[id.index()]).collect();
                kernel(k, &args).map(|mut all| {
                    side = all.split_off(1);
                    all.swap_remove(0)
                })
            }
            // `verify` checked that the operand is a kernel with this side output.
            Op::SideOutput(k) => sides[node.inputs[0].index()][*k as usize].try_clone(),
        }
        // A kernel allocates working values of other types on the way.
        .map_err(|e| e.in_op(node.op.name(), format_args!("evaluating {out}")))?;
        values.push(value);
        sides.push(side);
    }
    Ok(graph
        .outputs
        .iter()
        .map(|id| values[id.index()].clone())
        .collect())
}

/// Element `i` of a row-major array of `shape`, as coordinates.
fn unravel(mut i: usize, shape: &Shape) -> SmallVec<[usize; 6]> {
    let mut coords = SmallVec::from_elem(0, shape.rank());
    for (c, &d) in coords.iter_mut().zip(shape.dims()).rev() {
        *c = i % d;
        i /= d;
    }
    coords
}

fn dot(coords: &[usize], strides: &[usize]) -> usize {
    coords.iter().zip(strides).map(|(c, s)| c * s).sum()
}

/// A view: output element at `coords` is input element `index(coords)`.
fn gather(x: &Data, out: &Shape, index: impl Fn(&[usize]) -> usize) -> Result<Data, OutOfMemory> {
    Data::from_fn(x.dtype(), out.numel(), |i| x.get(index(&unravel(i, out))))
}

/// The number a scalar holds, exactly: integers and bools as i64, floats as f64.
enum Num {
    Int(i64),
    Float(f64),
}

fn num(x: Scalar) -> Num {
    match x {
        Scalar::F32(v) => Num::Float(v as f64),
        Scalar::I32(v) => Num::Int(v as i64),
        Scalar::I64(v) => Num::Int(v),
        Scalar::F64(v) => Num::Float(v),
        Scalar::U8(v) => Num::Int(v as i64),
        Scalar::Bool(v) => Num::Int(v as i64),
        Scalar::BF16(v) => Num::Float(v.to_f64()),
        Scalar::F16(v) => Num::Float(v.to_f64()),
    }
}

pub(crate) fn unary(op: UnaryOp, x: Scalar) -> Scalar {
    if op == UnaryOp::Detach {
        return x;
    }
    let dtype = x.dtype();
    let v = match num(x) {
        Num::Float(v) => v,
        // Integers wrap in i64 and wrap back; typing admits only these three.
        Num::Int(v) => match op {
            UnaryOp::Neg => return cast_int(v.wrapping_neg(), dtype),
            UnaryOp::Abs => return cast_int(v.wrapping_abs(), dtype),
            UnaryOp::Relu => return cast_int(v.max(0), dtype),
            UnaryOp::Detach
            | UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sqrt
            | UnaryOp::Recip
            | UnaryOp::Sigmoid
            | UnaryOp::Tanh
            | UnaryOp::Trig(_) => v as f64,
        },
    };
    let r = match op {
        UnaryOp::Neg => -v,
        UnaryOp::Exp => v.exp(),
        UnaryOp::Log => v.ln(),
        UnaryOp::Sqrt => v.sqrt(),
        UnaryOp::Recip => 1.0 / v,
        UnaryOp::Relu => {
            if v > 0.0 || v.is_nan() {
                v
            } else {
                0.0
            }
        }
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-v).exp()),
        UnaryOp::Tanh => v.tanh(),
        UnaryOp::Trig(t) => t.eval(v),
        UnaryOp::Abs => v.abs(),
        UnaryOp::Detach => v,
    };
    cast_f64(r, dtype)
}

pub(crate) fn binary(op: BinaryOp, a: Scalar, b: Scalar) -> Scalar {
    let dtype = a.dtype();
    match (num(a), num(b)) {
        // Typing admits i32 operands only.
        (Num::Int(x), Num::Int(y)) if op == BinaryOp::Uniform => {
            Scalar::F32(crate::random::uniform(x as i32, y as i32))
        }
        // Operands have one dtype: integers compare exactly in i64, floats in
        // f64, which holds f32 exactly.
        (Num::Int(x), Num::Int(y)) if op.is_comparison() => Scalar::Bool(compare(op, x, y)),
        (x, y) if op.is_comparison() => Scalar::Bool(compare(op, as_f64(x), as_f64(y))),
        (Num::Int(x), Num::Int(y)) => cast_int(int_binary(op, x, y), dtype),
        (x, y) => cast_f64(float_binary(op, as_f64(x), as_f64(y)), dtype),
    }
}

fn as_f64(x: Num) -> f64 {
    match x {
        Num::Int(v) => v as f64,
        Num::Float(v) => v,
    }
}

/// Integer arithmetic in i64, wrapping: the low bits of a wrapped i64 result
/// are those of the exact one, so the caller wraps it back to the operand
/// type with the same result as arithmetic in that type.
fn int_binary(op: BinaryOp, x: i64, y: i64) -> i64 {
    match op {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::Mul => x.wrapping_mul(y),
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        // 0 for a remainder by 0 and for `MIN % -1` (whose true remainder
        // it is); in i64 an i32's `MIN % -1` does not overflow anyway.
        BinaryOp::Rem => x.checked_rem(y).unwrap_or(0),
        // Typing admits these for floats only; they are defined through f64 anyway.
        BinaryOp::Div | BinaryOp::Pow => float_binary(op, x as f64, y as f64) as i64,
        // Typed f32; `binary` computes it.
        BinaryOp::Uniform => 0,
        BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne => {
            compare(op, x, y) as i64
        }
    }
}

fn float_binary(op: BinaryOp, x: f64, y: f64) -> f64 {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max => maximum(x, y),
        BinaryOp::Min => -maximum(-x, -y),
        BinaryOp::Pow => x.powf(y),
        // Exact: an f32's remainder computed in f64 is the f32 remainder.
        BinaryOp::Rem => x % y,
        BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne => {
            compare(op, x, y) as u8 as f64
        }
        // Typing admits i32 operands only; `binary` computes it.
        BinaryOp::Uniform => f64::NAN,
    }
}

/// IEEE 754-2019 `maximum`: NaN if either is NaN, and +0 above -0, so the
/// result never depends on operand order.
fn maximum(x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else if x == y {
        // Equal values differ at most in the sign of zero; +0 wins.
        if x.is_sign_positive() { x } else { y }
    } else {
        x.max(y)
    }
}

/// A comparison: exact for integers, IEEE for floats (false whenever a
/// NaN is involved, except for `ne`).
fn compare<T: PartialOrd>(op: BinaryOp, x: T, y: T) -> bool {
    match op {
        BinaryOp::Lt => x < y,
        BinaryOp::Le => x <= y,
        BinaryOp::Gt => x > y,
        BinaryOp::Ge => x >= y,
        BinaryOp::Eq => x == y,
        BinaryOp::Ne => x != y,
        BinaryOp::Add
        | BinaryOp::Sub
        | BinaryOp::Mul
        | BinaryOp::Div
        | BinaryOp::Max
        | BinaryOp::Min
        | BinaryOp::Pow
        | BinaryOp::Rem
        | BinaryOp::Uniform => false,
    }
}

/// Accumulates every input element into the output element it reduces to, in
/// f64 for floats and i64 for integers, then rounds or wraps once (an i64
/// product wraps modulo 2^64, so narrower integers come out as their own
/// wrapping products).
pub(crate) fn reduce(
    op: ReduceOp,
    axes: &[usize],
    x: &Data,
    from: &Shape,
    out: &Shape,
) -> Result<Data, OutOfMemory> {
    let dtype = x.dtype();
    let out_strides = out.strides();
    let target = |i: usize| -> usize {
        let coords = unravel(i, from);
        (0..from.rank())
            .filter(|a| !axes.contains(a))
            .map(|a| coords[a] * out_strides[a])
            .sum()
    };
    if dtype.is_float() {
        let init = match op {
            ReduceOp::Sum => 0.0,
            ReduceOp::Max => f64::NEG_INFINITY,
            ReduceOp::Prod => 1.0,
        };
        let mut acc = try_vec(out.numel(), init)?;
        for i in 0..from.numel() {
            let (t, v) = (target(i), x.get(i).to_f64());
            acc[t] = match op {
                ReduceOp::Sum => acc[t] + v,
                ReduceOp::Max => maximum(acc[t], v),
                ReduceOp::Prod => acc[t] * v,
            };
        }
        Data::from_fn(dtype, out.numel(), |i| cast_f64(acc[i], dtype))
    } else {
        let init = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => i64::MIN,
            ReduceOp::Prod => 1,
        };
        let mut acc = try_vec(out.numel(), init)?;
        for i in 0..from.numel() {
            let v = match num(x.get(i)) {
                Num::Int(v) => v,
                Num::Float(v) => v as i64,
            };
            let t = target(i);
            acc[t] = match op {
                ReduceOp::Sum => acc[t].wrapping_add(v),
                ReduceOp::Max => acc[t].max(v),
                ReduceOp::Prod => acc[t].wrapping_mul(v),
            };
        }
        Data::from_fn(dtype, out.numel(), |i| cast_int(acc[i], dtype))
    }
}

/// `[.., m, k] @ [.., k, n]` over equal batch dims, accumulating in f64.
pub(crate) fn matmul(
    a: &Data,
    b: &Data,
    ls: &Shape,
    rs: &Shape,
    out: &Shape,
) -> Result<Data, OutOfMemory> {
    let r = ls.rank();
    let (m, k, n) = (ls.dims()[r - 2], ls.dims()[r - 1], rs.dims()[r - 1]);
    // Each operand converted to f64 once, B with its columns contiguous:
    // the products are the same, in the same order, as read element by
    // element, and the reference stays fast enough for large products.
    let mut at = try_vec(a.len(), 0.0)?;
    for (i, t) in at.iter_mut().enumerate() {
        *t = a.get(i).to_f64();
    }
    let mut bt = try_vec(b.len(), 0.0)?;
    for (i, t) in bt.iter_mut().enumerate() {
        let (batch, col, p) = (i / (n * k), i / k % n, i % k);
        *t = b.get(batch * k * n + p * n + col).to_f64();
    }
    Data::from_fn(DType::F32, out.numel(), |i| {
        let (batch, row, col) = (i / (m * n), i / n % m, i % n);
        let (a0, b0) = (batch * m * k + row * k, batch * k * n + col * k);
        let (a, b) = (&at[a0..a0 + k], &bt[b0..b0 + k]);
        // A fold from +0.0: `Iterator::sum` starts at -0.0, and an empty product must be +0.0.
        let sum = a.iter().zip(b).fold(0.0, |acc, (x, y)| acc + x * y);
        Scalar::F32(sum as f32)
    })
}

/// Element `coords` of `x` read through `view`.
fn read(x: &Data, view: &View, coords: &[usize]) -> Scalar {
    match view.index(coords) {
        Some(i) => x.get(i),
        // `index` is `None` only under a mask.
        None => view.mask.as_ref().map_or(Scalar::Bool(false), |m| m.fill),
    }
}

/// `updates` of `shape` summed along `axis` into `len` positions, at the
/// positions `indices` give (`Op::ScatterAdd`), each sum in f64 and
/// rounded once.
fn scatter_add(
    updates: &Data,
    indices: &Data,
    shape: &Shape,
    axis: usize,
    len: usize,
) -> Result<Data, OutOfMemory> {
    let dims = shape.dims();
    let (picks, inner) = (dims[axis], dims[axis + 1..].iter().product::<usize>());
    let outer: usize = dims[..axis].iter().product();
    let mut acc = try_vec(outer * len * inner, 0.0f64)?;
    for i in 0..shape.numel() {
        let (outer, within) = (i / (picks * inner), i % inner);
        if let Some(p) = gather_position(index_value(indices.get(i)), len) {
            acc[(outer * len + p) * inner + within] += updates.get(i).to_f64();
        }
    }
    let dtype = updates.dtype();
    Data::from_fn(dtype, acc.len(), |i| cast_f64(acc[i], dtype))
}

/// An i32 or i64 index as an i64.
fn index_value(i: Scalar) -> i64 {
    match i.cast(DType::I64) {
        Scalar::I64(i) => i,
        // A cast to i64 gives an i64.
        _ => 0,
    }
}

/// The elements `view` presents, densely.
pub(crate) fn materialize(x: &Data, view: &View) -> Result<Data, OutOfMemory> {
    Data::from_fn(x.dtype(), view.shape.numel(), |i| {
        read(x, view, &unravel(i, &view.shape))
    })
}

/// One kernel, by the definitions of `kernel.rs`: blocks are evaluated value
/// by value with the scalar semantics of the graph ops, reductions and
/// products accumulate as the graph-level ops do, so a fused kernel and the
/// ops it replaces agree exactly.
/// Returns the output, then the side outputs in order.
fn kernel(k: &Kernel, args: &[&Data]) -> Result<Vec<Data>, OutOfMemory> {
    let space = &k.out.shape;
    let last = k.body.values.len().saturating_sub(1);
    let results: Vec<usize> = std::iter::once(last)
        .chain(k.side.iter().map(|s| s.value as usize))
        .collect();
    let body = |acc: &dyn Fn(&[usize]) -> Scalar| -> Result<Vec<Data>, OutOfMemory> {
        results
            .iter()
            .map(|&r| block_value(&k.body, r, space, args, acc))
            .collect()
    };
    match &k.kind {
        // The verifier admits `acc` only in reduction, scatter and matmul bodies.
        KernelKind::Elementwise => body(&|_| Scalar::Bool(false)),
        KernelKind::Scatter {
            axis,
            shape,
            prologue,
            index,
        } => {
            let none = |_: &[usize]| Scalar::Bool(false);
            let updates = block(prologue, shape, args, &none)?;
            let indices = block_value(prologue, *index as usize, shape, args, &none)?;
            let sums = scatter_add(&updates, &indices, shape, *axis, space.dims()[*axis])?;
            let strides = space.strides();
            body(&|coords| sums.get(dot(coords, &strides)))
        }
        KernelKind::Reduce {
            op,
            axes,
            shape,
            prologue,
        } => {
            let values = block(prologue, shape, args, &|_| Scalar::Bool(false))?;
            let mut reduced = shape.clone();
            for &a in axes {
                reduced.0[a] = 1;
            }
            let acc = reduce(*op, axes, &values, shape, &reduced)?;
            let strides = reduced.strides();
            let out_strides = space.strides();
            // Over the whole space, a reduced axis reads the one combined value;
            // over a reshape of the reduced shape, element i reads value i.
            let broadcast = space == shape;
            let at = |coords: &[usize]| {
                let flat = if broadcast {
                    (0..coords.len())
                        .filter(|a| !axes.contains(a))
                        .map(|a| coords[a] * strides[a])
                        .sum()
                } else {
                    dot(coords, &out_strides)
                };
                acc.get(flat)
            };
            body(&at)
        }
        KernelKind::Attention { op, operands } => {
            let values = operands
                .iter()
                .map(|(input, view)| materialize(args[*input as usize], view))
                .collect::<Result<Vec<Data>, _>>()?;
            let shapes: Vec<&Shape> = operands.iter().map(|(_, view)| &view.shape).collect();
            let values: Vec<&Data> = values.iter().collect();
            let result = op.evaluate(&values, &shapes)?;
            let strides = space.strides();
            body(&|coords| result.get(dot(coords, &strides)))
        }
        KernelKind::MatMul { a, b } => {
            let operand = |o: &Operand| match o {
                // A merged view's elements in row-major order are the operand's.
                Operand::Read { input, view } | Operand::Merged { input, view, .. } => {
                    materialize(args[*input as usize], view)
                }
                // The verifier keeps `acc` out of operand blocks.
                Operand::Computed { shape, block: b } => {
                    block(b, shape, args, &|_| Scalar::F32(0.0))
                }
            };
            let (lhs, rhs) = (operand(a)?, operand(b)?);
            let product = matmul(&lhs, &rhs, a.shape(), b.shape(), space)?;
            let strides = space.strides();
            body(&|coords| product.get(dot(coords, &strides)))
        }
    }
}

/// `b`'s result evaluated at every index of `space`.
fn block(
    b: &Block,
    space: &Shape,
    args: &[&Data],
    acc: &dyn Fn(&[usize]) -> Scalar,
) -> Result<Data, OutOfMemory> {
    block_value(b, b.values.len().saturating_sub(1), space, args, acc)
}

/// Value `result` of `b` evaluated at every index of `space`.
fn block_value(
    b: &Block,
    result: usize,
    space: &Shape,
    args: &[&Data],
    acc: &dyn Fn(&[usize]) -> Scalar,
) -> Result<Data, OutOfMemory> {
    let dtype = b.values.get(result).map_or(DType::F32, |v| v.dtype);
    let mut values: Vec<Scalar> = Vec::with_capacity(b.values.len());
    Data::from_fn(dtype, space.numel(), |i| {
        let coords = unravel(i, space);
        values.clear();
        for v in &b.values {
            let x = |k: u32| values[k as usize];
            let r = match &v.expr {
                Expr::Load { input, view } => read(args[*input as usize], view, &coords),
                Expr::Gather {
                    input,
                    view,
                    index,
                    stride,
                    len,
                } => match gather_position(index_value(x(*index)), *len) {
                    Some(at) => match view.index(&coords) {
                        Some(i) => args[*input as usize].get(i + at * stride),
                        None => read(args[*input as usize], view, &coords),
                    },
                    None => gather_fill(v.dtype),
                },
                Expr::Const(c) => *c,
                Expr::Acc => acc(&coords),
                Expr::Unary(op, a) => unary(*op, x(*a)),
                Expr::Binary(op, a, b) => binary(*op, x(*a), x(*b)),
                Expr::Where(c, a, b) => {
                    if x(*c) == Scalar::Bool(true) {
                        x(*a)
                    } else {
                        x(*b)
                    }
                }
                Expr::Cast(a) => x(*a).cast(v.dtype),
            };
            values.push(r);
        }
        // The verifier rejects empty blocks and keeps `result` inside.
        values.get(result).copied().unwrap_or(Scalar::Bool(false))
    })
}

/// An elementwise op applied to scalars, as the interpreter defines it; `None`
/// for ops that are not elementwise. Constant folding uses this, so a folded
/// constant is exactly what evaluating the op would give.
pub(crate) fn scalar_op(op: &Op, args: &[Scalar]) -> Option<Scalar> {
    match (op, args) {
        (Op::Unary(u), &[x]) => Some(unary(*u, x)),
        (Op::Binary(b), &[x, y]) => Some(binary(*b, x, y)),
        (Op::Where, &[c, x, y]) => Some(if c == Scalar::Bool(true) { x } else { y }),
        (Op::Cast(to), &[x]) => Some(x.cast(*to)),
        _ => None,
    }
}
