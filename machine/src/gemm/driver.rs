//! The loop nest of kiln's GEMM cores, generic over an ISA's micro-kernel
//! (`Kernel`): `C = A B`, A and B read through any strides, C row-major.
//!
//! For each block of at most `KC` along k (blocks of even depth), B's block
//! is packed into `NR`-column panels (or, for products with few rows, read
//! where it lies), and A's rows, in blocks of at most `MC`, into `MR`-row
//! panels (or, when they are contiguous and spread over the cache's sets,
//! read in place). bf16 operands (`Element`) are widened to f32 as they
//! are packed; a bf16 A whose rows are contiguous is widened row by row
//! and its f32 rows read as in place. Threads share a product
//! by rows or by panels (`share`). A task walks its panels of B in groups
//! of `NC_PANELS` (a group stays in L2): each panel of A passes over every
//! panel of the group, so it is read from the nearest caches while B's
//! panels stream past it, prefetched a few steps ahead of use by the
//! micro-kernel (faster than without: measured in
//! `benches/RESULTS-cpu.md`). In the last depth block each tile applies the
//! caller's `RawFused` epilogue (a bias, ReLU) in registers as it stores,
//! and each block of rows of C is handed to the caller's `finish` as soon
//! as that block is done, on the (last) thread that computed it.
//!
//! `unsafe` here is the calls of the packing, of the micro-kernels, of the
//! reads of A in place and of the sharing strategies, whose contracts the
//! loop nest keeps.

#![allow(unsafe_code)]

use super::panel::{InPlace, Packed, PanelA, aligned, pack_a, widen_rows};
use super::share::{by_panels, by_rows};
use super::tuning::Tuning;
use super::{Element, Operand, RawFused};
use crate::Isa;

/// One ISA's micro-kernel, an `MR x NR` tile of C held in registers over a
/// depth block, and the blocking sized for its registers and caches.
pub(super) trait Kernel<const MR: usize, const NR: usize> {
    /// Its blocking (`tuning`).
    const TUNING: Tuning;
    /// The heights of the micro-kernel's variants are multiples of this:
    /// with one block of rows per thread, blocks are cut at its multiples.
    const ROW_UNIT: usize;
    /// Whether a tile of at most `NR / 2` columns takes half a full tile's
    /// time (a variant computing only those).
    const HALF_TILES: bool;

    /// The top `tile.rows` rows of an `MR x NR` tile of C from rows of A and
    /// rows of `NR` elements of B, `b_stride` apart (one per depth step of
    /// `a`); only `tile.rows x tile.cols` of it is written, from `c` on.
    ///
    /// # Safety
    /// The CPU has the ISA's features, and the tile's elements of `c` are
    /// valid for reads and writes that no one else makes meanwhile.
    unsafe fn tile<A: PanelA<MR>>(a: A, b: &[f32], b_stride: usize, c: *mut f32, tile: Tile);
}

/// Where a tile of C lies, and how much of it is real.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    /// Of its first element from C's.
    pub offset: usize,
    /// Between its rows.
    pub stride: usize,
    /// Rows to write, 1 to `MR`.
    pub rows: usize,
    /// Columns to write, 1 to `NR`.
    pub cols: usize,
    /// Add to what C holds (a depth block after the first) instead of
    /// overwriting it.
    pub accumulate: bool,
    /// Applied to each element as it is stored (the last depth block),
    /// from the tile's first row and column.
    pub epilogue: RawFused,
}

/// B as the loop nest reads it: where it lies, each depth block packed into
/// panels as the product goes, or packed once before (`PackedB`): `NR`-column
/// panels one after the other, each `k` rows of `NR` (zeros past column
/// `n`).
#[derive(Clone, Copy)]
pub(super) enum Right<'a, T = f32> {
    Lies(Operand<T>),
    Packed(&'a [f32]),
}

