//! The loops of an elementwise kernel, or of a matmul's epilogue over the
//! product (in the output, or apart), as its plan says (`loops::Map`): one flat loop, or a
//! row loop around the stretches of each row, each a loop (four lanes at a
//! time where its version says) or a branch on a condition computed once
//! per row to a version of each side.

use std::ops::Range;

use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_ir::DType;

use super::emit::{Emitter, Placed, RowBase, Rows};
use super::row_call::ROW_CALL_MIN;
use super::{RowRange, UNROLL};
use crate::loops::Map;
use crate::loops::hoist::{Stretch, Version};
use crate::nest::Access;

impl<'a> Emitter<'a> {
    /// An elementwise kernel, or a matmul epilogue when `m.acc`.
    pub(super) fn map(&mut self, m: &Map, start: Value, end: Value) -> RowRange {
        let nest = &m.nest;
        let out = &nest.accesses[nest.accesses.len() - 1];
        // The product an epilogue reads, at the output's elements: in the
        // output, or apart (in scratch, where the output cannot hold it).
        let product = m.acc.then(|| Access {
            buffer: self.product.unwrap_or(out.buffer),
            ..out.clone()
        });
        let acc = product.as_ref();
        if m.flat {
            // The range is over elements.
            let zero = self.iconst(0);
            let bases = self.bases(&nest.accesses, zero);
            for s in &m.stretches {
                let hoisted = self.hoist(
                    &m.body,
                    &s.reads,
                    Rows::One(&bases),
                    (None, &[]),
                    &s.hoisted,
                );
                let run = AtRow {
                    bases: &bases,
                    hoisted: &hoisted,
                    out: (out, bases[bases.len() - 1]),
                    acc,
                    // One call for the launch's whole range of elements,
                    // however short: no row of them pays it again.
                    long: true,
                };
                self.version(&s.version, &run, start..end);
            }
            return RowRange {
                rows: nest.inner[0],
                row_len: 1,
            };
        }
        let inner_len: usize = nest.inner.iter().product();
        let invariant = if m.invariant.is_empty() {
            Vec::new()
        } else {
            let reads = &nest.accesses[..nest.accesses.len() - 1];
            let zero = self.iconst(0);
            let bases = self.bases(reads, zero);
            self.hoist(&m.body, reads, Rows::One(&bases), (None, &[]), &m.invariant)
        };
        self.counted_loop(start, end, 1, |e, row| {
            let bases = e.bases(&nest.accesses, row);
            for s in &m.stretches {
                e.stretch(m, s, (&bases, &invariant), acc);
            }
        });
        RowRange {
            rows: nest.rows,
            row_len: inner_len,
        }
    }

    /// Stretch `s` of a row of `m` whose accesses are at `bases`, with the
    /// values computed once per call (`invariant`), reading an epilogue's
    /// product through `acc`.
    fn stretch(
        &mut self,
        m: &Map,
        s: &Stretch,
        (bases, invariant): (&[RowBase], &[Option<Value>]),
        acc: Option<&Access>,
    ) {
        let inner_len: usize = m.nest.inner.iter().product();
        let span = s.span.clone().unwrap_or(0..inner_len);
        let (from, to) = (self.iconst(span.start as i64), self.iconst(span.end as i64));
        let rows = Rows::One(&bases[..s.reads.len()]);
        let hoisted = self.hoist(&m.body, &s.reads, rows, (None, invariant), &s.hoisted);
        let out = &m.nest.accesses[m.nest.accesses.len() - 1];
        let run = AtRow {
            bases,
            hoisted: &hoisted,
            out: (out, bases[bases.len() - 1]),
            acc,
            long: span.len() >= ROW_CALL_MIN,
        };
        self.version(&s.version, &run, from..to);
    }

    /// Version `v` of a stretch over `span`: its loop, or a branch on its
    /// condition to a version of each side.
    fn version(&mut self, v: &Version, run: &AtRow, span: Range<Value>) {
        match v {
            Version::Loop {
                block,
                reads,
                accesses,
                lanes,
            } => {
                let bases: Vec<RowBase> = reads.iter().map(|&k| run.bases[k]).collect();
                let at = Placed {
                    block,
                    accesses,
                    rows: Rows::One(&bases),
                    hoisted: run.hoisted,
                };
                // A row rounded to bf16 or its SiLU, long enough: by a
                // call, in 256-bit vectors.
                let called = run.long
                    && self.row_calls()
                    && self.row_function(at, run.out, span.clone(), run.acc);
                if !called {
                    self.inner_loop(at, run.out, span, *lanes, run.acc);
                }
            }
            Version::Branch { cond, taken, other } => {
                let cond = run.hoisted[*cond as usize]
                    .expect("a version branches on a value its stretch computes once");
                let blocks = [self.b.create_block(), self.b.create_block()];
                let merge = self.b.create_block();
                self.b.ins().brif(cond, blocks[0], &[], blocks[1], &[]);
                for (block, side) in blocks.into_iter().zip([taken, other]) {
                    self.b.switch_to_block(block);
                    self.version(side, run, span.clone());
                    self.b.ins().jump(merge, &[]);
                }
                self.b.switch_to_block(merge);
            }
        }
    }

    /// `for j in from..to`, four lanes at a time when `lanes`, then one at a
    /// time: `body` at `j` stored into `out` at `j`, given the product at
    /// `j` as its `acc` where there is one (`acc`, laid out as `out`).
    fn inner_loop(
        &mut self,
        body: Placed,
        (out, out_base): (&Access, RowBase),
        Range { start, end: to }: Range<Value>,
        lanes: bool,
        acc: Option<&Access>,
    ) {
        let in_out = acc.is_some_and(|a| a.buffer == out.buffer);
        let mut from = start;
        if lanes {
            // Four independent vectors per trip, then one, then the scalar tail.
            for unroll in [UNROLL, 1] {
                from = self.counted_loop(from, to, 4 * unroll as i64, |e, j| {
                    for u in 0..unroll {
                        let j = e.b.ins().iadd_imm_s(j, 4 * u as i64);
                        let acc = acc.map(|a| e.load(a, out_base, j, DType::F32, true));
                        e.store_body(body, (out, out_base), j, (acc, in_out), true);
                    }
                });
            }
        }
        self.counted_loop(from, to, 1, |e, j| {
            let acc = acc.map(|a| e.load(a, out_base, j, DType::F32, false));
            e.store_body(body, (out, out_base), j, (acc, in_out), false);
        });
    }
}

/// A stretch at a row: the positions of its reads there, the
/// values it computes once, the output at the row, where the product
/// the block reads (`Expr::Acc`) lies, laid out as the output, if it reads
/// one, and whether it is long.
struct AtRow<'r> {
    bases: &'r [RowBase],
    hoisted: &'r [Option<Value>],
    out: (&'r Access, RowBase),
    acc: Option<&'r Access>,
    /// Whether its stretch is long enough for a row function
    /// (`ROW_CALL_MIN`): a range of elements (a flat loop's) is taken to be.
    long: bool,
}
