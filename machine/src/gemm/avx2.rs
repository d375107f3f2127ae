//! The AVX2+FMA micro-kernel: a 6 x 16 tile of C in 12 of the 16 ymm
//! registers for a whole depth block, two more for a row of B and one for
//! the broadcast element of A; two FMAs per element of A, 12 independent
//! accumulators to cover the FMA latency on two pipes. The depth loop of a
//! full tile is written in assembly (`full_tile`), four steps to a pass.
//! Ragged tiles go through a row on the stack (AVX2's masked stores are
//! slow on AMD).
//!
//! `unsafe` here is the vector loads and stores, the assembly loop, and the
//! call of the AVX2 code.

#![allow(unsafe_code)]

use std::arch::asm;
use std::arch::x86_64::{
    __m256, _CMP_LE_OQ, _MM_HINT_T0, _mm_prefetch, _mm256_add_ps, _mm256_andnot_ps, _mm256_cmp_ps,
    _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_min_ps, _mm256_set1_ps, _mm256_setzero_ps,
    _mm256_storeu_ps,
};

use super::RawFused;
use super::driver::{Kernel, Tile};
use super::panel::{PanelA, Rows};
use super::tuning::{self, Tuning};

/// Rows of a tile: the broadcast elements of A.
pub(super) const MR: usize = 6;
/// Columns of a tile: two vectors of 8, one cache line of a packed panel.
pub(super) const NR: usize = 16;
/// How many steps along k ahead of use the micro-kernel prefetches B.
const PREFETCH: usize = 8;

/// The AVX2 core's micro-kernel and blocking.
pub(super) struct Avx2;

impl Kernel<MR, NR> for Avx2 {
    const TUNING: Tuning = tuning::AVX2;
    /// Kernels of 2, 4 and 6 rows.
    const ROW_UNIT: usize = 2;
    /// `microkernel`'s `HALF`.
    const HALF_TILES: bool = true;

    unsafe fn tile<A: PanelA<MR>>(a: A, b: &[f32], b_stride: usize, c: *mut f32, tile: Tile) {
        // (The epilogue is compiled in only where there is one: checked on
        // every store, it slowed the plain products; `benches/RESULTS-cpu.md`.)
        let kernel = match (tile.epilogue.is_none(), tile.cols <= NR / 2) {
            (true, false) => of_height::<false, false, A>(tile.rows),
            (true, true) => of_height::<false, true, A>(tile.rows),
            (false, false) => of_height::<true, false, A>(tile.rows),
            (false, true) => of_height::<true, true, A>(tile.rows),
        };
        // SAFETY: AVX2 and FMA are there, and the tile is this caller's (the
        // contract of this function).
        unsafe { kernel(a, b, b_stride, c, tile) }
    }
}

/// A tile's micro-kernel.
type MicroKernel<A> = unsafe fn(A, &[f32], usize, *mut f32, Tile);

/// The micro-kernel for a tile of `rows` rows: the variant of 2, 4 or `MR`
/// rows that covers them.
fn of_height<const EPILOGUE: bool, const HALF: bool, A: PanelA<MR>>(rows: usize) -> MicroKernel<A> {
    match rows {
        ..=2 => microkernel::<2, EPILOGUE, HALF, A>,
        3..=4 => microkernel::<4, EPILOGUE, HALF, A>,
        _ => microkernel::<MR, EPILOGUE, HALF, A>,
    }
}

