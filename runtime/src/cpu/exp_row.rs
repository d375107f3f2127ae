//! e^(x - shift) over a row, with the row's sum, in 256-bit AVX2+FMA
//! vectors, for generated code to call: the reduction `sum(exp(...))` of
//! softmax, log_softmax and logsumexp spends most of its time in exp, and
//! Cranelift emits 128-bit vectors only, so its own exp takes twice the
//! instructions per element. The arithmetic is `Math::exp`'s, operation for
//! operation (fused multiply-adds included), so every element gets the same
//! bits whichever computes it: `Math::exp`'s bounds hold here.
//!
//! `unsafe` here is the vector loads and stores and the call of the AVX2
//! code.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256, __m256i, _CMP_NLE_UQ, _MM_HINT_T0, _mm_prefetch, _mm256_add_epi32, _mm256_add_ps,
    _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmp_ps, _mm256_fmadd_ps, _mm256_loadu_ps,
    _mm256_max_ps, _mm256_min_ps, _mm256_movemask_ps, _mm256_mul_ps, _mm256_set1_epi32,
    _mm256_set1_ps, _mm256_setzero_ps, _mm256_slli_epi32, _mm256_srai_epi32, _mm256_storeu_ps,
    _mm256_sub_epi32, _mm256_sub_ps,
};

/// Whether this CPU runs `kiln_exp_sum` (and `row_ops`' functions).
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// Stores `e^(src[j] - shift)` to `dst[j]` for `j < n` (no store where
/// `dst` is null) and returns their sum (in an order of its own), reading a
/// line at `ahead` (unless null) per 16 elements, as the generated loops
/// do (`lower::signature`). `src` may be `dst`. The subtraction is the
/// generated code's `x - max`, one f32 operation, so the exponent's argument
/// has the same bits; a shift of 0 leaves every argument as it is. Called
/// by generated code only where `available()`, with rows it owns.
pub(crate) extern "C" fn kiln_exp_sum(
    src: *const f32,
    shift: f32,
    dst: *mut f32,
    n: i64,
    ahead: *const u8,
) -> f32 {
    let n = n.max(0) as usize;
    // SAFETY: generated code calls this only where the CPU has AVX2 and FMA
    // (`available`), with `n` elements at `src` to read and, unless null,
    // at `dst` to write, which only it touches meanwhile.
    unsafe {
        if dst.is_null() {
            exp_sum::<false>(src, shift, dst, n, ahead)
        } else {
            exp_sum::<true>(src, shift, dst, n, ahead)
        }
    }
}

/// `kiln_exp_sum` itself, storing the exponentials where `STORE`: four
/// vectors of eight at a time with four sums, then one, then the last few
/// through a vector on the stack.
///
/// # Safety
/// The CPU has AVX2 and FMA; `src..src + n` is readable and, where
/// `STORE`, `dst..dst + n` this caller's to write (`src` itself or apart).
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sum<const STORE: bool>(
    src: *const f32,
    shift: f32,
    dst: *mut f32,
    n: usize,
    ahead: *const u8,
) -> f32 {
    let shift = splat(shift);
    let mut sums = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (every access below): `i + 8 <= n`, inside the caller's row; a
    // prefetch never faults.
    while i + 32 <= n {
        if !ahead.is_null() {
            let line = ahead.wrapping_add(4 * i).cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(line);
            _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(64));
        }
        for (u, sum) in sums.iter_mut().enumerate() {
            let x = unsafe { _mm256_loadu_ps(src.add(i + 8 * u)) };
            let e = exp8(_mm256_sub_ps(x, shift));
            if STORE {
                unsafe { _mm256_storeu_ps(dst.add(i + 8 * u), e) };
            }
            *sum = _mm256_add_ps(*sum, e);
        }
        i += 32;
    }
    while i + 8 <= n {
        let x = unsafe { _mm256_loadu_ps(src.add(i)) };
        let e = exp8(_mm256_sub_ps(x, shift));
        if STORE {
            unsafe { _mm256_storeu_ps(dst.add(i), e) };
        }
        sums[0] = _mm256_add_ps(sums[0], e);
        i += 8;
    }
    let all = _mm256_add_ps(
        _mm256_add_ps(sums[0], sums[1]),
        _mm256_add_ps(sums[2], sums[3]),
    );
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), all) };
    let mut total: f32 = lanes.iter().sum();
    if i < n {
        let rest = n - i;
        let mut tail = [0f32; 8];
        // SAFETY: `rest` elements from `i` are inside the row, and `tail`
        // holds eight; the stack is apart from both rows.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), tail.as_mut_ptr(), rest) };
        let x = unsafe { _mm256_loadu_ps(tail.as_ptr()) };
        let e = exp8(_mm256_sub_ps(x, shift));
        unsafe { _mm256_storeu_ps(tail.as_mut_ptr(), e) };
        if STORE {
            unsafe { std::ptr::copy_nonoverlapping(tail.as_ptr(), dst.add(i), rest) };
        }
        total += tail[..rest].iter().sum::<f32>();
    }
    total
}

