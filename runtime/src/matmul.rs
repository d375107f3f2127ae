//! The plan of a matmul kernel, made once when it is compiled, for every
//! backend: where the GEMM reads each operand (a kernel input in place, or
//! scratch that a prologue kernel writes first), what the GEMM stores
//! (`Epilogue`), and the scratch it needs. A backend states what its GEMM
//! takes (`Target`); every decision is made here, and the backends render
//! the plan: the CPU with kiln's cores, CUDA with cuBLASLt or cuBLAS
//! between generated kernels.

use kiln_ir::kernel::{Block, Expr, Kernel, KernelKind, Operand};
use kiln_ir::view::View;
use kiln_ir::{BinaryOp, DType, Scalar, Shape, TensorType, UnaryOp};

use crate::Error;
use crate::nest::nest;

mod bf16;

/// What a backend's GEMM takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// It reads any view in place, axes merged without one stride included
    /// (through tables of offsets: kiln's cores); else only a matrix with
    /// one unit stride and batches of one stride (`blas`), and other views
    /// are copied into scratch first.
    pub any_view: bool,
    /// It adds a bias and applies ReLU as it stores the product (kiln's
    /// cores, cuBLASLt's epilogues), rather than a kernel after.
    pub bias_epilogue: bool,
    /// It adds a bias of one value per row of the product, as a
    /// convolution's is (kiln's cores), as well as one per column (a linear
    /// layer's).
    pub row_bias: bool,
    /// It caps the result at a constant (ReLU6's 6) after the bias and
    /// ReLU (kiln's cores).
    pub cap: bool,
    /// It applies ReLU and the cap to a product without a bias as well
    /// (kiln's cores).
    pub activation_alone: bool,
    /// An epilogue kernel reads the product from scratch (a CUDA kernel
    /// after the GEMM); else from the output, where the GEMM stored it,
    /// writing over it (the CPU's kernel, row block by row block), and
    /// from scratch where the output cannot hold it
    /// (`Kernel::holds_product`).
    pub product_in_scratch: bool,
    /// A prologue that reads its source down columns writes the operand
    /// transposed, so that it reads and writes along rows
    /// (`reads_down_columns`).
    pub transposes: bool,
    /// Scratch parts start at multiples of this many bytes.
    pub align: usize,
    /// It multiplies bf16 operands read in place, summing in f32 (kiln's
    /// cores, which widen them as they pack them or multiply them on AMX;
    /// cuBLASLt), which then take the place of the f32 operands
    /// `pass::widen` casts them into; as any view, where `any_view`.
    pub bf16: bool,
    /// It rounds a product of bf16 operands to bf16 as it stores it, where
    /// that is all the kernel's output is (cuBLASLt's bf16 result), rather
    /// than leaving it to a kernel after.
    pub stores_bf16: bool,
    /// Its bf16 products outrun its f32 ones (cuBLASLt's tensor cores, AMX
    /// tiles), so that operands a prologue rounds to bf16 (mixed
    /// precision's) are written as bf16 for them; else as f32, rounded, for
    /// the f32 GEMM, which kiln's AVX cores run faster than they widen bf16
    /// (`benches/RESULTS-cpu.md`).
    pub bf16_faster: bool,
}

impl Target {
    /// kiln's CPU cores.
    pub const CPU: Target = Target {
        any_view: true,
        bias_epilogue: true,
        row_bias: true,
        cap: true,
        activation_alone: true,
        product_in_scratch: false,
        transposes: true,
        align: 4,
        bf16: true,
        stores_bf16: false,
        bf16_faster: false,
    };

    /// kiln's CPU cores on `isa`'s path: bf16 faster on AMX.
    pub fn cpu(isa: kiln_machine::Isa) -> Target {
        Target {
            bf16_faster: isa == kiln_machine::Isa::Amx,
            ..Target::CPU
        }
    }

    /// cuBLASLt in TF32 (`fused`), bf16 operands as they are, or cuBLAS's
    /// IEEE `sgemm`, which has no epilogue and multiplies f32 alone;
    /// scratch parts aligned for `float4` accesses.
    pub fn cuda(fused: bool) -> Target {
        Target {
            any_view: false,
            bias_epilogue: fused,
            // cuBLASLt's bias is one per row of its column-major output:
            // per column of kiln's row-major product.
            row_bias: false,
            cap: false,
            activation_alone: false,
            product_in_scratch: true,
            transposes: false,
            align: 256,
            bf16: fused,
            stores_bf16: fused,
            bf16_faster: fused,
        }
    }
}

