//! Reverse-mode differentiation as a graph transform: `grad` appends to a
//! graph the nodes that compute the gradients of a scalar loss, made of
//! ordinary graph ops, so that the optimizer and the fuser compile the
//! forward and the backward pass together as one graph.
//!
//! The walk goes once over the arena from the loss back to the front. A
//! node gets a gradient (the cotangent of its value, of its shape) when it
//! lies on a path from a value to differentiate to the loss through float
//! (float) values; its rule turns that gradient into one contribution
//! per operand that is on such a path too, and the contributions of a node's readers
//! are summed (`add`). No other node is built: nothing for operands that
//! lead to no value asked for (the data fed to a network), nothing after
//! the loss.
//!
//! The rules, by op (`dy` the node's gradient, `y` its value):
//!
//! - `neg`: `-dy`; `exp`: `dy * y`; `log`: `dy / x`; `sqrt`: `dy * 0.5 / y`;
//!   `recip`: `-(dy * y * y)`; `sigmoid`: `dy * y * (1 - y)`;
//!   `tanh`: `dy * (1 - y * y)`;
//! - `relu`: `dy` where `y > 0` (exactly where `x > 0`: 0 at 0, as JAX and
//!   PyTorch), read from the output so that the input need not be kept;
//!   `detach`: nothing flows through it;
//!   `abs`: `dy * sign(x)`, 0 at 0 (as PyTorch; JAX gives `dy` there):
//!   the mean of the two one-sided slopes, what a central difference sees;
//! - `add`: `dy, dy`; `sub`: `dy, -dy`; `mul`: `dy * b, dy * a`;
//!   `div`: `q = dy / b`, then `q, -(q * y)`;
//!   `pow`: `dy * b * a^(b-1)` (0 where `b == 0`) and `dy * y * log(a)`
//!   (0 where `a == 0`), both as JAX writes them; `rem`: `dy` and
//!   `dy * (y - a) / b`, minus the truncated quotient, which JAX computes
//!   as `-sign(a / b) floor(|a / b|)`;
//! - `max`, `min` (binary): `dy` to the operand equal to the result, split
//!   evenly (`dy / 2` each) when both are, as JAX's balanced rule; none where
//!   the result is NaN;
//! - comparisons, `where`'s condition, casts from or to an integer or bool,
//!   and every integer or bool value: no gradient (such values are never on
//!   a path that carries one); `where`: `dy` to the taken branch, 0 to the
//!   other; a cast between float types (f32, f64): `dy` cast back;
//! - views: `reshape`: reshape back; `permute`: the inverse permutation;
//!   `expand`: summed back to the operand's shape (`sum_to`, the one place
//!   that undoes broadcasting: every elementwise op's operands are
//!   explicitly expanded in the IR); `pad`: the slice of the unpadded part;
//!   `slice`: a zero-filled scatter (for a step above 1, each kept element
//!   is followed by `step - 1` zeros by a reshape, a pad and a reshape back;
//!   then a pad puts the block in place);
//! - reductions: `sum`: `dy` expanded back over the reduced axes; `max`:
//!   `dy` to the elements equal to the maximum, split evenly among ties
//!   (`dy * hit / count`), as JAX; NaN over a row whose maximum is NaN, as
//!   JAX and PyTorch; `prod`:
//!   `dy` times the product of the row's other elements, exactly where
//!   the row holds zeros (see `reduce::prod_rule`);
//! - `matmul` (batched too): `dy @ b^T` and `a^T @ dy`, transposing the
//!   last two axes; broadcast batch axes are `expand` nodes in the IR, so
//!   their sums come from `expand`'s rule.
//!
//! Where a fused rule would be cheaper. The composites of kiln's API
//! (softmax, log_softmax, layer_norm, gelu, cross_entropy, mse_loss) are
//! recorded as primitives, so they differentiate through their parts, and
//! the result is exact up to rounding. Softmax and log_softmax detach the
//! max they shift by, as JAX does: the gradient that would reach it is zero
//! in exact arithmetic (the result does not change when the input is
//! shifted), and computing it would cost a reduction, a count of ties and a
//! residue of rounding. What is left is one row reduction beyond the
//! forward's, as in the hand-derived rules (softmax's `y * (dy - sum(dy *
//! y))`, log_softmax's `dy - softmax * sum(dy)`), and it fuses as a
//! sum+broadcast kernel. cross_entropy's `(softmax - one_hot) / batch`
//! would need none; the one it pays runs over `[rows, classes]`, small next
//! to a network's matmuls, so kiln adds no fused rule: one would need a
//! graph op per composite, which every stage would then handle.

