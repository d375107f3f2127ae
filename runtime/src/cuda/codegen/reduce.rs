//! Reduction kernels, as their loop plan says (`crate::loops`): a block of
//! threads per output row (threads stride along the row, then a
//! warp-shuffle and shared-memory block reduction), or a thread per output
//! walking the reduced axes, so that neighbouring threads read neighbouring
//! columns. The broadcast epilogue of softmax and
//! `x - mean(x)` runs in the same block or thread, over the row it just
//! reduced, while it is in cache. A reduction by rows can also be written
//! as a device function of one row, for a row group (`row_group`).

use kiln_ir::kernel::{Kernel, KernelKind};
use kiln_ir::{DType, ReduceOp, Shape};

use super::writer::{Element, Writer, ctype, literal, widen, wrap};
use super::{Grid, Program};
use crate::Error;
use crate::loops::{self, By, Loops, Target};
use crate::nest::placed_axes;

/// The rows of a reduction kernel that runs a block of threads to each row
/// of its output (`loops::By::Rows` on CUDA); `None` for other kernels.
pub fn reduction_rows(kernel: &Kernel) -> Option<usize> {
    if !matches!(kernel.kind, KernelKind::Reduce { .. }) {
        return None;
    }
    match loops::plan(kernel, Target::CUDA).kind {
        Loops::Reduce(r) if r.by == By::Rows => Some(r.reduction.rows()),
        _ => None,
    }
}

/// A reduction kernel: the prologue over its space combined along its
/// axes, then the body over the output.
pub(super) fn reduce(kernel: &Kernel) -> Result<Program, Error> {
    let mut w = Writer::new();
    let grid = reduce_into(&mut w, kernel, None)?;
    Ok(w.finish(grid))
}

