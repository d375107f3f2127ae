//! The operands of a micro-kernel: panels of B packed `NR` columns wide,
//! and a tile's rows of A, packed `MR` to a column or read where they lie.
//! ISA-independent: the micro-kernels read them through `PanelA` and plain
//! slices. Packing widens bf16 operands to f32 (`Element`).
//!
//! `unsafe` here is the reads through the caller's strides and pointers.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    _MM_HINT_T0, _MM_TRANSPOSE4_PS, _mm_castps_si128, _mm_prefetch, _mm_srli_si128,
    _mm_storel_epi64, _mm_storeu_ps, _mm_unpackhi_ps, _mm_unpacklo_ps,
};

use super::{Element, Operand};

/// Panels `p0..` of rows `k0..k0 + kc` of b, as many as `out` holds, one
/// after the other: panel `p` holds columns `p * NR..` up to `n`, `kc x NR`
/// row-major, zero past column `n`.
///
/// # Safety
/// Those elements of b must lie inside its buffer.
pub(super) unsafe fn pack_b<const NR: usize, T: Element>(
    b: Operand<T>,
    (k0, kc): (usize, usize),
    p0: usize,
    n: usize,
    out: &mut [f32],
) {
    if b.tabled() {
        // SAFETY: the contract of this function.
        unsafe { pack_b_tabled::<NR, T>(b, (k0, kc), p0, n, out) };
        return;
    }
    let first = b
        .ptr
        .wrapping_offset(k0 as isize * b.rows + (p0 * NR) as isize * b.cols);
    if b.cols == 1 {
        // Rows of b contiguous: each read once, in order, its stretch of
        // every panel written (a panel at a time, each row a line apart,
        // read rows a few KiB apart and made packing 1024³ cost more:
        // `benches/RESULTS-cpu.md`).
        for l in 0..kc {
            let row = first.wrapping_offset(l as isize * b.rows);
            for (q, panel) in out.chunks_exact_mut(NR * kc).enumerate() {
                let cols = NR.min(n - (p0 + q) * NR);
                let to = &mut panel[l * NR..(l + 1) * NR];
                // SAFETY: elements (k0 + l, (p0 + q) * NR..) of b, `cols` of
                // them, adjacent.
                let from = unsafe { std::slice::from_raw_parts(row.add(q * NR), cols) };
                if let (Ok(to), true) = (<&mut [f32; NR]>::try_from(&mut *to), cols == NR) {
                    // SAFETY: `cols == NR` of them.
                    unsafe { widen_run(from.as_ptr(), to) };
                } else {
                    for (x, &y) in to.iter_mut().zip(from) {
                        *x = y.to_f32();
                    }
                    to[cols..].fill(0.0);
                }
            }
        }
        return;
    }
    for (q, panel) in out.chunks_exact_mut(NR * kc).enumerate() {
        let cols = NR.min(n - (p0 + q) * NR);
        let first = first.wrapping_offset((q * NR) as isize * b.cols);
        let (rows, _) = panel.as_chunks_mut::<NR>();
        if b.rows == 1 {
            // SAFETY: elements (k0.., (p0 + q) * NR..) of b, `kc x cols` of
            // them (the contract of this function).
            unsafe { transpose_into::<NR, T>(first, b.cols, kc, cols, rows) };
        } else {
            for (l, row) in rows.iter_mut().enumerate() {
                let start = first.wrapping_offset(l as isize * b.rows);
                for (j, x) in row[..cols].iter_mut().enumerate() {
                    // SAFETY: element (k0 + l, (p0 + q) * NR + j) of b.
                    *x = unsafe { *start.offset(j as isize * b.cols) }.to_f32();
                }
                row[cols..].fill(0.0);
            }
        }
    }
}

