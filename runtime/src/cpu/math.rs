//! Transcendental functions as Cranelift IR, for `f32` and `f32x4` alike:
//! CLIF has no exp, log or tanh, and a libm call per lane would forfeit the
//! vector loop.
//!
//! Error bounds, measured against f64 over the whole f32 range by the
//! backend tests (`tests/cpu_products.rs`, `transcendentals_stay_within_their_bounds`):
//! - `exp`: relative error below 2e-7 wherever the result is a normal f32;
//!   +inf above 88.7228, subnormal results correctly scaled, NaN kept;
//! - `log`: absolute error below 2e-7 near 1, relative below 2e-7 elsewhere;
//!   NaN below 0, -inf at 0, +inf at +inf;
//! - `tanh`: relative error below 5e-7 (from `e^2|x| - 1` by exp's
//!   reduction, with no branch);
//! - `sigmoid`: `1 / (1 + exp(-x))`, relative error below 5e-7 where the
//!   result is a normal f32.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Type, Value, types};
use cranelift_frontend::FunctionBuilder;

/// Emits math over values of one float type, `F32` or `F32X4`.
pub(crate) struct Math<'a, 'b> {
    pub b: &'a mut FunctionBuilder<'b>,
    pub ty: Type,
}

impl Math<'_, '_> {
    fn vector(&self) -> bool {
        self.ty.is_vector()
    }

    /// The integer type with the same lanes.
    fn int(&self) -> Type {
        if self.vector() {
            types::I32X4
        } else {
            types::I32
        }
    }

    /// A float constant of the working type.
    pub fn f(&mut self, v: f32) -> Value {
        let c = self.b.ins().f32const(v);
        if self.vector() {
            self.b.ins().splat(self.ty, c)
        } else {
            c
        }
    }

    fn i(&mut self, v: i32) -> Value {
        let c = self.b.ins().iconst(types::I32, i64::from(v));
        if self.vector() {
            self.b.ins().splat(types::I32X4, c)
        } else {
            c
        }
    }

    /// `cond ? a : b` where `cond` is the result of an `fcmp` of this type.
    pub fn select(&mut self, cond: Value, a: Value, b: Value) -> Value {
        if self.vector() {
            let mask = self.b.ins().bitcast(self.ty, MemFlagsData::new(), cond);
            self.b.ins().bitselect(mask, a, b)
        } else {
            self.b.ins().select(cond, a, b)
        }
    }

    fn bits_of(&mut self, x: Value) -> Value {
        let int = self.int();
        self.b.ins().bitcast(int, MemFlagsData::new(), x)
    }

    fn float_of(&mut self, x: Value) -> Value {
        let ty = self.ty;
        self.b.ins().bitcast(ty, MemFlagsData::new(), x)
    }

    /// |x|. For f32x4 an `and` with a mask from the constant pool, where
    /// CLIF's `fabs` builds the mask in two instructions at every use.
    pub fn abs(&mut self, x: Value) -> Value {
        if !self.vector() {
            return self.b.ins().fabs(x);
        }
        let mask = self.i(0x7fff_ffff);
        let mask = self.float_of(mask);
        self.b.ins().band(x, mask)
    }

    /// -x. For f32x4 an `xor` with the sign bit from the constant pool (see
    /// `abs`).
    pub fn neg(&mut self, x: Value) -> Value {
        if !self.vector() {
            return self.b.ins().fneg(x);
        }
        let sign = self.i(i32::MIN);
        let sign = self.float_of(sign);
        self.b.ins().bxor(x, sign)
    }

    /// `p(x)` by Horner's rule with fused multiply-adds, highest power first.
    fn poly(&mut self, x: Value, coefficients: &[f32]) -> Value {
        let mut p = self.f(coefficients[0]);
        for &c in &coefficients[1..] {
            let c = self.f(c);
            p = self.b.ins().fma(p, x, c);
        }
        p
    }

