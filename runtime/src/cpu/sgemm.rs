//! f32 GEMM with AVX-512 on x86-64: `C = A B`, A and B read through any
//! strides, C row-major. The `gemm` crate's AVX-512 kernels need a nightly
//! compiler; on stable it runs 256-bit kernels, half the width of the FMA
//! units where AVX-512 is there. Elsewhere the crate does the work.
//!
//! The loop nest is the usual one: for each block of at most `KC` along k
//! (blocks of even depth), B's block is packed once into `NR`-column panels
//! (or, for products with few rows, read where it lies); the rows of C are
//! cut into blocks of at most `MC` rows, shared evenly between threads, each
//! task packing its rows of A into `MR`-row panels (or, when they are
//! contiguous and spread over the cache's sets, reading them in place).
//! A task walks B's panels in groups of `NC_PANELS` (a group stays in L2):
//! each panel of A passes over every panel of the group, so it is read from
//! the nearest caches while B's panels stream past it, both prefetched a few
//! steps ahead of use (measured 1.2-1.3x faster than without). The
//! microkernel holds an `MR x NR` tile in 24 of the 32 vector registers for
//! the whole depth block, two FMAs per broadcast element of A.
//!
//! `unsafe` here is the vector loads and stores, the reads of A and the
//! packing reads through the caller's strides, and the call of the AVX-512
//! code.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    _MM_HINT_T0, _mm_prefetch, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps,
    _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
};

use rayon::prelude::*;

/// Rows of a tile: the broadcast elements of A.
const MR: usize = 12;
/// Columns of a tile: two vectors of 16.
const NR: usize = 32;
/// Depth of a block at most: every tile of C is read and written once per
/// depth block, so deeper blocks cost less traffic in C; 512 measured
/// 5-15% faster than 256 on Cascade Lake (1024³, 2048³, 4096x784x256).
const KC: usize = 512;
/// Rows of C per task at most: the packed A block (`MC x KC`, 192 KiB) and
/// a group of B panels (`KC x NR * NC_PANELS`, 512 KiB) share the L2.
const MC: usize = 8 * MR;
/// Panels of B walked by every panel of A before the next group.
const NC_PANELS: usize = 8;
/// Farthest apart (in elements) the rows of B may be to be read in place:
/// rows further apart map onto few cache sets (read in place, 96x2048x2048
/// took 1.6x as long as packed).
const IN_PLACE_ROWS: usize = 512;
/// How many steps along k ahead of use the microkernel prefetches.
const PREFETCH: usize = 8;

/// Whether this machine runs the AVX-512 kernels.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// An operand: element `(i, j)` at `ptr + i * rows + j * cols`.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub ptr: *const f32,
    pub rows: isize,
    pub cols: isize,
}

// SAFETY: an operand is only read, while the caller of `sgemm` keeps its
// buffer alive (the contract of `sgemm`).
unsafe impl Sync for Operand {}
unsafe impl Send for Operand {}

