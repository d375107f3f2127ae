//! CUDA C from the kernel IR: one `__global__` function per kernel, with
//! shapes and strides baked in as constants (a kernel is specialized to its
//! types, as the CPU backend's are), for NVRTC to compile.
//!
//! - Elementwise kernels run a grid-stride loop over the output. When the
//!   output is f32 every step computes four elements: reads of a contiguous
//!   f32 buffer at the output's own index are 16-byte `float4` loads, the
//!   result is one `float4` store, and a scalar loop does the tail. Other
//!   reads compute their index from the output coordinates.
//! - Reductions run one block per output when the reduced axes are the
//!   innermost (threads stride along the row, then a warp-shuffle and
//!   shared-memory block reduction), else one thread per output walking the
//!   reduced axes, so that neighbouring threads read neighbouring columns.
//!   The broadcast epilogue of softmax and `x - mean(x)` runs in the same
//!   block or thread, over the row it just reduced, while it is in cache.
//!   A row group (`rows::row_groups`: softmax's max, then its sum of
//!   exponentials) is one kernel whose block runs each reduction's row in
//!   turn, so the row is read from memory once and the group launches once.
//! - A matmul is a GEMM (cuBLASLt) between generated kernels: each computed
//!   operand's prologue writes it into scratch first, and the epilogue is a
//!   kernel over the product unless cuBLASLt's own bias or bias+ReLU epilogue
//!   expresses it (`GemmEpilogue`). An operand view that cuBLASLt cannot
//!   stride through is copied into scratch by a prologue.
//!
//! Values follow the interpreter's semantics: IEEE f32 arithmetic with no
//! contraction into FMA (compiled with `--fmad=false`), NaN-propagating
//! max/min with +0 above -0, saturating float-to-integer casts, wrapping
//! integer arithmetic. exp, log and tanh are CUDA's (at most 2 ulp), pow is
//! computed in double.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::ops::Range;

use kiln_ir::kernel::{Block, Expr, Kernel, KernelKind, Operand};
use kiln_ir::pass::Optimized;
use kiln_ir::schedule::Location;
use kiln_ir::view::View;
use kiln_ir::{BinaryOp, DType, Op, ReduceOp, Scalar, Shape, TensorType, UnaryOp};

use crate::Error;

/// The name every generated kernel function has.
pub const ENTRY: &str = "kiln_kernel";

/// Threads per block of flat kernels.
pub const FLAT_THREADS: u32 = 256;

/// A generated kernel: its CUDA C and how to launch it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Source {
    /// CUDA C defining `extern "C" __global__ void kiln_kernel(...)`, whose
    /// parameters are the kernel's inputs in order, then its output.
    pub code: String,
    /// The grid it expects.
    pub launch: Launch,
}

/// How a generated kernel is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Launch {
    /// A grid-stride loop over `steps` units of `FLAT_THREADS`-thread blocks:
    /// any grid size is correct, `steps / FLAT_THREADS` blocks cover it once.
    Flat {
        /// Loop trips over the whole grid.
        steps: usize,
    },
    /// One block of `threads` per output row (blocks stride over the rows,
    /// so fewer are correct too).
    Rows {
        /// Output rows.
        rows: usize,
        /// Threads per block, a multiple of 32.
        threads: u32,
    },
}

/// What a matmul kernel runs: prologues for its computed operands, the
/// GEMM, then the epilogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatMulPlan {
    /// Bytes of scratch memory it uses: computed operands, then the product
    /// when an epilogue kernel reads it, each part 256-byte aligned.
    pub scratch_bytes: usize,
    /// For each operand that is computed (or copied), the kernel that writes
    /// it into scratch at `GemmOperand::source`.
    pub prologues: Vec<Source>,
    /// The product.
    pub gemm: Gemm,
    /// What happens to the product.
    pub epilogue: GemmEpilogue,
}

/// `out[batch] = a[batch] @ b[batch]` over row-major f32 matrices with
/// arbitrary element strides, one of which is 1 for each operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// Products, each `[m, k] @ [k, n]`.
    pub batches: usize,
    /// Rows of the product.
    pub m: usize,
    /// Columns of the product.
    pub n: usize,
    /// The shared dimension.
    pub k: usize,
    /// The left operand.
    pub a: GemmOperand,
    /// The right operand.
    pub b: GemmOperand,
}

/// A product as column-major BLAS (cuBLAS, cuBLASLt) takes it, in elements:
/// `C = op(A) op(B)`, `C` being `m x n` with leading dimension `ldc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnMajor {
    /// `op(A)` is `A` transposed.
    pub transa: bool,
    /// `op(B)` is `B` transposed.
    pub transb: bool,
    /// Rows of `C`.
    pub m: usize,
    /// Columns of `C`.
    pub n: usize,
    /// The shared dimension.
    pub k: usize,
    /// Leading dimension of `A`.
    pub lda: usize,
    /// Leading dimension of `B`.
    pub ldb: usize,
    /// Leading dimension of `C`.
    pub ldc: usize,
    /// Products.
    pub batches: usize,
    /// Between the batches of `A`, `B` and `C`.
    pub batch_strides: [usize; 3],
}

