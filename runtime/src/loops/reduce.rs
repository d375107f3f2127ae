//! A reduction's loops: its nests, the prologue value a broadcast
//! epilogue reads back, how its rows run on each target, and what a row
//! computes once.

use kiln_ir::kernel::{Block, Expr, Kernel};
use kiln_ir::view::View;
use kiln_ir::{DType, ReduceOp, Shape};

use super::hoist::{constant_dead_reads, hoisted};
use super::lanes::{f32_arithmetic, vectorizable};
use super::{Target, side_values};
use crate::nest::{Access, Nest, Reduction, loads, nest};

/// The loops of a reduction.
pub(crate) struct Reduce {
    /// How values combine.
    pub(crate) op: ReduceOp,
    /// Its rows: the kept axes, and the reduced axes along each row.
    pub(crate) reduction: Reduction,
    /// The values combined, over the reduction's space.
    pub(crate) prologue: Block,
    /// The epilogue, from the combined value: over the output, which is the
    /// whole space (`broadcast`: softmax's) or the reduced values.
    pub(crate) body: Block,
    /// The prologue's reads over the reduction's rows.
    pub(crate) pro: Nest,
    /// The epilogue's reads, then the output: over the same rows when
    /// `broadcast`, else one element a row.
    pub(crate) epi: Nest,
    /// The epilogue runs over the row again, as its output is the space.
    pub(crate) broadcast: bool,
    /// The value of the body read back from the output row, where the
    /// prologue stored its result (`Target::reuse`), and how `body` reads
    /// it there.
    pub(crate) reused: Option<usize>,
    /// How its rows run.
    pub(crate) by: By,
    /// A row's prologue combined in lanes along it, where a row runs alone
    /// (`By::Rows`, and the rows `By::FourRows` leaves): f32x4 vectors on
    /// the CPU, a block's threads on a GPU. (`By::FourRows` and
    /// `By::Columns` run rows side by side, a row a lane, by definition.)
    pub(crate) lanes: bool,
    /// The epilogue in lanes: along the row where a row runs alone, over
    /// four neighbouring outputs in `By::Columns`.
    pub(crate) epilogue_lanes: bool,
    /// What a row computes once (empty on a target that does not hoist,
    /// and for `By::Columns`).
    pub(crate) once: Once,
}

/// The values of a reduction computed once for a row or for four rows
/// (`hoist::hoisted`), before the loops along them.
#[derive(Default)]
pub(crate) struct Once {
    /// The prologue's, at a row.
    pub(crate) prologue: Vec<bool>,
    /// The epilogue's, from the row's combined value.
    pub(crate) epilogue: Vec<bool>,
    /// A prologue of several inner axes walked one run of the last axis
    /// after another, one element at a time: each run a row of its own,
    /// whose constant values are computed once for it, where a flat loop
    /// over the row computed them for every element (the training step's
    /// loss over [batch, classes] took the log of each row's sum for every
    /// class: `benches/RESULTS-cpu.md`).
    pub(crate) runs: Option<Runs>,
    /// `By::FourRows`: the prologue's and the epilogue's for four rows.
    pub(crate) four: Four,
}

/// What four rows at once compute once (`By::FourRows`).
#[derive(Default)]
pub(crate) struct Four {
    pub(crate) prologue: Vec<bool>,
    pub(crate) epilogue: Vec<bool>,
}

/// The runs of a row (`Once::runs`).
pub(crate) struct Runs {
    /// The prologue's reads over runs: the inner axes but the last are
    /// axes of the runs.
    pub(crate) accesses: Vec<Access>,
    /// Values computed once per run, the row's among them.
    pub(crate) hoisted: Vec<bool>,
}

/// How a reduction's rows run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum By {
    /// A row at a time, its elements combined along it (`Reduce::lanes`).
    Rows,
    /// Four rows at a time, one per lane, each walked element by element:
    /// along rows this short vectors have too little to do. Fewer than four
    /// rows left run as `Rows`.
    FourRows,
    /// Neighbouring outputs side by side, each walking its reduced axes:
    /// four rows a vector accumulated in place on the CPU (a sum over a
    /// leading axis, whose rows are neighbours in memory), a thread per
    /// output on a GPU.
    Columns,
}

/// Rows of a reduction up to this long run four at a time (`By::FourRows`):
/// along such a row there is too little for vectors to do, and each row's
/// chain of reduction, horizontal sum and epilogue would wait on the last.
const SHORT_ROW: usize = 15;

