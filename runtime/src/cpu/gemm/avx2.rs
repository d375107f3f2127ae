//! The AVX2+FMA micro-kernel: a 6 x 16 tile of C in 12 of the 16 ymm
//! registers for a whole depth block, two more for a row of B and one for
//! the broadcast element of A; two FMAs per element of A, 12 independent
//! accumulators to cover the FMA latency on two pipes. Ragged tiles go
//! through a row on the stack (AVX2's masked stores are slow on AMD).
//!
//! `unsafe` here is the vector loads and stores and the call of the AVX2
//! code.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256, _CMP_LE_OQ, _MM_HINT_T0, _mm_prefetch, _mm256_add_ps, _mm256_andnot_ps, _mm256_cmp_ps,
    _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
};

use super::driver::{Kernel, Tile};
use super::panel::PanelA;

/// Rows of a tile: the broadcast elements of A.
pub(super) const MR: usize = 6;
/// Columns of a tile: two vectors of 8, one cache line of a packed panel.
pub(super) const NR: usize = 16;
/// How many steps along k ahead of use the micro-kernel prefetches B.
const PREFETCH: usize = 8;

/// The AVX2 core's micro-kernel and blocking.
pub(super) struct Avx2;

impl Kernel<MR, NR> for Avx2 {
    /// 256 took 1.02-1.04x as long at 1024³ and 2048³ on two Zen 3 cores;
    /// 768 the same as 512.
    const KC: usize = 512;
    /// 96 x 512 elements, 192 KiB of Zen 3's 512 KiB L2 beside a group of
    /// B's panels (256 KiB); 48 and 144 rows measured the same.
    const MC: usize = 16 * MR;
    /// 4 and 16 measured the same; 1 (a panel of B in L1 over all rows of
    /// A, A from L2) slower by 1-2%.
    const NC_PANELS: usize = 8;
    /// B packed always: read in place, 64x784x256 took 1.1x as long on
    /// one Zen 3 core.
    const IN_PLACE_ROWS: usize = 0;
    /// Kernels of 2, 4 and 6 rows.
    const ROW_UNIT: usize = 2;

    unsafe fn tile<A: PanelA<MR>>(a: A, b: &[f32], b_stride: usize, c: *mut f32, tile: Tile) {
        // (The epilogue is compiled in only where there is one: checked on
        // every store, it cost the plain products 1-1.5%.)
        let kernel = match (tile.rows, tile.epilogue.is_none()) {
            (..=2, true) => microkernel::<2, false, A>,
            (3..=4, true) => microkernel::<4, false, A>,
            (_, true) => microkernel::<MR, false, A>,
            (..=2, false) => microkernel::<2, true, A>,
            (3..=4, false) => microkernel::<4, true, A>,
            (_, false) => microkernel::<MR, true, A>,
        };
        // SAFETY: AVX2 and FMA are there, and the tile is this caller's (the
        // contract of this function).
        unsafe { kernel(a, b, b_stride, c, tile) }
    }
}

/// The top `R` rows (2, 4 or `MR`) of an `MR x NR` tile of C from rows of A
/// and `kc` rows of `NR` elements of B, `b_stride` apart, through the tile's
/// epilogue if `EPILOGUE`; only `tile.rows x tile.cols` of it is written,
/// from `c` on.
///
/// # Safety
/// The tile's elements of `c` are valid for reads and writes that no one
/// else makes meanwhile.
#[target_feature(enable = "avx2,fma")]
unsafe fn microkernel<const R: usize, const EPILOGUE: bool, A: PanelA<MR>>(
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
    // The tile of C is read (or written) only after the depth loop: its
    // lines are asked for now, so that they are in L1 by then.
    for i in 0..tile.rows.min(R) {
        let start = c.wrapping_add(tile.offset + i * tile.stride);
        _mm_prefetch::<_MM_HINT_T0>(start.cast::<i8>());
        _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(NR - 1).cast::<i8>());
    }
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    // (Unrolled by four, the loop had its loads hoisted over the steps and
    // its accumulators spilled to the stack: 0.6 of the speed.)
    for l in 0..depth {
        let row = b.as_ptr().wrapping_add(l * b_stride);
        // Prefetches only hint: an address past the panels' ends is harmless.
        let ahead = row.wrapping_add(PREFETCH * b_stride).cast::<i8>();
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        // SAFETY: row `l` of B, 16 f32 (two vectors), is inside `b` (the
        // assert above).
        let (b0, b1) = unsafe { (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8))) };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: `i < R <= MR` and `l < depth`.
            let x = _mm256_set1_ps(unsafe { a.at(i, l) });
            row[0] = _mm256_fmadd_ps(x, b0, row[0]);
            row[1] = _mm256_fmadd_ps(x, b1, row[1]);
        }
    }
    // A full tile's bias, loaded once for all its rows.
    let epilogue = tile.epilogue;
    let bias = if EPILOGUE && !epilogue.bias.is_null() && tile.cols == NR {
        // SAFETY: the tile's NR columns are columns of the bias.
        unsafe {
            Some([
                _mm256_loadu_ps(epilogue.bias),
                _mm256_loadu_ps(epilogue.bias.add(8)),
            ])
        }
    } else {
        None
    };
    for (i, row) in acc.iter().take(tile.rows).enumerate() {
        // SAFETY: row `i` of the tile, `tile.cols` elements from `c`'s
        // `tile.offset + i * tile.stride`-th, is the caller's (the contract
        // of this function).
        let out = unsafe {
            std::slice::from_raw_parts_mut(c.add(tile.offset + i * tile.stride), tile.cols)
        };
        if let Ok(out) = <&mut [f32; NR]>::try_from(&mut *out) {
            for (half, &v) in row.iter().enumerate() {
                let lanes = out[8 * half..].as_mut_ptr();
                // SAFETY: the row has all NR columns: both halves' 8 lanes
                // are in `out`.
                unsafe {
                    let v = if tile.accumulate {
                        _mm256_add_ps(_mm256_loadu_ps(lanes), v)
                    } else {
                        v
                    };
                    let v = if EPILOGUE {
                        apply(v, bias.map(|b| b[half]), epilogue.relu)
                    } else {
                        v
                    };
                    _mm256_storeu_ps(lanes, v);
                }
            }
        } else {
            let mut lanes = [0.0f32; NR];
            // SAFETY: `lanes` holds both halves' 8 lanes.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), row[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), row[1]);
            }
            for (j, (x, &v)) in out.iter_mut().zip(&lanes).enumerate() {
                let v = if tile.accumulate { *x + v } else { v };
                // SAFETY: column `j` of the tile is a column of the product.
                *x = if EPILOGUE {
                    unsafe { epilogue.apply(v, j) }
                } else {
                    v
                };
            }
        }
    }
}

/// `v` plus `bias` where there is one, then ReLU if `relu`: lane by lane
/// as `Epilogue::apply` (the same bits).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn apply(v: __m256, bias: Option<__m256>, relu: bool) -> __m256 {
    let v = match bias {
        Some(bias) => _mm256_add_ps(v, bias),
        None => v,
    };
    if !relu {
        return v;
    }
    // Lanes not above zero (NaN is not) become +0.
    let not_above = _mm256_cmp_ps::<_CMP_LE_OQ>(v, _mm256_setzero_ps());
    _mm256_andnot_ps(not_above, v)
}
