//! A matmul plan (`crate::matmul`) rendered for CUDA: the CUDA C of its
//! prologue and epilogue kernels, and its GEMM as cuBLASLt or cuBLAS takes
//! it, column-major (`ColumnMajor`).

use kiln_ir::DType;
use kiln_ir::kernel::Kernel;

use super::codegen::{self, Program};
use crate::Error;
use crate::matmul::{Epilogue, Plan, Source, Target, blas, plan};

/// A matmul kernel on a GPU: its plan, the prologue kernels that write its
/// written operands into scratch (in the plan's order, `a` then `b`), the
/// GEMM, and the kernel computing the output from the product where the
/// plan's epilogue is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatMul {
    /// The plan it renders.
    pub plan: Plan,
    /// For each written operand, the kernel that writes it.
    pub prologues: Vec<Program>,
    /// The product.
    pub gemm: Gemm,
    /// The epilogue kernel: its parameters are the kernel's inputs, then
    /// the product, then the output.
    pub epilogue: Option<Program>,
}

/// Matmul `kernel` planned for CUDA and rendered: `fused` allows
/// cuBLASLt's bias and ReLU epilogues (TF32) and its products of bf16
/// operands read in place; without it (cuBLAS's `sgemm`) every operand is
/// f32 and every epilogue but the product is a kernel.
pub fn matmul(kernel: &Kernel, fused: bool) -> Result<MatMul, Error> {
    let plan = plan(kernel, Target::cuda(fused))?;
    let mut prologues = Vec::new();
    let mut operand = |o: &crate::matmul::PlanOperand| -> Result<GemmOperand, Error> {
        let source = match &o.source {
            Source::Input { input, .. } => OperandSource::Input(*input),
            Source::Written { prologue, at, .. } => {
                prologues.push(codegen::kernel(prologue)?);
                OperandSource::Scratch(*at)
            }
        };
        let view = o.view();
        let s = blas(&view).ok_or_else(|| {
            crate::codegen(
                crate::label(kernel),
                format!("a GEMM operand cuBLAS cannot step through: {}", view.shape),
            )
        })?;
        Ok(GemmOperand {
            source,
            dtype: o.dtype,
            offset: s.offset,
            row_stride: s.row,
            col_stride: s.col,
            batch_stride: s.batch,
        })
    };
    let (a, b) = (operand(&plan.a)?, operand(&plan.b)?);
    let epilogue = match plan.epilogue {
        Epilogue::Kernel { .. } => Some(codegen::elementwise(
            &kernel.inputs,
            Some(()),
            &kernel.body,
            &kernel.out,
            &kernel.side,
        )?),
        // cuBLASLt's bias is one per column of kiln's products, and it has
        // no cap; its epilogues here add a bias: `Target::cuda` asks for
        // none of those.
        Epilogue::Bias { rows: true, .. }
        | Epilogue::Bias { cap: Some(_), .. }
        | Epilogue::Bias { bias: None, .. } => {
            return Err(crate::codegen(
                crate::label(kernel),
                "a bias per row, a cap or no bias in cuBLASLt's epilogue",
            ));
        }
        Epilogue::Product | Epilogue::Bias { .. } => None,
    };
    let product = match plan.epilogue {
        Epilogue::Product => kernel.out.dtype,
        _ => DType::F32,
    };
    let gemm = Gemm {
        product,
        batches: plan.batches,
        m: plan.m,
        n: plan.n,
        k: plan.k,
        a,
        b,
    };
    Ok(MatMul {
        plan,
        prologues,
        gemm,
        epilogue,
    })
}

/// `out[batch] = a[batch] @ b[batch]` over row-major matrices, f32 or both
/// bf16, with arbitrary element strides, one of which is 1 for each
/// operand, summed in f32 and stored as `product`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// The product's elements: f32, or bf16 rounded from the f32 sums.
    pub product: DType,
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
    /// Its elements: f32 or bf16.
    pub dtype: DType,
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