#[target_feature(enable = "avx2,fma")]
fn splat(v: f32) -> __m256 {
    _mm256_set1_ps(v)
}

/// e^x of eight lanes: `Math::exp`'s fast path, or where a lane lies beyond
/// |x| = 87 (or is NaN), `Math::exp_anywhere` for all eight, which gives
/// the fast path's bits on the lanes within.
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
    let (shifted, e) = parts(x);
    let n = _mm256_slli_epi32::<23>(_mm256_castps_si256(shifted));
    let fast = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(e), n));
    let square = _mm256_mul_ps(x, x);
    let outside = _mm256_cmp_ps::<_CMP_NLE_UQ>(square, splat(87.0 * 87.0));
    if _mm256_movemask_ps(outside) == 0 {
        return fast;
    }
    // `x < lo ? lo : x` then `hi < x ? hi : x`: a NaN passes both (`maxps`
    // and `minps` return their second operand on one).
    let x = _mm256_max_ps(splat(-104.0), x);
    let x = _mm256_min_ps(splat(88.8), x);
    let (shifted, e) = parts(x);
    let n = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x4b40_0000));
    let half = _mm256_srai_epi32::<1>(n);
    let rest = _mm256_sub_epi32(n, half);
    let y = _mm256_mul_ps(e, pow2(half));
    _mm256_mul_ps(y, pow2(rest))
}

/// 2^n for integer lanes `n` in [-126, 127].
#[target_feature(enable = "avx2,fma")]
fn pow2(n: __m256i) -> __m256 {
    let biased = _mm256_add_epi32(n, _mm256_set1_epi32(127));
    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased))
}

/// `(n + 1.5 * 2^23, e^r)` for `x = n ln2 + r`: `Math::exp_parts`.
#[target_feature(enable = "avx2,fma")]
fn parts(x: __m256) -> (__m256, __m256) {
    let magic = splat(12_582_912.0);
    let shifted = _mm256_fmadd_ps(x, splat(std::f32::consts::LOG2_E), magic);
    let n = _mm256_sub_ps(shifted, magic);
    let r = _mm256_fmadd_ps(n, splat(-0.693_359_4), x);
    let r = _mm256_fmadd_ps(n, splat(2.121_944_4e-4), r);
    let r2 = _mm256_mul_ps(r, r);
    let one = splat(1.0);
    let a = _mm256_fmadd_ps(r, splat(4.999_999_4e-1), one);
    let b = _mm256_fmadd_ps(r, splat(4.166_839e-2), splat(1.666_652_1e-1));
    let c = _mm256_fmadd_ps(r, splat(1.381_458_4e-3), splat(8.368_724e-3));
    let bc = _mm256_fmadd_ps(c, r2, b);
    let p = _mm256_fmadd_ps(bc, r2, a);
    (shifted, _mm256_fmadd_ps(r, p, one))
}

#[cfg(test)]
mod tests {
    use kiln_ir::pass::{Options, optimize};
    use kiln_ir::{DType, Data, DataRef, Graph, Op, Shape, TensorType, UnaryOp};

    use super::*;
    use crate::cpu::jit::{Buffer, CompiledKernel};

    /// Every 97th f32 bit pattern of each sign (the whole range, subnormals
    /// included) and the special values.
    fn values() -> Vec<f32> {
        let mut values: Vec<f32> = (0..u32::MAX / 97)
            .map(|k| f32::from_bits(k.wrapping_mul(97)))
            .filter(|v| v.is_finite())
            .collect();
        values.extend([
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
        ]);
        values
    }

