//! The emitter of one kernel's code: counted loops, element offsets over a
//! loop nest (the loads and stores through them are `memory`'s), and a
//! block evaluated at an inner index of its rows, with the values constant
//! along the row hoisted out of the loop.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Value, types,
};
use cranelift_frontend::FunctionBuilder;
use kiln_ir::kernel::{Block, Expr};
use kiln_ir::{DType, Scalar};

use super::{Calls, Host};
use crate::loops::lanes::has_lanes;
use crate::nest::{Access, Axis};

/// Builds the loops of one kernel.
pub(super) struct Emitter<'a> {
    pub(super) b: FunctionBuilder<'a>,
    pub(super) ptrs: Vec<Value>,
    pub(super) calls: Calls<'a>,
    pub(super) out_dtype: DType,
    /// While set, the four lanes of a vector are four consecutive rows (see
    /// `reduce_column_block`), not four consecutive inner elements.
    pub(super) row_lanes: bool,
    /// The kernel's `ahead` parameter (see `signature`).
    pub(super) ahead: Value,
    /// The side outputs: their buffers and their values in the body, stored
    /// with the output (`store_body`).
    pub(super) side: Vec<(usize, u32)>,
    /// The buffer of a matmul's product where it lies apart from the
    /// output, which its epilogue reads (`Expr::Acc`); else it reads the
    /// output.
    pub(super) product: Option<usize>,
}

/// Where a block's reads are positioned: at one row, or at four rows at
/// once, one per vector lane (each access's four first-element addresses).
#[derive(Clone, Copy)]
pub(super) enum Rows<'r> {
    One(&'r [RowBase]),
    Four(&'r [[Value; 4]]),
}

/// One access of `Rows` positioned: at one row, or at four rows' first
/// elements' addresses, one per lane.
#[derive(Clone, Copy)]
enum At {
    One(RowBase),
    Four([Value; 4]),
}

impl Rows<'_> {
    /// Access `k` positioned at these rows.
    fn at(self, k: usize) -> At {
        match self {
            Rows::One(bases) => At::One(bases[k]),
            Rows::Four(bases) => At::Four(bases[k]),
        }
    }
}

/// A gather's read (`Expr::Gather`): the element type, the picked position
/// (a scalar value) and the gathered axis's stride and length.
#[derive(Clone, Copy)]
pub(super) struct Pick {
    pub(super) dtype: DType,
    pub(super) index: Value,
    pub(super) stride: usize,
    pub(super) len: usize,
}

/// An access positioned at a row: its base element offset (coordinates
/// clamped when padded) and, when padded, whether the row is valid.
#[derive(Clone, Copy)]
pub(super) struct RowBase {
    pub(super) base: Value,
    pub(super) valid: Option<Value>,
}

/// A block placed at its rows, ready to evaluate at any inner index of them
/// (`Emitter::block`): its reads, where they are positioned, and the values
/// computed once per row (`Emitter::hoist`).
#[derive(Clone, Copy)]
pub(super) struct Placed<'p> {
    pub(super) block: &'p Block,
    /// The block's reads, in the order of its loads.
    pub(super) accesses: &'p [Access],
    pub(super) rows: Rows<'p>,
    /// Per value of the block, its value hoisted out of the inner loop.
    pub(super) hoisted: &'p [Option<Value>],
}

impl<'a> Emitter<'a> {
    pub(super) fn iconst(&mut self, v: i64) -> Value {
        self.b.ins().iconst(types::I64, v)
    }

    /// `host` called with `args`: its results.
    pub(super) fn call(&mut self, host: Host, args: &[Value]) -> &[Value] {
        let callee = self.calls.import(host, self.b.func);
        let call = self.b.ins().call(callee, args);
        self.b.inst_results(call)
    }

    /// Whether the 256-bit row functions may be called.
    pub(super) fn row_calls(&self) -> bool {
        self.calls.rows
    }

    /// `for i in from..to { body(i) }` with `i` an i64.
    pub(super) fn counted_loop(
        &mut self,
        from: Value,
        to: Value,
        step: i64,
        body: impl FnOnce(&mut Self, Value),
    ) -> Value {
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.append_block_param(header, types::I64);
        self.b.ins().jump(header, &[from.into()]);
        self.b.switch_to_block(header);
        let i = self.b.block_params(header)[0];
        // Run while i + step <= to.
        let next = self.b.ins().iadd_imm_s(i, step);
        let more = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, next, to);
        self.b.ins().brif(more, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        body(self, i);
        self.b.ins().jump(header, &[next.into()]);
        self.b.switch_to_block(exit);
        i
    }