/// `c[i * n + j] = epilogue(sum over l of a(i, l) b(l, j))` for `i < m`,
/// `j < n`, by kernel `K`, on up to `threads` threads; `finish(r0, r1)`
/// runs as soon as rows `r0..r1` of c are done, once for each of a
/// partition of `0..m`, on the thread that computed them (or the last of
/// those that did), while they are still in its cache.
///
/// # Safety
/// The CPU has `K`'s ISA, `a(i, l)` for `i < m, l < k` and `b(l, j)` for
/// `l < k, j < n` must lie inside live buffers (packed, `n.div_ceil(NR)`
/// panels of `k * NR` values), and a bias of `epilogue` `n` live values
/// (`m` where it holds one per row).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn sgemm<const MR: usize, const NR: usize, K: Kernel<MR, NR>, T: Element>(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<T>,
    b: Right<'_, T>,
    c: &mut [f32],
    threads: usize,
    epilogue: RawFused,
    finish: &(dyn Fn(usize, usize) + Sync),
) {
    let c = &mut c[..m * n];
    if k == 0 {
        for (i, row) in c.chunks_mut(n).enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                // SAFETY: `i < m` and `j < n`, a row or column of the bias
                // (the contract of this function).
                *x = unsafe { epilogue.apply(0.0, i, j) };
            }
        }
        finish(0, m);
        return;
    }
    // A is read where it lies when its rows are contiguous and do not
    // crowd into a few cache sets: packing costs about a tenth of a product
    // with few panels of B (256³, 64x784x256, 4096x784x256), and reading in
    // place is as fast as packed with many (1000³); but rows 4 KiB apart all
    // fall in one set, and 1024³ read in place took longer
    // (`benches/RESULTS-cpu.md`).
    let a_in_place = T::as_f32(a).filter(|&a| reads_a_in_place::<MR, NR>(a));
    let depth = k.div_ceil(k.div_ceil(K::TUNING.kc));
    let blocks_of_k: Vec<(usize, usize)> = (0..k)
        .step_by(depth)
        .map(|k0| (k0, depth.min(k - k0)))
        .collect();
    let product = Product {
        a,
        a_in_place,
        b,
        n,
        k,
        c: C(c.as_mut_ptr()),
        epilogue,
    };
    // B is read where it lies when its rows are contiguous, close together,
    // and A has at most MC rows: then each panel serves a few tiles only,
    // and packing it would cost about as much as it saves.
    let b_in_place = match b {
        Right::Lies(b) => T::as_f32(b),
        Right::Packed(_) => None,
    }
    .filter(|b| {
        b.cols == 1
            && !b.tabled()
            && (n as isize..=K::TUNING.in_place_rows as isize).contains(&b.rows)
            && m <= K::TUNING.mc
    });
    // Sharing B's panels, every thread packs all of A that it does not
    // read in place, and the threads' shares are whole panels; sharing
    // rows, every thread packs all of B, and the shares are whole tiles.
    // Panels are shared where A costs little to pack again (read in place,
    // at most MC rows, or fewer rows than B has columns: A is then the
    // smaller operand to pack on every thread) and they split about as
    // evenly as tiles (within 1/32 of the product: 49 panels on two
    // threads). By panels, the AVX-512 core took less time at 250x784x256
    // and 256³, the AVX2 core at 250x256x784 with B stored transposed, and
    // not reliably less at 784x250x256 with A stored transposed (784 rows,
    // 256 columns), which stays by rows (`benches/RESULTS-cpu.md`).
    let (panels, tiles) = (n.div_ceil(NR), m.div_ceil(MR));
    let largest_share = |units: usize| units.div_ceil(threads) as f64 / units as f64;
    // A last panel of half tiles costs half a panel, in the last thread's
    // range: 49 columns in four panels, 3.5 panels' work, shared 2 + 1.5,
    // which rows split evenly.
    let half_last = K::HALF_TILES && (1..=NR / 2).contains(&(n % NR));
    let cost = |p: usize| {
        if half_last && p + 1 == panels {
            0.5
        } else {
            1.0
        }
    };
    let largest_range = (0..threads)
        .map(|i| {
            (i * panels / threads..(i + 1) * panels / threads)
                .map(cost)
                .sum::<f64>()
        })
        .fold(0.0, f64::max);
    let panel_share = largest_range / (0..panels).map(cost).sum::<f64>();
    let share_panels = b_in_place.is_none()
        && threads > 1
        && panels >= 2 * threads
        && (a_in_place.is_some() || m <= K::TUNING.mc || n > m)
        && panel_share <= largest_share(tiles) + 1.0 / 32.0;
    // SAFETY (both calls): the contract of this function; `c` is borrowed
    // for the call, and holds `m * n` elements.
    if share_panels {
        unsafe { by_panels::<MR, NR, K, T>(&product, m, &blocks_of_k, threads, finish) }
    } else {
        unsafe { by_rows::<MR, NR, K, T>(&product, m, &blocks_of_k, b_in_place, threads, finish) }
    }
}