/// A reduction as a whole kernel, or with `row: Some((name, written))` as a
/// device function `name(o, inputs.., out)` that reduces row `o` alone
/// (`None` where the reduction does not run by rows); inputs marked in
/// `written` are written by the group (`Writer::row_signature`).
pub(super) fn reduce_into(
    w: &mut Writer,
    kernel: &Kernel,
    row: Option<(&str, &[bool])>,
) -> Result<Grid, Error> {
    let (KernelKind::Reduce { shape, .. }, Loops::Reduce(plan)) =
        (&kernel.kind, loops::plan(kernel, Target::CUDA).kind)
    else {
        return Err(crate::codegen(
            "CUDA C",
            "a reduction kernel of another kind",
        ));
    };
    let (op, prologue, reduction) = (&plan.op, &plan.prologue, &plan.reduction);
    let (kept, reduced) = (&reduction.kept, &reduction.reduced);
    let (rows, length) = (reduction.rows(), reduction.row_len());
    let dtype = prologue.dtype().unwrap_or(DType::F32);
    let t = ctype(dtype);
    let init = literal(op.init(dtype));
    // The output is the whole space (broadcast epilogue) or the reduced values.
    let broadcast = plan.broadcast;
    let by_rows = plan.by == By::Rows;
    let (indent, lane_start, lane_step) = if let Some((name, written)) = row {
        if !by_rows {
            return Err(crate::codegen(
                "CUDA C",
                format!("{name}: a reduction that does not run by rows in a row group"),
            ));
        }
        w.row_signature(name, &kernel.inputs, written, kernel.out.dtype);
        (1, "threadIdx.x", "blockDim.x")
    } else if by_rows {
        w.signature(&kernel.inputs, false, kernel.out.dtype, kernel.side.len());
        w.line(
            1,
            &format!("for (long long o = blockIdx.x; o < {rows}; o += gridDim.x) {{"),
        );
        (2, "threadIdx.x", "blockDim.x")
    } else {
        w.signature(&kernel.inputs, false, kernel.out.dtype, kernel.side.len());
        w.line(
            1,
            &format!(
                "for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < {rows}; o += (long long)gridDim.x * blockDim.x) {{"
            ),
        );
        (2, "0", "1")
    };
    let row_loop = format!("for (long long r = {lane_start}; r < {length}; r += {lane_step}) {{");
    w.coords(indent, "c", "o", kept);
    w.line(indent, &format!("{t} acc = {init};"));
    w.line(indent, &row_loop);
    w.coords(indent + 1, "c", "r", reduced);
    let space_index = flat_index(shape, "c");
    let element = Element {
        suffix: "",
        index: &space_index,
        coords: "c",
        lane: None,
        acc: None,
    };
    let value = w.block(indent + 1, prologue, &kernel.inputs, &element)?;
    let combined = combine(w, (*op, dtype), "acc", &value);
    w.line(indent + 1, &format!("acc = {combined};"));
    w.line(indent, "}");
    if by_rows {
        across_block(w, indent, (*op, dtype), &init);
    }
    if broadcast {
        // The body over the row just reduced, `acc` broadcast along it.
        w.line(indent, &row_loop);
        w.coords(indent + 1, "c", "r", reduced);
        let element = Element {
            acc: Some("acc"),
            ..element
        };
        let result = w.block(indent + 1, &kernel.body, &kernel.inputs, &element)?;
        let result = w.stored(kernel.out.dtype, &result);
        w.line(indent + 1, &format!("out[{space_index}] = {result};"));
        w.line(indent, "}");
    } else {
        reduced_output(w, indent, kernel, by_rows)?;
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
    let grid = if by_rows {
        let threads = length.next_multiple_of(32).clamp(32, 256) as u32;
        Grid::Rows { rows, threads }
    } else {
        Grid::Flat { steps: rows.max(1) }
    };
    Ok(grid)
}

/// `a` and `b` combined by `op` in `dtype`.
fn combine(w: &mut Writer, (op, dtype): (ReduceOp, DType), a: &str, b: &str) -> String {
    match (op, dtype) {
        (ReduceOp::Sum, DType::F32 | DType::F64) => format!("{a} + {b}"),
        (ReduceOp::Sum, ty) => wrap(&format!("{} + {}", widen(a, ty), widen(b, ty)), ty),
        (ReduceOp::Max, DType::F32) => {
            w.helpers.insert("kiln_max");
            format!("kiln_max({a}, {b})")
        }
        (ReduceOp::Max, DType::F64) => {
            w.helpers.insert("kiln_maxd");
            format!("kiln_maxd({a}, {b})")
        }
        (ReduceOp::Max, _) => format!("{a} > {b} ? {a} : {b}"),
        (ReduceOp::Prod, DType::F32 | DType::F64) => format!("{a} * {b}"),
        // In `long long` (unsigned for i64), wrapped back, as `mul` of integers.
        (ReduceOp::Prod, ty) => wrap(&format!("{} * {}", widen(a, ty), widen(b, ty)), ty),
    }
}

/// Each thread's `acc` combined across the block (a warp shuffle, then
/// the warps' partial values through shared memory), left in every
/// thread's `acc`.
fn across_block(w: &mut Writer, indent: usize, (op, dtype): (ReduceOp, DType), init: &str) {
    let t = ctype(dtype);
    let shuffle = match dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I64 => "long long",
        DType::I32 | DType::U8 | DType::Bool => "int",
        // `pass::widen` reduces 16-bit floats in f32.
        DType::BF16 | DType::F16 => "float",
    };
    // The shuffle into a variable first: every lane of the warp must
    // reach it, and an integer max names its operand twice, the second
    // time on one side of `?:` only (lanes that skipped it left the
    // others waiting: argmax hung on the GPU).
    let across = format!(
        "for (int s = 16; s > 0; s >>= 1) {{ const {t} down = ({t})__shfl_down_sync(0xffffffffu, ({shuffle})acc, s); acc = {}; }}",
        combine(w, (op, dtype), "acc", "down")
    );
    w.line(indent, &format!("__shared__ {t} partial[32];"));
    w.line(indent, &across);
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
    w.line(indent + 1, &across);
    w.line(indent + 1, "if (threadIdx.x == 0) partial[0] = acc;");
    w.line(indent, "}");
    w.line(indent, "__syncthreads();");
    w.line(indent, "acc = partial[0];");
}

/// The body of a reduced output at output element `o`, from `acc`, with
/// the kernel's side outputs; by one thread of the block when `by_rows`.
fn reduced_output(
    w: &mut Writer,
    indent: usize,
    kernel: &Kernel,
    by_rows: bool,
) -> Result<(), Error> {
    // Output element `o` reads combined value `o`, at its own coordinates.
    if by_rows {
        w.line(indent, "if (threadIdx.x == 0) {");
    } else {
        w.line(indent, "{");
    }
    let out = &kernel.out.shape;
    w.coords(indent + 1, "e", "o", &placed_axes(out, 0..out.rank()));
    let element = Element {
        suffix: "",
        index: "o",
        coords: "e",
        lane: None,
        acc: Some("acc"),
    };
    let result = w.block(indent + 1, &kernel.body, &kernel.inputs, &element)?;
    let result = w.stored(kernel.out.dtype, &result);
    w.line(indent + 1, &format!("out[o] = {result};"));
    // Only a reduced output has side outputs (`Kernel::check`).
    for (k, s) in kernel.side.iter().enumerate() {
        let value = w.stored(kernel.out.dtype, &format!("v{}", s.value));
        w.line(indent + 1, &format!("side{k}[o] = {value};"));
    }
    w.line(indent, "}");
    Ok(())
}

/// The row-major flat index of coordinates `{prefix}{axis}` in `shape`
/// (size-1 axes have none and add nothing).
pub(super) fn flat_index(shape: &Shape, prefix: &str) -> String {
    let strides = shape.strides();
    let terms: Vec<String> = placed_axes(shape, 0..shape.rank())
        .into_iter()
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
