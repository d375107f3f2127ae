//! The epilogues of a matmul kernel that a GEMM applies as it stores the
//! product, rather than in a pass over the product after: the product
//! itself, `acc + bias` and `relu(acc + bias)`, `bias` one value per column
//! of the product, broadcast over its rows and batches. cuBLASLt has them
//! as epilogues of its own (`cuda::plan`); kiln's CPU cores apply them in
//! registers (`cpu::gemm`). Shared by both backends.

use kiln_ir::kernel::{Expr, Kernel, KernelKind};
use kiln_ir::{BinaryOp, UnaryOp};

/// What a GEMM stores for a matmul kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// The product: the kernel's body is its `acc`.
    Product,
    /// The product plus kernel input `bias` (one value per column), then
    /// ReLU if `relu`.
    Bias {
        /// The kernel input holding the bias.
        bias: u32,
        /// Whether ReLU follows.
        relu: bool,
    },
}

/// What the GEMM of a matmul `kernel` stores, when its body is one of the
/// forms above, it writes no side output, and the output's rows are the
/// product's (`n` columns); `None` otherwise (and for other kernels).
pub fn stored(kernel: &Kernel) -> Option<Stored> {
    let KernelKind::MatMul { b, .. } = &kernel.kind else {
        return None;
    };
    let n = *b.shape().dims().last()?;
    let out = kernel.out.shape.dims();
    if !kernel.side.is_empty() || out.last() != Some(&n) {
        return None;
    }
    // One value per column, at offset 0 (so that the bias is the input's
    // first `n` elements).
    let is_bias = |e: &Expr| match e {
        Expr::Load { input, view } => {
            let mut strides = vec![0usize; out.len()];
            strides[out.len() - 1] = usize::from(n != 1);
            (view.mask.is_none() && view.offset == 0 && view.strides.as_slice() == strides)
                .then_some(*input)
        }
        _ => None,
    };
    match kernel.body.values.as_slice() {
        [acc] if acc.expr == Expr::Acc => Some(Stored::Product),
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
            added.then_some(Stored::Bias { bias, relu })
        }
        _ => None,
    }
}
