//! The loops of an elementwise kernel, or of a matmul's epilogue over the
//! product in place: one flat loop when the nest merges to one axis, else a
//! row loop around an inner loop, each four lanes at a time where the
//! block allows (`lane_op`); a
//! row of padded reads in three stretches, its middle unpadded; and a row
//! whose `where`s pick by conditions constant over it (a concatenation's
//! parts) as a branch to a loop that reads only the picked values.

use std::ops::Range;

use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_ir::kernel::{Block, Expr};
use kiln_ir::{DType, Scalar};

use super::emit::{Emitter, Placed, RowBase, Rows};
use super::{RowRange, UNROLL, hoisted_set};
use crate::loops::lanes::vectorizable_hoisted;
use crate::loops::live;
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
            let lanes = vectorizable_hoisted(body, reads, out, &hoisted_set(&hoisted));
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
                // The stretch `span` of the row, through `reads`.
                let stretch = |e: &mut Self, reads: &[Access], span: Range<Value>, vector: bool| {
                    let rows = Rows::One(&bases);
                    let hoisted = e.hoist(body, reads, rows, inner_len, (None, &invariant));
                    let whole = Version {
                        block: body.clone(),
                        accesses: reads.to_vec(),
                        bases: bases[..reads.len()].to_vec(),
                    };
                    let mut budget = UNSWITCHED;
                    e.unswitched(whole, &hoisted, &mut budget, &mut |e, v| {
                        let lanes = vector
                            && vectorizable_hoisted(
                                &v.block,
                                &v.accesses,
                                out,
                                &hoisted_set(&hoisted),
                            );
                        let at = Placed {
                            block: &v.block,
                            accesses: &v.accesses,
                            rows: Rows::One(&v.bases),
                            hoisted: &hoisted,
                        };
                        e.inner_loop(at, (out, out_base), span.clone(), lanes, acc_in_place);
                    });
                };
                let Some((lo, hi, clear)) = &unpadded else {
                    stretch(e, reads, zero..n, true);
                    return;
                };
                // The middle of every row reads unpadded, in vectors: a read
                // whose row lies in its padding reads the fill there
                // (`Access::row_fill`), as a concatenation's parts do in the
                // rows of the others. Only the row's ends run one element
                // at a time.
                let ends = (*lo > 0, *hi < inner_len);
                let (lo, hi) = (e.iconst(*lo as i64), e.iconst(*hi as i64));
                if ends.0 {
                    stretch(e, reads, zero..lo, false);
                }
                stretch(e, clear, lo..hi, true);
                if ends.1 {
                    stretch(e, reads, hi..n, false);
                }
            });
            RowRange {
                rows: nest.rows,
                row_len: inner_len,
            }
        }
    }

    /// `emit` of `v`, or, where a `where` of `v` picks by a condition
    /// hoisted out of the row, a branch on it to a version of each side that
    /// reads only what its picks need: a concatenation's parts, picked by
    /// the row's position along the joined axis, become a copy of the one
    /// part the row lies in, where every element read all the parts and
    /// selected. The outermost such `where` first, and with it every `where`
    /// on the same condition; at most `budget` branches in all (a
    /// concatenation of `k` parts takes `k - 1`).
    fn unswitched(
        &mut self,
        v: Version,
        hoisted: &[Option<Value>],
        budget: &mut usize,
        emit: &mut dyn FnMut(&mut Self, &Version),
    ) {
        let live = live(&v.block, self.side.iter().map(|s| s.1));
        let pick = (0..v.block.values.len())
            .rev()
            .find_map(|i| match v.block.values[i].expr {
                Expr::Where(c, ..) if live[i] && hoisted[i].is_none() => {
                    hoisted[c as usize].map(|cond| (c, cond))
                }
                _ => None,
            });
        let Some((c, cond)) = pick.filter(|_| *budget > 0) else {
            emit(self, &v);
            return;
        };
        *budget -= 1;
        let blocks = [self.b.create_block(), self.b.create_block()];
        let merge = self.b.create_block();
        self.b.ins().brif(cond, blocks[0], &[], blocks[1], &[]);
        for (block, taken) in blocks.into_iter().zip([true, false]) {
            self.b.switch_to_block(block);
            let picked = v.picking(c, taken, &self.side);
            self.unswitched(picked, hoisted, budget, emit);
            self.b.ins().jump(merge, &[]);
        }
        self.b.switch_to_block(merge);
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

/// Branches a stretch of a row may take on its conditions (`unswitched`),
/// in all: enough for a concatenation of 9 parts, 9 loops; past it the rest
/// select element by element.
const UNSWITCHED: usize = 8;

/// A version of a block for one side of a branch: the block, and its reads
/// with their positions at the row, in the order of its loads.
struct Version {
    block: Block,
    accesses: Vec<Access>,
    bases: Vec<RowBase>,
}

impl Version {
    /// The version where condition `c` is `taken`: every `where` on it is
    /// the operand it picks, and the loads no longer needed are gone (a
    /// load is an instruction Cranelift keeps even when its value is
    /// unused), with their reads.
    fn picking(&self, c: u32, taken: bool, stored: &[(usize, u32)]) -> Version {
        let mut block = self.block.clone();
        for v in block.values.iter_mut() {
            if let Expr::Where(cond, x, y) = v.expr
                && cond == c
            {
                // A cast to its own dtype is the value itself.
                v.expr = Expr::Cast(if taken { x } else { y });
            }
        }
        let live = live(&block, stored.iter().map(|s| s.1));
        let (mut accesses, mut bases) = (Vec::new(), Vec::new());
        let mut reads = self.accesses.iter().zip(&self.bases);
        for (v, live) in block.values.iter_mut().zip(live) {
            if v.expr.read().is_none() {
                continue;
            }
            let Some((access, base)) = reads.next() else {
                break;
            };
            if live {
                accesses.push(access.clone());
                bases.push(*base);
            } else {
                v.expr = Expr::Const(Scalar::I32(0).cast(v.dtype));
            }
        }
        Version {
            block,
            accesses,
            bases,
        }
    }
}
