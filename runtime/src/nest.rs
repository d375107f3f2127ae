//! Loop nests: a kernel's index space ordered and split into rows (the
//! outer axes, one row per step of a row loop) and an inner loop, with each
//! read and write arranged over it. Pure shape and stride arithmetic, for any
//! backend that emits loops.
//!
//! The order puts a reduction's kept axes first, then its reduced axes.
//! Size-1 axes are dropped and adjacent axes merged wherever every index map
//! allows it, so a contiguous elementwise kernel is one flat loop. Each
//! access keeps its own strides: its base offset at a row comes from the
//! row's coordinates over its outer axes, and the inner loop adds
//! `j * stride`. A padded access keeps each axis's valid range and its fill
//! value.
//!
//! The same facts without merging, for a backend that indexes each axis by
//! its own coordinate (CUDA C): which axes take a place in memory
//! (`placed_axes`), and a reduction's rows and row elements (`Reduction`).

use kiln_ir::kernel::Block;
use kiln_ir::view::View;
use kiln_ir::{Scalar, Shape};

/// One axis of a read in a loop nest: its extent, stride and valid range.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Axis {
    /// Its extent.
    pub(crate) dim: usize,
    /// Elements between neighbours along it.
    pub(crate) stride: i64,
    /// The first valid coordinate (0 unless padded).
    pub(crate) lo: usize,
    /// One past the last valid coordinate (`dim` unless padded).
    pub(crate) hi: usize,
}

/// A buffer access arranged over a loop nest.
#[derive(Clone, Debug)]
pub(crate) struct Access {
    /// The buffer it reads or writes.
    pub(crate) buffer: usize,
    /// The element offset of coordinate zero.
    pub(crate) offset: i64,
    /// Its axes over the rows, outermost first.
    pub(crate) outer: Vec<Axis>,
    /// Its axes over the inner loop, outermost first.
    pub(crate) inner: Vec<Axis>,
    /// The value read outside the valid ranges, when padded.
    pub(crate) fill: Option<Scalar>,
    /// The value read over a whole row whose outer coordinates lie outside
    /// the valid ranges, for an access cut to the unpadded middle of its
    /// rows (`fill` none there): the padding's fill.
    pub(crate) row_fill: Option<Scalar>,
}

impl Access {
    /// Constant along the inner loop: read once per row.
    pub(crate) fn row_invariant(&self) -> bool {
        self.inner.iter().all(|a| a.stride == 0) && (self.fill.is_none() || self.inner.is_empty())
    }

    /// Contiguous along a single inner axis.
    pub(crate) fn unit_stride(&self) -> bool {
        self.fill.is_none() && self.inner.len() == 1 && self.inner[0].stride == 1
    }

    /// Every other element along a single inner axis (a stride-2
    /// convolution's or pooling's window).
    pub(crate) fn stride_two(&self) -> bool {
        self.fill.is_none() && self.inner.len() == 1 && self.inner[0].stride == 2
    }
}

/// A loop nest: the extents of the inner loop, and the reads and the write
/// arranged over it. Row count is the product of the outer extents.
pub(crate) struct Nest {
    /// How many rows.
    pub(crate) rows: usize,
    /// The inner loop's extents, outermost first.
    pub(crate) inner: Vec<usize>,
    /// The accesses, in the order of the views given to `nest`.
    pub(crate) accesses: Vec<Access>,
}

/// A reduction's index space as a loop nest lays it out: one row per
/// coordinate of the kept axes, the reduced axes along the row. Size-1 axes
/// are left out of both.
pub(crate) struct Reduction {
    /// The kept axes, in order, as (axis, extent).
    pub(crate) kept: Vec<(usize, usize)>,
    /// The reduced axes, in the order given, as (axis, extent).
    pub(crate) reduced: Vec<(usize, usize)>,
}

impl Reduction {
    /// The reduction of `space` over `axes`.
    pub(crate) fn new(space: &Shape, axes: &[usize]) -> Reduction {
        Reduction {
            kept: placed_axes(space, (0..space.rank()).filter(|a| !axes.contains(a))),
            reduced: placed_axes(space, axes.iter().copied()),
        }
    }

    /// How many rows: the product of the kept extents.
    pub(crate) fn rows(&self) -> usize {
        self.kept.iter().map(|k| k.1).product()
    }

    /// Elements per row: the product of the reduced extents.
    pub(crate) fn row_len(&self) -> usize {
        self.reduced.iter().map(|r| r.1).product()
    }

    /// `views` arranged over `space` (the reduction's space, or its
    /// broadcast output) in this order, the kept axes outer.
    pub(crate) fn nest(&self, space: &Shape, views: &[(usize, &View)]) -> Nest {
        let order: Vec<usize> = self.kept.iter().chain(&self.reduced).map(|a| a.0).collect();
        nest(space, &order, Some(self.kept.len()), views)
    }
}

