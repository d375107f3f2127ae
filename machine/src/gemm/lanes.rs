//! Vectors of f32 lanes, one type per ISA, for the kernels written once
//! for every ISA (`gemv`, `packed`), and the elements they load as such.
//!
//! `unsafe` here is the intrinsics, which run only where the CPU has the
//! type's features (`Lanes`'s contract).

#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{Avx2, Avx512};

/// A vector of f32 lanes: what the few-row products need of an ISA.
///
/// # Safety
/// Every method runs only where the CPU has the implementor's features,
/// inside a function that enables them; `load` reads `LANES` elements,
/// which lie inside a live buffer, and `store` writes `LANES` elements of
/// a buffer the caller may write.
pub(super) trait Lanes {
    type V: Copy;
    const LANES: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    /// `LANES` bf16 values (their bits) from `p`, widened.
    unsafe fn load_bf16(p: *const u16) -> Self::V;
    /// `a * b + c`.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// The lanes added.
    unsafe fn sum(v: Self::V) -> f32;
    /// `x` in every lane.
    unsafe fn splat(x: f32) -> Self::V;
    /// Writes the lanes to `LANES` elements from `p`.
    unsafe fn store(p: *mut f32, v: Self::V);
}

/// The elements a few-row product reads from `b`, loaded as f32 lanes:
/// f32, and bf16 as its bits, widened as they are loaded.
pub(super) trait Load: super::Element {
    /// `L::LANES` elements from `p` as f32 lanes.
    ///
    /// # Safety
    /// As `Lanes::load`.
    unsafe fn lanes<L: Lanes>(p: *const Self) -> L::V;
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(p: *const f32) -> L::V {
        // SAFETY: the caller's contract.
        unsafe { L::load(p) }
    }
}

impl Load for u16 {
    #[inline(always)]
    unsafe fn lanes<L: Lanes>(p: *const u16) -> L::V {
        // SAFETY: the caller's contract.
        unsafe { L::load_bf16(p) }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m256, __m512, _mm_add_ps, _mm_cvtss_f32, _mm_loadu_si128, _mm_movehl_ps, _mm_shuffle_ps,
        _mm256_add_ps, _mm256_castps256_ps128, _mm256_castsi256_ps, _mm256_cvtepu16_epi32,
        _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_loadu_si256,
        _mm256_set1_ps, _mm256_setzero_ps, _mm256_slli_epi32, _mm256_storeu_ps, _mm512_add_ps,
        _mm512_castsi512_ps, _mm512_cvtepu16_epi32, _mm512_fmadd_ps, _mm512_loadu_ps,
        _mm512_reduce_add_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_slli_epi32,
        _mm512_storeu_ps,
    };

    use super::Lanes;

    /// 8 lanes (AVX2 and FMA).
    pub(in crate::gemm) struct Avx2;

    /// 16 lanes (AVX-512).
    pub(in crate::gemm) struct Avx512;

    // SAFETY (every intrinsic below): the caller runs on a CPU with the
    // type's features, within a function that enables them (`Lanes`'s
    // contract), and loads and stores elements it holds.
    impl Lanes for Avx2 {
        type V = __m256;
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            unsafe { _mm256_loadu_ps(p) }
        }
        /// Each 16 bits zero-extended into a 32-bit lane, then moved to
        /// its top half.
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> __m256 {
            unsafe {
                let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
            }
        }
        #[inline(always)]
        unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sum(v: __m256) -> f32 {
            unsafe {
                let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
                _mm_cvtss_f32(_mm_add_ps(v, _mm_shuffle_ps::<1>(v, v)))
            }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            unsafe { _mm256_storeu_ps(p, v) }
        }
    }

    impl Lanes for Avx512 {
        type V = __m512;
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> __m512 {
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            unsafe { _mm512_loadu_ps(p) }
        }
        /// As `Avx2`'s, 16 at a time.
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> __m512 {
            unsafe {
                let bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits))
            }
        }
        #[inline(always)]
        unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sum(v: __m512) -> f32 {
            unsafe { _mm512_reduce_add_ps(v) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            unsafe { _mm512_storeu_ps(p, v) }
        }
    }
}