use smallvec::{SmallVec, smallvec};

use crate::Error;
use crate::elementwise::{BinaryOp, ReduceOp, UnaryOp};
use crate::graph::{Graph, Node, NodeId};
use crate::op::Op;
use crate::types::{DType, Scalar, Shape};
use crate::verify::{verify, verify_graph_ops};
use crate::view::SliceRange;

mod gather;
mod reduce;
mod trig;

/// Appends to `graph` the nodes that compute the gradient of `loss` with
/// respect to each node of `wrt`, and returns them in order (of the shapes of
/// the `wrt` nodes). The loss must be a float value of one element (any rank);
/// every `wrt` node must be a float. A `wrt` node the loss does
/// not depend on gets zeros, as in JAX. The graph's outputs are left as they are.
///
/// `graph` must hold graph ops only; a graph the optimizer has fused is an
/// `Err` naming its first post-fusion node, and so is a loss or `wrt` value
/// of an integer or bool type (naming the op that made it) or a loss of more
/// than one element. On `Err` the graph is unchanged.
pub fn grad(graph: &mut Graph, loss: NodeId, wrt: &[NodeId]) -> Result<Vec<NodeId>, Error> {
    verify_graph_ops(graph, "grad")?;
    verify(graph)?;
    let in_graph = |id: NodeId, role: &str| {
        if id.index() < graph.nodes.len() {
            Ok(())
        } else {
            Err(Error::Verify {
                message: format!("grad: the {role} {id} is not in the graph"),
                dump: graph.to_string(),
            })
        }
    };
    in_graph(loss, "loss")?;
    let loss_node = graph.node(loss);
    check_float(loss_node, "loss")?;
    if loss_node.ty.shape.numel() != 1 {
        return Err(Error::LossShape {
            op: loss_node.op.name(),
            shape: loss_node.ty.shape.clone(),
        });
    }
    for &w in wrt {
        in_graph(w, "value to differentiate")?;
        check_float(graph.node(w), "value to differentiate")?;
    }
    let len = graph.nodes.len();
    let grads = backward(graph, loss, wrt);
    if grads.is_err() {
        graph.nodes.truncate(len);
    }
    grads
}

/// The `Err` for a `role` value that is not a float.
fn check_float(node: &Node, role: &'static str) -> Result<(), Error> {
    if node.ty.dtype.is_float() {
        return Ok(());
    }
    Err(Error::NoGradient {
        role,
        op: node.op.name(),
        dtype: node.ty.dtype,
    })
}

/// The walk from the loss back to the front (see the module doc).
fn backward(graph: &mut Graph, loss: NodeId, wrt: &[NodeId]) -> Result<Vec<NodeId>, Error> {
    let n = loss.index() + 1;
    // Whether a node depends, through float values only, on a value asked for.
    let mut needs = vec![false; n];
    for w in wrt.iter().filter(|w| w.index() < n) {
        needs[w.index()] = true;
    }
    for i in 0..n {
        let node = &graph.nodes[i];
        let detached = node.op == Op::Unary(UnaryOp::Detach);
        needs[i] = needs[i]
            || (node.ty.dtype.is_float()
                && !detached
                && node.inputs.iter().any(|x| needs[x.index()]));
    }
    let mut grads: Vec<Option<NodeId>> = vec![None; n];
    if needs[loss.index()] {
        grads[loss.index()] = Some(like(graph, 1.0, loss)?);
    }
    for i in (0..n).rev() {
        let Some(dy) = grads[i] else { continue };
        let node = graph.nodes[i].clone();
        let want: SmallVec<[bool; 3]> = node.inputs.iter().map(|x| needs[x.index()]).collect();
        let contributions = rule(graph, &node, NodeId(i as u32), dy, &want)?;
        for (k, dx) in contributions.into_iter().enumerate() {
            let (Some(dx), true) = (dx, want[k]) else {
                continue;
            };
            let x = node.inputs[k].index();
            grads[x] = Some(match grads[x] {
                None => dx,
                Some(sum) => binary(graph, BinaryOp::Add, sum, dx)?,
            });
        }
    }
    wrt.iter()
        .map(|&w| match grads.get(w.index()).copied().flatten() {
            Some(g) => Ok(g),
            None => like(graph, 0.0, w),
        })
        .collect()
}

