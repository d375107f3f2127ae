//! The loop nest of kiln's GEMM cores, generic over an ISA's micro-kernel
//! (`Kernel`): `C = A B`, A and B read through any strides, C row-major.
//!
//! For each block of at most `KC` along k (blocks of even depth), B's block
//! is packed into `NR`-column panels (or, for products with few rows, read
//! where it lies), and A's rows, in blocks of at most `MC`, into `MR`-row
//! panels (or, when they are contiguous and spread over the cache's sets,
//! read in place). bf16 operands (`Element`) are always packed, widened to
//! f32 as they are. Threads share a product by rows (`by_rows`: each takes
//! blocks of rows and walks every panel of B, all of which it packs for
//! itself) or by panels (`by_panels`: A packed by all threads together
//! first, then each packs its own panels of B and walks every block of rows
//! over them, with no barrier between depth blocks). A task walks its
//! panels of B in groups of `NC_PANELS` (a group stays in L2): each panel
//! of A passes over every panel of the group, so it is read from the
//! nearest caches while B's panels stream past it, prefetched a few steps
//! ahead of use by the micro-kernel (faster than without: measured in
//! `benches/RESULTS-cpu.md`).
//! In the last depth block each tile applies the caller's `RawFused` epilogue (a
//! bias, ReLU) in registers as it stores, and each block of rows of C is
//! handed to the caller's `finish` as soon as that block is done, on the
//! (last) thread that computed it.
//!
//! `unsafe` here is the reads of B in place and the calls of the packing
//! and of the micro-kernels, whose contracts the loop nest keeps.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::panel::{InPlace, Packed, PanelA, in_place_rows, pack_a, pack_panels, packed_before};
use super::tuning::Tuning;
use super::{Element, Operand, RawFused};
use crate::{Isa, team};

