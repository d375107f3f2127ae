//! The matmul driver: a matmul kernel's computed operands run into scratch,
//! its operands as strided matrices, and the product batch by batch by the
//! GEMM path of this process (`cpu::gemm`), with the epilogue run over each
//! block of rows as kiln's cores finish it, or over the product after.

#![allow(unsafe_code)]

use kiln_ir::DType;
use kiln_ir::kernel::Operand;
use kiln_ir::view::View;

use super::CompiledKernel;
use super::launch::{Bound, Buffer, PARALLEL_ELEMENTS, run_rows};
use crate::Error;
use crate::cpu::gemm::{self, Isa};

impl CompiledKernel {
    /// Runs a matmul kernel over its launch's buffers (`bound`): its
    /// computed operands into `scratch`, the GEMM core, then the epilogue.
    pub(super) fn run_matmul(
        &self,
        [a, b]: [&Operand; 2],
        bound: &Bound<'_>,
        inputs: &[&Buffer],
        out: &Buffer,
        scratch: &Buffer,
    ) -> Result<(), Error> {
        let (k, table) = (&self.kernel, &bound.table);
        let isa = gemm::isa()?;
        // Computed operands lie one after the other in scratch.
        let mut parts = Vec::with_capacity(2);
        let mut at = 0;
        for (side, prologue) in [a, b].into_iter().zip(&self.operands) {
            parts.push(match (side, prologue) {
                (Operand::Read { input, view }, _) => Strided::new(view, inputs[*input as usize]),
                (Operand::Computed { shape, .. }, Some(prologue)) => {
                    let bytes = shape.numel() * DType::F32.size();
                    let mut part = scratch.part(at, bytes);
                    at += bytes;
                    prologue.run(inputs, &mut part, &mut [], &mut Buffer::empty())?;
                    Strided::new(&View::contiguous(shape), &part)
                }
                (Operand::Computed { .. }, None) => {
                    return Err(Error::Launch(
                        "a computed operand was not compiled".to_string(),
                    ));
                }
            });
        }
        let (b, a) = (parts.pop(), parts.pop());
        let (Some(a), Some(b)) = (a, b) else {
            return Err(Error::Launch("a matmul has two operands".to_string()));
        };
        // Only an epilogue that does more than copy the product needs a
        // pass: over each block of rows as the GEMM core finishes it,
        // or over the whole product after.
        let epilogue = k.body.values.len() > 1;
        let (batches, m, n) = (a.batches(), a.rows, b.cols);
        if a.cols != b.rows || batches * m * n > out.bytes / 4 {
            return Err(Error::Launch(format!(
                "a product of {batches} x [{m}, {}] @ [{}, {n}] does not fit {} output bytes",
                a.cols, b.rows, out.bytes
            )));
        }
        // The GEMM core splits its own work across threads (it packs the
        // operands once for all of them); the epilogue then sweeps the
        // output in row ranges.
        let work = batches * m * n * a.cols.max(1);
        let threads = if work < PARALLEL_ELEMENTS * 64 {
            1
        } else {
            rayon::current_num_threads()
        };
        // The epilogue takes each block of rows as the GEMM core finishes it
        // when its launch's rows are the product's: a launch of one row is
        // over elements instead (a product of one row, bias and relu, had
        // the epilogue on its first element only), and runs after.
        let by_rows = epilogue && self.range.rows == batches * m && self.range.row_len == n;
        let mut pending = epilogue;
        for batch in 0..batches {
            let rows = |r0: usize, r1: usize| {
                if by_rows {
                    // SAFETY: the product's rows `r0..r1` of this batch
                    // are rows of the epilogue's launch, finished and
                    // touched by no other thread meanwhile.
                    unsafe { bound.call(batch * m + r0, batch * m + r1, 0) }
                }
            };
            // SAFETY: `isa` came from `gemm::isa`; `a` and `b` read inside
            // buffers whose lengths were checked against views the verifier
            // bounded; the output holds every row of every batch (checked
            // above).
            let finished = unsafe { gemm_block(isa, &a, &b, table.out(), batch, threads, &rows) };
            pending &= !(finished && by_rows);
        }
        if pending {
            run_rows(std::slice::from_ref(bound))?;
        }
        Ok(())
    }
}

/// A matmul operand as the GEMM core takes it: element strides in place of
/// a view.
struct Strided {
    ptr: *const f32,
    offset: isize,
    batch: Vec<(usize, isize)>,
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
}

// SAFETY: an operand is only read, and only while the buffers of the launch
// that made it are borrowed by `run`.
unsafe impl Sync for Strided {}

impl Strided {
    fn new(view: &View, buf: &Buffer) -> Strided {
        let dims = view.shape.dims();
        let r = dims.len();
        Strided {
            ptr: buf.ptr as *const f32,
            offset: view.offset,
            batch: dims[..r - 2]
                .iter()
                .zip(&view.strides)
                .map(|(&d, &s)| (d, s as isize))
                .collect(),
            rows: dims[r - 2],
            cols: dims[r - 1],
            row_stride: view.strides[r - 2] as isize,
            col_stride: view.strides[r - 1] as isize,
        }
    }

    fn batches(&self) -> usize {
        self.batch.iter().map(|b| b.0).product()
    }

    /// The element offset of batch `index`.
    fn batch_offset(&self, mut index: usize) -> isize {
        let mut offset = self.offset;
        for &(dim, stride) in self.batch.iter().rev() {
            offset += (index % dim) as isize * stride;
            index /= dim;
        }
        offset
    }
}

/// `out[batch] = a[batch] @ b[batch]`, on `threads` threads, by the GEMM
/// path `isa`; true when it called `finish(r0, r1)` on each block of rows
/// as it was done.
///
/// # Safety
/// `isa` must be available, `a` and `b` must read inside live buffers for
/// every row and batch, and `out` must hold `batches * a.rows * b.cols` f32
/// that no one else writes in those rows.
unsafe fn gemm_block(
    isa: Isa,
    a: &Strided,
    b: &Strided,
    out: *mut u8,
    batch: usize,
    threads: usize,
    finish: &(dyn Fn(usize, usize) + Sync),
) -> bool {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if m == 0 || n == 0 {
        return false;
    }
    // An operand with no elements (k == 0) may have any offset, even one
    // before its buffer (a padded empty view): its address is formed without
    // the in-bounds promise of `offset`, and the GEMM reads nothing through it.
    let operand = |s: &Strided| gemm::Operand {
        ptr: s.ptr.wrapping_offset(s.batch_offset(batch)),
        rows: s.row_stride,
        cols: s.col_stride,
    };
    // SAFETY: the caller guarantees that the output rows and, when k > 0,
    // every operand element the GEMM reads lie inside their buffers.
    unsafe {
        let c = std::slice::from_raw_parts_mut((out as *mut f32).add(batch * m * n), m * n);
        gemm::gemm(isa, m, n, k, operand(a), operand(b), c, threads, finish)
    }
}
