//! Products of bf16 values: both operands bf16 (inputs read where they
//! lie, or, where bf16 is the faster, computed values rounded to bf16, as
//! mixed precision's operands are, written as bf16 by their prologues),
//! summed in f32 by a GEMM that multiplies bf16 (`Target::bf16`).

use kiln_ir::DType;
use kiln_ir::kernel::{Block, Expr, Kernel, KernelKind, Operand};
use kiln_ir::view::View;

use super::{Epilogue, Plan, PlanOperand, Source, Target};

/// The plan of matmul `kernel` (`batches` products of `[m, k] @ [k, n]`)
/// as a GEMM of bf16 operands, where both hold bf16 values and `target`
/// multiplies them; `None` elsewhere.
pub(super) fn plan(
    kernel: &Kernel,
    target: Target,
    (batches, m, n, k): (usize, usize, usize, usize),
) -> Option<Plan> {
    let KernelKind::MatMul { a, b } = &kernel.kind else {
        return None;
    };
    // Both operands bf16 values widened to f32, which a bf16 GEMM reads as
    // bf16: a bf16 input read where it lies (through any view, or one BLAS
    // steps through), or computed values rounded to bf16 (mixed
    // precision's operands), which its prologue writes as bf16.
    let halves = [a, b].map(|o| {
        let read =
            widened_bf16(o).filter(|(_, view)| target.any_view || super::blas(view).is_some());
        match read {
            Some((input, view)) => Some(Half::Read(input, view)),
            None => rounded_bf16(o)
                .filter(|_| target.bf16_faster)
                .map(Half::Rounded),
        }
    });
    let ([Some(a_half), Some(b_half)], true) = (halves, target.bf16) else {
        return None;
    };
    let mut scratch = 0;
    let mut operand = |o: &Operand, half: Half| {
        let source = match half {
            Half::Read(input, view) => Source::Input {
                input,
                view: view.clone(),
            },
            Half::Rounded(block) => {
                let rounded = Operand::Computed {
                    shape: o.shape().clone(),
                    block,
                };
                super::prologue_source(kernel, &rounded, DType::BF16, target, &mut scratch)
            }
        };
        PlanOperand {
            shape: o.shape().clone(),
            dtype: DType::BF16,
            source,
        }
    };
    let (a, b) = (operand(a, a_half), operand(b, b_half));
    let epilogue = epilogue(kernel, target, m, n, &mut scratch);
    Some(Plan {
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

/// The epilogue of a GEMM of bf16 operands, which applies none of its
/// own: the product stored as it is, or rounded to bf16
/// (`Target::stores_bf16`), else a kernel after it (`kernel_epilogue`).
fn epilogue(kernel: &Kernel, target: Target, m: usize, n: usize, scratch: &mut usize) -> Epilogue {
    match super::stored(kernel, m, n) {
        Some(Epilogue::Product) => Epilogue::Product,
        _ if target.stores_bf16 && rounded_product(kernel) => Epilogue::Product,
        _ => super::kernel_epilogue(kernel, target, scratch),
    }
}

/// A GEMM operand that holds bf16 values.
enum Half<'a> {
    /// A bf16 kernel input, read through this view.
    Read(u32, &'a View),
    /// Computed values rounded to bf16: this block computes them as bf16.
    Rounded(Block),
}

/// The block that computes operand `o` as bf16 values, where its last
/// step widens a bf16 value to f32 (mixed precision's rounding,
/// `cast(cast(x, bf16), f32)`, or a bf16 input no GEMM reads in place):
/// the block up to that bf16 value.
fn rounded_bf16(o: &Operand) -> Option<Block> {
    let Operand::Computed { block, .. } = o else {
        return None;
    };
    let last = block.values.last()?;
    let Expr::Cast(narrow) = last.expr else {
        return None;
    };
    let narrow = narrow as usize;
    (last.dtype == DType::F32 && block.values[narrow].dtype == DType::BF16).then(|| Block {
        values: block.values[..=narrow].to_vec(),
    })
}

/// Whether the kernel's output is its product rounded to bf16, in order:
/// `bf16 @ bf16` as `pass::widen` writes it.
fn rounded_product(kernel: &Kernel) -> bool {
    let [acc, cast] = kernel.body.values.as_slice() else {
        return false;
    };
    kernel.side.is_empty()
        && kernel.out.dtype == DType::BF16
        && acc.expr == Expr::Acc
        && cast.expr == Expr::Cast(0)
        && cast.dtype == DType::BF16
}

/// The bf16 input and its view that operand `o` casts to f32, where that
/// is all it computes and the view reads no padding.
fn widened_bf16(o: &Operand) -> Option<(u32, &View)> {
    let Operand::Computed { block, .. } = o else {
        return None;
    };
    match block.values.as_slice() {
        [load, cast] if load.dtype == DType::BF16 && cast.dtype == DType::F32 => {
            match (&load.expr, &cast.expr) {
                (Expr::Load { input, view }, Expr::Cast(0)) if view.mask.is_none() => {
                    Some((*input, view))
                }
                _ => None,
            }
        }
        _ => None,
    }
}