/// One ISA's micro-kernel, an `MR x NR` tile of C held in registers over a
/// depth block, and the blocking sized for its registers and caches.
pub(super) trait Kernel<const MR: usize, const NR: usize> {
    /// Its blocking (`tuning`).
    const TUNING: Tuning;
    /// The heights of the micro-kernel's variants are multiples of this:
    /// with one block of rows per thread, blocks are cut at its multiples.
    const ROW_UNIT: usize;

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
    // Sharing B's panels, every thread reads all of A (packed once, where
    // it is not read in place), and the threads' shares are whole panels;
    // sharing rows, every thread packs all of B, and the shares are whole
    // tiles. Panels are shared where A costs little to read again (read in
    // place, at most MC rows, or fewer rows than B has columns: A is then
    // the smaller operand to read on every thread) and they split about as
    // evenly as tiles (within 1/32 of the product: 49 panels on two
    // threads). By panels, the AVX-512 core took less time at 250x784x256
    // and 256³, the AVX2 core at 250x256x784 with B stored transposed, and
    // not reliably less at 784x250x256 with A stored transposed (784 rows,
    // 256 columns), which stays by rows (`benches/RESULTS-cpu.md`).
    let (panels, tiles) = (n.div_ceil(NR), m.div_ceil(MR));
    let largest_share = |units: usize| units.div_ceil(threads) as f64 / units as f64;
    let share_panels = b_in_place.is_none()
        && threads > 1
        && panels >= 2 * threads
        && (a_in_place.is_some() || m <= K::TUNING.mc || n > m)
        && largest_share(panels) <= largest_share(tiles) + 1.0 / 32.0;
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
struct Product<'a, T> {
    a: Operand<T>,
    a_in_place: Option<Operand>,
    b: Right<'a, T>,
    n: usize,
    k: usize,
    c: C,
    epilogue: RawFused,
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

/// The product with the rows of C cut into blocks shared between threads,
/// each walking every panel of B. Each thread packs B's depth blocks for
/// itself, at the first block of rows it takes in each parallel region
/// (one per depth block, or one for all where B is read in place).
/// (Packed once for all threads, the panels that one thread had packed
/// came to the other from its cache or through L3, and threads waited for
/// each other's runs of panels. Packed per thread, 784x250x256 with A
/// stored transposed took less time, and no product measured took
/// longer: `benches/RESULTS-cpu.md`.)
///
/// # Safety
/// The contract of `sgemm`, and no one else touches C meanwhile.
unsafe fn by_rows<const MR: usize, const NR: usize, K: Kernel<MR, NR>, T: Element>(
    product: &Product<'_, T>,
    m: usize,
    blocks_of_k: &[(usize, usize)],
    in_place: Option<Operand>,
    threads: usize,
    finish: &(dyn Fn(usize, usize) + Sync),
) {
    let (b, n) = (product.b, product.n);
    let panels = n.div_ceil(NR);
    // Panels `..first_packed` are read where they lie: all of them packed
    // before, else where B is read in place all but its ragged last panel,
    // which is packed all the same (reading its NR columns would pass the
    // end of B's row).
    let first_packed = match (b, in_place) {
        (Right::Packed(_), _) => panels,
        (Right::Lies(_), Some(_)) => n / NR,
        (Right::Lies(_), None) => 0,
    };
    // Depth blocks in groups that run as one parallel region, each task
    // walking its rows through all of them. Read in place or packed
    // before, B's panels pack little or nothing, and one group saves a
    // dispatch per block; packed as the product goes, each block is its own
    // group, so that its panels stay in cache for every row block.
    let groups: Vec<&[(usize, usize)]> = if in_place.is_some() || first_packed > 0 {
        vec![blocks_of_k]
    } else {
        blocks_of_k.chunks(1).collect()
    };
    let packed_width = (panels - first_packed) * NR;
    let bounds = row_blocks::<MR, NR, K>(m, threads);
    let last_group = groups.len() - 1;
    for (g, group) in groups.into_iter().enumerate() {
        let k_first = group[0].0;
        let k_end = group.last().map_or(k_first, |&(k0, kc)| k0 + kc);
        // Where packed panel `p` of the depth block from `k0`, `kc` deep,
        // starts: depth block after depth block, panel after panel.
        let packed_at = |k0: usize, kc: usize, p: usize| {
            packed_width * (k0 - k_first) + (p - first_packed) * NR * kc
        };
        // This group's parallel region, told apart from every other: a
        // thread's packed panels are this region's when tagged with it.
        let region = REGIONS.fetch_add(1, Ordering::Relaxed);
        // (`b` is taken whole, by reference: its pointer alone is not
        // `Sync`.)
        let b = &b;
        let block = |&(r0, r1): &(usize, usize)| {
            // The thread's packed panels (and below, rows of A), taken for
            // the task and put back before `finish`: a product that
            // `finish` starts packs them again, tagged with its own region,
            // so that this region's next task on this thread packs them
            // again too.
            let mut packed_b = PACKED_B.take();
            let packed = aligned(&mut packed_b.buffer, packed_width * (k_end - k_first));
            if let Right::Lies(b) = *b
                && packed_b.region != Some(region)
            {
                for &(k0, kc) in group {
                    let at = packed_at(k0, kc, first_packed);
                    let out = &mut packed[at..at + packed_width * kc];
                    // SAFETY: rows `k0..k0 + kc` and columns `..n` of b
                    // are inside its buffer (the contract of `sgemm`).
                    unsafe { pack_panels::<NR, T>(b, (k0, kc), first_packed..panels, n, out) };
                }
                packed_b.region = Some(region);
            }
            let packed = &*packed;
            let mut packed_a_buffer = PACKED_A.take();
            for (d, &(k0, kc)) in group.iter().enumerate() {
                // Panel `p` of this depth block: its rows and their
                // distance.
                let panel = |p: usize| -> (&[f32], usize) {
                    match (*b, in_place) {
                        (Right::Packed(all), _) => packed_before::<NR>(all, product.k, (k0, kc), p),
                        // SAFETY: `p < n / NR`, and B read in place (the
                        // contract of `sgemm`).
                        (Right::Lies(_), Some(b)) if p < first_packed => unsafe {
                            in_place_rows::<NR>(b, (k0, kc), p)
                        },
                        (Right::Lies(_), _) => {
                            let at = packed_at(k0, kc, p);
                            (&packed[at..at + NR * kc], NR)
                        }
                    }
                };
                let last = g == last_group && d + 1 == group.len();
                let len = match product.a_in_place {
                    Some(_) => 0,
                    None => (r1 - r0).div_ceil(MR) * MR * kc,
                };
                let packed_a = aligned(&mut packed_a_buffer, len);
                if product.a_in_place.is_none() {
                    // SAFETY: rows `r0..r1` and columns `k0..k0 + kc` of a
                    // are inside its buffer (the contract of `sgemm`).
                    unsafe { pack_a::<MR, T>(product.a, r0, r1 - r0, k0, kc, packed_a) };
                }
                // SAFETY: the contract of `sgemm`; rows `r0..r1` of C are
                // this task's alone.
                unsafe {
                    block::<MR, NR, K, T>(
                        product,
                        r0..r1,
                        (k0, kc, last),
                        (0..panels, panel),
                        (packed_a, MR * kc),
                    )
                };
            }
            PACKED_A.set(packed_a_buffer);
            PACKED_B.set(packed_b);
            if g == last_group {
                finish(r0, r1);
            }
        };
        if threads > 1 {
            team::for_each(bounds.len(), &|i| block(&bounds[i]));
        } else {
            bounds.iter().for_each(block);
        }
    }
}

/// `by_rows`' blocks of rows. Where the rows make one block of at most MC
/// per thread, a thread's time is its block's, so they are cut evenly at
/// multiples of the kernel's row unit, and the last tile of a block runs
/// the kernel of its height: with 12-row tiles and a unit of 4, 64 rows are
/// 2 x (12 + 12 + 8), not 36 + 28 with a 12-row kernel on the 4 left.
/// Else blocks of at most MC rows, taken in turns (`largest_first`).
fn row_blocks<const MR: usize, const NR: usize, K: Kernel<MR, NR>>(
    m: usize,
    threads: usize,
) -> Vec<(usize, usize)> {
    let tiles = m.div_ceil(MR);
    let blocks = (threads * tiles.div_ceil(threads * (K::TUNING.mc / MR))).min(tiles);
    if blocks > threads {
        return largest_first::<MR>(m, blocks);
    }
    let units = m.div_ceil(K::ROW_UNIT);
    (0..blocks)
        .map(|i| {
            let row = |i: usize| (i * units / blocks * K::ROW_UNIT).min(m);
            (row(i), row(i + 1))
        })
        .collect()
}

/// Rows `0..m` in `blocks` blocks of whole tiles of `MR` rows, the larger
/// ones (by a tile) first: threads that take blocks in turns then end
/// within a tile of each other. (Taken in the rows' order, 784x250x256's
/// blocks of 6 and 7 tiles could leave one thread two tiles more than the
/// other, a sixteenth of the product's time on two threads.)
fn largest_first<const MR: usize>(m: usize, blocks: usize) -> Vec<(usize, usize)> {
    let tiles = m.div_ceil(MR);
    let (size, larger) = (tiles / blocks, tiles % blocks);
    let mut first = 0;
    (0..blocks)
        .map(|i| {
            let start = first;
            first += size + usize::from(i < larger);
            (start * MR, (first * MR).min(m))
        })
        .collect()
}

/// The product with the panels of B shared between threads, each packing
/// its own panels a run at a time, depth block by depth block, and walking
/// every block of rows of A (packed once for all, `packed_for_all`) over
/// them: each thread reads a part of B only, and no thread waits for
/// another but for A's packing (a block of rows is finished by the last
/// thread to pass it).
///
/// # Safety
/// The contract of `sgemm`, and no one else touches C meanwhile.
unsafe fn by_panels<const MR: usize, const NR: usize, K: Kernel<MR, NR>, T: Element>(
    product: &Product<'_, T>,
    m: usize,
    blocks_of_k: &[(usize, usize)],
    threads: usize,
    finish: &(dyn Fn(usize, usize) + Sync),
) {
    let (b, n) = (product.b, product.n);
    let panels = n.div_ceil(NR);
    let ranges: Vec<std::ops::Range<usize>> = (0..threads)
        .map(|i| i * panels / threads..(i + 1) * panels / threads)
        .collect();
    // Blocks of at most MC rows, tiles shared evenly between them, and at
    // least one per thread (where there are the tiles), so that threads
    // finish blocks in turns to the end.
    let tiles = m.div_ceil(MR);
    let blocks = tiles.div_ceil(K::TUNING.mc / MR).max(threads.min(tiles));
    let bounds: Vec<(usize, usize)> = (0..blocks)
        .map(|i| {
            let row = |i: usize| (i * tiles / blocks * MR).min(m);
            (row(i), row(i + 1))
        })
        .collect();
    // A block of rows is done when every range has passed it in its last
    // pass (its last run's last depth block): the last task to get there
    // runs `finish` over it (after the others' writes, which its increment
    // acquires).
    let done: Vec<AtomicUsize> = bounds.iter().map(|_| AtomicUsize::new(0)).collect();
    let last_depth = blocks_of_k.len() - 1;
    // The caller's buffer holds A packed, taken for the call: a product
    // that `finish` starts makes its own.
    let k = product.k;
    let mut packed_a_buffer = PACKED_A.take();
    // SAFETY: the contract of `sgemm`.
    let packed_a = unsafe { packed_for_all::<MR, T>(product, m, &mut packed_a_buffer) };
    // Depth block `k0..` of the panels from row `r0` on.
    let rows_of_a = |r0: usize, k0: usize| match product.a_in_place {
        Some(_) => &[][..],
        None => &packed_a[r0 * k + k0 * MR..],
    };
    team::for_each(threads, &|t| {
        let range = ranges[t].clone();
        // The buffer is taken for the task, so that a product started by
        // `finish` makes its own.
        let mut packed_b_buffer = PACKED_B.take().buffer;
        // Passes over the blocks of rows so far: every other one walks
        // them backwards. In the last pass threads then pass a block last
        // in turns, so that each finishes about its share of
        // them (walked all the same way, a thread a little behind the
        // other finished every block, and 784x250x256 with bias and relu
        // took longer: `benches/RESULTS-cpu.md`), and a pass starts on the
        // rows of C the last one ended on, still in cache.
        let mut passes = t;
        // The range's panels a run at a time (`RUN_BYTES`), each run over
        // every depth block, packed, then walked by every block of rows,
        // so that the run and its columns of C stay in cache: packed whole
        // for each depth block, 32x576x16384's panels and C ran from
        // memory (`benches/RESULTS-cpu.md`).
        let deepest = blocks_of_k[0].1;
        let run = (RUN_BYTES / (NR * deepest * size_of::<f32>())).max(K::TUNING.nc_panels);
        let runs = range.len().div_ceil(run);
        for (r, first) in range.clone().step_by(run).enumerate() {
            let panels = first..(first + run).min(range.end);
            for (d, &(k0, kc)) in blocks_of_k.iter().enumerate() {
                let packed: &[f32] = match b {
                    Right::Lies(b) => {
                        let packed = aligned(&mut packed_b_buffer, panels.len() * NR * kc);
                        // SAFETY: rows `k0..k0 + kc` and columns `..n` of b
                        // are inside its buffer (the contract of `sgemm`).
                        unsafe { pack_panels::<NR, T>(b, (k0, kc), panels.clone(), n, packed) };
                        packed
                    }
                    Right::Packed(_) => &[],
                };
                let panel = |p: usize| -> (&[f32], usize) {
                    match b {
                        Right::Lies(_) => {
                            let at = (p - first) * NR * kc;
                            (&packed[at..at + NR * kc], NR)
                        }
                        Right::Packed(all) => packed_before::<NR>(all, product.k, (k0, kc), p),
                    }
                };
                let mut order: Vec<_> = bounds.iter().zip(&done).collect();
                if passes % 2 == 1 {
                    order.reverse();
                }
                passes += 1;
                let last = d == last_depth && r + 1 == runs;
                for (&(r0, r1), done) in order {
                    // SAFETY: the contract of `sgemm`; columns of this
                    // range's panels are this task's alone.
                    unsafe {
                        block::<MR, NR, K, T>(
                            product,
                            r0..r1,
                            (k0, kc, d == last_depth),
                            (panels.clone(), panel),
                            (rows_of_a(r0, k0), MR * k),
                        )
                    };
                    if last && done.fetch_add(1, Ordering::AcqRel) + 1 == threads {
                        finish(r0, r1);
                    }
                }
            }
        }
        PACKED_B.set(PackedB {
            region: None,
            buffer: packed_b_buffer,
        });
    });
    PACKED_A.set(packed_a_buffer);
}

/// A, where it is not read in place, packed into `buffer` by all threads
/// together for `by_panels`, in which every thread reads it all: panels
/// of MR rows, each k deep (a depth block's panel is then a part of it);
/// else nothing. Packed by each thread for itself, it was packed `threads`
/// times over, and a bf16 product took longer than an f32 one whose A is
/// read in place (`benches/RESULTS-cpu.md`).
///
/// # Safety
/// The contract of `sgemm` for `product`, of `m` rows.
unsafe fn packed_for_all<'a, const MR: usize, T: Element>(
    product: &Product<'_, T>,
    m: usize,
    buffer: &'a mut Vec<f32>,
) -> &'a [f32] {
    let k = product.k;
    let packed = match product.a_in_place {
        Some(_) => &mut [],
        None => aligned(buffer, m.div_ceil(MR) * MR * k),
    };
    team::for_each_chunk(packed, MR * k, &|t, panel| {
        // SAFETY: rows `t * MR..` (at most MR of them, up to m) and columns
        // `..k` of a are inside its buffer (the contract of `sgemm`).
        unsafe { pack_a::<MR, T>(product.a, t * MR, MR.min(m - t * MR), 0, k, panel) }
    });
    packed
}

