//! One value of a block from its operands' values, in a scalar type or
//! four lanes (`has_lanes`), with the interpreter's semantics: unary and
//! binary ops, casts, and the combine of a reduction.
//!
//! The 64-bit types (i64, f64) run one element at a time: x86-64 vectors
//! are 128 bits, two 64-bit lanes, and correctness comes first. f64's
//! transcendentals and `pow` are calls of Rust's f64 functions
//! (`cpu::f64_math`), never `math`'s f32 polynomials; so are f32's
//! trigonometric and hyperbolic functions (tanh aside), widened and rounded
//! back, one element at a time.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use kiln_ir::kernel::{Block, Expr};
use kiln_ir::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp, random};

use super::emit::Emitter;
use super::{Host, clif_type};
use crate::cpu::f64_math::unary_code;
use crate::cpu::math::{Math, int_cc};

impl<'a> Emitter<'a> {
    /// Value `i` of `block` (a constant or an op) from its operands' values.
    pub(super) fn op(&mut self, block: &Block, i: usize, args: &[Value], lanes: bool) -> Value {
        let v = &block.values[i];
        let operand_dtype = |k: usize| block.values[v.expr.operands()[k] as usize].dtype;
        match (&v.expr, args) {
            (Expr::Const(c), _) => {
                let s = self.scalar_const(*c);
                if lanes { self.splat(v.dtype, s) } else { s }
            }
            // `pass::widen` leaves no arithmetic on 16-bit floats; were there
            // any, its result would round as the interpreter rounds it.
            (Expr::Unary(op, _), &[a]) if v.dtype.is_half() => {
                let r = self.unary(*op, v.dtype, a, lanes);
                self.round_half(v.dtype, r, lanes)
            }
            (Expr::Binary(op, _, _), &[a, b]) if v.dtype.is_half() => {
                let r = self.binary(*op, operand_dtype(0), a, b);
                self.round_half(v.dtype, r, lanes)
            }
            (Expr::Unary(op, _), &[a]) => self.unary(*op, v.dtype, a, lanes),
            (Expr::Binary(op, _, _), &[a, b]) => self.binary(*op, operand_dtype(0), a, b),
            (Expr::Where(..), &[c, a, b]) if lanes => {
                // The condition is a mask of whole lanes: a bitwise select.
                let ty = self.b.func.dfg.value_type(a);
                let mask = if ty == types::I32X4 {
                    c
                } else {
                    self.b.ins().bitcast(ty, MemFlagsData::new(), c)
                };
                self.b.ins().bitselect(mask, a, b)
            }
            (Expr::Where(..), &[c, a, b]) => self.b.ins().select(c, a, b),
            (Expr::Cast(_), &[a]) if lanes => self.cast_lanes(a, operand_dtype(0), v.dtype),
            (Expr::Cast(_), &[a]) => self.cast(a, operand_dtype(0), v.dtype),
            // Loads and `acc` are not ops; the verifier fixes every arity.
            _ => args
                .first()
                .copied()
                .unwrap_or_else(|| self.scalar_const(Scalar::F32(f32::NAN))),
        }
    }

    pub(super) fn math(&mut self, lanes: bool) -> Math<'_, 'a> {
        Math {
            b: &mut self.b,
            ty: if lanes { types::F32X4 } else { types::F32 },
        }
    }

    /// Math in the type of `x` (f32 or f32x4).
    fn math_of(&mut self, x: Value) -> Math<'_, 'a> {
        let ty = self.b.func.dfg.value_type(x);
        Math { b: &mut self.b, ty }
    }

