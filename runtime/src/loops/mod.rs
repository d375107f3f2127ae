//! Loop kernels: how a kernel's loops run, decided once from the kernel and
//! the target's facts, for the CPU (Cranelift) and CUDA (C) renderers to
//! follow. A plan states the loop nests (`crate::nest`), a reduction's
//! strategy (a row at a time, four short rows at once, or neighbouring
//! outputs side by side), which parts run in lanes, and which prologue
//! value a broadcast epilogue reads back instead of computing again. Like
//! `crate::matmul`'s plans, loop kernels print as text, and
//! `tests/loop_kernels.rs` snapshots them for both targets.
//!
//! Still decided while rendering (the next steps): the CPU's versions of a
//! row (its padded ends, and a branch per condition a concatenation picks
//! by) and the lanes of each, which values are computed once per row, and
//! where a row's max or sum becomes a call of 256-bit code.

pub(crate) mod lanes;

use kiln_ir::elementwise::infer_matmul;
use kiln_ir::kernel::{Block, Expr, Kernel, KernelKind, Operand};
use kiln_ir::view::View;
use kiln_ir::{DType, ReduceOp, Scalar, Shape, TensorType};

use crate::nest::{Access, Axis, Nest, Reduction, loads, nest};
use lanes::{f32_arithmetic, vectorizable};

/// What a backend's loops can do, for the decisions a plan makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// Lanes need an instruction for every op of a block (the CPU's f32x4
    /// and i32x4, `lanes::lane_op`); else a lane is a scalar statement, and
    /// any f32 block runs four elements a step between 16-byte loads and
    /// stores (CUDA's `float4`).
    pub vector_ops: bool,
    /// A row of a reduction is combined by a block of threads (a GPU), when
    /// its reduced axes are innermost; else by one thread, in vector lanes
    /// where its block has them (the CPU).
    pub threads_per_row: bool,
    /// A broadcast epilogue reads a value equal to the prologue's result
    /// (softmax's `exp(x - max)`) back from the output row, where the
    /// prologue pass stored it while the row is in cache, instead of
    /// computing it again (the CPU). CUDA computes it again: storing it is
    /// not measured on a GPU yet.
    pub reuse: bool,
}

impl Target {
    /// kiln's CPU code.
    pub const CPU: Target = Target {
        vector_ops: true,
        threads_per_row: false,
        reuse: true,
    };

    /// CUDA C.
    pub const CUDA: Target = Target {
        vector_ops: false,
        threads_per_row: true,
        reuse: false,
    };

    /// How an elementwise kernel storing `out` steps: where lanes need no
    /// instruction per op, four f32 elements a step; where they do, each
    /// stretch of a row as its block allows.
    pub(crate) fn map_vectors(self, out: &TensorType) -> Vectors {
        match self.vector_ops {
            true => Vectors::WhereBlocksAllow,
            false if out.dtype == DType::F32 && out.shape.numel() >= 4 => Vectors::Float4,
            false => Vectors::Scalar,
        }
    }
}

/// A kernel's loops.
pub struct LoopKernel {
    /// The kernel's inputs: buffer `inputs` is the output.
    pub(crate) inputs: usize,
    /// What runs in them.
    pub(crate) kind: Loops,
}

/// The loops of each kind of kernel.
pub(crate) enum Loops {
    /// An elementwise kernel, or a matmul's epilogue over the product.
    Map(Map),
    /// A reduction.
    Reduce(Reduce),
    /// A scatter-add.
    Scatter(Scatter),
}

/// The loops of an elementwise kernel or a matmul's epilogue.
pub(crate) struct Map {
    /// The space it runs over: the output's shape, or for an epilogue over a
    /// reshape of the product (a convolution's `[N, O, H, W]` from `[N, O,
    /// H * W]`) the product's, so that its rows are the product's and follow
    /// the GEMM's row blocks.
    pub(crate) space: Shape,
    /// The body, its reads reshaped to `space`.
    pub(crate) body: Block,
    /// The reads, then the output, over `space`: one flat loop where they
    /// merge to one axis; a matmul's epilogue a row of the last axis each.
    pub(crate) nest: Nest,
    /// A matmul's epilogue, reading the product from the output in place.
    pub(crate) acc: bool,
    /// How it steps.
    pub(crate) vectors: Vectors,
}

