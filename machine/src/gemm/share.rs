//! How threads share a product on kiln's GEMM cores (`driver::sgemm`
//! chooses): by rows (`by_rows`: each takes blocks of rows and walks every
//! panel of B, all of which it packs for itself) or by panels (`by_panels`:
//! each packs its own panels of B a run at a time and walks every block of
//! rows over them, packing the rows of A it does not read in place, with no
//! barrier between depth blocks), and the packed operands each thread
//! keeps from call to call.
//!
//! `unsafe` here is the calls of the packing, of the reads of B in place
//! and of the loop nest's `block`, whose contracts these keep.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::driver::{Kernel, Product, Right, block};
use super::panel::{aligned, in_place_rows, pack_panels, packed_before};
use super::{Element, Operand};
use crate::team;

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
pub(super) unsafe fn by_rows<const MR: usize, const NR: usize, K: Kernel<MR, NR>, T: Element>(
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
            let mut packed_a = PACKED_A.take();
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
                // SAFETY: the contract of `sgemm`; rows `r0..r1` of C are
                // this task's alone.
                unsafe {
                    block::<MR, NR, K, T>(
                        product,
                        r0..r1,
                        (k0, kc, last),
                        (0..panels, panel),
                        &mut packed_a,
                    )
                };
            }
            PACKED_A.set(packed_a);
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

/// `by_panels`' blocks of rows: at most `mc` rows each, whole tiles of
/// `MR` rows shared evenly between them, and at least one per thread
/// (where there are the tiles), so that threads finish blocks in turns to
/// the end.
fn even_blocks<const MR: usize>(m: usize, mc: usize, threads: usize) -> Vec<(usize, usize)> {
    let tiles = m.div_ceil(MR);
    let blocks = tiles.div_ceil(mc / MR).max(threads.min(tiles));
    (0..blocks)
        .map(|i| {
            let row = |i: usize| (i * tiles / blocks * MR).min(m);
            (row(i), row(i + 1))
        })
        .collect()
}

/// The product with the panels of B shared between threads, each packing
/// its own panels a run at a time, depth block by depth block, and walking
/// every block of rows of A over them (each packing the rows it does not
/// read in place): each thread reads a part of B only, and no thread waits
/// for another (a block of rows is finished by the last thread to pass
/// it). (A packed once by all threads together, each thread read all of
/// it from L3, where packing its rows left them in L2: bf16 250x784x256
/// took longer, `benches/RESULTS-cpu.md`.)
///
/// # Safety
/// The contract of `sgemm`, and no one else touches C meanwhile.
pub(super) unsafe fn by_panels<const MR: usize, const NR: usize, K: Kernel<MR, NR>, T: Element>(
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
    // Every thread passes every block of rows (`done`), so every range
    // holds panels (`sgemm` shares panels only where each thread has two).
    debug_assert!(ranges.iter().all(|r| !r.is_empty()));
    let bounds = even_blocks::<MR>(m, K::TUNING.mc, threads);
    // A block of rows is done when every range has passed it in its last
    // pass (its last run's last depth block): the last task to get there
    // runs `finish` over it (after the others' writes, which its increment
    // acquires).
    let done: Vec<AtomicUsize> = bounds.iter().map(|_| AtomicUsize::new(0)).collect();
    let last_depth = blocks_of_k.len() - 1;
    team::for_each(threads, &|t| {
        let range = ranges[t].clone();
        // Both buffers are taken for the task, so that a product started
        // by `finish` makes its own.
        let mut packed_b_buffer = PACKED_B.take().buffer;
        let mut packed_a = PACKED_A.take();
        // The range's panels a run at a time (`RUN_BYTES`), each run over
        // every depth block, packed, then walked by every block of rows,
        // so that the run and its columns of C stay in cache: packed whole
        // for each depth block, 32x576x16384's panels and C ran from
        // memory (`benches/RESULTS-cpu.md`).
        let deepest = blocks_of_k[0].1;
        let run = (RUN_BYTES / (NR * deepest * size_of::<f32>()))
            .max(1)
            .next_multiple_of(K::TUNING.nc_panels);
        let runs = range.len().div_ceil(run);
        // Passes over the blocks of rows: every other one walks them
        // backwards, counted from the last, which walks them forwards on
        // every other thread. In the last pass threads then pass a block
        // last in turns, so that each finishes about its share of
        // them (walked all the same way, a thread a little behind the
        // other finished every block, and 784x250x256 with bias and relu
        // took longer: `benches/RESULTS-cpu.md`), and a pass starts on the
        // rows of C the last one ended on, still in cache.
        let mut passes_left = runs * blocks_of_k.len();
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
                passes_left -= 1;
                let mut order: Vec<_> = bounds.iter().zip(&done).collect();
                if (t + passes_left) % 2 == 1 {
                    order.reverse();
                }
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
                            &mut packed_a,
                        )
                    };
                    if last && done.fetch_add(1, Ordering::AcqRel) + 1 == threads {
                        finish(r0, r1);
                    }
                }
            }
        }
        PACKED_A.set(packed_a);
        PACKED_B.set(PackedB {
            region: None,
            buffer: packed_b_buffer,
        });
    });
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