/// A matmul kernel as a GEMM: `out[batch] = a[batch] @ b[batch]`, each
/// `[m, k] @ [k, n]`, between prologues and an epilogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Products.
    pub batches: usize,
    /// Rows of each product.
    pub m: usize,
    /// Columns of each product.
    pub n: usize,
    /// The shared dimension.
    pub k: usize,
    /// The left operand, `[.., m, k]`.
    pub a: PlanOperand,
    /// The right operand, `[.., k, n]`.
    pub b: PlanOperand,
    /// What becomes of the product.
    pub epilogue: Epilogue,
    /// Bytes of scratch: the written operands, then the product where an
    /// epilogue kernel reads it from there.
    pub scratch_bytes: usize,
}

/// One operand of the GEMM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanOperand {
    /// As the GEMM reads it: `[batch axes.., rows, cols]`.
    pub shape: Shape,
    /// Its elements' type: f32, or bf16 where the target multiplies bf16
    /// (`Target::bf16`).
    pub dtype: DType,
    /// Where it lies.
    pub source: Source,
}

/// Where a GEMM operand lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Kernel input `input`, read in place through `view`, whose axes
    /// merge into the operand's where they differ from them.
    Input {
        /// The kernel input.
        input: u32,
        /// Its elements in the operand's order.
        view: View,
    },
    /// Scratch from byte `at`, written by `prologue` (an elementwise
    /// kernel over the matmul kernel's inputs) before the product: the
    /// operand's elements in order, or with its last two axes swapped
    /// (`transposed`).
    Written {
        /// The kernel that writes it.
        prologue: Box<Kernel>,
        /// Whether it writes the operand transposed.
        transposed: bool,
        /// Where in scratch.
        at: usize,
    },
}

impl Plan {
    /// Where an epilogue kernel reads the product: scratch from this byte,
    /// or the output (`None`, as for every other epilogue).
    pub fn product_at(&self) -> Option<usize> {
        match self.epilogue {
            Epilogue::Kernel { acc } => acc,
            Epilogue::Product | Epilogue::Bias { .. } => None,
        }
    }
}

impl PlanOperand {
    /// The view the product reads the operand through, in the operand's
    /// shape: an input's own, or a written operand's over what its
    /// prologue wrote.
    pub fn view(&self) -> View {
        match &self.source {
            Source::Input { view, .. } => view.clone(),
            Source::Written {
                transposed: true, ..
            } => View::contiguous(&swapped_shape(&self.shape))
                .permute(&swapped_axes(self.shape.rank())),
            Source::Written {
                transposed: false, ..
            } => View::contiguous(&self.shape),
        }
    }
}

/// The plan in a few lines, as its snapshots show it:
/// `2 x [4, 5] @ [5, 6]`, then each operand (`a f32[2,4,5]: input 0
/// strides [20,5,1]`, or `written at byte 0 by a 3-value prologue, as
/// f32[..]`, `transposed`), then the epilogue and the scratch.
impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (b, m, n, k) = (self.batches, self.m, self.n, self.k);
        writeln!(f, "{b} x [{m}, {k}] @ [{k}, {n}]")?;
        for (name, o) in [("a", &self.a), ("b", &self.b)] {
            write!(f, "{name} {}: ", TensorType::new(o.dtype, o.shape.clone()))?;
            match &o.source {
                Source::Input { input, view } => writeln!(f, "input {input} {view}")?,
                Source::Written {
                    prologue,
                    transposed,
                    at,
                } => writeln!(
                    f,
                    "written at byte {at} by a {}-value prologue, as {}{}",
                    prologue.body.values.len(),
                    prologue.out,
                    if *transposed { ", transposed" } else { "" }
                )?,
            }
        }
        writeln!(
            f,
            "epilogue {:?}, {} scratch bytes",
            self.epilogue, self.scratch_bytes
        )
    }
}

/// What becomes of the product.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// It is the output: the kernel's body is its `acc`, or that rounded
    /// to the output's bf16 (`Target::stores_bf16`).
    Product,
    /// The GEMM adds kernel input `bias`, if there is one (one value per
    /// column of the product, broadcast over its rows and batches, or with
    /// `rows` one per row, broadcast over its columns and batches: a
    /// convolution's, per output channel) as it stores it, then ReLU if
    /// `relu`, then the lesser of that and `cap` if there is one (ReLU6).
    Bias {
        /// The kernel input holding the bias.
        bias: Option<u32>,
        /// Whether ReLU follows.
        relu: bool,
        /// The bits of the f32 the result is capped at: finite, not zero
        /// (so that the sign of a zero never matters to it).
        cap: Option<u32>,
        /// Whether the bias holds a value per row, not per column.
        rows: bool,
    },
    /// The kernel's body computes the output from the product: read from
    /// scratch at byte `acc`, or from the output where `acc` is `None`.
    Kernel {
        /// Where the product is.
        acc: Option<usize>,
    },
}

