//! Taps: at every position of an output plane, a sum of weighted taps of
//! one input plane, the multiply-and-sum of a depthwise convolution
//! (`conv2d`'s elementwise chain, matched in the CPU backend's lowering).
//!
//! Generated code computes such a chain 128 bits at a time (Cranelift's
//! widest vectors), reading each tap through a masked view and each weight
//! as a splat; a 5x5 chain's 25 weights do not fit its registers beside the
//! window. Here a plane is first staged: its rows copied with the padding
//! filled in, and, for a column stride `s`, split into `s` phases of every
//! `s`-th column, so that every tap of every output row is a contiguous,
//! unmasked 256-bit load. Then each output row is 16 (or 8) outputs at a
//! time, its products summed in registers.
//!
//! The values are the generated code's and the interpreter's, bit for bit:
//! each product is rounded, and the products are summed in the tree
//! `conv2d` builds (pairs of neighbours, then pairs of pairs, a last odd
//! one carried), written out for each tap count (`pairwise`).
//!
//! `unsafe` here is the vector loads and stores from the staged plane and
//! the output row, and the call of the AVX2 code.

#![allow(unsafe_code)]

use crate::{Error, Isa};

/// The tap counts with code of their own (3x3, 5x5 and 7x7 windows): each
/// count's sums are unrolled into registers.
const COUNTS: [usize; 3] = [9, 25, 49];

/// Whether `taps` runs a sum of this many taps.
pub fn supports(count: usize) -> bool {
    COUNTS.contains(&count)
}

/// One tap: the input element at `(oh * stride_h + dy, ow * stride_w + dx)`
/// of a plane times the plane's weight `weight`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tap {
    /// Rows from the output row's first input row.
    pub dy: isize,
    /// Columns from the output column's first input column.
    pub dx: isize,
    /// The weight's offset from the plane's first weight.
    pub weight: usize,
}

/// Where one plane's values lie: its input's element (0, 0) and its first
/// weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plane {
    /// The offset of the input plane's first element.
    pub input: usize,
    /// The offset of its first weight.
    pub weights: usize,
}

/// The planes' common geometry and their values.
#[derive(Clone, Copy, Debug)]
pub struct Taps<'a> {
    /// The input planes, each `[rows, cols]` row-major.
    pub input: &'a [f32],
    /// The weights.
    pub weights: &'a [f32],
    /// An input plane's rows and columns; a tap outside them reads `fill`.
    pub in_dims: [usize; 2],
    /// An output plane's rows and columns.
    pub out_dims: [usize; 2],
    /// Input rows and columns between neighbouring outputs.
    pub stride: [usize; 2],
    /// The taps, in the order their products are summed.
    pub taps: &'a [Tap],
    /// What a tap outside the input plane reads.
    pub fill: f32,
}