impl Gemm {
    /// Row-major `C = A B` is column-major `C' = B' A'` with `m' = n`,
    /// `n' = m`: kiln's right operand is BLAS's `A`. An operand with a unit
    /// column stride is a column-major matrix with leading dimension
    /// `row_stride` (no transpose); a unit row stride is its transpose.
    pub fn column_major(&self) -> ColumnMajor {
        let layout = |o: &GemmOperand| {
            if o.col_stride == 1 {
                (false, o.row_stride.max(1))
            } else {
                (true, o.col_stride.max(1))
            }
        };
        let ((transa, lda), (transb, ldb)) = (layout(&self.b), layout(&self.a));
        ColumnMajor {
            transa,
            transb,
            m: self.n,
            n: self.m,
            k: self.k,
            lda,
            ldb,
            ldc: self.n,
            batches: self.batches,
            batch_strides: [self.b.batch_stride, self.a.batch_stride, self.m * self.n],
        }
    }
}

/// Where a GEMM operand lives and how to step through it (in elements).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmOperand {
    /// The buffer.
    pub source: OperandSource,
    /// The element of coordinates zero.
    pub offset: usize,
    /// Between neighbouring rows.
    pub row_stride: usize,
    /// Between neighbouring columns.
    pub col_stride: usize,
    /// Between batches (0 broadcasts one matrix to every batch).
    pub batch_stride: usize,
}

/// The buffer a GEMM operand is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandSource {
    /// A kernel input.
    Input(u32),
    /// Scratch memory from this byte, written by a prologue.
    Scratch(usize),
}

/// The matmul's epilogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GemmEpilogue {
    /// The product is the output.
    None,
    /// cuBLASLt adds kernel input `bias` (one value per column), then applies
    /// ReLU if `relu`.
    Bias {
        /// The kernel input holding the bias.
        bias: u32,
        /// Whether ReLU follows.
        relu: bool,
    },
    /// The product goes to scratch at byte `acc`, and this kernel (whose
    /// parameters are the kernel's inputs, then the product, then the
    /// output) computes the output from it.
    Kernel {
        /// Where the product is.
        acc: usize,
        /// The epilogue.
        source: Source,
    },
}

/// The CUDA C of an elementwise or reduction kernel.
pub fn kernel(kernel: &Kernel) -> Result<Source, Error> {
    match &kernel.kind {
        KernelKind::Elementwise => elementwise(&kernel.inputs, None, &kernel.body, &kernel.out),
        KernelKind::Reduce {
            op,
            axes,
            shape,
            prologue,
        } => reduce(kernel, *op, axes, shape, prologue),
        KernelKind::MatMul { .. } => Err(Error::Codegen(
            "a matmul kernel is a plan, not one source".to_string(),
        )),
    }
}

/// The rows of a reduction kernel that runs a block of threads to each row
/// of its output; `None` for other kernels.
pub fn reduction_rows(kernel: &Kernel) -> Option<usize> {
    match &kernel.kind {
        KernelKind::Reduce { axes, shape, .. } => rows_of(shape, axes),
        KernelKind::Elementwise | KernelKind::MatMul { .. } => None,
    }
}

/// A reduction over `axes` of `shape` runs a block of threads to each row
/// (returned: how many) when its reduced axes are innermost and more than
/// one element long: reads coalesce along the row. Otherwise one thread per
/// output walks the reduced axes. Size-1 axes take no place in memory:
/// `[c, 1]` summed over axis 0 is a row.
fn rows_of(shape: &Shape, axes: &[usize]) -> Option<usize> {
    let dims = shape.dims();
    let last = (0..dims.len()).rev().find(|&a| dims[a] != 1);
    let innermost = axes.iter().rev().find(|&&a| dims[a] != 1) == last.as_ref();
    let length: usize = axes.iter().map(|&a| dims[a]).product();
    let rows = (0..dims.len())
        .filter(|a| !axes.contains(a))
        .map(|a| dims[a])
        .product();
    (last.is_some() && innermost && length > 1).then_some(rows)
}

/// The kernel of the row group `launches` of `optimized`'s schedule
/// (`rows::row_groups`), or `None` where it is one launch or its reductions
/// do not all run a block to each of the same rows.
pub fn row_group_of(
    optimized: &Optimized,
    launches: Range<usize>,
) -> Result<Option<Source>, Error> {
    let (graph, schedule) = (&optimized.graph, &optimized.schedule);
    let mut members = Vec::new();
    let mut rows = None;
    for i in launches.clone() {
        let launch = &schedule.launches[i];
        let Op::Kernel(kernel) = &graph.node(launch.node).op else {
            return Ok(None);
        };
        let Some(r) = reduction_rows(kernel) else {
            return Ok(None);
        };
        if *rows.get_or_insert(r) != r {
            return Ok(None);
        }
        // Inputs an earlier member writes.
        let written: Vec<bool> = launch
            .inputs
            .iter()
            .map(|loc| {
                schedule.launches[launches.start..i]
                    .iter()
                    .any(|m| *loc == Location::Slot(m.output))
            })
            .collect();
        members.push((kernel.as_ref(), written));
    }
    if members.len() < 2 {
        return Ok(None);
    }
    row_group(&members).map(Some)
}