/// The contribution of node `y`'s gradient `dy` to each operand (`None`:
/// none). `want` says which operands need one; the others may get `None`.
fn rule(
    g: &mut Graph,
    node: &Node,
    y: NodeId,
    dy: NodeId,
    want: &[bool],
) -> Result<SmallVec<[Option<NodeId>; 3]>, Error> {
    let x = |k: usize| node.inputs[k];
    let shape_of = |g: &Graph, k: usize| g.node(node.inputs[k]).ty.shape.clone();
    Ok(match &node.op {
        Op::Input { .. } | Op::Const(_) => SmallVec::new(),
        Op::Unary(op) => smallvec![Some(unary_rule(g, *op, x(0), y, dy)?)],
        Op::Binary(op) => binary_rule(g, *op, [x(0), x(1)], y, dy, want)?,
        Op::Where => {
            let zero = like(g, 0.0, y)?;
            let on_true = want[1]
                .then(|| push(g, Op::Where, &[x(0), dy, zero]))
                .transpose()?;
            let on_false = want[2]
                .then(|| push(g, Op::Where, &[x(0), zero, dy]))
                .transpose()?;
            smallvec![None, on_true, on_false]
        }
        // Reached only between float types: every other cast has an integer
        // or bool on one side, which carries no gradient. `dy` goes back in
        // the operand's type.
        Op::Cast(_) => smallvec![Some(cast_like(g, dy, x(0))?)],
        Op::Reshape(_) => {
            let from = shape_of(g, 0);
            smallvec![Some(reshape(g, dy, &from)?)]
        }
        Op::Permute(perm) => {
            let mut inverse: SmallVec<[usize; 4]> = SmallVec::from_elem(0, perm.len());
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            smallvec![Some(push(g, Op::Permute(inverse), &[dy])?)]
        }
        Op::Expand(_) => {
            let from = shape_of(g, 0);
            smallvec![Some(sum_to(g, dy, &from)?)]
        }
        Op::Slice(ranges) => {
            let from = shape_of(g, 0);
            smallvec![Some(scatter(g, dy, ranges, &from)?)]
        }
        Op::Unfold { axis, size, step } => {
            let from = shape_of(g, 0);
            smallvec![Some(unfold_rule(g, dy, (*axis, *size, *step), &from)?)]
        }
        Op::Pad { pads, .. } => {
            let from = shape_of(g, 0);
            let ranges = pads
                .iter()
                .zip(from.dims())
                .map(|(&(before, _), &d)| SliceRange {
                    start: before,
                    end: before + d,
                    step: 1,
                })
                .collect();
            smallvec![Some(push(g, Op::Slice(ranges), &[dy])?)]
        }
        Op::Reduce {
            op: ReduceOp::Sum, ..
        } => {
            let from = shape_of(g, 0);
            smallvec![Some(push(g, Op::Expand(from), &[dy])?)]
        }
        Op::Reduce {
            op: ReduceOp::Max,
            axes,
        } => smallvec![Some(reduce::max_rule(g, axes, x(0), y, dy)?)],
        Op::Reduce {
            op: ReduceOp::Prod,
            axes,
        } => smallvec![Some(reduce::prod_rule(g, axes, x(0), dy)?)],
        Op::MatMul => {
            let da = want[0]
                .then(|| {
                    let bt = transpose(g, x(1))?;
                    push(g, Op::MatMul, &[dy, bt])
                })
                .transpose()?;
            let db = want[1]
                .then(|| {
                    let at = transpose(g, x(0))?;
                    push(g, Op::MatMul, &[at, dy])
                })
                .transpose()?;
            smallvec![da, db]
        }
        Op::Gather { axis } => {
            smallvec![Some(gather::gather_rule(g, *axis, x(0), x(1), dy)?), None]
        }
        Op::ScatterAdd { axis, len } => {
            let rule = gather::scatter_add_rule(g, (*axis, *len), x(0), x(1), dy)?;
            smallvec![Some(rule), None]
        }
        // Found by the optimizer, after gradients are taken.
        Op::Attention(_) => {
            return Err(Error::Malformed {
                op: "grad",
                message: format!("node {y} is an attention: differentiate the ops it stands for"),
            });
        }
        // `grad` checked on entry that the graph holds graph ops only.
        Op::View(_) | Op::Kernel(_) | Op::SideOutput(_) => {
            return Err(Error::Verify {
                message: format!("grad: node {y} is a {} node", node.op.name()),
                dump: g.to_string(),
            });
        }
    })
}