/// `N` adjacent elements from `from` as f32 in `to`, four at a time in SSE
/// registers.
///
/// # Safety
/// The `N` elements lie inside a live buffer.
#[inline(always)]
unsafe fn widen_run<T: Element, const N: usize>(from: *const T, to: &mut [f32; N]) {
    let (quads, rest) = to.as_chunks_mut::<4>();
    for (q, quad) in quads.iter_mut().enumerate() {
        // SAFETY: elements `4q..4q + 4` of the `N`; `quad` holds four.
        unsafe { _mm_storeu_ps(quad.as_mut_ptr(), T::load4(from.add(4 * q))) };
    }
    for (i, x) in rest.iter_mut().enumerate() {
        // SAFETY: one of the `N` past the whole fours.
        *x = unsafe { *from.add(N / 4 * 4 + i) }.to_f32();
    }
}

/// Rows `l < kc` of a panel from `cols` contiguous runs of an operand
/// (columns of b stored transposed, rows of a stored row-major), run `j`
/// from `first + j * stride`, zero past run `cols`: 4 x 4 blocks turned in
/// SSE registers, four rows of the panel at a time. (Element by element,
/// every element was a store to its own line of the panel, which at 256
/// deep fills L1 and was evicted before the next run, and products that
/// pack B transposed or A took longer: `benches/RESULTS-cpu.md`.)
///
/// # Safety
/// Element `l` of each of the `cols` runs lies inside its operand's buffer
/// for `l < kc`; `cols <= NR`, and `rows` holds `kc` rows.
unsafe fn transpose_into<const NR: usize, T: Element>(
    first: *const T,
    stride: isize,
    kc: usize,
    cols: usize,
    rows: &mut [[f32; NR]],
) {
    debug_assert!(cols <= NR && rows.len() == kc);
    let column = |j: usize| first.wrapping_offset(j as isize * stride);
    let (blocks, _) = rows.as_chunks_mut::<4>();
    for (l0, block) in (0..kc).step_by(4).zip(blocks) {
        let mut j = 0;
        while j + 4 <= cols {
            // SAFETY: elements `l0..l0 + 4` of columns `j..j + 4` (the
            // contract of this function); `block`'s rows hold `j + 4 <= NR`
            // elements.
            unsafe {
                let [mut r0, mut r1, mut r2, mut r3] =
                    std::array::from_fn(|c| T::load4(column(j + c).add(l0)));
                _MM_TRANSPOSE4_PS(&mut r0, &mut r1, &mut r2, &mut r3);
                for (row, r) in block.iter_mut().zip([r0, r1, r2, r3]) {
                    _mm_storeu_ps(row.as_mut_ptr().add(j), r);
                }
            }
            j += 4;
        }
        if cols - j == 2 {
            // Two runs past the last whole four (a 6-row panel of A, a
            // panel of B's last 2, 6, 10 or 14 columns): interleaved in SSE
            // registers, two elements stored to each of the block's rows.
            // SAFETY: elements `l0..l0 + 4` of columns `j` and `j + 1`;
            // `block`'s rows hold `j + 2 <= NR` elements (`movq` stores
            // need no alignment).
            unsafe {
                let (r0, r1) = (T::load4(column(j).add(l0)), T::load4(column(j + 1).add(l0)));
                let low = _mm_castps_si128(_mm_unpacklo_ps(r0, r1));
                let high = _mm_castps_si128(_mm_unpackhi_ps(r0, r1));
                let halves = [
                    low,
                    _mm_srli_si128::<8>(low),
                    high,
                    _mm_srli_si128::<8>(high),
                ];
                for (row, half) in block.iter_mut().zip(halves) {
                    _mm_storel_epi64(row.as_mut_ptr().add(j).cast(), half);
                }
            }
            j += 2;
        }
        for (i, row) in block.iter_mut().enumerate() {
            for (c, x) in row[j..cols].iter_mut().enumerate() {
                // SAFETY: element `l0 + i` of column `j + c`.
                *x = unsafe { *column(j + c).add(l0 + i) }.to_f32();
            }
        }
    }
    let whole = kc / 4 * 4;
    for (i, row) in rows[whole..].iter_mut().enumerate() {
        for (c, x) in row[..cols].iter_mut().enumerate() {
            // SAFETY: element `whole + i` of column `c`.
            *x = unsafe { *column(c).add(whole + i) }.to_f32();
        }
    }
    for row in rows.iter_mut() {
        row[cols..].fill(0.0);
    }
}