/// The plan of matmul `kernel` for `target`.
pub fn plan(kernel: &Kernel, target: Target) -> Result<Plan, Error> {
    let KernelKind::MatMul { a, b } = &kernel.kind else {
        return Err(crate::codegen(crate::label(kernel), "not a matmul kernel"));
    };
    let (ad, bd) = (a.shape().dims(), b.shape().dims());
    let (ra, rb) = (ad.len(), bd.len());
    if ra < 2 || rb < 2 {
        return Err(crate::codegen(
            crate::label(kernel),
            format!(
                "matmul operands {} and {} have no matrix",
                a.shape(),
                b.shape()
            ),
        ));
    }
    let (m, k, n) = (ad[ra - 2], ad[ra - 1], bd[rb - 1]);
    let batches = kernel.out.shape.numel() / (m * n).max(1);
    if let Some(plan) = bf16::plan(kernel, target, (batches, m, n, k)) {
        return Ok(plan);
    }
    let mut scratch = 0;
    let mut operand = |o: &Operand| {
        let shape = o.shape().clone();
        let source = match o {
            Operand::Read { input, view } if target.any_view || blas(view).is_some() => {
                Source::Input {
                    input: *input,
                    view: view.clone(),
                }
            }
            Operand::Merged { input, view, .. } if target.any_view => Source::Input {
                input: *input,
                view: view.clone(),
            },
            _ => prologue_source(kernel, o, DType::F32, target, &mut scratch),
        };
        PlanOperand {
            shape,
            dtype: DType::F32,
            source,
        }
    };
    let (a, b) = (operand(a), operand(b));
    let epilogue = match stored(kernel, m, n) {
        Some(stored) if applies(&stored, target, k) => stored,
        _ => kernel_epilogue(kernel, target, &mut scratch),
    };
    Ok(Plan {
        batches,
        m,
        n,
        k,
        a,
        b,
        epilogue,
        scratch_bytes: scratch,
    })
}

/// The epilogue as a kernel after the GEMM, reading the product from
/// scratch from byte `*scratch` (moved past it) where `target` keeps it
/// there or the output cannot hold it, else from the output.
fn kernel_epilogue(kernel: &Kernel, target: Target, scratch: &mut usize) -> Epilogue {
    let apart = target.product_in_scratch || !kernel.holds_product();
    Epilogue::Kernel {
        acc: apart.then(|| {
            let acc = *scratch;
            *scratch += kernel.out.shape.numel() * DType::F32.size();
            acc
        }),
    }
}

/// Operand `o` of `kernel` written into scratch from byte `*scratch` (moved
/// past it) as `dtype` by a prologue, for `target`'s GEMM.
fn prologue_source(
    kernel: &Kernel,
    o: &Operand,
    dtype: DType,
    target: Target,
    scratch: &mut usize,
) -> Source {
    let (body, written, transposed) = written(o, target);
    let at = *scratch;
    *scratch = (at + written.numel() * dtype.size()).next_multiple_of(target.align);
    let prologue = Box::new(Kernel {
        inputs: kernel.inputs.clone(),
        out: TensorType::new(dtype, written),
        kind: KernelKind::Elementwise,
        body,
        side: Vec::new(),
    });
    Source::Written {
        prologue,
        transposed,
        at,
    }
}

/// Whether `target`'s GEMM applies `epilogue` itself to a product of depth
/// `k`. With k = 0 the product is zeros, which a runtime may write without
/// a GEMM (CUDA does): the bias then needs the kernel.
fn applies(epilogue: &Epilogue, target: Target, k: usize) -> bool {
    match *epilogue {
        Epilogue::Product => true,
        Epilogue::Bias {
            bias, rows, cap, ..
        } => {
            target.bias_epilogue
                && k > 0
                && (!rows || target.row_bias)
                && (cap.is_none() || target.cap)
                && (bias.is_some() || target.activation_alone)
        }
        Epilogue::Kernel { .. } => false,
    }
}