/// Rows `rows` of C over one depth block `(k0, kc)`, the last one if
/// `last` (whose tiles apply the epilogue), and panels `panels` of B (each
/// `panel(p)`: its rows and their distance): each group of `NC_PANELS`
/// panels walked by every tile of rows, read in place or from `packed_a`
/// (the tiles' panels of this depth block packed, `kc` columns of MR
/// values each, the next `stride` values on; empty where A is read in
/// place).
///
/// # Safety
/// The contract of `sgemm`, and no one else touches these rows and panels'
/// columns of C meanwhile.
unsafe fn block<'b, const MR: usize, const NR: usize, K: Kernel<MR, NR>, T: Element>(
    product: &Product<'_, T>,
    rows: std::ops::Range<usize>,
    (k0, kc, last): (usize, usize, bool),
    (panels, panel): (std::ops::Range<usize>, impl Fn(usize) -> (&'b [f32], usize)),
    (packed_a, stride): (&[f32], usize),
) {
    let n = product.n;
    let (r0, mr) = (rows.start, rows.len());
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
                if let Some(a) = product.a_in_place {
                    // SAFETY: `a_in_place`: rows of a are contiguous; the
                    // tile's rows (1 to MR of them), columns `k0..k0 + kc`,
                    // are inside its buffer.
                    let a_rows = unsafe { InPlace::new(a, r0 + t * MR, tile.rows, k0, kc) };
                    // SAFETY: the CPU has K's ISA; the tile lies in C, whose
                    // rows and columns here are this caller's alone.
                    unsafe { K::tile(a_rows, b_rows, b_stride, c, tile) };
                } else {
                    let (a_panel, _) = packed_a[t * stride..t * stride + MR * kc].as_chunks();
                    let a_panel = Packed(a_panel);
                    // SAFETY: as above.
                    unsafe { K::tile(a_panel, b_rows, b_stride, c, tile) };
                }
            }
        }
    }
}

