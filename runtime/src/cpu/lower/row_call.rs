//! Rows handed to the 256-bit row functions (`kiln_machine::rows`): which
//! blocks have a row function's form (a contiguous f32 row of one read,
//! and a number constant along it), and the calls
//! for a row's max or sum, for an epilogue that scales a row, and for one
//! that rounds a row to bf16.
//!
//! Why calls: Cranelift emits 128-bit vectors only. With softmax's exp in
//! a 256-bit call, its other passes (the max, staging `x - max` for the
//! call, and the scale by 1/sum) took about 0.4 of its time in cache; in
//! 256-bit code they take half the instructions, and the staging pass goes:
//! softmax then takes on one thread what C with every pass in 256-bit
//! vectors takes (`benches/RESULTS-cpu.md`). A call is made once per row,
//! where the vector registers it does not preserve cost little, and only on
//! rows of `ROW_CALL_MIN` and more.

use std::ops::Range;

use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_ir::kernel::Expr;
use kiln_ir::{BinaryOp, DType, Scalar};

use super::Host;
use super::emit::{Emitter, Placed, RowBase, Rows};
use crate::nest::Access;

/// Rows at least this long go to a row function: shorter ones spend more
/// on the call than on their elements.
pub(super) const ROW_CALL_MIN: usize = 32;

impl Emitter<'_> {
    /// The address of `access`'s first element in the row at `base`.
    pub(super) fn row_address(&mut self, access: &Access, base: RowBase, dtype: DType) -> Value {
        let zero = self.iconst(0);
        let (offset, _) = self.element(access, base, zero);
        let bytes = self.b.ins().imul_imm_s(offset, dtype.size() as i64);
        self.b.ins().iadd(self.ptrs[access.buffer], bytes)
    }

    /// The address of the row that value `i` of `at`'s block reads, where
    /// it is an f32 read contiguous along the row.
    pub(super) fn contiguous_row(&mut self, at: Placed, i: usize) -> Option<Value> {
        let Rows::One(bases) = at.rows else {
            return None;
        };
        let v = &at.block.values[i];
        if !matches!(v.expr, Expr::Load { .. }) || v.dtype != DType::F32 || at.hoisted[i].is_some()
        {
            return None;
        }
        let k = at.block.values[..i]
            .iter()
            .filter(|v| v.expr.read().is_some())
            .count();
        let access = &at.accesses[k];
        access
            .unit_stride()
            .then(|| self.row_address(access, bases[k], DType::F32))
    }

    /// Value `i` of `at`'s block as one f32 for the whole row: hoisted, or
    /// a constant.
    fn row_constant(&mut self, at: Placed, i: usize) -> Option<Value> {
        match (at.hoisted[i], &at.block.values[i].expr) {
            (Some(h), _) => Some(h),
            (None, Expr::Const(Scalar::F32(c))) => Some(self.b.ins().f32const(*c)),
            _ => None,
        }
    }

    /// `(row, c)` where value `i` of `at`'s block is `row[j] op c` (or, for
    /// an `op` that commutes, `c op row[j]`).
    pub(super) fn row_op_constant(
        &mut self,
        at: Placed,
        i: usize,
        op: BinaryOp,
    ) -> Option<(Value, Value)> {
        let Expr::Binary(o, x, y) = at.block.values[i].expr else {
            return None;
        };
        if o != op {
            return None;
        }
        let (x, y) = (x as usize, y as usize);
        let commutes = matches!(op, BinaryOp::Add | BinaryOp::Mul);
        let pair = |e: &mut Self, r: usize, c: usize| {
            let row = e.contiguous_row(at, r)?;
            e.row_constant(at, c).map(|c| (row, c))
        };
        pair(self, x, y).or_else(|| commutes.then(|| pair(self, y, x)).flatten())
    }

    /// A row's max or sum by `kiln_max_row` or `kiln_sum_row` (`fold`),
    /// where `at`'s block is a plain contiguous f32 read of `len` elements.
    pub(super) fn fold_row(&mut self, fold: Host, at: Placed, len: usize) -> Option<Value> {
        let last = at.block.values.len().checked_sub(1)?;
        let src = self.contiguous_row(at, last)?;
        let n = self.iconst(len as i64);
        Some(self.call(fold, &[src, n])[0])
    }

    /// An epilogue `out[j] = row[j] * c` over the row by `kiln_scale_row`,
    /// where `at`'s block has that form; false where it has not.
    pub(super) fn scale_row(
        &mut self,
        at: Placed,
        (out, out_base): (&Access, RowBase),
        len: usize,
    ) -> bool {
        let Some(last) = at.block.values.len().checked_sub(1) else {
            return false;
        };
        let Some((src, c)) = self.row_op_constant(at, last, BinaryOp::Mul) else {
            return false;
        };
        let dst = self.row_address(out, out_base, DType::F32);
        let n = self.iconst(len as i64);
        self.call(Host::ScaleRow, &[src, c, dst, n]);
        true
    }

    /// Elements `from..to` of the output row at `out_base` stored by
    /// `kiln_bf16_row`, where `at`'s block only rounds a contiguous f32 row
    /// to the bf16 output: a matmul's product apart from the output (a
    /// bf16 product's rounding) or a read (a cast); false where it does
    /// more, or writes side outputs.
    pub(super) fn bf16_row(
        &mut self,
        at: Placed,
        (out, out_base): (&Access, RowBase),
        Range {
            start: from,
            end: to,
        }: Range<Value>,
        acc: Option<&Access>,
    ) -> bool {
        let Some(last) = at.block.values.last() else {
            return false;
        };
        let (Expr::Cast(x), DType::BF16) = (&last.expr, self.out_dtype) else {
            return false;
        };
        let x = *x as usize;
        if !self.side.is_empty() || !out.unit_stride() || at.block.values[x].dtype != DType::F32 {
            return false;
        }
        let src = match (&at.block.values[x].expr, acc) {
            (Expr::Acc, Some(acc)) if acc.buffer != out.buffer && acc.unit_stride() => {
                self.row_address(acc, out_base, DType::F32)
            }
            (Expr::Acc, _) => return false,
            _ => match self.contiguous_row(at, x) {
                Some(src) => src,
                None => return false,
            },
        };
        let dst = self.row_address(out, out_base, DType::BF16);
        let src_from = self.b.ins().imul_imm_s(from, DType::F32.size() as i64);
        let src = self.b.ins().iadd(src, src_from);
        let dst_from = self.b.ins().imul_imm_s(from, DType::BF16.size() as i64);
        let dst = self.b.ins().iadd(dst, dst_from);
        let n = self.b.ins().isub(to, from);
        self.call(Host::Bf16Row, &[src, dst, n]);
        true
    }
}