/// What the prologue of operand `o` writes: its block, the shape it
/// writes, and whether that is the operand transposed. A computed operand
/// is its own block; a view the target cannot read in place is copied, in
/// its own (perhaps finer) shape: the operand's elements in its order.
fn written(o: &Operand, target: Target) -> (Block, Shape, bool) {
    match o {
        Operand::Computed { block, shape } => {
            if target.transposes && reads_down_columns(block, shape.rank()) {
                let swap = swapped_axes(shape.rank());
                let mut block = block.clone();
                for v in &mut block.values {
                    if let Some((_, view)) = v.expr.read_mut() {
                        *view = view.permute(&swap);
                    }
                }
                (block, swapped_shape(shape), true)
            } else {
                (block.clone(), shape.clone(), false)
            }
        }
        Operand::Read { input, view } | Operand::Merged { input, view, .. } => {
            let mut copy = Block::default();
            copy.push(
                Expr::Load {
                    input: *input,
                    view: view.clone(),
                },
                DType::F32,
            );
            (copy, view.shape.clone(), false)
        }
    }
}

/// Whether a computed operand's reads run down its columns and none along
/// its rows (the input of a weight gradient, `xᵀ @ g`, cast or normalized on
/// the way): written in that order, the prologue reads and writes
/// contiguous rows, in vectors, where the operand's own order would gather
/// every element from a row of its source apart (the normalized `xᵀ` of
/// the training step's first layer, 784x250 from u8, took longer on the
/// CPU: `benches/RESULTS-cpu.md`).
fn reads_down_columns(block: &Block, rank: usize) -> bool {
    if rank < 2 {
        return false;
    }
    let mut down = false;
    for v in &block.values {
        if let Some((_, view)) = v.expr.read() {
            match (view.strides[rank - 2], view.strides[rank - 1]) {
                (_, 1) => return false,
                (1, _) => down = true,
                _ => {}
            }
        }
    }
    down
}

/// The permutation that swaps the last two of `rank` axes.
fn swapped_axes(rank: usize) -> Vec<usize> {
    let mut axes: Vec<usize> = (0..rank).collect();
    if rank >= 2 {
        axes.swap(rank - 2, rank - 1);
    }
    axes
}

fn swapped_shape(shape: &Shape) -> Shape {
    Shape(
        swapped_axes(shape.rank())
            .iter()
            .map(|&a| shape.dims()[a])
            .collect(),
    )
}

/// An operand as BLAS steps through it, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    /// The element of coordinates zero.
    pub offset: usize,
    /// Between neighbouring rows.
    pub row: usize,
    /// Between neighbouring columns.
    pub col: usize,
    /// Between batches (0 broadcasts one matrix to every batch).
    pub batch: usize,
}

/// `view` as BLAS takes an operand: unmasked, one unit stride (or a single
/// row or column) and the other a leading dimension that does not overlap
/// it, and batch axes that merge into one stride; `None` otherwise.
pub fn blas(view: &View) -> Option<Strides> {
    if view.mask.is_some() || view.offset < 0 {
        return None;
    }
    let d = view.shape.dims();
    let r = d.len();
    if r < 2 {
        return None;
    }
    let (rows, cols) = (d[r - 2], d[r - 1]);
    // Size-1 axes have stride 0 in canonical views; any stride serves them.
    let row = if rows == 1 { cols } else { view.strides[r - 2] };
    let col = if cols == 1 { 1 } else { view.strides[r - 1] };
    // A matrix broadcast along rows or columns overlaps itself.
    let leading = if col == 1 {
        rows == 1 || row >= cols
    } else {
        row == 1 && (cols == 1 || col >= rows)
    };
    if !leading {
        return None;
    }
    // A loop nest over the batch axes alone merges them into one.
    let batch_axes: Vec<usize> = (0..r - 2).collect();
    let batch = nest(&view.shape, &batch_axes, Some(r - 2), &[(0, view)]);
    let batch = &batch.accesses[0].outer;
    if batch.len() > 1 {
        return None;
    }
    Some(Strides {
        offset: view.offset as usize,
        row,
        col,
        batch: batch.first().map_or(0, |b| b.stride as usize),
    })
}