    fn unary(&mut self, op: UnaryOp, dtype: DType, x: Value, lanes: bool) -> Value {
        match dtype {
            // 16-bit floats compute as f32, rounded by `op`.
            DType::F32 | DType::BF16 | DType::F16 => {}
            DType::F64 => return self.unary_f64(op, x),
            // Typing admits neg, abs and relu on i32 and i64 only.
            DType::I32 | DType::I64 | DType::U8 | DType::Bool => {
                return match op {
                    UnaryOp::Detach => x,
                    UnaryOp::Neg => self.b.ins().ineg(x),
                    UnaryOp::Abs => self.b.ins().iabs(x),
                    _ => {
                        let zero = self.b.ins().iconst(clif_type(dtype), 0);
                        let zero = if lanes { self.splat(dtype, zero) } else { zero };
                        self.b.ins().smax(x, zero)
                    }
                };
            }
        }
        match op {
            UnaryOp::Detach => x,
            UnaryOp::Neg => self.math(lanes).neg(x),
            UnaryOp::Abs => self.math(lanes).abs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Recip => {
                let one = self.math(lanes).f(1.0);
                self.b.ins().fdiv(one, x)
            }
            UnaryOp::Relu => self.math(lanes).relu(x),
            UnaryOp::Exp => self.math(lanes).exp(x),
            UnaryOp::Log => self.math(lanes).log(x),
            UnaryOp::Tanh => self.math(lanes).tanh(x),
            UnaryOp::Sigmoid => self.math(lanes).sigmoid(x),
            // One element (`loops::lanes::called` keeps these out of
            // lanes), in f64 and rounded back.
            UnaryOp::Trig(_) => {
                let wide = self.b.ins().fpromote(types::F64, x);
                let y = self.unary_f64(op, wide);
                self.b.ins().fdemote(types::F32, y)
            }
        }
    }