/// About the bytes of B's packed panels that `by_panels` walks every block
/// of rows over at a time, over every depth block: twice a Zen 3 core's
/// L2, far below its L3. Runs of 256 KiB packed a row-major B's rows a few
/// lines at a time, and 64x1152x4096 took longer than with the range
/// packed whole (`benches/RESULTS-cpu.md`).
const RUN_BYTES: usize = 1 << 20;

/// The parallel regions of `by_rows` so far.
static REGIONS: AtomicU64 = AtomicU64::new(0);

/// A thread's packed panels of B, and the region of `by_rows` they were
/// packed for, if any (`by_panels` packs them afresh for each run and depth block).
#[derive(Default)]
struct PackedB {
    region: Option<u64>,
    buffer: Vec<f32>,
}

thread_local! {
    /// Each thread's packed rows of A, kept from call to call: packing
    /// writes every element the microkernel reads, so reuse needs no
    /// clearing. Taken by a task while it runs, as `PACKED_B` is: a
    /// product started by `finish` then makes its own.
    static PACKED_A: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// Each thread's packed panels of B, kept from call to call as
    /// `PACKED_A` is: a fresh zeroed buffer cost 256³ a tenth of its time.
    static PACKED_B: std::cell::Cell<PackedB> = const {
        std::cell::Cell::new(PackedB {
            region: None,
            buffer: Vec::new(),
        })
    };
}

/// `len` elements of `buffer` (grown as needed) from a 64-byte boundary:
/// a row of a packed panel then never straddles two cache lines (a large
/// allocation starts 16 bytes past a page boundary).
fn aligned(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    const LINE: usize = 64 / size_of::<f32>();
    if buffer.len() < len + LINE {
        buffer.resize(len + LINE, 0.0);
    }
    let skip = buffer.as_ptr().align_offset(64).min(LINE);
    &mut buffer[skip..skip + len]
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
