//! kiln's bf16 GEMM core, on AMX: `c = a b` for bf16 `a` and `b`, each
//! product exact and their sums in f32, as a widened product's are (the
//! order of the additions aside; and AMX reads subnormal bf16 operands as
//! zero and flushes subnormal sums to zero).
//!
//! An AMX tile multiply (`tdpbf16ps`) takes a 16 x 32 tile of A, a tile of
//! B holding 32 rows of 16 columns as 16 rows of pairs, and adds the
//! product to a 16 x 16 tile of f32: 8,192 multiply-adds an instruction.
//! Where a CPU has AMX, that is several times its AVX-512 FMAs' rate, and
//! AVX512-BF16's `vdpbf16ps` is not (`benches/RESULTS-cpu.md`).
//!
//! Both operands are packed first, zero-padded to whole tiles: A row-major
//! with rows of a multiple of 32 values; B in panels of 32 columns, for
//! each pair of its rows `2q, 2q + 1` 32 words each holding `b[2q][j]` in
//! its low half and `b[2q + 1][j]` in its high half. Each task takes 32
//! rows (two tiles of A) and walks the panels, summing four tiles of C in
//! registers over the whole depth, and stores them through a buffer to c.
//!
//! A process asks Linux for the tiles' state once (`arch_prctl`); each task
//! loads the tiles' shapes, and releases them when done.
//!
//! `unsafe` here is the tiles' instructions (in `asm!`, as Rust's AMX
//! intrinsics are not stable) over the packed buffers, and the stores into
//! c.

use std::arch::asm;
use std::arch::x86_64::{
    _mm256_loadu_si256, _mm512_cvtepu16_epi32, _mm512_or_si512, _mm512_setzero_si512,
    _mm512_slli_epi32, _mm512_storeu_si512,
};
use std::cell::Cell;
use std::sync::OnceLock;

use super::Operand;
use crate::{Error, team};

/// Rows of a tile of A or C.
const TILE_ROWS: usize = 16;
/// bf16 values of a row of a tile of A (64 bytes).
const TILE_K: usize = 32;
/// Columns of a panel of B: two tiles of C.
const NR: usize = 32;
/// Rows of a task: two tiles of C.
const MR: usize = 32;

/// Whether this CPU runs the core: it has AMX-TILE and AMX-BF16, and
/// Linux lets this process use the tiles (asked once).
pub(super) fn available() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        let leaf = std::arch::x86_64::__cpuid_count(7, 0);
        let (tile, bf16) = (leaf.edx >> 24 & 1 == 1, leaf.edx >> 22 & 1 == 1);
        tile && bf16 && is_x86_feature_detected!("avx512f") && granted()
    })
}

/// Asks Linux for the tiles' state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`); true where it is given.
#[cfg(target_os = "linux")]
fn granted() -> bool {
    const ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the system call reads two numbers and changes only what the
    // kernel saves of this process's registers; it clobbers rcx and r11.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn granted() -> bool {
    false
}

/// The tiles' shapes (`ldtilecfg`'s 64 bytes): palette 1, every one of the
/// 8 tiles 16 rows of 64 bytes. Tiles 0-3 hold C, 4-5 A, 6-7 B.
#[repr(C, align(64))]
struct Config([u8; 64]);

impl Config {
    fn new() -> Config {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        for t in 0..8 {
            bytes[16 + 2 * t] = 64;
            bytes[48 + t] = TILE_ROWS as u8;
        }
        Config(bytes)
    }
}