/// One kernel for a row group (`rows::row_groups`): reductions by rows over
/// the same `rows`, each a device function called for every row in turn, a
/// block to a row, so that softmax's max and sum read a row once from
/// memory and launch once. `members` are the kernels with, for each of
/// their inputs, whether an earlier member writes it. The kernel's
/// parameters are each member's inputs, then its output, member by member.
fn row_group(members: &[(&Kernel, Vec<bool>)]) -> Result<Source, Error> {
    let mut w = Writer::new();
    let mut rows_and_threads = None;
    let mut params = Vec::new();
    let mut calls = Vec::new();
    for (m, (kernel, written)) in members.iter().enumerate() {
        let KernelKind::Reduce {
            op,
            axes,
            shape,
            prologue,
        } = &kernel.kind
        else {
            return Err(Error::Codegen(format!(
                "row group member {m} is not a reduction"
            )));
        };
        let name = format!("kiln_row{m}");
        let launch = reduce_into(
            &mut w,
            kernel,
            *op,
            axes,
            shape,
            prologue,
            Some((&name, written)),
        )?;
        let Launch::Rows { rows, threads } = launch else {
            return Err(Error::Codegen(format!(
                "row group member {m} is not by rows"
            )));
        };
        let (group_rows, group_threads) = *rows_and_threads.get_or_insert((rows, threads));
        if rows != group_rows {
            return Err(Error::Codegen(format!(
                "row group member {m} has {rows} rows, not {group_rows}"
            )));
        }
        rows_and_threads = Some((rows, threads.max(group_threads)));
        let mut args = vec!["o".to_string()];
        for (i, t) in kernel.inputs.iter().enumerate() {
            params.push(format!("const {}* m{m}_in{i}", ctype(t.dtype)));
            args.push(format!("m{m}_in{i}"));
        }
        params.push(format!("{}* m{m}_out", ctype(kernel.out.dtype)));
        args.push(format!("m{m}_out"));
        calls.push(format!("{name}({});", args.join(", ")));
    }
    let Some((rows, threads)) = rows_and_threads else {
        return Err(Error::Codegen("an empty row group".to_string()));
    };
    w.line(
        0,
        &format!(
            "extern \"C\" __global__ void {ENTRY}({}) {{",
            params.join(", ")
        ),
    );
    w.line(
        1,
        &format!("for (long long o = blockIdx.x; o < {rows}; o += gridDim.x) {{"),
    );
    for call in &calls {
        w.line(2, call);
    }
    w.line(1, "}");
    w.line(0, "}");
    Ok(w.finish(Launch::Rows { rows, threads }))
}

/// Scratch parts start at multiples of this, so `float4` accesses align.
const SCRATCH_ALIGN: usize = 256;

/// The plan of a matmul kernel. `fused` allows cuBLASLt's bias and ReLU
/// epilogues; without it every epilogue but the identity is a kernel.
pub fn matmul(kernel: &Kernel, fused: bool) -> Result<MatMulPlan, Error> {
    let KernelKind::MatMul { a, b } = &kernel.kind else {
        return Err(Error::Codegen("not a matmul kernel".to_string()));
    };
    let (ad, bd) = (a.shape().dims(), b.shape().dims());
    let (ra, rb) = (ad.len(), bd.len());
    let (m, k, n) = (ad[ra - 2], ad[ra - 1], bd[rb - 1]);
    let batches = kernel.out.shape.numel() / (m * n).max(1);
    let mut prologues = Vec::new();
    let mut scratch = 0;
    let mut operand = |o: &Operand| -> Result<GemmOperand, Error> {
        if let Operand::Read { input, view } = o
            && let Some(strided) = strided(view, OperandSource::Input(*input))
        {
            return Ok(strided);
        }
        // Computed, or a view cuBLASLt cannot step through: written contiguously.
        let block = match o {
            Operand::Computed { block, .. } => block.clone(),
            Operand::Read { input, view } => {
                let mut copy = Block::default();
                copy.push(
                    Expr::Load {
                        input: *input,
                        view: view.clone(),
                    },
                    DType::F32,
                );
                copy
            }
        };
        let shape = o.shape().clone();
        let out = TensorType::new(DType::F32, shape.clone());
        prologues.push(elementwise(&kernel.inputs, None, &block, &out)?);
        let at = scratch;
        scratch = (scratch + shape.numel() * 4).next_multiple_of(SCRATCH_ALIGN);
        Ok(contiguous_operand(&shape, at))
    };
    let (a, b) = (operand(a)?, operand(b)?);
    let epilogue = match bias_epilogue(&kernel.body, &kernel.out.shape, n) {
        // With k = 0 the product is zeros, which the runtime writes itself;
        // cuBLASLt's epilogue comes with a GEMM, so a bias needs the kernel.
        Some(e) if (fused && k > 0) || e == GemmEpilogue::None => e,
        _ => {
            let acc = scratch;
            scratch += kernel.out.shape.numel() * 4;
            GemmEpilogue::Kernel {
                acc,
                source: elementwise(&kernel.inputs, Some(()), &kernel.body, &kernel.out)?,
            }
        }
    };
    Ok(MatMulPlan {
        scratch_bytes: scratch,
        prologues,
        gemm: Gemm {
            batches,
            m,
            n,
            k,
            a,
            b,
        },
        epilogue,
    })
}

/// A contiguous `[.., rows, cols]` operand in scratch at byte `at`.
fn contiguous_operand(shape: &Shape, at: usize) -> GemmOperand {
    let d = shape.dims();
    let (rows, cols) = (d[d.len() - 2], d[d.len() - 1]);
    GemmOperand {
        source: OperandSource::Scratch(at),
        offset: 0,
        row_stride: cols,
        col_stride: 1,
        batch_stride: rows * cols,
    }
}

