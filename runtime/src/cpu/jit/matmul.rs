//! The matmul driver: a matmul kernel's plan (`crate::matmul`) run, its
//! written operands into scratch first, its operands as strided matrices
//! over their buffers' values, and the product batch by batch by the GEMM
//! of this process's path (`kiln_machine::gemm`), with the epilogue applied
//! in registers by kiln's cores where it is a bias, ReLU and a cap (each if
//! there), else run over each block of rows as they finish it, or over the
//! product after.
//!
//! `unsafe` here is that epilogue's call of the generated code over the
//! rows the GEMM hands back finished.

#![allow(unsafe_code)]

use std::sync::{Arc, Mutex};

use kiln_ir::DType;
use kiln_ir::Data;
use kiln_ir::Shape;
use kiln_ir::kernel::Kernel;
use kiln_ir::view::View;
use kiln_machine::gemm::{self, Axis, Bias, Matrix, PackedB, Product, Table};
use kiln_machine::team;

use super::CompiledKernel;
use super::compile::MatMul;
use super::launch::{Bound, Buffer, run_rows, views};
use crate::matmul::{Epilogue, PlanOperand, Source};
use crate::{Error, Role};

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

/// A matmul's right operand packed once (`gemm::PackedB`) from a value
/// that every run passes as the same input (a captured weight), and that
/// value, held so that it stays alive and unchanged: a run that passes
/// another buffer multiplies the operand where it lies.
pub(crate) struct PackedOperand {
    value: Arc<Data>,
    packed: PackedB,
}

impl PackedOperand {
    /// Whether `buffer` is the value it was packed from.
    fn holds(&self, buffer: &Buffer) -> bool {
        let held = Buffer::input(self.value.as_ref().into());
        held.ptr == buffer.ptr && held.bytes == buffer.bytes
    }
}

impl CompiledKernel {
    /// The right operand of this matmul kernel, where it reads kernel
    /// input `input` as f32 and the same matrix for every batch: its shape
    /// and the view it reads through, which tell two launches that read the
    /// same matrix of a value.
    pub(crate) fn constant_b(&self, input: usize) -> Option<(Shape, View)> {
        let matmul = self.matmul.as_ref()?;
        let b = &matmul.plan.b;
        match &b.source {
            Source::Input { input: i, view } if *i as usize == input && b.dtype == DType::F32 => {
                let one = matmul.layouts[1]
                    .batch
                    .iter()
                    .all(|&(_, stride)| stride == 0);
                one.then(|| (b.shape.clone(), view.clone()))
            }
            _ => None,
        }
    }

    /// The right operand of this matmul kernel (`constant_b`'s) packed
    /// from `value`, through the layout worked out when the kernel was
    /// compiled, where this process's path packs it.
    pub(crate) fn pack_b(&self, value: &Arc<Data>) -> Result<Option<PackedOperand>, Error> {
        let kernel = &self.kernel;
        let (Some(matmul), Data::F32(values), isa) =
            (&self.matmul, value.as_ref(), crate::cpu_isa()?)
        else {
            return Ok(None);
        };
        let layout = &matmul.layouts[1];
        // Packing is an optimization: where its panels cannot be allocated
        // the product reads the operand where it lies.
        let packed = match PackedB::new(isa, layout.matrix(values, 0)) {
            Err(kiln_machine::Error::PackTooLarge { .. }) => None,
            packed => packed.map_err(|error| Error::Machine {
                kernel: crate::label(kernel),
                error,
            })?,
        };
        Ok(packed.map(|packed| PackedOperand {
            value: Arc::clone(value),
            packed,
        }))
    }

