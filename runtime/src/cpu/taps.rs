//! Depthwise convolutions by `kiln_machine::taps`: an elementwise kernel
//! whose body sums weighted taps of one input plane (`conv2d`'s
//! multiply-and-sum) computes that sum by the machine kernel, a chunk of
//! planes per task, and the rest of its body (the bias, the activation) as
//! generated code over each chunk just written, reading the sum as `acc`,
//! as a matmul's epilogue reads its product; where the rest is ReLU and a
//! cap alone, the machine kernel applies them to each plane it writes.
//!
//! A sum is taken only where the machine kernel reads exactly what the
//! kernel's loads read: every tap a product of a read of one input `x`
//! and a read of one input `w`, `x` read along the output's last two axes
//! at a stride through a plane of its last two dims, padded exactly where
//! a tap falls outside that plane, `w` constant over each plane; the
//! products summed in `conv2d`'s pairwise tree, which the machine kernel
//! reproduces bit for bit. A kernel that reads an input only at its own
//! output index is left alone: `pass::donate` may give its output that
//! input's buffer, which the sums would overwrite before the rest of the
//! body reads it. Anything else stays generated code.

use kiln_ir::kernel::{Block, Expr, Kernel, KernelKind, SideOutput, Value};
use kiln_ir::view::View;
use kiln_ir::{BinaryOp, DType, Scalar};
use kiln_machine::taps::{self, Activation, Plane, Tap};

use crate::loops;

/// The taps of a kernel: which inputs they read, and how.
#[derive(Debug)]
pub(crate) struct TapsPlan {
    /// The input whose planes are tapped.
    pub x: u32,
    /// The input holding the weights.
    pub w: u32,
    /// The taps, in the order they are summed.
    pub taps: Vec<Tap>,
    /// Each output plane's input and weights.
    pub planes: Vec<Plane>,
    /// An input plane's rows and columns.
    pub in_dims: [usize; 2],
    /// An output plane's rows and columns.
    pub out_dims: [usize; 2],
    /// Input rows and columns between neighbouring outputs.
    pub stride: [usize; 2],
    /// What a tap outside the input plane reads.
    pub fill: f32,
    /// ReLU and a cap, where they are all the kernel does to the sum: the
    /// machine kernel applies them to each plane it writes.
    pub activation: Activation,
}

/// The taps of `kernel`'s body, and the kernel that remains: its body with
/// the sum read as `acc` (and no more, where the plan's activation is the
/// rest of it).
pub(crate) fn plan(kernel: &Kernel) -> Option<(TapsPlan, Kernel)> {
    if kernel.kind != KernelKind::Elementwise || kernel.out.dtype != DType::F32 {
        return None;
    }
    let values = &kernel.body.values;
    // An input read only at the output's own index may be donated to it.
    let own = View::contiguous(&kernel.out.shape);
    let reads = |input: u32| {
        (values.iter()).filter_map(move |v| v.expr.read().filter(|(i, _)| *i == input))
    };
    let donatable = |input: u32| reads(input).all(|(_, view)| *view == own);
    if (0..kernel.inputs.len() as u32).any(|i| reads(i).next().is_some() && donatable(i)) {
        return None;
    }
    let mut uses = vec![0usize; values.len()];
    for v in values {
        for o in v.expr.operands() {
            uses[o as usize] += 1;
        }
    }
    for s in &kernel.side {
        uses[s.value as usize] += 1;
    }
    *uses.last_mut()? += 1;
    // The last sum that has the form: an added bias makes a larger tree
    // around it that does not.
    let (root, plan) = (0..values.len()).rev().find_map(|root| {
        let leaves = sum_tree(values, &uses, root)?;
        taps_of(kernel, &leaves).map(|plan| (root, plan))
    })?;
    let tail = tail(kernel, root);
    match activation_of(&tail) {
        Some(activation) => {
            let sum = Block {
                values: tail.body.values[..1].to_vec(),
            };
            let plan = TapsPlan { activation, ..plan };
            Some((plan, Kernel { body: sum, ..tail }))
        }
        None => Some((plan, tail)),
    }
}