/// `axes` of `space`, in the order given, as (axis, extent), less the size-1
/// ones: they take no place in memory and no loop steps along them.
pub(crate) fn placed_axes(
    space: &Shape,
    axes: impl IntoIterator<Item = usize>,
) -> Vec<(usize, usize)> {
    let dims = space.dims();
    axes.into_iter()
        .filter(|&a| dims[a] != 1)
        .map(|a| (a, dims[a]))
        .collect()
}

/// Arranges `views` (each reading `buffers[i]`) over `space` in the axis
/// order `axes`, the first `split` of them outer (`None`: all but the last
/// after merging); drops size-1 axes and merges neighbours on the same side
/// that every view steps through contiguously.
pub(crate) fn nest(
    space: &Shape,
    axes: &[usize],
    split: Option<usize>,
    views: &[(usize, &View)],
) -> Nest {
    let dims = space.dims();
    // Positions in loop order, with the outer/inner boundary, size-1 axes dropped.
    let mut order: Vec<(usize, bool)> = axes
        .iter()
        .enumerate()
        .filter(|&(_, &a)| dims[a] != 1)
        .map(|(p, &a)| (a, split.is_some_and(|k| p < k)))
        .collect();
    let axis_of = |v: &View, a: usize, dim: usize| Axis {
        dim,
        stride: v.strides[a] as i64,
        lo: v.mask.as_ref().map_or(0, |m| m.valid[a].0),
        hi: v.mask.as_ref().map_or(dims[a], |m| m.valid[a].1),
    };
    let mut columns: Vec<Vec<Axis>> = views
        .iter()
        .map(|(_, v)| order.iter().map(|&(a, _)| axis_of(v, a, dims[a])).collect())
        .collect();
    // The extent of every position, kept alongside the views' columns.
    let mut extents: Vec<usize> = order.iter().map(|&(a, _)| dims[a]).collect();
    // Merge position p into p+1 (innermost first) when every view steps
    // through both as one and a padded one is valid all along both (a
    // concatenation's part, padded along the joined axis alone).
    let whole = |a: &Axis| a.lo == 0 && a.hi == a.dim;
    let mut p = order.len().saturating_sub(1);
    while p > 0 {
        let same_side = order[p - 1].1 == order[p].1;
        let mergeable = columns.iter().all(|c| {
            c[p - 1].stride == c[p].stride * c[p].dim as i64 && whole(&c[p - 1]) && whole(&c[p])
        });
        if same_side && mergeable {
            for c in columns.iter_mut() {
                let outer = c.remove(p - 1);
                c[p - 1].dim *= outer.dim;
                c[p - 1].hi = c[p - 1].dim;
            }
            let outer = extents.remove(p - 1);
            extents[p - 1] *= outer;
            order.remove(p - 1);
        }
        p -= 1;
    }
    let outer_count = match split {
        Some(_) => order.iter().filter(|o| o.1).count(),
        None => order.len().saturating_sub(1),
    };
    let inner = extents[outer_count..].to_vec();
    let rows = extents[..outer_count].iter().product();
    let accesses = views
        .iter()
        .zip(columns)
        .map(|((buffer, v), mut c)| {
            let inner = c.split_off(outer_count);
            Access {
                buffer: *buffer,
                offset: v.offset as i64,
                outer: c,
                inner,
                fill: v.mask.as_ref().map(|m| m.fill),
                row_fill: None,
            }
        })
        .collect();
    Nest {
        rows,
        inner,
        accesses,
    }
}

/// The reads of a block (loads and gathers), as (buffer, view), in value
/// order. A gather's view holds its axis still: its access steps along the
/// other axes, and the position picked is added to it per element.
pub(crate) fn loads(block: &Block) -> Vec<(usize, &View)> {
    block
        .values
        .iter()
        .filter_map(|v| v.expr.read())
        .map(|(input, view)| (input as usize, view))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reduction's rows are its kept axes and its row its reduced ones,
    /// size-1 axes in neither; its nest merges what the reads allow.
    #[test]
    fn a_reduction_is_rows_of_kept_axes_over_its_reduced_ones() {
        let space = Shape::new(&[4, 1, 3, 5]);
        let r = Reduction::new(&space, &[2, 1]);
        assert_eq!(r.kept, [(0, 4), (3, 5)]);
        assert_eq!(r.reduced, [(2, 3)]);
        assert_eq!((r.rows(), r.row_len()), (20, 3));
        let view = View::contiguous(&space);
        let n = r.nest(&space, &[(0, &view)]);
        assert_eq!((n.rows, n.inner.as_slice()), (20, &[3][..]));
        let strides = |axes: &[Axis]| axes.iter().map(|a| a.stride).collect::<Vec<_>>();
        assert_eq!(strides(&n.accesses[0].outer), [15, 1]);
        assert_eq!(strides(&n.accesses[0].inner), [5]);
        let all = Reduction::new(&space, &[0, 1, 2, 3]);
        assert!(all.kept.is_empty());
        assert_eq!((all.rows(), all.row_len()), (1, 60));
        let merged = all.nest(&space, &[(0, &view)]);
        assert_eq!((merged.rows, merged.inner.as_slice()), (1, &[60][..]));
    }
}