/// `c[i * n + j] = sum over l of a(i, l) b(l, j)` for `i < m`, `j < n`, on
/// up to `threads` threads; `finish(r0, r1)` runs on the thread that
/// computed rows `r0..r1` of c as soon as they are done, once for each of a
/// partition of `0..m`, while they are still in its cache.
///
/// # Safety
/// `available()` must be true, and `a(i, l)` for `i < m, l < k` and
/// `b(l, j)` for `l < k, j < n` must lie inside live buffers.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    c: &mut [f32],
    threads: usize,
    finish: &(dyn Fn(usize, usize) + Sync),
) {
    if k == 0 {
        c[..m * n].fill(0.0);
        finish(0, m);
        return;
    }
    let panels = n.div_ceil(NR);
    // B is read where it lies when its rows are contiguous, close together,
    // and A has at most MC rows: then each panel serves a few tiles only,
    // and packing it would cost about as much as it saves. The
    // ragged last panel is packed all the same: reading its 32 columns would
    // pass the end of B's row.
    let in_place =
        b.cols == 1 && (n as isize..=IN_PLACE_ROWS as isize).contains(&b.rows) && m <= MC;
    let first_packed = if in_place { n / NR } else { 0 };
    // A is read where it lies when its rows are contiguous and do not
    // crowd into a few cache sets: packing costs about a tenth of a product
    // with few panels of B (256³, 64x784x256, 4096x784x256), and reading in
    // place is as fast as packed with many (1000³); but rows 4 KiB apart all
    // fall in one set (1024³ then took 1.3x as long).
    let a_in_place = a.cols == 1 && spread_over_sets(a.rows);
    let depth = k.div_ceil(k.div_ceil(KC));
    // Depth blocks `(k0, kc)`, in groups that run as one parallel region:
    // B's blocks of a group are packed together first, then each task walks
    // its rows through all of them. Read in place, B packs little, and one
    // group saves a dispatch and a barrier per block; packed, each block is
    // its own group, so that its panels stay in cache for every row block.
    let blocks_of_k: Vec<(usize, usize)> = (0..k)
        .step_by(depth)
        .map(|k0| (k0, depth.min(k - k0)))
        .collect();
    let groups: Vec<&[(usize, usize)]> = if in_place {
        vec![&blocks_of_k]
    } else {
        blocks_of_k.chunks(1).collect()
    };
    // A group's packed panels, depth block after depth block, in this
    // thread's buffer (taken for the call, so that a nested call would
    // make its own).
    let packed_width = (panels - first_packed) * NR;
    let packed_len = packed_width * if in_place { k } else { depth };
    let mut packed_b = PACKED_B.take();
    if packed_b.len() < packed_len {
        packed_b.resize(packed_len, 0.0);
    }
    // Row blocks: at most MC rows, as many per thread, tiles shared as
    // evenly as they go (block sizes differ by one tile at most). With one
    // block per thread, a thread's time is its block's, so the blocks are
    // cut at multiples of 4 rows instead, and the last tile of a block (4,
    // 8 or 12 rows) runs the kernel of its height: 64 rows are 2 x (12 +
    // 12 + 8), not 36 + 28 with a 12-row kernel on the 4 left.
    let tiles = m.div_ceil(MR);
    let blocks = (threads * tiles.div_ceil(threads * (MC / MR))).min(tiles);
    let unit = if blocks <= threads { 4 } else { MR };
    let units = m.div_ceil(unit);
    let bounds: Vec<usize> = (0..=blocks)
        .map(|i| (i * units / blocks * unit).min(m))
        .collect();
    let last_group = groups.len() - 1;
    for (g, group) in groups.into_iter().enumerate() {
        let k_first = group[0].0;
        let k_end = group.last().map_or(k_first, |&(k0, kc)| k0 + kc);
        let packed_b = &mut packed_b[..packed_width * (k_end - k_first)];
        // Every depth block's panels, each `kc x NR`.
        let mut jobs: Vec<(usize, usize, &mut [f32])> =
            Vec::with_capacity(group.len() * (panels - first_packed));
        let mut rest = &mut *packed_b;
        for &(k0, kc) in group {
            for p in first_packed..panels {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(NR * kc);
                jobs.push((k0, p, head));
                rest = tail;
            }
        }
        let pack = |(k0, p, panel): (usize, usize, &mut [f32])| {
            // SAFETY: rows `k0..k0 + kc` and columns `..n` of b are inside
            // its buffer (the contract of this function).
            unsafe { pack_b(b, k0, p, n, panel) }
        };
        if threads > 1 {
            jobs.into_par_iter().for_each(pack);
        } else {
            jobs.into_iter().for_each(pack);
        }
        let packed_b = &*packed_b;
        // Panel `p` of depth block `d`: its rows and their distance. (`b` is
        // taken whole, by reference: its pointer alone is not `Sync`.)
        let b = &b;
        let panel = |d: usize, p: usize| -> (&[f32], usize) {
            let (k0, kc) = group[d];
            if p < first_packed {
                let stride = b.rows as usize;
                // SAFETY: `in_place`: rows `k0..k0 + kc` of b lie `stride`
                // apart in one buffer, and columns `p * NR..(p + 1) * NR`
                // are inside each (`p < n / NR`); the slice runs from the
                // first of them to the last.
                let rows = unsafe {
                    std::slice::from_raw_parts(
                        b.ptr.offset(k0 as isize * b.rows + (p * NR) as isize),
                        (kc - 1) * stride + NR,
                    )
                };
                (rows, stride)
            } else {
                let at = packed_width * (k0 - k_first) + (p - first_packed) * NR * kc;
                (&packed_b[at..at + NR * kc], NR)
            }
        };
        let block = |(r0, c_rows): (usize, &mut [f32])| {
            let mr = c_rows.len() / n;
            PACKED_A.with_borrow_mut(|buffer| {
                for (d, &(k0, kc)) in group.iter().enumerate() {
                    let len = if a_in_place {
                        0
                    } else {
                        mr.div_ceil(MR) * MR * kc
                    };
                    if buffer.len() < len {
                        buffer.resize(len, 0.0);
                    }
                    let packed_a = &mut buffer[..len];
                    if !a_in_place {
                        // SAFETY: rows `r0..r0 + mr` and columns `k0..k0 + kc`
                        // of a are inside its buffer.
                        unsafe { pack_a(a, r0, mr, k0, kc, packed_a) };
                    }
                    let (packed_a, _) = packed_a.as_chunks::<MR>();
                    for p0 in (0..panels).step_by(NC_PANELS) {
                        for t in 0..mr.div_ceil(MR) {
                            for p in p0..panels.min(p0 + NC_PANELS) {
                                let tile = Tile {
                                    offset: t * MR * n + p * NR,
                                    stride: n,
                                    rows: MR.min(mr - t * MR),
                                    cols: NR.min(n - p * NR),
                                    accumulate: k0 > 0,
                                };
                                let (b_rows, b_stride) = panel(d, p);
                                if a_in_place {
                                    // SAFETY: `a_in_place`: rows of a are
                                    // contiguous; the tile's rows (1 to MR of
                                    // them), columns `k0..k0 + kc`, are inside
                                    // its buffer.
                                    let a_rows =
                                        unsafe { InPlace::new(a, r0 + t * MR, tile.rows, k0, kc) };
                                    // SAFETY: `available()` (the contract of this function).
                                    unsafe { run_tile(a_rows, b_rows, b_stride, c_rows, tile) };
                                } else {
                                    let a_panel = Packed(&packed_a[t * kc..(t + 1) * kc]);
                                    // SAFETY: `available()` (the contract of this function).
                                    unsafe { run_tile(a_panel, b_rows, b_stride, c_rows, tile) };
                                }
                            }
                        }
                    }
                }
            });
            if g == last_group {
                finish(r0, r0 + mr);
            }
        };
        let mut rest = &mut c[..m * n];
        let mut row_blocks = Vec::with_capacity(blocks);
        for w in bounds.windows(2) {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut((w[1] - w[0]) * n);
            row_blocks.push((w[0], head));
            rest = tail;
        }
        if threads > 1 {
            row_blocks.into_par_iter().with_max_len(1).for_each(block);
        } else {
            row_blocks.into_iter().for_each(block);
        }
    }
    PACKED_B.set(packed_b);
}

