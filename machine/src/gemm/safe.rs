//! `sgemm`, the GEMM's safe entry: operands as slices with the offsets of
//! their rows and columns, every offset checked before a core reads one.

use super::packed::PackedB;
use super::{Operand, RawFused};
use crate::{Error, Isa};

/// One axis of an operand: `len` indices, each at a multiple of `stride`,
/// or each at its own offset (the windows of a convolution, each row a
/// kernel position of a channel, each column an output position: axes that
/// merge without one stride between them).
#[derive(Clone, Copy, Debug)]
pub enum Axis<'a> {
    /// Index `i` at `i * stride`.
    Strided {
        /// The indices.
        len: usize,
        /// Elements between neighbours (any sign, or 0 for a broadcast).
        stride: isize,
    },
    /// Index `i` at the table's offset `i`.
    Table(&'a Table),
}

/// The offsets of an axis's indices, with their least and greatest found
/// once: a table serves every batch of a product, each checked in O(1).
#[derive(Clone, Debug)]
pub struct Table {
    offsets: Vec<isize>,
    reach: (i128, i128),
}

impl Table {
    /// The table of `offsets`.
    pub fn new(offsets: Vec<isize>) -> Table {
        let reach = offsets.iter().fold((i128::MAX, i128::MIN), |(lo, hi), &o| {
            (lo.min(o as i128), hi.max(o as i128))
        });
        Table { offsets, reach }
    }
}

impl Axis<'_> {
    /// Its indices.
    pub fn len(&self) -> usize {
        match self {
            Axis::Strided { len, .. } => *len,
            Axis::Table(table) => table.offsets.len(),
        }
    }

    /// Whether it has no index.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its least and greatest offset (of an axis with an index).
    fn reach(&self) -> (i128, i128) {
        match *self {
            Axis::Strided { len, stride } => {
                let last = (len as i128 - 1) * stride as i128;
                (last.min(0), last.max(0))
            }
            Axis::Table(table) => table.reach,
        }
    }

    /// Its stride and table, as the cores take them.
    fn raw(&self) -> (isize, *const isize) {
        match *self {
            Axis::Strided { stride, .. } => (stride, std::ptr::null()),
            Axis::Table(table) => (0, table.offsets.as_ptr()),
        }
    }
}

/// An operand read where it lies: element `(i, j)` at
/// `data[offset + rows(i) + cols(j)]`; f32 values, or bf16 ones as their
/// bits (`bf16_gemm`).
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a, T = f32> {
    /// The values it reads among.
    pub data: &'a [T],
    /// The offset of element `(0, 0)`.
    pub offset: isize,
    /// Its rows.
    pub rows: Axis<'a>,
    /// Its columns.
    pub cols: Axis<'a>,
}

impl<T> Matrix<'_, T> {
    /// Checks that every element lies inside `data` (an operand without
    /// elements reads none, whatever its offset); `operand` names it.
    pub(crate) fn check(&self, operand: &'static str) -> Result<(), Error> {
        let (rows, cols) = (self.rows.len(), self.cols.len());
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let ((r0, r1), (c0, c1)) = (self.rows.reach(), self.cols.reach());
        // Reaches near 2^127 (lengths near 2^64 by strides near 2^63) add
        // up past i128: out of bounds, as every such reach is.
        let at = |r: i128, c: i128| r.checked_add(c)?.checked_add(self.offset as i128);
        let (first, last) = (at(r0, c0), at(r1, c1));
        let len = self.data.len();
        match (first, last) {
            (Some(first), Some(last)) if first >= 0 && last < len as i128 => Ok(()),
            _ => Err(Error::Operand {
                operand,
                rows,
                cols,
                first: first.unwrap_or(i128::MIN),
                last: last.unwrap_or(i128::MAX),
                len,
            }),
        }
    }

    /// The operand as the cores take it. Its address is formed without the
    /// in-bounds promise of `offset`: an operand without elements may lie
    /// anywhere (a padded empty view), and none of its elements is read.
    pub(super) fn raw(&self) -> Operand<T> {
        let ((rows, row_table), (cols, col_table)) = (self.rows.raw(), self.cols.raw());
        Operand {
            ptr: self.data.as_ptr().wrapping_offset(self.offset),
            rows,
            cols,
            row_table,
            col_table,
        }
    }
}