    /// 2^n for integer lanes `n` in [-126, 127], as a float.
    fn pow2(&mut self, n: Value) -> Value {
        let bias = self.i(127);
        let biased = self.b.ins().iadd(n, bias);
        let bits = self.b.ins().ishl_imm_s(biased, 23);
        self.float_of(bits)
    }

    /// `x < y ? x : y`: one `minps` on x64, where CLIF's NaN-exact `fmin`
    /// takes eight instructions. A NaN on either side gives `y`.
    fn fast_min(&mut self, x: Value, y: Value) -> Value {
        let lt = self.b.ins().fcmp(FloatCC::LessThan, x, y);
        self.select(lt, x, y)
    }

    /// `y < x ? x : y`, the `maxps` counterpart of `fast_min`.
    pub fn fast_max(&mut self, x: Value, y: Value) -> Value {
        let lt = self.b.ins().fcmp(FloatCC::LessThan, y, x);
        self.select(lt, x, y)
    }

    /// IEEE `maximum` (NaN if either is NaN, +0 above -0). For f32x4 in five
    /// instructions where CLIF's `fmax` takes eight, chained: `maxps` in both
    /// operand orders agrees except on a tie of zeros, where and-ing the two
    /// keeps +0, and on a NaN, which or-ing in the unordered mask gives.
    pub fn maximum(&mut self, x: Value, y: Value) -> Value {
        if !self.vector() {
            return self.b.ins().fmax(x, y);
        }
        let a = self.fast_max(x, y);
        let b = self.fast_max(y, x);
        let both = self.b.ins().band(a, b);
        let unordered = self.b.ins().fcmp(FloatCC::Unordered, x, y);
        let ty = self.ty;
        let nan = self.b.ins().bitcast(ty, MemFlagsData::new(), unordered);
        self.b.ins().bor(both, nan)
    }

    /// IEEE `minimum` (NaN if either is NaN, -0 below +0). For f32x4 in three
    /// instructions: `minps` in both operand orders, or-ed, which keeps -0 on
    /// a tie of zeros and a NaN when either order returned one (its exponent
    /// and nonzero mantissa bits survive the or).
    pub fn minimum(&mut self, x: Value, y: Value) -> Value {
        if !self.vector() {
            return self.b.ins().fmin(x, y);
        }
        let a = self.fast_min(x, y);
        let b = self.fast_min(y, x);
        self.b.ins().bor(a, b)
    }

    /// e^x: range reduction `x = n ln2 + r` and a polynomial of degree 6 for
    /// e^r, then n added to the result's exponent bits: two integer
    /// instructions, exact while the result is a normal float, which
    /// |x| <= 87 ensures. A vector with a lane beyond (or a NaN) branches to
    /// `exp_anywhere`, which clamps and scales in nine, and gives the same
    /// bits on the lanes within. In exp-bound loops the fast path takes 0.7
    /// to 0.8 of the time.
    pub fn exp(&mut self, x: Value) -> Value {
        let ty = self.ty;
        let (shifted, e) = self.exp_parts(x);
        let shifted_bits = self.bits_of(shifted);
        // `shifted`'s bits are 0x4b40_0000 + n, whose shift by 23 is n << 23:
        // the magic constant's bits vanish past the top.
        let n = self.b.ins().ishl_imm_s(shifted_bits, 23);
        let e_bits = self.bits_of(e);
        let bits = self.b.ins().iadd(e_bits, n);
        let fast = self.float_of(bits);
        // |x| > 87 as x^2 > 87^2: one constant where the absolute value takes
        // two (rounding x^2 moves the bound by about 1e-6, far inside the 0.3
        // of slack between 87 and where results stop being normal floats).
        let square = self.b.ins().fmul(x, x);
        let limit = self.f(87.0 * 87.0);
        let outside = self
            .b
            .ins()
            .fcmp(FloatCC::UnorderedOrGreaterThan, square, limit);
        let any = if self.vector() {
            self.b.ins().vany_true(outside)
        } else {
            outside
        };
        let (slow, join) = (self.b.create_block(), self.b.create_block());
        self.b.set_cold_block(slow);
        let result = self.b.append_block_param(join, ty);
        self.b.ins().brif(any, slow, &[], join, &[fast.into()]);
        self.b.switch_to_block(slow);
        let exact = self.exp_anywhere(x);
        self.b.ins().jump(join, &[exact.into()]);
        self.b.switch_to_block(join);
        result
    }