/// The ReLU and cap of `tail` (its body the sum as `acc`, then those, each
/// if there, and no side output), which the machine kernel applies as a
/// GEMM's epilogue does (`matmul::activation`); `None` for any other tail.
fn activation_of(tail: &Kernel) -> Option<Activation> {
    let [acc, rest @ ..] = tail.body.values.as_slice() else {
        return None;
    };
    if acc.expr != Expr::Acc || rest.is_empty() || !tail.side.is_empty() {
        return None;
    }
    let (relu, cap) = crate::matmul::activation(rest, 0)?;
    Some(Activation {
        relu,
        cap: cap.map(f32::from_bits),
    })
}

/// More leaves than any sum the machine kernel runs.
const LEAVES: usize = 64;

/// The leaves of the tree of f32 additions at `root`, where the tree is
/// `conv2d`'s pairwise one over them: an addition read only by the tree is
/// part of it.
fn sum_tree(values: &[Value], uses: &[usize], root: usize) -> Option<Vec<u32>> {
    /// A tree of additions: a leaf, or the sum of two trees.
    #[derive(PartialEq)]
    enum Tree {
        Leaf(u32),
        Add(Box<Tree>, Box<Tree>),
    }
    /// The tree at `at`; past `LEAVES` leaves it stops descending (the
    /// tree is then too large to match), so a chain of additions costs no
    /// deep recursion.
    fn walk(values: &[Value], uses: &[usize], at: u32, top: bool, leaves: &mut Vec<u32>) -> Tree {
        match values[at as usize].expr {
            Expr::Binary(BinaryOp::Add, a, b)
                if (top || uses[at as usize] == 1) && leaves.len() <= LEAVES =>
            {
                let a = walk(values, uses, a, false, leaves);
                let b = walk(values, uses, b, false, leaves);
                Tree::Add(Box::new(a), Box::new(b))
            }
            _ => {
                leaves.push(at);
                Tree::Leaf(at)
            }
        }
    }
    if !matches!(values[root].expr, Expr::Binary(BinaryOp::Add, ..)) {
        return None;
    }
    let mut leaves = Vec::new();
    let tree = walk(values, uses, root as u32, true, &mut leaves);
    if !taps::supports(leaves.len()) {
        return None;
    }
    // `conv2d`'s tree over the same leaves: neighbours paired, level by level.
    let mut level: Vec<Tree> = leaves.iter().map(|&l| Tree::Leaf(l)).collect();
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len().div_ceil(2));
        let mut it = level.into_iter();
        while let Some(a) = it.next() {
            next.push(match it.next() {
                Some(b) => Tree::Add(Box::new(a), Box::new(b)),
                None => a,
            });
        }
        level = next;
    }
    (level.pop()? == tree).then_some(leaves)
}

