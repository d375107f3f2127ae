//! The plan of a matmul kernel: a GEMM (cuBLASLt, or cuBLAS in f32)
//! between generated kernels. Each computed operand's prologue writes it
//! into scratch first, and the epilogue is a kernel over the product unless
//! cuBLASLt's own bias or bias+ReLU epilogue expresses it (`GemmEpilogue`).
//! An operand view that cuBLASLt cannot stride through is copied into
//! scratch by a prologue. The plan also gives the product as column-major
//! BLAS takes it (`ColumnMajor`).

use kiln_ir::kernel::{Block, Expr, Kernel, KernelKind, Operand};
use kiln_ir::view::View;
use kiln_ir::{DType, Shape, TensorType};

use super::codegen::{self, Program};
use crate::Error;
use crate::nest::nest;
use crate::stored::{Stored, stored};

/// What a matmul kernel runs: prologues for its computed operands, the
/// GEMM, then the epilogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatMulPlan {
    /// Bytes of scratch memory it uses: computed operands, then the product
    /// when an epilogue kernel reads it, each part 256-byte aligned.
    pub scratch_bytes: usize,
    /// For each operand that is computed (or copied), the kernel that writes
    /// it into scratch at `GemmOperand::source`.
    pub prologues: Vec<Program>,
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
        program: Program,
    },
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
        // Computed, or a view cuBLASLt cannot step through: written
        // contiguously (a merged view over its own, finer shape: the same
        // elements in the same order).
        let (block, space) = match o {
            Operand::Computed { block, shape } => (block.clone(), shape.clone()),
            Operand::Read { input, view } | Operand::Merged { input, view, .. } => {
                let mut copy = Block::default();
                copy.push(
                    Expr::Load {
                        input: *input,
                        view: view.clone(),
                    },
                    DType::F32,
                );
                (copy, view.shape.clone())
            }
        };
        let shape = o.shape().clone();
        let out = TensorType::new(DType::F32, space);
        prologues.push(codegen::elementwise(
            &kernel.inputs,
            None,
            &block,
            &out,
            &[],
        )?);
        let at = scratch;
        scratch = (scratch + shape.numel() * 4).next_multiple_of(SCRATCH_ALIGN);
        Ok(contiguous_operand(&shape, at))
    };
    let (a, b) = (operand(a)?, operand(b)?);
    let epilogue = match stored(kernel) {
        Some(Stored::Product) => GemmEpilogue::None,
        // With k = 0 the product is zeros, which the runtime writes itself;
        // cuBLASLt's epilogue comes with a GEMM, so a bias needs the kernel.
        Some(Stored::Bias { bias, relu }) if fused && k > 0 => GemmEpilogue::Bias { bias, relu },
        _ => {
            let acc = scratch;
            scratch += kernel.out.shape.numel() * 4;
            GemmEpilogue::Kernel {
                acc,
                program: codegen::elementwise(
                    &kernel.inputs,
                    Some(()),
                    &kernel.body,
                    &kernel.out,
                    &kernel.side,
                )?,
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
    // The batch axes must be one stride: a loop nest over them alone merges
    // them into one axis.
    let batch_axes: Vec<usize> = (0..r - 2).collect();
    let batch = nest(&view.shape, &batch_axes, Some(r - 2), &[(0, view)]);
    let batch = &batch.accesses[0].outer;
    if batch.len() > 1 {
        return None;
    }
    let batch_stride = batch.first().map_or(0, |b| b.stride as usize);
    Some(GemmOperand {
        source,
        offset: view.offset as usize,
        row_stride,
        col_stride,
        batch_stride,
    })
}