    /// Runs a matmul kernel by its plan over its launch's buffers
    /// (`bound`; `product`, where the GEMM stores the product,
    /// `MatMul::product`): its written operands where `computed` says, the
    /// GEMM core (over `packed`, the right operand packed before, where the
    /// launch passes the value it was packed from), then the epilogue.
    pub(super) fn run_matmul(
        &self,
        MatMul {
            plan,
            prologues,
            layouts,
        }: &MatMul,
        bound: &Bound<'_>,
        (inputs, product, scratch): (&[&Buffer], &Buffer, &Buffer),
        computed: &[Computed; 2],
        packed: Option<&PackedOperand>,
    ) -> Result<(), Error> {
        let mut product = product.alias();
        let isa = crate::cpu_isa()?;
        let kernel = &self.kernel;
        let [a, b] = [0, 1].map(|side| {
            let place = &computed[side];
            let prologue = prologues[side].as_deref();
            let operand = [&plan.a, &plan.b][side];
            operand_at(
                Side {
                    kernel,
                    side,
                    place,
                },
                (operand, &layouts[side]),
                prologue,
                (inputs, scratch),
            )
        });
        let (((a_role, a_buffer), a), ((b_role, b_buffer), b)) = (a?, b?);
        let packed =
            (packed.filter(|p| p.holds(&b_buffer) && p.packed.isa() == isa)).map(|p| &p.packed);
        if a.cols.len() != b.rows.len() {
            let problem = format!("operands of {} and {} rows", a.cols.len(), b.rows.len());
            return Err(crate::launch(crate::label(kernel), problem));
        }
        let run = Run {
            batches: a.batches(),
            m: a.rows.len(),
            n: b.cols.len(),
            k: a.cols.len(),
            epilogue: plan.epilogue != Epilogue::Product,
            in_registers: false,
        };
        let machine = |error| Error::Machine {
            kernel: crate::label(kernel),
            error,
        };
        if plan.a.dtype == DType::BF16 {
            let read = [(a_role, a_buffer), (b_role, b_buffer)];
            let ([a_values, b_values], c) = views::<u16, 2>(kernel, &read, &mut product)?;
            let product: &Batch<'_> = &|batch, c, threads, rows| {
                let (a, b) = (a.matrix(a_values, batch), b.matrix(b_values, batch));
                gemm::bf16_gemm(isa, a, b, c, threads, rows).map_err(machine)
            };
            return self.batches(bound, run, c, product);
        }
        // A bias, ReLU and a cap (each if there) kiln's cores apply as they
        // store the product: the bias the third buffer read, else an empty
        // one.
        let (bias, in_registers) = match plan.epilogue {
            Epilogue::Bias {
                bias: Some(bias),
                relu,
                rows,
                cap,
            } => {
                let buffer = inputs.get(bias as usize).ok_or_else(|| {
                    crate::launch(crate::label(kernel), format!("no input {bias}, its bias"))
                })?;
                let read = (Role::Input(bias as usize), buffer.alias());
                (read, Some((Some(rows), relu, cap.map(f32::from_bits))))
            }
            Epilogue::Bias {
                bias: None,
                relu,
                cap,
                ..
            } => (
                (Role::Scratch, Buffer::empty()),
                Some((None, relu, cap.map(f32::from_bits))),
            ),
            Epilogue::Product | Epilogue::Kernel { .. } => ((Role::Scratch, Buffer::empty()), None),
        };
        let read = [(a_role, a_buffer), (b_role, b_buffer), bias];
        let ([a_values, b_values, bias], c) = views::<f32, 3>(kernel, &read, &mut product)?;
        let fused = match in_registers {
            Some((rows, relu, cap)) => gemm::Fused {
                bias: rows.map(|rows| match rows {
                    true => Bias::Rows(bias),
                    false => Bias::Columns(bias),
                }),
                relu,
                cap,
            },
            None => gemm::Fused::default(),
        };
        let product: &Batch<'_> = &|batch, c, threads, rows| {
            let (a, b) = (a.matrix(a_values, batch), b.matrix(b_values, batch));
            match packed {
                Some(packed) => gemm::sgemm_packed(isa, a, packed, fused, c, rows)
                    .map(|()| true)
                    .map_err(machine),
                None => {
                    gemm::sgemm(isa, Product { a, b, fused }, c, threads, rows).map_err(machine)
                }
            }
        };
        let in_registers = in_registers.is_some();
        self.batches(
            bound,
            Run {
                in_registers,
                ..run
            },
            c,
            product,
        )
    }

    /// The product of `run`, batch by batch (`product` computes one into
    /// its part of `c`), then the epilogue's pass where the GEMM has not
    /// done it: over each block of rows as the core finishes it, or over
    /// the product after.
    fn batches(
        &self,
        bound: &Bound<'_>,
        Run {
            batches,
            m,
            n,
            k,
            epilogue,
            in_registers,
        }: Run,
        c: &mut [f32],
        product: &Batch<'_>,
    ) -> Result<(), Error> {
        let values = batches.saturating_mul(m).saturating_mul(n);
        if values > c.len() {
            return Err(Error::Fit {
                kernel: crate::label(&self.kernel),
                buffer: Role::Output,
                bytes: size_of_val(c),
                needs: values.saturating_mul(size_of::<f32>()),
            });
        }
        // The GEMM core splits its own work across threads (each packs what
        // it reads of the operands); the epilogue then sweeps the
        // output in row ranges.
        let threads = gemm::threads_for(values * k.max(1));
        // The epilogue takes each block of rows as the GEMM core finishes it
        // when its launch's rows are the product's: a launch of one row is
        // over elements instead (a product of one row, bias and relu, had
        // the epilogue on its first element only), and runs after.
        let by_rows =
            epilogue && !in_registers && self.range.rows == batches * m && self.range.row_len == n;
        // What kiln's cores leave done: the epilogue, where they apply it or
        // call the rows' pass as they finish them.
        let done = by_rows || in_registers;
        let one_batch = |batch: usize, c: &mut [f32], threads: usize| {
            let rows = |r0: usize, r1: usize| {
                if by_rows {
                    // SAFETY: the product's rows `r0..r1` of this batch
                    // are rows of the epilogue's launch, finished and
                    // touched by no other thread meanwhile.
                    unsafe { bound.call(batch * m + r0, batch * m + r1, 0) }
                }
            };
            product(batch, c, threads, &rows)
        };
        // Whether every batch's product left the epilogue done.
        let mut all_done = done && m * n > 0;
        let products = &mut c[..values];
        if m * n == 0 {
            // No product to compute: the epilogue, if any, runs after.
        } else if threads > 1 && batches >= 2 * threads && m * n * k <= BATCH_WORK {
            let outcome = Mutex::new(Ok(true));
            team::for_each_chunk(products, m * n, &|batch, c| {
                let result = one_batch(batch, c, 1);
                let mut outcome = outcome.lock().unwrap_or_else(|e| e.into_inner());
                if let Ok(finished) = *outcome {
                    *outcome = result.map(|f| finished && f);
                }
            });
            let finished = outcome.into_inner().unwrap_or_else(|e| e.into_inner())?;
            all_done &= finished;
        } else {
            for (batch, c) in products.chunks_mut(m * n).enumerate() {
                all_done &= one_batch(batch, c, threads)?;
            }
        }
        if epilogue && !all_done {
            run_rows(std::slice::from_ref(bound))?;
        }
        Ok(())
    }
}

