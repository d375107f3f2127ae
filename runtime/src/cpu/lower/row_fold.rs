//! One row of a reduction folded: the prologue read at each inner index
//! (and stored where the epilogue reads it back), combined one element at
//! a time or four lanes at a time into UNROLL vector accumulators, a max
//! in vectors made IEEE's afterwards.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use cranelift_frontend::Variable;
use kiln_ir::{DType, ReduceOp};

use super::UNROLL;
use super::emit::{Emitter, Placed, RowBase};
use super::reduce::LONG_ROW;
use crate::nest::Access;

/// What folding one row of a reduction reads and keeps: the prologue
/// placed at the row, the output row the prologue's values are also stored
/// into (`loops::Reduce::reused`), the row's length and start, the reduction's
/// first value, and for a max in vectors the NaNs seen.
#[derive(Clone, Copy)]
pub(super) struct RowFold<'p> {
    pub(super) op: ReduceOp,
    pub(super) dtype: DType,
    pub(super) pro_at: Placed<'p>,
    pub(super) stored: Option<(&'p Access, RowBase)>,
    pub(super) n: Value,
    pub(super) zero: Value,
    pub(super) init: Value,
    pub(super) nans: Option<Variable>,
}

impl Emitter<'_> {
    /// The prologue at inner index `j` (four elements with `lanes`), also
    /// stored into the output row where the epilogue reads it back.
    fn row_element(&mut self, f: &RowFold, j: Value, lanes: bool) -> Value {
        let v = self.block(f.pro_at, j, None, lanes);
        if let Some((out, out_base)) = f.stored {
            self.store(out, out_base, j, v);
        }
        v
    }

    /// The prologue combined into `acc` one element at a time, from `from`
    /// to the row's end.
    pub(super) fn fold_scalars(&mut self, f: &RowFold, acc: Variable, from: Value) {
        self.counted_loop(from, f.n, 1, |e, j| {
            let v = e.row_element(f, j, false);
            let a = e.b.use_var(acc);
            let a = e.combine(f.op, f.dtype, a, v);
            e.b.def_var(acc, a);
        });
    }

    /// Vector `v` folded into accumulator `a`: `maxps` alone for a max
    /// that notes NaNs apart.
    fn fold_lanes(&mut self, f: &RowFold, a: Value, v: Value) -> Value {
        match f.nans {
            Some(_) => self.math(true).fast_max(v, a),
            None => self.combine(f.op, DType::F32, a, v),
        }
    }

    /// Folds a vector of the row into an accumulator, noting its NaNs.
    fn fold_noting(&mut self, f: &RowFold, a: Value, v: Value) -> Value {
        if let Some(nans) = f.nans {
            let nan = self.b.ins().fcmp(FloatCC::Unordered, v, v);
            let seen = self.b.use_var(nans);
            let seen = self.b.ins().bor(seen, nan);
            self.b.def_var(nans, seen);
        }
        self.fold_lanes(f, a, v)
    }

    /// The row folded four lanes at a time into `acc`, UNROLL vector
    /// accumulators side by side, reading a line `ahead` where given;
    /// returns where the scalar rest of the row begins.
    pub(super) fn fold_row_lanes(
        &mut self,
        f: &RowFold,
        acc: Variable,
        inner_len: usize,
        ahead: Option<(Value, DType)>,
    ) -> Value {
        let e = self;
        // UNROLL independent vector accumulators, so that additions do not
        // wait on each other, then one, folded together at the end.
        let vinit = e.b.ins().splat(types::F32X4, f.init);
        let vaccs: Vec<_> = (0..UNROLL)
            .map(|_| {
                let v = e.b.declare_var(types::F32X4);
                e.b.def_var(v, vinit);
                v
            })
            .collect();
        // A long row is read as UNROLL segments at once, one vector of
        // each per trip (see `LONG_ROW`); a shorter one, from cache, in
        // order, UNROLL vectors per trip.
        let (segment, step, trips) = if inner_len >= LONG_ROW {
            let segment = inner_len / (4 * UNROLL) * 4;
            (segment, 4, e.iconst(segment as i64))
        } else {
            (4, 4 * UNROLL, f.n)
        };
        let last = e.counted_loop(f.zero, trips, step as i64, |e, j| {
            // Rows read in segments read no line ahead: alone in a launch
            // (`ahead` 0) the line is one of the row's own, ahead of its
            // segments, and sum_all 4096² took longer reading it
            // (`benches/RESULTS-cpu.md`).
            if let Some((row_ahead, dtype)) = ahead.filter(|_| segment == 4) {
                let bytes = e.b.ins().imul_imm_s(j, dtype.size() as i64);
                let at = e.b.ins().iadd(row_ahead, bytes);
                // Without `notrap` a load stays although nothing uses it.
                e.b.ins().load(types::I8, MemFlagsData::new(), at, 0);
            }
            for (u, &vacc) in vaccs.iter().enumerate() {
                let j = e.b.ins().iadd_imm_s(j, (segment * u) as i64);
                let v = e.row_element(f, j, true);
                let a = e.b.use_var(vacc);
                let a = e.fold_noting(f, a, v);
                e.b.def_var(vacc, a);
            }
        });
        // The rest of the row, after the segments or the last trip.
        let mut from = if step == 4 {
            e.iconst((segment * UNROLL) as i64)
        } else {
            last
        };
        from = e.counted_loop(from, f.n, 4, |e, j| {
            let v = e.row_element(f, j, true);
            let a = e.b.use_var(vaccs[0]);
            let a = e.fold_noting(f, a, v);
            e.b.def_var(vaccs[0], a);
        });
        // A ragged tail of a row of at least four: one more vector over the
        // last four elements, the lanes already counted masked to `init`.
        let ragged = inner_len % 4;
        if ragged != 0 && inner_len >= 4 {
            let j = e.iconst((inner_len - 4) as i64);
            let v = e.row_element(f, j, true);
            let lanes: Vec<u8> = (0..4u32)
                .flat_map(|k| if k >= 4 - ragged as u32 { u32::MAX } else { 0 }.to_le_bytes())
                .collect();
            let mask = e.b.func.dfg.constants.insert(lanes.into());
            let mask = e.b.ins().vconst(types::I32X4, mask);
            let mask = e.b.ins().bitcast(types::F32X4, MemFlagsData::new(), mask);
            let v = e.b.ins().bitselect(mask, v, vinit);
            let a = e.b.use_var(vaccs[0]);
            let a = e.fold_noting(f, a, v);
            e.b.def_var(vaccs[0], a);
            from = f.n;
        }
        // The accumulators hold no NaN (`maxps` keeps the accumulator
        // over a NaN of the row), so folding them notes nothing.
        let mut v = e.b.use_var(vaccs[0]);
        for &vacc in &vaccs[1..] {
            let w = e.b.use_var(vacc);
            v = e.fold_lanes(f, v, w);
        }
        let mut total = e.b.ins().extractlane(v, 0);
        for lane in 1..4 {
            let x = e.b.ins().extractlane(v, lane);
            total = e.combine(f.op, DType::F32, total, x);
        }
        if let Some(nans) = f.nans {
            total = e.max_exactly(f, nans, total);
        }
        e.b.def_var(acc, total);
        from
    }

    /// A row's max from lanes (`total`) made IEEE's: NaN where the row
    /// noted one (`nans`), and the row walked again one element at a time
    /// where it came out zero, `maxps` having maybe kept -0 over +0.
    fn max_exactly(&mut self, f: &RowFold, nans: Variable, total: Value) -> Value {
        let e = self;
        let seen = e.b.use_var(nans);
        let any = e.b.ins().vany_true(seen);
        let nan = e.b.ins().f32const(f32::NAN);
        let total = e.b.ins().select(any, nan, total);
        let zero_f32 = e.b.ins().f32const(0.0);
        let is_zero = e.b.ins().fcmp(FloatCC::Equal, total, zero_f32);
        let (again, join) = (e.b.create_block(), e.b.create_block());
        e.b.set_cold_block(again);
        let max = e.b.append_block_param(join, types::F32);
        e.b.ins().brif(is_zero, again, &[], join, &[total.into()]);
        e.b.switch_to_block(again);
        let exact = e.b.declare_var(types::F32);
        e.b.def_var(exact, f.init);
        e.fold_scalars(f, exact, f.zero);
        let exact = e.b.use_var(exact);
        e.b.ins().jump(join, &[exact.into()]);
        e.b.switch_to_block(join);
        max
    }
}
