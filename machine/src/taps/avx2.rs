//! The AVX2 code of `taps`: a plane's rows staged and summed 16 outputs
//! at a time, and small planes 8 at a time, one per lane.
//!
//! `unsafe` here is the vector loads and stores.

use std::arch::x86_64::{
    __m128, __m256, _MM_TRANSPOSE4_PS, _mm_loadu_ps, _mm_storeu_ps, _mm256_add_ps,
    _mm256_castpd_ps, _mm256_castps_pd, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_maskstore_ps,
    _mm256_mul_ps, _mm256_permute2f128_ps, _mm256_permute4x64_pd, _mm256_set1_ps,
    _mm256_setzero_ps, _mm256_shuffle_ps, _mm256_storeu_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps,
};

use std::ops::Range;

use super::{Activation, Stage, Taps, Window, every, pairwise};

/// Eight lanes stored, then eight not: the mask of a row's last `n`
/// outputs starts `8 - n` in.
const LANES: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

/// An output plane, `[oh, ow]` row-major: its input staged (every
/// other value 8 at a time), then its sums, 16 outputs at a time, then
/// 8, a row's last few by a masked store.
///
/// # Safety
/// The CPU has AVX2 and FMA; for every tap `k`, row `r < oh` and column
/// block `i < ow.next_multiple_of(8)`, `staged[at[k] + r * row_step +
/// i..][..8]` lies inside `staged`; `out` holds `oh * ow` values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn plane<const T: usize>(
    (stage, t, first): (&Stage, &Taps<'_>, usize),
    staged: &mut [f32],
    (at, w): (&[usize; T], &[f32; T]),
    out: &mut [f32],
) {
    let every = |src: &[f32], step: usize, dst: &mut [f32]| match step {
        1 => copy(src, dst),
        _ => every(src, step, dst),
    };
    stage.fill((t, first), staged, every, |src, a, b| pair(src, a, b));
    let ([oh, ow], row_step, act) = (stage.out_dims, stage.row_step, t.activation);
    let ws: [__m256; T] = std::array::from_fn(|k| _mm256_set1_ps(w[k]));
    let base = staged.as_ptr();
    for r in 0..oh {
        let row = r * row_step;
        let o = &mut out[r * ow..(r + 1) * ow];
        let mut i = 0;
        // SAFETY (every block below): the reads are those the caller
        // vouches for, and the stores lie inside `o` (a masked store
        // writes only its lanes inside, and reads `LANES` inside it).
        while i + 16 <= ow {
            let [a, b] = unsafe { sums::<T, 2>(base, at, &ws, row + i) };
            unsafe {
                _mm256_storeu_ps(o.as_mut_ptr().add(i), activated(act, a));
                _mm256_storeu_ps(o.as_mut_ptr().add(i + 8), activated(act, b));
            }
            i += 16;
        }
        while i < ow {
            let [a] = unsafe { sums::<T, 1>(base, at, &ws, row + i) };
            // The lanes inside the row: all 8, or its last few.
            let inside = (ow - i).min(8);
            unsafe {
                let mask = _mm256_loadu_si256(LANES.as_ptr().add(8 - inside).cast());
                _mm256_maskstore_ps(o.as_mut_ptr().add(i), mask, activated(act, a));
            }
            i += 8;
        }
    }
}

/// `dst[i] = src[i]`, 16 at a time, then 8, the last few one at a time:
/// the rows copied are short (7 to 112 values), where a call of `memcpy`
/// costs more than the copy (and AMD's masked stores are slow). (A loop of
/// one vector a step was made a call of `memcpy` by the compiler; two
/// stores a step, each half the step's stride, are not.)
#[inline]
#[target_feature(enable = "avx2,fma")]
fn copy(src: &[f32], dst: &mut [f32]) {
    let n = dst.len().min(src.len());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `src[i..i + 16]` and `dst[i..i + 16]` lie inside the
        // slices (the loop's condition).
        unsafe {
            let (a, b) = (
                _mm256_loadu_ps(src.as_ptr().add(i)),
                _mm256_loadu_ps(src.as_ptr().add(i + 8)),
            );
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), a);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i + 8), b);
        }
        i += 16;
    }
    if i + 8 <= n {
        // SAFETY: `src[i..i + 8]` and `dst[i..i + 8]` lie inside the slices.
        unsafe {
            _mm256_storeu_ps(
                dst.as_mut_ptr().add(i),
                _mm256_loadu_ps(src.as_ptr().add(i)),
            )
        };
        i += 8;
    }
    // The last few without a loop: 4, 2, then 1.
    if n - i >= 4 {
        // SAFETY: `src[i..i + 4]` and `dst[i..i + 4]` lie inside the slices.
        unsafe { _mm_storeu_ps(dst.as_mut_ptr().add(i), _mm_loadu_ps(src.as_ptr().add(i))) };
        i += 4;
    }
    if n - i >= 2 {
        dst[i..i + 2].copy_from_slice(&src[i..i + 2]);
        i += 2;
    }
    if n > i {
        dst[i] = src[i];
    }
}