/// A reduction: its prologue's nest along the reduced axes, the epilogue's
/// over the output, a prologue value the epilogue reuses, and how its rows
/// run.
pub(super) fn reduce(
    kernel: &Kernel,
    target: Target,
    (op, axes, shape, prologue): (ReduceOp, &[usize], &Shape, &Block),
) -> Reduce {
    let out_buffer = kernel.inputs.len();
    let space = &kernel.out.shape;
    let reduction = Reduction::new(shape, axes);
    let pro = reduction.nest(shape, &loads(prologue));
    let broadcast = space == shape;
    let out_view = View::contiguous(space);
    let side = side_values(kernel);
    let mut reused = (target.reuse && broadcast)
        .then(|| recomputed(prologue, &kernel.body))
        .flatten();
    // Four prologue lanes are stored as one vector: only into a contiguous row.
    if reused.is_some() {
        let out_nest = reduction.nest(space, &[(out_buffer, &out_view)]);
        if vectorizable(prologue, &pro.accesses, None) && !out_nest.accesses[0].unit_stride() {
            reused = None;
        }
    }
    let body = match reused {
        Some(i) => {
            let mut body = kernel.body.clone();
            body.values[i].expr = Expr::Load {
                input: out_buffer as u32,
                view: out_view.clone(),
            };
            constant_dead_reads(&mut body, &side);
            body
        }
        None => kernel.body.clone(),
    };
    let mut views = loads(&body);
    views.push((out_buffer, &out_view));
    let epi = if broadcast {
        reduction.nest(space, &views)
    } else {
        let all: Vec<usize> = (0..space.rank()).collect();
        nest(space, &all, Some(space.rank()), &views)
    };
    let mut plan = Reduce {
        op,
        reduction,
        prologue: prologue.clone(),
        body,
        pro,
        epi,
        broadcast,
        reused,
        by: By::Rows,
        lanes: false,
        epilogue_lanes: false,
        once: Once::default(),
    };
    let stores_side = !kernel.side.is_empty();
    if target.threads_per_row {
        threads_per_row(&mut plan);
    } else {
        one_thread_per_row(&mut plan, kernel.out.dtype, stores_side);
    }
    if target.hoists && plan.by != By::Columns {
        plan.once = once(&plan);
    }
    plan
}

/// What a reduction's rows compute once (`Once`): reads constant along
/// the row, and in the epilogue the row's combined value and what follows
/// from it (log_softmax's `log(sum)`).
fn once(r: &Reduce) -> Once {
    let keep = Access::row_invariant;
    let inner_len: usize = r.pro.inner.iter().product();
    let epi_reads = &r.epi.accesses[..r.epi.accesses.len() - 1];
    let prologue = hoisted(
        &r.prologue,
        &r.pro.accesses,
        (inner_len, true),
        (false, &[]),
        keep,
    );
    // A reduced output's epilogue runs once per row, whatever the inner extent.
    let extent = if r.broadcast { inner_len } else { 1 };
    let epilogue = hoisted(&r.body, epi_reads, (extent, true), (true, &[]), keep);
    let runs =
        (!r.lanes && r.reused.is_none() && r.pro.inner.len() >= 2 && inner_len > 0).then(|| {
            let accesses: Vec<Access> = (r.pro.accesses.iter())
                .map(|a| {
                    let (across, along) = a.inner.split_at(a.inner.len() - 1);
                    Access {
                        outer: a.outer.iter().chain(across).copied().collect(),
                        inner: along.to_vec(),
                        ..a.clone()
                    }
                })
                .collect();
            let along = r.pro.inner[r.pro.inner.len() - 1];
            let hoisted = hoisted(
                &r.prologue,
                &accesses,
                (along, true),
                (false, &prologue),
                keep,
            );
            Runs { accesses, hoisted }
        });
    let four = match r.by {
        By::FourRows => Four {
            prologue: hoisted(
                &r.prologue,
                &r.pro.accesses,
                (inner_len, false),
                (false, &[]),
                keep,
            ),
            epilogue: hoisted(&r.body, epi_reads, (inner_len, false), (true, &[]), keep),
        },
        By::Rows | By::Columns => Four::default(),
    };
    Once {
        prologue,
        epilogue,
        runs,
        four,
    }
}

