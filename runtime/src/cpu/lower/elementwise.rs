//! The loops of an elementwise kernel, or of a matmul's epilogue over the
//! product in place: one flat loop when the nest merges to one axis, else a
//! row loop around an inner loop, each in f32x4 where the block allows.

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
            let hoisted = self.hoist(body, reads, Rows::One(&bases), zero, nest.inner[0], None);
            let lanes = vectorizable_hoisted(body, reads, out, &hoisted);
            let at = Placed {
                block: body,
                accesses: reads,
                rows: Rows::One(&bases),
                hoisted: &hoisted,
            };
            let out_base = bases[bases.len() - 1];
            self.inner_loop(at, out, out_base, start, end, lanes, acc_in_place);
            RowRange {
                rows: nest.inner[0],
                row_len: 1,
            }
        } else {
            let inner_len: usize = nest.inner.iter().product();
            self.counted_loop(start, end, 1, |e, row| {
                let bases = e.bases(&nest.accesses, row);
                let zero = e.iconst(0);
                let hoisted = e.hoist(body, reads, Rows::One(&bases), zero, inner_len, None);
                let lanes = vectorizable_hoisted(body, reads, out, &hoisted);
                let n = e.iconst(inner_len as i64);
                let at = Placed {
                    block: body,
                    accesses: reads,
                    rows: Rows::One(&bases),
                    hoisted: &hoisted,
                };
                let out_base = bases[bases.len() - 1];
                e.inner_loop(at, out, out_base, zero, n, lanes, acc_in_place);
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
    #[allow(clippy::too_many_arguments)]
    fn inner_loop(
        &mut self,
        body: Placed,
        out: &Access,
        out_base: RowBase,
        from: Value,
        to: Value,
        lanes: bool,
        acc_in_place: bool,
    ) {
        let mut from = from;
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
