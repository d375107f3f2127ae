//! The loops of a reduction, as its plan says (`loops::Reduce`): per row,
//! the prologue combined over the inner loop (in f32x4 with several
//! accumulators, or by a call of 256-bit code where the row's block
//! matches one), then the epilogue once or over the row again; four short
//! rows at once, one per lane; or, for a sum over a leading axis, blocks of
//! output rows accumulated in place while the reduced axis is walked in
//! memory order.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{self, InstBuilder, MemFlagsData, Value, types};
use cranelift_frontend::Variable;
use kiln_ir::kernel::{Block, Expr};
use kiln_ir::{DType, ReduceOp};

use super::emit::{Emitter, Placed, RowBase, Rows};
use super::exp_sum::exp_argument;
use super::row_call::ROW_CALL_MIN;
use super::row_fold::RowFold;
use super::{Host, RowRange, UNROLL, clif_type};
use crate::loops::{By, Reduce, Runs};
use crate::nest::Nest;

/// Output rows accumulated together by a sum over a leading axis: 16 KiB of
/// f32, which stay in L1 while the reduced axis is walked, and read as 16 KiB
/// contiguous runs of each input row (4 KiB runs were slower: every run a
/// new page, which prefetchers do not cross; `benches/RESULTS-cpu.md`).
const COLUMN_BLOCK: i64 = 4096;

/// Rows of a reduction from this long (32 KiB of f32) are read as `UNROLL`
/// segments at once, a vector of each per trip: a core keeps more lines in
/// flight from several streams than from one (on Zen 3, four streams of
/// 16-byte loads beat one). Zen 4 reads one stream of 32-byte loads
/// fastest: where the row calls run, a plain read's max or sum goes to a
/// 256-bit call (`row_call`), and only computed rows come here. Shorter
/// rows come from cache, where order is moot or worse (sum_all 1024² read
/// in segments took longer). Measured in `benches/RESULTS-cpu.md`.
pub(super) const LONG_ROW: usize = 8192;

