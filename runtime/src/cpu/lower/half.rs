//! 16-bit floats (bf16, f16) in f32 registers: a load widens the stored
//! bits to the f32 of the same value, a store narrows an f32 to its
//! nearest 16-bit value (ties to even), and a cast to a 16-bit type rounds
//! the same way and widens again. `pass::widen` leaves no other op on
//! 16-bit values but moves (`where`, gathers, views), which f32 registers
//! hold as they are. NaN stays NaN (quiet); overflow goes to infinity.
//!
//! Integer code only, the same on every x86-64: F16C's conversions are
//! not on every machine kiln runs on, and bf16's are AVX512-BF16.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use kiln_ir::DType;

use super::emit::Emitter;

impl Emitter<'_> {
    /// The f32 value of 16-bit `bits` (an i32 holding them in its low half)
    /// of `dtype`.
    pub(super) fn widen_half(&mut self, dtype: DType, bits: Value) -> Value {
        let f = MemFlagsData::new();
        if dtype == DType::BF16 {
            // bf16 is the top half of the f32 of the same value.
            let wide = self.b.ins().ishl_imm_s(bits, 16);
            return self.b.ins().bitcast(types::F32, f, wide);
        }
        // f16: exponent and significand moved into f32's places, then
        // scaled by 2^112 (the difference of the exponent biases), which
        // also makes f16's subnormals normal f32s; all-ones exponents
        // (infinities, NaN) keep theirs.
        let ins = self.b.ins();
        let magnitude = ins.band_imm_s(bits, 0x7fff);
        let moved = self.b.ins().ishl_imm_s(magnitude, 13);
        let as_float = self.b.ins().bitcast(types::F32, f, moved);
        let scale = self.b.ins().f32const(f32::from_bits(0x7780_0000));
        let scaled = self.b.ins().fmul(as_float, scale);
        let scaled = self.b.ins().bitcast(types::I32, f, scaled);
        let special = self.b.ins().bor_imm_s(moved, 0x7f80_0000);
        let is_special =
            self.b
                .ins()
                .icmp_imm_s(IntCC::SignedGreaterThanOrEqual, magnitude, 0x7c00);
        let value = self.b.ins().select(is_special, special, scaled);
        let sign = self.b.ins().band_imm_s(bits, 0x8000);
        let sign = self.b.ins().ishl_imm_s(sign, 16);
        let value = self.b.ins().bor(value, sign);
        self.b.ins().bitcast(types::F32, f, value)
    }

    /// The 16-bit `dtype` bits (in an i32's low half) nearest f32 `x`.
    pub(super) fn narrow_half(&mut self, dtype: DType, x: Value) -> Value {
        let f = MemFlagsData::new();
        let bits = self.b.ins().bitcast(types::I32, f, x);
        let nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        if dtype == DType::BF16 {
            // Add half a unit of the last kept place, less one unless the
            // kept part is odd (ties to even), and keep the top half.
            let high = self.b.ins().ushr_imm_s(bits, 16);
            let odd = self.b.ins().band_imm_s(high, 1);
            let biased = self.b.ins().iadd_imm_s(bits, 0x7fff);
            let biased = self.b.ins().iadd(biased, odd);
            let rounded = self.b.ins().ushr_imm_s(biased, 16);
            let quiet = self.b.ins().bor_imm_s(high, 0x40);
            return self.b.ins().select(nan, quiet, rounded);
        }
        // f16, on the magnitude: above its largest finite value (rounded)
        // infinity; below its smallest normal, an f32 addition rounds to a
        // multiple of 2^-24; else the same rounding as bf16's, 13 places.
        let sign = self
            .b
            .ins()
            .band_imm_s(bits, i64::from(0x8000_0000u32 as i32));
        let sign = self.b.ins().ushr_imm_s(sign, 16);
        let magnitude = self.b.ins().band_imm_s(bits, 0x7fff_ffff);
        let abs = self.b.ins().bitcast(types::F32, f, magnitude);
        // 2^-1: its unit in the last place is 2^-24, f16's smallest subnormal.
        let half = self.b.ins().f32const(0.5);
        let sub = self.b.ins().fadd(abs, half);
        let sub = self.b.ins().bitcast(types::I32, f, sub);
        let sub = self.b.ins().iadd_imm_s(sub, -0x3f00_0000);
        let odd = self.b.ins().ushr_imm_s(magnitude, 13);
        let odd = self.b.ins().band_imm_s(odd, 1);
        // Rebias the exponent from 127 to 15 and round.
        let normal = self
            .b
            .ins()
            .iadd_imm_s(magnitude, ((15 - 127) << 23) + 0xfff);
        let normal = self.b.ins().iadd(normal, odd);
        let normal = self.b.ins().ushr_imm_s(normal, 13);
        let is_sub = self
            .b
            .ins()
            .icmp_imm_s(IntCC::SignedLessThan, magnitude, 113 << 23);
        let finite = self.b.ins().select(is_sub, sub, normal);
        // f16's largest finite value is 65504; from 65520 on, infinity.
        let inf = self.b.ins().iconst(types::I32, 0x7c00);
        let huge =
            self.b
                .ins()
                .icmp_imm_s(IntCC::SignedGreaterThanOrEqual, magnitude, (127 + 16) << 23);
        let value = self.b.ins().select(huge, inf, finite);
        let quiet = self.b.ins().iconst(types::I32, 0x7e00);
        let value = self.b.ins().select(nan, quiet, value);
        self.b.ins().bor(value, sign)
    }

    /// f32 `x` rounded to the nearest `dtype` value, as f32.
    pub(super) fn round_half(&mut self, dtype: DType, x: Value) -> Value {
        let bits = self.narrow_half(dtype, x);
        self.widen_half(dtype, bits)
    }

    /// f64 `x` rounded to the nearest `dtype` value, as f32: rounded to f32
    /// toward zero with the last bit set where that dropped anything (round
    /// to odd), which rounded again gives the direct rounding, where
    /// rounding to nearest twice could land on a tie and round it to even.
    pub(super) fn round_f64_half(&mut self, dtype: DType, x: Value) -> Value {
        let f = MemFlagsData::new();
        let near = self.b.ins().fdemote(types::F32, x);
        let back = self.b.ins().fpromote(types::F64, near);
        let inexact = self.b.ins().fcmp(FloatCC::OrderedNotEqual, back, x);
        let abs_back = self.b.ins().fabs(back);
        let abs_x = self.b.ins().fabs(x);
        let away = self.b.ins().fcmp(FloatCC::GreaterThan, abs_back, abs_x);
        let bits = self.b.ins().bitcast(types::I32, f, near);
        let stepped = self.b.ins().iadd_imm_s(bits, -1);
        let toward = self.b.ins().select(away, stepped, bits);
        let odd = self.b.ins().bor_imm_s(toward, 1);
        // An infinite `near` is exact or an overflow, which stays infinite.
        let inf = self.b.ins().f64const(f64::INFINITY);
        let finite = self.b.ins().fcmp(FloatCC::NotEqual, abs_back, inf);
        let adjust = self.b.ins().band(inexact, finite);
        let bits = self.b.ins().select(adjust, odd, bits);
        let odd_f32 = self.b.ins().bitcast(types::F32, f, bits);
        self.round_half(dtype, odd_f32)
    }
}
