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
//! time, its products summed in registers. Planes of at most
//! `SMALL_PLANE` outputs go 8 at a time instead, one per lane, each staged
//! position holding the 8 planes' values (`avx2::Grid`).
//!
//! The values are the generated code's and the interpreter's, bit for bit:
//! each product is rounded, and the products are summed in the tree
//! `conv2d` builds (pairs of neighbours, then pairs of pairs, a last odd
//! one carried), written out for each tap count (`pairwise`). ReLU and a
//! cap (`Activation`) apply to each sum as it is stored.
//!
//! `unsafe` here is the calls of the AVX2 code (`avx2`, whose vector loads
//! and stores are the rest).

#![allow(unsafe_code)]

use crate::{Error, Isa};

/// The tap counts with code of their own (3x3, 5x5 and 7x7 windows): each
/// count's sums are unrolled into registers.
const COUNTS: [usize; 3] = [9, 25, 49];

/// Planes of at most this many outputs are summed 8 at a time, one per
/// lane (`avx2::group`): rows this short lose lanes and their per-row work
/// outweighs their sums.
const SMALL_PLANE: usize = 256;

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

/// What is applied to each sum as it is stored: ReLU (anything not above zero becomes +0, a NaN stays),
/// then the lesser of that and `cap`, as kiln's GEMM applies them
/// (`gemm::Fused`) and generated code's `max(x, +0)` and `min(x, cap)`
/// compute them (a NaN's payload aside).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Activation {
    /// Whether ReLU applies.
    pub relu: bool,
    /// The value the result is capped at (finite, not zero), if any.
    pub cap: Option<f32>,
}

impl Activation {
    /// Neither: the sums as they are.
    pub const NONE: Activation = Activation {
        relu: false,
        cap: None,
    };

    /// It applied to one sum.
    fn of(self, x: f32) -> f32 {
        let x = if self.relu && x <= 0.0 { 0.0 } else { x };
        match self.cap {
            Some(cap) if x > cap => cap,
            _ => x,
        }
    }
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
    /// Applied to each sum as it is stored.
    pub activation: Activation,
}