/// A value added to each element of the product: one per column (a linear
/// layer's) or one per row (a convolution's, per output channel).
#[derive(Clone, Copy, Debug)]
pub enum Bias<'a> {
    /// `c[i][j] + bias[j]`.
    Columns(&'a [f32]),
    /// `c[i][j] + bias[i]`.
    Rows(&'a [f32]),
}

/// What kiln's cores apply to each element of the product in registers as
/// they store it: the bias, then ReLU where `relu`, then the lesser of
/// that and `cap` where there is one, in the order and with the rounding
/// of generated code's epilogues, so that both give the same values (a
/// NaN's payload aside): ReLU keeps NaN and makes anything not above zero
/// +0; the cap is finite and not zero.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fused<'a> {
    /// The bias, if any.
    pub bias: Option<Bias<'a>>,
    /// Whether ReLU follows.
    pub relu: bool,
    /// The value the result is capped at, if any.
    pub cap: Option<f32>,
}

/// A product: `a` (`m x k`) times `b` (`k x n`), and what kiln's
/// cores apply as they store it.
#[derive(Clone, Copy, Debug)]
pub struct Product<'a> {
    /// The left operand.
    pub a: Matrix<'a>,
    /// The right operand.
    pub b: Matrix<'a>,
    /// Applied by kiln's cores.
    pub fused: Fused<'a>,
}

/// The product's `(m, k, n)`, once its operands' inner dimensions agree,
/// every element they read lies inside their slices, and `c` holds `m * n`
/// values (a product of more than `usize::MAX` fits no slice).
fn checked<T>(
    a: &Matrix<'_, T>,
    b: &Matrix<'_, T>,
    c: &[f32],
) -> Result<(usize, usize, usize), Error> {
    b.check("b")?;
    checked_a(a, (b.rows.len(), b.cols.len()), c)
}

/// `checked` for a right operand of `k_b x n` checked before.
fn checked_a<T>(
    a: &Matrix<'_, T>,
    (k_b, n): (usize, usize),
    c: &[f32],
) -> Result<(usize, usize, usize), Error> {
    let (m, k) = (a.rows.len(), a.cols.len());
    if k_b != k {
        return Err(Error::Inner { m, k, k_b, n });
    }
    a.check("a")?;
    let mn = m.saturating_mul(n);
    if c.len() < mn {
        return Err(Error::Short {
            what: "product",
            len: c.len(),
            needs: mn,
        });
    }
    Ok((m, k, n))
}

/// `c = a b` (`c` row-major `m x n`, its first `m * n` values) on `threads`
/// threads, by `isa`'s path. kiln's cores take products large enough for
/// them and not too narrow, and every product with an operand read through
/// a table; they apply the epilogue as they store the product and call
/// `finish(r0, r1)` on each block of rows as it is done, and the result is
/// then true. Else the `gemm` crate computes the plain product (a tabled
/// operand gathered first), and the result is false: the epilogue is the
/// caller's.
///
/// Every element the operands read, `c`'s `m * n` values and the bias are
/// checked against their slices first; `isa` must be one this CPU runs.
/// `threads` is taken between 1 and the team's (`team::threads`).
pub fn sgemm(
    isa: Isa,
    Product { a, b, fused }: Product<'_>,
    c: &mut [f32],
    threads: usize,
    finish: &(dyn Fn(usize, usize) + Sync),
) -> Result<bool, Error> {
    let (m, k, n) = checked(&a, &b, c)?;
    let fused = raw_fused(fused, m, n)?;
    if !isa.available() {
        return Err(Error::MissingIsa { isa });
    }
    // SAFETY: `isa` is available; every element the operands read lies
    // inside their slices and the bias's `m` or `n` values inside its own
    // (checked above), all borrowed for the call; `c` holds `m * n`.
    let (c, threads) = (&mut c[..m * n], threads.clamp(1, crate::team::threads()));
    unsafe { super::gemm(isa, m, n, k, a.raw(), b.raw(), c, threads, fused, finish) }
}