/// `a[i] = src[2 * i]` and `b[i] = src[2 * i + 1]`, 8 of each at a time
/// from 16 where `src` holds them.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn pair(src: &[f32], a: &mut [f32], b: &mut [f32]) {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n && 2 * i + 16 <= src.len() {
        // SAFETY: `src[2i..2i + 16]`, `a[i..i + 8]` and `b[i..i + 8]` lie
        // inside the slices (the loop's condition).
        let (x, y) = unsafe {
            let at = src.as_ptr().add(2 * i);
            (_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8)))
        };
        // [x0 x2 y0 y2 | x4 x6 y4 y6] (and the odd ones), then its 64-bit
        // quarters in the order 0, 2, 1, 3.
        let order = |v| _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(v)));
        let (even, odd) = (
            order(_mm256_shuffle_ps::<0x88>(x, y)),
            order(_mm256_shuffle_ps::<0xDD>(x, y)),
        );
        // SAFETY: as above.
        unsafe {
            _mm256_storeu_ps(a.as_mut_ptr().add(i), even);
            _mm256_storeu_ps(b.as_mut_ptr().add(i), odd);
        }
        i += 8;
    }
    for (j, d) in a.iter_mut().enumerate().skip(i) {
        *d = src[2 * j];
    }
    for (j, d) in b.iter_mut().enumerate().skip(i) {
        *d = src[2 * j + 1];
    }
}

/// `N` vectors of 8 neighbouring outputs whose taps start `col`
/// values past each tap's offset.
///
/// # Safety
/// As `plane`'s, for these reads.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sums<const T: usize, const N: usize>(
    base: *const f32,
    at: &[usize; T],
    ws: &[__m256; T],
    col: usize,
) -> [__m256; N] {
    let product = |k: usize| -> [__m256; N] {
        std::array::from_fn(|j| {
            // SAFETY: inside `staged`, by the caller's contract.
            let x = unsafe { _mm256_loadu_ps(base.add(at[k] + col + 8 * j)) };
            _mm256_mul_ps(x, ws[k])
        })
    };
    let add = |a: [__m256; N], b: [__m256; N]| -> [__m256; N] {
        std::array::from_fn(|j| _mm256_add_ps(a[j], b[j]))
    };
    pairwise::<T, [__m256; N]>(&product, &add)
}

/// Small planes, 8 at a time: each staged position holds the 8 planes'
/// values at one input position of the window, one per lane (with `fill`
/// where that is outside the input), so that a tap is one load and a
/// weight one vector for any stride, and no lane is lost to a short row.
pub(super) struct Grid {
    /// Window columns per staged row.
    cols: usize,
    /// The window's rows and columns inside the input, and where the
    /// window starts.
    inside: [Range<usize>; 2],
    origin: [isize; 2],
    /// Each tap's offset, in values, from an output's first position.
    at: Vec<usize>,
    /// Values between output rows and between output columns.
    steps: [usize; 2],
    len: usize,
}

impl Grid {
    pub(super) fn new(window: &Window, t: &Taps<'_>) -> Grid {
        let ([sh, sw], cols) = (t.stride, window.cols);
        let at = (t.taps.iter())
            .map(|tap| {
                let y = (tap.dy - window.dy0) as usize;
                let x = (tap.dx - window.dx0) as usize;
                (y * cols + x) * 8
            })
            .collect();
        Grid {
            cols,
            inside: [window.inside_rows.clone(), window.inside_cols.clone()],
            origin: [window.dy0, window.dx0],
            at,
            steps: [sh * cols * 8, sw * 8],
            len: window.rows * cols * 8,
        }
    }