/// `c = a b` for `a: m x k`, `b: k x n` of bf16 bits, `c` row-major
/// `m x n`, on `threads` threads, calling `finish(r0, r1)` on each block of
/// rows as it is done.
///
/// # Safety
/// The CPU runs the core (`available`); `a(i, l)` for `i < m, l < k` and
/// `b(l, j)` for `l < k, j < n` lie inside live buffers; `c` holds
/// `m * n` values.
pub(super) unsafe fn gemm(
    (m, n, k): (usize, usize, usize),
    (a, b): (Operand<u16>, Operand<u16>),
    c: &mut [f32],
    threads: usize,
    finish: &(dyn Fn(usize, usize) + Sync),
) -> Result<(), Error> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        c.fill(0.0);
        finish(0, m);
        return Ok(());
    }
    let (blocks, panels) = (m.div_ceil(MR), n.div_ceil(NR));
    let too_large = Error::TooLarge { m, k, n };
    let kp = k
        .checked_next_multiple_of(TILE_K)
        .ok_or(too_large.clone())?;
    let a_len = (blocks * MR).checked_mul(kp).ok_or(too_large.clone())?;
    let b_len = (panels * NR).checked_mul(kp / 2).ok_or(too_large.clone())?;
    // The packed operands, kept from call to call on the calling thread:
    // packing writes every element, padding included, so that reuse needs
    // no clearing, and a fresh allocation's page faults are paid once.
    let (mut packed_a, mut packed_b) = (PACKED_A.take(), PACKED_B.take());
    let reserve_a = packed_a.try_reserve(a_len.saturating_sub(packed_a.len()));
    let reserve_b = packed_b.try_reserve(b_len.saturating_sub(packed_b.len()));
    if reserve_a.is_err() || reserve_b.is_err() {
        return Err(too_large);
    }
    packed_a.resize(a_len, 0);
    packed_b.resize(b_len, 0);
    each_chunk(threads, &mut packed_a, MR * kp, &|t, rows| {
        // SAFETY: the block's rows are rows of a.
        unsafe { pack_a(a, (m, k), t * MR, rows) }
    });
    each_chunk(threads, &mut packed_b, (kp / 2) * NR, &|p, panel| {
        // SAFETY: the panel's columns are columns of b, its rows b's rows.
        unsafe { pack_b(b, (k, n), p * NR, panel) }
    });
    let out = Shared(c.as_mut_ptr());
    let task = |t: usize| {
        let config = Config::new();
        // SAFETY: the CPU runs AMX and the process may use the tiles; the
        // configuration is 64 readable bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack)) };
        let (r0, r1) = (t * MR, (t * MR + MR).min(m));
        let rows = &packed_a[r0 * kp..(r0 + MR) * kp];
        // Every value of it is stored over by the tiles.
        let mut tile = [[0f32; NR]; MR];
        for p in 0..panels {
            let panel = &packed_b[p * (kp / 2) * NR..(p + 1) * (kp / 2) * NR];
            // SAFETY: the tiles are configured; `rows` holds 32 rows of
            // `kp` values and `panel` `kp / 2` rows of 32 words.
            unsafe { product(rows, panel, kp, &mut tile) };
            let cols = NR.min(n - p * NR);
            for (i, row) in tile.iter().enumerate().take(r1 - r0) {
                // SAFETY: row r0 + i of c, columns p * NR.., inside c and
                // written by this task alone.
                let to =
                    unsafe { std::slice::from_raw_parts_mut(out.at((r0 + i) * n + p * NR), cols) };
                to.copy_from_slice(&row[..cols]);
            }
        }
        // SAFETY: the tiles were configured by this task.
        unsafe { asm!("tilerelease", options(nostack)) };
        finish(r0, r1);
    };
    match threads {
        1 => (0..blocks).for_each(task),
        _ => team::for_each(blocks, &task),
    }
    PACKED_A.set(packed_a);
    PACKED_B.set(packed_b);
    Ok(())
}

/// `task(i, chunk)` on each chunk of `chunk` elements of `data`: on the
/// caller where one thread is asked for, across the team else.
fn each_chunk<T: Send>(
    threads: usize,
    data: &mut [T],
    chunk: usize,
    task: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    match threads {
        1 => data
            .chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| task(i, c)),
        _ => team::for_each_chunk(data, chunk, task),
    }
}

thread_local! {
    /// The calling thread's packed A, kept from call to call (taken while
    /// a call runs: a product started by `finish` makes its own).
    static PACKED_A: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
    /// The calling thread's packed B, as `PACKED_A`.
    static PACKED_B: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
}

/// The product's start, shared by the tasks, each of which writes rows of
/// its own.
struct Shared(*mut f32);

// SAFETY: every task writes disjoint rows through it, while `gemm`'s caller
// keeps c borrowed.
unsafe impl Sync for Shared {}