/// The gradient of `y = op(x)`.
fn unary_rule(
    g: &mut Graph,
    op: UnaryOp,
    x: NodeId,
    y: NodeId,
    dy: NodeId,
) -> Result<NodeId, Error> {
    use BinaryOp::{Div, Gt, Lt, Mul, Sub};
    match op {
        UnaryOp::Neg => unary(g, UnaryOp::Neg, dy),
        UnaryOp::Exp => binary(g, Mul, dy, y),
        UnaryOp::Log => binary(g, Div, dy, x),
        UnaryOp::Sqrt => {
            let half = scale(g, dy, 0.5)?;
            binary(g, Div, half, y)
        }
        UnaryOp::Recip => {
            let yy = binary(g, Mul, y, y)?;
            let product = binary(g, Mul, dy, yy)?;
            unary(g, UnaryOp::Neg, product)
        }
        UnaryOp::Relu => {
            // `y > 0` exactly when `x > 0` (NaN fails both, so a NaN input
            // gets 0, as JAX's and PyTorch's relu give it): reading the
            // output lets the input die in the kernel that computes both,
            // a matmul's epilogue, instead of being stored for the backward pass.
            let zero = like(g, 0.0, y)?;
            let positive = binary(g, Gt, y, zero)?;
            push(g, Op::Where, &[positive, dy, zero])
        }
        UnaryOp::Sigmoid => {
            let one = like(g, 1.0, y)?;
            let rest = binary(g, Sub, one, y)?;
            let slope = binary(g, Mul, y, rest)?;
            binary(g, Mul, dy, slope)
        }
        // `backward` gives detached values no gradient; were it asked, none flows.
        UnaryOp::Detach => like(g, 0.0, x),
        UnaryOp::Tanh => {
            let one = like(g, 1.0, y)?;
            let yy = binary(g, Mul, y, y)?;
            let slope = binary(g, Sub, one, yy)?;
            binary(g, Mul, dy, slope)
        }
        UnaryOp::Trig(t) => trig::rule(g, t, [x, y, dy]),
        UnaryOp::Abs => {
            // sign(x) = (x > 0) - (x < 0): 0 at 0; NaN at NaN, as JAX's and
            // PyTorch's sign, so that a NaN input shows in its gradient.
            let zero = like(g, 0.0, x)?;
            let positive = binary(g, Gt, x, zero)?;
            let negative = binary(g, Lt, x, zero)?;
            let (p, n) = (cast_like(g, positive, x)?, cast_like(g, negative, x)?);
            let sign = binary(g, Sub, p, n)?;
            let nan = binary(g, BinaryOp::Ne, x, x)?;
            let sign = push(g, Op::Where, &[nan, x, sign])?;
            binary(g, Mul, dy, sign)
        }
    }
}