    /// The values a group's staging holds.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// One past the furthest value a sum reads.
    pub(super) fn furthest(&self, [oh, ow]: [usize; 2]) -> usize {
        let last = self.at.iter().max().copied().unwrap_or(0);
        last + (oh - 1) * self.steps[0] + (ow - 1) * self.steps[1] + 8
    }
}

/// Up to 8 planes' outputs (`out`, the planes one after another) from
/// their inputs, staged in `staged`, which holds `fill` wherever no input
/// value lands (made so once; only input values are written).
///
/// # Safety
/// The CPU has AVX2 and FMA; `staged` holds `grid.len()` values, at least
/// `grid.furthest(t.out_dims)`; `planes` are at most 8, inside `t`'s slices
/// (`taps` checked them); `out` holds their outputs.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn group<const T: usize>(
    grid: &Grid,
    t: &Taps<'_>,
    planes: &[super::Plane],
    staged: &mut [f32],
    out: &mut [f32],
) {
    let (w, [oh, ow]) = (t.in_dims[1], t.out_dims);
    let [rows, cols] = grid.inside.clone();
    let mut weights = [[0.0f32; 8]; T];
    if let (false, Some(last)) = (cols.is_empty(), planes.len().checked_sub(1)) {
        let x0 = (cols.start as isize + grid.origin[1]) as usize;
        for r in rows {
            let y = (r as isize + grid.origin[0]) as usize;
            // Lanes past the group's planes repeat its last (their sums
            // are not stored).
            let src: [&[f32]; 8] = std::array::from_fn(|lane| {
                &t.input[planes[lane.min(last)].input + y * w + x0..][..cols.len()]
            });
            let row = &mut staged[(r * grid.cols + cols.start) * 8..][..cols.len() * 8];
            interleave(src, row);
        }
    }
    for (lane, p) in planes.iter().enumerate() {
        for (k, tap) in t.taps.iter().enumerate() {
            weights[k][lane] = t.weights[p.weights + tap.weight];
        }
    }
    // SAFETY: `weights[k]` holds 8 values.
    let ws: [__m256; T] = std::array::from_fn(|k| unsafe { _mm256_loadu_ps(weights[k].as_ptr()) });
    let at: [usize; T] = std::array::from_fn(|k| grid.at[k]);
    let base = staged.as_ptr();
    let plane = oh * ow;
    // The 8 planes' sums at output row `i`, column `j`.
    let sums = |i: usize, j: usize| {
        let first = i * grid.steps[0] + j * grid.steps[1];
        // SAFETY: `first + at[k] + 8` is at most `grid.furthest`, inside
        // `staged` (the caller's contract).
        let product =
            |k: usize| _mm256_mul_ps(unsafe { _mm256_loadu_ps(base.add(first + at[k])) }, ws[k]);
        pairwise::<T, __m256>(&product, &|a, b| _mm256_add_ps(a, b))
    };
    // Eight positions at a time, turned in registers so that each plane's
    // eight outputs (adjacent: a plane's positions run on from row to row)
    // are one store, where each output was a store of its own.
    let mut q = 0;
    let mut block = [_mm256_setzero_ps(); 8];
    while q + 8 <= plane {
        // (Each sum put aside as it is made: the weights take `T` of the
        // 16 registers, and eight sums held beside them spill.)
        let (mut i, mut j) = (q / ow, q % ow);
        for v in &mut block {
            *v = sums(i, j);
            j += 1;
            if j == ow {
                (i, j) = (i + 1, 0);
            }
        }
        let turned = transpose(block);
        for (lane, v) in turned.iter().take(planes.len()).enumerate() {
            let to = &mut out[lane * plane + q..][..8];
            // SAFETY: `to` holds 8 values.
            unsafe { _mm256_storeu_ps(to.as_mut_ptr(), activated(t.activation, *v)) };
        }
        q += 8;
    }
    for q in q..plane {
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sums(q / ow, q % ow)) };
        for (lane, v) in lanes.iter().take(planes.len()).enumerate() {
            out[lane * plane + q] = t.activation.of(*v);
        }
    }
}