/// The top `R` rows (2, 4 or `MR`) of an `MR x NR` tile of C from rows of A
/// and `a.depth()` rows of `NR` elements of B, packed (`b_stride` is `NR`:
/// this core reads no B in place), through the tile's epilogue if
/// `EPILOGUE`; only `tile.rows x tile.cols` of it is written, from `c` on.
/// With `HALF` (a tile of at most `NR / 2` columns: the last of a product
/// whose columns are not a whole number of panels, 49 of a 7 x 7
/// convolution's) only the left half is computed, one FMA per element of
/// A, where the whole tile took twice the steps for columns it drops.
///
/// # Safety
/// The tile's elements of `c` are valid for reads and writes that no one
/// else makes meanwhile.
#[target_feature(enable = "avx2,fma")]
unsafe fn microkernel<const R: usize, const EPILOGUE: bool, const HALF: bool, A: PanelA<MR>>(
    a: A,
    b: &[f32],
    b_stride: usize,
    c: *mut f32,
    tile: Tile,
) {
    let depth = a.depth();
    assert!(
        b_stride == NR && depth * NR <= b.len(),
        "B holds {depth} rows of {NR}, packed",
    );
    // The tile of C is read (or written) only after the depth loop: its
    // lines are asked for now, so that they are in L1 by then.
    for i in 0..tile.rows.min(R) {
        let start = c.wrapping_add(tile.offset + i * tile.stride);
        _mm_prefetch::<_MM_HINT_T0>(start.cast::<i8>());
        _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(NR - 1).cast::<i8>());
    }
    let acc: [[__m256; 2]; R] = if R == MR && !HALF {
        // SAFETY: AVX2 and FMA are there (the contract of this function);
        // `a` holds `depth` steps, and `b` `depth` rows of NR (the assert
        // above).
        let sums = unsafe { full_tile(a.rows(), b.as_ptr(), depth) };
        std::array::from_fn(|i| sums[i])
    } else {
        // The tiles of 2 and 4 rows, a block's last, and the half tiles,
        // a product's last column, keep the compiled loop: a small part of
        // any product's steps.
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for l in 0..depth {
            let row = b.as_ptr().wrapping_add(l * NR);
            // Prefetches only hint: an address past the panels' ends is
            // harmless.
            let ahead = row.wrapping_add(PREFETCH * NR).cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            // SAFETY: row `l` of B, 16 f32 (two vectors), is inside `b` (the
            // assert above).
            let (b0, b1) = unsafe { (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8))) };
            for (i, row) in acc.iter_mut().enumerate() {
                // SAFETY: `i < R <= MR` and `l < depth`.
                let x = _mm256_set1_ps(unsafe { a.at(i, l) });
                row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                if !HALF {
                    row[1] = _mm256_fmadd_ps(x, b1, row[1]);
                }
            }
        }
        acc
    };
    // A full tile's bias per column, loaded once for all its rows.
    let epilogue = tile.epilogue;
    let bias = if EPILOGUE && !epilogue.bias.is_null() && !epilogue.rows && tile.cols == NR {
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
    // A full tile in straight-line code: through the loop below, its
    // checks made row by row, a tile's stores took tens of cycles more, and
    // products with bias and ReLU 256 deep took longer
    // (`benches/RESULTS-cpu.md`).
    if tile.rows == R && tile.cols == NR {
        for (i, row) in acc.iter().enumerate() {
            // SAFETY: the tile is full: its row `i`, NR elements from here,
            // is the caller's (the contract of this function), and a row of
            // any bias per row.
            unsafe {
                let bias = row_bias::<EPILOGUE>(epilogue, i).or(bias);
                whole_row::<EPILOGUE>(c.add(tile.offset + i * tile.stride), row, tile, bias)
            };
        }
        return;
    }
    for (i, row) in acc.iter().take(tile.rows).enumerate() {
        // SAFETY: row `i` of the tile, `tile.cols` elements from `c`'s
        // `tile.offset + i * tile.stride`-th, is the caller's (the contract
        // of this function).
        let out = unsafe {
            std::slice::from_raw_parts_mut(c.add(tile.offset + i * tile.stride), tile.cols)
        };
        if out.len() == NR {
            // SAFETY: `out` holds the row's NR elements; `i` is a row of any
            // bias per row.
            unsafe {
                let bias = row_bias::<EPILOGUE>(epilogue, i).or(bias);
                whole_row::<EPILOGUE>(out.as_mut_ptr(), row, tile, bias)
            };
        } else {
            let mut lanes = [0.0f32; NR];
            // SAFETY: `lanes` holds both halves' 8 lanes.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), row[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), row[1]);
            }
            for (j, (x, &v)) in out.iter_mut().zip(&lanes).enumerate() {
                let v = if tile.accumulate { *x + v } else { v };
                // SAFETY: row `i` and column `j` of the tile are a row and
                // a column of the product.
                *x = if EPILOGUE {
                    unsafe { epilogue.apply(v, i, j) }
                } else {
                    v
                };
            }
        }
    }
}