impl<'a> Emitter<'a> {
    /// A reduction: per row, the prologue combined over the inner loop, then
    /// the epilogue once (reduced output) or over the row again
    /// (broadcast); its rows as the plan says (`By`).
    pub(super) fn reduce(&mut self, r: &Reduce, start: Value, end: Value) -> RowRange {
        let Reduce { prologue, pro, .. } = r;
        let dtype = prologue.dtype().unwrap_or(DType::F32);
        let inner_len: usize = pro.inner.iter().product();
        let header = self.b.create_block();
        let exit = self.b.create_block();
        self.b.append_block_param(header, types::I64);
        self.b.ins().jump(header, &[start.into()]);
        self.b.switch_to_block(header);
        let row = self.b.block_params(header)[0];
        let more = self.b.ins().icmp(IntCC::SignedLessThan, row, end);
        let next = self.b.create_block();
        self.b.ins().brif(more, next, &[], exit, &[]);
        self.b.switch_to_block(next);
        match r.by {
            By::Columns => {
                // A block of rows stays inside one run of the innermost row
                // axis, where neighbouring rows are neighbours in memory.
                let last = pro.accesses[0].outer.last().map_or(1, |o| o.dim) as i64;
                let within = self.b.ins().urem_imm_s(row, last);
                let run_end = self.b.ins().isub(row, within);
                let run_end = self.b.ins().iadd_imm_s(run_end, last);
                let block_end = self.b.ins().iadd_imm_s(row, COLUMN_BLOCK);
                let block_end = self.b.ins().smin(block_end, run_end);
                let block_end = self.b.ins().smin(block_end, end);
                self.reduce_column_block(r, row, block_end, inner_len);
                self.b.ins().jump(header, &[block_end.into()]);
            }
            By::FourRows => {
                let (four, one_row) = (self.b.create_block(), self.b.create_block());
                let last = self.b.ins().iadd_imm_s(row, 4);
                let fits = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, last, end);
                self.b.ins().brif(fits, four, &[], one_row, &[]);
                self.b.switch_to_block(four);
                self.reduce_four_short_rows(r, row, inner_len);
                self.b.ins().jump(header, &[last.into()]);
                // The rows four at once leave.
                self.b.switch_to_block(one_row);
                self.row_alone(r, (dtype, inner_len), row, header);
            }
            By::Rows => {
                let one_row = self.b.create_block();
                self.b.ins().jump(one_row, &[]);
                self.b.switch_to_block(one_row);
                self.row_alone(r, (dtype, inner_len), row, header);
            }
        }
        self.b.switch_to_block(exit);
        RowRange {
            rows: pro.rows,
            row_len: inner_len.max(1),
        }
    }

    /// Row `row` alone, then on to the next row at `header`.
    fn row_alone(
        &mut self,
        r: &Reduce,
        (dtype, inner_len): (DType, usize),
        row: Value,
        header: ir::Block,
    ) {
        self.reduce_row(r, dtype, row, inner_len);
        let following = self.b.ins().iadd_imm_s(row, 1);
        self.b.ins().jump(header, &[following.into()]);
    }

    /// The prologue's first contiguous read, a line of which each trip
    /// reads `ahead` rows on (see `signature`): its address there, and its
    /// element type.
    fn first_ahead(&mut self, prologue: &Block, pro: &Nest, row: Value) -> Option<(Value, DType)> {
        prologue
            .values
            .iter()
            .filter(|v| v.expr.read().is_some())
            .zip(&pro.accesses)
            .find(|(v, a)| matches!(v.expr, Expr::Load { .. }) && a.unit_stride())
            .map(|(v, a)| (self.row_ahead(a, v.dtype, row, pro.rows), v.dtype))
    }

    /// One row of a reduction: the prologue combined over the inner loop
    /// (four inner elements per lane group when it can, or by a call), then
    /// the epilogue.
    fn reduce_row(&mut self, r: &Reduce, dtype: DType, row: Value, inner_len: usize) {
        let Reduce {
            prologue, pro, epi, ..
        } = r;
        let op = r.op;
        let lanes = r.lanes;
        let e = self;
        let bases = e.bases(&pro.accesses, row);
        let zero = e.iconst(0);
        let hoisted = e.hoist(
            prologue,
            &pro.accesses,
            Rows::One(&bases),
            (None, &[]),
            &r.once.prologue,
        );
        let pro_at = Placed {
            block: prologue,
            accesses: &pro.accesses,
            rows: Rows::One(&bases),
            hoisted: &hoisted,
        };
        let n = e.iconst(inner_len as i64);
        let init = e.scalar_const(op.init(dtype));
        let acc = e.b.declare_var(clif_type(dtype));
        e.b.def_var(acc, init);
        let epi_bases = e.bases(&epi.accesses, row);
        let out_base = epi_bases[epi_bases.len() - 1];
        let out = &epi.accesses[epi.accesses.len() - 1];
        let store = r.reused.is_some();
        // A max over vectors runs `maxps` alone, where IEEE `maximum` takes
        // five instructions: NaNs are noted apart, and a row whose max comes
        // out zero, where `maxps` may have kept -0 over +0, is walked again.
        let nans = (lanes && op == ReduceOp::Max && dtype == DType::F32).then(|| {
            let none = e.b.ins().iconst(types::I32, 0);
            let none = e.b.ins().splat(types::I32X4, none);
            let nans = e.b.declare_var(types::I32X4);
            e.b.def_var(nans, none);
            nans
        });
        let f = RowFold {
            op,
            dtype,
            pro_at,
            stored: store.then_some((out, out_base)),
            n,
            zero,
            init,
            nans,
        };
        let mut from = zero;
        let ahead = if lanes {
            e.first_ahead(prologue, pro, row)
        } else {
            None
        };
        // A long enough row's sum of exponentials, or max or sum of a plain
        // read: by a call, in 256-bit vectors (`exp_sum`, `row_call`).
        let row_calls = e.row_calls() && lanes && dtype == DType::F32 && inner_len >= ROW_CALL_MIN;
        let exp_call = (row_calls && op == ReduceOp::Sum)
            .then(|| exp_argument(prologue))
            .flatten();
        let row_fold = match op {
            ReduceOp::Max => Some(Host::MaxRow),
            ReduceOp::Sum => Some(Host::SumRow),
            _ => None,
        };
        let fold_call = row_fold
            .filter(|_| row_calls && !store)
            .and_then(|host| e.fold_row(host, pro_at, inner_len));
        if let Some(total) = fold_call {
            e.b.def_var(acc, total);
            from = n;
        } else if let Some(a) = exp_call {
            let argument = Block {
                values: prologue.values[..=a].to_vec(),
            };
            let at = Placed {
                block: &argument,
                hoisted: &hoisted[..=a],
                ..pro_at
            };
            let total = e.exp_sum_row(at, f.stored, inner_len, ahead);
            e.b.def_var(acc, total);
            from = n;
        } else if lanes {
            from = e.fold_row_lanes(&f, acc, inner_len, ahead);
        }
        match &r.once.runs {
            Some(runs) => e.reduce_runs(r, (runs, dtype), row, acc, &hoisted),
            None => e.fold_scalars(&f, acc, from),
        }
        let total = e.b.use_var(acc);
        let total = e.pin(total);
        e.row_epilogue(r, &epi_bases, total, inner_len);
    }

    /// The epilogue of one row of a reduction, from the row's reduced value
    /// `total`: over the row (four lanes at a time where it can, or by a
    /// call), or once for a reduced output. `bases`: the epilogue's reads
    /// and the output positioned at the row.
    fn row_epilogue(&mut self, r: &Reduce, bases: &[RowBase], total: Value, inner_len: usize) {
        let Reduce { body, epi, .. } = r;
        let broadcast = r.broadcast;
        let epi_reads = &epi.accesses[..epi.accesses.len() - 1];
        let epi_lanes = r.epilogue_lanes;
        let e = self;
        let out_base = bases[bases.len() - 1];
        let out = &epi.accesses[epi.accesses.len() - 1];
        let store = r.reused.is_some();
        let zero = e.iconst(0);
        let n = e.iconst(inner_len as i64);
        let hoisted = e.hoist(
            body,
            epi_reads,
            Rows::One(bases),
            (Some(total), &[]),
            &r.once.epilogue,
        );
        let epi_at = Placed {
            block: body,
            accesses: epi_reads,
            rows: Rows::One(bases),
            hoisted: &hoisted,
        };
        // An epilogue scaling a long enough row: by a call, in 256-bit vectors.
        let scaled = broadcast
            && epi_lanes
            && e.side.is_empty()
            && inner_len >= ROW_CALL_MIN
            && e.row_calls()
            && e.scale_row(epi_at, (out, out_base), inner_len);
        if scaled {
            // The call stored the row.
        } else if broadcast {
            let mut from = zero;
            if epi_lanes {
                let splat = e.b.ins().splat(types::F32X4, total);
                for unroll in [UNROLL, 1] {
                    from = e.counted_loop(from, n, 4 * unroll as i64, |e, j| {
                        for u in 0..unroll {
                            let j = e.b.ins().iadd_imm_s(j, 4 * u as i64);
                            let v = e.block(epi_at, j, Some(splat), true);
                            e.store(out, out_base, j, v);
                        }
                    });
                }
                // A ragged tail: the last four elements again, the overlap
                // recomputed to the same values. Not when the epilogue reads
                // back the output it overwrites (`store`).
                if !inner_len.is_multiple_of(4) && inner_len >= 4 && !store {
                    let j = e.iconst((inner_len - 4) as i64);
                    let v = e.block(epi_at, j, Some(splat), true);
                    e.store(out, out_base, j, v);
                    from = n;
                }
            }
            e.counted_loop(from, n, 1, |e, j| {
                let v = e.block(epi_at, j, Some(total), false);
                e.store(out, out_base, j, v);
            });
        } else {
            e.store_body(epi_at, (out, out_base), zero, (Some(total), false), false);
        }
    }

    /// The prologue over row `row` of several inner axes, one element at a
    /// time, combined into `acc` one run of the last axis after another,
    /// each computing once what its plan says (`loops::Runs`). Values
    /// constant over the whole row come `hoisted` already.
    fn reduce_runs(
        &mut self,
        r: &Reduce,
        (runs, dtype): (&Runs, DType),
        row: Value,
        acc: Variable,
        hoisted: &[Option<Value>],
    ) {
        let Reduce { prologue, pro, .. } = r;
        let op = r.op;
        let along = pro.inner[pro.inner.len() - 1];
        let count = pro.inner.iter().product::<usize>() / along;
        let accesses = &runs.accesses;
        let first = self.b.ins().imul_imm_s(row, count as i64);
        let zero = self.iconst(0);
        let (count, n) = (self.iconst(count as i64), self.iconst(along as i64));
        self.counted_loop(zero, count, 1, |e, k| {
            let run = e.b.ins().iadd(first, k);
            let bases = e.bases(accesses, run);
            let rows = Rows::One(&bases);
            let hoisted = e.hoist(prologue, accesses, rows, (None, hoisted), &runs.hoisted);
            let at = Placed {
                block: prologue,
                accesses,
                rows,
                hoisted: &hoisted,
            };
            e.counted_loop(zero, n, 1, |e, j| {
                let v = e.block(at, j, None, false);
                let a = e.b.use_var(acc);
                let a = e.combine(op, dtype, a, v);
                e.b.def_var(acc, a);
            });
        });
    }

    /// Rows `row..row + 4` of a reduction with short rows, one row per lane:
    /// every read gathers the four rows' elements at one inner index, values
    /// constant along the rows are computed once, and the results go back
    /// to the four rows one lane at a time. f32 arithmetic, unpadded reads.
    fn reduce_four_short_rows(&mut self, r: &Reduce, row: Value, inner_len: usize) {
        let Reduce {
            prologue,
            pro,
            body,
            epi,
            ..
        } = r;
        let op = r.op;
        let broadcast = r.broadcast;
        let rows: Vec<Value> = (0..4).map(|l| self.b.ins().iadd_imm_s(row, l)).collect();
        let pro_bases = self.lane_pointers(&pro.accesses, &rows);
        let epi_bases = self.lane_pointers(&epi.accesses, &rows);
        let zero = self.iconst(0);
        let hoisted = self.hoist(
            prologue,
            &pro.accesses,
            Rows::Four(&pro_bases),
            (None, &[]),
            &r.once.four.prologue,
        );
        let pro_at = Placed {
            block: prologue,
            accesses: &pro.accesses,
            rows: Rows::Four(&pro_bases),
            hoisted: &hoisted,
        };
        let init = self.scalar_const(op.init(DType::F32));
        let init = self.b.ins().splat(types::F32X4, init);
        let acc = self.b.declare_var(types::F32X4);
        self.b.def_var(acc, init);
        // Rows this short are walked unrolled, at constant inner indices:
        // a loop of one vector per trip spent much of it counting (log_softmax
        // [4096, 10] took longer: `benches/RESULTS-cpu.md`).
        for j in 0..inner_len {
            let j = self.iconst(j as i64);
            let v = self.block(pro_at, j, None, true);
            let a = self.b.use_var(acc);
            let a = self.combine(op, DType::F32, a, v);
            self.b.def_var(acc, a);
        }
        let total = self.b.use_var(acc);
        let (reads, out) = epi.accesses.split_at(epi.accesses.len() - 1);
        let hoisted = self.hoist(
            body,
            reads,
            Rows::Four(&epi_bases),
            (Some(total), &[]),
            &r.once.four.epilogue,
        );
        let epi_at = Placed {
            block: body,
            accesses: reads,
            rows: Rows::Four(&epi_bases),
            hoisted: &hoisted,
        };
        let out_lanes = &epi_bases[epi_bases.len() - 1];
        let store = |e: &mut Self, j: Value, v: Value| {
            let inner = e.inner_bytes(&out[0], j, e.out_dtype);
            for (lane, &base) in out_lanes.iter().enumerate() {
                let x = e.b.ins().extractlane(v, lane as u8);
                let addr = e.b.ins().iadd(base, inner);
                e.b.ins()
                    .store(MemFlagsData::new().with_notrap(), x, addr, 0);
            }
        };
        if broadcast {
            for j in 0..inner_len {
                let j = self.iconst(j as i64);
                let v = self.block(epi_at, j, Some(total), true);
                store(self, j, v);
            }
        } else {
            let v = self.block(epi_at, zero, Some(total), true);
            store(self, zero, v);
        }
    }

    /// Rows `from..to` of a reduction whose rows are neighbours in memory (a
    /// sum over a leading axis): the output rows accumulate in place, four
    /// rows per vector, while the reduced axis is walked once in memory
    /// order; then the epilogue runs on them in place.
    fn reduce_column_block(&mut self, r: &Reduce, from: Value, to: Value, inner_len: usize) {
        let Reduce {
            prologue,
            pro,
            body,
            epi,
            ..
        } = r;
        let op = r.op;
        let out_ptr = self.ptrs[epi.accesses[epi.accesses.len() - 1].buffer];
        let flags = MemFlagsData::new().with_notrap();
        let init = self.scalar_const(op.init(DType::F32));
        let vinit = self.b.ins().splat(types::F32X4, init);
        let addr = |e: &mut Self, rr: Value| {
            let bytes = e.b.ins().imul_imm_s(rr, 4);
            e.b.ins().iadd(out_ptr, bytes)
        };
        self.row_span(from, to, &mut |e, rr, lanes| {
            let a = addr(e, rr);
            let v = if lanes { vinit } else { init };
            e.b.ins().store(flags, v, a, 0);
        });
        let bases = self.bases(&pro.accesses, from);
        let zero = self.iconst(0);
        let n = self.iconst(inner_len as i64);
        let none = vec![None; prologue.values.len()];
        self.counted_loop(zero, n, 1, |e, j| {
            // Each read's offset at (row `from`, reduced index `j`), once per
            // `j`: Cranelift would recompute it for every vector of the span.
            let at_j: Vec<Value> = pro
                .accesses
                .iter()
                .zip(&bases)
                .map(|(a, b)| {
                    let (offset, _) = e.element(a, *b, j);
                    e.pin(offset)
                })
                .collect();
            e.row_span(from, to, &mut |e, rr, lanes| {
                let d = e.b.ins().isub(rr, from);
                let shifted: Vec<RowBase> = pro
                    .accesses
                    .iter()
                    .zip(&at_j)
                    .map(|(a, &at)| {
                        let step = a.outer.last().map_or(0, |o| o.stride);
                        let off = e.b.ins().imul_imm_s(d, step);
                        RowBase {
                            base: e.b.ins().iadd(at, off),
                            valid: None,
                        }
                    })
                    .collect();
                e.row_lanes = true;
                let at = Placed {
                    block: prologue,
                    accesses: &pro.accesses,
                    rows: Rows::One(&shifted),
                    hoisted: &none,
                };
                let v = e.block(at, zero, None, lanes);
                e.row_lanes = false;
                let a = addr(e, rr);
                let ty = if lanes { types::F32X4 } else { types::F32 };
                let acc = e.b.ins().load(ty, flags, a, 0);
                let acc = e.combine(op, DType::F32, acc, v);
                e.b.ins().store(flags, acc, a, 0);
            });
        });
        let none = vec![None; body.values.len()];
        // An epilogue of arithmetic alone runs four rows at a time on the
        // sums in place; one that reads (an optimizer's state) or stores
        // side outputs, one row at a time, its reads placed at the row.
        if r.epilogue_lanes {
            self.row_span(from, to, &mut |e, rr, lanes| {
                let a = addr(e, rr);
                let ty = if lanes { types::F32X4 } else { types::F32 };
                let acc = e.b.ins().load(ty, flags, a, 0);
                let at = Placed {
                    block: body,
                    accesses: &[],
                    rows: Rows::One(&[]),
                    hoisted: &none,
                };
                let v = e.block(at, zero, Some(acc), lanes);
                e.b.ins().store(flags, v, a, 0);
            });
            return;
        }
        let (reads, out) = epi.accesses.split_at(epi.accesses.len() - 1);
        self.counted_loop(from, to, 1, |e, rr| {
            let bases = e.bases(&epi.accesses, rr);
            let a = addr(e, rr);
            let acc = e.b.ins().load(types::F32, flags, a, 0);
            let at = Placed {
                block: body,
                accesses: reads,
                rows: Rows::One(&bases),
                hoisted: &none,
            };
            let out_base = bases[bases.len() - 1];
            e.store_body(at, (&out[0], out_base), zero, (Some(acc), false), false);
        });
    }

    /// `for rr in from..to`: `UNROLL` vectors of four at a time, then four
    /// (`lanes`), then one at a time.
    fn row_span(&mut self, from: Value, to: Value, f: &mut dyn FnMut(&mut Self, Value, bool)) {
        let rest = self.counted_loop(from, to, 4 * UNROLL as i64, |e, rr| {
            for u in 0..UNROLL {
                let at = e.b.ins().iadd_imm_s(rr, 4 * u as i64);
                f(e, at, true);
            }
        });
        let rest = self.counted_loop(rest, to, 4, |e, rr| f(e, rr, true));
        self.counted_loop(rest, to, 1, |e, rr| f(e, rr, false));
    }
}