    /// e^x over the whole f32 range: the input clamped to where n stays in
    /// [-150, 128], and 2^n applied as two halves so that both stay normal
    /// floats.
    fn exp_anywhere(&mut self, x: Value) -> Value {
        // The clamps pass a NaN through (`fast_max(lo, x)` is `x < lo ? lo : x`),
        // and every step after keeps it a NaN. Above 88.8 the result is +inf:
        // there n = 128 and the last product overflows, as the exact value does
        // from 88.72284 on.
        let (lo, hi) = (self.f(-104.0), self.f(88.8));
        let clamped = self.fast_max(lo, x);
        let x = self.fast_min(hi, clamped);
        let (shifted, e) = self.exp_parts(x);
        // 2^n in two normal halves, so that a subnormal result is rounded
        // once, by the last product (and a NaN, which integer arithmetic on
        // its bits would not keep, stays one).
        let shifted_bits = self.bits_of(shifted);
        let magic_bits = self.i(0x4b40_0000);
        let n = self.b.ins().isub(shifted_bits, magic_bits);
        let half = self.b.ins().sshr_imm_s(n, 1);
        let rest = self.b.ins().isub(n, half);
        let (p1, p2) = (self.pow2(half), self.pow2(rest));
        let y = self.b.ins().fmul(e, p1);
        self.b.ins().fmul(y, p2)
    }

    /// `(n + 1.5 * 2^23, e^r)` for `x = n ln2 + r`, n = nearest(x log2e).
    fn exp_parts(&mut self, x: Value) -> (Value, Value) {
        let (shifted, r, p) = self.exp_reduced(x);
        // One fused multiply-add, so the result is rounded once.
        let one = self.f(1.0);
        (shifted, self.b.ins().fma(r, p, one))
    }

    /// `(n + 1.5 * 2^23, r, p(r))` for `x = n ln2 + r`, n = nearest(x
    /// log2e), and `e^r = 1 + r p(r)`.
    fn exp_reduced(&mut self, x: Value) -> (Value, Value, Value) {
        // Adding 1.5 * 2^23 leaves n in the sum's low mantissa bits, rounded
        // once by the fused multiply-add.
        let (log2e, magic) = (self.f(std::f32::consts::LOG2_E), self.f(12_582_912.0));
        let shifted = self.b.ins().fma(x, log2e, magic);
        let n = self.b.ins().fsub(shifted, magic);
        let (ln2_hi, ln2_lo) = (self.f(-0.693_359_4), self.f(2.121_944_4e-4));
        let r = self.b.ins().fma(n, ln2_hi, x);
        let r = self.b.ins().fma(n, ln2_lo, r);
        // p the minimax polynomial of degree 5 with p(0) = 1 (relative
        // error of e^r 3.7e-9 on |r| <= ln2/2 with these f32 coefficients),
        // in pairs (Estrin's scheme): half the dependency chain of Horner's
        // rule, which out-of-order cores cannot overlap across enough
        // vectors to hide.
        let r2 = self.b.ins().fmul(r, r);
        let one = self.f(1.0);
        let p1 = self.f(4.999_999_4e-1);
        let a = self.b.ins().fma(r, p1, one);
        let [b, c] = [
            [1.666_652_1e-1, 4.166_839e-2],
            [8.368_724e-3, 1.381_458_4e-3],
        ]
        .map(|[c0, c1]| {
            let (c0, c1) = (self.f(c0), self.f(c1));
            self.b.ins().fma(r, c1, c0)
        });
        let bc = self.b.ins().fma(c, r2, b);
        let p = self.b.ins().fma(bc, r2, a);
        (shifted, r, p)
    }

