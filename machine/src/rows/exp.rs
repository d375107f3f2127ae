//! e^(x - shift) over a row, with the row's sum, and SiLU over a row
//! (`x * sigmoid(x)`), in 256-bit AVX2+FMA vectors, for generated code to
//! call: the reduction `sum(exp(...))` of softmax, log_softmax and
//! logsumexp spends most of its time in exp, as the SiLU after each of
//! EfficientNet's convolutions does, and Cranelift emits 128-bit vectors
//! only, so its own exp takes twice the instructions per element. The
//! arithmetic is `Math::exp`'s (and `Math::sigmoid`'s), operation for
//! operation (fused multiply-adds included), so every element gets the
//! same bits whichever computes it (the runtime's `cpu::math`; its tests
//! compare the two bit for bit): `Math::exp`'s bounds hold here.
//!
//! `unsafe` here is the vector loads and stores and the call of the AVX2
//! code.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256, __m256i, _CMP_LT_OQ, _CMP_NLE_UQ, _MM_HINT_T0, _mm_prefetch, _mm256_add_epi32,
    _mm256_add_ps, _mm256_andnot_ps, _mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmp_ps,
    _mm256_div_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_max_ps, _mm256_min_ps,
    _mm256_movemask_ps, _mm256_mul_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps,
    _mm256_slli_epi32, _mm256_srai_epi32, _mm256_storeu_ps, _mm256_sub_epi32, _mm256_sub_ps,
    _mm256_xor_ps,
};

/// Stores `e^(src[j] - shift)` to `dst[j]` for `j < n` (no store where
/// `dst` is null) and returns their sum (in an order of its own), reading a
/// line at `ahead` (unless null) per 16 elements, as the generated loops
/// do. `src` may be `dst`. The subtraction is the generated code's
/// `x - max`, one f32 operation, so the exponent's argument has the same
/// bits; a shift of 0 leaves every argument as it is.
///
/// # Safety
/// The CPU has AVX2 and FMA (`super::available`); `n` elements at `src` are
/// readable and, unless `dst` is null, the `n` at `dst` are this caller's to
/// write (`src` itself or apart); `ahead`, when not null, is any address (a
/// prefetch never faults).
pub unsafe extern "C" fn kiln_exp_sum(
    src: *const f32,
    shift: f32,
    dst: *mut f32,
    n: i64,
    ahead: *const u8,
) -> f32 {
    let n = n.max(0) as usize;
    // SAFETY: the contract of this function.
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
    // Lanes below -104 (masked scores: -inf, -1e9) are 0 by the fast path
    // once a lane of the row has left it: `exp8` would take the slow path
    // for them, in every later vector of a masked row, and the branch,
    // mispredicted there, cost masked softmax 5x (`benches/RESULTS-cpu.md`).
    // Rows that never leave it keep the cheaper test.
    let mut masked = false;
    let mut exp = |x: __m256| {
        if masked {
            return exp8::<true>(x).0;
        }
        let (e, slow) = exp8::<false>(x);
        masked = slow;
        e
    };
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
            let e = exp(_mm256_sub_ps(x, shift));
            if STORE {
                unsafe { _mm256_storeu_ps(dst.add(i + 8 * u), e) };
            }
            *sum = _mm256_add_ps(*sum, e);
        }
        i += 32;
    }
    while i + 8 <= n {
        let x = unsafe { _mm256_loadu_ps(src.add(i)) };
        let e = exp(_mm256_sub_ps(x, shift));
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
        let e = exp(_mm256_sub_ps(x, shift));
        unsafe { _mm256_storeu_ps(tail.as_mut_ptr(), e) };
        if STORE {
            unsafe { std::ptr::copy_nonoverlapping(tail.as_ptr(), dst.add(i), rest) };
        }
        total += tail[..rest].iter().sum::<f32>();
    }
    total
}