/// The loops of a scatter-add: per outer row of the output, its picks in
/// order, each a row of updates along the inner axes.
pub(crate) struct Scatter {
    /// The updates, and the index at value `index`.
    pub(crate) prologue: Block,
    pub(crate) index: u32,
    /// The prologue's reads: a row per (outer row, pick), the inner axes
    /// along it.
    pub(crate) nest: Nest,
    /// Outer rows, picks per outer row, and output positions per outer row.
    pub(crate) outer: usize,
    pub(crate) picks: usize,
    pub(crate) len: usize,
    /// The output's buffer.
    pub(crate) out: usize,
}

/// How a map steps through its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Vectors {
    /// Four f32 elements a step: contiguous f32 reads and the store as
    /// 16-byte vectors, scalar code between them.
    Float4,
    /// One element a step.
    Scalar,
    /// Each stretch of a row in lanes where its block has a vector form for
    /// every value it does not compute once per row
    /// (`lanes::vectorizable_hoisted`).
    WhereBlocksAllow,
}

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
    /// A row's prologue combined in lanes: f32x4 vectors on the CPU, a
    /// block's threads on a GPU.
    pub(crate) lanes: bool,
    /// The epilogue in lanes: over the row (`By::Rows`), or over
    /// neighbouring outputs (`By::Columns`).
    pub(crate) epilogue_lanes: bool,
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

/// The loops of `kernel` on `target`.
pub fn plan(kernel: &Kernel, target: Target) -> LoopKernel {
    let kind = match &kernel.kind {
        KernelKind::Elementwise | KernelKind::MatMul { .. } => Loops::Map(map(kernel, target)),
        KernelKind::Reduce {
            op,
            axes,
            shape,
            prologue,
        } => Loops::Reduce(reduce(kernel, target, (*op, axes, shape, prologue))),
        KernelKind::Scatter {
            axis,
            shape,
            prologue,
            index,
        } => {
            let identity: Vec<usize> = (0..shape.rank()).collect();
            let dims = shape.dims();
            Loops::Scatter(Scatter {
                prologue: prologue.clone(),
                index: *index,
                nest: nest(shape, &identity, Some(axis + 1), &loads(prologue)),
                outer: dims[..*axis].iter().product(),
                picks: dims[*axis],
                len: kernel.out.shape.dims()[*axis],
                out: kernel.inputs.len(),
            })
        }
    };
    LoopKernel {
        inputs: kernel.inputs.len(),
        kind,
    }
}

/// An elementwise kernel, or a matmul's epilogue over the product in place.
fn map(kernel: &Kernel, target: Target) -> Map {
    let out_buffer = kernel.inputs.len();
    let (space, body) =
        product_rows(kernel).unwrap_or_else(|| (kernel.out.shape.clone(), kernel.body.clone()));
    let identity: Vec<usize> = (0..space.rank()).collect();
    let out_view = View::contiguous(&space);
    let mut views = loads(&body);
    views.push((out_buffer, &out_view));
    // A matmul's product is already in the output and its epilogue reads
    // it in place, a row of the output's last axis per unit, so that it
    // can follow the GEMM's row blocks.
    let acc = matches!(kernel.kind, KernelKind::MatMul { .. });
    let split = acc.then(|| space.rank().saturating_sub(1));
    let nest = nest(&space, &identity, split, &views);
    Map {
        vectors: target.map_vectors(&kernel.out),
        space,
        body,
        nest,
        acc,
    }
}

/// For a matmul whose output reshapes the product (a convolution's
/// `[N, O, H, W]` from `[N, groups, O / groups, H * W]`), the product's
/// shape and the epilogue with every read reshaped to it; `None` when the
/// output is the product's shape already or a read does not reshape.
fn product_rows(kernel: &Kernel) -> Option<(Shape, Block)> {
    let KernelKind::MatMul { a, b } = &kernel.kind else {
        return None;
    };
    let operand = |o: &Operand| TensorType::new(DType::F32, o.shape().clone());
    let product = infer_matmul(&operand(a), &operand(b)).ok()?.shape;
    if product == kernel.out.shape || product.numel() != kernel.out.shape.numel() {
        return None;
    }
    let mut body = kernel.body.clone();
    for value in &mut body.values {
        if let Some((_, view)) = value.expr.read_mut() {
            *view = view.reshape(&product)?;
        }
    }
    Some((product, body))
}