thread_local! {
    /// Each thread's packed rows of A, kept from call to call: packing
    /// writes every element the microkernel reads, so reuse needs no
    /// clearing.
    static PACKED_A: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The calling thread's packed panels of B, kept from call to call as
    /// `PACKED_A` is: a fresh zeroed buffer cost 256³ a tenth of its time.
    static PACKED_B: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Where a tile of C lies in a row block, and how much of it is real.
#[derive(Clone, Copy)]
struct Tile {
    offset: usize,
    stride: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
}

/// Panel `p` of rows `k0..k0 + kc` of b (`kc = panel.len() / NR`): columns
/// `p * NR..` up to `n`, `kc x NR` row-major, zero past column `n`.
///
/// # Safety
/// Those elements of b must lie inside its buffer.
unsafe fn pack_b(b: Operand, k0: usize, p: usize, n: usize, panel: &mut [f32]) {
    let cols = NR.min(n - p * NR);
    for (l, row) in panel.chunks_exact_mut(NR).enumerate() {
        let base = (k0 + l) as isize * b.rows + (p * NR) as isize * b.cols;
        if b.cols == 1 {
            // SAFETY: elements (k0 + l, p * NR..p * NR + cols) of b, adjacent.
            let src = unsafe { std::slice::from_raw_parts(b.ptr.offset(base), cols) };
            row[..cols].copy_from_slice(src);
        } else {
            for (j, x) in row[..cols].iter_mut().enumerate() {
                // SAFETY: element (k0 + l, p * NR + j) of b, inside its buffer.
                *x = unsafe { *b.ptr.offset(base + j as isize * b.cols) };
            }
        }
        row[cols..].fill(0.0);
    }
}

/// Rows `r0..r0 + mr` of a, columns `k0..k0 + kc`, as `MR`-row panels, each
/// `kc x MR` (column of the panel after column), zero past row `mr`.
///
/// # Safety
/// Those elements of a must lie inside its buffer.
unsafe fn pack_a(a: Operand, r0: usize, mr: usize, k0: usize, kc: usize, out: &mut [f32]) {
    for (t, panel) in out.chunks_exact_mut(MR * kc).enumerate() {
        let rows = MR.min(mr - t * MR);
        for (l, column) in panel.chunks_exact_mut(MR).enumerate() {
            let base = (r0 + t * MR) as isize * a.rows + (k0 + l) as isize * a.cols;
            for (i, x) in column[..rows].iter_mut().enumerate() {
                // SAFETY: element (r0 + t * MR + i, k0 + l) of a, inside its buffer.
                *x = unsafe { *a.ptr.offset(base + i as isize * a.rows) };
            }
            column[rows..].fill(0.0);
        }
    }
}

/// A tile's rows of A along one depth block: element `(i, l)`, row `i` of
/// the tile at depth `l`.
trait PanelA {
    /// The depth.
    fn depth(&self) -> usize;
    /// Element `(i, l)`.
    ///
    /// # Safety
    /// `i < MR` and `l < depth()`.
    unsafe fn at(&self, i: usize, l: usize) -> f32;
    /// Hints that depth `l` (perhaps past the end) is read soon.
    fn prefetch(&self, _l: usize) {}
}

/// A packed panel, `kc x MR`, column after column.
struct Packed<'a>(&'a [[f32; MR]]);