/// Stores `x * sigmoid(x)` to `dst[j]` for `x = src[j]`, `j < n`: the
/// generated code's SiLU operation for operation (`-x` by its sign bit,
/// `1 / (1 + e^-x)`, the product), so each element gets the same bits.
/// `src` may be `dst`.
///
/// # Safety
/// The CPU has AVX2 and FMA (`super::available`); `n` elements at `src` are
/// readable, and the `n` at `dst` this caller's to write (`src` itself or
/// apart).
pub unsafe extern "C" fn kiln_silu_row(src: *const f32, dst: *mut f32, n: i64) {
    // SAFETY: the contract of this function.
    unsafe { silu_row(src, dst, n.max(0) as usize) }
}

/// `kiln_silu_row`: two vectors at a time, then one, then the last few
/// through a vector on the stack.
///
/// # Safety
/// The CPU has AVX2 and FMA; `src..src + n` is readable and `dst..dst + n`
/// this caller's to write (`src` itself or apart).
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_row(src: *const f32, dst: *mut f32, n: usize) {
    let silu = |x: __m256| {
        let (e, _) = exp8::<false>(_mm256_xor_ps(x, splat(-0.0)));
        let one = splat(1.0);
        _mm256_mul_ps(x, _mm256_div_ps(one, _mm256_add_ps(one, e)))
    };
    let mut i = 0;
    // SAFETY (every access below): `i + 8 <= n`, inside both rows.
    while i + 16 <= n {
        let (x, y) = unsafe { (_mm256_loadu_ps(src.add(i)), _mm256_loadu_ps(src.add(i + 8))) };
        unsafe { _mm256_storeu_ps(dst.add(i), silu(x)) };
        unsafe { _mm256_storeu_ps(dst.add(i + 8), silu(y)) };
        i += 16;
    }
    while i + 8 <= n {
        let x = unsafe { _mm256_loadu_ps(src.add(i)) };
        unsafe { _mm256_storeu_ps(dst.add(i), silu(x)) };
        i += 8;
    }
    if i < n {
        let rest = n - i;
        let mut tail = [0f32; 8];
        // SAFETY: `rest` elements from `i` are inside both rows, and `tail`
        // holds eight; the stack is apart from both.
        unsafe { std::ptr::copy_nonoverlapping(src.add(i), tail.as_mut_ptr(), rest) };
        let x = unsafe { _mm256_loadu_ps(tail.as_ptr()) };
        unsafe { _mm256_storeu_ps(tail.as_mut_ptr(), silu(x)) };
        unsafe { std::ptr::copy_nonoverlapping(tail.as_ptr(), dst.add(i), rest) };
    }
}

#[target_feature(enable = "avx2,fma")]
fn splat(v: f32) -> __m256 {
    _mm256_set1_ps(v)
}

/// e^x of eight lanes, and whether it took the slow path: `Math::exp`'s
/// fast path, or where a lane lies beyond |x| = 87 (or is NaN),
/// `Math::exp_anywhere` for all eight, which gives the fast path's bits on
/// the lanes within. With `TINY`, lanes below -104 are 0 by the fast path
/// (`exp_anywhere` gives them 0 too), and a vector takes the slow path (all
/// eight lanes) only where a lane not below -104 lies beyond.
#[target_feature(enable = "avx2,fma")]
fn exp8<const TINY: bool>(x: __m256) -> (__m256, bool) {
    let (shifted, e) = parts(x);
    let n = _mm256_slli_epi32::<23>(_mm256_castps_si256(shifted));
    let fast = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(e), n));
    let square = _mm256_mul_ps(x, x);
    let outside = _mm256_cmp_ps::<_CMP_NLE_UQ>(square, splat(87.0 * 87.0));
    if TINY {
        let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, splat(-104.0));
        if _mm256_movemask_ps(_mm256_andnot_ps(tiny, outside)) == 0 {
            return (_mm256_andnot_ps(tiny, fast), false);
        }
    } else if _mm256_movemask_ps(outside) == 0 {
        return (fast, false);
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
    (_mm256_mul_ps(y, pow2(rest)), true)
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