/// The operand as strides cuBLASLt takes: unmasked, one unit stride (or a
/// single row or column), and batch axes that merge into one stride.
fn strided(view: &View, source: OperandSource) -> Option<GemmOperand> {
    if view.mask.is_some() || view.offset < 0 {
        return None;
    }
    let d = view.shape.dims();
    let r = d.len();
    let (rows, cols) = (d[r - 2], d[r - 1]);
    // Size-1 axes have stride 0 in canonical views; any stride serves them.
    let row_stride = if rows == 1 { cols } else { view.strides[r - 2] };
    let col_stride = if cols == 1 { 1 } else { view.strides[r - 1] };
    // One unit stride, and the other a leading dimension that does not
    // overlap it (a matrix broadcast along rows or columns is copied).
    let leading = if col_stride == 1 {
        rows == 1 || row_stride >= cols
    } else {
        row_stride == 1 && (cols == 1 || col_stride >= rows)
    };
    if !leading {
        return None;
    }
    // Batch axes, outermost first, must be one stride: s[i] = s[i+1] * d[i+1].
    let batch: Vec<(usize, usize)> = d[..r - 2]
        .iter()
        .zip(&view.strides)
        .filter(|(dim, _)| **dim != 1)
        .map(|(&dim, &s)| (dim, s))
        .collect();
    let batch_stride = batch.last().map_or(0, |b| b.1);
    let merges = batch.windows(2).all(|w| w[0].1 == w[1].1 * w[1].0);
    if !merges {
        return None;
    }
    Some(GemmOperand {
        source,
        offset: view.offset as usize,
        row_stride,
        col_stride,
        batch_stride,
    })
}

/// cuBLASLt's epilogue, when the body is `acc`, `acc + bias` or
/// `relu(acc + bias)` with `bias` a vector broadcast along the rows of an
/// output whose rows are the product's (`n` columns).
fn bias_epilogue(body: &Block, out: &Shape, n: usize) -> Option<GemmEpilogue> {
    if out.dims().last() != Some(&n) {
        return None;
    }
    let v = &body.values;
    let is_bias = |e: &Expr| match e {
        Expr::Load { input, view } => {
            let d = out.dims();
            let n = d[d.len() - 1];
            let mut strides = vec![0usize; d.len()];
            strides[d.len() - 1] = usize::from(n != 1);
            (view.mask.is_none() && view.offset == 0 && view.strides.as_slice() == strides)
                .then_some(*input)
        }
        _ => None,
    };
    match v.as_slice() {
        [acc] if acc.expr == Expr::Acc => Some(GemmEpilogue::None),
        [acc, bias, add, rest @ ..] if acc.expr == Expr::Acc => {
            let bias = is_bias(&bias.expr)?;
            let added = matches!(
                add.expr,
                Expr::Binary(BinaryOp::Add, 0, 1) | Expr::Binary(BinaryOp::Add, 1, 0)
            );
            let relu = match rest {
                [] => false,
                [r] if r.expr == Expr::Unary(UnaryOp::Relu, 2) => true,
                _ => return None,
            };
            added.then_some(GemmEpilogue::Bias { bias, relu })
        }
        _ => None,
    }
}

/// The C type of a dtype.
fn ctype(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::I32 => "int",
        DType::U8 => "unsigned char",
        DType::Bool => "bool",
    }
}

/// A constant as C, exact: floats print in their shortest round-trip form.
fn literal(c: Scalar) -> String {
    match c {
        Scalar::F32(v) if v.is_finite() => format!("{v:?}f"),
        Scalar::F32(v) => format!("__int_as_float(0x{:08x})", v.to_bits()),
        Scalar::I32(v) if v == i32::MIN => "(-2147483647 - 1)".to_string(),
        Scalar::I32(v) => v.to_string(),
        Scalar::U8(v) => format!("(unsigned char){v}"),
        Scalar::Bool(v) => v.to_string(),
    }
}

/// Helper functions, emitted before the kernel when used.
const HELPERS: [(&str, &str); 4] = [
    (
        "kiln_max",
        "// IEEE maximum: NaN if either is, +0 above -0.
__device__ __forceinline__ float kiln_max(float a, float b) {
  if (a != a || b != b) return __int_as_float(0x7fc00000);
  if (a == b) return __float_as_int(a) < 0 ? b : a;
  return a > b ? a : b;
}
",
    ),
    (
        "kiln_min",
        "__device__ __forceinline__ float kiln_min(float a, float b) { return -kiln_max(-a, -b); }
",
    ),
    (
        "kiln_f2i",
        "// Saturating, NaN to 0, as Rust's `as`.
__device__ __forceinline__ int kiln_f2i(float x) {
  return x != x ? 0 : x >= 2147483648.0f ? 2147483647 : x <= -2147483648.0f ? (-2147483647 - 1) : (int)x;
}
",
    ),
    (
        "kiln_f2u8",
        "__device__ __forceinline__ unsigned char kiln_f2u8(float x) {
  return x != x ? 0 : x >= 255.0f ? 255 : x <= 0.0f ? 0 : (unsigned char)x;
}
",
    ),
];

/// How the values of one block are named and where its loads and `acc` come
/// from, for one element.
struct Element<'a> {
    /// Suffix of every value's name (a vector lane's, or empty).
    suffix: &'a str,
    /// The element's flat index in the block's space.
    index: &'a str,
    /// Prefix of its coordinate variables.
    coords: &'a str,
    /// The vector lane (`x`, `y`, `z`, `w`) whose `float4` loads serve
    /// contiguous f32 reads.
    lane: Option<char>,
    /// The expression of `acc`.
    acc: Option<&'a str>,
}