impl PanelA for Packed<'_> {
    fn depth(&self) -> usize {
        self.0.len()
    }

    #[inline(always)]
    unsafe fn at(&self, i: usize, l: usize) -> f32 {
        self.0[l][i]
    }

    #[inline(always)]
    fn prefetch(&self, l: usize) {
        // Prefetches only hint: an address past the panel's end is harmless.
        let ahead = self.0.as_ptr().wrapping_add(l).cast::<i8>();
        // SAFETY: `_mm_prefetch` reads nothing; AVX-512 implies SSE.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead) };
    }
}

/// `MR` rows of A read where they lie, each `depth` contiguous elements.
struct InPlace {
    rows: [*const f32; MR],
    depth: usize,
}

impl InPlace {
    /// Rows `r0..r0 + rows` of a (`rows <= MR`, the rest standing in for
    /// rows past the tile, whose results are not stored), columns `k0..k0 +
    /// depth`.
    ///
    /// # Safety
    /// `a.cols == 1`, `1 <= rows <= MR`, and those elements of a lie inside
    /// its buffer.
    unsafe fn new(a: Operand, r0: usize, rows: usize, k0: usize, depth: usize) -> InPlace {
        let row = |i: usize| {
            a.ptr
                .wrapping_offset((r0 + i.min(rows - 1)) as isize * a.rows + k0 as isize)
        };
        InPlace {
            rows: std::array::from_fn(row),
            depth,
        }
    }
}

impl PanelA for InPlace {
    fn depth(&self) -> usize {
        self.depth
    }

    #[inline(always)]
    unsafe fn at(&self, i: usize, l: usize) -> f32 {
        // SAFETY: `l < depth` (the caller's contract), and row `i` holds
        // `depth` elements from its pointer (the contract of `new`).
        unsafe { *self.rows[i].add(l) }
    }
}

/// The top `R` rows (4, 8 or `MR`) of an `MR x NR` tile of C from rows of A
/// and `kc` rows of `NR` elements of B, `b_stride` apart; only `tile.rows x
/// tile.cols` of it is written.
#[target_feature(enable = "avx512f")]
fn microkernel<const R: usize, A: PanelA>(
    a: A,
    b: &[f32],
    b_stride: usize,
    c: &mut [f32],
    tile: Tile,
) {
    let depth = a.depth();
    assert!(
        depth == 0 || (depth - 1) * b_stride + NR <= b.len(),
        "B holds {depth} rows of {NR}, {b_stride} apart",
    );
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for l in 0..depth {
        let row = b.as_ptr().wrapping_add(l * b_stride);
        // Prefetches only hint: an address past the panels' ends is harmless.
        let ahead = row.wrapping_add(PREFETCH * b_stride).cast::<i8>();
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        a.prefetch(l + PREFETCH);
        // SAFETY: row `l` of B, 32 f32 (two vectors), is inside `b` (the
        // assert above).
        let (b0, b1) = unsafe { (_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16))) };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: `i < R <= MR` and `l < depth`.
            let x = _mm512_set1_ps(unsafe { a.at(i, l) });
            row[0] = _mm512_fmadd_ps(x, b0, row[0]);
            row[1] = _mm512_fmadd_ps(x, b1, row[1]);
        }
    }
    let masks = [
        lane_mask(tile.cols.min(16)),
        lane_mask(tile.cols.saturating_sub(16)),
    ];
    for (i, row) in acc.iter().take(tile.rows).enumerate() {
        let start = tile.offset + i * tile.stride;
        let out = &mut c[start..start + tile.cols];
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
                _mm512_mask_storeu_ps(lanes, mask, v);
            }
        }
    }
}