/// Rows `k0..k0 + kc` of panel `p` of B packed before (`Right::Packed`,
/// each panel `k` rows of `NR`), and their distance.
pub(super) fn packed_before<const NR: usize>(
    all: &[f32],
    k: usize,
    (k0, kc): (usize, usize),
    p: usize,
) -> (&[f32], usize) {
    let at = (p * k + k0) * NR;
    (&all[at..at + kc * NR], NR)
}

/// Rows `k0..k0 + kc` of panel `p` of B where they lie in b, and their
/// distance.
///
/// # Safety
/// Rows `k0..k0 + kc` of b lie in one buffer that lives and is not written
/// for `'a`, and columns `p * NR..(p + 1) * NR` inside each (`p < n / NR`).
pub(super) unsafe fn in_place_rows<'a, const NR: usize>(
    b: Operand,
    (k0, kc): (usize, usize),
    p: usize,
) -> (&'a [f32], usize) {
    let stride = b.rows as usize;
    // SAFETY: the contract of this function; the slice runs from the
    // first of those elements to the last.
    let rows = unsafe {
        std::slice::from_raw_parts(
            b.ptr.offset(k0 as isize * b.rows + (p * NR) as isize),
            (kc - 1) * stride + NR,
        )
    };
    (rows, stride)
}

/// Panels `range` of b's depth block `(k0, kc)`, each `kc x NR`, one after
/// the other in `out`, `PACK_PANELS` at a time.
///
/// # Safety
/// Rows `k0..k0 + kc` and columns `..n` of b lie inside its buffer;
/// `range` holds panels of b (`range.end <= n.div_ceil(NR)`), and `out`
/// holds exactly those, `range.len() * NR * kc` elements.
pub(super) unsafe fn pack_panels<const NR: usize, T: Element>(
    b: Operand<T>,
    (k0, kc): (usize, usize),
    range: std::ops::Range<usize>,
    n: usize,
    out: &mut [f32],
) {
    let runs = out.chunks_mut(PACK_PANELS * NR * kc);
    for (run, p) in runs.zip(range.step_by(PACK_PANELS)) {
        // SAFETY: the contract of this function.
        unsafe { pack_b::<NR, T>(b, (k0, kc), p, n, run) };
    }
}

/// Panels of B packed together, row by row of B: a few lines of each row
/// read at once, and as many written.
const PACK_PANELS: usize = 8;

/// `len` elements of `buffer` (grown as needed) from a 64-byte boundary:
/// a row of a packed panel then never straddles two cache lines (a large
/// allocation starts 16 bytes past a page boundary).
pub(super) fn aligned(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    const LINE: usize = 64 / size_of::<f32>();
    if buffer.len() < len + LINE {
        buffer.resize(len + LINE, 0.0);
    }
    let skip = buffer.as_ptr().align_offset(64).min(LINE);
    &mut buffer[skip..skip + len]
}

