//! Attention without its score matrix: `softmax(q kᵀ · scale + bias) v`
//! for a block of queries at a time, the scores of a block of keys in a
//! scratch block and never in memory whole. Flash attention's online
//! softmax: each query keeps its running maximum and sum, and its output
//! is rescaled as the maximum grows. The two products of each block go
//! through `gemm::sgemm`, which checks every element they read.

use crate::gemm::{self, Axis, Fused, Matrix, Product};
use crate::{Error, Isa, rows, team};

/// Queries a task takes at a time: its scores (`QUERIES x KEYS`) and
/// outputs stay in L2.
const QUERIES: usize = 128;

/// Keys scored at a time: a block of scores stays in L1, and a mask's
/// blocks that hide every key (a causal mask's past the diagonal) are
/// skipped.
const KEYS: usize = 128;

/// An operand of attention, `[batch, rows, cols]`: element `(b, i, j)` at
/// `data[batches[b] + i * rows + j * cols]`.
#[derive(Clone, Copy, Debug)]
pub struct Heads<'a> {
    /// The values it reads among.
    pub data: &'a [f32],
    /// The offset of each batch's first element.
    pub batches: &'a [isize],
    /// Elements between neighbouring rows (0 for a broadcast).
    pub rows: isize,
    /// Elements between neighbouring columns (0 for a broadcast).
    pub cols: isize,
}

impl<'a> Heads<'a> {
    /// Where element `(b, i, j)` lies in `data`, for an element `attention`
    /// checked to lie there (so the wrapping sum is its offset).
    fn offset(&self, b: usize, i: usize, j: usize) -> usize {
        let rows = (i as isize).wrapping_mul(self.rows);
        let cols = (j as isize).wrapping_mul(self.cols);
        self.batches[b].wrapping_add(rows).wrapping_add(cols) as usize
    }

    /// Element `(b, i, j)`, checked to lie in `data`.
    fn at(&self, b: usize, i: usize, j: usize) -> f32 {
        self.data[self.offset(b, i, j)]
    }

    /// Batch `b`'s `[rows, cols]` matrix from row `first` on.
    fn matrix(&self, b: usize, first: usize, (rows, cols): (usize, usize)) -> Matrix<'a> {
        // Wrapping: an operand without elements may lie anywhere, and none
        // of its elements is read.
        let offset = (first as isize).wrapping_mul(self.rows);
        Matrix {
            data: self.data,
            offset: self.batches[b].wrapping_add(offset),
            rows: Axis::Strided {
                len: rows,
                stride: self.rows,
            },
            cols: Axis::Strided {
                len: cols,
                stride: self.cols,
            },
        }
    }
}

/// One attention: queries `q` (`[batch, l, e]`), keys `k` (`[batch, s,
/// e]`), values `v` (`[batch, s, ev]`), and a bias added to the scores
/// (`[batch, l, s]`).
#[derive(Clone, Copy, Debug)]
pub struct Attention<'a> {
    /// The queries.
    pub q: Heads<'a>,
    /// The keys.
    pub k: Heads<'a>,
    /// The values.
    pub v: Heads<'a>,
    /// Added to the scores, if any.
    pub bias: Option<Heads<'a>>,
    /// `[batch, l, s, e, ev]`.
    pub dims: [usize; 5],
    /// The scores' factor.
    pub scale: f32,
    /// What a query every key is hidden from gets (its scores all -inf):
    /// zeros, or NaN as a plain softmax gives.
    ///
    /// Keys and values hidden from every query of a block, and all of them
    /// from a query every key is hidden from, are not read, as in flash
    /// attention: a NaN or an infinity there, which the ops would carry
    /// into the result through `0 · inf`, does not reach it.
    pub hidden: f32,
}