/// Whether `MR` rows `lda` elements apart start in enough of L1's 64 sets
/// (of 64-byte lines, 4 KiB round) that reading them in place leaves
/// room in each set, 8 lines, for B's two lines beside them.
fn spread_over_sets(lda: isize) -> bool {
    let mut rows_in_set = [0u8; 64];
    for i in 0..MR {
        rows_in_set[(i * lda.unsigned_abs() * 4 / 64) % 64] += 1;
    }
    rows_in_set.iter().all(|&rows| rows <= 6)
}

/// A tile by the microkernel of its height.
///
/// # Safety
/// `available()`.
unsafe fn run_tile<A: PanelA>(a: A, b: &[f32], b_stride: usize, c: &mut [f32], tile: Tile) {
    let kernel = match tile.rows {
        ..=4 => microkernel::<4, A>,
        5..=8 => microkernel::<8, A>,
        _ => microkernel::<MR, A>,
    };
    // SAFETY: AVX-512 is there (the contract of this function).
    unsafe { kernel(a, b, b_stride, c, tile) }
}

/// The first `lanes` (at most 16) bits set.
fn lane_mask(lanes: usize) -> u16 {
    ((1u32 << lanes) - 1) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products of awkward shapes and strides (a transposed, b broadcast
    /// along k) against a plain triple loop in f64.
    #[test]
    fn tiles_edges_and_strides_agree_with_a_plain_product() {
        if !available() {
            eprintln!("skipped: this machine has no AVX-512");
            return;
        }
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 7, 5),
            (13, 300, 33),
            (12, 256, 32),
            (50, 513, 1027),
            (200, 64, 17),
            (300, 1100, 70),
            // B read in place over several depth blocks, with and without a
            // ragged packed panel; row blocks ending in 4- and 8-row tiles.
            (64, 1100, 96),
            (90, 600, 50),
            (8, 70, 40),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919) % 97) as f32 / 13.0 - 3.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 104_729) % 89) as f32 / 11.0 - 4.0)
                .collect();
            // a row-major or stored transposed ([k, m]); b row-major, its
            // rows `pad` elements apart beyond their length (a slice of
            // wider rows).
            let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
            let transposed = Operand {
                ptr: at.as_ptr(),
                rows: 1,
                cols: m as isize,
            };
            let row_major = Operand {
                ptr: a.as_ptr(),
                rows: k as isize,
                cols: 1,
            };
            for (threads, pad, a_op) in [(1, 0, transposed), (2, 0, transposed), (2, 3, row_major)]
            {
                let stride = n + pad;
                let b_rows: Vec<f32> = (0..k * stride)
                    .map(|i| {
                        if i % stride < n {
                            b[i / stride * n + i % stride]
                        } else {
                            f32::NAN
                        }
                    })
                    .collect();
                let mut c = vec![f32::NAN; m * n];
                let b_op = Operand {
                    ptr: b_rows.as_ptr(),
                    rows: stride as isize,
                    cols: 1,
                };
                let finished = std::sync::Mutex::new(Vec::new());
                let finish = |r0, r1| finished.lock().unwrap().push((r0, r1));
                // SAFETY: `available()`; both operands index inside their vectors.
                unsafe { sgemm(m, n, k, a_op, b_op, &mut c, threads, &finish) };
                // `finish` saw a partition of the rows.
                let mut finished = finished.into_inner().unwrap();
                finished.sort_unstable();
                let mut next = 0;
                for (r0, r1) in finished {
                    assert_eq!(r0, next, "{m}x{k}x{n}: rows finished");
                    next = r1;
                }
                assert_eq!(next, m, "{m}x{k}x{n}: rows finished");
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|l| f64::from(a[i * k + l]) * f64::from(b[l * n + j]))
                            .sum();
                        let got = f64::from(c[i * n + j]);
                        let scale: f64 = (0..k)
                            .map(|l| f64::from(a[i * k + l] * b[l * n + j]).abs())
                            .sum();
                        assert!(
                            (got - want).abs() <= 1e-6 * scale.max(1.0),
                            "({m},{k},{n}) threads {threads} pad {pad} at ({i},{j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