/// The epilogue a GEMM can apply itself as it stores the product of a
/// matmul `kernel` of `m` rows and `n` columns, where it writes no side
/// output: `Product` when its body is the product, `Bias` when it is a bias
/// over the product's rows or columns, then ReLU (or the max with +0, the
/// same values) and a cap (the min with a constant), each if there is one
/// (and at least one of the three); `None` otherwise.
fn stored(kernel: &Kernel, m: usize, n: usize) -> Option<Epilogue> {
    if !kernel.side.is_empty() {
        return None;
    }
    // The product in order is the output, whatever the output's shape (a
    // convolution's NCHW).
    if let [acc] = kernel.body.values.as_slice()
        && acc.expr == Expr::Acc
    {
        return Some(Epilogue::Product);
    }
    let out = kernel.out.shape.dims();
    let is_bias = |e: &Expr| match e {
        Expr::Load { input, view } if view.mask.is_none() && view.offset == 0 => {
            bias_along(out, &view.strides, m, n).map(|rows| (*input, rows))
        }
        _ => None,
    };
    let [acc, rest @ ..] = kernel.body.values.as_slice() else {
        return None;
    };
    if acc.expr != Expr::Acc {
        return None;
    }
    if let [bias, add, after @ ..] = rest
        && let Some((bias, rows)) = is_bias(&bias.expr)
    {
        let added = matches!(
            add.expr,
            Expr::Binary(BinaryOp::Add, 0, 1) | Expr::Binary(BinaryOp::Add, 1, 0)
        );
        let (relu, cap) = activation(after, 2)?;
        return added.then_some(Epilogue::Bias {
            bias: Some(bias),
            relu,
            rows,
            cap,
        });
    }
    // ReLU or a cap alone (a convolution whose bias folded away).
    match activation(rest, 0)? {
        (false, None) => None,
        (relu, cap) => Some(Epilogue::Bias {
            bias: None,
            relu,
            rows: false,
            cap,
        }),
    }
}

/// The ReLU and the cap of a body's values after value `x` (a matmul's
/// bias addition or product, a depthwise convolution's sum: `cpu::taps`),
/// `rest` being values `x + 1..` to the body's end: `relu(x)` or
/// `max(x, +0)`, then `min(x, c)` with a finite constant `c` other than
/// zero, each if there; `None` for anything else.
pub(crate) fn activation(rest: &[kiln_ir::kernel::Value], x: u32) -> Option<(bool, Option<u32>)> {
    let constant = |v: &kiln_ir::kernel::Value| match v.expr {
        Expr::Const(Scalar::F32(c)) => Some(c),
        _ => None,
    };
    let of = |e: &Expr, op: BinaryOp, x: u32| {
        *e == Expr::Binary(op, x, x + 1) || *e == Expr::Binary(op, x + 1, x)
    };
    let (relu, last, rest) = match rest {
        [r, tail @ ..] if r.expr == Expr::Unary(UnaryOp::Relu, x) => (true, x + 1, tail),
        // +0 exactly: the max with -0 keeps a -0.
        [c, m, tail @ ..]
            if constant(c).is_some_and(|c| c.to_bits() == 0) && of(&m.expr, BinaryOp::Max, x) =>
        {
            (true, x + 2, tail)
        }
        _ => (false, x, rest),
    };
    match rest {
        [] => Some((relu, None)),
        [c, m] if of(&m.expr, BinaryOp::Min, last) => {
            let cap = constant(c).filter(|c| c.is_finite() && *c != 0.0)?;
            Some((relu, Some(cap.to_bits())))
        }
        _ => None,
    }
}

/// Whether a read through `strides` over an output of `dims` (the
/// products of `m x n`, batch after batch, in order) reads element `j` at
/// column `j` of every row (`Some(false)`) or element `i` at row `i` of
/// every column (`Some(true)`), the same in every batch; `None` if neither.
fn bias_along(dims: &[usize], strides: &[usize], m: usize, n: usize) -> Option<bool> {
    // Innermost first; an axis of one element reads the same at any stride.
    let axes: Vec<(usize, usize)> = (dims.iter().zip(strides).rev())
        .filter(|(d, _)| **d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    // The axes from `from` on that make up `extent` elements, each stepping
    // through them in order where `counts`, each still where not: the
    // position after them, if they do.
    let span = |from: usize, extent: usize, counts: bool| -> Option<usize> {
        let (mut at, mut covered) = (from, 1);
        while covered < extent {
            let &(d, s) = axes.get(at)?;
            if s != if counts { covered } else { 0 } {
                return None;
            }
            covered *= d;
            at += 1;
        }
        (covered == extent).then_some(at)
    };
    // Per column: the columns' axes step through the bias, every other
    // axis stays (however rows and batches share axes). Per row: the
    // columns' axes stay, the rows' step through it, the batches' stay.
    let rest_still = |at: usize| axes[at..].iter().all(|&(_, s)| s == 0);
    let fits = |rows: bool| match rows {
        false => span(0, n, true).is_some_and(rest_still),
        true => (span(0, n, false).and_then(|at| span(at, m, true))).is_some_and(rest_still),
    };
    [false, true].into_iter().find(|&rows| fits(rows))
}