/// The plan of taps `leaves`, each a product of a read of the tapped
/// input and a read of the weights, where they have the module's form.
fn taps_of(kernel: &Kernel, leaves: &[u32]) -> Option<TapsPlan> {
    let values = &kernel.body.values;
    let load = |i: u32| match &values[i as usize].expr {
        Expr::Load { input, view } if values[i as usize].dtype == DType::F32 => {
            Some((*input, view))
        }
        _ => None,
    };
    let out = kernel.out.shape.dims();
    let rank = out.len();
    if rank < 2 {
        return None;
    }
    let lead = rank - 2;
    // A weight read: no padding, the same weight over a plane.
    let weight = |v: &View| v.mask.is_none() && v.strides[lead..].iter().all(|&s| s == 0);
    let mut reads = Vec::with_capacity(leaves.len());
    for &leaf in leaves {
        let Expr::Binary(BinaryOp::Mul, a, b) = values[leaf as usize].expr else {
            return None;
        };
        let ((xi, xv), (wi, wv)) = match (load(a)?, load(b)?) {
            (x, w) if weight(w.1) && !weight(x.1) => (x, w),
            (w, x) if weight(w.1) && !weight(x.1) => (x, w),
            _ => return None,
        };
        reads.push((xi, xv, wi, wv));
    }
    let (x, xv0, w, wv0) = reads[0];
    let same = |(xi, xv, wi, wv): &(u32, &View, u32, &View)| {
        *xi == x && *wi == w && xv.strides == xv0.strides && wv.strides == wv0.strides
    };
    if x == w || !reads.iter().all(same) {
        return None;
    }
    // The tapped input's planes: its last two dims, rows `cols` apart.
    let x_ty = kernel.inputs.get(x as usize)?;
    let in_dims = x_ty.shape.dims();
    let [h, cols] = *in_dims.get(in_dims.len().checked_sub(2)?..)? else {
        return None;
    };
    let (row_stride, sw) = (xv0.strides[lead], xv0.strides[lead + 1]);
    if cols == 0 || sw == 0 || row_stride == 0 || !row_stride.is_multiple_of(cols) {
        return None;
    }
    let (sh, out_dims) = (row_stride / cols, [out[lead], out[lead + 1]]);
    let mut fill = None;
    let mut tap_list = Vec::with_capacity(reads.len());
    for (_, xv, _, wv) in &reads {
        let (dy, dx) = place(xv, [h, cols], [sh, sw], out_dims)?;
        if let Some(m) = &xv.mask {
            let Scalar::F32(f) = m.fill else { return None };
            if fill.is_some_and(|g: f32| g.to_bits() != f.to_bits()) {
                return None;
            }
            fill = Some(f);
        }
        let weight = usize::try_from(wv.offset).ok()?;
        tap_list.push(Tap { dy, dx, weight });
    }
    // Each plane's first input element and first weight, by its
    // coordinates along the leading axes.
    let lead_dims = &out[..lead];
    let count: usize = lead_dims.iter().product();
    let planes: Vec<Plane> = (0..count)
        .map(|p| {
            let (mut input, mut weights, mut rest) = (0, 0, p);
            for a in (0..lead).rev() {
                let c = rest % lead_dims[a];
                rest /= lead_dims[a];
                input += c * xv0.strides[a];
                weights += c * wv0.strides[a];
            }
            Plane { input, weights }
        })
        .collect();
    // Every plane inside its input (the machine kernel stages whole rows).
    let last = planes.iter().map(|p| p.input).max().unwrap_or(0);
    if last + h * cols > x_ty.shape.numel() {
        return None;
    }
    Some(TapsPlan {
        x,
        w,
        taps: tap_list,
        planes,
        in_dims: [h, cols],
        out_dims,
        stride: [sh, sw],
        fill: fill.unwrap_or(0.0),
        activation: Activation::NONE,
    })
}

/// The tap `(dy, dx)` a read of the tapped input makes, where it reads
/// `offset + (oh * sh + dy) * cols + ow * sw + dx` for every output plane
/// position, padded exactly where that lies outside the `[h, cols]` plane
/// and along no leading axis.
fn place(
    v: &View,
    [h, cols]: [usize; 2],
    [sh, sw]: [usize; 2],
    [oh, ow]: [usize; 2],
) -> Option<(isize, isize)> {
    let lead = v.shape.rank() - 2;
    // The outputs whose tap lies inside an axis of `len`.
    let inside = |len: usize, step: usize, d: isize, n: usize| {
        let first = (0..n).find(|&i| (0..len as isize).contains(&((i * step) as isize + d)));
        let first = first.unwrap_or(n);
        let end = (first..n)
            .find(|&i| !(0..len as isize).contains(&((i * step) as isize + d)))
            .unwrap_or(n);
        (first, end)
    };
    let empty_or_equal =
        |a: (usize, usize), b: (usize, usize)| a == b || (a.0 >= a.1 && b.0 >= b.1);
    let c = cols as isize;
    let (dy, dx) = (v.offset.div_euclid(c), v.offset.rem_euclid(c));
    [(dy, dx), (dy + 1, dx - c)].into_iter().find(|&(dy, dx)| {
        let (rows, columns) = (inside(h, sh, dy, oh), inside(cols, sw, dx, ow));
        match &v.mask {
            None => rows == (0, oh) && columns == (0, ow),
            Some(m) => {
                (0..lead).all(|a| m.valid[a] == (0, v.shape.dims()[a]))
                    && empty_or_equal(m.valid[lead], rows)
                    && empty_or_equal(m.valid[lead + 1], columns)
            }
        }
    })
}

