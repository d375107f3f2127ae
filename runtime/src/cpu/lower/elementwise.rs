//! The loops of an elementwise kernel, or of a matmul's epilogue over the
//! product in place: one flat loop when the nest merges to one axis, else a
//! row loop around an inner loop, each four lanes at a time where the
//! block allows (`lane_op`); a
//! row of padded reads in three stretches, its middle unpadded.

use std::ops::Range;

use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_ir::DType;
use kiln_ir::kernel::Block;

use super::emit::{Emitter, Placed, RowBase, Rows};
use super::{RowRange, UNROLL, vectorizable_hoisted};
use crate::nest::{Access, Nest};

impl<'a> Emitter<'a> {
    /// An elementwise kernel, or a matmul epilogue when `acc_in_place`.
    pub(super) fn elementwise(
        &mut self,
        body: &Block,
        nest: &Nest,
        acc_in_place: bool,
        start: Value,
        end: Value,
    ) -> RowRange {
        let (reads, out) = nest.accesses.split_at(nest.accesses.len() - 1);
        let out = &out[0];
        // Flat: one merged axis, and the range is over elements.
        let flat = nest.rows == 1 && nest.inner.len() == 1;
        if flat {
            let zero = self.iconst(0);
            let bases = self.bases(&nest.accesses, zero);
            let hoisted = self.hoist(body, reads, Rows::One(&bases), nest.inner[0], (None, &[]));
            let lanes = vectorizable_hoisted(body, reads, out, &hoisted);
            let at = Placed {
                block: body,
                accesses: reads,
                rows: Rows::One(&bases),
                hoisted: &hoisted,
            };
            let out_base = bases[bases.len() - 1];
            self.inner_loop(at, (out, out_base), start..end, lanes, acc_in_place);
            RowRange {
                rows: nest.inner[0],
                row_len: 1,
            }
        } else {
            let inner_len: usize = nest.inner.iter().product();
            let unpadded = unpadded_middle(reads);
            let invariant = self.invariant(body, reads, nest.rows * inner_len > 0);
            self.counted_loop(start, end, 1, |e, row| {
                let bases = e.bases(&nest.accesses, row);
                let out_base = bases[bases.len() - 1];
                let zero = e.iconst(0);
                let n = e.iconst(inner_len as i64);
                let whole = |e: &mut Self, from: Value, to: Value, vector: bool| {
                    let rows = Rows::One(&bases);
                    let hoisted = e.hoist(body, reads, rows, inner_len, (None, &invariant));
                    let lanes = vector && vectorizable_hoisted(body, reads, out, &hoisted);
                    let at = Placed {
                        block: body,
                        accesses: reads,
                        rows,
                        hoisted: &hoisted,
                    };
                    e.inner_loop(at, (out, out_base), from..to, lanes, acc_in_place);
                };
                let Some((lo, hi, clear)) = &unpadded else {
                    whole(e, zero, n, true);
                    return;
                };
                // The middle of every row reads unpadded, in vectors: a read
                // whose row lies in its padding reads the fill there
                // (`Access::row_fill`), as a concatenation's parts do in the
                // rows of the others. Only the row's ends run one element
                // at a time.
                let (lo, hi) = (e.iconst(*lo as i64), e.iconst(*hi as i64));
                whole(e, zero, lo, false);
                let rows = Rows::One(&bases);
                let hoisted = e.hoist(body, clear, rows, inner_len, (None, &invariant));
                let lanes = vectorizable_hoisted(body, clear, out, &hoisted);
                let at = Placed {
                    block: body,
                    accesses: clear,
                    rows,
                    hoisted: &hoisted,
                };
                e.inner_loop(at, (out, out_base), lo..hi, lanes, acc_in_place);
                whole(e, hi, n, false);
            });
            RowRange {
                rows: nest.rows,
                row_len: inner_len,
            }
        }
    }

    /// `for j in from..to`, four lanes at a time when `lanes`, then one at a
    /// time: `body` at `j` stored into `out` at `j`, with `acc_in_place` given
    /// the output's value there as its `acc`.
    fn inner_loop(
        &mut self,
        body: Placed,
        (out, out_base): (&Access, RowBase),
        Range { start, end: to }: Range<Value>,
        lanes: bool,
        acc_in_place: bool,
    ) {
        let mut from = start;
        if lanes {
            // Four independent vectors per trip, then one, then the scalar tail.
            for unroll in [UNROLL, 1] {
                from = self.counted_loop(from, to, 4 * unroll as i64, |e, j| {
                    for u in 0..unroll {
                        let j = e.b.ins().iadd_imm_s(j, 4 * u as i64);
                        let acc = acc_in_place.then(|| e.load(out, out_base, j, DType::F32, true));
                        e.store_body(body, (out, out_base), j, (acc, acc_in_place), true);
                    }
                });
            }
        }
        self.counted_loop(from, to, 1, |e, j| {
            let acc = acc_in_place.then(|| e.load(out, out_base, j, DType::F32, false));
            e.store_body(body, (out, out_base), j, (acc, acc_in_place), false);
        });
    }
}

/// For a row loop with padded reads, each padded along its one inner axis
/// at most: the part `lo..hi` of the row where every padded read is inside
/// its valid range along that axis, and the reads as unpadded there (a pad
/// or a window stored before a convolution, whose rows are the padding, a
/// run of the input, the padding); `None` without padded reads, or where no
/// part of the row is valid for all of them.
fn unpadded_middle(reads: &[Access]) -> Option<(usize, usize, Vec<Access>)> {
    let padded: Vec<&Access> = reads.iter().filter(|a| a.fill.is_some()).collect();
    if padded.is_empty() || padded.iter().any(|a| a.inner.len() != 1) {
        return None;
    }
    let lo = padded.iter().map(|a| a.inner[0].lo).max()?;
    let hi = padded.iter().map(|a| a.inner[0].hi).min()?;
    (lo < hi).then(|| {
        let clear = reads
            .iter()
            .map(|a| Access {
                fill: None,
                row_fill: a.fill,
                ..a.clone()
            })
            .collect();
        (lo, hi, clear)
    })
}