/// `sgemm` on the core of `isa`: kiln's AVX-512 core (AMX's f32 path
/// too) or its AVX2 core.
///
/// # Safety
/// `isa` is one of those, and the contract of `sgemm` for its core.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn on_core<T: Element>(
    isa: Isa,
    (m, n, k): (usize, usize, usize),
    a: Operand<T>,
    b: Right<'_, T>,
    c: &mut [f32],
    threads: usize,
    epilogue: RawFused,
    finish: &(dyn Fn(usize, usize) + Sync),
) {
    use super::{avx2, avx512};
    // SAFETY: the contract of this function.
    unsafe {
        match isa {
            Isa::Avx512 | Isa::Amx => sgemm::<{ avx512::MR }, { avx512::NR }, avx512::Avx512, T>(
                m, n, k, a, b, c, threads, epilogue, finish,
            ),
            Isa::Avx2 => sgemm::<{ avx2::MR }, { avx2::NR }, avx2::Avx2, T>(
                m, n, k, a, b, c, threads, epilogue, finish,
            ),
            Isa::Generic => unreachable!("the gemm crate is no core of kiln's"),
        }
    }
}

/// What every task of a product reads, and where it writes: A where it
/// lies too, if it is read there.
pub(super) struct Product<'a, T> {
    pub(super) a: Operand<T>,
    pub(super) a_in_place: Option<Operand>,
    pub(super) b: Right<'a, T>,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) c: C,
    pub(super) epilogue: RawFused,
}

/// The product's first element: tasks write disjoint tiles of it.
#[derive(Clone, Copy)]
pub(super) struct C(pub(super) *mut f32);

// SAFETY: tasks write through it only to the tiles they own, while the
// caller of `sgemm` holds the product borrowed.
unsafe impl Sync for C {}
unsafe impl Send for C {}