    /// Coordinates of flat index `i` over `axes` (row-major), clamped into
    /// each axis's valid range, and whether all were valid.
    fn coords(&mut self, i: Value, axes: &[Axis], masked: bool) -> (Value, Option<Value>) {
        let mut offset = self.iconst(0);
        let mut valid: Option<Value> = None;
        let mut below = 1i64;
        for (k, axis) in axes.iter().enumerate().rev() {
            let mut c = if below == 1 {
                i
            } else {
                self.b.ins().udiv_imm_s(i, below)
            };
            // The outermost coordinate needs no wrap; an empty axis is never iterated.
            if k > 0 && axis.dim > 0 {
                c = self.b.ins().urem_imm_s(c, axis.dim as i64);
            }
            below *= axis.dim.max(1) as i64;
            if masked {
                let lo = self.iconst(axis.lo as i64);
                let hi = self.iconst(axis.hi as i64 - 1);
                let ok_lo = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, c, lo);
                let ok_hi = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, c, hi);
                let ok = self.b.ins().band(ok_lo, ok_hi);
                valid = Some(match valid {
                    Some(v) => self.b.ins().band(v, ok),
                    None => ok,
                });
                c = self.b.ins().smax(c, lo);
                c = self.b.ins().smin(c, hi);
            }
            let term = self.b.ins().imul_imm_s(c, axis.stride);
            offset = self.b.ins().iadd(offset, term);
        }
        (offset, valid)
    }

    fn row_base(&mut self, access: &Access, row: Value) -> RowBase {
        let masked = access.fill.is_some();
        let (offset, valid) = self.coords(row, &access.outer, masked);
        let base = self.b.ins().iadd_imm_s(offset, access.offset);
        RowBase { base, valid }
    }

    /// The element offset and validity of `access` at inner index `j`.
    pub(super) fn element(
        &mut self,
        access: &Access,
        row: RowBase,
        j: Value,
    ) -> (Value, Option<Value>) {
        let masked = access.fill.is_some();
        let (inner, valid) = match access.inner.as_slice() {
            [] => (self.iconst(0), None),
            [axis] if !masked => (self.b.ins().imul_imm_s(j, axis.stride), None),
            axes => self.coords(j, axes, masked),
        };
        let offset = self.b.ins().iadd(row.base, inner);
        let valid = match (row.valid, valid) {
            (Some(a), Some(b)) => Some(self.b.ins().band(a, b)),
            (a, b) => a.or(b),
        };
        (offset, valid)
    }

    /// The address of row `row + self.ahead` of `access`, that row clamped
    /// into `0..rows`, computed before the loop that uses it.
    pub(super) fn row_ahead(
        &mut self,
        access: &Access,
        dtype: DType,
        row: Value,
        rows: usize,
    ) -> Value {
        let r = self.b.ins().iadd(row, self.ahead);
        let (first, last) = (self.iconst(0), self.iconst(rows as i64 - 1));
        let r = self.b.ins().smax(r, first);
        let r = self.b.ins().smin(r, last);
        let base = self.row_base(access, r).base;
        let at = self.address(access.buffer, base, dtype);
        self.pin(at)
    }

    /// `v`, computed here and not at its uses. Cranelift places a pure
    /// value where it is used, and a value computed before a loop for use in
    /// it (`log(sum)` in log_softmax's epilogue, a row's horizontal sum) was
    /// recomputed on every trip; a trip through a stack slot is a side effect
    /// it keeps in place, so the computation stays before the loop.
    pub(super) fn pin(&mut self, v: Value) -> Value {
        let ty = self.b.func.dfg.value_type(v);
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            ty.bytes(),
            ty.bytes().trailing_zeros() as u8,
        ));
        let ptr = self.b.func.dfg.value_type(self.ptrs[0]);
        self.b.ins().stack_store(ptr, v, slot, 0);
        self.b.ins().stack_load(ptr, ty, slot, 0)
    }

    pub(super) fn scalar_const(&mut self, c: Scalar) -> Value {
        match c {
            Scalar::F32(v) => self.b.ins().f32const(v),
            Scalar::F64(v) => self.b.ins().f64const(v),
            Scalar::I32(v) => self.b.ins().iconst(types::I32, i64::from(v)),
            Scalar::I64(v) => self.b.ins().iconst(types::I64, v),
            Scalar::U8(v) => self.b.ins().iconst(types::I8, i64::from(v)),
            Scalar::Bool(v) => self.b.ins().iconst(types::I8, i64::from(v)),
            Scalar::BF16(v) => self.b.ins().f32const(v.to_f32()),
            Scalar::F16(v) => self.b.ins().f32const(v.to_f32()),
        }
    }

    /// The values of `block` its plan computes once (`set`, from
    /// `loops::hoist::hoisted`), computed here, before the loop that uses
    /// them: the reads placed at `rows`, the reduced value `acc` of an
    /// epilogue, the values `given` (computed before), and every op of
    /// those and of constants.
    pub(super) fn hoist(
        &mut self,
        block: &Block,
        accesses: &[Access],
        rows: Rows,
        (acc, given): (Option<Value>, &[Option<Value>]),
        set: &[bool],
    ) -> Vec<Option<Value>> {
        let zero = self.iconst(0);
        let mut hoisted: Vec<Option<Value>> = Vec::with_capacity(block.values.len());
        // Four rows at once hold every value, constant or not, in vectors.
        let lanes = matches!(rows, Rows::Four(_));
        let mut k = 0;
        for (i, v) in block.values.iter().enumerate() {
            k += usize::from(v.expr.read().is_some());
            if !set.get(i).copied().unwrap_or(false) {
                hoisted.push(None);
                continue;
            }
            if let Some(&Some(x)) = given.get(i) {
                hoisted.push(Some(x));
                continue;
            }
            let h = match &v.expr {
                Expr::Load { .. } => {
                    // Four rows' values are gathered once, and pinned: left
                    // to Cranelift, the lanes were inserted on every trip.
                    let v = self.read(&accesses[k - 1], rows.at(k - 1), zero, v.dtype, lanes);
                    Some(if lanes { self.pin(v) } else { v })
                }
                // One row's gather at a position picked once per row.
                Expr::Gather {
                    index, stride, len, ..
                } => match (rows, hoisted[*index as usize]) {
                    (Rows::One(bases), Some(index)) => {
                        let pick = Pick {
                            dtype: v.dtype,
                            index,
                            stride: *stride,
                            len: *len,
                        };
                        let v = self.gathered(&accesses[k - 1], bases[k - 1], zero, false, pick);
                        Some(self.pin(v))
                    }
                    _ => None,
                },
                Expr::Const(_) => None,
                Expr::Acc => acc,
                expr => {
                    let args: Option<Vec<Value>> = expr
                        .operands()
                        .iter()
                        .map(
                            |&x| match (hoisted[x as usize], &block.values[x as usize].expr) {
                                (Some(h), _) => Some(h),
                                (None, Expr::Const(c)) => {
                                    let c = self.scalar_const(*c);
                                    Some(if lanes {
                                        self.b.ins().splat(types::F32X4, c)
                                    } else {
                                        c
                                    })
                                }
                                (None, _) => None,
                            },
                        )
                        .collect();
                    args.map(|args| {
                        let v = self.op(block, i, &args, lanes);
                        self.pin(v)
                    })
                }
            };
            hoisted.push(h);
        }
        // The plan's set is what is computed here: a branch of a row's
        // versions takes its condition from it.
        debug_assert!(hoisted.iter().zip(set).all(|(h, &s)| h.is_some() == s));
        hoisted
    }

    /// `access` at inner index `j`: of one row (four inner elements at once
    /// with `lanes`), or of four rows, one per lane.
    fn read(&mut self, access: &Access, at: At, j: Value, dtype: DType, lanes: bool) -> Value {
        match at {
            At::One(base) => self.load(access, base, j, dtype, lanes),
            At::Four(bases) => self.gather(access, bases, j),
        }
    }

    /// The result of `at`'s block at inner index `j`.
    pub(super) fn block(&mut self, at: Placed, j: Value, acc: Option<Value>, lanes: bool) -> Value {
        let values = self.block_values(at, j, acc, lanes);
        // The verifier rejects empty blocks.
        values.last().copied().unwrap_or(j)
    }

    /// `at`'s result at inner index `j` stored into `out` at `j`, and the
    /// kernel's side values into their buffers at the same element.
    /// `acc_in_out`: `acc` was read from `out` at `j`, so a result that is
    /// `acc` itself (a product kept apart by `pass::donate`) is there
    /// already.
    pub(super) fn store_body(
        &mut self,
        at: Placed,
        (out, out_base): (&Access, RowBase),
        j: Value,
        (acc, acc_in_out): (Option<Value>, bool),
        lanes: bool,
    ) {
        let unchanged =
            acc_in_out && matches!(at.block.values.last(), Some(v) if v.expr == Expr::Acc);
        let values = self.block_values(at, j, acc, lanes);
        let Some(&result) = values.last() else {
            return;
        };
        let (offset, _) = self.element(out, out_base, j);
        let primary = (!unchanged).then_some((out.buffer, result));
        let stores: Vec<(usize, Value)> = primary
            .into_iter()
            .chain(self.side.iter().map(|&(b, v)| (b, values[v as usize])))
            .collect();
        for (buffer, x) in stores {
            self.store_at(buffer, offset, x);
        }
    }

    /// Every value of `at`'s block at inner index `j`.
    pub(super) fn block_values(
        &mut self,
        at: Placed,
        j: Value,
        acc: Option<Value>,
        lanes: bool,
    ) -> Vec<Value> {
        let Placed {
            block,
            accesses,
            rows,
            hoisted,
        } = at;
        let mut values: Vec<Value> = Vec::with_capacity(block.values.len());
        let mut k = 0;
        for (i, v) in block.values.iter().enumerate() {
            let is_load = v.expr.read().is_some();
            let r = match (hoisted[i], &v.expr) {
                // One row's hoisted values are scalars; four rows' are
                // vectors. A scalar without lanes is a gather's index alone
                // (`loops::lanes::vectorizable_hoisted`), read as it is.
                (Some(h), _) if lanes && matches!(rows, Rows::One(_)) && has_lanes(v.dtype) => {
                    self.splat(v.dtype, h)
                }
                (Some(h), _) => h,
                (None, Expr::Load { .. }) => self.read(&accesses[k], rows.at(k), j, v.dtype, lanes),
                (
                    None,
                    Expr::Gather {
                        index, stride, len, ..
                    },
                ) => {
                    let Rows::One(bases) = rows else {
                        unreachable!("four rows at once run f32 arithmetic, which holds no index")
                    };
                    // In lanes the position is one per row, hoisted
                    // (`loops::lanes::vectorizable_hoisted`); else this element's.
                    let index = match hoisted[*index as usize] {
                        Some(at) => at,
                        None => values[*index as usize],
                    };
                    let pick = Pick {
                        dtype: v.dtype,
                        index,
                        stride: *stride,
                        len: *len,
                    };
                    self.gathered(&accesses[k], bases[k], j, lanes, pick)
                }
                (None, Expr::Acc) => acc.unwrap_or(j),
                (None, expr) => {
                    let args: Vec<Value> = expr
                        .operands()
                        .iter()
                        .map(|&x| values[x as usize])
                        .collect();
                    self.op(block, i, &args, lanes)
                }
            };
            k += usize::from(is_load);
            values.push(r);
        }
        values
    }

    /// The accesses positioned at `row`, their base offsets pinned before
    /// the row's loops: left to Cranelift, each load in them multiplied the
    /// row by its stride again.
    pub(super) fn bases(&mut self, accesses: &[Access], row: Value) -> Vec<RowBase> {
        accesses
            .iter()
            .map(|a| {
                let at = self.row_base(a, row);
                RowBase {
                    base: self.pin(at.base),
                    ..at
                }
            })
            .collect()
    }

    /// For each access, the address of each of four rows' first element.
    pub(super) fn lane_pointers(&mut self, accesses: &[Access], rows: &[Value]) -> Vec<[Value; 4]> {
        accesses
            .iter()
            .map(|a| {
                let lane = |e: &mut Self, l: usize| {
                    let base = e.row_base(a, rows[l]).base;
                    e.address(a.buffer, base, DType::F32)
                };
                [lane(self, 0), lane(self, 1), lane(self, 2), lane(self, 3)]
            })
            .collect()
    }

    /// The byte offset of inner index `j` from a row's first element: the
    /// same for every row, so computed once for the four.
    pub(super) fn inner_bytes(&mut self, access: &Access, j: Value, dtype: DType) -> Value {
        let zero = self.iconst(0);
        let row = RowBase {
            base: zero,
            valid: None,
        };
        let (offset, _) = self.element(access, row, j);
        self.b.ins().imul_imm_s(offset, dtype.size() as i64)
    }

    /// `access` at inner index `j` of four rows (`lanes`: their first
    /// elements' addresses), one row per lane.
    fn gather(&mut self, access: &Access, lanes: [Value; 4], j: Value) -> Value {
        let flags = MemFlagsData::new().with_notrap();
        let inner = self.inner_bytes(access, j, DType::F32);
        let mut v = None;
        for (lane, base) in lanes.into_iter().enumerate() {
            let addr = self.b.ins().iadd(base, inner);
            let x = self.b.ins().load(types::F32, flags, addr, 0);
            v = Some(match v {
                None => self.b.ins().splat(types::F32X4, x),
                Some(v) => self.b.ins().insertlane(v, x, lane as u8),
            });
        }
        // Four lanes are always given.
        v.unwrap_or(j)
    }
}
