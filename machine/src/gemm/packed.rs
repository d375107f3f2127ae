//! Right operands packed once for many products (`PackedB`): a weight that
//! a compiled graph reads on every run (a linear layer's, an LSTM's
//! recurrent one) laid out in the panels kiln's cores read, so that no
//! product packs it again, and products of a few rows stream it once.
//!
//! - More than `FEW` rows: the cores' loop nest over the panels
//!   (`driver::Right::Packed`).
//! - 1 to `FEW` rows: each row's outputs summed over the panels in
//!   registers, `x(i, l)` broadcast against each panel's row `l`: no sum
//!   across lanes, and each panel one sequential stream. Tiles of 1 row by
//!   4 panels, 2 by 2, 3 or 4 by 1 (6 to 8 accumulators of two vectors
//!   each, enough FMAs in flight); the rows past the first 4 read the same
//!   stretch of panels again from the cache. Each thread takes a fixed
//!   range of the panels, so that at every step of a recurrence a core
//!   reads the same part of the weight (from its own caches where that
//!   part fits them).
//!
//! `unsafe` here is the packing's reads of `b`, the products' reads of the
//! panels and of `a` through its offsets, and their writes into `c`, made
//! safe by `PackedB::new`'s and `sgemm_packed`'s checks.

#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use super::driver::{self, C, Right};
#[cfg(target_arch = "x86_64")]
use super::gemv::{FEW, rows_of};
#[cfg(target_arch = "x86_64")]
use super::lanes::{self, Lanes};
use super::panel;
use super::safe::Matrix;
use super::{Operand, RawFused};
use crate::{Error, Isa};

/// Bytes of panels one thread takes at least in a product of a few rows:
/// two threads took less time than one from 256 KiB of panels, and about
/// as long at 128 KiB (`benches/RESULTS-cpu.md`).
const THREAD_BYTES: usize = 1 << 17;

/// Bytes of panels a stretch holds at most: the rows past the first 4 read
/// it again from L2.
const STRETCH_BYTES: usize = 1 << 17;

/// A `k x n` right operand packed into the panels of `isa`'s core: `NR`
/// columns each (zeros past column `n`), `k` rows of them one after the
/// other.
pub struct PackedB {
    isa: Isa,
    k: usize,
    n: usize,
    /// The panels, from the buffer's first 64-byte boundary (`start`).
    buffer: Vec<f32>,
    start: usize,
}

/// The width of `isa`'s panels, where kiln has a core for it.
fn panel_width(isa: Isa) -> Option<usize> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(super::avx2::NR),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => Some(super::avx512::NR),
        _ => None,
    }
}

impl PackedB {
    /// `b` packed for `isa`'s core; `None` where `isa` has none (the
    /// `gemm` crate's path), or `b` has at most `NARROW` columns, which
    /// stay with the crate as unpacked products do. Every element `b`
    /// reads is checked against its slice first.
    pub fn new(isa: Isa, b: Matrix<'_>) -> Result<Option<PackedB>, Error> {
        b.check("b")?;
        let (k, n) = (b.rows.len(), b.cols.len());
        let Some(nr) = panel_width(isa) else {
            return Ok(None);
        };
        #[cfg(target_arch = "x86_64")]
        if n <= super::tuning::NARROW || k == 0 {
            return Ok(None);
        }
        let too_large = || Error::PackTooLarge { k, n };
        let len = (n.div_ceil(nr).checked_mul(nr))
            .and_then(|width| width.checked_mul(k))
            .filter(|len| *len < usize::MAX - 16)
            .ok_or_else(too_large)?;
        let mut buffer = Vec::new();
        buffer
            .try_reserve_exact(len + 16)
            .map_err(|_| too_large())?;
        buffer.resize(len + 16, 0.0);
        let start = buffer.as_ptr().align_offset(64).min(16);
        let out = &mut buffer[start..start + len];
        // Runs of panels packed on the team's threads: a model's weights
        // are packed when it is compiled, all of it copying, and the
        // compile waits for it.
        #[cfg(target_arch = "x86_64")]
        {
            const RUN: usize = 8;
            let (b, panels) = (b.raw(), n.div_ceil(nr));
            crate::team::for_each_chunk(out, RUN * nr * k, &|i, run| {
                let range = i * RUN..panels.min((i + 1) * RUN);
                // SAFETY: every element of b lies inside its slice (checked
                // above), and `run` holds panels `range`, `k` rows each.
                unsafe {
                    match nr {
                        16 => panel::pack_panels::<16, f32>(b, (0, k), range, n, run),
                        _ => panel::pack_panels::<32, f32>(b, (0, k), range, n, run),
                    }
                }
            });
        }
        Ok(Some(PackedB {
            isa,
            k,
            n,
            buffer,
            start,
        }))
    }

