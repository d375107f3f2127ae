//! The matmul driver: a matmul kernel's plan (`crate::matmul`) run, its
//! written operands into scratch first, its operands as strided matrices,
//! and the product batch by batch by the GEMM path of this process
//! (`cpu::gemm`), with the epilogue applied in registers by kiln's cores
//! where it is a bias and ReLU, else run over each block of rows as they
//! finish it, or over the product after.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

use kiln_ir::DType;
use kiln_ir::Shape;
use kiln_ir::view::View;

use super::CompiledKernel;
use super::compile::MatMul;
use super::launch::{Bound, Buffer, run_rows};
use crate::Error;
use crate::cpu::gemm::{self, Isa};
use crate::cpu::team;
use crate::matmul::{Epilogue, Source};

/// Batches of at most this many multiply-adds each run side by side, one
/// thread each, rather than one after the other across every thread.
const BATCH_WORK: usize = 1 << 22;

/// Where a matmul's computed operand is written: into its launch's
/// scratch, or into a buffer an executable keeps for a later launch whose
/// operand is the same (`CompiledKernel::computed`), where that launch
/// then finds it.
pub(crate) enum Computed {
    Scratch,
    Keep(Buffer),
    Kept(Buffer),
}

impl CompiledKernel {
    /// Runs a matmul kernel by its plan over its launch's buffers
    /// (`bound`): its written operands where `computed` says, the GEMM
    /// core, then the epilogue.
    pub(super) fn run_matmul(
        &self,
        MatMul { plan, prologues }: &MatMul,
        bound: &Bound<'_>,
        (inputs, out, scratch): (&[&Buffer], &Buffer, &Buffer),
        computed: &[Computed; 2],
    ) -> Result<(), Error> {
        let table = &bound.table;
        let isa = gemm::isa()?;
        let mut parts = Vec::with_capacity(2);
        let sides = [&plan.a, &plan.b].into_iter().zip(prologues).zip(computed);
        for ((operand, prologue), place) in sides {
            let shape = &operand.shape;
            parts.push(match (&operand.source, prologue, operand.written_view()) {
                (Source::Input { input, view }, _, _) => {
                    let buffer = inputs.get(*input as usize).ok_or_else(|| {
                        Error::Launch(format!("a matmul operand of input {input}"))
                    })?;
                    Strided::new(view, shape, buffer)?
                }
                (Source::Written { at, .. }, Some(prologue), Some(view)) => {
                    let bytes = shape.numel() * DType::F32.size();
                    let (mut part, there) = match place {
                        Computed::Scratch => (scratch.part(*at, bytes), false),
                        Computed::Keep(buffer) => (buffer.alias(), false),
                        Computed::Kept(buffer) => (buffer.alias(), true),
                    };
                    if part.bytes < bytes {
                        return Err(Error::Launch(format!(
                            "a written operand {shape} in {} bytes",
                            part.bytes
                        )));
                    }
                    if !there {
                        prologue.run(inputs, &mut part, &mut [], &mut Buffer::empty())?;
                    }
                    Strided::new(&view, shape, &part)?
                }
                (Source::Written { .. }, _, _) => {
                    return Err(Error::Launch(
                        "a written operand was not compiled".to_string(),
                    ));
                }
            });
        }
        let (b, a) = (parts.pop(), parts.pop());
        let (Some(a), Some(b)) = (a, b) else {
            return Err(Error::Launch("a matmul has two operands".to_string()));
        };
        let (batches, m, n) = (a.batches(), a.rows, b.cols);
        if a.cols != b.rows || batches * m * n > out.bytes / 4 {
            return Err(Error::Launch(format!(
                "a product of {batches} x [{m}, {}] @ [{}, {n}] does not fit {} output bytes",
                a.cols, b.rows, out.bytes
            )));
        }
        // A bias and ReLU kiln's cores apply as they store the product.
        let in_registers = match plan.epilogue {
            Epilogue::Bias {
                bias,
                relu,
                rows,
                cap,
            } => {
                let bias = inputs
                    .get(bias as usize)
                    .ok_or_else(|| Error::Launch(format!("a bias of input {bias}")))?;
                let (len, what) = if rows { (m, "rows") } else { (n, "columns") };
                if bias.bytes < len * 4 {
                    return Err(Error::Launch(format!(
                        "a bias of {} bytes for a product of {len} {what}",
                        bias.bytes
                    )));
                }
                Some(gemm::Fused {
                    bias: bias.ptr as *const f32,
                    rows,
                    relu,
                    cap: cap.map(f32::from_bits),
                })
            }
            Epilogue::Product | Epilogue::Kernel { .. } => None,
        };
        // An epilogue needs a pass where the GEMM core does not apply it (a
        // kernel's, or a bias on a path other than kiln's cores): over each
        // block of rows as the core finishes it, or over the product after.
        let epilogue = plan.epilogue != Epilogue::Product;
        // The GEMM core splits its own work across threads (each packs what
        // it reads of the operands); the epilogue then sweeps the
        // output in row ranges. A thread per 64³ multiply-adds, up to the
        // team's: the second thread pays from about that size, as at 100³
        // and at the training step's 250x256x10 (`benches/RESULTS-cpu.md`).
        let work = batches * m * n * a.cols.max(1);
        let threads = (work / (64 * 64 * 64)).clamp(1, team::threads());
        // The epilogue takes each block of rows as the GEMM core finishes it
        // when its launch's rows are the product's: a launch of one row is
        // over elements instead (a product of one row, bias and relu, had
        // the epilogue on its first element only), and runs after.
        let by_rows = epilogue
            && in_registers.is_none()
            && self.range.rows == batches * m
            && self.range.row_len == n;
        // What kiln's cores leave done: the epilogue, where they apply it or
        // call the rows' pass as they finish them.
        let done = by_rows || in_registers.is_some();
        let in_registers = in_registers.unwrap_or(gemm::Fused::NONE);
        let mut pending = epilogue;
        let one_batch = |batch: usize, threads: usize| {
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
            // above), and each batch's rows are written by its call alone.
            unsafe {
                let out = table.out();
                gemm_block(isa, (&a, &b, out), batch, threads, in_registers, &rows)
            }
        };
        if threads > 1 && batches >= 2 * threads && m * n * a.cols <= BATCH_WORK {
            let unfinished = AtomicBool::new(false);
            team::for_each(batches, &|batch| {
                if !one_batch(batch, 1) {
                    unfinished.store(true, Ordering::Relaxed);
                }
            });
            let all_finished = !unfinished.into_inner();
            pending &= !(all_finished && done);
        } else {
            for batch in 0..batches {
                let finished = one_batch(batch, threads);
                pending &= !(finished && done);
            }
        }
        if pending {
            run_rows(std::slice::from_ref(bound))?;
        }
        Ok(())
    }
}