/// `out` (the planes one after another, each `out_dims` row-major) = the
/// sum of `t`'s taps over each of `planes`, on `isa`'s path (the AVX2 code
/// on every path but `generic`).
///
/// Every read is checked first: a plane outside `input`, weights outside
/// `weights`, an unsupported tap count, a zero stride and an `out` of
/// another length are errors.
pub fn taps(isa: Isa, t: &Taps<'_>, planes: &[Plane], out: &mut [f32]) -> Result<(), Error> {
    let [oh, ow] = t.out_dims;
    let [h, w] = t.in_dims;
    let refuse = |problem: String| Err(Error::Taps(problem));
    if !supports(t.taps.len()) {
        return refuse(format!("{} taps (supported: {COUNTS:?})", t.taps.len()));
    }
    if t.stride.contains(&0) {
        return refuse(format!("a stride of {:?}", t.stride));
    }
    let needs = planes.len().checked_mul(oh).and_then(|n| n.checked_mul(ow));
    if needs != Some(out.len()) {
        return Err(Error::Short {
            what: "taps' output",
            len: out.len(),
            needs: needs.unwrap_or(usize::MAX),
        });
    }
    let last_weight = t.taps.iter().map(|tap| tap.weight).max().unwrap_or(0);
    for (i, p) in planes.iter().enumerate() {
        let input_end = p.input.checked_add(h * w);
        if h * w > 0 && input_end.is_none_or(|end| end > t.input.len()) {
            return refuse(format!(
                "plane {i} reads input elements {}.. of {} ({h}x{w} from {})",
                p.input,
                t.input.len(),
                p.input
            ));
        }
        if p.weights
            .checked_add(last_weight)
            .is_none_or(|at| at >= t.weights.len())
        {
            return refuse(format!(
                "plane {i} reads weight {}+{last_weight} of {}",
                p.weights,
                t.weights.len()
            ));
        }
    }
    if out.is_empty() {
        return Ok(());
    }
    let stage = Stage::new(t);
    let mut staged = vec![t.fill; stage.len()];
    // The furthest read: the last output row's last 8 columns, of the
    // furthest tap; what makes the vector code's reads safe.
    let furthest = stage.at.iter().max().copied().unwrap_or(0)
        + (oh - 1) * stage.row_step
        + ow.next_multiple_of(8);
    if furthest > staged.len() {
        return refuse(format!(
            "a staged plane of {} values read up to {furthest}",
            staged.len()
        ));
    }
    let vectors = vectors_available(isa);
    for (p, out) in planes.iter().zip(out.chunks_exact_mut(oh * ow)) {
        let weights = &t.weights[p.weights..];
        macro_rules! plane {
            ($n:literal) => {{
                let w: [f32; $n] = std::array::from_fn(|k| weights[t.taps[k].weight]);
                plane::<$n>((&stage, t, p.input), &mut staged, &w, out, vectors)
            }};
        }
        match t.taps.len() {
            9 => plane!(9),
            25 => plane!(25),
            _ => plane!(49),
        }
    }
    Ok(())
}

/// Whether the 256-bit code runs: on every path but `generic`, where the
/// CPU has AVX2 (and FMA, which kiln's paths come with).
fn vectors_available(isa: Isa) -> bool {
    isa != Isa::Generic && crate::rows::available()
}

/// How a plane is staged: `phases` copies of its rows (one per column
/// phase), `rows` rows of `len` values each, row `r` of phase `p` holding
/// input row `r + dy0` at columns `i * phases + p + dx0`.
struct Stage {
    phases: usize,
    rows: usize,
    len: usize,
    dy0: isize,
    /// Staged rows between output rows.
    row_step: usize,
    /// Each phase's columns inside the input: the first, the end, and the
    /// input column of the first.
    columns: Vec<(usize, usize, usize)>,
    /// Each tap's offset in the staged plane for output (0, 0).
    at: Vec<usize>,
    in_dims: [usize; 2],
    out_dims: [usize; 2],
}

impl Stage {
    fn new(t: &Taps<'_>) -> Stage {
        let [oh, ow] = t.out_dims;
        let [sh, sw] = t.stride;
        let (dy0, dx0) = (
            t.taps.iter().map(|tap| tap.dy).min().unwrap_or(0),
            t.taps.iter().map(|tap| tap.dx).min().unwrap_or(0),
        );
        // Offsets from the first tap row and column, which are at least 0.
        let rel = |tap: &Tap| ((tap.dy - dy0) as usize, (tap.dx - dx0) as usize);
        let span_y = t.taps.iter().map(|tap| rel(tap).0).max().unwrap_or(0);
        let span_x = t.taps.iter().map(|tap| rel(tap).1 / sw).max().unwrap_or(0);
        let rows = (oh - 1) * sh + span_y + 1;
        // Every output row is computed 8 columns at a time.
        let len = ow.next_multiple_of(8) + span_x;
        let at = (t.taps.iter())
            .map(|tap| {
                let (y, x) = rel(tap);
                ((x % sw) * rows + y) * len + x / sw
            })
            .collect();
        // Each phase's staged columns inside the input, `first..end`, and
        // the input column of the first: column `i` of phase `p` is input
        // column `i * sw + p + dx0`.
        let w = t.in_dims[1] as isize;
        let columns = (0..sw)
            .map(|phase| {
                let c0 = phase as isize + dx0;
                let end = ((w - c0).max(0) as usize).div_ceil(sw).min(len);
                let first = (((-c0).max(0) as usize).div_ceil(sw)).min(end);
                (first, end, ((first * sw) as isize + c0).max(0) as usize)
            })
            .collect();
        Stage {
            phases: sw,
            rows,
            len,
            columns,
            dy0,
            row_step: sh * len,
            at,
            in_dims: t.in_dims,
            out_dims: t.out_dims,
        }
    }