/// `pack_b` for an operand read through tables: each panel row by row,
/// its `NR` columns copied as one run where their offsets are consecutive
/// (a panel within one row of a convolution's output positions), else one
/// by one.
///
/// # Safety
/// As `pack_b`.
unsafe fn pack_b_tabled<const NR: usize, T: Element>(
    b: Operand<T>,
    (k0, kc): (usize, usize),
    p0: usize,
    n: usize,
    out: &mut [f32],
) {
    for (q, panel) in out.chunks_exact_mut(NR * kc).enumerate() {
        let j0 = (p0 + q) * NR;
        let cols = NR.min(n - j0);
        // SAFETY: columns `j0..j0 + cols` are columns of b.
        let at: [isize; NR] = std::array::from_fn(|c| unsafe { b.col(j0 + c.min(cols - 1)) });
        let run = cols == NR && (1..NR).all(|c| at[c] == at[0] + c as isize);
        let (rows, _) = panel.as_chunks_mut::<NR>();
        for (l, row) in rows.iter_mut().enumerate() {
            // SAFETY: row `k0 + l` is a row of b.
            let start = b.ptr.wrapping_offset(unsafe { b.row(k0 + l) });
            if run {
                // SAFETY: elements (k0 + l, j0..j0 + NR) of b, adjacent.
                unsafe { widen_run(start.wrapping_offset(at[0]), row) };
            } else {
                for (x, &o) in row[..cols].iter_mut().zip(&at) {
                    // SAFETY: element (k0 + l, j0 + c) of b.
                    *x = unsafe { *start.wrapping_offset(o) }.to_f32();
                }
                row[cols..].fill(0.0);
            }
        }
    }
}

/// Rows `r0..r0 + mr` of a, columns `k0..k0 + kc`, as `MR`-row panels, each
/// `kc x MR` (column of the panel after column), zero past row `mr`.
///
/// # Safety
/// Those elements of a must lie inside its buffer.
pub(super) unsafe fn pack_a<const MR: usize, T: Element>(
    a: Operand<T>,
    r0: usize,
    mr: usize,
    k0: usize,
    kc: usize,
    out: &mut [f32],
) {
    for (t, panel) in out.chunks_exact_mut(MR * kc).enumerate() {
        let rows = MR.min(mr - t * MR);
        if a.tabled() {
            let (columns, _) = panel.as_chunks_mut::<MR>();
            for (l, column) in columns.iter_mut().enumerate() {
                for (i, x) in column[..rows].iter_mut().enumerate() {
                    // SAFETY: element (r0 + t * MR + i, k0 + l) of a, inside
                    // its buffer.
                    *x = unsafe {
                        *a.ptr
                            .wrapping_offset(a.row(r0 + t * MR + i) + a.col(k0 + l))
                    }
                    .to_f32();
                }
                column[rows..].fill(0.0);
            }
            continue;
        }
        let first = a
            .ptr
            .wrapping_offset((r0 + t * MR) as isize * a.rows + k0 as isize * a.cols);
        let (columns, _) = panel.as_chunks_mut::<MR>();
        if a.rows == 1 && rows == MR {
            // a stored transposed: a column of the panel lies contiguous.
            for (l, column) in columns.iter_mut().enumerate() {
                // SAFETY: elements (r0 + t * MR.., k0 + l) of a, adjacent.
                unsafe { widen_run(first.offset(l as isize * a.cols), column) };
            }
        } else if a.cols == 1 {
            // Rows of a contiguous: turned in blocks, as b's columns are (the
            // runs are a's rows, the panel's rows its columns).
            // SAFETY: elements (r0 + t * MR + i, k0..k0 + kc) of a for
            // `i < rows`, inside its buffer.
            unsafe { transpose_into::<MR, T>(first, a.rows, kc, rows, columns) };
        } else {
            for (l, column) in columns.iter_mut().enumerate() {
                let start = first.wrapping_offset(l as isize * a.cols);
                for (i, x) in column[..rows].iter_mut().enumerate() {
                    // SAFETY: element (r0 + t * MR + i, k0 + l) of a, inside its buffer.
                    *x = unsafe { *start.offset(i as isize * a.rows) }.to_f32();
                }
                column[rows..].fill(0.0);
            }
        }
    }
}

