//! The AVX-512 micro-kernel: a 12 x 32 tile of C in 24 of the 32 zmm
//! registers for a whole depth block, two FMAs per broadcast element of A,
//! ragged tiles written through lane masks. The `gemm` crate's AVX-512
//! kernels need a nightly compiler; on stable it runs 256-bit kernels, half
//! the width of the FMA units where AVX-512 is there.
//!
//! `unsafe` here is the vector loads and stores and the call of the
//! AVX-512 code.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512, _CMP_LE_OQ, _MM_HINT_T0, _mm_prefetch, _mm512_add_ps, _mm512_cmp_ps_mask,
    _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps,
    _mm512_maskz_mov_ps, _mm512_min_ps, _mm512_set1_ps, _mm512_setzero_ps,
};

use super::RawFused;
use super::driver::{Kernel, Tile};
use super::panel::PanelA;
use super::tuning::{self, Tuning};

/// Rows of a tile: the broadcast elements of A.
pub(super) const MR: usize = 12;
/// Columns of a tile: two vectors of 16.
pub(super) const NR: usize = 32;
/// How many steps along k ahead of use the microkernel prefetches.
const PREFETCH: usize = 8;

/// The AVX-512 core's micro-kernel and blocking.
pub(super) struct Avx512;

impl Kernel<MR, NR> for Avx512 {
    const TUNING: Tuning = tuning::AVX512;
    /// Kernels of 4, 8 and 12 rows.
    const ROW_UNIT: usize = 4;
    const HALF_TILES: bool = false;

    unsafe fn tile<A: PanelA<MR>>(a: A, b: &[f32], b_stride: usize, c: *mut f32, tile: Tile) {
        // A tile of at most 16 columns (a ragged last panel) takes one
        // vector's FMAs: with two, 250x256x784 (24 panels and a half, 12
        // and 13 to two threads) took longer (`benches/RESULTS-cpu.md`).
        // SAFETY (both): the contract of this function.
        if tile.cols <= NR / 2 {
            unsafe { of_height::<1, A>(a, b, b_stride, c, tile) }
        } else {
            unsafe { of_height::<2, A>(a, b, b_stride, c, tile) }
        }
    }
}

/// The micro-kernel for a tile of `V` vectors of columns, of its height
/// and with its epilogue or none.
///
/// # Safety
/// As `Kernel::tile`, and `tile.cols <= 16 * V`.
unsafe fn of_height<const V: usize, A: PanelA<MR>>(
    a: A,
    b: &[f32],
    b_stride: usize,
    c: *mut f32,
    tile: Tile,
) {
    // (The epilogue is compiled in only where there is one, as in the
    // AVX2 core.)
    let kernel = match (tile.rows, tile.epilogue.is_none()) {
        (..=4, true) => microkernel::<4, V, false, A>,
        (5..=8, true) => microkernel::<8, V, false, A>,
        (_, true) => microkernel::<MR, V, false, A>,
        (..=4, false) => microkernel::<4, V, true, A>,
        (5..=8, false) => microkernel::<8, V, true, A>,
        (_, false) => microkernel::<MR, V, true, A>,
    };
    // SAFETY: AVX-512 is there, and the tile is this caller's (the
    // contract of this function).
    unsafe { kernel(a, b, b_stride, c, tile) }
}

