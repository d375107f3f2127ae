//! cuBLAS `sgemm`: the IEEE f32 products of `Precision::F32` (cuBLASLt's
//! TF32 products and their epilogues are `blaslt`'s).

#![allow(unsafe_code)]

use cudarc::cublas::{CudaBlas, sys::cublasOperation_t};

use super::context::driver;
use super::gemm::ColumnMajor;
use crate::Error;

/// Enqueues `C = op(A) op(B)`, batch by batch, on `blas`'s stream.
///
/// # Safety
/// `a`, `b`, `c` must be device addresses of `blas`'s context with every
/// element the product describes inside a live allocation, `c` not
/// overlapping the others.
pub(super) unsafe fn sgemm(
    blas: &CudaBlas,
    shape: &ColumnMajor,
    [a, b, c]: [u64; 3],
) -> Result<(), Error> {
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let (one, zero) = (1.0f32, 0.0f32);
    let int = |v: usize| {
        i32::try_from(v)
            .map_err(|_| crate::launch("cuBLAS sgemm", format!("sgemm takes no dimension of {v}")))
    };
    let [sa, sb, sc] = shape.batch_strides;
    // SAFETY: the caller's; the handle's stream is the device's, and every
    // pointer is a device address of its context.
    unsafe {
        cudarc::cublas::result::sgemm_strided_batched(
            *blas.handle(),
            op(shape.transa),
            op(shape.transb),
            int(shape.m)?,
            int(shape.n)?,
            int(shape.k)?,
            &one,
            a as *const f32,
            int(shape.lda)?,
            sa as i64,
            b as *const f32,
            int(shape.ldb)?,
            sb as i64,
            &zero,
            c as *mut f32,
            int(shape.ldc)?,
            sc as i64,
            int(shape.batches)?,
        )
    }
    .map_err(|e| driver("cuBLAS sgemm", e))
}