/// The gradients of `y = a op b` for the operands that `want` them.
fn binary_rule(
    g: &mut Graph,
    op: BinaryOp,
    [a, b]: [NodeId; 2],
    y: NodeId,
    dy: NodeId,
    want: &[bool],
) -> Result<SmallVec<[Option<NodeId>; 3]>, Error> {
    use BinaryOp::{Div, Eq, Mul};
    let each = |g: &mut Graph,
                f: &dyn Fn(&mut Graph, usize) -> Result<NodeId, Error>|
     -> Result<SmallVec<[Option<NodeId>; 3]>, Error> {
        (0..2)
            .map(|k| want[k].then(|| f(g, k)).transpose())
            .collect()
    };
    match op {
        BinaryOp::Add => Ok(smallvec![Some(dy), Some(dy)]),
        BinaryOp::Sub => {
            let neg = want[1].then(|| unary(g, UnaryOp::Neg, dy)).transpose()?;
            Ok(smallvec![Some(dy), neg])
        }
        BinaryOp::Mul => each(g, &|g, k| binary(g, Mul, dy, [b, a][k])),
        BinaryOp::Div => {
            let q = binary(g, Div, dy, b)?;
            let db = want[1]
                .then(|| {
                    let qy = binary(g, Mul, q, y)?;
                    unary(g, UnaryOp::Neg, qy)
                })
                .transpose()?;
            Ok(smallvec![Some(q), db])
        }
        BinaryOp::Max | BinaryOp::Min => {
            // JAX's balanced rule: all of `dy` to the operand equal to the
            // result, half to each when both are.
            let ta = binary(g, Eq, a, y)?;
            let tb = binary(g, Eq, b, y)?;
            let half = scale(g, dy, 0.5)?;
            let zero = like(g, 0.0, dy)?;
            each(g, &|g, k| {
                let (mine, other) = [(ta, tb), (tb, ta)][k];
                let share = push(g, Op::Where, &[other, half, dy])?;
                push(g, Op::Where, &[mine, share, zero])
            })
        }
        BinaryOp::Pow => each(g, &|g, k| {
            let zero = like(g, 0.0, a)?;
            let slope = if k == 0 {
                // b * a^(b-1), and 0 where b == 0 (not 0 * a^-1, NaN at a == 0).
                let one = like(g, 1.0, b)?;
                let b1 = binary(g, BinaryOp::Sub, b, one)?;
                let p = binary(g, BinaryOp::Pow, a, b1)?;
                let bp = binary(g, Mul, b, p)?;
                let b_zero = binary(g, Eq, b, zero)?;
                push(g, Op::Where, &[b_zero, zero, bp])?
            } else {
                // y * log(a), with log(1) = 0 standing in where a == 0.
                let one = like(g, 1.0, a)?;
                let a_zero = binary(g, Eq, a, zero)?;
                let safe = push(g, Op::Where, &[a_zero, one, a])?;
                let log = unary(g, UnaryOp::Log, safe)?;
                binary(g, Mul, y, log)?
            };
            binary(g, Mul, dy, slope)
        }),
        // a - trunc(a / b) b: 1 for a, and for b -trunc(a / b), here
        // (y - a) / b (equal to it in exact arithmetic), the jumps at whole
        // quotients ignored as JAX's `rem` ignores them.
        BinaryOp::Rem => {
            let db = want[1]
                .then(|| {
                    let minus = binary(g, BinaryOp::Sub, y, a)?;
                    let slope = binary(g, Div, minus, b)?;
                    binary(g, Mul, dy, slope)
                })
                .transpose()?;
            Ok(smallvec![Some(dy), db])
        }
        // Integer operands: nothing to differentiate.
        BinaryOp::Lt
        | BinaryOp::Le
        | BinaryOp::Gt
        | BinaryOp::Ge
        | BinaryOp::Eq
        | BinaryOp::Ne
        | BinaryOp::Uniform => Ok(smallvec![None, None]),
    }
}

