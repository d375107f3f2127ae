//! A row's max, its sum and a row scaled by a number, in 256-bit AVX2
//! vectors, for generated code to call. Cranelift emits 128-bit vectors
//! only.
//! - The max and the scale are softmax's passes around its exponentials
//!   (`super::exp`): with the exp in 256-bit code, they took about 0.4 of
//!   softmax's time in cache. Both give exactly the interpreter's values: a
//!   max is one of the row's values (IEEE `maximum`: NaN where the row has
//!   one, +0 above -0), a product one f32 operation.
//! - The sum is a plain read's, over any row of 32 or more (`ROW_CALL_MIN`);
//!   long ones (`sum_all`'s rows of 64 KiB) reach the memory's limit on
//!   Zen 4 only in one stream of 32-byte loads. Its additions are
//!   reassociated, as the generated code's vector accumulators already do.
//!
//! `unsafe` here is the vector loads and stores and the call of the AVX2
//! code.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256, __m256i, _CMP_UNORD_Q, _mm256_add_ps, _mm256_castps_si256, _mm256_cmp_ps,
    _mm256_cmpeq_epi32, _mm256_cmpgt_epi32, _mm256_loadu_ps, _mm256_maskload_ps,
    _mm256_maskstore_ps, _mm256_max_ps, _mm256_movemask_epi8, _mm256_movemask_ps, _mm256_mul_ps,
    _mm256_or_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps,
    _mm256_setzero_si256, _mm256_storeu_ps,
};

/// The IEEE maximum of `src[0..n]` (-inf for no elements).
///
/// # Safety
/// The CPU has AVX2 and FMA (`super::available`); `n` elements at `src` are
/// readable.
pub unsafe extern "C" fn kiln_max_row(src: *const f32, n: i64) -> f32 {
    // SAFETY: the contract of this function.
    unsafe { max_row(src, n.max(0) as usize) }
}

/// The sum of `src[0..n]` (+0 for no elements).
///
/// # Safety
/// As `kiln_max_row`.
pub unsafe extern "C" fn kiln_sum_row(src: *const f32, n: i64) -> f32 {
    // SAFETY: the contract of this function.
    unsafe { sum_row(src, n.max(0) as usize) }
}

/// `dst[j] = src[j] * c` for `j < n`; `src` may be `dst`.
///
/// # Safety
/// As `kiln_max_row`, and the `n` elements at `dst` are this caller's to
/// write (`src` itself or apart).
pub unsafe extern "C" fn kiln_scale_row(src: *const f32, c: f32, dst: *mut f32, n: i64) {
    // SAFETY: the contract of this function.
    unsafe { scale_row(src, c, dst, n.max(0) as usize) }
}

/// `kiln_max_row`: `maxps` over four vectors at a time, which keeps the
/// accumulator over a NaN of the row (its second operand) and may keep -0
/// over +0, with the NaNs noted apart, one compare per two vectors; the
/// last few elements as the last eight again (a max of a value twice is
/// the same max); and a row whose max comes out zero looked at again for
/// a +0.
///
/// # Safety
/// The CPU has AVX2; `src..src + n` is readable.
#[target_feature(enable = "avx2,fma")]
unsafe fn max_row(src: *const f32, n: usize) -> f32 {
    if n < 8 {
        // SAFETY: `n` elements at `src` are readable.
        let row = unsafe { std::slice::from_raw_parts(src, n) };
        return row.iter().fold(f32::NEG_INFINITY, |m, &x| maximum(m, x));
    }
    let mut maxes = [splat(f32::NEG_INFINITY); 4];
    let mut nans = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY (every load below): `i + 8 <= n`, inside the row.
    while i + 32 <= n {
        let mut v = [_mm256_setzero_ps(); 4];
        for (u, (m, x)) in maxes.iter_mut().zip(&mut v).enumerate() {
            *x = unsafe { _mm256_loadu_ps(src.add(i + 8 * u)) };
            *m = _mm256_max_ps(*x, *m);
        }
        let unordered = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[1]),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[2], v[3]),
        );
        nans = _mm256_or_ps(nans, unordered);
        i += 32;
    }
    // Single vectors, the last one overlapping the ones before where the
    // row ends ragged.
    while i < n {
        let x = unsafe { _mm256_loadu_ps(src.add(i.min(n - 8))) };
        maxes[0] = _mm256_max_ps(x, maxes[0]);
        nans = _mm256_or_ps(nans, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        i += 8;
    }
    if _mm256_movemask_ps(nans) != 0 {
        return f32::NAN;
    }
    let all = _mm256_max_ps(
        _mm256_max_ps(maxes[0], maxes[1]),
        _mm256_max_ps(maxes[2], maxes[3]),
    );
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), all) };
    let max = lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    if max != 0.0 {
        return max;
    }
    // +0 where the row holds one (all bits clear), else -0.
    let zero = _mm256_setzero_si256();
    let mut found = false;
    let mut j = 0;
    while j < n && !found {
        let at = j.min(n - 8);
        // SAFETY: `at + 8 <= n`.
        let x = _mm256_castps_si256(unsafe { _mm256_loadu_ps(src.add(at)) });
        found = _mm256_movemask_epi8(_mm256_cmpeq_epi32(x, zero)) != 0;
        j += 8;
    }
    if found { 0.0 } else { -0.0 }
}