    /// Its rows (`k`).
    pub fn rows(&self) -> usize {
        self.k
    }

    /// Its columns (`n`).
    pub fn cols(&self) -> usize {
        self.n
    }

    /// The path it is packed for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    fn panels(&self) -> &[f32] {
        let nr = panel_width(self.isa).unwrap_or(1);
        &self.buffer[self.start..self.start + self.n.div_ceil(nr) * nr * self.k]
    }
}

#[cfg(target_arch = "x86_64")]
/// `c = epilogue(a b)` for `b` packed for `b.isa`'s core: a few rows
/// streamed over the panels, more by the core's loop nest; `finish(0, m)`
/// after the few, on each block of rows as it is done by the core.
///
/// # Safety
/// `b.isa` runs here; `a(i, l)` for `i < m`, `l < k` lie inside a live
/// buffer, `c` holds `m * n` values, and a bias of `epilogue` a value for
/// each row or column it is added along.
pub(super) unsafe fn gemm(
    a: Operand,
    b: &PackedB,
    c: &mut [f32],
    epilogue: RawFused,
    finish: &(dyn Fn(usize, usize) + Sync),
) {
    let (m, k, n) = (c.len() / b.n.max(1), b.k, b.n);
    if m == 0 || n == 0 {
        finish(0, m);
        return;
    }
    if m > FEW {
        let threads = super::threads_for(m * n * k);
        let panels = Right::Packed(b.panels());
        // SAFETY: the contract of this function; the panels are the
        // core's, `k` rows each.
        unsafe { driver::on_core(b.isa, (m, n, k), a, panels, c, threads, epilogue, finish) };
        return;
    }
    // SAFETY: a's elements lie inside a live buffer (the contract of this
    // function).
    let x = unsafe { rows_of(a, m, k) };
    let threads = (size_of_val(b.panels()) / THREAD_BYTES).clamp(1, crate::team::threads());
    let rows = Rows {
        x: &x,
        m,
        k,
        n,
        panels: b.panels(),
        c: C(c.as_mut_ptr()),
        epilogue,
    };
    // SAFETY: the contract of this function.
    unsafe {
        match b.isa {
            Isa::Avx2 => rows.run(threads, streamed_avx2, super::avx2::NR),
            _ => rows.run(threads, streamed_avx512, super::avx512::NR),
        }
    };
    finish(0, m);
}

/// A product of a few rows over packed panels: what every task reads, and
/// where it writes.
#[cfg(target_arch = "x86_64")]
struct Rows<'a> {
    /// The rows of `a`, `k` each.
    x: &'a [f32],
    m: usize,
    k: usize,
    n: usize,
    panels: &'a [f32],
    c: C,
    epilogue: RawFused,
}

/// Panels `range` of a `Rows` product, in one ISA's lanes.
#[cfg(target_arch = "x86_64")]
type Streamed = unsafe fn(&Rows<'_>, std::ops::Range<usize>);

/// `Rows::stream` in 8 lanes.
///
/// # Safety
/// The CPU has AVX2 and FMA; the product's panels are 16 wide.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn streamed_avx2(rows: &Rows<'_>, range: std::ops::Range<usize>) {
    // SAFETY: the contract of this function.
    unsafe { rows.stream::<lanes::Avx2>(range) }
}

/// `Rows::stream` in 16 lanes.
///
/// # Safety
/// The CPU has AVX-512; the product's panels are 32 wide.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn streamed_avx512(rows: &Rows<'_>, range: std::ops::Range<usize>) {
    // SAFETY: the contract of this function.
    unsafe { rows.stream::<lanes::Avx512>(range) }
}