    /// `Math::exp` of each value, by an elementwise kernel.
    fn generated_exp(values: &[f32]) -> Vec<f32> {
        let mut g = Graph::new("g");
        let ty = TensorType::new(DType::F32, Shape::new(&[values.len()]));
        let x = g.input(ty);
        let e = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
        g.outputs.push(e);
        let optimized = optimize(&g, Options::default(), &mut |_, _| {}).unwrap();
        let launch = &optimized.schedule.launches[0];
        let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
            panic!("the launch is a kernel")
        };
        let kernel = CompiledKernel::new(kernel, None).unwrap();
        let mut out = Data::zeros(DType::F32, values.len()).unwrap();
        let input = Buffer::input(DataRef::F32(values));
        kernel
            .run(
                &[&input],
                &mut Buffer::output(&mut out),
                &mut [],
                &mut Buffer::empty(),
            )
            .unwrap();
        match out {
            Data::F32(v) => v,
            _ => panic!("an f32 output"),
        }
    }

    #[test]
    fn exp_sum_gives_the_generated_exp_bit_for_bit_within_its_bound() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX2 or FMA");
            return;
        }
        let values = values();
        let want = generated_exp(&values);
        // Rows of awkward lengths: every tail, and whole rows of 32.
        let mut got = values.clone();
        let mut at = 0;
        for len in (1..=40).cycle() {
            if at == got.len() {
                break;
            }
            let row = &mut got[at..(at + len).min(values.len())];
            let p = row.as_mut_ptr();
            kiln_exp_sum(p, 0.0, p, row.len() as i64, std::ptr::null());
            at += row.len();
        }
        let mut worst = (0.0f64, 0.0f32);
        for ((&v, &g), &w) in values.iter().zip(&got).zip(&want) {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "exp({v:e}): {g:e} here, {w:e} generated"
            );
            // `Math::exp`'s bound (tests/cpu_products.rs), against f64.
            let exact = f64::from(v).exp();
            let e32 = exact as f32;
            let err = if e32.is_nan() {
                if g.is_nan() { 0.0 } else { f64::INFINITY }
            } else if e32.is_infinite() || g.is_infinite() {
                if g == e32 { 0.0 } else { f64::INFINITY }
            } else if exact < f64::from(f32::MIN_POSITIVE) {
                (f64::from(g) - exact).abs() / f64::from(f32::MIN_POSITIVE) * 1e-7
            } else {
                (f64::from(g) - exact).abs() / exact
            };
            if err > worst.0 {
                worst = (err, v);
            }
        }
        assert!(worst.0 <= 2e-7, "exp: error {:e} at {:e}", worst.0, worst.1);
    }

    #[test]
    fn exp_sum_sums_what_it_stores_from_its_shifted_source() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX2 or FMA");
            return;
        }
        for len in [0, 1, 7, 8, 9, 31, 32, 33, 1000, 1027] {
            let src: Vec<f32> = (0..len).map(|i| (i % 23) as f32 / 4.0 - 1.5).collect();
            let shift = 1.5f32;
            let mut dst = vec![f32::NAN; len];
            let ahead = src.as_ptr().cast::<u8>();
            let sum = kiln_exp_sum(src.as_ptr(), shift, dst.as_mut_ptr(), len as i64, ahead);
            // The same exponentials as in place from the shifted row.
            let mut want: Vec<f32> = src.iter().map(|&x| x - shift).collect();
            let p = want.as_mut_ptr();
            let in_place = kiln_exp_sum(p, 0.0, p, len as i64, std::ptr::null());
            assert_eq!(sum.to_bits(), in_place.to_bits(), "length {len}");
            let same = dst
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "length {len}: exponentials differ");
            // Without a destination, the sum alone.
            let alone = kiln_exp_sum(src.as_ptr(), shift, std::ptr::null_mut(), len as i64, ahead);
            assert_eq!(sum.to_bits(), alone.to_bits(), "length {len}");
            let exact: f64 = dst.iter().map(|&e| f64::from(e)).sum();
            let err = (f64::from(sum) - exact).abs();
            assert!(
                err <= 1e-6 * exact.max(1.0),
                "length {len}: {sum} for {exact}"
            );
        }
    }
}