/// `dy` summed over the axes that `expand` broadcast to reach its shape from
/// `from`, then reshaped to `from`: the one place broadcasting is undone.
fn sum_to(g: &mut Graph, dy: NodeId, from: &Shape) -> Result<NodeId, Error> {
    let to = g.node(dy).ty.shape.clone();
    let lead = to.rank() - from.rank();
    let axes: SmallVec<[usize; 4]> = (0..to.rank())
        .filter(|&a| to.dims()[a] != 1 && (a < lead || from.dims()[a - lead] == 1))
        .collect();
    let summed = if axes.is_empty() {
        dy
    } else {
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            axes,
        };
        push(g, op, &[dy])?
    };
    reshape(g, summed, from)
}

/// The gradient of an unfold: each position `j` within the windows is a
/// slice of the input along the axis (starting at `j`, `step` apart), so
/// `dy` at `j` scatters back as that slice's gradient, and the `size`
/// scatters add up where windows overlap.
fn unfold_rule(
    g: &mut Graph,
    dy: NodeId,
    (axis, size, step): (usize, usize, usize),
    from: &Shape,
) -> Result<NodeId, Error> {
    let out = g.node(dy).ty.shape.clone();
    let (rank, windows) = (from.rank(), out.dims()[axis]);
    let mut terms = Vec::with_capacity(size);
    for j in 0..size {
        let mut at: SmallVec<[SliceRange; 4]> = out
            .dims()
            .iter()
            .map(|&d| SliceRange {
                start: 0,
                end: d,
                step: 1,
            })
            .collect();
        at[rank] = SliceRange {
            start: j,
            end: j + 1,
            step: 1,
        };
        let dy_j = push(g, Op::Slice(at), &[dy])?;
        let dy_j = reshape(g, dy_j, &Shape::new(&out.dims()[..rank]))?;
        let kept: SmallVec<[SliceRange; 4]> = from
            .dims()
            .iter()
            .enumerate()
            .map(|(a, &d)| match a == axis {
                true => SliceRange {
                    start: j,
                    end: j + (windows - 1) * step + 1,
                    step,
                },
                false => SliceRange {
                    start: 0,
                    end: d,
                    step: 1,
                },
            })
            .collect();
        terms.push(scatter(g, dy_j, &kept, from)?);
    }
    // Pairwise, so that a wide window is a shallow graph.
    while terms.len() > 1 {
        let mut next = Vec::with_capacity(terms.len().div_ceil(2));
        for pair in terms.chunks(2) {
            next.push(match pair {
                &[a, b] => binary(g, BinaryOp::Add, a, b)?,
                _ => pair[0],
            });
        }
        terms = next;
    }
    terms.pop().ok_or_else(|| Error::Malformed {
        op: "unfold",
        message: "windows of no elements".to_string(),
    })
}

/// The gradient of a slice: `dy` scattered into zeros of shape `from` at the
/// positions the slice kept.
fn scatter(
    g: &mut Graph,
    dy: NodeId,
    ranges: &[SliceRange],
    from: &Shape,
) -> Result<NodeId, Error> {
    let lens: SmallVec<[usize; 4]> = ranges.iter().map(SliceRange::len).collect();
    let dtype = g.node(dy).ty.dtype;
    if lens.contains(&0) {
        return full(g, Scalar::F32(0.0).cast(dtype), from);
    }
    // Axes whose kept elements are apart: each is followed by `step - 1`
    // zeros, by splitting the axis as [len, 1], padding the new axis to
    // [len, step], merging it back and cutting the zeros after the last.
    let strided = |a: usize| ranges[a].step > 1 && lens[a] > 1;
    let mut cur = dy;
    if (0..ranges.len()).any(strided) {
        let mut split = Vec::new();
        let mut pads = SmallVec::new();
        for (a, r) in ranges.iter().enumerate() {
            split.push(lens[a]);
            pads.push((0, 0));
            if strided(a) {
                split.push(1);
                pads.push((0, r.step - 1));
            }
        }
        cur = reshape(g, cur, &Shape::new(&split))?;
        cur = push(g, pad_op(pads, dtype), &[cur])?;
        let merged: Vec<usize> = (0..ranges.len())
            .map(|a| {
                if strided(a) {
                    lens[a] * ranges[a].step
                } else {
                    lens[a]
                }
            })
            .collect();
        cur = reshape(g, cur, &Shape::new(&merged))?;
        let cut = (0..ranges.len())
            .map(|a| SliceRange {
                start: 0,
                end: extent(ranges, &lens, a),
                step: 1,
            })
            .collect();
        cur = push(g, Op::Slice(cut), &[cur])?;
    }
    let pads: SmallVec<[(usize, usize); 4]> = (0..ranges.len())
        .map(|a| {
            let start = ranges[a].start;
            (start, from.dims()[a] - start - extent(ranges, &lens, a))
        })
        .collect();
    if pads.iter().all(|&p| p == (0, 0)) {
        return Ok(cur);
    }
    push(g, pad_op(pads, dtype), &[cur])
}