/// Writes generated code and remembers the helpers it used.
struct Writer {
    code: String,
    helpers: BTreeSet<&'static str>,
}

impl Writer {
    fn new() -> Writer {
        Writer {
            code: String::new(),
            helpers: BTreeSet::new(),
        }
    }

    fn line(&mut self, indent: usize, text: &str) {
        let _ = writeln!(self.code, "{:indent$}{text}", "", indent = indent * 2);
    }

    /// The finished source: helpers, then the kernel.
    fn finish(self, launch: Launch) -> Source {
        let mut code = String::new();
        for (name, text) in HELPERS {
            if self.helpers.contains(name) {
                code.push_str(text);
            }
        }
        code.push_str(&self.code);
        Source { code, launch }
    }

    /// `extern "C" __global__ void kiln_kernel(...) {`.
    fn signature(&mut self, inputs: &[TensorType], acc: bool, out: DType) {
        let mut params: Vec<String> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| format!("const {}* __restrict__ in{i}", ctype(t.dtype)))
            .collect();
        if acc {
            params.push("const float* __restrict__ acc".to_string());
        }
        params.push(format!("{}* __restrict__ out", ctype(out)));
        self.line(
            0,
            &format!(
                "extern \"C\" __global__ void {ENTRY}({}) {{",
                params.join(", ")
            ),
        );
    }

    /// `__device__ void {name}(long long o, ...) {`: one row of a row
    /// group. Inputs marked in `written` were written by an earlier function
    /// of the group in this kernel, by another thread: they are read as
    /// `volatile`, from where the write went, never through `__restrict__`'s
    /// non-coherent read-only path, a copy the compiler keeps, or a line the
    /// multiprocessor's L1 holds from before the write. (A warp-per-row
    /// variant reading them as plain `const` pointers after `__syncwarp`
    /// read stale values on the H100: layer_norm's mean, rows of 3.)
    fn row_signature(&mut self, name: &str, inputs: &[TensorType], written: &[bool], out: DType) {
        let mut params = vec!["const long long o".to_string()];
        params.extend(inputs.iter().enumerate().map(|(i, t)| {
            let t = ctype(t.dtype);
            if written.get(i) == Some(&true) {
                format!("const volatile {t}* in{i}")
            } else {
                format!("const {t}* __restrict__ in{i}")
            }
        }));
        params.push(format!("{}* __restrict__ out", ctype(out)));
        self.line(
            0,
            &format!(
                "__device__ __forceinline__ void {name}({}) {{",
                params.join(", ")
            ),
        );
    }

    /// `const long long {prefix}{axis} = ...;` for every axis of `dims`
    /// from the flat index `index` (row-major over `dims`).
    fn coords(&mut self, indent: usize, prefix: &str, index: &str, dims: &[(usize, usize)]) {
        let mut inner = 1usize;
        for (k, &(axis, dim)) in dims.iter().enumerate().rev() {
            let q = if inner == 1 {
                index.to_string()
            } else {
                format!("{index} / {inner}")
            };
            let expr = if k == 0 { q } else { format!("({q}) % {dim}") };
            self.line(indent, &format!("const long long {prefix}{axis} = {expr};"));
            inner *= dim;
        }
    }

    /// The values of `block` for one element; returns the result's name.
    fn block(
        &mut self,
        indent: usize,
        block: &Block,
        inputs: &[TensorType],
        at: &Element,
    ) -> Result<String, Error> {
        let name = |k: u32| format!("v{k}{}", at.suffix);
        for (k, value) in block.values.iter().enumerate() {
            let ty = value.dtype;
            let operand_type = |x: u32| block.values[x as usize].dtype;
            let expr = match &value.expr {
                Expr::Load { input, view } => {
                    let dtype = inputs
                        .get(*input as usize)
                        .map(|t| t.dtype)
                        .ok_or_else(|| Error::Codegen(format!("no input {input}")))?;
                    self.load(*input, view, dtype, at)
                }
                Expr::Const(c) => literal(*c),
                Expr::Acc => at
                    .acc
                    .ok_or_else(|| Error::Codegen("acc outside a reduction or matmul".into()))?
                    .to_string(),
                Expr::Unary(op, x) => self.unary(*op, &name(*x), ty)?,
                Expr::Binary(op, x, y) => {
                    self.binary(*op, &name(*x), &name(*y), operand_type(*x))?
                }
                Expr::Where(c, x, y) => format!("{} ? {} : {}", name(*c), name(*x), name(*y)),
                Expr::Cast(x) => self.cast(&name(*x), operand_type(*x), ty),
            };
            self.line(
                indent,
                &format!("const {} {} = {expr};", ctype(ty), name(k as u32)),
            );
        }
        Ok(name(block.values.len().saturating_sub(1) as u32))
    }

    /// A read of input `input` through `view`.
    fn load(&mut self, input: u32, view: &View, dtype: DType, at: &Element) -> String {
        if view.is_contiguous() {
            return match at.lane {
                Some(lane) if dtype == DType::F32 => format!("l{input}.{lane}"),
                _ => format!("in{input}[{}]", at.index),
            };
        }
        let mut index = if view.offset == 0 {
            String::new()
        } else {
            view.offset.to_string()
        };
        for (axis, &stride) in view.strides.iter().enumerate() {
            if stride != 0 {
                if !index.is_empty() {
                    index.push_str(" + ");
                }
                let _ = write!(index, "{}{axis} * {stride}", at.coords);
            }
        }
        if index.is_empty() {
            index.push('0');
        }
        let read = format!("in{input}[{index}]");
        let Some(mask) = &view.mask else {
            return read;
        };
        let dims = view.shape.dims();
        let conditions: Vec<String> = mask
            .valid
            .iter()
            .enumerate()
            .filter(|&(a, &(lo, hi))| (lo, hi) != (0, dims[a]))
            .map(|(a, &(lo, hi))| {
                let c = format!("{}{a}", at.coords);
                match (lo, hi) {
                    (0, hi) => format!("{c} < {hi}"),
                    (lo, hi) if hi == dims[a] => format!("{c} >= {lo}"),
                    (lo, hi) => format!("{c} >= {lo} && {c} < {hi}"),
                }
            })
            .collect();
        if conditions.is_empty() {
            return read;
        }
        format!(
            "({}) ? {read} : {}",
            conditions.join(" && "),
            literal(mask.fill)
        )
    }

    fn unary(&mut self, op: UnaryOp, x: &str, ty: DType) -> Result<String, Error> {
        if ty == DType::F32 {
            return Ok(match op {
                UnaryOp::Neg => format!("-{x}"),
                UnaryOp::Exp => format!("expf({x})"),
                UnaryOp::Log => format!("logf({x})"),
                UnaryOp::Sqrt => format!("sqrtf({x})"),
                UnaryOp::Recip => format!("1.0f / {x}"),
                // NaN stays NaN; -0 and everything below 0 become +0.
                UnaryOp::Relu => format!("({x} > 0.0f || {x} != {x}) ? {x} : 0.0f"),
                UnaryOp::Sigmoid => format!("1.0f / (1.0f + expf(-{x}))"),
                UnaryOp::Tanh => format!("tanhf({x})"),
                UnaryOp::Abs => format!("fabsf({x})"),
            });
        }
        let wide = format!("(long long){x}");
        Ok(match op {
            UnaryOp::Neg => wrap(&format!("-{wide}"), ty),
            UnaryOp::Abs => wrap(&format!("({x} < 0 ? -{wide} : {wide})"), ty),
            UnaryOp::Relu => format!("{x} > 0 ? {x} : 0"),
            _ => {
                return Err(Error::Codegen(format!(
                    "{} of {ty} is not typed",
                    op.name()
                )));
            }
        })
    }

    fn binary(&mut self, op: BinaryOp, x: &str, y: &str, ty: DType) -> Result<String, Error> {
        let infix = |sign: &str| format!("{x} {sign} {y}");
        if op.is_comparison() {
            return Ok(match op {
                BinaryOp::Lt => infix("<"),
                BinaryOp::Le => infix("<="),
                BinaryOp::Gt => infix(">"),
                BinaryOp::Ge => infix(">="),
                BinaryOp::Eq => infix("=="),
                _ => infix("!="),
            });
        }
        if ty == DType::F32 {
            return Ok(match op {
                BinaryOp::Add => infix("+"),
                BinaryOp::Sub => infix("-"),
                BinaryOp::Mul => infix("*"),
                BinaryOp::Div => infix("/"),
                BinaryOp::Max => {
                    self.helpers.insert("kiln_max");
                    format!("kiln_max({x}, {y})")
                }
                BinaryOp::Min => {
                    self.helpers.extend(["kiln_max", "kiln_min"]);
                    format!("kiln_min({x}, {y})")
                }
                BinaryOp::Pow => format!("(float)pow((double){x}, (double){y})"),
                _ => return Err(Error::Codegen(format!("{} is not arithmetic", op.name()))),
            });
        }
        let wide = |sign: &str| wrap(&format!("(long long){x} {sign} (long long){y}"), ty);
        Ok(match op {
            BinaryOp::Add => wide("+"),
            BinaryOp::Sub => wide("-"),
            BinaryOp::Mul => wide("*"),
            BinaryOp::Max => format!("{x} > {y} ? {x} : {y}"),
            BinaryOp::Min => format!("{x} < {y} ? {x} : {y}"),
            _ => {
                return Err(Error::Codegen(format!(
                    "{} of {ty} is not typed",
                    op.name()
                )));
            }
        })
    }

    fn cast(&mut self, x: &str, from: DType, to: DType) -> String {
        match (from, to) {
            (a, b) if a == b => x.to_string(),
            (_, DType::Bool) => format!("{x} != 0"),
            (DType::F32, DType::I32) => {
                self.helpers.insert("kiln_f2i");
                format!("kiln_f2i({x})")
            }
            (DType::F32, DType::U8) => {
                self.helpers.insert("kiln_f2u8");
                format!("kiln_f2u8({x})")
            }
            (_, to) => format!("({}){x}", ctype(to)),
        }
    }
}

