//! Which blocks run in vector lanes on a target whose lanes need an
//! instruction for every op (`Target::vector_ops`: the CPU's f32x4 and
//! i32x4): the rules the loop plan (`super::plan`) decides by, and the
//! types whose values the CPU renderer holds four to a vector
//! (`has_lanes`).

use kiln_ir::kernel::{Block, Expr};
use kiln_ir::{BinaryOp, DType, UnaryOp};

use crate::nest::Access;

/// Whether `block`, of an f32 result, can run four lanes at a time: every
/// value one with a lane form (`lane_op`: f32 arithmetic, and the i32
/// values, comparisons, `where`s and casts a mask makes on the way, as a
/// causal attention's `where(row >= col, s, -inf)`), with reads as
/// `lanes_read` takes them.
pub(crate) fn vectorizable(block: &Block, accesses: &[Access], out: Option<&Access>) -> bool {
    block.dtype() == Some(DType::F32)
        && block.values.iter().all(|v| lane_op(block, v))
        && lanes_read(block, accesses, out)
}

/// Whether every read of `block` (`accesses`, in its order) is contiguous
/// or constant along the inner loop, or a 4-byte load of every other
/// element (two vectors and a shuffle, `Emitter::load_at`), and the write
/// (if any) contiguous.
fn lanes_read(block: &Block, accesses: &[Access], out: Option<&Access>) -> bool {
    let mut reads = block.values.iter().filter(|v| v.expr.read().is_some());
    let reads_ok = accesses.iter().all(|a| {
        let paired = reads
            .next()
            .is_some_and(|v| matches!(v.expr, Expr::Load { .. }) && v.dtype.size() == 4);
        a.row_invariant() || a.unit_stride() || (paired && a.stride_two())
    });
    reads_ok && out.is_none_or(Access::unit_stride)
}

/// Whether every value of `block` is f32 arithmetic that has a vector form.
pub(crate) fn f32_arithmetic(block: &Block) -> bool {
    block.values.iter().all(f32_lane_op)
}

/// Whether `v` is f32 arithmetic that has a vector form.
fn f32_lane_op(v: &kiln_ir::kernel::Value) -> bool {
    v.dtype == DType::F32
        && match &v.expr {
            Expr::Load { .. } | Expr::Const(_) | Expr::Acc => true,
            Expr::Unary(op, _) => !called(*op),
            // `uniform` is f32 from i32 operands: lanes of i32, not f32.
            Expr::Binary(op, _, _) => {
                !op.is_comparison()
                    && !matches!(op, BinaryOp::Pow | BinaryOp::Rem | BinaryOp::Uniform)
            }
            Expr::Where(..) | Expr::Cast(_) | Expr::Gather { .. } => false,
        }
}

/// Whether an elementwise block (or a matmul's epilogue) runs four lanes
/// at a time: every value a `lane_op`, except those `hoisted` computes once
/// per row as scalars and splats, which need only have lanes (an
/// optimizer's bias correction, a `pow` of the step count, leaves its
/// update in vectors; so does a row's label compared along it) or be read
/// only as gathers' index (an i64 id, kept a scalar), and gathers whose
/// index is hoisted (a row picked once per row); a result stored as f32,
/// i32, bf16 or f16; reads as `lanes_read` takes them.
pub(crate) fn vectorizable_hoisted(
    block: &Block,
    accesses: &[Access],
    out: &Access,
    hoisted: &[bool],
) -> bool {
    // A hoisted value that only gathers read as their index stays a scalar.
    let only_indexes = |i: usize| {
        block.values.iter().zip(hoisted).all(|(u, h)| {
            *h || matches!(u.expr, Expr::Gather { index, .. } if index as usize == i)
                || !u.expr.operands().contains(&(i as u32))
        })
    };
    let values_ok = block
        .values
        .iter()
        .zip(hoisted)
        .enumerate()
        .all(|(i, (v, &h))| match (h, &v.expr) {
            (true, _) => has_lanes(v.dtype) || only_indexes(i),
            // A gather runs in lanes along a row it picks once per row.
            (false, Expr::Gather { index, .. }) => has_lanes(v.dtype) && hoisted[*index as usize],
            (false, _) => lane_op(block, v),
        });
    let stored_ok = matches!(
        block.dtype(),
        Some(DType::F32 | DType::I32 | DType::BF16 | DType::F16)
    );
    values_ok && stored_ok && lanes_read(block, accesses, Some(out))
}

/// Whether values of `dtype` run four to a vector: f32, bf16 and f16 (as
/// f32, `half`) in f32x4; i32, u8 (zero-extended) and bool (a mask of all
/// ones or all zeros, as a comparison makes it) in i32x4. The 64-bit types do not: two lanes would
/// not pay for the conversions around them.
pub(crate) fn has_lanes(dtype: DType) -> bool {
    !matches!(dtype, DType::F64 | DType::I64)
}

/// Whether `v` of `block` has a lane form: f32 arithmetic but `pow` and
/// `rem`, i32 arithmetic but `rem`, comparisons, `where`, casts between types with lanes. u8 and
/// bool lanes hold their values widened, where adding or multiplying would
/// not wrap at 8 bits: of those only comparisons, max and min.
fn lane_op(block: &Block, v: &kiln_ir::kernel::Value) -> bool {
    let dtype_of = |x: u32| block.values[x as usize].dtype;
    has_lanes(v.dtype)
        && match &v.expr {
            Expr::Load { .. } | Expr::Const(_) | Expr::Where(..) => true,
            Expr::Acc => v.dtype == DType::F32,
            Expr::Unary(op, _) => matches!(v.dtype, DType::F32 | DType::I32) && !called(*op),
            Expr::Binary(op, x, _) => match dtype_of(*x) {
                DType::F32 => !matches!(op, BinaryOp::Pow | BinaryOp::Rem),
                DType::I32 => *op != BinaryOp::Rem,
                DType::U8 | DType::Bool => {
                    op.is_comparison() || matches!(op, BinaryOp::Max | BinaryOp::Min)
                }
                DType::F64 | DType::I64 | DType::BF16 | DType::F16 => false,
            },
            // An i32 into a 16-bit float goes through f64 (`cast`), which
            // has no lanes: through f32 it could round twice.
            Expr::Cast(x) => {
                has_lanes(dtype_of(*x)) && !(dtype_of(*x) == DType::I32 && v.dtype.is_half())
            }
            // Only with its index hoisted (`vectorizable_hoisted`).
            Expr::Gather { .. } => false,
        }
}

/// Whether `op` has no vector form on the CPU: the trigonometric and
/// hyperbolic functions (tanh aside) are a call per element, in f64 and
/// rounded back, as the interpreter computes them.
pub(crate) fn called(op: UnaryOp) -> bool {
    matches!(op, UnaryOp::Trig(_))
}