/// How many elements of axis `a` a slice spans, from its first kept element
/// to its last.
fn extent(ranges: &[SliceRange], lens: &[usize], a: usize) -> usize {
    (lens[a] - 1) * ranges[a].step + 1
}

/// A pad with zeros of `dtype`.
fn pad_op(pads: SmallVec<[(usize, usize); 4]>, dtype: DType) -> Op {
    Op::Pad {
        pads,
        value: Scalar::F32(0.0).cast(dtype),
    }
}

/// The last two axes of `x` swapped.
fn transpose(g: &mut Graph, x: NodeId) -> Result<NodeId, Error> {
    let rank = g.node(x).ty.shape.rank();
    let mut perm: SmallVec<[usize; 4]> = (0..rank).collect();
    perm.swap(rank - 1, rank - 2);
    push(g, Op::Permute(perm), &[x])
}

fn push(g: &mut Graph, op: Op, inputs: &[NodeId]) -> Result<NodeId, Error> {
    g.push(op, inputs)
}

fn unary(g: &mut Graph, op: UnaryOp, x: NodeId) -> Result<NodeId, Error> {
    push(g, Op::Unary(op), &[x])
}

fn binary(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, Error> {
    push(g, Op::Binary(op), &[a, b])
}

/// `x * v`.
fn scale(g: &mut Graph, x: NodeId, v: f32) -> Result<NodeId, Error> {
    let k = like(g, v, x)?;
    binary(g, BinaryOp::Mul, x, k)
}

/// `x` cast to the dtype of `like` (itself when it has that dtype already).
fn cast_like(g: &mut Graph, x: NodeId, like: NodeId) -> Result<NodeId, Error> {
    let dtype = g.node(like).ty.dtype;
    if g.node(x).ty.dtype == dtype {
        return Ok(x);
    }
    push(g, Op::Cast(dtype), &[x])
}

/// `x` under shape `to` (itself when it has that shape already).
fn reshape(g: &mut Graph, x: NodeId, to: &Shape) -> Result<NodeId, Error> {
    if &g.node(x).ty.shape == to {
        return Ok(x);
    }
    push(g, Op::Reshape(to.clone()), &[x])
}

/// The constant `v` broadcast to `shape`.
fn full(g: &mut Graph, v: Scalar, shape: &Shape) -> Result<NodeId, Error> {
    let k = push(g, Op::Const(v), &[])?;
    if shape.rank() == 0 {
        return Ok(k);
    }
    push(g, Op::Expand(shape.clone()), &[k])
}

/// The constant `v` of `x`'s shape and dtype (a float: the `v`s of the rules,
/// 0, 0.5 and 1, are exact in each).
fn like(g: &mut Graph, v: f32, x: NodeId) -> Result<NodeId, Error> {
    let ty = g.node(x).ty.clone();
    full(g, Scalar::F32(v).cast(ty.dtype), &ty.shape)
}