/// One step `u` (0 to 3) of a pass of `full_tile`'s loop: B's row of the
/// step prefetched `PREFETCH` rows ahead and loaded, then each of A's six
/// elements of the step (at the address `$a!(u, i)`) broadcast and
/// multiplied into its row's two accumulators.
#[rustfmt::skip]
macro_rules! step {
    ($a:ident, $u:literal) => {
        concat!(
            "prefetcht0 byte ptr [{b} + {ahead} + {row}*", $u, "]\n",
            "vmovups {b0}, ymmword ptr [{b} + {row}*", $u, "]\n",
            "vmovups {b1}, ymmword ptr [{b} + {row}*", $u, " + 32]\n",
            row_of_step!($a, $u, 0),
            row_of_step!($a, $u, 1),
            row_of_step!($a, $u, 2),
            row_of_step!($a, $u, 3),
            row_of_step!($a, $u, 4),
            row_of_step!($a, $u, 5),
        )
    };
}

/// Row `i`'s part of step `u`: its element of A broadcast, two FMAs.
#[rustfmt::skip]
macro_rules! row_of_step {
    ($a:ident, $u:literal, $i:literal) => {
        concat!(
            "vbroadcastss {x}, dword ptr ", $a!($u, $i), "\n",
            "vfmadd231ps {c", $i, "0}, {x}, {b0}\n",
            "vfmadd231ps {c", $i, "1}, {x}, {b1}\n",
        )
    };
}

/// Packed A: row `i`'s element at step `u` of the pass from `{a}`.
macro_rules! packed {
    ($u:literal, $i:literal) => {
        concat!("[{a} + {a_step}*", $u, " + 4*", $i, "]")
    };
}

/// A in place: row `i`'s element `{l} + u`.
macro_rules! in_place {
    ($u:literal, $i:literal) => {
        concat!("[{a", $i, "} + 4*{l} + 4*", $u, "]")
    };
}

/// The loop of `full_tile` over A's rows at `$a` (`packed` or `in_place`),
/// advanced by `$next4` after four steps and by `$next1` after one, with
/// their operands.
macro_rules! full_tile_loop {
    ($a:ident, $next4:literal, $next1:literal, $c:expr, $b:expr, $depth:expr, $($operands:tt)*) => {{
        let [[c00, c01], [c10, c11], [c20, c21], [c30, c31], [c40, c41], [c50, c51]] = $c;
        asm!(
            "test {quads}, {quads}",
            "jz 3f",
            "2:",
            step!($a, 0),
            step!($a, 1),
            step!($a, 2),
            step!($a, 3),
            $next4,
            "add {b}, 4*{row}",
            "dec {quads}",
            "jnz 2b",
            "3:",
            "test {rest}, {rest}",
            "jz 5f",
            "4:",
            step!($a, 0),
            $next1,
            "add {b}, {row}",
            "dec {rest}",
            "jnz 4b",
            "5:",
            $($operands)*
            b = inout(reg) $b => _,
            quads = inout(reg) $depth / 4 => _,
            rest = inout(reg) $depth % 4 => _,
            b0 = out(ymm_reg) _,
            b1 = out(ymm_reg) _,
            x = out(ymm_reg) _,
            c00 = inout(ymm_reg) *c00,
            c01 = inout(ymm_reg) *c01,
            c10 = inout(ymm_reg) *c10,
            c11 = inout(ymm_reg) *c11,
            c20 = inout(ymm_reg) *c20,
            c21 = inout(ymm_reg) *c21,
            c30 = inout(ymm_reg) *c30,
            c31 = inout(ymm_reg) *c31,
            c40 = inout(ymm_reg) *c40,
            c41 = inout(ymm_reg) *c41,
            c50 = inout(ymm_reg) *c50,
            c51 = inout(ymm_reg) *c51,
            row = const NR * 4,
            ahead = const PREFETCH * NR * 4,
            options(nostack, readonly),
        )
    }};
}