/// A GPU's strategy: a block of threads to a row when the reduced axes are
/// innermost and more than one element long, so that reads coalesce along
/// the row; else a thread per output walking the reduced axes, so that
/// neighbouring threads read neighbouring columns. Size-1 axes take no
/// place in memory: `[c, 1]` summed over axis 0 is a row.
fn threads_per_row(r: &mut Reduce) {
    let innermost = r.reduction.reduced.last().map(|a| a.0)
        == r.reduction
            .kept
            .iter()
            .chain(&r.reduction.reduced)
            .map(|a| a.0)
            .max();
    let rows = !r.reduction.reduced.is_empty() && innermost && r.reduction.row_len() > 1;
    (r.by, r.lanes, r.epilogue_lanes) = match rows {
        true => (By::Rows, true, r.broadcast),
        false => (By::Columns, false, false),
    };
}

/// The CPU's strategy, one thread to a row: `By::Columns` where the
/// prologue cannot run four inner elements at once but steps through rows
/// contiguously (a sum over a leading axis) and the output is f32 (its rows
/// accumulate in place); `By::FourRows` for short rows of f32 arithmetic
/// (side outputs are stored a row at a time); else `By::Rows`, in lanes
/// where the block has them.
fn one_thread_per_row(r: &mut Reduce, out: DType, stores_side: bool) {
    let epi_reads = &r.epi.accesses[..r.epi.accesses.len() - 1];
    r.lanes = vectorizable(&r.prologue, &r.pro.accesses, None);
    let columns = !r.broadcast
        && !r.lanes
        && f32_arithmetic(&r.prologue)
        && out == DType::F32
        && !r.pro.accesses.is_empty()
        && r.pro.accesses.iter().all(|a| {
            a.fill.is_none()
                && a.outer
                    .last()
                    .is_some_and(|o| o.stride == 0 || o.stride == 1)
        });
    let inner_len: usize = r.pro.inner.iter().product();
    let four_rows = !columns
        && !stores_side
        && r.reused.is_none()
        && (2..=SHORT_ROW).contains(&inner_len)
        && r.pro.rows >= 4
        && f32_arithmetic(&r.prologue)
        && f32_arithmetic(&r.body)
        && r.pro
            .accesses
            .iter()
            .chain(&r.epi.accesses)
            .all(|a| a.fill.is_none());
    if columns {
        // An epilogue of arithmetic alone runs four rows at a time on the
        // sums in place; one that reads (an optimizer's state) or stores
        // side outputs, one row at a time, its reads placed at the row.
        r.by = By::Columns;
        r.epilogue_lanes = f32_arithmetic(&r.body)
            && !stores_side
            && !r.body.values.iter().any(|v| v.expr.read().is_some());
    } else {
        r.by = if four_rows { By::FourRows } else { By::Rows };
        r.epilogue_lanes = r.broadcast && vectorizable(&r.body, epi_reads, r.epi.accesses.last());
    }
}

/// The position of a value of `body` that computes exactly the prologue's
/// result (same ops on the same loads), if it is an f32 like the output.
fn recomputed(prologue: &Block, body: &Block) -> Option<usize> {
    fn same(p: &Block, i: u32, b: &Block, j: u32) -> bool {
        let (x, y) = (&p.values[i as usize], &b.values[j as usize]);
        let operands_same = || {
            let (xo, yo) = (x.expr.operands(), y.expr.operands());
            xo.len() == yo.len() && xo.iter().zip(&yo).all(|(&a, &c)| same(p, a, b, c))
        };
        x.dtype == y.dtype
            && match (&x.expr, &y.expr) {
                (Expr::Load { .. }, Expr::Load { .. }) | (Expr::Const(_), Expr::Const(_)) => {
                    x.expr == y.expr
                }
                (Expr::Unary(a, _), Expr::Unary(c, _)) => a == c && operands_same(),
                (Expr::Binary(a, _, _), Expr::Binary(c, _, _)) => a == c && operands_same(),
                (Expr::Where(..), Expr::Where(..)) | (Expr::Cast(_), Expr::Cast(_)) => {
                    operands_same()
                }
                _ => false,
            }
    }
    let last = prologue.values.len().checked_sub(1)? as u32;
    if prologue.values[last as usize].dtype != DType::F32 || body.dtype() != Some(DType::F32) {
        return None;
    }
    // Worth it only for a computed value, not a plain load.
    if matches!(
        prologue.values[last as usize].expr,
        Expr::Load { .. } | Expr::Const(_)
    ) {
        return None;
    }
    (0..body.values.len() as u32)
        .find(|&j| same(prologue, last, body, j))
        .map(|j| j as usize)
}
