//! 16-bit floats (bf16, f16) in f32 registers: a load widens the stored
//! bits to the f32 of the same value, a store narrows an f32 to its
//! nearest 16-bit value (ties to even), and a cast to a 16-bit type rounds
//! the same way and widens again. `pass::widen` leaves no other op on
//! 16-bit values but moves (`where`, gathers, views), which f32 registers
//! hold as they are. NaN stays NaN (quiet); overflow goes to infinity.
//!
//! Integer code, one element (in an i32) or four lanes (in an i32x4) at a
//! time, the same on every x86-64: F16C's conversions are not on every
//! machine kiln runs on, and bf16's are AVX512-BF16.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{Endianness, InstBuilder, MemFlagsData, Type, Value, types};
use kiln_ir::DType;

use super::emit::Emitter;

/// The integer and float types of one element or four lanes.
fn shapes(lanes: bool) -> (Type, Type) {
    if lanes {
        (types::I32X4, types::F32X4)
    } else {
        (types::I32, types::F32)
    }
}

impl Emitter<'_> {
    /// `v` as an i32, or in each of four lanes.
    pub(super) fn int(&mut self, v: i64, lanes: bool) -> Value {
        let c = self.b.ins().iconst(types::I32, v);
        if lanes {
            self.b.ins().splat(types::I32X4, c)
        } else {
            c
        }
    }

    /// `f`'s bits reread as the type `to`.
    fn reread(&mut self, to: Type, x: Value) -> Value {
        self.b.ins().bitcast(to, MemFlagsData::new(), x)
    }

    /// `a` where `c` holds, else `b`: a select of one element, a bitwise
    /// select of lane masks.
    fn choose(&mut self, c: Value, a: Value, b: Value, lanes: bool) -> Value {
        if lanes {
            self.b.ins().bitselect(c, a, b)
        } else {
            self.b.ins().select(c, a, b)
        }
    }

    /// Whether `x` (signed) is at least `v`, per lane.
    fn at_least(&mut self, x: Value, v: i64, lanes: bool) -> Value {
        let v = self.int(v, lanes);
        self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, x, v)
    }

    /// The f32 value of 16-bit `bits` (an i32 holding them in its low half,
    /// or four in an i32x4) of `dtype`.
    pub(super) fn widen_half(&mut self, dtype: DType, bits: Value, lanes: bool) -> Value {
        let (_, float) = shapes(lanes);
        if dtype == DType::BF16 {
            // bf16 is the top half of the f32 of the same value.
            let wide = self.b.ins().ishl_imm_u(bits, 16);
            return self.reread(float, wide);
        }
        // f16: exponent and significand moved into f32's places, then
        // scaled by 2^112 (the difference of the exponent biases), which
        // also makes f16's subnormals normal f32s; all-ones exponents
        // (infinities, NaN) keep theirs.
        let (int, _) = shapes(lanes);
        let low = self.int(0x7fff, lanes);
        let magnitude = self.b.ins().band(bits, low);
        let moved = self.b.ins().ishl_imm_u(magnitude, 13);
        let as_float = self.reread(float, moved);
        let scale = self.b.ins().f32const(f32::from_bits(0x7780_0000));
        let scale = if lanes {
            self.b.ins().splat(types::F32X4, scale)
        } else {
            scale
        };
        let scaled = self.b.ins().fmul(as_float, scale);
        let scaled = self.reread(int, scaled);
        let all_ones = self.int(0x7f80_0000, lanes);
        let special = self.b.ins().bor(moved, all_ones);
        let is_special = self.at_least(magnitude, 0x7c00, lanes);
        let value = self.choose(is_special, special, scaled, lanes);
        let sign_bit = self.int(0x8000, lanes);
        let sign = self.b.ins().band(bits, sign_bit);
        let sign = self.b.ins().ishl_imm_u(sign, 16);
        let value = self.b.ins().bor(value, sign);
        self.reread(float, value)
    }

    /// The 16-bit `dtype` bits nearest f32 `x`, in an i32's low half (or
    /// four, in an i32x4's lanes).
    pub(super) fn narrow_half(&mut self, dtype: DType, x: Value, lanes: bool) -> Value {
        let (int, float) = shapes(lanes);
        let bits = self.reread(int, x);
        let nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        let one = self.int(1, lanes);
        if dtype == DType::BF16 {
            // Add half a unit of the last kept place, less one unless the
            // kept part is odd (ties to even), and keep the top half.
            let high = self.b.ins().ushr_imm_u(bits, 16);
            let odd = self.b.ins().band(high, one);
            let bias = self.int(0x7fff, lanes);
            let biased = self.b.ins().iadd(bits, bias);
            let biased = self.b.ins().iadd(biased, odd);
            let rounded = self.b.ins().ushr_imm_u(biased, 16);
            let quiet_bit = self.int(0x40, lanes);
            let quiet = self.b.ins().bor(high, quiet_bit);
            return self.choose(nan, quiet, rounded, lanes);
        }
        // f16, on the magnitude: above its largest finite value (rounded)
        // infinity; below its smallest normal, an f32 addition rounds to a
        // multiple of 2^-24; else the same rounding as bf16's, 13 places.
        let sign_bit = self.int(i64::from(i32::MIN), lanes);
        let sign = self.b.ins().band(bits, sign_bit);
        let sign = self.b.ins().ushr_imm_u(sign, 16);
        let low = self.int(0x7fff_ffff, lanes);
        let magnitude = self.b.ins().band(bits, low);
        let abs = self.reread(float, magnitude);
        // 2^-1: its unit in the last place is 2^-24, f16's smallest subnormal.
        let half = self.b.ins().f32const(0.5);
        let half = if lanes {
            self.b.ins().splat(types::F32X4, half)
        } else {
            half
        };
        let sub = self.b.ins().fadd(abs, half);
        let sub = self.reread(int, sub);
        let half_bits = self.int(0x3f00_0000, lanes);
        let sub = self.b.ins().isub(sub, half_bits);
        let odd = self.b.ins().ushr_imm_u(magnitude, 13);
        let odd = self.b.ins().band(odd, one);
        // Rebias the exponent from 127 to 15 and round.
        let bias = self.int(((15 - 127) << 23) + 0xfff, lanes);
        let normal = self.b.ins().iadd(magnitude, bias);
        let normal = self.b.ins().iadd(normal, odd);
        let normal = self.b.ins().ushr_imm_u(normal, 13);
        let is_normal = self.at_least(magnitude, 113 << 23, lanes);
        let finite = self.choose(is_normal, normal, sub, lanes);
        // f16's largest finite value is 65504; from 65520 on, infinity.
        let inf = self.int(0x7c00, lanes);
        let huge = self.at_least(magnitude, (127 + 16) << 23, lanes);
        let value = self.choose(huge, inf, finite, lanes);
        let quiet = self.int(0x7e00, lanes);
        let value = self.choose(nan, quiet, value, lanes);
        self.b.ins().bor(value, sign)
    }

    /// The `dtype` element at `addr` (four with `lanes`), as f32.
    pub(super) fn load_half(&mut self, dtype: DType, addr: Value, lanes: bool) -> Value {
        let flags = MemFlagsData::new().with_notrap();
        let bits = if lanes {
            self.b.ins().uload16x4(flags, addr, 0)
        } else {
            self.b.ins().uload16(types::I32, flags, addr, 0)
        };
        self.widen_half(dtype, bits, lanes)
    }

    /// `x`, an f32 holding a `dtype` value (or four lanes of them), stored
    /// at `addr` as its 16 bits.
    pub(super) fn store_half(&mut self, dtype: DType, x: Value, addr: Value) {
        let flags = MemFlagsData::new().with_notrap();
        if self.b.func.dfg.value_type(x).is_vector() {
            // Four 16-bit lanes packed into the low 64 bits, stored at once.
            let bits = self.half_bits(dtype, x, true);
            let packed = self.b.ins().unarrow(bits, bits);
            let little = MemFlagsData::new().with_endianness(Endianness::Little);
            let words = self.b.ins().bitcast(types::I64X2, little, packed);
            let four = self.b.ins().extractlane(words, 0);
            self.b.ins().store(flags, four, addr, 0);
        } else {
            let bits = self.half_bits(dtype, x, false);
            self.b.ins().istore16(flags, bits, addr, 0);
        }
    }

    /// The bits memory holds of `x`, an f32 (or four) holding a `dtype`
    /// value. Every 16-bit value a kernel holds is one (a load, a constant,
    /// a cast, a `where` of those; `op` rounds any other op's result), so
    /// bf16's are the top half of the f32's bits, and f16's round exactly.
    pub(super) fn half_bits(&mut self, dtype: DType, x: Value, lanes: bool) -> Value {
        if dtype == DType::BF16 {
            let (int, _) = shapes(lanes);
            let bits = self.reread(int, x);
            return self.b.ins().ushr_imm_u(bits, 16);
        }
        self.narrow_half(dtype, x, lanes)
    }

    /// f32 `x` (or four lanes) rounded to the nearest `dtype` value, as f32.
    pub(super) fn round_half(&mut self, dtype: DType, x: Value, lanes: bool) -> Value {
        let bits = self.narrow_half(dtype, x, lanes);
        self.widen_half(dtype, bits, lanes)
    }

    /// f64 `x` rounded to the nearest `dtype` value, as f32: rounded to f32
    /// toward zero with the last bit set where that dropped anything (round
    /// to odd), which rounded again gives the direct rounding, where
    /// rounding to nearest twice could land on a tie and round it to even.
    pub(super) fn round_f64_half(&mut self, dtype: DType, x: Value) -> Value {
        let near = self.b.ins().fdemote(types::F32, x);
        let back = self.b.ins().fpromote(types::F64, near);
        let inexact = self.b.ins().fcmp(FloatCC::OrderedNotEqual, back, x);
        let abs_back = self.b.ins().fabs(back);
        let abs_x = self.b.ins().fabs(x);
        let away = self.b.ins().fcmp(FloatCC::GreaterThan, abs_back, abs_x);
        let bits = self.reread(types::I32, near);
        let stepped = self.b.ins().iadd_imm_s(bits, -1);
        let toward = self.b.ins().select(away, stepped, bits);
        let odd = self.b.ins().bor_imm_s(toward, 1);
        // An infinite `near` is exact or an overflow, which stays infinite.
        let inf = self.b.ins().f64const(f64::INFINITY);
        let finite = self.b.ins().fcmp(FloatCC::NotEqual, abs_back, inf);
        let adjust = self.b.ins().band(inexact, finite);
        let bits = self.b.ins().select(adjust, odd, bits);
        let odd_f32 = self.reread(types::F32, bits);
        self.round_half(dtype, odd_f32, false)
    }
}
