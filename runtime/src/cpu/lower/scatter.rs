//! Scatter-add kernels (`KernelKind::Scatter`): per outer row of the
//! output, its positions zeroed, then the prologue's updates added at the
//! positions their indices pick, pick by pick in order, so that every run
//! sums in the same order. Along the inner axes the updates run four lanes
//! at a time where the index is one per row (an embedding's gradient: a
//! row of the table per id), else one element at a time, each with its
//! own position. An update whose index is outside the axis adds zero at
//! position 0, which leaves every sum as it is (a sum from +0 is never
//! -0), so no branch stands in the loop.

use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use kiln_ir::DType;

use super::emit::{Emitter, Placed, Rows};
use super::{RowRange, clif_type};
use crate::loops::Scatter;

impl Emitter<'_> {
    /// The outer rows `start..end` of a scatter-add.
    pub(super) fn scatter(&mut self, s: &Scatter, start: Value, end: Value) -> RowRange {
        let inner: usize = s.nest.inner.iter().product();
        let block = s.len * inner;
        self.counted_loop(start, end, 1, |e, o| {
            let first = e.b.ins().imul_imm_s(o, block as i64);
            e.zero(s.out, first, block);
            // With no positions there is nowhere to add, and an empty
            // inner loop has nothing to add.
            if block == 0 {
                return;
            }
            let first_pick = e.b.ins().imul_imm_s(o, s.picks as i64);
            let (from, to) = (e.iconst(0), e.iconst(s.picks as i64));
            e.counted_loop(from, to, 1, |e, j| {
                let row = e.b.ins().iadd(first_pick, j);
                e.scatter_row(s, row, first, inner);
            });
        });
        RowRange {
            rows: s.outer,
            row_len: ((s.picks + s.len) * inner).max(1),
        }
    }

    /// Pick `row` of the prologue added into the outer row whose first
    /// output element is `first`.
    fn scatter_row(&mut self, s: &Scatter, row: Value, first: Value, inner: usize) {
        let accesses = &s.nest.accesses;
        let bases = self.bases(accesses, row);
        let zero = self.iconst(0);
        let hoisted = self.hoist(
            &s.prologue,
            accesses,
            Rows::One(&bases),
            (None, &[]),
            &s.hoisted,
        );
        let at = Placed {
            block: &s.prologue,
            accesses,
            rows: Rows::One(&bases),
            hoisted: &hoisted,
        };
        let n = self.iconst(inner as i64);
        let Some(index) = hoisted[s.index as usize] else {
            // A position per element.
            self.counted_loop(zero, n, 1, |e, i| {
                let values = e.block_values(at, i, None, false);
                let (position, inside) = e.position(values[s.index as usize], s.len);
                let base = e.b.ins().imul_imm_s(position, inner as i64);
                let base = e.b.ins().iadd(first, base);
                // The verifier rejects empty blocks.
                let update = values.last().copied().unwrap_or(i);
                e.add_into(s.out, base, i, (update, inside), false);
            });
            return;
        };
        // One position for the row: its first element found once.
        let (position, inside) = self.position(index, s.len);
        let base = self.b.ins().imul_imm_s(position, inner as i64);
        let base = self.b.ins().iadd(first, base);
        let lanes = s.lanes;
        let mut from = zero;
        if lanes {
            from = self.counted_loop(zero, n, 4, |e, i| {
                let update = e.block(at, i, None, true);
                e.add_into(s.out, base, i, (update, inside), true);
            });
        }
        self.counted_loop(from, n, 1, |e, i| {
            let update = e.block(at, i, None, false);
            e.add_into(s.out, base, i, (update, inside), false);
        });
    }

    /// `update` (four lanes with `lanes`) added to output element `base + i`,
    /// or zero added where `inside` is false.
    fn add_into(
        &mut self,
        out: usize,
        base: Value,
        i: Value,
        (update, inside): (Value, Value),
        lanes: bool,
    ) {
        let flags = MemFlagsData::new().with_notrap();
        let dtype = self.out_dtype;
        let offset = self.b.ins().iadd(base, i);
        let addr = self.address(out, offset, dtype);
        let zero = self.scalar_const(kiln_ir::Scalar::I32(0).cast(dtype));
        let (ty, zero) = if lanes {
            (types::F32X4, self.b.ins().splat(types::F32X4, zero))
        } else {
            (clif_type(dtype), zero)
        };
        let update = self.b.ins().select(inside, update, zero);
        let sum = self.b.ins().load(ty, flags, addr, 0);
        let sum = self.b.ins().fadd(sum, update);
        self.b.ins().store(flags, sum, addr, 0);
    }

    /// Output elements `first..first + n` set to +0, four at a time in f32.
    fn zero(&mut self, out: usize, first: Value, n: usize) {
        let flags = MemFlagsData::new().with_notrap();
        let dtype = self.out_dtype;
        let zero = self.scalar_const(kiln_ir::Scalar::I32(0).cast(dtype));
        let (from, to) = (self.iconst(0), self.iconst(n as i64));
        let mut rest = from;
        if dtype == DType::F32 {
            let four = self.b.ins().splat(types::F32X4, zero);
            rest = self.counted_loop(from, to, 4, |e, i| {
                let offset = e.b.ins().iadd(first, i);
                let addr = e.address(out, offset, dtype);
                e.b.ins().store(flags, four, addr, 0);
            });
        }
        self.counted_loop(rest, to, 1, |e, i| {
            let offset = e.b.ins().iadd(first, i);
            let addr = e.address(out, offset, dtype);
            e.b.ins().store(flags, zero, addr, 0);
        });
    }
}