impl Shared {
    fn at(&self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// Rows `i0..i0 + MR` of `a` (`m x k`) into `rows`, `kp` values each,
/// zero past column `k` and row `m`.
///
/// # Safety
/// Every element of `a` lies inside a live buffer.
unsafe fn pack_a(a: Operand<u16>, (m, k): (usize, usize), i0: usize, rows: &mut [u16]) {
    let kp = rows.len() / MR;
    for (i, row) in rows.chunks_exact_mut(kp).enumerate() {
        let (values, padding) = row.split_at_mut(k);
        if i0 + i >= m {
            values.fill(0);
        } else if !a.tabled() && a.cols == 1 {
            // SAFETY: row i0 + i of a holds k values, inside its buffer.
            let from =
                unsafe { std::slice::from_raw_parts(a.ptr.wrapping_offset(a.row(i0 + i)), k) };
            values.copy_from_slice(from);
        } else {
            for (l, x) in values.iter_mut().enumerate() {
                // SAFETY: element (i0 + i, l) of a, inside its buffer.
                *x = unsafe { *a.ptr.wrapping_offset(a.row(i0 + i) + a.col(l)) };
            }
        }
        padding.fill(0);
    }
}

/// Packs columns `j0..j0 + NR` of `b` (`k x n`) into `panel`: for each
/// pair of rows, `NR` words, the upper row in the high half; zero past `n`
/// and past row `k`. Rows of unit column stride, 32 columns at a time, in
/// vectors; others value by value.
///
/// # Safety
/// The CPU has AVX-512; every element of `b` lies inside a live buffer.
#[target_feature(enable = "avx512f")]
unsafe fn pack_b(b: Operand<u16>, (k, n): (usize, usize), j0: usize, panel: &mut [u32]) {
    let cols = NR.min(n - j0);
    let vectors = cols == NR && !b.tabled() && b.cols == 1;
    // SAFETY: element (l, j) of b, `l < k` and `j < n`.
    let at = |l: usize, j: usize| unsafe { b.ptr.wrapping_offset(b.row(l) + b.col(j0 + j)) };
    let (pairs, padding) = panel.split_at_mut(k.div_ceil(2) * NR);
    padding.fill(0);
    for (q, words) in pairs.chunks_exact_mut(NR).enumerate() {
        let (low, high) = (at(2 * q, 0), (2 * q + 1 < k).then(|| at(2 * q + 1, 0)));
        if vectors {
            for half in (0..NR).step_by(16) {
                // SAFETY: 16 values of each row from column j0 + half,
                // inside b's buffer; 16 words of the panel's row.
                unsafe {
                    let widen = |p: *const u16| {
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(half).cast()))
                    };
                    let high = high.map_or(_mm512_setzero_si512(), widen);
                    let pair = _mm512_or_si512(widen(low), _mm512_slli_epi32::<16>(high));
                    _mm512_storeu_si512(words.as_mut_ptr().add(half).cast(), pair);
                }
            }
            continue;
        }
        let (words, padding) = words.split_at_mut(cols);
        padding.fill(0);
        for (j, word) in words.iter_mut().enumerate() {
            // SAFETY: column j of rows 2q and 2q + 1, inside b's buffer.
            let value = |l: usize| unsafe { u32::from(*at(l, j)) };
            let high = if 2 * q + 1 < k { value(2 * q + 1) } else { 0 };
            *word = value(2 * q) | high << 16;
        }
    }
}

/// The 32 x 32 product of `rows` (32 rows of `kp` bf16) and `panel` (`kp /
/// 2` rows of 32 words), into `tile`.
///
/// # Safety
/// The tiles are configured (`Config`) on this thread.
unsafe fn product(rows: &[u16], panel: &[u32], kp: usize, tile: &mut [[f32; NR]; MR]) {
    let (a, b, c) = (rows.as_ptr(), panel.as_ptr(), tile.as_mut_ptr());
    let (a_stride, b_stride, c_stride) = (kp * 2, NR * 4, NR * 4);
    // SAFETY: every load reads 16 rows of 64 bytes inside `rows` (two tiles
    // of 16 rows, at value `l` of each row, `l + 32 <= kp`) or `panel` (16
    // pairs from pair `l / 2`, each half of a row of 32 words); the stores
    // write `tile`'s 32 rows of 128 bytes.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack)
        );
        for l in (0..kp).step_by(TILE_K) {
            let (a0, a1) = (a.add(l), a.add(TILE_ROWS * kp + l));
            let (b0, b1) = (b.add(l / 2 * NR), b.add(l / 2 * NR + NR / 2));
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0,
                a1 = in(reg) a1,
                b0 = in(reg) b0,
                b1 = in(reg) b1,
                sa = in(reg) a_stride,
                sb = in(reg) b_stride,
                options(nostack, readonly),
            );
        }
        let c0 = c.cast::<f32>();
        asm!(
            "tilestored [{c0} + {sc}*1], tmm0",
            "tilestored [{c1} + {sc}*1], tmm1",
            "tilestored [{c2} + {sc}*1], tmm2",
            "tilestored [{c3} + {sc}*1], tmm3",
            c0 = in(reg) c0,
            c1 = in(reg) c0.add(NR / 2),
            c2 = in(reg) c0.add(TILE_ROWS * NR),
            c3 = in(reg) c0.add(TILE_ROWS * NR + NR / 2),
            sc = in(reg) c_stride,
            options(nostack),
        );
    }
}
