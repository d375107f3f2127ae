//! Index maps: how a kernel reads a buffer through movement ops without
//! copying it.
//!
//! A `View` of shape `S` reads element `c` (coordinates in `S`) of a
//! contiguous source buffer at flat index `offset + sum(c[i] * strides[i])`,
//! unless a coordinate lies outside the mask's valid range on its axis, in
//! which case it reads the mask's fill value (that is how padding is a view).
//! Permute, expand, slice and pad always compose into one view; a reshape
//! composes when the strides allow it, as in PyTorch's `view`.
//!
//! Views are kept canonical so that equal index maps compare and hash equal:
//! a size-1 axis has stride 0, and a mask that keeps everything is dropped.
//!
//! The movement methods here know nothing of `Op`: `fold-views` maps each
//! movement op to one of them, and the verifier checks a view against the
//! buffer it reads with `View::check`. `SliceRange`, the parameter of a
//! slice, lives here for the same reason, so this module reads only `types`.

use std::fmt;

use smallvec::SmallVec;

use crate::types::{Scalar, Shape, TensorType};

/// How a kernel reads one buffer: shape, strides (0 for broadcast axes),
/// offset, and the padding mask.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct View {
    /// The shape the view presents.
    pub shape: Shape,
    /// Source elements between neighbours along each axis; 0 broadcasts.
    pub strides: SmallVec<[usize; 4]>,
    /// The flat source index of coordinates zero; negative only under a mask
    /// (padding before the first element).
    pub offset: isize,
    /// The padded region, if any.
    pub mask: Option<Mask>,
}

/// The region of a view backed by the source; everything outside reads `fill`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mask {
    /// Per axis, the coordinates `start..end` that read the source.
    pub valid: SmallVec<[(usize, usize); 4]>,
    /// The value read everywhere else.
    pub fill: Scalar,
}

/// The part of one axis that a slice keeps: `start..end` every `step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceRange {
    /// First index kept.
    pub start: usize,
    /// One past the last index considered; `start <= end <= dim`.
    pub end: usize,
    /// Distance between kept indices, at least 1.
    pub step: usize,
}

impl SliceRange {
    /// How many indices the range keeps.
    pub fn len(&self) -> usize {
        (self.end - self.start).div_ceil(self.step)
    }

    /// Whether the range keeps nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl View {
    /// The identity view of a contiguous row-major buffer of `shape`.
    pub fn contiguous(shape: &Shape) -> View {
        View {
            shape: shape.clone(),
            strides: shape.strides(),
            offset: 0,
            mask: None,
        }
        .canonical()
    }

    /// Whether the view reads a whole buffer of its own shape in row-major order.
    pub fn is_contiguous(&self) -> bool {
        *self == View::contiguous(&self.shape)
    }

    /// The flat source index of `coords`, or `None` where the view reads the
    /// fill value.
    pub fn index(&self, coords: &[usize]) -> Option<usize> {
        if let Some(mask) = &self.mask
            && coords
                .iter()
                .zip(&mask.valid)
                .any(|(&c, &(start, end))| c < start || c >= end)
        {
            return None;
        }
        let flat = coords
            .iter()
            .zip(&self.strides)
            .fold(self.offset, |acc, (&c, &s)| acc + (c * s) as isize);
        // A canonical view in bounds (see `bounds`) never reads below 0.
        Some(flat as usize)
    }

    /// The smallest and largest flat source index the view reads, or `None`
    /// when it reads no source element. The verifier checks these against the
    /// source's length, so no view can read out of bounds.
    pub fn bounds(&self) -> Option<(i128, i128)> {
        if self.shape.numel() == 0 {
            return None;
        }
        let ranges: SmallVec<[(usize, usize); 4]> = match &self.mask {
            Some(mask) => mask.valid.clone(),
            None => self.shape.dims().iter().map(|&d| (0, d)).collect(),
        };
        if ranges.iter().any(|&(start, end)| start >= end) {
            return None;
        }
        let mut lo = self.offset as i128;
        let mut hi = self.offset as i128;
        for (&(start, end), &s) in ranges.iter().zip(&self.strides) {
            lo += start as i128 * s as i128;
            hi += (end - 1) as i128 * s as i128;
        }
        Some((lo, hi))
    }