/// `out` (`[batch, l, ev]`, row-major) = `softmax(q kᵀ · scale + bias) v`,
/// by `isa`'s GEMM path, a query block per task on the team's threads.
///
/// Every element read is checked against its slice first: batch tables
/// shorter than the batch, reads outside an operand's slice and an `out`
/// of another length are errors.
pub fn attention(isa: Isa, att: &Attention<'_>, out: &mut [f32]) -> Result<(), Error> {
    let [batch, l, s, e, ev] = att.dims;
    let mut operands = vec![("q", att.q, l, e), ("k", att.k, s, e), ("v", att.v, s, ev)];
    operands.extend(att.bias.map(|bias| ("bias", bias, l, s)));
    for (name, heads, rows, cols) in operands {
        if heads.batches.len() < batch {
            return Err(Error::Short {
                what: name,
                len: heads.batches.len(),
                needs: batch,
            });
        }
        for b in 0..batch {
            heads.matrix(b, 0, (rows, cols)).check(name)?;
        }
    }
    let needs = batch.checked_mul(l).and_then(|n| n.checked_mul(ev));
    if needs != Some(out.len()) {
        return Err(Error::Short {
            what: "attention's output",
            len: out.len(),
            needs: needs.unwrap_or(usize::MAX),
        });
    }
    if ev == 0 {
        return Ok(());
    }
    let failure = std::sync::Mutex::new(None);
    team::for_each_chunk(out, QUERIES.saturating_mul(ev), &|chunk, out| {
        let first = chunk * QUERIES;
        let rows = out.len() / ev;
        // A chunk's rows may straddle batches: one block for each.
        let mut at = first;
        while at < first + rows {
            let (b, i0) = (at / l, at % l);
            let i1 = l.min(i0 + first + rows - at);
            let block = &mut out[(at - first) * ev..(at - first + i1 - i0) * ev];
            if let Err(error) = queries(isa, att, b, i0..i1, block) {
                *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
            }
            at += i1 - i0;
        }
    });
    match failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// Queries `range` of batch `b` into `out` (their rows, `ev` each).
fn queries(
    isa: Isa,
    att: &Attention<'_>,
    b: usize,
    range: std::ops::Range<usize>,
    out: &mut [f32],
) -> Result<(), Error> {
    let [_, _, s, e, ev] = att.dims;
    let m = range.len();
    let q = att.q.matrix(b, range.start, (m, e));
    let mut scores = vec![0.0f32; m * KEYS.min(s)];
    let mut product = vec![0.0f32; if s > KEYS { m * ev } else { 0 }];
    let (mut max, mut sum) = (vec![f32::NEG_INFINITY; m], vec![0.0f32; m]);
    let mut rescale = vec![1.0f32; m];
    let mut first = true;
    for j0 in (0..s).step_by(KEYS) {
        let n = KEYS.min(s - j0);
        // Keys the bias hides from every query here weigh nothing: a
        // causal mask's blocks past the diagonal.
        if hidden(att, b, (&range, j0..j0 + n)) {
            continue;
        }
        let mut k = att.k.matrix(b, j0, (n, e));
        // kᵀ: the keys' columns as rows.
        (k.rows, k.cols) = (k.cols, k.rows);
        let scores = &mut scores[..m * n];
        product_of(isa, q, k, scores)?;
        for (r, row) in scores.chunks_exact_mut(n).enumerate() {
            biased(att, b, (range.start + r, j0), row);
            let top = row_max(row)?;
            let new = if top > max[r] || top.is_nan() {
                top
            } else {
                max[r]
            };
            if new == f32::NEG_INFINITY {
                // Every key so far is hidden from this query.
                row.fill(0.0);
                continue;
            }
            rescale[r] = if max[r] == f32::NEG_INFINITY {
                0.0
            } else {
                (max[r] - new).exp()
            };
            sum[r] = sum[r] * rescale[r] + exp_sum(row, new)?;
            max[r] = new;
        }
        let v = att.v.matrix(b, j0, (n, ev));
        let p = Matrix {
            data: scores,
            offset: 0,
            rows: Axis::Strided {
                len: m,
                stride: n as isize,
            },
            cols: Axis::Strided { len: n, stride: 1 },
        };
        if first {
            // The first block's products are the outputs so far.
            product_of(isa, p, v, out)?;
            first = false;
            continue;
        }
        product_of(isa, p, v, &mut product)?;
        for ((to, from), c) in out
            .chunks_exact_mut(ev)
            .zip(product.chunks_exact(ev))
            .zip(&rescale)
        {
            to.iter_mut()
                .zip(from)
                .for_each(|(to, from)| *to = *to * c + from);
        }
    }
    // Over no keys, the product over an empty axis: zeros.
    let hidden = if s == 0 { 0.0 } else { att.hidden };
    for (row, sum) in out.chunks_exact_mut(ev).zip(sum) {
        match sum {
            // Every key is hidden from this query.
            0.0 => row.fill(hidden),
            _ => row.iter_mut().for_each(|x| *x /= sum),
        }
    }
    Ok(())
}

/// Whether the bias hides every key of `keys` from every query of
/// `queries` (is -inf there), read until a value that is not.
fn hidden(
    att: &Attention<'_>,
    b: usize,
    (queries, keys): (&std::ops::Range<usize>, std::ops::Range<usize>),
) -> bool {
    let Some(bias) = att.bias else {
        return false;
    };
    queries
        .clone()
        .all(|i| keys.clone().all(|j| bias.at(b, i, j) == f32::NEG_INFINITY))
}

/// Scores `row` of query `i` from key `j0` on: scaled, then the bias added.
fn biased(att: &Attention<'_>, b: usize, (i, j0): (usize, usize), row: &mut [f32]) {
    let scale = att.scale;
    let Some(bias) = att.bias else {
        row.iter_mut().for_each(|x| *x *= scale);
        return;
    };
    if bias.cols == 1 {
        let at = bias.offset(b, i, j0);
        let values = &bias.data[at..at + row.len()];
        row.iter_mut()
            .zip(values)
            .for_each(|(x, b)| *x = *x * scale + b);
        return;
    }
    for (j, x) in row.iter_mut().enumerate() {
        *x = *x * scale + bias.at(b, i, j0 + j);
    }
}

/// The IEEE maximum of `row`, NaN where it holds one.
fn row_max(row: &[f32]) -> Result<f32, Error> {
    #[cfg(target_arch = "x86_64")]
    if rows::available() {
        return rows::max(row);
    }
    Ok(row.iter().fold(
        f32::NEG_INFINITY,
        |m, &x| if x > m || x.is_nan() { x } else { m },
    ))
}

/// `row[j] = e^(row[j] - shift)`, and their sum.
fn exp_sum(row: &mut [f32], shift: f32) -> Result<f32, Error> {
    #[cfg(target_arch = "x86_64")]
    if rows::available() {
        return rows::exp_sum_in_place(row, shift);
    }
    Ok(row.iter_mut().fold(0.0, |sum, x| {
        *x = (*x - shift).exp();
        sum + *x
    }))
}

/// `c = a b` on the calling thread.
fn product_of(isa: Isa, a: Matrix<'_>, b: Matrix<'_>, c: &mut [f32]) -> Result<(), Error> {
    let fused = Fused::default();
    gemm::sgemm(isa, Product { a, b, fused }, c, 1, &|_, _| {})?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[rows, cols]` row-major heads over `data`, one batch.
    fn heads(data: &[f32], cols: usize) -> Heads<'_> {
        Heads {
            data,
            batches: &[0],
            rows: cols as isize,
            cols: 1,
        }
    }

    /// Attention of 3 queries over 200 keys (two blocks), heads of 5 and
    /// 2, by the definition in f64.
    fn definition(q: &[f32], k: &[f32], v: &[f32], bias: &[f32]) -> Vec<f64> {
        let mut out = Vec::new();
        for i in 0..3 {
            let scores: Vec<f64> = (0..200)
                .map(|j| {
                    let dot: f64 = (0..5)
                        .map(|e| f64::from(q[i * 5 + e]) * f64::from(k[j * 5 + e]))
                        .sum();
                    dot * 0.5 + f64::from(bias[i * 200 + j])
                })
                .collect();
            let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f64 = w.iter().sum();
            for c in 0..2 {
                out.push(
                    (0..200)
                        .map(|j| w[j] * f64::from(v[j * 2 + c]))
                        .sum::<f64>()
                        / total,
                );
            }
        }
        out
    }

    #[test]
    fn attention_over_two_blocks_of_keys_is_its_definition() {
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7 + seed) % 13) as f32 / 6.0 - 1.0)
                .collect()
        };
        let (q, k, v) = (values(15, 1), values(1000, 2), values(400, 3));
        let mut bias = values(600, 4);
        // The last query sees no key.
        bias[400..].fill(f32::NEG_INFINITY);
        let att = Attention {
            q: heads(&q, 5),
            k: heads(&k, 5),
            v: heads(&v, 2),
            bias: Some(heads(&bias, 200)),
            dims: [1, 3, 200, 5, 2],
            scale: 0.5,
            hidden: f32::NAN,
        };
        let mut out = vec![0.0; 6];
        attention(Isa::Generic, &att, &mut out).unwrap();
        let want = definition(&q, &k, &v, &bias);
        for (i, (got, want)) in out.iter().zip(&want).enumerate() {
            let close = (f64::from(*got) - want).abs() <= 1e-5 * want.abs().max(1.0);
            assert!(
                close || (got.is_nan() && want.is_nan()),
                "{i}: {got} against {want}"
            );
        }
        assert!(out[4].is_nan() && out[5].is_nan());
    }

    #[test]
    fn reads_outside_the_operands_are_errors() {
        let (q, kv) = (vec![0.0f32; 8], vec![0.0f32; 8]);
        let att = |dims: [usize; 5]| Attention {
            q: heads(&q, 2),
            k: heads(&kv, 2),
            v: heads(&kv, 2),
            bias: None,
            dims,
            scale: 1.0,
            hidden: 0.0,
        };
        let mut out = vec![0.0; 8];
        let fits = att([1, 4, 4, 2, 2]);
        assert_eq!(attention(Isa::Generic, &fits, &mut out), Ok(()));
        // Five queries of 2 in a slice of 8.
        let long = att([1, 5, 4, 2, 2]);
        let mut longer = vec![0.0; 10];
        assert!(matches!(
            attention(Isa::Generic, &long, &mut longer),
            Err(Error::Operand { operand: "q", .. })
        ));
        // Two batches, one offset.
        let two = att([2, 1, 4, 2, 2]);
        assert!(matches!(
            attention(Isa::Generic, &two, &mut out[..4]),
            Err(Error::Short { what: "q", .. })
        ));
        // An output of another length.
        assert!(matches!(
            attention(Isa::Generic, &fits, &mut out[..7]),
            Err(Error::Short { .. })
        ));
    }
}