/// An integer result computed in `long long`, wrapped to `ty`.
fn wrap(wide: &str, ty: DType) -> String {
    match ty {
        DType::I32 => format!("(int)(unsigned int)({wide})"),
        DType::U8 => format!("(unsigned char)({wide})"),
        _ => format!("({wide}) != 0"),
    }
}

/// The dims of `shape` as (axis, extent), size-1 axes dropped.
fn axes_of(shape: &Shape) -> Vec<(usize, usize)> {
    shape
        .dims()
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, d)| d != 1)
        .collect()
}

/// An elementwise kernel computing `body` over `out`; with `acc`, it also
/// reads the product of a matmul as `acc[i]`.
fn elementwise(
    inputs: &[TensorType],
    acc: Option<()>,
    body: &Block,
    out: &TensorType,
) -> Result<Source, Error> {
    let n = out.shape.numel();
    let mut w = Writer::new();
    w.signature(inputs, acc.is_some(), out.dtype);
    let dims = axes_of(&out.shape);
    let strided = body
        .values
        .iter()
        .any(|v| matches!(&v.expr, Expr::Load { view, .. } if !view.is_contiguous()));
    let vector = out.dtype == DType::F32 && n >= 4;
    let step = "(long long)gridDim.x * blockDim.x";
    let first = "(long long)blockIdx.x * blockDim.x + threadIdx.x";
    let scalar_from = if vector {
        // Four elements per step: contiguous f32 reads as float4, one float4 store.
        w.line(1, &format!("const long long vectors = {};", n / 4));
        w.line(
            1,
            &format!("for (long long q = {first}; q < vectors; q += {step}) {{"),
        );
        let contiguous: BTreeSet<u32> = body
            .values
            .iter()
            .filter_map(|v| match &v.expr {
                Expr::Load { input, view }
                    if view.is_contiguous() && inputs[*input as usize].dtype == DType::F32 =>
                {
                    Some(*input)
                }
                _ => None,
            })
            .collect();
        for input in &contiguous {
            w.line(
                2,
                &format!("const float4 l{input} = reinterpret_cast<const float4*>(in{input})[q];"),
            );
        }
        if acc.is_some() {
            w.line(
                2,
                "const float4 a4 = reinterpret_cast<const float4*>(acc)[q];",
            );
        }
        let mut results = Vec::new();
        for lane in ['x', 'y', 'z', 'w'] {
            let (suffix, index, coords) =
                (format!("_{lane}"), format!("i_{lane}"), format!("c{lane}_"));
            let offset = "xyzw".find(lane).unwrap_or(0);
            w.line(2, &format!("const long long {index} = 4 * q + {offset};"));
            if strided {
                w.coords(2, &coords, &index, &dims);
            }
            let acc_lane = format!("a4.{lane}");
            let element = Element {
                suffix: &suffix,
                index: &index,
                coords: &coords,
                lane: Some(lane),
                acc: acc.map(|_| acc_lane.as_str()),
            };
            results.push(w.block(2, body, inputs, &element)?);
        }
        w.line(
            2,
            &format!(
                "reinterpret_cast<float4*>(out)[q] = make_float4({});",
                results.join(", ")
            ),
        );
        w.line(1, "}");
        format!("vectors * 4 + {first}")
    } else {
        first.to_string()
    };
    w.line(
        1,
        &format!("for (long long i = {scalar_from}; i < {n}; i += {step}) {{"),
    );
    if strided {
        w.coords(2, "c", "i", &dims);
    }
    let element = Element {
        suffix: "",
        index: "i",
        coords: "c",
        lane: None,
        acc: acc.map(|_| "acc[i]"),
    };
    let result = w.block(2, body, inputs, &element)?;
    w.line(2, &format!("out[i] = {result};"));
    w.line(1, "}");
    w.line(0, "}");
    let steps = if vector { n / 4 } else { n };
    Ok(w.finish(Launch::Flat {
        steps: steps.max(1),
    }))
}