/// The top `R` rows (4, 8 or `MR`) and first `16 * V` columns (`V` 1 or 2)
/// of an `MR x NR` tile of C from rows of A and `kc` rows of `NR` elements
/// of B, `b_stride` apart, through the tile's epilogue if `EPILOGUE`; only
/// `tile.rows x tile.cols` of it is written, from `c` on.
///
/// # Safety
/// The tile's elements of `c` are valid for reads and writes that no one
/// else makes meanwhile, and `tile.cols <= 16 * V`.
#[target_feature(enable = "avx512f")]
unsafe fn microkernel<const R: usize, const V: usize, const EPILOGUE: bool, A: PanelA<MR>>(
    a: A,
    b: &[f32],
    b_stride: usize,
    c: *mut f32,
    tile: Tile,
) {
    let depth = a.depth();
    assert!(
        depth == 0 || (depth - 1) * b_stride + NR <= b.len(),
        "B holds {depth} rows of {NR}, {b_stride} apart",
    );
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for l in 0..depth {
        let row = b.as_ptr().wrapping_add(l * b_stride);
        // Prefetches only hint: an address past the panels' ends is harmless.
        let ahead = row.wrapping_add(PREFETCH * b_stride).cast::<i8>();
        for v in 0..V {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * v));
        }
        a.prefetch(l + PREFETCH);
        // SAFETY: row `l` of B, 32 f32 (two vectors, of which `V` are
        // read), is inside `b` (the assert above).
        let bv: [__m512; V] = std::array::from_fn(|v| unsafe { _mm512_loadu_ps(row.add(16 * v)) });
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: `i < R <= MR` and `l < depth`.
            let x = _mm512_set1_ps(unsafe { a.at(i, l) });
            for (acc, &b) in row.iter_mut().zip(&bv) {
                *acc = _mm512_fmadd_ps(x, b, *acc);
            }
        }
    }
    let masks = [
        lane_mask(tile.cols.min(16)),
        lane_mask(tile.cols.saturating_sub(16)),
    ];
    // The tile's bias per column, its lanes loaded once for all its rows.
    let epilogue = tile.epilogue;
    let bias = if EPILOGUE && !epilogue.bias.is_null() && !epilogue.rows {
        // SAFETY: the lanes the masks select are the tile's columns, which
        // are columns of the bias (a masked-off half reads nothing).
        unsafe {
            Some([
                _mm512_maskz_loadu_ps(masks[0], epilogue.bias),
                _mm512_maskz_loadu_ps(masks[1], epilogue.bias.wrapping_add(16)),
            ])
        }
    } else {
        None
    };
    for (i, row) in acc.iter().take(tile.rows).enumerate() {
        // SAFETY: row `i` of the tile, `tile.cols` elements from `c`'s
        // `tile.offset + i * tile.stride`-th, is the caller's (the contract
        // of this function), and a row of any bias per row.
        let out = unsafe {
            std::slice::from_raw_parts_mut(c.add(tile.offset + i * tile.stride), tile.cols)
        };
        // The row's bias, where there is one per row, in every lane.
        let bias = match unsafe { epilogue.row_bias(i) } {
            Some(b) if EPILOGUE => Some([_mm512_set1_ps(b); 2]),
            _ => bias,
        };
        for (half, (&v, &mask)) in row.iter().zip(&masks).enumerate() {
            if mask == 0 {
                continue;
            }
            let lanes = out[16 * half..].as_mut_ptr();
            // SAFETY: `mask` selects the lanes of `out[16 * half..]` that
            // exist (`tile.cols` of the row), so every access is in `out`.
            unsafe {
                let v = if tile.accumulate {
                    let old = _mm512_maskz_loadu_ps(mask, lanes);
                    _mm512_add_ps(old, v)
                } else {
                    v
                };
                let v = if EPILOGUE {
                    apply(v, bias.map(|b| b[half]), epilogue)
                } else {
                    v
                };
                _mm512_mask_storeu_ps(lanes, mask, v);
            }
        }
    }
}

/// `v` plus `bias` where there is one, then `epilogue`'s ReLU and cap:
/// lane by lane as `RawFused::apply` (the same bits).
#[target_feature(enable = "avx512f")]
#[inline]
fn apply(v: __m512, bias: Option<__m512>, epilogue: RawFused) -> __m512 {
    let mut v = match bias {
        Some(bias) => _mm512_add_ps(v, bias),
        None => v,
    };
    if epilogue.relu {
        // Lanes not above zero (NaN is not) become +0.
        let not_above = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, _mm512_setzero_ps());
        v = _mm512_maskz_mov_ps(!not_above, v);
    }
    match epilogue.cap {
        // `cap < v ? cap : v`: a NaN lane stays.
        Some(cap) => _mm512_min_ps(_mm512_set1_ps(cap), v),
        None => v,
    }
}

/// The first `lanes` (at most 16) bits set.
fn lane_mask(lanes: usize) -> u16 {
    ((1u32 << lanes) - 1) as u16
}