/// Rows `r0..r0 + mr` of a, columns `k0..k0 + kc`, widened to f32 into
/// `out`, row `i` from `out[i * stride]`: a plain loop, which the compiler
/// turns into 256-bit widening loads for AVX2, twice the elements of an
/// SSE step.
///
/// # Safety
/// The CPU has AVX2 (every core of the driver); `a.cols == 1` and `a` has
/// no table; those elements of a lie inside its buffer; `kc <= stride` and
/// `out` holds `mr * stride` elements.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn widen_rows<T: Element>(
    a: Operand<T>,
    (r0, mr): (usize, usize),
    (k0, kc): (usize, usize),
    out: &mut [f32],
    stride: usize,
) {
    debug_assert!(a.cols == 1 && !a.tabled() && kc <= stride && out.len() >= mr * stride);
    for (i, row) in out.chunks_exact_mut(stride).take(mr).enumerate() {
        let from = a
            .ptr
            .wrapping_offset((r0 + i) as isize * a.rows + k0 as isize);
        for (l, x) in row[..kc].iter_mut().enumerate() {
            // SAFETY: element `k0 + l` of row `r0 + i` (the contract of
            // this function).
            *x = unsafe { *from.add(l) }.to_f32();
        }
    }
}

/// A tile's rows of A along one depth block: element `(i, l)`, row `i` of
/// the tile at depth `l`.
pub(super) trait PanelA<const MR: usize> {
    /// The depth.
    fn depth(&self) -> usize;
    /// Element `(i, l)`.
    ///
    /// # Safety
    /// `i < MR` and `l < depth()`.
    unsafe fn at(&self, i: usize, l: usize) -> f32;
    /// Hints that depth `l` (perhaps past the end) is read soon.
    fn prefetch(&self, _l: usize) {}
    /// Where the elements lie, for loops in assembly: element `(i, l)` is
    /// readable there for `i < MR` and `l < depth()`.
    fn rows(&self) -> Rows<MR>;
}

/// Where a tile's rows of A lie.
pub(super) enum Rows<const MR: usize> {
    /// Element `(i, l)` at `first.add(l * MR + i)`.
    Packed(*const f32),
    /// Element `(i, l)` at `rows[i].add(l)`.
    InPlace([*const f32; MR]),
}

/// A packed panel, `kc x MR`, column after column.
pub(super) struct Packed<'a, const MR: usize>(pub &'a [[f32; MR]]);

impl<const MR: usize> PanelA<MR> for Packed<'_, MR> {
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
        // SAFETY: `_mm_prefetch` reads nothing; x86-64 has SSE.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead) };
    }

    fn rows(&self) -> Rows<MR> {
        Rows::Packed(self.0.as_ptr().cast())
    }
}

/// `MR` rows of A read where they lie, each `depth` contiguous elements.
pub(super) struct InPlace<const MR: usize> {
    rows: [*const f32; MR],
    depth: usize,
}

impl<const MR: usize> InPlace<MR> {
    /// Rows `r0..r0 + rows` of a (`rows <= MR`, the rest standing in for
    /// rows past the tile, whose results are not stored), columns `k0..k0 +
    /// depth`.
    ///
    /// # Safety
    /// `a.cols == 1`, `1 <= rows <= MR`, and those elements of a lie inside
    /// its buffer.
    pub(super) unsafe fn new(
        a: Operand,
        r0: usize,
        rows: usize,
        k0: usize,
        depth: usize,
    ) -> InPlace<MR> {
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

impl<const MR: usize> PanelA<MR> for InPlace<MR> {
    fn depth(&self) -> usize {
        self.depth
    }

    #[inline(always)]
    unsafe fn at(&self, i: usize, l: usize) -> f32 {
        // SAFETY: `l < depth` (the caller's contract), and row `i` holds
        // `depth` elements from its pointer (the contract of `new`).
        unsafe { *self.rows[i].add(l) }
    }

    fn rows(&self) -> Rows<MR> {
        Rows::InPlace(self.rows)
    }
}