/// `kernel` with value `root` of its body read as `acc`, the values only it
/// read dropped.
fn tail(kernel: &Kernel, root: usize) -> Kernel {
    let mut body = kernel.body.clone();
    body.values[root].expr = Expr::Acc;
    let live = loops::live(&body, kernel.side.iter().map(|s| s.value));
    let mut at = vec![0u32; body.values.len()];
    let mut kept = Block::default();
    for (i, v) in body.values.iter().enumerate().filter(|(i, _)| live[*i]) {
        at[i] = kept.values.len() as u32;
        let mut v = v.clone();
        for x in v.expr.operands_mut() {
            *x = at[*x as usize];
        }
        kept.values.push(v);
    }
    let side = (kernel.side.iter())
        .map(|s| SideOutput {
            ty: s.ty.clone(),
            value: at[s.value as usize],
        })
        .collect();
    Kernel {
        body: kept,
        side,
        ..kernel.clone()
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::pass::{Options, optimize};
    use kiln_ir::view::SliceRange;
    use kiln_ir::{Graph, NodeId, Op, Shape, TensorType, UnaryOp};
    use smallvec::smallvec;

    use super::*;

    /// A depthwise `k x k` convolution of `[n, c, h, w]` as `conv2d` builds
    /// it (padded input, a strided slice per tap times the tap's weight per
    /// channel, summed pairwise), plus a bias and ReLU; its one kernel.
    fn depthwise(n: usize, c: usize, [h, w]: [usize; 2], k: usize, stride: usize) -> Kernel {
        depthwise_then(n, c, [h, w], (k, stride), Then::Relu)
    }

    /// What follows a depthwise convolution's sum.
    #[derive(PartialEq)]
    enum Then {
        /// A bias, then ReLU.
        Relu,
        /// A bias, ReLU, then a residual input added.
        Residual,
        /// ReLU, then the min with 6 (ReLU6 without a bias).
        Relu6,
    }

    /// `depthwise`, with `then` after the sum.
    fn depthwise_then(
        n: usize,
        c: usize,
        [h, w]: [usize; 2],
        (k, stride): (usize, usize),
        then: Then,
    ) -> Kernel {
        let pad = k / 2;
        let mut g = Graph::new("g");
        let f32s = |dims: &[usize]| TensorType::new(DType::F32, Shape::new(dims));
        let x = g.input(f32s(&[n, c, h, w]));
        let weights = g.input(f32s(&[c, k * k]));
        let bias = g.input(f32s(&[1, c, 1, 1]));
        let padded = Op::Pad {
            pads: smallvec![(0, 0), (0, 0), (pad, pad), (pad, pad)],
            value: Scalar::F32(0.0),
        };
        let xp = g.push(padded, &[x]).unwrap();
        let [oh, ow] = [h, w].map(|d| (d + 2 * pad - k) / stride + 1);
        let mut terms: Vec<NodeId> = Vec::new();
        for i in 0..k {
            for j in 0..k {
                let range = |start, len: usize, step| SliceRange {
                    start,
                    end: start + (len - 1) * step + 1,
                    step,
                };
                let window = Op::Slice(smallvec![
                    range(0, n, 1),
                    range(0, c, 1),
                    range(i, oh, stride),
                    range(j, ow, stride),
                ]);
                let win = g.push(window, &[xp]).unwrap();
                let tap = i * k + j;
                let column = Op::Slice(smallvec![range(0, c, 1), range(tap, 1, 1)]);
                let col = g.push(column, &[weights]).unwrap();
                let col = g
                    .push(Op::Reshape(Shape::new(&[1, c, 1, 1])), &[col])
                    .unwrap();
                let col = g
                    .push(Op::Expand(Shape::new(&[n, c, oh, ow])), &[col])
                    .unwrap();
                terms.push(g.push(Op::Binary(BinaryOp::Mul), &[win, col]).unwrap());
            }
        }
        while terms.len() > 1 {
            terms = terms
                .chunks(2)
                .map(|p| match p {
                    [a, b] => g.push(Op::Binary(BinaryOp::Add), &[*a, *b]).unwrap(),
                    _ => p[0],
                })
                .collect();
        }
        let bias = g
            .push(Op::Expand(Shape::new(&[n, c, oh, ow])), &[bias])
            .unwrap();
        let y = match then {
            Then::Relu6 => terms[0],
            _ => (g.push(Op::Binary(BinaryOp::Add), &[terms[0], bias])).unwrap(),
        };
        let mut y = g.push(Op::Unary(UnaryOp::Relu), &[y]).unwrap();
        if then == Then::Residual {
            let r = g.input(f32s(&[n, c, oh, ow]));
            y = g.push(Op::Binary(BinaryOp::Add), &[y, r]).unwrap();
        }
        if then == Then::Relu6 {
            let six = g.push(Op::Const(Scalar::F32(6.0)), &[]).unwrap();
            let six = (g.push(Op::Expand(Shape::new(&[n, c, oh, ow])), &[six])).unwrap();
            y = g.push(Op::Binary(BinaryOp::Min), &[y, six]).unwrap();
        }
        g.outputs.push(y);
        let optimized = optimize(&g, Options::default(), &mut |_, _| {}).unwrap();
        let launch = optimized.schedule.launches.last().unwrap();
        let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
            panic!("the launch is a kernel")
        };
        (**kernel).clone()
    }

    #[test]
    fn a_depthwise_convolutions_sum_is_its_taps_and_the_rest_reads_it_as_acc() {
        for (k, stride, dims) in [(3, 2, [13, 17]), (5, 1, [9, 6]), (7, 2, [15, 15])] {
            let kernel = depthwise(2, 5, dims, k, stride);
            let (plan, tail) = plan(&kernel).expect("the sum is matched");
            let pad = (k / 2) as isize;
            let [oh, ow] = dims.map(|d| (d + 2 * (k / 2) - k) / stride + 1);
            assert_eq!((plan.stride, plan.out_dims), ([stride; 2], [oh, ow]));
            assert_eq!(plan.planes.len(), 10);
            // The input read through masks, padded where a tap falls outside.
            let (in_dims, origin) = (dims, -pad);
            let want: Vec<(isize, isize)> = (0..k * k)
                .map(|t| ((t / k) as isize + origin, (t % k) as isize + origin))
                .collect();
            let got: Vec<(isize, isize)> = plan.taps.iter().map(|t| (t.dy, t.dx)).collect();
            assert_eq!(got, want, "k{k} s{stride}");
            assert_eq!(
                plan.planes[6],
                Plane {
                    input: 6 * in_dims[0] * in_dims[1],
                    weights: k * k
                }
            );
            // The bias and ReLU stay, over `acc`.
            let exprs: Vec<&Expr> = tail.body.values.iter().map(|v| &v.expr).collect();
            assert!(
                matches!(
                    exprs[..],
                    [
                        Expr::Acc,
                        Expr::Load { .. },
                        Expr::Binary(..),
                        Expr::Unary(..)
                    ]
                ),
                "{exprs:?}"
            );
        }
    }

    #[test]
    fn relu6_alone_is_the_machine_kernels_and_a_bias_before_it_the_tails() {
        let relu6 = depthwise_then(1, 3, [8, 8], (3, 1), Then::Relu6);
        let (taps, tail) = plan(&relu6).expect("the sum is matched");
        let applied = Activation {
            relu: true,
            cap: Some(6.0),
        };
        assert_eq!((taps.activation, tail.body.values.len()), (applied, 1));
        let (taps, tail) = plan(&depthwise(1, 3, [8, 8], 3, 1)).expect("the sum is matched");
        assert_eq!(taps.activation, Activation::NONE);
        assert_eq!(tail.body.values.len(), 4);
    }

    #[test]
    fn sums_in_another_order_of_unsupported_counts_or_beside_donatable_reads_stay_generated() {
        let mut kernel = depthwise(1, 3, [8, 8], 3, 2);
        assert!(plan(&kernel).is_some());
        // The sum's last addition with its operands swapped (the last tap
        // first): not `conv2d`'s tree.
        let values = &mut kernel.body.values;
        let bias = (values.iter())
            .rposition(|v| matches!(v.expr, Expr::Binary(BinaryOp::Add, ..)))
            .unwrap();
        let Expr::Binary(_, sum, _) = values[bias].expr else {
            unreachable!()
        };
        let Expr::Binary(_, a, b) = values[sum as usize].expr else {
            unreachable!()
        };
        values[sum as usize].expr = Expr::Binary(BinaryOp::Add, b, a);
        assert!(plan(&kernel).is_none());
        // An input read only at the output's own index, which
        // `pass::donate` may write the output over.
        assert!(plan(&depthwise_then(1, 3, [8, 8], (3, 2), Then::Residual)).is_none());
        // A 4x4 window: 16 taps, a count the machine kernel does not run.
        assert!(plan(&depthwise(1, 3, [8, 8], 4, 1)).is_none());
    }
}