impl C {
    /// Element `i` of the product.
    pub(super) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// Rows `rows` of C over one depth block `(k0, kc)`, the last one if
/// `last` (whose tiles apply the epilogue), and panels `panels` of B (each
/// `panel(p)`: its rows and their distance): A's rows packed into
/// `packed_a` (or read in place), then each group of `NC_PANELS` panels
/// walked by every tile of rows.
///
/// # Safety
/// The contract of `sgemm`, and no one else touches these rows and panels'
/// columns of C meanwhile.
pub(super) unsafe fn block<'b, const MR: usize, const NR: usize, K: Kernel<MR, NR>, T: Element>(
    product: &Product<'_, T>,
    rows: std::ops::Range<usize>,
    (k0, kc, last): (usize, usize, bool),
    (panels, panel): (std::ops::Range<usize>, impl Fn(usize) -> (&'b [f32], usize)),
    packed_a: &mut Vec<f32>,
) {
    let (a, n) = (product.a, product.n);
    let (r0, mr) = (rows.start, rows.len());
    let widened = match product.a_in_place {
        Some(_) => None,
        None => widened_stride::<MR, NR, T>(a, kc),
    };
    let len = match (product.a_in_place, widened) {
        (Some(_), _) => 0,
        (None, Some(stride)) => mr * stride,
        (None, None) => mr.div_ceil(MR) * MR * kc,
    };
    let packed_a = aligned(packed_a, len);
    // A's rows read in place: the operand, the first of its rows in this
    // block, and the first column; or `None` for panels.
    let in_place = match (product.a_in_place, widened) {
        (Some(a), _) => Some((a, 0, k0)),
        (None, Some(stride)) => {
            // SAFETY: the CPU has K's ISA, AVX2 or more; a's rows are
            // contiguous and it has no table (`widened_stride`); rows `r0..r0
            // + mr` and columns `k0..k0 + kc` of a are inside its buffer
            // (the contract of `sgemm`); `packed_a` holds `mr` rows `stride`
            // apart, `stride >= kc`.
            unsafe { widen_rows(a, (r0, mr), (k0, kc), packed_a, stride) };
            Some((
                Operand::strided(packed_a.as_ptr(), stride as isize, 1),
                r0,
                0,
            ))
        }
        (None, None) => {
            // SAFETY: rows `r0..r0 + mr` and columns `k0..k0 + kc` of a are
            // inside its buffer (the contract of `sgemm`).
            unsafe { pack_a::<MR, T>(a, r0, mr, k0, kc, packed_a) };
            None
        }
    };
    let (packed_a, _) = packed_a.as_chunks::<MR>();
    for p0 in panels.clone().step_by(K::TUNING.nc_panels) {
        for t in 0..mr.div_ceil(MR) {
            for p in p0..panels.end.min(p0 + K::TUNING.nc_panels) {
                let tile = Tile {
                    offset: (r0 + t * MR) * n + p * NR,
                    stride: n,
                    rows: MR.min(mr - t * MR),
                    cols: NR.min(n - p * NR),
                    accumulate: k0 > 0,
                    epilogue: match last {
                        true => product.epilogue.at(r0 + t * MR, p * NR),
                        false => RawFused::NONE,
                    },
                };
                let (b_rows, b_stride) = panel(p);
                let c = product.c.0;
                if let Some((a, first, l0)) = in_place {
                    // SAFETY: rows of a (where it lies, or widened) are
                    // contiguous; the tile's rows (1 to MR of them), `kc`
                    // columns from `l0`, are inside its buffer.
                    let a_rows = unsafe { InPlace::new(a, r0 + t * MR - first, tile.rows, l0, kc) };
                    // SAFETY: the CPU has K's ISA; the tile lies in C, whose
                    // rows and columns here are this caller's alone.
                    unsafe { K::tile(a_rows, b_rows, b_stride, c, tile) };
                } else {
                    let a_panel = Packed(&packed_a[t * kc..(t + 1) * kc]);
                    // SAFETY: as above.
                    unsafe { K::tile(a_panel, b_rows, b_stride, c, tile) };
                }
            }
        }
    }
}

/// The distance between the rows of a depth block of `kc` columns of `a`
/// widened row by row into f32 (`widen_rows`), where `a` is bf16 and its
/// rows contiguous: then the core reads them as f32 rows in place, which
/// costs less than turning them into panels (`benches/RESULTS-cpu.md`).
/// At least `kc`, and enough that the rows spread over the cache's sets.
fn widened_stride<const MR: usize, const NR: usize, T: Element>(
    a: Operand<T>,
    kc: usize,
) -> Option<usize> {
    if T::as_f32(a).is_some() || a.cols != 1 || a.tabled() {
        return None;
    }
    let spread = |stride: &usize| spread_over_sets::<MR>(*stride as isize, NR.div_ceil(16));
    // A line more at a time moves each row to another set: one of the first
    // 64 such strides spreads them.
    (0..64).map(|lines| kc + 16 * lines).find(spread)
}

/// Whether a core of `MR x NR` tiles reads `a` where it lies (rather than
/// packed): its rows contiguous, and spread over the cache's sets.
pub(super) fn reads_a_in_place<const MR: usize, const NR: usize>(a: Operand) -> bool {
    a.cols == 1 && !a.tabled() && spread_over_sets::<MR>(a.rows, NR.div_ceil(16))
}

/// Whether `MR` rows `lda` elements apart start in enough of L1's 64 sets
/// (of 64-byte lines, 4 KiB round) that reading them in place leaves room
/// in each set, 8 lines, for the `b_lines` lines of B read beside them.
fn spread_over_sets<const MR: usize>(lda: isize, b_lines: usize) -> bool {
    let mut rows_in_set = [0usize; 64];
    for i in 0..MR {
        rows_in_set[(i * lda.unsigned_abs() * 4 / 64) % 64] += 1;
    }
    rows_in_set.iter().all(|&rows| rows + b_lines <= 8)
}
