//! A row's max, its sum and a row scaled by a number, in 256-bit AVX2
//! vectors, for generated code to call. Cranelift emits 128-bit vectors
//! only.
//! - The max and the scale are softmax's passes around its exponentials
//!   (`exp_row`): with the exp in 256-bit code, they took about 0.4 of
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

/// The IEEE maximum of `src[0..n]` (-inf for no elements). Called by
/// generated code only where `exp_row::available()`.
pub(crate) extern "C" fn kiln_max_row(src: *const f32, n: i64) -> f32 {
    // SAFETY: generated code calls this only where the CPU has AVX2 and FMA,
    // with `n` elements at `src` to read.
    unsafe { max_row(src, n.max(0) as usize) }
}

/// The sum of `src[0..n]` (+0 for no elements). Called by generated code
/// only where `exp_row::available()`.
pub(crate) extern "C" fn kiln_sum_row(src: *const f32, n: i64) -> f32 {
    // SAFETY: as `kiln_max_row`.
    unsafe { sum_row(src, n.max(0) as usize) }
}

/// `dst[j] = src[j] * c` for `j < n`; `src` may be `dst`. Called by
/// generated code only where `exp_row::available()`, with a row it owns.
pub(crate) extern "C" fn kiln_scale_row(src: *const f32, c: f32, dst: *mut f32, n: i64) {
    // SAFETY: as `kiln_max_row`, and the `n` elements at `dst` are only
    // this call's to write meanwhile.
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
fn maximum(x: f32, y: f32) -> f32 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::exp_row::available;

    /// Rows of negatives with zeros and NaNs placed in every lane, the
    /// unrolled part, the single vectors and the overlapping last one.
    #[test]
    fn max_row_is_the_interpreters_max() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX2 or FMA");
            return;
        }
        for n in [0, 1, 5, 8, 9, 31, 32, 33, 47, 64, 100, 1000, 1027] {
            let base: Vec<f32> = (0..n).map(|i| -1.0 - (i % 13) as f32).collect();
            let mut rows = vec![base.clone()];
            for at in (0..n).step_by(3) {
                for marks in [
                    &[(at, f32::NAN)][..],
                    &[(at, 0.0), (n - 1 - at, -0.0)],
                    &[(at, -0.0), (n - 1 - at, 0.0)],
                    &[(at, -0.0)],
                    &[(at, f32::INFINITY)],
                    &[(at, 5.0), (n - 1 - at, f32::NEG_INFINITY)],
                ] {
                    let mut row = base.clone();
                    for &(i, x) in marks {
                        row[i] = x;
                    }
                    rows.push(row);
                }
            }
            rows.push(vec![f32::NEG_INFINITY; n]);
            for row in rows {
                let want = row.iter().fold(f32::NEG_INFINITY, |m, &x| maximum(m, x));
                let got = kiln_max_row(row.as_ptr(), n as i64);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "length {n}: {got:e} for {want:e} in {row:?}"
                );
            }
        }
    }

    /// Every length through the unrolled part, the single vectors and the
    /// masked rest, against a sum in f64; a NaN or an infinity in any
    /// place comes through.
    #[test]
    fn sum_row_sums_every_element_and_no_other() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX2 or FMA");
            return;
        }
        for n in [0, 1, 5, 7, 8, 9, 31, 32, 33, 47, 64, 100, 1000, 1027] {
            // NaN guards either side, which a read past the row would catch.
            let mut buf = vec![f32::NAN; n + 16];
            for (i, x) in buf[8..8 + n].iter_mut().enumerate() {
                *x = (i % 17) as f32 * 0.37 - 2.0;
            }
            let row = &buf[8..8 + n];
            let want: f64 = row.iter().map(|&x| f64::from(x)).sum();
            let got = kiln_sum_row(row.as_ptr(), n as i64);
            let tolerance = 1e-6 * row.iter().map(|x| f64::from(x.abs())).sum::<f64>();
            assert!(
                (f64::from(got) - want).abs() <= tolerance,
                "length {n}: {got} for {want}"
            );
            for at in (0..n).step_by(5) {
                for (mark, want) in [(f32::NAN, f32::NAN), (f32::INFINITY, f32::INFINITY)] {
                    let mut marked = row.to_vec();
                    marked[at] = mark;
                    let got = kiln_sum_row(marked.as_ptr(), n as i64);
                    assert!(
                        got == want || (got.is_nan() && want.is_nan()),
                        "length {n}, {mark} at {at}: {got}"
                    );
                }
            }
        }
    }

    #[test]
    fn scale_row_scales_every_element_and_no_other() {
        if !available() {
            eprintln!("skipped: this CPU lacks AVX2 or FMA");
            return;
        }
        for n in [0, 1, 7, 8, 9, 31, 32, 33, 1000, 1027] {
            let src: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * 0.37 - 2.0).collect();
            let c = 1.0 / 3.0f32;
            // Apart, with guards either side.
            let mut dst = vec![7.0f32; n + 2];
            kiln_scale_row(src.as_ptr(), c, dst[1..].as_mut_ptr(), n as i64);
            assert_eq!((dst[0], dst[n + 1]), (7.0, 7.0), "length {n}: guards");
            for (j, (&x, &y)) in src.iter().zip(&dst[1..=n]).enumerate() {
                assert_eq!(y.to_bits(), (x * c).to_bits(), "length {n}, element {j}");
            }
            // In place.
            let mut row = src.clone();
            let p = row.as_mut_ptr();
            kiln_scale_row(p, c, p, n as i64);
            assert_eq!(row, dst[1..=n], "length {n}: in place");
        }
    }
}