/// `kiln_sum_row`: four accumulators over four vectors at a time, in the
/// row's order, then single vectors, then the last few by a masked load,
/// its other lanes +0 as the accumulators start. One stream: on Zen 4 it
/// reads faster than four segments of 128-bit loads, the generated code's
/// form for long rows (`LONG_ROW`; measured in `benches/RESULTS-cpu.md`).
///
/// # Safety
/// The CPU has AVX2; `src..src + n` is readable.
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_row(src: *const f32, n: usize) -> f32 {
    let mut sums = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (every load below): `i + 8 <= n`, inside the row.
    while i + 32 <= n {
        for (u, s) in sums.iter_mut().enumerate() {
            *s = _mm256_add_ps(*s, unsafe { _mm256_loadu_ps(src.add(i + 8 * u)) });
        }
        i += 32;
    }
    while i + 8 <= n {
        sums[0] = _mm256_add_ps(sums[0], unsafe { _mm256_loadu_ps(src.add(i)) });
        i += 8;
    }
    if i < n {
        // SAFETY: only lanes `i..n` are read.
        let x = unsafe { _mm256_maskload_ps(src.add(i), below(n - i)) };
        sums[0] = _mm256_add_ps(sums[0], x);
    }
    let all = _mm256_add_ps(
        _mm256_add_ps(sums[0], sums[1]),
        _mm256_add_ps(sums[2], sums[3]),
    );
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), all) };
    lanes.iter().sum()
}

/// A mask of the lanes below `rest` (all ones where `rest > lane`), for
/// masked loads and stores of a row's last `rest < 8` elements.
#[target_feature(enable = "avx2,fma")]
fn below(rest: usize) -> __m256i {
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(rest as i32), lane)
}

/// IEEE `maximum` of two f32, as the interpreter computes a max.
pub(super) fn maximum(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else if x == y {
        if x.is_sign_positive() { x } else { y }
    } else {
        x.max(y)
    }
}

/// `kiln_scale_row`: four vectors at a time, then one, then the last few
/// by masked loads and stores.
///
/// # Safety
/// The CPU has AVX2; `src..src + n` is readable and `dst..dst + n` this
/// caller's to write (`src` itself or apart).
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_row(src: *const f32, c: f32, dst: *mut f32, n: usize) {
    let c = splat(c);
    let mut i = 0;
    // SAFETY (every access below): `i + 8 <= n`, inside both rows.
    while i + 32 <= n {
        for u in 0..4 {
            let x = unsafe { _mm256_loadu_ps(src.add(i + 8 * u)) };
            unsafe { _mm256_storeu_ps(dst.add(i + 8 * u), _mm256_mul_ps(x, c)) };
        }
        i += 32;
    }
    while i + 8 <= n {
        let x = unsafe { _mm256_loadu_ps(src.add(i)) };
        unsafe { _mm256_storeu_ps(dst.add(i), _mm256_mul_ps(x, c)) };
        i += 8;
    }
    if i < n {
        let mask = below(n - i);
        // SAFETY: the masked lanes, `i..n`, are inside both rows; the others
        // are neither read nor written.
        let x = unsafe { _mm256_maskload_ps(src.add(i), mask) };
        unsafe { _mm256_maskstore_ps(dst.add(i), mask, _mm256_mul_ps(x, c)) };
    }
}

#[target_feature(enable = "avx2,fma")]
fn splat(v: f32) -> __m256 {
    _mm256_set1_ps(v)
}