    /// Checks that the view presents `space` and reads only inside a buffer
    /// of type `ty`, padding with a value of its dtype. A failure is a
    /// compiler bug, described for the verifier.
    pub(crate) fn check(&self, ty: &TensorType, space: &Shape) -> Result<(), String> {
        if self.shape != *space {
            return Err(format!("view {} does not present {space}", self.shape));
        }
        if self.strides.len() != space.rank() {
            return Err(format!(
                "view strides {:?} do not match {space}",
                self.strides
            ));
        }
        if let Some(mask) = &self.mask {
            if mask.valid.len() != space.rank() {
                return Err(format!("view mask {:?} does not match {space}", mask.valid));
            }
            if mask.fill.dtype() != ty.dtype {
                return Err(format!("view pads {} with {}", ty, mask.fill));
            }
        }
        if let Some((lo, hi)) = self.bounds()
            && (lo < 0 || hi >= ty.shape.numel() as i128)
        {
            return Err(format!(
                "view {self} of {} reads {lo}..={hi}, outside the buffer",
                self.shape
            ));
        }
        Ok(())
    }

    /// The fill value, when the view reads nothing but fill (a pad around an
    /// empty range, or a slice of the padding alone).
    pub fn only_fill(&self) -> Option<Scalar> {
        let mask = self.mask.as_ref()?;
        let empty = mask.valid.iter().any(|&(start, end)| start >= end);
        (empty && self.shape.numel() > 0).then_some(mask.fill)
    }

    /// Strides of size-1 axes are 0 and a mask that keeps everything is
    /// dropped, so that equal index maps are equal values.
    fn canonical(mut self) -> View {
        for (s, &d) in self.strides.iter_mut().zip(self.shape.dims()) {
            if d == 1 {
                *s = 0;
            }
        }
        if let Some(mask) = &self.mask {
            let keeps_all = mask
                .valid
                .iter()
                .zip(self.shape.dims())
                .all(|(&(start, end), &d)| start == 0 && end >= d);
            if keeps_all || self.shape.numel() == 0 {
                self.mask = None;
            }
        }
        self
    }

    /// The view after a reshape to `to`, or `None` when it is not one view
    /// (the view is padded, or its strides do not allow it). PyTorch's `view`
    /// rule: groups of axes that are contiguous among themselves may be split
    /// and merged; anything else needs a copy.
    pub fn reshape(&self, to: &Shape) -> Option<View> {
        if self.mask.is_some() {
            return None;
        }
        if self.shape.numel() == 0 {
            return Some(
                View {
                    offset: self.offset,
                    ..View::contiguous(to)
                }
                .canonical(),
            );
        }
        // Drop size-1 axes: they carry no stride, and keep the rest as (dim, stride).
        let old: SmallVec<[(usize, usize); 4]> = self
            .shape
            .dims()
            .iter()
            .zip(&self.strides)
            .filter(|(d, _)| **d != 1)
            .map(|(&d, &s)| (d, s))
            .collect();
        let mut strides: SmallVec<[usize; 4]> = SmallVec::from_elem(0, to.rank());
        let new = to.dims();
        // Walk both shapes from the innermost axis, one chunk of mergeable old axes at a time.
        let mut v = new.len();
        let mut t = old.len();
        while t > 0 {
            let base = old[t - 1].1;
            let mut chunk = 1usize;
            // Extend the chunk while the next outer axis continues it.
            loop {
                chunk *= old[t - 1].0;
                t -= 1;
                if t == 0 || old[t - 1].1 != chunk * base {
                    break;
                }
            }
            let mut covered = 1usize;
            while v > 0 && (covered < chunk || new[v - 1] == 1) {
                strides[v - 1] = covered * base;
                covered *= new[v - 1];
                v -= 1;
            }
            if covered != chunk {
                return None;
            }
        }
        // Whatever is left of the new shape is size-1 axes.
        if new[..v].iter().any(|&d| d != 1) {
            return None;
        }
        Some(
            View {
                shape: to.clone(),
                strides,
                offset: self.offset,
                mask: None,
            }
            .canonical(),
        )
    }

    /// For each axis of `coarse`, the run of axes of `fine` that it merges
    /// in row-major order (axes of one element belong to no run, or to any),
    /// or `None` when `coarse` is not such a merge of `fine`: `[2, 3, 4]`
    /// as `[6, 4]` is `[0..2, 2..3]`, as `[2, 12]` is `[0..1, 1..3]`, as
    /// `[4, 6]` nothing.
    pub fn runs(fine: &Shape, coarse: &Shape) -> Option<Vec<std::ops::Range<usize>>> {
        if fine.numel() != coarse.numel() || fine.numel() == 0 {
            return None;
        }
        let f = fine.dims();
        let mut at = 0;
        let mut runs = Vec::with_capacity(coarse.rank());
        for &d in coarse.dims() {
            let start = at;
            let mut size = 1;
            while size < d && at < f.len() {
                size *= f[at];
                at += 1;
            }
            if size != d {
                return None;
            }
            runs.push(start..at);
        }
        // Only axes of one element may be left.
        f[at..].iter().all(|&d| d == 1).then_some(runs)
    }