/// `row[c * 8 + lane] = src[lane][c]`: eight rows interleaved, eight
/// columns at a time turned in registers, then four, the last few one by
/// one. (Value by value, a store each, the staging's stores took much of
/// a small plane's time: `benches/RESULTS-cpu.md`.)
#[inline]
#[target_feature(enable = "avx2,fma")]
fn interleave(src: [&[f32]; 8], row: &mut [f32]) {
    let len = row.len() / 8;
    assert!(src.iter().all(|s| s.len() >= len), "rows of {len} values");
    let mut c = 0;
    while c + 8 <= len {
        // SAFETY: values `c..c + 8` of every row (the assert above).
        let turned = transpose(std::array::from_fn(|lane| unsafe {
            _mm256_loadu_ps(src[lane].as_ptr().add(c))
        }));
        for (q, v) in turned.iter().enumerate() {
            let to = &mut row[(c + q) * 8..][..8];
            // SAFETY: `to` holds 8 values.
            unsafe { _mm256_storeu_ps(to.as_mut_ptr(), *v) };
        }
        c += 8;
    }
    if c + 4 <= len {
        // Lanes 0-3 and 4-7 turned as two 4 x 4 blocks.
        // SAFETY: values `c..c + 4` of every row (the assert above).
        let [mut low, mut high]: [[__m128; 4]; 2] = std::array::from_fn(|half| {
            std::array::from_fn(|i| unsafe { _mm_loadu_ps(src[4 * half + i].as_ptr().add(c)) })
        });
        let [l0, l1, l2, l3] = &mut low;
        _MM_TRANSPOSE4_PS(l0, l1, l2, l3);
        let [h0, h1, h2, h3] = &mut high;
        _MM_TRANSPOSE4_PS(h0, h1, h2, h3);
        for q in 0..4 {
            let to = &mut row[(c + q) * 8..][..8];
            // SAFETY: `to` holds 8 values.
            unsafe {
                _mm_storeu_ps(to.as_mut_ptr(), low[q]);
                _mm_storeu_ps(to.as_mut_ptr().add(4), high[q]);
            }
        }
        c += 4;
    }
    for c in c..len {
        for (lane, x) in row[c * 8..][..8].iter_mut().enumerate() {
            *x = src[lane][c];
        }
    }
}

/// Eight vectors turned: lane `j` of vector `i` becomes lane `i` of
/// vector `j`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn transpose([r0, r1, r2, r3, r4, r5, r6, r7]: [__m256; 8]) -> [__m256; 8] {
    // Pairs of rows interleaved, then quads: within each 128-bit half,
    // lane `j` of every row; the halves then swapped into place.
    let pairs = [
        _mm256_unpacklo_ps(r0, r1),
        _mm256_unpackhi_ps(r0, r1),
        _mm256_unpacklo_ps(r2, r3),
        _mm256_unpackhi_ps(r2, r3),
        _mm256_unpacklo_ps(r4, r5),
        _mm256_unpackhi_ps(r4, r5),
        _mm256_unpacklo_ps(r6, r7),
        _mm256_unpackhi_ps(r6, r7),
    ];
    let quads = |low: usize, high: usize| {
        [
            _mm256_shuffle_ps::<0x44>(pairs[low], pairs[high]),
            _mm256_shuffle_ps::<0xEE>(pairs[low], pairs[high]),
        ]
    };
    let [q0, q1] = quads(0, 2);
    let [q2, q3] = quads(1, 3);
    let [q4, q5] = quads(4, 6);
    let [q6, q7] = quads(5, 7);
    [
        _mm256_permute2f128_ps::<0x20>(q0, q4),
        _mm256_permute2f128_ps::<0x20>(q1, q5),
        _mm256_permute2f128_ps::<0x20>(q2, q6),
        _mm256_permute2f128_ps::<0x20>(q3, q7),
        _mm256_permute2f128_ps::<0x31>(q0, q4),
        _mm256_permute2f128_ps::<0x31>(q1, q5),
        _mm256_permute2f128_ps::<0x31>(q2, q6),
        _mm256_permute2f128_ps::<0x31>(q3, q7),
    ]
}

/// `act` applied to the 8 sums of `v`: lane by lane as `Activation::of`
/// (the same bits, NaN's included), in registers as they are stored.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn activated(act: Activation, v: __m256) -> __m256 {
    crate::gemm::relu_then_cap(v, act.relu, act.cap)
}

/// `activated` over 8 values in memory, for the tests.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(test)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn activated_lanes(act: Activation, lanes: &mut [f32; 8]) {
    // SAFETY: `lanes` holds 8 values.
    unsafe {
        _mm256_storeu_ps(
            lanes.as_mut_ptr(),
            activated(act, _mm256_loadu_ps(lanes.as_ptr())),
        )
    };
}
