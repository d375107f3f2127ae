//! A row of f32 rounded to bf16 in 256-bit AVX2 vectors, for generated
//! code to call: Cranelift emits 128-bit vectors only, and has no
//! instruction that narrows lanes to 16 bits, so its epilogues that round
//! a product to bf16 took about a tenth of the product's time
//! (`benches/RESULTS-cpu.md`). The rounding is the generated code's
//! (`narrow_half`): to nearest, ties to even, overflow to infinity, and a
//! NaN stays a NaN of its sign, quiet, its payload's top bits kept.
//!
//! `unsafe` here is the vector loads and stores and the call of the AVX2
//! code.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256i, _CMP_UNORD_Q, _mm256_add_epi32, _mm256_and_si256, _mm256_blendv_epi8,
    _mm256_castps_si256, _mm256_cmp_ps, _mm256_loadu_ps, _mm256_or_si256, _mm256_packus_epi32,
    _mm256_permute4x64_epi64, _mm256_set1_epi32, _mm256_srli_epi32, _mm256_storeu_si256,
};

/// `dst[j]` = the bits of the bf16 nearest `src[j]`, for `j < n`.
///
/// # Safety
/// The CPU has AVX2 and FMA (`super::available`); `n` elements at `src` are
/// readable, and the `n` at `dst` this caller's to write.
pub unsafe extern "C" fn kiln_bf16_row(src: *const f32, dst: *mut u16, n: i64) {
    // SAFETY: the contract of this function.
    unsafe { bf16_row(src, dst, n.max(0) as usize) }
}

/// The bits of the bf16 nearest `x`: add half a unit of the last kept
/// place, less one unless the kept part is odd (ties to even), and keep the
/// top half.
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let high = bits >> 16;
    if x.is_nan() {
        return (high | 0x40) as u16;
    }
    (bits.wrapping_add(0x7fff + (high & 1)) >> 16) as u16
}

/// `kiln_bf16_row`: sixteen elements at a time, two vectors rounded and
/// packed into one, then the last few one by one.
///
/// # Safety
/// The CPU has AVX2; `src..src + n` is readable and `dst..dst + n` this
/// caller's to write.
#[target_feature(enable = "avx2")]
unsafe fn bf16_row(src: *const f32, dst: *mut u16, n: usize) {
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`: both vectors lie inside the row.
        let (lo, hi) = unsafe { (rounded(src.add(i)), rounded(src.add(i + 8))) };
        // Each lane's 16 bits are its low half, so packing with unsigned
        // saturation keeps them. It packs within 128-bit halves: the
        // permute puts the four quarters back in order.
        let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(lo, hi));
        // SAFETY: `dst + i..dst + i + 16` is inside the row.
        unsafe { _mm256_storeu_si256(dst.add(i).cast(), packed) };
        i += 16;
    }
    for j in i..n {
        // SAFETY: `j < n`.
        unsafe { *dst.add(j) = bf16_bits(*src.add(j)) };
    }
}

/// `bf16_bits` of the eight f32 at `p`, each in the low half of its lane.
///
/// # Safety
/// The CPU has AVX2; the eight are readable.
#[target_feature(enable = "avx2")]
unsafe fn rounded(p: *const f32) -> __m256i {
    // SAFETY: the caller's contract.
    let x = unsafe { _mm256_loadu_ps(p) };
    let bits = _mm256_castps_si256(x);
    let high = _mm256_srli_epi32::<16>(bits);
    let odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
    let biased = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), odd);
    let rounded = _mm256_srli_epi32::<16>(biased);
    let quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
    _mm256_blendv_epi8(rounded, quiet, nan)
}