    /// The view after a permute: output axis `i` is axis `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> View {
        View {
            shape: Shape(perm.iter().map(|&p| self.shape.dims()[p]).collect()),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
            mask: self.mask.as_ref().map(|m| Mask {
                valid: perm.iter().map(|&p| m.valid[p]).collect(),
                fill: m.fill,
            }),
        }
        .canonical()
    }

    /// The view after an expand to `to`, NumPy's `broadcast_to`: new leading
    /// axes and size-1 axes read with stride 0.
    pub(crate) fn expand(&self, to: &Shape) -> View {
        let lead = to.rank() - self.shape.rank();
        let mut strides: SmallVec<[usize; 4]> = SmallVec::from_elem(0, lead);
        strides.extend(self.strides.iter().copied());
        // A size-1 axis of a canonical view is fully valid, so it stays valid at any size.
        let mask = self.mask.as_ref().map(|m| Mask {
            valid: (0..to.rank())
                .map(|a| match a.checked_sub(lead) {
                    Some(a) if self.shape.dims()[a] != 1 => m.valid[a],
                    _ => (0, to.dims()[a]),
                })
                .collect(),
            fill: m.fill,
        });
        View {
            shape: to.clone(),
            strides,
            offset: self.offset,
            mask,
        }
        .canonical()
    }

    /// The view after a slice by `ranges`, one per axis.
    pub(crate) fn slice(&self, ranges: &[SliceRange]) -> View {
        let mut offset = self.offset;
        let mut strides = SmallVec::new();
        for (r, &s) in ranges.iter().zip(&self.strides) {
            offset += (r.start * s) as isize;
            strides.push(r.step * s);
        }
        // New coordinate c reads old coordinate start + c*step; keep the c whose
        // old coordinate lies in the old valid range.
        let mask = self.mask.as_ref().map(|m| Mask {
            valid: ranges
                .iter()
                .zip(&m.valid)
                .map(|(r, &(start, end))| {
                    let first = start.saturating_sub(r.start).div_ceil(r.step);
                    let last = end.saturating_sub(r.start).div_ceil(r.step);
                    (first.min(r.len()), last.min(r.len()))
                })
                .collect(),
            fill: m.fill,
        });
        View {
            shape: Shape(ranges.iter().map(SliceRange::len).collect()),
            strides,
            offset,
            mask,
        }
        .canonical()
    }

    /// The view after an unfold of `axis` into windows of `size` elements,
    /// `step` apart (`Op::Unfold`), or `None` when that axis is padded: its
    /// valid part would not be a range of window starts and offsets.
    pub(crate) fn unfold(&self, axis: usize, size: usize, step: usize) -> Option<View> {
        let dim = self.shape.dims()[axis];
        let mut mask = self.mask.clone();
        if let Some(m) = &mut mask {
            let (start, end) = m.valid[axis];
            if start != 0 || end < dim {
                return None;
            }
            let windows = (dim - size) / step + 1;
            m.valid[axis] = (0, windows);
            m.valid.push((0, size));
        }
        let mut shape = self.shape.dims().to_vec();
        shape[axis] = (dim - size) / step + 1;
        shape.push(size);
        let mut strides = self.strides.clone();
        strides[axis] *= step;
        strides.push(self.strides[axis]);
        Some(
            View {
                shape: Shape(shape.into()),
                strides,
                offset: self.offset,
                mask,
            }
            .canonical(),
        )
    }

    /// The view after padding every axis with `(before, after)` elements of
    /// `value`, or `None` when the view is already padded with another value.
    pub(crate) fn pad(&self, pads: &[(usize, usize)], value: Scalar) -> Option<View> {
        let old = match &self.mask {
            Some(m) if m.fill != value => return None,
            Some(m) => m.valid.clone(),
            None => self.shape.dims().iter().map(|&d| (0, d)).collect(),
        };
        let mut offset = self.offset;
        for (&(before, _), &s) in pads.iter().zip(&self.strides) {
            offset -= (before * s) as isize;
        }
        let padded = View {
            shape: Shape(
                pads.iter()
                    .zip(self.shape.dims())
                    .map(|(&(b, a), &d)| b + d + a)
                    .collect(),
            ),
            strides: self.strides.clone(),
            offset,
            mask: Some(Mask {
                valid: pads
                    .iter()
                    .zip(&old)
                    .map(|(&(before, _), &(start, end))| (start + before, end + before))
                    .collect(),
                fill: value,
            }),
        }
        .canonical();
        Some(padded)
    }

    /// Whether this view only broadcasts a contiguous buffer of `shape`: it
    /// adds or drops size-1 axes and repeats along stride-0 axes, nothing else.
    /// A value read this way can be recomputed inside its reader, because the
    /// reader's index maps onto the value's own index without a reshape.
    pub fn is_broadcast_of(&self, shape: &Shape) -> bool {
        self.offset == 0 && self.mask.is_none() && self.read_axes() == contiguous_axes(shape)
    }

    /// Whether this view reads a contiguous buffer of `shape` as a broadcast
    /// does (`is_broadcast_of`) but with the axes in any order: a transpose
    /// of a broadcast. A value of `shape` read this way can be recomputed at
    /// the reader's index too, its own index being a permutation of it.
    pub fn is_permuted_broadcast_of(&self, shape: &Shape) -> bool {
        let (mut read, mut own) = (self.read_axes(), contiguous_axes(shape));
        read.sort_unstable();
        own.sort_unstable();
        self.offset == 0 && self.mask.is_none() && read == own
    }

    /// The view with `axis` held at coordinate 0 and stretched to `picks`,
    /// and the stride along it: what a gather along `axis` reads besides
    /// its run-time position (`Expr::Gather`). `None` when the view is
    /// padded along `axis`, where a position may land in the padding.
    pub(crate) fn gathered(&self, axis: usize, picks: usize) -> Option<(View, usize)> {
        let len = self.shape.dims()[axis];
        if let Some(mask) = &self.mask
            && mask.valid[axis] != (0, len)
        {
            return None;
        }
        let mut dims = self.shape.dims().to_vec();
        dims[axis] = picks;
        let mut view = self.clone();
        view.shape = Shape::new(&dims);
        let stride = std::mem::replace(&mut view.strides[axis], 0);
        if let Some(mask) = &mut view.mask {
            mask.valid[axis] = (0, picks);
        }
        Some((view.canonical(), stride))
    }

    /// The (extent, stride) of each axis that moves through the source: more
    /// than one element and a nonzero stride.
    fn read_axes(&self) -> SmallVec<[(usize, usize); 4]> {
        let dims = self.shape.dims().iter().zip(&self.strides);
        dims.filter(|(d, s)| **d != 1 && **s != 0)
            .map(|(&d, &s)| (d, s))
            .collect()
    }

    /// The view that reads through `self` at the index `outer` gives, where
    /// `outer` is a broadcast of `self`'s shape, its axes in any order
    /// (`outer.is_permuted_broadcast_of`). Each axis of `outer` with more
    /// than one element and a nonzero stride is the axis of `self` of that
    /// extent and that stride in `self`'s row-major layout; every other axis
    /// of `outer` repeats.
    pub fn under(&self, outer: &View) -> View {
        let dims = self.shape.dims();
        let own = self.shape.strides();
        let axis_of = |d: usize, s: usize| (0..dims.len()).find(|&a| dims[a] == d && own[a] == s);
        let mut strides = SmallVec::new();
        let mut valid = SmallVec::new();
        for (&d, &s) in outer.shape.dims().iter().zip(&outer.strides) {
            match (d != 1 && s != 0).then(|| axis_of(d, s)).flatten() {
                Some(a) => {
                    strides.push(self.strides[a]);
                    valid.push(self.mask.as_ref().map_or((0, d), |m| m.valid[a]));
                }
                None => {
                    strides.push(0);
                    valid.push((0, d));
                }
            }
        }
        View {
            shape: outer.shape.clone(),
            strides,
            offset: self.offset,
            mask: self.mask.as_ref().map(|m| Mask {
                valid,
                fill: m.fill,
            }),
        }
        .canonical()
    }
}

/// The (extent, stride) of each axis of more than one element of a
/// contiguous buffer of `shape`.
fn contiguous_axes(shape: &Shape) -> SmallVec<[(usize, usize); 4]> {
    let dims = shape.dims().iter().zip(shape.strides());
    dims.filter(|(d, _)| **d != 1)
        .map(|(&d, s)| (d, s))
        .collect()
}

/// The index map without the shape, which the printed IR shows in the type:
/// `strides [0,1] offset 2 valid [0:3,1:4] else 0.0`, trivial parts left out.
impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.strides.iter().map(usize::to_string).collect();
        write!(f, "strides [{}]", parts.join(","))?;
        if self.offset != 0 {
            write!(f, " offset {}", self.offset)?;
        }
        if let Some(mask) = &self.mask {
            let parts: Vec<String> = mask.valid.iter().map(|(s, e)| format!("{s}:{e}")).collect();
            write!(f, " valid [{}] else {}", parts.join(","), mask.fill)?;
        }
        Ok(())
    }
}