/// A reduction: its prologue's nest along the reduced axes, the epilogue's
/// over the output, a prologue value the epilogue reuses, and how its rows
/// run.
fn reduce(
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
    let side: Vec<u32> = kernel.side.iter().map(|s| s.value).collect();
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
            drop_dead_loads(&mut body, &side);
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
    };
    let stores_side = !kernel.side.is_empty();
    if target.threads_per_row {
        threads_per_row(&mut plan);
    } else {
        one_thread_per_row(&mut plan, kernel.out.dtype, stores_side);
    }
    plan
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

/// Makes the loads that neither `block`'s result nor a side output (the
/// values `stored`) depends on constants: a load is an instruction
/// Cranelift keeps even when its value is unused.
fn drop_dead_loads(block: &mut Block, stored: &[u32]) {
    let live = live(block, stored.iter().copied());
    for (v, live) in block.values.iter_mut().zip(live) {
        if !live && v.expr.read().is_some() {
            v.expr = Expr::Const(Scalar::I32(0).cast(v.dtype));
        }
    }
}

/// Which values of `block` its result or a side output (the values
/// `stored`) needs.
pub(crate) fn live(block: &Block, stored: impl IntoIterator<Item = u32>) -> Vec<bool> {
    let mut live = vec![false; block.values.len()];
    if let Some(last) = live.last_mut() {
        *last = true;
    }
    for v in stored {
        live[v as usize] = true;
    }
    for i in (0..block.values.len()).rev() {
        if live[i] {
            for x in block.values[i].expr.operands() {
                live[x as usize] = true;
            }
        }
    }
    live
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

impl std::fmt::Display for LoopKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let buffer = |b: usize| match b == self.inputs {
            true => "out".to_string(),
            false => format!("in{b}"),
        };
        let nest = |f: &mut std::fmt::Formatter<'_>, what: &str, n: &Nest| {
            writeln!(f, "  {what}: {} rows of {:?}", n.rows, n.inner)?;
            n.accesses
                .iter()
                .try_for_each(|a| writeln!(f, "    {}", access(a, &buffer(a.buffer))))
        };
        let lanes = |on: bool| if on { "in lanes" } else { "one at a time" };
        match &self.kind {
            Loops::Map(m) => {
                let of = if m.acc { "epilogue over" } else { "map over" };
                let steps = match m.vectors {
                    Vectors::Float4 => "four elements a step",
                    Vectors::Scalar => "one element a step",
                    Vectors::WhereBlocksAllow => "in lanes where a stretch's block allows",
                };
                writeln!(f, "{of} {}, {steps}", m.space)?;
                nest(f, "loops", &m.nest)
            }
            Loops::Reduce(r) => {
                let axes: Vec<usize> = r.reduction.reduced.iter().map(|a| a.0).collect();
                let output = if r.broadcast { "broadcast" } else { "reduced" };
                writeln!(
                    f,
                    "reduce {:?} along axes {axes:?}: {} rows of {}, output {output}",
                    r.op,
                    r.reduction.rows(),
                    r.reduction.row_len()
                )?;
                write!(
                    f,
                    "  by {:?}, prologue {}, epilogue {}",
                    r.by,
                    lanes(r.lanes),
                    lanes(r.epilogue_lanes)
                )?;
                match r.reused {
                    Some(v) => writeln!(f, ", value {v} read back from out")?,
                    None => writeln!(f)?,
                }
                nest(f, "prologue", &r.pro)?;
                nest(f, "epilogue", &r.epi)
            }
            Loops::Scatter(s) => {
                writeln!(
                    f,
                    "scatter-add: {} outer rows of {} picks into {}",
                    s.outer, s.picks, s.len
                )?;
                nest(f, "updates", &s.nest)
            }
        }
    }
}

/// An access as text: its buffer and offset, the strides over the rows and
/// along the row, and its fill where padded.
fn access(a: &Access, buffer: &str) -> String {
    let strides = |axes: &[Axis]| -> Vec<i64> { axes.iter().map(|x| x.stride).collect() };
    let fill = a
        .fill
        .map(|c| format!(", padded with {c}"))
        .unwrap_or_default();
    format!(
        "{buffer} at {:+}: rows {:?}, along {:?}{fill}",
        a.offset,
        strides(&a.outer),
        strides(&a.inner)
    )
}