    /// One f64 element: the transcendentals by a call, the rest in CLIF,
    /// whose f64 arithmetic is IEEE's, as the interpreter's.
    fn unary_f64(&mut self, op: UnaryOp, x: Value) -> Value {
        if let Some(code) = unary_code(op) {
            let code = self.b.ins().iconst(types::I64, code);
            return self.call(Host::UnaryF64, &[x, code])[0];
        }
        match op {
            UnaryOp::Neg => self.b.ins().fneg(x),
            UnaryOp::Abs => self.b.ins().fabs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Recip => {
                let one = self.b.ins().f64const(1.0);
                self.b.ins().fdiv(one, x)
            }
            UnaryOp::Relu => {
                // x where x > 0 or x is NaN, else +0.
                let zero = self.b.ins().f64const(0.0);
                let keep = self.b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, x, zero);
                self.b.ins().select(keep, x, zero)
            }
            // The called ops returned above.
            UnaryOp::Detach
            | UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Trig(_) => x,
        }
    }

    /// `dtype` is the operands' type.
    fn binary(&mut self, op: BinaryOp, dtype: DType, x: Value, y: Value) -> Value {
        if op == BinaryOp::Uniform {
            return self.uniform(x, y);
        }
        if op == BinaryOp::Rem {
            return self.rem(dtype, x, y);
        }
        let ins = self.b.ins();
        match dtype {
            // Scalar f64 `fmax`/`fmin` (what `maximum` emits for a scalar)
            // propagate NaN and order -0 below +0, as the interpreter.
            // 16-bit floats are held as f32, rounded by `op`.
            DType::F32 | DType::F64 | DType::BF16 | DType::F16 => match op {
                BinaryOp::Add => ins.fadd(x, y),
                BinaryOp::Sub => ins.fsub(x, y),
                BinaryOp::Mul => ins.fmul(x, y),
                BinaryOp::Div => ins.fdiv(x, y),
                BinaryOp::Max => self.math_of(x).maximum(x, y),
                BinaryOp::Min => self.math_of(x).minimum(x, y),
                BinaryOp::Pow => {
                    let pow = if dtype == DType::F64 {
                        Host::PowD
                    } else {
                        Host::PowF
                    };
                    self.call(pow, &[x, y])[0]
                }
                BinaryOp::Lt => ins.fcmp(FloatCC::LessThan, x, y),
                BinaryOp::Le => ins.fcmp(FloatCC::LessThanOrEqual, x, y),
                // As `y < x`: `where(x > y, x, y)` is then the form that x86
                // lowers to one `maxps` (Cranelift's pmax pattern) instead of a
                // compare and a blend.
                BinaryOp::Gt => ins.fcmp(FloatCC::LessThan, y, x),
                BinaryOp::Ge => ins.fcmp(FloatCC::GreaterThanOrEqual, x, y),
                BinaryOp::Eq => ins.fcmp(FloatCC::Equal, x, y),
                BinaryOp::Ne => ins.fcmp(FloatCC::NotEqual, x, y),
                // Returned above (`uniform` typed for i32 operands only).
                BinaryOp::Rem | BinaryOp::Uniform => x,
            },
            DType::I32 | DType::I64 | DType::U8 | DType::Bool => {
                let signed = matches!(dtype, DType::I32 | DType::I64);
                match op {
                    BinaryOp::Add => ins.iadd(x, y),
                    BinaryOp::Sub => ins.isub(x, y),
                    BinaryOp::Mul => ins.imul(x, y),
                    BinaryOp::Max if signed => ins.smax(x, y),
                    BinaryOp::Max => ins.umax(x, y),
                    BinaryOp::Min if signed => ins.smin(x, y),
                    BinaryOp::Min => ins.umin(x, y),
                    BinaryOp::Lt => ins.icmp(int_cc(true, false, signed), x, y),
                    BinaryOp::Le => ins.icmp(int_cc(true, true, signed), x, y),
                    BinaryOp::Gt => ins.icmp(int_cc(false, false, signed), x, y),
                    BinaryOp::Ge => ins.icmp(int_cc(false, true, signed), x, y),
                    BinaryOp::Eq => ins.icmp(IntCC::Equal, x, y),
                    BinaryOp::Ne => ins.icmp(IntCC::NotEqual, x, y),
                    // Typing admits div and pow on floats only; `rem` and
                    // `uniform` returned above.
                    BinaryOp::Div | BinaryOp::Pow | BinaryOp::Rem | BinaryOp::Uniform => x,
                }
            }
        }
    }

    /// `x rem y` of one element (`loops::lanes` keeps `rem` out of lanes):
    /// a float's in f64 by a call, exact, and rounded back exactly; an
    /// integer's by `srem` or `urem`, with 0 for a divisor of 0, where the
    /// divisor is first made 1, as both instructions trap on 0 (and, signed,
    /// for -1 too, whose remainders are all 0: no `MIN % -1` reaches `srem`).
    fn rem(&mut self, dtype: DType, x: Value, y: Value) -> Value {
        if dtype.is_float() {
            let (x, y) = match dtype {
                DType::F64 => (x, y),
                _ => (
                    self.b.ins().fpromote(types::F64, x),
                    self.b.ins().fpromote(types::F64, y),
                ),
            };
            let r = self.call(Host::RemD, &[x, y])[0];
            return match dtype {
                DType::F64 => r,
                _ => self.b.ins().fdemote(types::F32, r),
            };
        }
        let signed = matches!(dtype, DType::I32 | DType::I64);
        let ty = self.b.func.dfg.value_type(y);
        let zero = self.b.ins().iconst(ty, 0);
        let one = self.b.ins().iconst(ty, 1);
        let mut no_remainder = self.b.ins().icmp(IntCC::Equal, y, zero);
        if signed {
            let minus_one = self.b.ins().iconst(ty, -1);
            let by_minus_one = self.b.ins().icmp(IntCC::Equal, y, minus_one);
            no_remainder = self.b.ins().bor(no_remainder, by_minus_one);
        }
        let divisor = self.b.ins().select(no_remainder, one, y);
        let r = match signed {
            true => self.b.ins().srem(x, divisor),
            false => self.b.ins().urem(x, divisor),
        };
        self.b.ins().select(no_remainder, zero, r)
    }

    /// `uniform(key, counter)` of i32s or four i32 lanes: Threefry-2x32-20
    /// of `(counter, 0)` under `(key, 0)`, round by round as
    /// `kiln_ir::random::threefry2x32`, the first word's top 24 bits times
    /// 2^-24 (exact in f32).
    fn uniform(&mut self, key: Value, counter: Value) -> Value {
        let lanes = self.b.func.dfg.value_type(key) == types::I32X4;
        let parity = self.int(i64::from(random::PARITY), lanes);
        let zero = self.int(0, lanes);
        let ks = [key, zero, self.b.ins().bxor(parity, key)];
        let mut x = [self.b.ins().iadd(counter, ks[0]), ks[1]];
        for round in 0..20 {
            let r = i64::from(random::ROTATIONS[round % 8]);
            x[0] = self.b.ins().iadd(x[0], x[1]);
            let left = self.b.ins().ishl_imm_u(x[1], r);
            let right = self.b.ins().ushr_imm_u(x[1], 32 - r);
            let rotated = self.b.ins().bor(left, right);
            x[1] = self.b.ins().bxor(rotated, x[0]);
            if round % 4 == 3 {
                let s = round / 4 + 1;
                x[0] = self.b.ins().iadd(x[0], ks[s % 3]);
                let count = self.int(s as i64, lanes);
                let added = self.b.ins().iadd(ks[(s + 1) % 3], count);
                x[1] = self.b.ins().iadd(x[1], added);
            }
        }
        let top = self.b.ins().ushr_imm_u(x[0], 8);
        let ty = if lanes { types::F32X4 } else { types::F32 };
        let float = self.b.ins().fcvt_from_sint(ty, top);
        let scale = self.math(lanes).f(1.0 / (1u32 << 24) as f32);
        self.b.ins().fmul(float, scale)
    }

    /// `Scalar::cast` semantics: float to int truncates and saturates (NaN
    /// to 0), int to narrower wraps, anything to bool is `!= 0`.
    fn cast(&mut self, x: Value, from: DType, to: DType) -> Value {
        let ty = clif_type(to);
        match (from, to) {
            (a, b) if a == b => return x,
            // A 16-bit value is its f32: exactly that, then on from f32.
            (DType::BF16 | DType::F16, _) => return self.cast(x, DType::F32, to),
            (DType::F32, DType::BF16 | DType::F16) => return self.round_half(to, x, false),
            (DType::F64, DType::BF16 | DType::F16) => return self.round_f64_half(to, x),
            // Integers through f64, which holds them exactly up to 2^53.
            (_, DType::BF16 | DType::F16) => {
                let wide = self.cast(x, from, DType::F64);
                return self.round_f64_half(to, wide);
            }
            _ => {}
        }
        let ins = self.b.ins();
        match (from, to) {
            (a, b) if a == b => x,
            (DType::F32, DType::F64) => ins.fpromote(ty, x),
            (DType::F64, DType::F32) => ins.fdemote(ty, x),
            (DType::F32 | DType::F64, DType::I32 | DType::I64) => ins.fcvt_to_sint_sat(ty, x),
            (DType::F32 | DType::F64, DType::U8) => {
                let i = ins.fcvt_to_sint_sat(types::I32, x);
                let zero = self.b.ins().iconst(types::I32, 0);
                let max = self.b.ins().iconst(types::I32, 255);
                let i = self.b.ins().smax(i, zero);
                let i = self.b.ins().smin(i, max);
                self.b.ins().ireduce(types::I8, i)
            }
            (DType::F32, DType::Bool) => {
                let zero = ins.f32const(0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            }
            (DType::F64, DType::Bool) => {
                let zero = ins.f64const(0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            }
            (DType::I32 | DType::I64, DType::F32 | DType::F64) => ins.fcvt_from_sint(ty, x),
            (DType::U8 | DType::Bool, DType::F32 | DType::F64) => {
                let i = ins.uextend(types::I32, x);
                self.b.ins().fcvt_from_sint(ty, i)
            }
            (DType::I32, DType::I64) => ins.sextend(ty, x),
            (DType::I64, DType::I32 | DType::U8) | (DType::I32, DType::U8) => ins.ireduce(ty, x),
            (DType::U8 | DType::Bool, DType::I32 | DType::I64) => ins.uextend(ty, x),
            (DType::I32 | DType::I64 | DType::U8, DType::Bool) => {
                ins.icmp_imm_s(IntCC::NotEqual, x, 0)
            }
            // bool -> u8: the same 0/1 byte.
            (DType::Bool, DType::U8) => x,
            // Every pair of distinct types is above; equal ones returned first.
            (_, _) => x,
        }
    }

    /// `Scalar::cast` of four lanes (`has_lanes`), between f32, i32, u8,
    /// bool, bf16 and f16 (but i32 to a 16-bit float, `loops::lanes`): the
    /// conversions of `cast`, on lanes as they are held.
    fn cast_lanes(&mut self, x: Value, from: DType, to: DType) -> Value {
        match (from, to) {
            (a, b) if a == b => x,
            // A 16-bit value is its f32, as in `cast`.
            (DType::BF16 | DType::F16, to) => self.cast_lanes(x, DType::F32, to),
            (DType::F32, to @ (DType::BF16 | DType::F16)) => self.round_half(to, x, true),
            (from, to @ (DType::BF16 | DType::F16)) => {
                let wide = self.cast_lanes(x, from, DType::F32);
                self.round_half(to, wide, true)
            }
            (DType::F32, DType::I32) => self.b.ins().fcvt_to_sint_sat(types::I32X4, x),
            (DType::F32, DType::U8) => {
                let i = self.b.ins().fcvt_to_sint_sat(types::I32X4, x);
                let (zero, max) = (self.int(0, true), self.int(255, true));
                let i = self.b.ins().smax(i, zero);
                self.b.ins().smin(i, max)
            }
            (DType::F32, DType::Bool) => {
                let zero = self.math(true).f(0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            }
            (DType::I32 | DType::U8, DType::F32) => self.b.ins().fcvt_from_sint(types::F32X4, x),
            // A mask's lanes keep 1.0's bits, or none.
            (DType::Bool, DType::F32) => {
                let one = self.int(i64::from(1.0f32.to_bits()), true);
                let bits = self.b.ins().band(x, one);
                self.b
                    .ins()
                    .bitcast(types::F32X4, MemFlagsData::new(), bits)
            }
            (DType::I32, DType::U8) => {
                let byte = self.int(0xff, true);
                self.b.ins().band(x, byte)
            }
            (DType::Bool, DType::I32 | DType::U8) => self.b.ins().ineg(x),
            (DType::I32 | DType::U8, DType::Bool) => {
                let zero = self.int(0, true);
                self.b.ins().icmp(IntCC::NotEqual, x, zero)
            }
            // The same type; u8 -> i32 is held widened already.
            _ => x,
        }
    }

    pub(super) fn combine(&mut self, op: ReduceOp, dtype: DType, a: Value, x: Value) -> Value {
        match (op, dtype) {
            (ReduceOp::Sum, DType::F32 | DType::F64) => self.b.ins().fadd(a, x),
            (ReduceOp::Sum, _) => self.b.ins().iadd(a, x),
            (ReduceOp::Max, DType::F32 | DType::F64) => self.math_of(a).maximum(a, x),
            (ReduceOp::Max, DType::I32 | DType::I64) => self.b.ins().smax(a, x),
            (ReduceOp::Max, _) => self.b.ins().umax(a, x),
            (ReduceOp::Prod, DType::F32 | DType::F64) => self.b.ins().fmul(a, x),
            (ReduceOp::Prod, _) => self.b.ins().imul(a, x),
        }
    }
}