/// A reduction kernel: the prologue over `shape` combined along `axes`,
/// then the body over the output.
fn reduce(
    kernel: &Kernel,
    op: ReduceOp,
    axes: &[usize],
    shape: &Shape,
    prologue: &Block,
) -> Result<Source, Error> {
    let mut w = Writer::new();
    let launch = reduce_into(&mut w, kernel, op, axes, shape, prologue, None)?;
    Ok(w.finish(launch))
}

/// A reduction as a whole kernel, or with `row: Some((name, written))` as a
/// device function `name(o, inputs.., out)` that reduces row `o` alone
/// (`None` where the reduction does not run by rows); inputs marked in
/// `written` are written by the group (`Writer::row_signature`).
fn reduce_into(
    w: &mut Writer,
    kernel: &Kernel,
    op: ReduceOp,
    axes: &[usize],
    shape: &Shape,
    prologue: &Block,
    row: Option<(&str, &[bool])>,
) -> Result<Launch, Error> {
    let dims = shape.dims();
    let kept: Vec<(usize, usize)> = (0..dims.len())
        .filter(|a| !axes.contains(a) && dims[*a] != 1)
        .map(|a| (a, dims[a]))
        .collect();
    let reduced: Vec<(usize, usize)> = axes
        .iter()
        .filter(|&&a| dims[a] != 1)
        .map(|&a| (a, dims[a]))
        .collect();
    let rows: usize = kept.iter().map(|k| k.1).product();
    let length: usize = reduced.iter().map(|r| r.1).product();
    let dtype = prologue.dtype().unwrap_or(DType::F32);
    let t = ctype(dtype);
    let init = literal(op.init(dtype));
    let combine = |w: &mut Writer, a: &str, b: &str| match (op, dtype) {
        (ReduceOp::Sum, DType::F32) => format!("{a} + {b}"),
        (ReduceOp::Sum, ty) => wrap(&format!("(long long){a} + (long long){b}"), ty),
        (ReduceOp::Max, DType::F32) => {
            w.helpers.insert("kiln_max");
            format!("kiln_max({a}, {b})")
        }
        (ReduceOp::Max, _) => format!("{a} > {b} ? {a} : {b}"),
    };
    // The output is the whole space (broadcast epilogue) or the reduced values.
    let broadcast = kernel.out.shape == *shape;
    let by_rows = rows_of(shape, axes).is_some();
    let (indent, lane_start, lane_step) = if let Some((name, written)) = row {
        if !by_rows {
            return Err(Error::Codegen(format!(
                "{name}: a reduction that does not run by rows in a row group"
            )));
        }
        w.row_signature(name, &kernel.inputs, written, kernel.out.dtype);
        (1, "threadIdx.x", "blockDim.x")
    } else if by_rows {
        w.signature(&kernel.inputs, false, kernel.out.dtype);
        w.line(
            1,
            &format!("for (long long o = blockIdx.x; o < {rows}; o += gridDim.x) {{"),
        );
        (2, "threadIdx.x", "blockDim.x")
    } else {
        w.signature(&kernel.inputs, false, kernel.out.dtype);
        w.line(
            1,
            &format!(
                "for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < {rows}; o += (long long)gridDim.x * blockDim.x) {{"
            ),
        );
        (2, "0", "1")
    };
    w.coords(indent, "c", "o", &kept);
    w.line(indent, &format!("{t} acc = {init};"));
    w.line(
        indent,
        &format!("for (long long r = {lane_start}; r < {length}; r += {lane_step}) {{"),
    );
    w.coords(indent + 1, "c", "r", &reduced);
    let space_index = flat_index(shape, "c");
    let element = Element {
        suffix: "",
        index: &space_index,
        coords: "c",
        lane: None,
        acc: None,
    };
    let value = w.block(indent + 1, prologue, &kernel.inputs, &element)?;
    let combined = combine(w, "acc", &value);
    w.line(indent + 1, &format!("acc = {combined};"));
    w.line(indent, "}");
    if by_rows {
        let shuffle = if dtype == DType::F32 { "float" } else { "int" };
        let down = format!("({t})__shfl_down_sync(0xffffffffu, ({shuffle})acc, s)");
        let across = combine(w, "acc", &down);
        w.line(indent, &format!("__shared__ {t} partial[32];"));
        w.line(
            indent,
            &format!("for (int s = 16; s > 0; s >>= 1) acc = {across};"),
        );
        w.line(
            indent,
            "if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;",
        );
        w.line(indent, "__syncthreads();");
        w.line(indent, "if (threadIdx.x < 32) {");
        w.line(
            indent + 1,
            &format!("acc = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : {init};"),
        );
        w.line(
            indent + 1,
            &format!("for (int s = 16; s > 0; s >>= 1) acc = {across};"),
        );
        w.line(indent + 1, "if (threadIdx.x == 0) partial[0] = acc;");
        w.line(indent, "}");
        w.line(indent, "__syncthreads();");
        w.line(indent, "acc = partial[0];");
    }
    if broadcast {
        // The body over the row just reduced, `acc` broadcast along it.
        w.line(
            indent,
            &format!("for (long long r = {lane_start}; r < {length}; r += {lane_step}) {{"),
        );
        w.coords(indent + 1, "c", "r", &reduced);
        let element = Element {
            suffix: "",
            index: &space_index,
            coords: "c",
            lane: None,
            acc: Some("acc"),
        };
        let result = w.block(indent + 1, &kernel.body, &kernel.inputs, &element)?;
        w.line(indent + 1, &format!("out[{space_index}] = {result};"));
        w.line(indent, "}");
    } else {
        // Output element `o` reads combined value `o`, at its own coordinates.
        if by_rows {
            w.line(indent, "if (threadIdx.x == 0) {");
        } else {
            w.line(indent, "{");
        }
        w.coords(indent + 1, "e", "o", &axes_of(&kernel.out.shape));
        let element = Element {
            suffix: "",
            index: "o",
            coords: "e",
            lane: None,
            acc: Some("acc"),
        };
        let result = w.block(indent + 1, &kernel.body, &kernel.inputs, &element)?;
        w.line(indent + 1, &format!("out[o] = {result};"));
        w.line(indent, "}");
    }
    if by_rows {
        // `partial` is written again by the next row, and in a row group
        // the next function reads what this one wrote.
        w.line(indent, "__syncthreads();");
    }
    if row.is_none() {
        w.line(1, "}");
    }
    w.line(0, "}");
    let launch = if by_rows {
        let threads = length.next_multiple_of(32).clamp(32, 256) as u32;
        Launch::Rows { rows, threads }
    } else {
        Launch::Flat { steps: rows.max(1) }
    };
    Ok(launch)
}

/// The row-major flat index of coordinates `{prefix}{axis}` in `shape`
/// (size-1 axes have none and add nothing).
fn flat_index(shape: &Shape, prefix: &str) -> String {
    let strides = shape.strides();
    let terms: Vec<String> = shape
        .dims()
        .iter()
        .enumerate()
        .filter(|&(_, &d)| d != 1)
        .map(|(a, _)| match strides[a] {
            1 => format!("{prefix}{a}"),
            s => format!("{prefix}{a} * {s}"),
        })
        .collect();
    if terms.is_empty() {
        "0".to_string()
    } else {
        terms.join(" + ")
    }
}