    /// ln x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m by the Cephes
    /// polynomial in m - 1, plus e ln2 in two parts.
    pub fn log(&mut self, x: Value) -> Value {
        // Subnormals are scaled into the normal range first.
        let tiny = self.f(f32::MIN_POSITIVE);
        let is_tiny = self.b.ins().fcmp(FloatCC::LessThan, x, tiny);
        let scale = self.f(8_388_608.0); // 2^23
        let scaled = self.b.ins().fmul(x, scale);
        let xs = self.select(is_tiny, scaled, x);
        let (zero_i, minus23) = (self.i(0), self.i(-23));
        let adjust = if self.vector() {
            let mask = self
                .b
                .ins()
                .bitcast(types::I32X4, MemFlagsData::new(), is_tiny);
            self.b.ins().bitselect(mask, minus23, zero_i)
        } else {
            self.b.ins().select(is_tiny, minus23, zero_i)
        };
        let bits = self.bits_of(xs);
        let exp_bits = self.b.ins().ushr_imm_s(bits, 23);
        let mask = self.i(0xff);
        let exp_bits = self.b.ins().band(exp_bits, mask);
        let bias = self.i(126);
        let e = self.b.ins().isub(exp_bits, bias);
        let e = self.b.ins().iadd(e, adjust);
        // m in [0.5, 1).
        let mant = self.i(0x007f_ffff);
        let m_bits = self.b.ins().band(bits, mant);
        let half = self.i(0x3f00_0000);
        let m_bits = self.b.ins().bor(m_bits, half);
        let m = self.float_of(m_bits);
        let ty = self.ty;
        let ef = self.b.ins().fcvt_from_sint(ty, e);
        let sqrt_half = self.f(std::f32::consts::FRAC_1_SQRT_2);
        let below = self.b.ins().fcmp(FloatCC::LessThan, m, sqrt_half);
        let one = self.f(1.0);
        let twice = self.b.ins().fadd(m, m);
        let m = self.select(below, twice, m);
        let ef_minus = self.b.ins().fsub(ef, one);
        let ef = self.select(below, ef_minus, ef);
        let f = self.b.ins().fsub(m, one);
        let z = self.b.ins().fmul(f, f);
        let p = self.poly(
            f,
            &[
                7.037_683_6e-2,
                -1.151_461e-1,
                1.167_699_9e-1,
                -1.242_014_1e-1,
                1.424_932_3e-1,
                -1.666_805_8e-1,
                2.000_071_4e-1,
                -2.499_999_4e-1,
                0.333_333_3,
            ],
        );
        let y = self.b.ins().fmul(p, f);
        let y = self.b.ins().fmul(y, z);
        let lo = self.f(-2.121_944_4e-4);
        let y = self.b.ins().fma(ef, lo, y);
        let minus_half = self.f(-0.5);
        let y = self.b.ins().fma(z, minus_half, y);
        let r = self.b.ins().fadd(f, y);
        let hi = self.f(0.693_359_4);
        let r = self.b.ins().fma(ef, hi, r);
        // The special values: NaN and negatives give NaN, 0 gives -inf, +inf stays.
        let zero = self.f(0.0);
        let is_zero = self.b.ins().fcmp(FloatCC::Equal, x, zero);
        let neg_inf = self.f(f32::NEG_INFINITY);
        let r = self.select(is_zero, neg_inf, r);
        let inf = self.f(f32::INFINITY);
        let is_inf = self.b.ins().fcmp(FloatCC::Equal, x, inf);
        let r = self.select(is_inf, inf, r);
        let nan = self.f(f32::NAN);
        let invalid = self.b.ins().fcmp(FloatCC::UnorderedOrLessThan, x, zero);
        self.select(invalid, nan, r)
    }