    fn len(&self) -> usize {
        self.phases * self.rows * self.len
    }

    /// Stages the plane whose element (0, 0) is `t.input[first]` into
    /// `staged`, which holds `fill` wherever no input value lands (it is
    /// made so once, and only those values are written), copying each
    /// row's columns of a phase by `every` (`every(src, step, dst)`:
    /// `dst[i] = src[i * step]`).
    #[inline(always)]
    fn fill(
        &self,
        (t, first): (&Taps<'_>, usize),
        staged: &mut [f32],
        every: impl Fn(&[f32], usize, &mut [f32]),
    ) {
        let [h, w] = self.in_dims;
        // Staged rows `r` inside the input: input rows `r + dy0` in `0..h`.
        let r0 = (-self.dy0).max(0) as usize;
        let r1 = ((h as isize - self.dy0).max(0) as usize).min(self.rows);
        for (phase, &(first_in, end_in, x0)) in self.columns.iter().enumerate() {
            if first_in >= end_in {
                continue;
            }
            for r in r0..r1.max(r0) {
                let y = (r as isize + self.dy0) as usize;
                let src = &t.input[first + y * w..][x0..w];
                let row = (phase * self.rows + r) * self.len;
                every(src, self.phases, &mut staged[row + first_in..row + end_in]);
            }
        }
    }
}

/// `dst[i] = src[i * step]`, a copy where `step` is 1.
#[inline(always)]
fn every(src: &[f32], step: usize, dst: &mut [f32]) {
    match step {
        1 => dst.copy_from_slice(&src[..dst.len()]),
        _ => {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = src[i * step];
            }
        }
    }
}