#[cfg(target_arch = "x86_64")]
impl Rows<'_> {
    /// Every panel, in `threads` fixed ranges of them, one per task.
    ///
    /// # Safety
    /// `streamed` runs on this CPU and reads panels as wide as the
    /// product's; the contract of `gemm`.
    unsafe fn run(&self, threads: usize, streamed: Streamed, width: usize) {
        let panels = self.n.div_ceil(width);
        let per = panels.div_ceil(threads);
        let task = |t: usize| {
            let range = t * per..panels.min((t + 1) * per);
            if !range.is_empty() {
                // SAFETY: the contract of this function; tasks write the
                // columns of their own panels.
                unsafe { streamed(self, range) }
            }
        };
        match threads {
            1 => task(0),
            _ => crate::team::for_each(threads, &task),
        }
    }

    /// Panels `range`, in stretches of at most `STRETCH_BYTES`, each
    /// walked by every group of up to 4 rows in tiles (see the module's
    /// doc).
    ///
    /// # Safety
    /// `L` runs on this CPU, and the panels are `2 * L::LANES` wide.
    #[inline(always)]
    unsafe fn stream<L: Lanes>(&self, range: std::ops::Range<usize>) {
        let panel_bytes = 2 * L::LANES * self.k * size_of::<f32>();
        let stretch = (STRETCH_BYTES / panel_bytes).max(4) / 4 * 4;
        for s0 in range.clone().step_by(stretch) {
            let end = (s0 + stretch).min(range.end);
            for i in (0..self.m).step_by(4) {
                let mut p = s0;
                while p < end {
                    // SAFETY: rows i.., panels p.. of the product (the
                    // tile's width no more than those left); `L` runs.
                    p += unsafe {
                        match ((self.m - i).min(4), end - p) {
                            (1, 4..) => self.tile::<L, 1, 4>(i, p),
                            (1, _) => self.tile::<L, 1, 1>(i, p),
                            (2, 2..) => self.tile::<L, 2, 2>(i, p),
                            (2, _) => self.tile::<L, 2, 1>(i, p),
                            (3, _) => self.tile::<L, 3, 1>(i, p),
                            _ => self.tile::<L, 4, 1>(i, p),
                        }
                    };
                }
            }
        }
    }

    /// Rows `i..i + R` by panels `p..p + P`, summed in registers over the
    /// whole depth and stored through the epilogue; returns `P`.
    ///
    /// # Safety
    /// `L` runs on this CPU; the rows and panels are the product's, and
    /// the panels `2 * L::LANES` wide.
    #[inline(always)]
    unsafe fn tile<L: Lanes, const R: usize, const P: usize>(&self, i: usize, p: usize) -> usize {
        let (k, n, nr) = (self.k, self.n, 2 * L::LANES);
        // SAFETY (every intrinsic and access): `L` runs here; rows
        // `i..i + R` of x hold `k` elements each, and panels `p..p + P`
        // `k` rows of `nr`.
        unsafe {
            let zero = L::zero();
            let mut s = [[[zero; 2]; P]; R];
            let x = self.x.as_ptr().add(i * k);
            let b = self.panels.as_ptr().add(p * k * nr);
            for l in 0..k {
                let mut v = [[zero; 2]; P];
                for (q, v) in v.iter_mut().enumerate() {
                    let at = b.add(q * k * nr + l * nr);
                    *v = [L::load(at), L::load(at.add(L::LANES))];
                }
                for (r, s) in s.iter_mut().enumerate() {
                    let a = L::splat(*x.add(r * k + l));
                    for (s, v) in s.iter_mut().zip(&v) {
                        s[0] = L::fma(a, v[0], s[0]);
                        s[1] = L::fma(a, v[1], s[1]);
                    }
                }
            }
            // R x P panels of at most 32 columns (the tiles `stream` takes).
            const { assert!(R * P * 32 <= 128) };
            let mut out = [0.0f32; 128];
            for (r, s) in s.iter().enumerate() {
                for (q, s) in s.iter().enumerate() {
                    let at = out.as_mut_ptr().add((r * P + q) * nr);
                    L::store(at, s[0]);
                    L::store(at.add(L::LANES), s[1]);
                }
            }
            for r in 0..R {
                for q in 0..P {
                    let j0 = (p + q) * nr;
                    for c in 0..nr.min(n - j0) {
                        let v = out[(r * P + q) * nr + c];
                        *self.c.at((i + r) * n + j0 + c) = self.epilogue.apply(v, i + r, j0 + c);
                    }
                }
            }
        }
        P
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