impl MatMul {
    /// Where the GEMM stores the f32 product, for the epilogue to read it:
    /// the launch's output, or its part of `scratch` where the plan keeps it
    /// there (an output that cannot hold it, `Kernel::holds_product`).
    pub(super) fn product(&self, out: &Buffer, scratch: &Buffer) -> Buffer {
        match self.plan.product_at() {
            Some(at) => {
                let values = self.plan.batches * self.plan.m * self.plan.n;
                scratch.part(at, values * size_of::<f32>())
            }
            None => out.alias(),
        }
    }
}

/// A product's sizes, and what becomes of it: whether an epilogue follows,
/// and whether the GEMM applies it in registers.
#[derive(Clone, Copy)]
struct Run {
    batches: usize,
    m: usize,
    n: usize,
    k: usize,
    epilogue: bool,
    in_registers: bool,
}

/// One batch's product into its part of the product's buffer, on so many
/// threads, calling the function on each block of rows done; true where
/// the GEMM applied the epilogue and called it.
type Batch<'a> = dyn Fn(usize, &mut [f32], usize, &(dyn Fn(usize, usize) + Sync)) -> Result<bool, Error>
    + Sync
    + 'a;

/// Which operand of which matmul kernel, and where it is computed.
struct Side<'a> {
    kernel: &'a Kernel,
    /// 0 for `a`, 1 for `b`.
    side: usize,
    place: &'a Computed,
}

