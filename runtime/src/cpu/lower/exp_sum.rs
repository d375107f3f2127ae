//! A row's sum of exponentials by a call of `kiln_exp_sum`
//! (`kiln_machine::rows`, 256-bit AVX2 vectors), storing them to the output row when the prologue
//! is stored there (softmax). An argument `x - max` (softmax, log_softmax,
//! logsumexp) or `x` goes to the call, which subtracts; another is computed
//! here in f32x4 and staged where the call reads it, in the output row or
//! in chunks on the stack.
//!
//! Why a call: softmax 4096x1000 is bound by exp, not memory (two threads
//! take half the time of one), and Cranelift's f32x4 code for exp takes
//! twice the instructions per element of 256-bit code. Dropping exp's range
//! check altogether (which large |x| need) gained less than this call does
//! (`benches/RESULTS-cpu.md`). The call is made once per row (per 1024
//! elements on the stack), where the vector registers it does not preserve
//! cost little.

use cranelift_codegen::ir::{
    InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Value, types,
};
use kiln_ir::kernel::{Block, Expr};
use kiln_ir::{BinaryOp, DType, UnaryOp};

use super::emit::{Emitter, Placed, RowBase};
use super::{Host, UNROLL};
use crate::nest::Access;

/// Elements of the argument staged on the stack per call: 4 KiB, in L1.
const CHUNK: usize = 1024;

/// The position of `exp`'s argument where `block`'s result is `exp` of it.
pub(super) fn exp_argument(block: &Block) -> Option<usize> {
    match block.values.last()?.expr {
        Expr::Unary(UnaryOp::Exp, a) => Some(a as usize),
        _ => None,
    }
}

impl Emitter<'_> {
    /// The sum over a row of `e^at`, `at` evaluated at inner indices
    /// `0..len`, with the exponentials stored to the output row `out` where
    /// given. An argument `x - c` or `x` (`x` a contiguous f32 row, `c`
    /// constant along it) goes to the call as it is; another is staged,
    /// into `out`, or without one in chunks on the stack. `ahead`: the
    /// address of a row ahead, and its element type, read a line per 16
    /// elements (see `lower::signature`).
    pub(super) fn exp_sum_row(
        &mut self,
        at: Placed,
        out: Option<(&Access, RowBase)>,
        len: usize,
        ahead: Option<(Value, DType)>,
    ) -> Value {
        let ptr = self.b.func.dfg.value_type(self.ptrs[0]);
        let null = self.b.ins().iconst(ptr, 0);
        let call = |e: &mut Self, args: [Value; 4], ahead: Value| {
            let [src, shift, dst, len] = args;
            e.call(Host::ExpSum, &[src, shift, dst, len, ahead])[0]
        };
        let last = at.block.values.len() - 1;
        let direct = self.row_op_constant(at, last, BinaryOp::Sub).or_else(|| {
            let row = self.contiguous_row(at, last)?;
            Some((row, self.b.ins().f32const(0.0)))
        });
        let dst = out.map(|(out, base)| self.row_address(out, base, DType::F32));
        if let Some((src, shift)) = direct {
            // The call reads the line ahead where it is a line per 16
            // elements, as its own row's.
            let ahead = match ahead {
                Some((row_ahead, DType::F32)) => row_ahead,
                _ => null,
            };
            let n = self.iconst(len as i64);
            return call(self, [src, shift, dst.unwrap_or(null), n], ahead);
        }
        let zero = self.iconst(0);
        let no_shift = self.b.ins().f32const(0.0);
        if let Some(dst) = dst {
            self.stage(at, zero, len, dst, ahead);
            let n = self.iconst(len as i64);
            return call(self, [dst, no_shift, dst, n], null);
        }
        let chunk = len.min(CHUNK);
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (chunk * 4) as u32,
            4,
        ));
        let staged = self.b.ins().stack_addr(ptr, slot, 0);
        let total = self.b.declare_var(types::F32);
        let none = self.b.ins().f32const(0.0);
        self.b.def_var(total, none);
        let add = |e: &mut Self, from: Value, len: usize| {
            e.stage(at, from, len, staged, ahead);
            let n = e.iconst(len as i64);
            let s = call(e, [staged, no_shift, null, n], null);
            let t = e.b.use_var(total);
            let t = e.b.ins().fadd(t, s);
            e.b.def_var(total, t);
        };
        let whole = len - len % chunk;
        let end = self.iconst(whole as i64);
        self.counted_loop(zero, end, chunk as i64, |e, from| add(e, from, chunk));
        if whole < len {
            add(self, end, len - whole);
        }
        self.b.use_var(total)
    }

    /// Stores `at` at inner indices `from..from + len` to `dst`, one f32
    /// after another: `UNROLL` vectors at a time, then one, then scalars.
    fn stage(
        &mut self,
        at: Placed,
        from: Value,
        len: usize,
        dst: Value,
        ahead: Option<(Value, DType)>,
    ) {
        let end = self.b.ins().iadd_imm_s(from, len as i64);
        let put = |e: &mut Self, j: Value, lanes: bool| {
            let v = e.block(at, j, None, lanes);
            let k = e.b.ins().isub(j, from);
            let bytes = e.b.ins().ishl_imm_s(k, 2);
            let addr = e.b.ins().iadd(dst, bytes);
            e.b.ins()
                .store(MemFlagsData::new().with_notrap(), v, addr, 0);
        };
        let rest = self.counted_loop(from, end, 4 * UNROLL as i64, |e, j| {
            if let Some((row_ahead, dtype)) = ahead {
                let bytes = e.b.ins().imul_imm_s(j, dtype.size() as i64);
                let at = e.b.ins().iadd(row_ahead, bytes);
                // Without `notrap` a load stays although nothing uses it.
                e.b.ins().load(types::I8, MemFlagsData::new(), at, 0);
            }
            for u in 0..UNROLL {
                let j = e.b.ins().iadd_imm_s(j, 4 * u as i64);
                put(e, j, true);
            }
        });
        let rest = self.counted_loop(rest, end, 4, |e, j| put(e, j, true));
        self.counted_loop(rest, end, 1, |e, j| put(e, j, false));
    }
}