/// The sums of a full `MR x NR` tile over `depth` steps of A's rows `a`
/// and of B's rows from `b`, packed (`NR` apart).
///
/// In assembly, so that a step costs fewer instructions: compiled from the
/// intrinsics a step took 25 (24 operations issued, the compare and branch
/// fused), the loop's counting among them, and unrolled by LLVM, the loads
/// were hoisted over the steps and the accumulators spilled. Four steps to
/// a pass take 22 each (21.75 operations, `dec` and `jnz` fused). Alone on
/// its core, the loop is bound by the FMAs either way; where the core's
/// other hyperthread runs another program, by how many instructions issue.
/// Where the vCPUs shared their cores with other tenants, this loop ran
/// nearer the FMA peak than the compiled one, and whole products took less
/// time with it; when the host was quiet, the same time
/// (`benches/RESULTS-cpu.md`).
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` holds `depth` steps and `b` `depth` rows.
#[target_feature(enable = "avx2,fma")]
unsafe fn full_tile(a: Rows<MR>, b: *const f32, depth: usize) -> [[__m256; 2]; MR] {
    let mut c = [[_mm256_setzero_ps(); 2]; MR];
    match a {
        // SAFETY: the loop reads `depth` steps of A and rows of B (the
        // contract of this function), and prefetches, which read nothing.
        Rows::Packed(first) => unsafe {
            full_tile_loop!(
                packed,
                "add {a}, 4*{a_step}",
                "add {a}, {a_step}",
                &mut c,
                b,
                depth,
                a = inout(reg) first => _,
                a_step = const MR * 4,
            )
        },
        // SAFETY: as above.
        Rows::InPlace([a0, a1, a2, a3, a4, a5]) => unsafe {
            full_tile_loop!(
                in_place,
                "add {l}, 4",
                "add {l}, 1",
                &mut c,
                b,
                depth,
                a0 = in(reg) a0,
                a1 = in(reg) a1,
                a2 = in(reg) a2,
                a3 = in(reg) a3,
                a4 = in(reg) a4,
                a5 = in(reg) a5,
                l = inout(reg) 0usize => _,
            )
        },
    }
    c
}

/// A row of a tile with all `NR` columns, `row`, stored from `out`: added
/// to what is there if `tile.accumulate`, then through the tile's epilogue
/// (with `bias`, the epilogue's for these columns) if `EPILOGUE`.
///
/// # Safety
/// `out` is valid for `NR` reads and writes.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn whole_row<const EPILOGUE: bool>(
    out: *mut f32,
    row: &[__m256; 2],
    tile: Tile,
    bias: Option<[__m256; 2]>,
) {
    for (half, &v) in row.iter().enumerate() {
        // SAFETY: both halves' 8 lanes are among `out`'s NR elements.
        unsafe {
            let lanes = out.add(8 * half);
            let v = if tile.accumulate {
                _mm256_add_ps(_mm256_loadu_ps(lanes), v)
            } else {
                v
            };
            let v = if EPILOGUE {
                apply(v, bias.map(|b| b[half]), tile.epilogue)
            } else {
                v
            };
            _mm256_storeu_ps(lanes, v);
        }
    }
}

/// Row `i`'s bias in every lane, where `epilogue` has one per row.
///
/// # Safety
/// Where it has, `i` is one of its rows.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn row_bias<const EPILOGUE: bool>(epilogue: RawFused, i: usize) -> Option<[__m256; 2]> {
    // SAFETY: the caller's row `i` is inside the bias.
    let b = unsafe { epilogue.row_bias(i) }.filter(|_| EPILOGUE)?;
    Some([_mm256_set1_ps(b); 2])
}

/// `v` plus `bias` where there is one, then `epilogue`'s ReLU and cap:
/// lane by lane as `RawFused::apply` (the same bits).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn apply(v: __m256, bias: Option<__m256>, epilogue: RawFused) -> __m256 {
    let v = match bias {
        Some(bias) => _mm256_add_ps(v, bias),
        None => v,
    };
    relu_then_cap(v, epilogue.relu, epilogue.cap)
}

/// ReLU where `relu` (lanes not above zero become +0, a NaN stays), then
/// the lesser of that and `cap` where there is one (a NaN stays): the
/// GEMM's epilogue and the depthwise kernel's, lane by lane as
/// `RawFused::apply`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn relu_then_cap(mut v: __m256, relu: bool, cap: Option<f32>) -> __m256 {
    if relu {
        let not_above = _mm256_cmp_ps::<_CMP_LE_OQ>(v, _mm256_setzero_ps());
        v = _mm256_andnot_ps(not_above, v);
    }
    match cap {
        // `cap < v ? cap : v`.
        Some(cap) => _mm256_min_ps(_mm256_set1_ps(cap), v),
        None => v,
    }
}