/// `out` (the planes one after another, each `out_dims` row-major) = the
/// sum of `t`'s taps over each of `planes`, `t.activation` applied to
/// each sum as it is stored, on `isa`'s path
/// (the AVX2 code on every path but `generic`).
///
/// Every read is checked first: a plane outside `input`, weights outside
/// `weights`, an unsupported tap count, a zero stride, a window whose
/// staging no memory holds and an `out` of another length are errors.
pub fn taps(isa: Isa, t: &Taps<'_>, planes: &[Plane], out: &mut [f32]) -> Result<(), Error> {
    let [oh, ow] = t.out_dims;
    let [h, w] = t.in_dims;
    let window = |span| Error::TapWindow {
        outputs: t.out_dims,
        stride: t.stride,
        span,
    };
    if !supports(t.taps.len()) {
        return Err(Error::TapCount {
            count: t.taps.len(),
            supported: COUNTS,
        });
    }
    if t.stride.contains(&0) {
        return Err(window([None; 2]));
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
    let plane_len = h as u128 * w as u128;
    for (i, p) in planes.iter().enumerate() {
        let reads = |what, first: usize, count: u128, len: usize| {
            let outside = count > 0 && first as u128 + count > len as u128;
            match outside {
                true => Err(Error::TapPlane {
                    plane: i,
                    what,
                    first,
                    count,
                    len,
                }),
                false => Ok(()),
            }
        };
        reads("input values", p.input, plane_len, t.input.len())?;
        reads(
            "weights",
            p.weights,
            last_weight as u128 + 1,
            t.weights.len(),
        )?;
    }
    if out.is_empty() {
        return Ok(());
    }
    // A stride along an axis of one output moves nothing; as 1, it stages
    // no more than the window.
    let stride = [0, 1].map(|a| if t.out_dims[a] == 1 { 1 } else { t.stride[a] });
    let t = &Taps { stride, ..*t };
    let staging = Window::new(t).ok_or_else(|| window(Window::spans(t)))?;
    let vectors = vectors_available(isa);
    #[cfg(target_arch = "x86_64")]
    if vectors && oh * ow <= SMALL_PLANE {
        return small_planes(&staging, t, planes, out);
    }
    let stage = Stage::new(&staging, t);
    let mut staged = vec![t.fill; stage.len()];
    // The furthest read: the last output row's last 8 columns, of the
    // furthest tap; what makes the vector code's reads safe.
    let furthest = stage.at.iter().max().copied().unwrap_or(0)
        + (oh - 1) * stage.row_step
        + ow.next_multiple_of(8);
    if furthest > staged.len() {
        return Err(window(Window::spans(t)));
    }
    for (p, out) in planes.iter().zip(out.chunks_exact_mut(oh * ow)) {
        let weights = &t.weights[p.weights..];
        macro_rules! sums {
            ($n:literal) => {{
                let w: [f32; $n] = std::array::from_fn(|k| weights[t.taps[k].weight]);
                plane::<$n>((&stage, t, p.input), &mut staged, &w, out, vectors)
            }};
        }
        match t.taps.len() {
            9 => sums!(9),
            25 => sums!(25),
            _ => sums!(49),
        }
    }
    Ok(())
}

/// `taps` over planes of at most `SMALL_PLANE` outputs, 8 planes at a
/// time by the AVX2 code, one plane per lane.
#[cfg(target_arch = "x86_64")]
fn small_planes(
    window: &Window,
    t: &Taps<'_>,
    planes: &[Plane],
    out: &mut [f32],
) -> Result<(), Error> {
    let grid = avx2::Grid::new(window, t);
    let mut staged = vec![t.fill; grid.len()];
    let furthest = grid.furthest(t.out_dims);
    if furthest > staged.len() {
        return Err(Error::TapWindow {
            outputs: t.out_dims,
            stride: t.stride,
            span: Window::spans(t),
        });
    }
    let plane = t.out_dims[0] * t.out_dims[1];
    for (group, out) in planes.chunks(8).zip(out.chunks_mut(8 * plane)) {
        macro_rules! group {
            ($n:literal) => {
                // SAFETY: the CPU has AVX2 and FMA (`vectors_available`);
                // `staged` holds `grid.len()` values, at least the furthest
                // read (checked above); `taps` checked the planes, and `out`
                // holds their outputs.
                unsafe { avx2::group::<$n>(&grid, t, group, &mut staged, out) }
            };
        }
        match t.taps.len() {
            9 => group!(9),
            25 => group!(25),
            _ => group!(49),
        }
    }
    Ok(())
}

/// Whether the 256-bit code runs: on every path but `generic`, where the
/// CPU has AVX2 (and FMA, which kiln's paths come with).
fn vectors_available(isa: Isa) -> bool {
    isa != Isa::Generic && crate::rows::available()
}

/// Where the taps reach, from an output plane's first position, and what
/// staging it takes: both paths' sizes, computed once with every product
/// checked, so that no offset made from them overflows.
struct Window {
    /// The first row and column a tap reads, from the output's.
    dy0: isize,
    dx0: isize,
    /// The rows and columns between the first tap and the furthest.
    span: [usize; 2],
    /// The input rows and columns the outputs' taps reach, from `dy0` and
    /// `dx0`.
    rows: usize,
    cols: usize,
    /// Of those, the ones inside the input.
    inside_rows: std::ops::Range<usize>,
    inside_cols: std::ops::Range<usize>,
}

impl Window {
    /// Rows and columns between the first tap and the furthest (`None`
    /// where more than a `usize` counts).
    fn spans(t: &Taps<'_>) -> [Option<usize>; 2] {
        let span = |d: fn(&Tap) -> isize| {
            let d0 = t.taps.iter().map(d).min().unwrap_or(0);
            let mut spans = (t.taps.iter()).map(|tap| usize::try_from(d(tap) as i128 - d0 as i128));
            spans.try_fold(0, |m, s| s.ok().map(|s| m.max(s)))
        };
        [span(|tap| tap.dy), span(|tap| tap.dx)]
    }

    /// The window of `t`, whose output is not empty; `None` where its
    /// staging would not fit in memory.
    fn new(t: &Taps<'_>) -> Option<Window> {
        let ([oh, ow], [sh, sw], [h, w]) = (t.out_dims, t.stride, t.in_dims);
        let first = |d: fn(&Tap) -> isize| t.taps.iter().map(d).min().unwrap_or(0);
        let (dy0, dx0) = (first(|tap| tap.dy), first(|tap| tap.dx));
        let [span_y, span_x] = Window::spans(t);
        let (span_y, span_x) = (span_y?, span_x?);
        let extent = |n: usize, step: usize, span: usize| {
            (n - 1).checked_mul(step)?.checked_add(span)?.checked_add(1)
        };
        let (rows, cols) = (extent(oh, sh, span_y)?, extent(ow, sw, span_x)?);
        // The larger staging of the two paths (`Stage::len`, `avx2::Grid`),
        // in bytes, which a `Vec` must hold.
        let by_rows = (ow.checked_next_multiple_of(8)?.checked_add(span_x / sw)?)
            .checked_mul(sw)?
            .checked_mul(rows)?;
        let by_lanes = rows.checked_mul(cols)?.checked_mul(8)?;
        if by_rows.max(by_lanes).checked_mul(4)? > isize::MAX as usize {
            return None;
        }
        // Staged positions `r` inside the input: input rows `r + dy0` in `0..h`.
        let inside = |d0: isize, len: usize, n: usize| {
            let start = (-(d0 as i128)).clamp(0, n as i128);
            let end = (len as i128 - d0 as i128).clamp(start, n as i128);
            start as usize..end as usize
        };
        Some(Window {
            dy0,
            dx0,
            span: [span_y, span_x],
            rows,
            cols,
            inside_rows: inside(dy0, h, rows),
            inside_cols: inside(dx0, w, cols),
        })
    }
}

/// How a plane is staged: `phases` copies of its rows (one per column
/// phase), `rows` rows of `len` values each, row `r` of phase `p` holding
/// input row `r + dy0` at columns `i * phases + p + dx0`.
struct Stage {
    phases: usize,
    rows: usize,
    len: usize,
    dy0: isize,
    /// The staged rows inside the input.
    inside_rows: std::ops::Range<usize>,
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
    fn new(window: &Window, t: &Taps<'_>) -> Stage {
        let ([sh, sw], ow) = (t.stride, t.out_dims[1]);
        let rows = window.rows;
        // Every output row is computed 8 columns at a time.
        let len = ow.next_multiple_of(8) + window.span[1] / sw;
        let at = (t.taps.iter())
            .map(|tap| {
                let y = (tap.dy - window.dy0) as usize;
                let x = (tap.dx - window.dx0) as usize;
                ((x % sw) * rows + y) * len + x / sw
            })
            .collect();
        // Each phase's staged columns inside the input, `first..end`, and
        // the input column of the first: column `i` of phase `p` is
        // window column `i * sw + p`.
        let cols = &window.inside_cols;
        let columns = (0..sw)
            .map(|phase| {
                let first = cols.start.saturating_sub(phase).div_ceil(sw).min(len);
                let end = cols
                    .end
                    .saturating_sub(phase)
                    .div_ceil(sw)
                    .clamp(first, len);
                let x0 = (first * sw + phase) as isize + window.dx0;
                (first, end, x0.max(0) as usize)
            })
            .collect();
        Stage {
            phases: sw,
            rows,
            len,
            columns,
            dy0: window.dy0,
            inside_rows: window.inside_rows.clone(),
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
    /// `dst[i] = src[i * step]`), or of both phases of a stride of 2 at
    /// once by `pair` (`pair(src, a, b)`: `a[i] = src[2 * i]`, `b[i] =
    /// src[2 * i + 1]`), reading each row once.
    #[inline(always)]
    fn fill(
        &self,
        (t, first): (&Taps<'_>, usize),
        staged: &mut [f32],
        every: impl Fn(&[f32], usize, &mut [f32]),
        pair: impl Fn(&[f32], &mut [f32], &mut [f32]),
    ) {
        let w = self.in_dims[1];
        let rows = |phase: usize, r: usize| {
            let (first_in, end_in, _) = self.columns[phase];
            let at = (phase * self.rows + r) * self.len;
            at + first_in..at + end_in
        };
        if let [(f0, e0, x0), (f1, e1, x1)] = self.columns[..] {
            // Both phases start at neighbouring input columns (they do
            // unless one has none): the earlier takes the even ones.
            if f0 < e0 && f1 < e1 && x0.abs_diff(x1) == 1 {
                let block = self.rows * self.len;
                let (phase0, phase1) = staged.split_at_mut(block);
                for r in self.inside_rows.clone() {
                    let y = (r as isize + self.dy0) as usize;
                    let src = &t.input[first + y * w..][x0.min(x1)..w];
                    let b = rows(1, r);
                    let (a, b) = (
                        &mut phase0[rows(0, r)],
                        &mut phase1[b.start - block..b.end - block],
                    );
                    match x0 < x1 {
                        true => pair(src, a, b),
                        false => pair(src, b, a),
                    }
                }
                return;
            }
        }
        for (phase, &(first_in, end_in, x0)) in self.columns.iter().enumerate() {
            if first_in >= end_in {
                continue;
            }
            for r in self.inside_rows.clone() {
                let y = (r as isize + self.dy0) as usize;
                let src = &t.input[first + y * w..][x0..w];
                every(src, self.phases, &mut staged[rows(phase, r)]);
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
    let pair = |src: &[f32], a: &mut [f32], b: &mut [f32]| {
        every(src, 2, a);
        every(&src[1..], 2, b);
    };
    stage.fill((t, first), staged, every, pair);
    for (r, out) in out.chunks_exact_mut(ow).enumerate().take(oh) {
        for (i, o) in out.iter_mut().enumerate() {
            let read = |k: usize| staged[at[k] + r * stage.row_step + i] * w[k];
            *o = t.activation.of(pairwise::<T, f32>(&read, &|a, b| a + b));
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
mod avx2;
#[cfg(test)]
mod tests;