/// A matmul operand's buffer, and its layout (`Strided::of`): an input
/// where it lies, or an operand its prologue writes, written where
/// `at.place` says (into scratch, or a kept buffer) unless an earlier
/// launch has.
fn operand_at<'l>(
    at: Side<'_>,
    (operand, layout): (&PlanOperand, &'l Strided),
    prologue: Option<&CompiledKernel>,
    (inputs, scratch): (&[&Buffer], &Buffer),
) -> Result<((Role, Buffer), &'l Strided), Error> {
    let shape = &operand.shape;
    let buffer = match (&operand.source, prologue) {
        (Source::Input { input, .. }, _) => {
            let buffer = inputs.get(*input as usize).ok_or_else(|| {
                crate::launch(
                    crate::label(at.kernel),
                    format!("no input {input}, an operand"),
                )
            })?;
            (Role::Input(*input as usize), buffer.alias())
        }
        (Source::Written { at: offset, .. }, Some(prologue)) => {
            let bytes = shape.numel() * operand.dtype.size();
            let (mut part, there) = match at.place {
                Computed::Scratch => (scratch.part(*offset, bytes), false),
                Computed::Keep(buffer) => (buffer.alias(), false),
                Computed::Kept(buffer) => (buffer.alias(), true),
            };
            if part.bytes < bytes {
                return Err(Error::Fit {
                    kernel: crate::label(at.kernel),
                    buffer: Role::Operand(at.side),
                    bytes: part.bytes,
                    needs: bytes,
                });
            }
            if !there {
                prologue.run(inputs, &mut part, &mut [], &mut Buffer::empty())?;
            }
            (Role::Operand(at.side), part)
        }
        (Source::Written { .. }, None) => {
            let problem = format!("written operand {} without its prologue", at.side);
            return Err(crate::launch(crate::label(at.kernel), problem));
        }
    };
    Ok((buffer, layout))
}

/// A matmul operand as the GEMM takes it (an attention's, as its kernel
/// takes it): element strides in place of a view, and tables of offsets for
/// rows or columns that merge axes without one stride between them
/// (`Operand::Merged`).
pub(super) struct Strided {
    offset: isize,
    batch: Vec<(usize, isize)>,
    rows: Merged,
    cols: Merged,
}

impl Strided {
    /// A matmul operand's layout (`PlanOperand::view`). Worked out once, when
    /// the kernel is compiled: a table's offsets built at every launch
    /// were a few percent of a convolution's time, on one thread while the
    /// others waited.
    pub(super) fn of(operand: &PlanOperand) -> Result<Strided, String> {
        Strided::new(&operand.view(), &operand.shape)
    }

    /// The operand of `shape` that `view` presents in row-major order: the
    /// view itself, or its axes merged into `shape`'s.
    pub(super) fn new(view: &View, shape: &Shape) -> Result<Strided, String> {
        let own = || Some((0..shape.rank()).map(|a| a..a + 1).collect::<Vec<_>>());
        let runs = (if view.shape == *shape {
            own()
        } else {
            View::runs(&view.shape, shape)
        })
        .filter(|runs| runs.len() >= 2)
        .ok_or_else(|| {
            format!(
                "operand {shape} does not merge the axes of its view {}",
                view.shape
            )
        })?;
        let r = runs.len();
        let axes = |run: &std::ops::Range<usize>| -> Vec<(usize, isize)> {
            run.clone()
                .map(|a| (view.shape.dims()[a], view.strides[a] as isize))
                .collect()
        };
        Ok(Strided {
            offset: view.offset,
            batch: runs[..r - 2].iter().flat_map(axes).collect(),
            rows: Merged::new(axes(&runs[r - 2])),
            cols: Merged::new(axes(&runs[r - 1])),
        })
    }

    fn batches(&self) -> usize {
        self.batch.iter().map(|b| b.0).product()
    }

    /// Where batch `index`'s element (0, 0) lies.
    fn offset(&self, mut index: usize) -> isize {
        let mut offset = self.offset;
        for &(dim, stride) in self.batch.iter().rev() {
            offset += (index % dim) as isize * stride;
            index /= dim;
        }
        offset
    }

    /// Where each batch's element (0, 0) lies, in order.
    pub(super) fn offsets(&self) -> Vec<isize> {
        (0..self.batches()).map(|b| self.offset(b)).collect()
    }

    /// Batch `index` of the operand, over `data`.
    fn matrix<'a, T>(&'a self, data: &'a [T], index: usize) -> Matrix<'a, T> {
        Matrix {
            data,
            offset: self.offset(index),
            rows: self.rows.axis(),
            cols: self.cols.axis(),
        }
    }
}

/// The axes (extent, stride) that make up one axis of an operand: one
/// stride where they merge into one, else each index's offset.
struct Merged {
    len: usize,
    stride: isize,
    table: Option<Table>,
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
                    table: Some(Table::new(table)),
                }
            }
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn axis(&self) -> Axis<'_> {
        match &self.table {
            Some(table) => Axis::Table(table),
            None => Axis::Strided {
                len: self.len,
                stride: self.stride,
            },
        }
    }
}
