//! Rows handed to the 256-bit row functions (`kiln_machine::rows`): which
//! blocks have a row function's form (a contiguous f32 row of one read,
//! and a number constant along it), and the calls
//! for a row's max or sum, for an epilogue that scales a row, and for
//! blocks that round a row to bf16 or take its SiLU.
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
use kiln_ir::{BinaryOp, DType, Scalar, UnaryOp};

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
    /// it is an f32 read contiguous along the row, of no padding.
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
        // A padded read's rows of padding alone (`row_fill`) read the
        // fill, where the row's address is a clamped row beside it.
        (access.unit_stride() && access.row_fill.is_none())
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

    /// Elements `from..to` of the output row at `out_base` stored by a row
    /// function, where `at`'s block has its form (`row_form`) over an f32
    /// row (`f32_row`: a product or sum of taps an epilogue reads, or a
    /// read); false where it does more, or writes side outputs.
    pub(super) fn row_function(
        &mut self,
        at: Placed,
        (out, out_base): (&Access, RowBase),
        Range {
            start: from,
            end: to,
        }: Range<Value>,
        acc: Option<&Access>,
    ) -> bool {
        let Some((host, x)) = self.row_form(at) else {
            return false;
        };
        // A product in the output is an f32 row there: only an f32 output
        // holds it.
        let in_out = acc.is_some_and(|acc| acc.buffer == out.buffer);
        if !self.side.is_empty() || !out.unit_stride() || (in_out && self.out_dtype != DType::F32) {
            return false;
        }
        let Some(src) = self.f32_row(at, x as usize, (acc, out_base), from) else {
            return false;
        };
        let dst = self.row_address(out, out_base, self.out_dtype);
        let dst = self.element_address(dst, from, self.out_dtype);
        let n = self.b.ins().isub(to, from);
        self.call(host, &[src, dst, n]);
        true
    }

    /// The row function that computes `at`'s block, and the value its row
    /// is: the value rounded to the bf16 output (`kiln_bf16_row`), or `x`
    /// of `x * sigmoid(x)` into an f32 output (`kiln_silu_row`).
    fn row_form(&self, at: Placed) -> Option<(Host, u32)> {
        let values = &at.block.values;
        let last = values.last()?;
        match (&last.expr, last.dtype, self.out_dtype) {
            (&Expr::Cast(x), DType::BF16, DType::BF16) => Some((Host::Bf16Row, x)),
            (&Expr::Binary(BinaryOp::Mul, p, q), DType::F32, DType::F32) => {
                let sigmoid_of =
                    |s: u32, x: u32| values[s as usize].expr == Expr::Unary(UnaryOp::Sigmoid, x);
                match (sigmoid_of(q, p), sigmoid_of(p, q)) {
                    (true, _) => Some((Host::SiluRow, p)),
                    (_, true) => Some((Host::SiluRow, q)),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The address of element `from` of the f32 row that value `x` of
    /// `at`'s block holds, where it lies in memory: the product (or sum of
    /// taps) an epilogue reads (`Expr::Acc`, at `acc`, laid out as the
    /// output, whose row is at `out_base`), or a contiguous read.
    fn f32_row(
        &mut self,
        at: Placed,
        x: usize,
        (acc, out_base): (Option<&Access>, RowBase),
        from: Value,
    ) -> Option<Value> {
        let v = &at.block.values[x];
        if v.dtype != DType::F32 {
            return None;
        }
        let row = match (&v.expr, acc) {
            (Expr::Acc, Some(acc)) if acc.unit_stride() => {
                self.row_address(acc, out_base, DType::F32)
            }
            (Expr::Acc, _) => return None,
            _ => self.contiguous_row(at, x)?,
        };
        Some(self.element_address(row, from, DType::F32))
    }

    /// The address of element `j` of a contiguous row of `dtype` at `row`.
    fn element_address(&mut self, row: Value, j: Value, dtype: DType) -> Value {
        let bytes = self.b.ins().imul_imm_s(j, dtype.size() as i64);
        self.b.ins().iadd(row, bytes)
    }
}