/// One output plane: its input staged, then its sums.
fn plane<const T: usize>(
    (stage, t, first): (&Stage, &Taps<'_>, usize),
    staged: &mut [f32],
    w: &[f32; T],
    out: &mut [f32],
    vectors: bool,
) {
    let [oh, ow] = stage.out_dims;
    let at: [usize; T] = std::array::from_fn(|k| stage.at[k]);
    #[cfg(target_arch = "x86_64")]
    if vectors {
        // SAFETY: the CPU has AVX2 and FMA (`vectors_available`); every
        // read lies inside `staged` (`taps` checked the furthest).
        unsafe { avx2::plane((stage, t, first), staged, (&at, w), out) };
        return;
    }
    let _ = vectors;
    stage.fill((t, first), staged, every);
    for (r, out) in out.chunks_exact_mut(ow).enumerate().take(oh) {
        for (i, o) in out.iter_mut().enumerate() {
            let read = |k: usize| staged[at[k] + r * stage.row_step + i] * w[k];
            *o = pairwise::<T, f32>(&read, &|a, b| a + b);
        }
    }
}

/// The sum of `product(0..T)` in `conv2d`'s pairwise tree: where `T` is
/// `2^a + 2^b + ...` (`a > b > ...`), the balanced trees of the first 2^a
/// products, of the next 2^b, ..., summed from the last: `A + (B + ...)`.
/// Written out for each count of `COUNTS`, so that the whole sum is
/// straight-line code in registers.
#[inline(always)]
fn pairwise<const T: usize, V: Copy>(p: &impl Fn(usize) -> V, add: &impl Fn(V, V) -> V) -> V {
    match T {
        9 => add(b8(p, add, 0), p(8)),
        25 => add(b16(p, add, 0), add(b8(p, add, 16), p(24))),
        _ => add(b32(p, add, 0), add(b16(p, add, 32), p(48))),
    }
}

/// `bN(p, add, s)`: the balanced tree of `p(s..s + N)`, its halves' trees
/// added.
macro_rules! balanced {
    ($($name:ident = $half:ident, $n:literal;)*) => {$(
        #[inline(always)]
        fn $name<V: Copy>(p: &impl Fn(usize) -> V, add: &impl Fn(V, V) -> V, s: usize) -> V {
            add($half(p, add, s), $half(p, add, s + $n / 2))
        }
    )*};
}

#[inline(always)]
fn b1<V: Copy>(p: &impl Fn(usize) -> V, _: &impl Fn(V, V) -> V, s: usize) -> V {
    p(s)
}

balanced! {
    b2 = b1, 2;
    b4 = b2, 4;
    b8 = b4, 8;
    b16 = b8, 16;
    b32 = b16, 32;
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256, _mm_loadu_ps, _mm_storeu_ps, _mm256_add_ps, _mm256_castpd_ps, _mm256_castps_pd,
        _mm256_loadu_ps, _mm256_loadu_si256, _mm256_maskstore_ps, _mm256_mul_ps,
        _mm256_permute4x64_pd, _mm256_set1_ps, _mm256_shuffle_ps, _mm256_storeu_ps,
    };

    use super::{Stage, Taps, every, pairwise};

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
        stage.fill((t, first), staged, |src, step, dst| match step {
            1 => copy(src, dst),
            2 => evens(src, dst),
            _ => every(src, step, dst),
        });
        let ([oh, ow], row_step) = (stage.out_dims, stage.row_step);
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
                    _mm256_storeu_ps(o.as_mut_ptr().add(i), a);
                    _mm256_storeu_ps(o.as_mut_ptr().add(i + 8), b);
                }
                i += 16;
            }
            while i < ow {
                let [a] = unsafe { sums::<T, 1>(base, at, &ws, row + i) };
                // The lanes inside the row: all 8, or its last few.
                let inside = (ow - i).min(8);
                unsafe {
                    let mask = _mm256_loadu_si256(LANES.as_ptr().add(8 - inside).cast());
                    _mm256_maskstore_ps(o.as_mut_ptr().add(i), mask, a);
                }
                i += 8;
            }
        }
    }

    /// `dst[i] = src[i]`, 8 at a time, the last few one at a time: the
    /// rows copied are short (7 to 112 values), where a call of `memcpy`
    /// costs more than the copy (and AMD's masked stores are slow).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn copy(src: &[f32], dst: &mut [f32]) {
        let n = dst.len().min(src.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `src[i..i + 8]` and `dst[i..i + 8]` lie inside the
            // slices (the loop's condition).
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
            }
            i += 8;
        }
        // The last few without a loop, which the compiler would make a
        // call of `memcpy`: 4, 2, then 1.
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

    /// `dst[i] = src[2 * i]`, 8 at a time from 16 where `src` holds them.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn evens(src: &[f32], dst: &mut [f32]) {
        let n = dst.len();
        let mut i = 0;
        while i + 8 <= n && 2 * i + 16 <= src.len() {
            // SAFETY: `src[2i..2i + 16]` and `dst[i..i + 8]` lie inside the
            // slices (the loop's condition).
            let (a, b) = unsafe {
                let at = src.as_ptr().add(2 * i);
                (_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8)))
            };
            // [a0 a2 b0 b2 | a4 a6 b4 b6], then its 64-bit quarters in the
            // order 0, 2, 1, 3.
            let e = _mm256_shuffle_ps::<0x88>(a, b);
            let e = _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(e)));
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(i), e) };
            i += 8;
        }
        for (j, d) in dst.iter_mut().enumerate().skip(i) {
            *d = src[2 * j];
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sum as `conv2d` builds it: products paired level by level.
    fn tree_sum(mut terms: Vec<f32>) -> f32 {
        while terms.len() > 1 {
            terms = terms
                .chunks(2)
                .map(|p| if p.len() == 2 { p[0] + p[1] } else { p[0] })
                .collect();
        }
        terms[0]
    }

    /// Values of every sign and size, a few zeros, no pattern along a row.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let h = (i ^ seed).wrapping_mul(2654435761).rotate_left(13);
                if h.is_multiple_of(17) {
                    0.0
                } else {
                    (h % 2001) as f32 / 997.0 - 1.0
                }
            })
            .collect()
    }

    /// A window of `k x k` taps, `dilation` apart, from `-pad`.
    fn window(k: usize, pad: isize, dilation: isize, planes_weights: usize) -> Vec<Tap> {
        let mut taps = Vec::new();
        for y in 0..k {
            for x in 0..k {
                taps.push(Tap {
                    dy: y as isize * dilation - pad,
                    dx: x as isize * dilation - pad,
                    weight: (y * k + x) * planes_weights,
                });
            }
        }
        taps
    }

    fn case(in_dims: [usize; 2], k: usize, stride: [usize; 2], pad: isize, dilation: isize) {
        let [h, w] = in_dims;
        let span = (k as isize - 1) * dilation + 1;
        let out_dims = [0, 1]
            .map(|a| ((in_dims[a] as isize + 2 * pad - span) / stride[a] as isize + 1) as usize);
        let window = window(k, pad, dilation, 2);
        // Three planes, not packed: the input planes 5 values apart, the
        // weights interleaved with another plane's.
        let planes: Vec<Plane> = (0..3)
            .map(|p| Plane {
                input: 3 + p * (h * w + 5),
                weights: p,
            })
            .collect();
        let input = values(3 + 3 * (h * w + 5), 7);
        let weights = values(2 * k * k + 3, 11);
        let t = Taps {
            input: &input,
            weights: &weights,
            in_dims,
            out_dims,
            stride,
            taps: &window,
            fill: 0.0,
        };
        let [oh, ow] = out_dims;
        let mut want = Vec::new();
        for p in &planes {
            for r in 0..oh {
                for c in 0..ow {
                    let terms = (window.iter())
                        .map(|tap| {
                            let y = (r * stride[0]) as isize + tap.dy;
                            let x = (c * stride[1]) as isize + tap.dx;
                            let inside =
                                (0..h as isize).contains(&y) && (0..w as isize).contains(&x);
                            let v = match inside {
                                true => input[p.input + y as usize * w + x as usize],
                                false => 0.0,
                            };
                            v * weights[p.weights + tap.weight]
                        })
                        .collect();
                    want.push(tree_sum(terms));
                }
            }
        }
        for isa in [Isa::Generic, Isa::Avx2]
            .into_iter()
            .filter(|i| i.available())
        {
            let mut got = vec![f32::NAN; want.len()];
            taps(isa, &t, &planes, &mut got).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "{isa} {in_dims:?} k{k} s{stride:?} p{pad} d{dilation}"
            );
        }
    }

    #[test]
    fn sums_are_the_pairwise_trees_of_rounded_products_bit_for_bit() {
        for (in_dims, k, stride, pad, dilation) in [
            ([7, 7], 3, [1, 1], 1, 1),
            ([56, 56], 3, [1, 1], 1, 1),
            ([13, 29], 3, [2, 2], 1, 1),
            ([112, 112], 3, [2, 2], 1, 1),
            ([14, 14], 5, [1, 1], 2, 1),
            ([23, 19], 5, [2, 2], 2, 1),
            ([11, 40], 3, [1, 3], 0, 2),
            ([9, 9], 7, [1, 1], 3, 1),
            ([30, 17], 3, [3, 1], 2, 1),
        ] {
            case(in_dims, k, stride, pad, dilation);
        }
    }

    #[test]
    fn reads_outside_the_slices_and_other_tap_counts_are_errors() {
        let taps9 = window(3, 1, 1, 1);
        let (input, weights) = (vec![0.0; 16], vec![0.0; 9]);
        let t = Taps {
            input: &input,
            weights: &weights,
            in_dims: [4, 4],
            out_dims: [4, 4],
            stride: [1, 1],
            taps: &taps9,
            fill: 0.0,
        };
        let plane = |input, weights| [Plane { input, weights }];
        let mut out = vec![0.0; 16];
        assert!(taps(Isa::Generic, &t, &plane(0, 0), &mut out).is_ok());
        let e = taps(Isa::Generic, &t, &plane(1, 0), &mut out).unwrap_err();
        assert!(e.to_string().contains("plane 0 reads input"), "{e}");
        let e = taps(Isa::Generic, &t, &plane(0, 1), &mut out).unwrap_err();
        assert!(e.to_string().contains("weight"), "{e}");
        let e = taps(Isa::Generic, &t, &plane(0, 0), &mut out[..15]).unwrap_err();
        assert!(e.to_string().contains("15"), "{e}");
        let four = &taps9[..4];
        let e = taps(
            Isa::Generic,
            &Taps { taps: four, ..t },
            &plane(0, 0),
            &mut out,
        )
        .unwrap_err();
        assert!(e.to_string().contains("4 taps"), "{e}");
    }
}