    /// tanh x from `m = e^2|x| - 1`, x's sign restored: `m / (m + 2)`
    /// below |x| = 0.55, where `1 - 2 / (m + 2)` would cancel, and that
    /// formula above, where it rounds once near 1 (which `1 + tanh` in
    /// GELU's tail needs). One exp's reduction and polynomial, one
    /// division, no branch; |x| past 10 gives 1 (tanh(10) is 1 - 4e-9),
    /// which keeps e^2|x| a normal float.
    pub fn tanh(&mut self, x: Value) -> Value {
        // `fast_min(10, NaN)` is NaN: the clamp keeps a NaN.
        let ten = self.f(10.0);
        let ax = self.abs(x);
        let ax = self.fast_min(ten, ax);
        let y = self.b.ins().fadd(ax, ax);
        // m = 2^n (1 + r p) - 1 = 2^n r p + (2^n - 1): no cancellation
        // where y is small (n = 0, m = r p).
        let (shifted, r, p) = self.exp_reduced(y);
        let q = self.b.ins().fmul(r, p);
        let shifted_bits = self.bits_of(shifted);
        let n = self.b.ins().ishl_imm_s(shifted_bits, 23);
        let one_bits = self.i(1.0f32.to_bits() as i32);
        let two_n = self.b.ins().iadd(one_bits, n);
        let two_n = self.float_of(two_n);
        let one = self.f(1.0);
        let less_one = self.b.ins().fsub(two_n, one);
        let m = self.b.ins().fma(two_n, q, less_one);
        let two = self.f(2.0);
        let d = self.b.ins().fadd(m, two);
        let g = self.b.ins().fdiv(one, d);
        let small = self.b.ins().fmul(m, g);
        let minus_two = self.f(-2.0);
        let large = self.b.ins().fma(minus_two, g, one);
        let bound = self.f(0.55);
        let is_small = self.b.ins().fcmp(FloatCC::LessThan, ax, bound);
        let t = self.select(is_small, small, large);
        let t_bits = self.bits_of(t);
        let x_bits = self.bits_of(x);
        let sign = self.i(i32::MIN);
        let x_sign = self.b.ins().band(x_bits, sign);
        let bits = self.b.ins().bor(t_bits, x_sign);
        self.float_of(bits)
    }

    /// 1 / (1 + e^-x).
    pub fn sigmoid(&mut self, x: Value) -> Value {
        let neg = self.neg(x);
        let e = self.exp(neg);
        let one = self.f(1.0);
        let d = self.b.ins().fadd(one, e);
        self.b.ins().fdiv(one, d)
    }

    /// max(x, 0) with NaN kept and -0 mapped to +0, as the interpreter says.
    /// For f32x4 the lanes at or below zero are cleared by an and-not with
    /// the comparison's mask (a NaN compares false and stays): one `andnps`
    /// after the comparison, where a select takes a `blendv` of two micro-ops.
    pub fn relu(&mut self, x: Value) -> Value {
        let zero = self.f(0.0);
        let nonpositive = self.b.ins().fcmp(FloatCC::LessThanOrEqual, x, zero);
        if !self.vector() {
            return self.b.ins().select(nonpositive, zero, x);
        }
        let ty = self.ty;
        let mask = self.b.ins().bitcast(ty, MemFlagsData::new(), nonpositive);
        self.b.ins().band_not(x, mask)
    }
}

/// The integer comparison an op means for a signed or unsigned type.
pub(crate) fn int_cc(lt: bool, eq: bool, signed: bool) -> IntCC {
    match (lt, eq, signed) {
        (true, false, true) => IntCC::SignedLessThan,
        (true, true, true) => IntCC::SignedLessThanOrEqual,
        (false, false, true) => IntCC::SignedGreaterThan,
        (false, true, true) => IntCC::SignedGreaterThanOrEqual,
        (true, false, false) => IntCC::UnsignedLessThan,
        (true, true, false) => IntCC::UnsignedLessThanOrEqual,
        (false, false, false) => IntCC::UnsignedGreaterThan,
        (false, true, false) => IntCC::UnsignedGreaterThanOrEqual,
    }
}