/// `fused` as the cores take it, once its bias holds a value for each of
/// the product's `n` columns (`m` rows where it is added along rows).
fn raw_fused(fused: Fused<'_>, m: usize, n: usize) -> Result<RawFused, Error> {
    let bias = match fused.bias {
        None => None,
        Some(Bias::Columns(values)) => Some((values, false, n)),
        Some(Bias::Rows(values)) => Some((values, true, m)),
    };
    if let Some((values, _, needs)) = bias
        && values.len() < needs
    {
        return Err(Error::Short {
            what: "bias",
            len: values.len(),
            needs,
        });
    }
    Ok(RawFused {
        bias: bias.map_or(std::ptr::null(), |b| b.0.as_ptr()),
        rows: bias.is_some_and(|b| b.1),
        relu: fused.relu,
        cap: fused.cap,
    })
}

/// `c = a b` as `sgemm` computes it, for `b` packed before (`PackedB`, for
/// this `isa`): by kiln's cores, which apply `fused` as they store the
/// product and call `finish(r0, r1)` on each block of rows as it is done.
/// It takes as many threads as the product pays for, up to the team's.
///
/// `a`, `c` and the bias are checked as `sgemm`'s; `b` packed for another
/// path than `isa` is an error.
pub fn sgemm_packed(
    isa: Isa,
    a: Matrix<'_>,
    b: &PackedB,
    fused: Fused<'_>,
    c: &mut [f32],
    finish: &(dyn Fn(usize, usize) + Sync),
) -> Result<(), Error> {
    let (m, _, n) = checked_a(&a, (b.rows(), b.cols()), c)?;
    let fused = raw_fused(fused, m, n)?;
    if b.isa() != isa {
        return Err(Error::PackedFor {
            packed: b.isa(),
            isa,
        });
    }
    if !isa.available() {
        return Err(Error::MissingIsa { isa });
    }
    // SAFETY: `isa` is available and `b` packed for it; every element `a`
    // reads lies inside its slice and the bias's `m` or `n` values inside
    // its own (checked above), all borrowed for the call; `c` holds
    // `m * n`.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        super::packed::gemm(a.raw(), b, &mut c[..m * n], fused, finish)
    };
    // Off x86-64 no path packs (`PackedB::new`): no `b` reaches here.
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (fused, finish);
        return Err(Error::MissingIsa { isa: b.isa() });
    }
    #[cfg(target_arch = "x86_64")]
    Ok(())
}

/// `c = a b` for bf16 `a` (`m x k`) and `b` (`k x n`), given as their bits,
/// into f32 `c` (row-major `m x n`, its first `m * n` values) on `threads`
/// threads, by `isa`'s path: each product exact, their sums in f32, as the
/// product of the operands widened to f32 is (the order of the additions
/// aside). On `Isa::Amx` kiln's AMX core multiplies the bf16 values;
/// elsewhere kiln's f32 cores widen them as they pack them, and products
/// they do not take are `sgemm`'s of both operands widened first.
/// Where kiln's cores compute it they call `finish(r0, r1)` on each block
/// of rows as it is done, and the result is true; any epilogue is the
/// caller's.
///
/// Checked as `sgemm`'s operands are; `isa` must be one this CPU runs.
pub fn bf16_gemm(
    isa: Isa,
    a: Matrix<'_, u16>,
    b: Matrix<'_, u16>,
    c: &mut [f32],
    threads: usize,
    finish: &(dyn Fn(usize, usize) + Sync),
) -> Result<bool, Error> {
    let (m, k, n) = checked(&a, &b, c)?;
    if !isa.available() {
        return Err(Error::MissingIsa { isa });
    }
    let (c, threads) = (&mut c[..m * n], threads.clamp(1, crate::team::threads()));
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx {
        // SAFETY: the CPU runs the core; every element the operands read
        // lies inside their slices (checked above), borrowed for the call;
        // `c` holds `m * n`.
        return unsafe { super::amx::gemm((m, n, k), (a.raw(), b.raw()), c, threads, finish) }
            .map(|()| true);
    }
    // SAFETY: as above, for `isa`'s path.
    unsafe { super::gemm_bf16(isa, (m, n, k), (a.raw(), b.raw()), c, threads, finish) }
}