/// A matmul operand as the GEMM core takes it: element strides in place of
/// a view, and tables of offsets for rows or columns that merge axes
/// without one stride between them (`Operand::Merged`).
struct Strided {
    ptr: *const f32,
    offset: isize,
    batch: Vec<(usize, isize)>,
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
    row_table: Option<Vec<isize>>,
    col_table: Option<Vec<isize>>,
}

// SAFETY: an operand is only read, and only while the buffers of the launch
// that made it are borrowed by `run`.
unsafe impl Sync for Strided {}

impl Strided {
    /// The operand of `shape` that `view` presents in row-major order: the
    /// view itself, or its axes merged into `shape`'s.
    fn new(view: &View, shape: &Shape, buf: &Buffer) -> Result<Strided, Error> {
        let own = || Some((0..shape.rank()).map(|a| a..a + 1).collect::<Vec<_>>());
        let runs = (if view.shape == *shape {
            own()
        } else {
            View::runs(&view.shape, shape)
        })
        .filter(|runs| runs.len() >= 2)
        .ok_or_else(|| {
            Error::Launch(format!(
                "a matmul operand {shape} does not merge the axes of its view {}",
                view.shape
            ))
        })?;
        let r = runs.len();
        let axes = |run: &std::ops::Range<usize>| -> Vec<(usize, isize)> {
            run.clone()
                .map(|a| (view.shape.dims()[a], view.strides[a] as isize))
                .collect()
        };
        let rows = Merged::new(axes(&runs[r - 2]));
        let cols = Merged::new(axes(&runs[r - 1]));
        Ok(Strided {
            ptr: buf.ptr as *const f32,
            offset: view.offset,
            batch: runs[..r - 2].iter().flat_map(axes).collect(),
            rows: rows.len,
            cols: cols.len,
            row_stride: rows.stride,
            col_stride: cols.stride,
            row_table: rows.table,
            col_table: cols.table,
        })
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

/// The axes (extent, stride) that make up one axis of an operand: one
/// stride where they merge into one, else each index's offset.
struct Merged {
    len: usize,
    stride: isize,
    table: Option<Vec<isize>>,
}

impl Merged {
    fn new(axes: Vec<(usize, isize)>) -> Merged {
        let len = axes.iter().map(|a| a.0).product();
        // Axes of one element move nothing; an outer axis continuing the
        // next inner one merges with it.
        let mut kept: Vec<(usize, isize)> = Vec::new();
        for (d, s) in axes.into_iter().rev().filter(|a| a.0 != 1) {
            match kept.last_mut() {
                Some(inner) if s == inner.1 * inner.0 as isize => inner.0 *= d,
                _ => kept.push((d, s)),
            }
        }
        match kept.as_slice() {
            [] => Merged {
                len,
                stride: 0,
                table: None,
            },
            &[(_, stride)] => Merged {
                len,
                stride,
                table: None,
            },
            _ => {
                let mut table = vec![0isize];
                for &(d, s) in &kept {
                    table = (0..d as isize)
                        .flat_map(|i| table.iter().map(move |&t| i * s + t))
                        .collect();
                }
                Merged {
                    len,
                    stride: 0,
                    table: Some(table),
                }
            }
        }
    }
}

/// `out[batch] = a[batch] @ b[batch]`, on `threads` threads, by the GEMM
/// path `isa`; true when it applied `epilogue` and called `finish(r0, r1)`
/// on each block of rows as it was done.
///
/// # Safety
/// `isa` must be available, `a` and `b` must read inside live buffers for
/// every row and batch, `out` must hold `batches * a.rows * b.cols` f32
/// that no one else writes in those rows, and a bias of `epilogue`
/// `b.cols` live ones (`a.rows` where it holds one per row).
unsafe fn gemm_block(
    isa: Isa,
    (a, b, out): (&Strided, &Strided, *mut u8),
    batch: usize,
    threads: usize,
    epilogue: gemm::Fused,
    finish: &(dyn Fn(usize, usize) + Sync),
) -> bool {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if m == 0 || n == 0 {
        return false;
    }
    // An operand with no elements (k == 0) may have any offset, even one
    // before its buffer (a padded empty view): its address is formed without
    // the in-bounds promise of `offset`, and the GEMM reads nothing through it.
    let table = |t: &Option<Vec<isize>>| t.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    let operand = |s: &Strided| gemm::Operand {
        ptr: s.ptr.wrapping_offset(s.batch_offset(batch)),
        rows: s.row_stride,
        cols: s.col_stride,
        row_table: table(&s.row_table),
        col_table: table(&s.col_table),
    };
    // SAFETY: the caller guarantees that the output rows and, when k > 0,
    // every operand element the GEMM reads lie inside their buffers.
    unsafe {
        let c = std::slice::from_raw_parts_mut((out as *mut f32).add(batch * m * n), m * n);
        gemm::gemm(
            isa,
            m,
            n,
            k,
            operand(a),
            operand(b),
            c,
            threads,
            epilogue,
            finish,
        )
    }
}
