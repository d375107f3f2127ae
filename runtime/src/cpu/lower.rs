//! Lowering of one kernel to a Cranelift function.
//!
//! Every kernel becomes `fn(buffers: *const *mut u8, start: i64, end: i64)`:
//! `buffers` holds the input pointers then the output pointer, and the
//! function computes the rows `start..end` of its loop nest, so that threads
//! can split a launch into disjoint row ranges.
//!
//! A loop nest orders the kernel's space (a reduction's kept axes first,
//! then its reduced axes) and splits it into rows (the outer axes, one row
//! per call of the row loop) and the inner loop. Size-1 axes are dropped and
//! adjacent axes merged wherever every index map allows it, so a contiguous
//! elementwise kernel is one flat loop whose `start..end` are element
//! indices. Each read keeps its own strides: per row its base offset is
//! computed once from the row's coordinates, and the inner loop adds
//! `j * stride`. Padded reads clamp their coordinates into the valid range
//! (so the address is always inside the buffer) and select the fill value
//! outside it.
//!
//! The inner loop runs in f32x4 with a scalar tail when the block is pure
//! f32 arithmetic and every read is contiguous or constant along it; reads
//! constant along the inner loop are loaded once per row. A reduction over
//! short rows runs four rows at once instead, one per lane. Everything else
//! runs one element at a time, with the exact scalar semantics of the
//! interpreter.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, FuncRef, Function, InstBuilder, MemFlagsData, Signature, StackSlotData,
    StackSlotKind, Type, Value, types,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use kiln_ir::kernel::{Block, Expr, Kernel, KernelKind};
use kiln_ir::view::View;
use kiln_ir::{BinaryOp, DType, ReduceOp, Scalar, Shape, UnaryOp};

use super::math::{Math, int_cc};

/// How a lowered kernel is driven: the range of `start..end` and what one
/// unit of it costs, for splitting across threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    /// `end` of a whole launch (`start` is 0).
    pub rows: usize,
    /// Elements computed per unit of the range.
    pub row_len: usize,
}

/// The signature every kernel function has: the buffer table, the first
/// and last-plus-one row, and `ahead`, a count of rows: a reduction's vector
/// loop over a row reads one line per trip of the row that far ahead (0:
/// the same row again), so that in a row group (`jit::run_rows`) the next
/// block's rows arrive in cache while this block computes. Cranelift has no
/// prefetch instruction; a load whose value goes unused does the same.
pub(crate) fn signature(ptr: Type, call_conv: CallConv) -> Signature {
    let mut sig = Signature::new(call_conv);
    sig.params.extend([
        AbiParam::new(ptr),
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
    ]);
    sig
}

/// Output rows accumulated together by a sum over a leading axis: 16 KiB of
/// f32, which stay in L1 while the reduced axis is walked, and read as 16 KiB
/// contiguous runs of each input row (4 KiB runs measured 14% slower: every
/// run a new page, which prefetchers do not cross).
const COLUMN_BLOCK: i64 = 4096;

/// Vectors per trip of an unrolled loop: enough independent work to keep the
/// load and FMA units busy.
const UNROLL: usize = 4;

/// Rows of a reduction up to this long run four at a time, one per lane:
/// along such a row there is too little for vectors to do, and each row's
/// chain of reduction, horizontal sum and epilogue would wait on the last.
const SHORT_ROW: usize = 15;

/// One axis of a read in a loop nest: its extent, stride and valid range.
#[derive(Clone, Copy, Debug)]
struct Axis {
    dim: usize,
    stride: i64,
    lo: usize,
    hi: usize,
}

/// A buffer access arranged over a loop nest.
#[derive(Clone, Debug)]
struct Access {
    buffer: usize,
    offset: i64,
    outer: Vec<Axis>,
    inner: Vec<Axis>,
    fill: Option<Scalar>,
}

impl Access {
    /// Constant along the inner loop: read once per row.
    fn row_invariant(&self) -> bool {
        self.inner.iter().all(|a| a.stride == 0) && (self.fill.is_none() || self.inner.is_empty())
    }

    /// Contiguous along a single inner axis.
    fn unit_stride(&self) -> bool {
        self.fill.is_none() && self.inner.len() == 1 && self.inner[0].stride == 1
    }
}

/// A loop nest: the extents of the inner loop, and the reads and the write
/// arranged over it. Row count is the product of the outer extents.
struct Nest {
    rows: usize,
    inner: Vec<usize>,
    accesses: Vec<Access>,
}

/// Arranges `views` (each reading `buffers[i]`) over `space` in the axis
/// order `axes`, the first `split` of them outer (`None`: all but the last
/// after merging); drops size-1 axes and merges neighbours on the same side
/// that every view steps through contiguously.
fn nest(space: &Shape, axes: &[usize], split: Option<usize>, views: &[(usize, &View)]) -> Nest {
    let dims = space.dims();
    let masked = views.iter().any(|(_, v)| v.mask.is_some());
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
    if !masked {
        // Merge position p into p+1 (innermost first) when every view steps through both as one.
        let mut p = order.len().saturating_sub(1);
        while p > 0 {
            let same_side = order[p - 1].1 == order[p].1;
            let mergeable = columns
                .iter()
                .all(|c| c[p - 1].stride == c[p].stride * c[p].dim as i64);
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
            }
        })
        .collect();
    Nest {
        rows,
        inner,
        accesses,
    }
}

/// The loads of a block, as (buffer, view), in value order.
fn loads(block: &Block) -> Vec<(usize, &View)> {
    block
        .values
        .iter()
        .filter_map(|v| match &v.expr {
            Expr::Load { input, view } => Some((*input as usize, view)),
            _ => None,
        })
        .collect()
}

/// Makes the loads that `block`'s result does not depend on constants: a
/// load is an instruction Cranelift keeps even when its value is unused.
fn drop_dead_loads(block: &mut Block) {
    let mut live = vec![false; block.values.len()];
    if let Some(last) = live.last_mut() {
        *last = true;
    }
    for i in (0..block.values.len()).rev() {
        if live[i] {
            for x in block.values[i].expr.operands() {
                live[x as usize] = true;
            }
        }
    }
    for (v, live) in block.values.iter_mut().zip(live) {
        if !live && matches!(v.expr, Expr::Load { .. }) {
            v.expr = Expr::Const(Scalar::I32(0).cast(v.dtype));
        }
    }
}

/// The position of a value of `body` that computes exactly the prologue's
/// result (same ops on the same loads), if it is an f32 like the output.
fn recomputed(prologue: &Block, body: &Block) -> Option<usize> {
    fn same(p: &Block, i: u32, b: &Block, j: u32) -> bool {
        let (x, y) = (&p.values[i as usize], &b.values[j as usize]);
        let operands_same = || {
            let (xo, yo) = (x.expr.operands(), y.expr.operands());
            xo.len() == yo.len() && xo.iter().zip(&yo).all(|(&a, &c)| same(p, a, b, c))
        };
        x.dtype == y.dtype
            && match (&x.expr, &y.expr) {
                (Expr::Load { .. }, Expr::Load { .. }) | (Expr::Const(_), Expr::Const(_)) => {
                    x.expr == y.expr
                }
                (Expr::Unary(a, _), Expr::Unary(c, _)) => a == c && operands_same(),
                (Expr::Binary(a, _, _), Expr::Binary(c, _, _)) => a == c && operands_same(),
                (Expr::Where(..), Expr::Where(..)) | (Expr::Cast(_), Expr::Cast(_)) => {
                    operands_same()
                }
                _ => false,
            }
    }
    let last = prologue.values.len().checked_sub(1)? as u32;
    if prologue.values[last as usize].dtype != DType::F32 || body.dtype() != Some(DType::F32) {
        return None;
    }
    // Worth it only for a computed value, not a plain load.
    if matches!(
        prologue.values[last as usize].expr,
        Expr::Load { .. } | Expr::Const(_)
    ) {
        return None;
    }
    (0..body.values.len() as u32)
        .find(|&j| same(prologue, last, body, j))
        .map(|j| j as usize)
}

fn clif_type(dtype: DType) -> Type {
    match dtype {
        DType::F32 => types::F32,
        DType::I32 => types::I32,
        DType::U8 | DType::Bool => types::I8,
    }
}

/// Whether `block` can run four lanes at a time: f32 arithmetic only, with
/// reads contiguous or constant along the inner loop.
fn vectorizable(block: &Block, accesses: &[Access], out: Option<&Access>) -> bool {
    let reads_ok = accesses
        .iter()
        .all(|a| a.row_invariant() || a.unit_stride());
    f32_arithmetic(block) && reads_ok && out.is_none_or(Access::unit_stride)
}

/// Whether every value of `block` is f32 arithmetic that has a vector form.
fn f32_arithmetic(block: &Block) -> bool {
    block.values.iter().all(|v| {
        v.dtype == DType::F32
            && match &v.expr {
                Expr::Load { .. } | Expr::Const(_) | Expr::Acc | Expr::Unary(..) => true,
                Expr::Binary(op, _, _) => !op.is_comparison() && *op != BinaryOp::Pow,
                Expr::Where(..) | Expr::Cast(_) => false,
            }
    })
}

/// Emits the kernel into `func` and says how to launch it.
pub(crate) fn lower(
    kernel: &Kernel,
    func: &mut Function,
    fbc: &mut FunctionBuilderContext,
    ptr: Type,
    powf: FuncRef,
    target: TargetFrontendConfig,
) -> Launch {
    let mut b = FunctionBuilder::new(func, fbc);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry);
    let (table, start, end, ahead) = (params[0], params[1], params[2], params[3]);
    let buffers = kernel.inputs.len() + 1;
    let ptrs: Vec<Value> = (0..buffers)
        .map(|i| {
            b.ins().load(
                ptr,
                MemFlagsData::trusted(),
                table,
                (i * ptr.bytes() as usize) as i32,
            )
        })
        .collect();
    let out_buffer = kernel.inputs.len();
    let space = &kernel.out.shape;
    let mut e = Emitter {
        b,
        ptrs,
        powf,
        out_dtype: kernel.out.dtype,
        row_lanes: false,
        store_prologue: false,
        ahead,
    };
    let launch = match &kernel.kind {
        KernelKind::Elementwise | KernelKind::MatMul { .. } => {
            let identity: Vec<usize> = (0..space.rank()).collect();
            let out_view = View::contiguous(space);
            let mut views = loads(&kernel.body);
            views.push((out_buffer, &out_view));
            // A matmul's product is already in the output and its epilogue reads
            // it in place, a row of the output's last axis per unit, so that it
            // can follow the GEMM's row blocks.
            let acc = matches!(kernel.kind, KernelKind::MatMul { .. });
            let split = acc.then(|| space.rank().saturating_sub(1));
            let nest = nest(space, &identity, split, &views);
            e.elementwise(&kernel.body, &nest, acc, start, end)
        }
        KernelKind::Reduce {
            op,
            axes,
            shape,
            prologue,
        } => {
            let kept: Vec<usize> = (0..shape.rank()).filter(|a| !axes.contains(a)).collect();
            let order: Vec<usize> = kept.iter().chain(axes.iter()).copied().collect();
            let pro = nest(shape, &order, Some(kept.len()), &loads(prologue));
            let broadcast = space == shape;
            let out_view = View::contiguous(space);
            // Over the whole space, an epilogue value equal to the prologue's
            // (softmax's `exp(x - max)`) is stored by the prologue pass and read
            // back from the output row, still in cache, instead of recomputed.
            let mut reuse = if broadcast {
                recomputed(prologue, &kernel.body)
            } else {
                None
            };
            // Four prologue lanes are stored as one vector: only into a contiguous row.
            if reuse.is_some() {
                let out_nest = nest(space, &order, Some(kept.len()), &[(out_buffer, &out_view)]);
                if vectorizable(prologue, &pro.accesses, None)
                    && !out_nest.accesses[0].unit_stride()
                {
                    reuse = None;
                }
            }
            let body = match reuse {
                Some(i) => {
                    let mut body = kernel.body.clone();
                    body.values[i].expr = Expr::Load {
                        input: out_buffer as u32,
                        view: out_view.clone(),
                    };
                    drop_dead_loads(&mut body);
                    body
                }
                None => kernel.body.clone(),
            };
            let mut views = loads(&body);
            views.push((out_buffer, &out_view));
            let epilogue = if broadcast {
                nest(space, &order, Some(kept.len()), &views)
            } else {
                let all: Vec<usize> = (0..space.rank()).collect();
                nest(space, &all, Some(space.rank()), &views)
            };
            e.store_prologue = reuse.is_some();
            e.reduce(*op, prologue, &pro, &body, &epilogue, broadcast, start, end)
        }
    };
    e.b.ins().return_(&[]);
    e.b.seal_all_blocks();
    e.b.finalize(target);
    launch
}

/// Builds the loops of one kernel.
struct Emitter<'a> {
    b: FunctionBuilder<'a>,
    ptrs: Vec<Value>,
    powf: FuncRef,
    out_dtype: DType,
    /// While set, the four lanes of a vector are four consecutive rows (see
    /// `reduce_four_rows`), not four consecutive inner elements.
    row_lanes: bool,
    /// The prologue of a broadcast reduction stores its values in the output,
    /// where the epilogue reads them back (see `recomputed`).
    store_prologue: bool,
    /// The kernel's `ahead` parameter (see `signature`).
    ahead: Value,
}

/// Where a block's reads are positioned: at one row, or at four rows at
/// once, one per vector lane (each access's four first-element addresses).
#[derive(Clone, Copy)]
enum Rows<'r> {
    One(&'r [RowBase]),
    Four(&'r [[Value; 4]]),
}

/// An access positioned at a row: its base element offset (coordinates
/// clamped when padded) and, when padded, whether the row is valid.
#[derive(Clone, Copy)]
struct RowBase {
    base: Value,
    valid: Option<Value>,
}

impl<'a> Emitter<'a> {
    fn iconst(&mut self, v: i64) -> Value {
        self.b.ins().iconst(types::I64, v)
    }

    /// `for i in from..to { body(i) }` with `i` an i64.
    fn counted_loop(
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
    fn element(&mut self, access: &Access, row: RowBase, j: Value) -> (Value, Option<Value>) {
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

    fn address(&mut self, buffer: usize, offset: Value, dtype: DType) -> Value {
        let bytes = self.b.ins().imul_imm_s(offset, dtype.size() as i64);
        self.b.ins().iadd(self.ptrs[buffer], bytes)
    }

    /// One element (or four lanes) of `access` at `j`.
    fn load(
        &mut self,
        access: &Access,
        row: RowBase,
        j: Value,
        dtype: DType,
        lanes: bool,
    ) -> Value {
        let flags = MemFlagsData::new().with_notrap();
        let (offset, valid) = self.element(access, row, j);
        let addr = self.address(access.buffer, offset, dtype);
        let contiguous = if self.row_lanes {
            access.outer.last().is_some_and(|o| o.stride == 1)
        } else {
            access.unit_stride()
        };
        if lanes && contiguous {
            return self.b.ins().load(types::F32X4, flags, addr, 0);
        }
        let x = self.b.ins().load(clif_type(dtype), flags, addr, 0);
        let x = match (valid, access.fill) {
            (Some(ok), Some(fill)) => {
                let f = self.scalar_const(fill);
                self.b.ins().select(ok, x, f)
            }
            _ => x,
        };
        if lanes {
            self.b.ins().splat(types::F32X4, x)
        } else {
            x
        }
    }

    fn store(&mut self, access: &Access, row: RowBase, j: Value, x: Value) {
        let (offset, _) = self.element(access, row, j);
        let addr = self.address(access.buffer, offset, self.out_dtype);
        self.b
            .ins()
            .store(MemFlagsData::new().with_notrap(), x, addr, 0);
    }

    /// The address of row `row + self.ahead` of `access`, that row clamped
    /// into `0..rows`, computed before the loop that uses it.
    fn row_ahead(&mut self, access: &Access, dtype: DType, row: Value, rows: usize) -> Value {
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
    fn pin(&mut self, v: Value) -> Value {
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

    fn scalar_const(&mut self, c: Scalar) -> Value {
        match c {
            Scalar::F32(v) => self.b.ins().f32const(v),
            Scalar::I32(v) => self.b.ins().iconst(types::I32, i64::from(v)),
            Scalar::U8(v) => self.b.ins().iconst(types::I8, i64::from(v)),
            Scalar::Bool(v) => self.b.ins().iconst(types::I8, i64::from(v)),
        }
    }

    /// The values of a block that are the same all along the inner loop
    /// (constants, row-invariant loads, the reduced value `acc` of an
    /// epilogue, and every op of those), computed once per row. Only where
    /// the inner loop has elements (`inner > 0`): a view of an empty space may
    /// point anywhere, and the verifier bounds only the reads it makes.
    #[allow(clippy::too_many_arguments)]
    fn hoist(
        &mut self,
        block: &Block,
        accesses: &[Access],
        rows: Rows,
        zero: Value,
        inner: usize,
        acc: Option<Value>,
    ) -> Vec<Option<Value>> {
        let mut hoisted: Vec<Option<Value>> = Vec::with_capacity(block.values.len());
        if inner == 0 {
            hoisted.resize(block.values.len(), None);
            return hoisted;
        }
        // Four rows at once hold every value, constant or not, in vectors.
        let lanes = matches!(rows, Rows::Four(_));
        let mut k = 0;
        for (i, v) in block.values.iter().enumerate() {
            let h = match &v.expr {
                Expr::Load { .. } => {
                    k += 1;
                    let a = &accesses[k - 1];
                    // Four rows' values are gathered once, and pinned: left
                    // to Cranelift, the lanes were inserted on every trip.
                    a.row_invariant().then(|| {
                        let v = self.read(a, rows, k - 1, zero, v.dtype, lanes);
                        if lanes { self.pin(v) } else { v }
                    })
                }
                // Constants are immediates where they are used.
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
        hoisted
    }

    /// Access `k` (`access`) at inner index `j`: of one row (four inner
    /// elements at once with `lanes`), or of four rows, one per lane.
    fn read(
        &mut self,
        access: &Access,
        rows: Rows,
        k: usize,
        j: Value,
        dtype: DType,
        lanes: bool,
    ) -> Value {
        match rows {
            Rows::One(bases) => self.load(access, bases[k], j, dtype, lanes),
            Rows::Four(bases) => self.gather(access, bases[k], j),
        }
    }

    /// The block's result at inner index `j`.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &mut self,
        block: &Block,
        accesses: &[Access],
        rows: Rows,
        hoisted: &[Option<Value>],
        j: Value,
        acc: Option<Value>,
        lanes: bool,
    ) -> Value {
        let mut values: Vec<Value> = Vec::with_capacity(block.values.len());
        let mut k = 0;
        for (i, v) in block.values.iter().enumerate() {
            let is_load = matches!(v.expr, Expr::Load { .. });
            let r = match (hoisted[i], &v.expr) {
                // One row's hoisted values are scalars; four rows' are vectors.
                (Some(h), _) if lanes && matches!(rows, Rows::One(_)) => {
                    self.b.ins().splat(types::F32X4, h)
                }
                (Some(h), _) => h,
                (None, Expr::Load { .. }) => self.read(&accesses[k], rows, k, j, v.dtype, lanes),
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
        // The verifier rejects empty blocks.
        values.last().copied().unwrap_or(j)
    }

    /// Value `i` of `block` (a constant or an op) from its operands' values.
    fn op(&mut self, block: &Block, i: usize, args: &[Value], lanes: bool) -> Value {
        let v = &block.values[i];
        let operand_dtype = |k: usize| block.values[v.expr.operands()[k] as usize].dtype;
        match (&v.expr, args) {
            (Expr::Const(c), _) => {
                let s = self.scalar_const(*c);
                if lanes {
                    self.b.ins().splat(types::F32X4, s)
                } else {
                    s
                }
            }
            (Expr::Unary(op, _), &[a]) => self.unary(*op, v.dtype, a, lanes),
            (Expr::Binary(op, _, _), &[a, b]) => self.binary(*op, operand_dtype(0), a, b),
            (Expr::Where(..), &[c, a, b]) => self.b.ins().select(c, a, b),
            (Expr::Cast(_), &[a]) => self.cast(a, operand_dtype(0), v.dtype),
            // Loads and `acc` are not ops; the verifier fixes every arity.
            _ => args
                .first()
                .copied()
                .unwrap_or_else(|| self.scalar_const(Scalar::F32(f32::NAN))),
        }
    }

    fn math(&mut self, lanes: bool) -> Math<'_, 'a> {
        Math {
            b: &mut self.b,
            ty: if lanes { types::F32X4 } else { types::F32 },
        }
    }

    /// Math in the type of `x` (f32 or f32x4).
    fn math_of(&mut self, x: Value) -> Math<'_, 'a> {
        let ty = self.b.func.dfg.value_type(x);
        Math { b: &mut self.b, ty }
    }

    fn unary(&mut self, op: UnaryOp, dtype: DType, x: Value, lanes: bool) -> Value {
        if dtype != DType::F32 {
            // Typing admits neg, abs and relu on i32 only.
            return match op {
                UnaryOp::Neg => self.b.ins().ineg(x),
                UnaryOp::Abs => self.b.ins().iabs(x),
                _ => {
                    let zero = self.b.ins().iconst(types::I32, 0);
                    self.b.ins().smax(x, zero)
                }
            };
        }
        match op {
            UnaryOp::Neg => self.math(lanes).neg(x),
            UnaryOp::Abs => self.math(lanes).abs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Recip => {
                let one = self.math(lanes).f(1.0);
                self.b.ins().fdiv(one, x)
            }
            UnaryOp::Relu => self.math(lanes).relu(x),
            UnaryOp::Exp => self.math(lanes).exp(x),
            UnaryOp::Log => self.math(lanes).log(x),
            UnaryOp::Tanh => self.math(lanes).tanh(x),
            UnaryOp::Sigmoid => self.math(lanes).sigmoid(x),
        }
    }

    /// `dtype` is the operands' type.
    fn binary(&mut self, op: BinaryOp, dtype: DType, x: Value, y: Value) -> Value {
        let ins = self.b.ins();
        match dtype {
            DType::F32 => match op {
                BinaryOp::Add => ins.fadd(x, y),
                BinaryOp::Sub => ins.fsub(x, y),
                BinaryOp::Mul => ins.fmul(x, y),
                BinaryOp::Div => ins.fdiv(x, y),
                BinaryOp::Max => self.math_of(x).maximum(x, y),
                BinaryOp::Min => self.math_of(x).minimum(x, y),
                BinaryOp::Pow => {
                    let call = self.b.ins().call(self.powf, &[x, y]);
                    self.b.inst_results(call)[0]
                }
                BinaryOp::Lt => ins.fcmp(FloatCC::LessThan, x, y),
                BinaryOp::Le => ins.fcmp(FloatCC::LessThanOrEqual, x, y),
                BinaryOp::Gt => ins.fcmp(FloatCC::GreaterThan, x, y),
                BinaryOp::Ge => ins.fcmp(FloatCC::GreaterThanOrEqual, x, y),
                BinaryOp::Eq => ins.fcmp(FloatCC::Equal, x, y),
                BinaryOp::Ne => ins.fcmp(FloatCC::NotEqual, x, y),
            },
            DType::I32 | DType::U8 | DType::Bool => {
                let signed = dtype == DType::I32;
                match op {
                    BinaryOp::Add => ins.iadd(x, y),
                    BinaryOp::Sub => ins.isub(x, y),
                    BinaryOp::Mul => ins.imul(x, y),
                    BinaryOp::Max if signed => ins.smax(x, y),
                    BinaryOp::Max => ins.umax(x, y),
                    BinaryOp::Min if signed => ins.smin(x, y),
                    BinaryOp::Min => ins.umin(x, y),
                    BinaryOp::Lt => ins.icmp(int_cc(true, false, signed), x, y),
                    BinaryOp::Le => ins.icmp(int_cc(true, true, signed), x, y),
                    BinaryOp::Gt => ins.icmp(int_cc(false, false, signed), x, y),
                    BinaryOp::Ge => ins.icmp(int_cc(false, true, signed), x, y),
                    BinaryOp::Eq => ins.icmp(IntCC::Equal, x, y),
                    BinaryOp::Ne => ins.icmp(IntCC::NotEqual, x, y),
                    // Typing admits div and pow on f32 only.
                    BinaryOp::Div | BinaryOp::Pow => x,
                }
            }
        }
    }

    /// `Scalar::cast` semantics: float to int truncates and saturates (NaN
    /// to 0), int to narrower wraps, anything to bool is `!= 0`.
    fn cast(&mut self, x: Value, from: DType, to: DType) -> Value {
        let ins = self.b.ins();
        match (from, to) {
            (a, b) if a == b => x,
            (DType::F32, DType::I32) => ins.fcvt_to_sint_sat(types::I32, x),
            (DType::F32, DType::U8) => {
                let i = ins.fcvt_to_sint_sat(types::I32, x);
                let zero = self.b.ins().iconst(types::I32, 0);
                let max = self.b.ins().iconst(types::I32, 255);
                let i = self.b.ins().smax(i, zero);
                let i = self.b.ins().smin(i, max);
                self.b.ins().ireduce(types::I8, i)
            }
            (DType::F32, DType::Bool) => {
                let zero = ins.f32const(0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            }
            (DType::I32, DType::F32) => ins.fcvt_from_sint(types::F32, x),
            (DType::U8 | DType::Bool, DType::F32) => {
                let i = ins.uextend(types::I32, x);
                self.b.ins().fcvt_from_sint(types::F32, i)
            }
            (DType::I32, DType::U8) => ins.ireduce(types::I8, x),
            (DType::U8 | DType::Bool, DType::I32) => ins.uextend(types::I32, x),
            (DType::I32 | DType::U8, DType::Bool) => ins.icmp_imm_s(IntCC::NotEqual, x, 0),
            // bool -> u8: the same 0/1 byte.
            (DType::Bool, DType::U8) => x,
            (_, _) => x,
        }
    }

    /// The accesses positioned at `row`, their base offsets pinned before
    /// the row's loops: left to Cranelift, each load in them multiplied the
    /// row by its stride again.
    fn bases(&mut self, accesses: &[Access], row: Value) -> Vec<RowBase> {
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

    /// An elementwise kernel, or a matmul epilogue when `acc_in_place`.
    fn elementwise(
        &mut self,
        body: &Block,
        nest: &Nest,
        acc_in_place: bool,
        start: Value,
        end: Value,
    ) -> Launch {
        let (reads, out) = nest.accesses.split_at(nest.accesses.len() - 1);
        let out = &out[0];
        // Flat: one merged axis, and the range is over elements.
        let flat = nest.rows == 1 && nest.inner.len() == 1;
        let lanes = vectorizable(body, reads, Some(out));
        if flat {
            let zero = self.iconst(0);
            let bases = self.bases(&nest.accesses, zero);
            let hoisted = self.hoist(body, reads, Rows::One(&bases), zero, nest.inner[0], None);
            self.inner_loop(
                body,
                reads,
                out,
                &bases,
                &hoisted,
                start,
                end,
                lanes,
                acc_in_place,
            );
            Launch {
                rows: nest.inner[0],
                row_len: 1,
            }
        } else {
            let inner_len: usize = nest.inner.iter().product();
            self.counted_loop(start, end, 1, |e, row| {
                let bases = e.bases(&nest.accesses, row);
                let zero = e.iconst(0);
                let hoisted = e.hoist(body, reads, Rows::One(&bases), zero, inner_len, None);
                let n = e.iconst(inner_len as i64);
                e.inner_loop(
                    body,
                    reads,
                    out,
                    &bases,
                    &hoisted,
                    zero,
                    n,
                    lanes,
                    acc_in_place,
                );
            });
            Launch {
                rows: nest.rows,
                row_len: inner_len,
            }
        }
    }

    /// `for j in from..to`, four lanes at a time when `lanes`, then one at a time.
    #[allow(clippy::too_many_arguments)]
    fn inner_loop(
        &mut self,
        body: &Block,
        reads: &[Access],
        out: &Access,
        bases: &[RowBase],
        hoisted: &[Option<Value>],
        from: Value,
        to: Value,
        lanes: bool,
        acc_in_place: bool,
    ) {
        let out_base = bases[bases.len() - 1];
        let mut from = from;
        if lanes {
            // Four independent vectors per trip, then one, then the scalar tail.
            for unroll in [UNROLL, 1] {
                from = self.counted_loop(from, to, 4 * unroll as i64, |e, j| {
                    for u in 0..unroll {
                        let j = e.b.ins().iadd_imm_s(j, 4 * u as i64);
                        let acc = acc_in_place.then(|| e.load(out, out_base, j, DType::F32, true));
                        let v = e.block(body, reads, Rows::One(bases), hoisted, j, acc, true);
                        e.store(out, out_base, j, v);
                    }
                });
            }
        }
        self.counted_loop(from, to, 1, |e, j| {
            let acc = acc_in_place.then(|| e.load(out, out_base, j, DType::F32, false));
            let v = e.block(body, reads, Rows::One(bases), hoisted, j, acc, false);
            e.store(out, out_base, j, v);
        });
    }

    /// A reduction: per row, the prologue combined over the inner loop, then
    /// the epilogue once (reduced output) or over the row again (broadcast).
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        op: ReduceOp,
        prologue: &Block,
        pro: &Nest,
        body: &Block,
        epi: &Nest,
        broadcast: bool,
        start: Value,
        end: Value,
    ) -> Launch {
        let dtype = prologue.dtype().unwrap_or(DType::F32);
        let inner_len: usize = pro.inner.iter().product();
        // Four rows at once, one per lane, when the prologue cannot run four
        // inner elements at once but steps through rows contiguously (a sum
        // over a leading axis) and the epilogue reads nothing.
        let row_lanes = !broadcast
            && !vectorizable(prologue, &pro.accesses, None)
            && f32_arithmetic(prologue)
            && f32_arithmetic(body)
            && !body
                .values
                .iter()
                .any(|v| matches!(v.expr, Expr::Load { .. }))
            && !pro.accesses.is_empty()
            && pro.accesses.iter().all(|a| {
                a.fill.is_none()
                    && a.outer
                        .last()
                        .is_some_and(|o| o.stride == 0 || o.stride == 1)
            });
        let short_rows = !row_lanes
            && !self.store_prologue
            && (2..=SHORT_ROW).contains(&inner_len)
            && pro.rows >= 4
            && f32_arithmetic(prologue)
            && f32_arithmetic(body)
            && pro
                .accesses
                .iter()
                .chain(&epi.accesses)
                .all(|a| a.fill.is_none());
        let header = self.b.create_block();
        let exit = self.b.create_block();
        let one_row = self.b.create_block();
        self.b.append_block_param(header, types::I64);
        self.b.ins().jump(header, &[start.into()]);
        self.b.switch_to_block(header);
        let row = self.b.block_params(header)[0];
        let more = self.b.ins().icmp(IntCC::SignedLessThan, row, end);
        let next = self.b.create_block();
        self.b.ins().brif(more, next, &[], exit, &[]);
        self.b.switch_to_block(next);
        if row_lanes {
            // A block of rows stays inside one run of the innermost row axis,
            // where neighbouring rows are neighbours in memory.
            let last = pro.accesses[0].outer.last().map_or(1, |o| o.dim) as i64;
            let within = self.b.ins().urem_imm_s(row, last);
            let run_end = self.b.ins().isub(row, within);
            let run_end = self.b.ins().iadd_imm_s(run_end, last);
            let block_end = self.b.ins().iadd_imm_s(row, COLUMN_BLOCK);
            let block_end = self.b.ins().smin(block_end, run_end);
            let block_end = self.b.ins().smin(block_end, end);
            self.reduce_column_block(op, prologue, pro, body, epi, row, block_end, inner_len);
            self.b.ins().jump(header, &[block_end.into()]);
        } else if short_rows {
            let four = self.b.create_block();
            let last = self.b.ins().iadd_imm_s(row, 4);
            let fits = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, last, end);
            self.b.ins().brif(fits, four, &[], one_row, &[]);
            self.b.switch_to_block(four);
            self.reduce_four_short_rows(op, prologue, pro, body, epi, broadcast, row, inner_len);
            self.b.ins().jump(header, &[last.into()]);
        } else {
            self.b.ins().jump(one_row, &[]);
        }
        self.b.switch_to_block(one_row);
        self.reduce_row(
            op, dtype, prologue, pro, body, epi, broadcast, row, inner_len,
        );
        let following = self.b.ins().iadd_imm_s(row, 1);
        self.b.ins().jump(header, &[following.into()]);
        self.b.switch_to_block(exit);
        Launch {
            rows: pro.rows,
            row_len: inner_len.max(1),
        }
    }

    /// One row of a reduction: the prologue combined over the inner loop
    /// (four inner elements per lane group when it can), then the epilogue.
    #[allow(clippy::too_many_arguments)]
    fn reduce_row(
        &mut self,
        op: ReduceOp,
        dtype: DType,
        prologue: &Block,
        pro: &Nest,
        body: &Block,
        epi: &Nest,
        broadcast: bool,
        row: Value,
        inner_len: usize,
    ) {
        let lanes = vectorizable(prologue, &pro.accesses, None);
        let epi_reads = &epi.accesses[..epi.accesses.len() - 1];
        let epi_lanes = broadcast && vectorizable(body, epi_reads, epi.accesses.last());
        let e = self;
        let bases = e.bases(&pro.accesses, row);
        let zero = e.iconst(0);
        let hoisted = e.hoist(
            prologue,
            &pro.accesses,
            Rows::One(&bases),
            zero,
            inner_len,
            None,
        );
        let n = e.iconst(inner_len as i64);
        let init = e.scalar_const(op.init(dtype));
        let acc = e.b.declare_var(clif_type(dtype));
        e.b.def_var(acc, init);
        let epi_bases = e.bases(&epi.accesses, row);
        let out_base = epi_bases[epi_bases.len() - 1];
        let out = &epi.accesses[epi.accesses.len() - 1];
        let store = e.store_prologue;
        // The prologue at inner index `j` (four elements with `lanes`), also
        // stored into the output row where the epilogue reads it back.
        let element = |e: &mut Self, j: Value, lanes: bool| {
            let v = e.block(
                prologue,
                &pro.accesses,
                Rows::One(&bases),
                &hoisted,
                j,
                None,
                lanes,
            );
            if store {
                e.store(out, out_base, j, v);
            }
            v
        };
        // The prologue combined into `acc` one element at a time, from `from`
        // to the row's end.
        let scalars = |e: &mut Self, acc: Variable, from: Value| {
            e.counted_loop(from, n, 1, |e, j| {
                let v = element(e, j, false);
                let a = e.b.use_var(acc);
                let a = e.combine(op, dtype, a, v);
                e.b.def_var(acc, a);
            });
        };
        let mut from = zero;
        // A max over vectors runs `maxps` alone, where IEEE `maximum` takes
        // five instructions: NaNs are noted apart, and a row whose max comes
        // out zero, where `maxps` may have kept -0 over +0, is walked again.
        let nans = (lanes && op == ReduceOp::Max && dtype == DType::F32).then(|| {
            let none = e.b.ins().iconst(types::I32, 0);
            let none = e.b.ins().splat(types::I32X4, none);
            let nans = e.b.declare_var(types::I32X4);
            e.b.def_var(nans, none);
            nans
        });
        let fold = |e: &mut Self, a: Value, v: Value| match nans {
            Some(_) => e.math(true).fast_max(v, a),
            None => e.combine(op, DType::F32, a, v),
        };
        // Folds a vector of the row into an accumulator, noting its NaNs.
        let vcombine = |e: &mut Self, a: Value, v: Value| {
            if let Some(nans) = nans {
                let nan = e.b.ins().fcmp(FloatCC::Unordered, v, v);
                let seen = e.b.use_var(nans);
                let seen = e.b.ins().bor(seen, nan);
                e.b.def_var(nans, seen);
            }
            fold(e, a, v)
        };
        if lanes {
            // UNROLL independent vector accumulators, so that additions do not
            // wait on each other, then one, folded together at the end.
            let vinit = e.b.ins().splat(types::F32X4, init);
            let vaccs: Vec<_> = (0..UNROLL)
                .map(|_| {
                    let v = e.b.declare_var(types::F32X4);
                    e.b.def_var(v, vinit);
                    v
                })
                .collect();
            // The first contiguous read, a line of it per trip read `ahead`
            // rows on (see `signature`).
            let ahead = prologue
                .values
                .iter()
                .filter(|v| matches!(v.expr, Expr::Load { .. }))
                .zip(&pro.accesses)
                .find(|(_, a)| a.unit_stride())
                .map(|(v, a)| (e.row_ahead(a, v.dtype, row, pro.rows), v.dtype));
            from = e.counted_loop(zero, n, 4 * UNROLL as i64, |e, j| {
                if let Some((row_ahead, dtype)) = ahead {
                    let bytes = e.b.ins().imul_imm_s(j, dtype.size() as i64);
                    let at = e.b.ins().iadd(row_ahead, bytes);
                    // Without `notrap` a load stays although nothing uses it.
                    e.b.ins().load(types::I8, MemFlagsData::new(), at, 0);
                }
                for (u, &vacc) in vaccs.iter().enumerate() {
                    let j = e.b.ins().iadd_imm_s(j, 4 * u as i64);
                    let v = element(e, j, true);
                    let a = e.b.use_var(vacc);
                    let a = vcombine(e, a, v);
                    e.b.def_var(vacc, a);
                }
            });
            from = e.counted_loop(from, n, 4, |e, j| {
                let v = element(e, j, true);
                let a = e.b.use_var(vaccs[0]);
                let a = vcombine(e, a, v);
                e.b.def_var(vaccs[0], a);
            });
            // A ragged tail of a row of at least four: one more vector over the
            // last four elements, the lanes already counted masked to `init`.
            let ragged = inner_len % 4;
            if ragged != 0 && inner_len >= 4 {
                let j = e.iconst((inner_len - 4) as i64);
                let v = element(e, j, true);
                let lanes: Vec<u8> = (0..4u32)
                    .flat_map(|k| if k >= 4 - ragged as u32 { u32::MAX } else { 0 }.to_le_bytes())
                    .collect();
                let mask = e.b.func.dfg.constants.insert(lanes.into());
                let mask = e.b.ins().vconst(types::I32X4, mask);
                let mask = e.b.ins().bitcast(types::F32X4, MemFlagsData::new(), mask);
                let v = e.b.ins().bitselect(mask, v, vinit);
                let a = e.b.use_var(vaccs[0]);
                let a = vcombine(e, a, v);
                e.b.def_var(vaccs[0], a);
                from = n;
            }
            // The accumulators hold no NaN (`maxps` keeps the accumulator
            // over a NaN of the row), so folding them notes nothing.
            let mut v = e.b.use_var(vaccs[0]);
            for &vacc in &vaccs[1..] {
                let w = e.b.use_var(vacc);
                v = fold(e, v, w);
            }
            let mut total = e.b.ins().extractlane(v, 0);
            for lane in 1..4 {
                let x = e.b.ins().extractlane(v, lane);
                total = e.combine(op, DType::F32, total, x);
            }
            if let Some(nans) = nans {
                let seen = e.b.use_var(nans);
                let any = e.b.ins().vany_true(seen);
                let nan = e.b.ins().f32const(f32::NAN);
                total = e.b.ins().select(any, nan, total);
                let zero_f32 = e.b.ins().f32const(0.0);
                let is_zero = e.b.ins().fcmp(FloatCC::Equal, total, zero_f32);
                let (again, join) = (e.b.create_block(), e.b.create_block());
                e.b.set_cold_block(again);
                let max = e.b.append_block_param(join, types::F32);
                e.b.ins().brif(is_zero, again, &[], join, &[total.into()]);
                e.b.switch_to_block(again);
                let exact = e.b.declare_var(types::F32);
                e.b.def_var(exact, init);
                scalars(e, exact, zero);
                let exact = e.b.use_var(exact);
                e.b.ins().jump(join, &[exact.into()]);
                e.b.switch_to_block(join);
                total = max;
            }
            e.b.def_var(acc, total);
        }
        scalars(e, acc, from);
        let total = e.b.use_var(acc);
        let total = e.pin(total);
        let bases = epi_bases;
        // A reduced output's epilogue runs once per row, whatever the inner extent.
        let extent = if broadcast { inner_len } else { 1 };
        let hoisted = e.hoist(
            body,
            epi_reads,
            Rows::One(&bases),
            zero,
            extent,
            Some(total),
        );
        if broadcast {
            let mut from = zero;
            if epi_lanes {
                let splat = e.b.ins().splat(types::F32X4, total);
                for unroll in [UNROLL, 1] {
                    from = e.counted_loop(from, n, 4 * unroll as i64, |e, j| {
                        for u in 0..unroll {
                            let j = e.b.ins().iadd_imm_s(j, 4 * u as i64);
                            let v = e.block(
                                body,
                                epi_reads,
                                Rows::One(&bases),
                                &hoisted,
                                j,
                                Some(splat),
                                true,
                            );
                            e.store(out, out_base, j, v);
                        }
                    });
                }
                // A ragged tail: the last four elements again, the overlap
                // recomputed to the same values. Not when the epilogue reads
                // back the output it overwrites (`store`).
                if !inner_len.is_multiple_of(4) && inner_len >= 4 && !store {
                    let j = e.iconst((inner_len - 4) as i64);
                    let v = e.block(
                        body,
                        epi_reads,
                        Rows::One(&bases),
                        &hoisted,
                        j,
                        Some(splat),
                        true,
                    );
                    e.store(out, out_base, j, v);
                    from = n;
                }
            }
            e.counted_loop(from, n, 1, |e, j| {
                let v = e.block(
                    body,
                    epi_reads,
                    Rows::One(&bases),
                    &hoisted,
                    j,
                    Some(total),
                    false,
                );
                e.store(out, out_base, j, v);
            });
        } else {
            let v = e.block(
                body,
                epi_reads,
                Rows::One(&bases),
                &hoisted,
                zero,
                Some(total),
                false,
            );
            e.store(out, out_base, zero, v);
        }
    }

    /// Rows `row..row + 4` of a reduction with short rows, one row per lane:
    /// every read gathers the four rows' elements at one inner index, values
    /// constant along the rows are computed once, and the results go back
    /// to the four rows one lane at a time. f32 arithmetic, unpadded reads.
    #[allow(clippy::too_many_arguments)]
    fn reduce_four_short_rows(
        &mut self,
        op: ReduceOp,
        prologue: &Block,
        pro: &Nest,
        body: &Block,
        epi: &Nest,
        broadcast: bool,
        row: Value,
        inner_len: usize,
    ) {
        let rows: Vec<Value> = (0..4).map(|l| self.b.ins().iadd_imm_s(row, l)).collect();
        let pro_bases = self.lane_pointers(&pro.accesses, &rows);
        let epi_bases = self.lane_pointers(&epi.accesses, &rows);
        let zero = self.iconst(0);
        let hoisted = self.hoist(
            prologue,
            &pro.accesses,
            Rows::Four(&pro_bases),
            zero,
            inner_len,
            None,
        );
        let init = self.scalar_const(op.init(DType::F32));
        let init = self.b.ins().splat(types::F32X4, init);
        let acc = self.b.declare_var(types::F32X4);
        self.b.def_var(acc, init);
        // Rows this short are walked unrolled, at constant inner indices:
        // a loop of one vector per trip spent much of it counting (log_softmax
        // [4096, 10] took 1.25x as long).
        for j in 0..inner_len {
            let j = self.iconst(j as i64);
            let v = self.block(
                prologue,
                &pro.accesses,
                Rows::Four(&pro_bases),
                &hoisted,
                j,
                None,
                true,
            );
            let a = self.b.use_var(acc);
            let a = self.combine(op, DType::F32, a, v);
            self.b.def_var(acc, a);
        }
        let total = self.b.use_var(acc);
        let (reads, out) = epi.accesses.split_at(epi.accesses.len() - 1);
        let hoisted = self.hoist(
            body,
            reads,
            Rows::Four(&epi_bases),
            zero,
            inner_len,
            Some(total),
        );
        let out_lanes = &epi_bases[epi_bases.len() - 1];
        let store = |e: &mut Self, j: Value, v: Value| {
            let inner = e.inner_bytes(&out[0], j, e.out_dtype);
            for (lane, &base) in out_lanes.iter().enumerate() {
                let x = e.b.ins().extractlane(v, lane as u8);
                let addr = e.b.ins().iadd(base, inner);
                e.b.ins()
                    .store(MemFlagsData::new().with_notrap(), x, addr, 0);
            }
        };
        if broadcast {
            for j in 0..inner_len {
                let j = self.iconst(j as i64);
                let v = self.block(
                    body,
                    reads,
                    Rows::Four(&epi_bases),
                    &hoisted,
                    j,
                    Some(total),
                    true,
                );
                store(self, j, v);
            }
        } else {
            let v = self.block(
                body,
                reads,
                Rows::Four(&epi_bases),
                &hoisted,
                zero,
                Some(total),
                true,
            );
            store(self, zero, v);
        }
    }

    /// For each access, the address of each of four rows' first element.
    fn lane_pointers(&mut self, accesses: &[Access], rows: &[Value]) -> Vec<[Value; 4]> {
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
    fn inner_bytes(&mut self, access: &Access, j: Value, dtype: DType) -> Value {
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

    /// Rows `from..to` of a reduction whose rows are neighbours in memory (a
    /// sum over a leading axis): the output rows accumulate in place, four
    /// rows per vector, while the reduced axis is walked once in memory
    /// order; then the epilogue (which reads nothing) runs on them in place.
    #[allow(clippy::too_many_arguments)]
    fn reduce_column_block(
        &mut self,
        op: ReduceOp,
        prologue: &Block,
        pro: &Nest,
        body: &Block,
        epi: &Nest,
        from: Value,
        to: Value,
        inner_len: usize,
    ) {
        let out_ptr = self.ptrs[epi.accesses[epi.accesses.len() - 1].buffer];
        let flags = MemFlagsData::new().with_notrap();
        let init = self.scalar_const(op.init(DType::F32));
        let vinit = self.b.ins().splat(types::F32X4, init);
        let addr = |e: &mut Self, rr: Value| {
            let bytes = e.b.ins().imul_imm_s(rr, 4);
            e.b.ins().iadd(out_ptr, bytes)
        };
        self.row_span(from, to, &mut |e, rr, lanes| {
            let a = addr(e, rr);
            let v = if lanes { vinit } else { init };
            e.b.ins().store(flags, v, a, 0);
        });
        let bases = self.bases(&pro.accesses, from);
        let zero = self.iconst(0);
        let n = self.iconst(inner_len as i64);
        let none = vec![None; prologue.values.len()];
        self.counted_loop(zero, n, 1, |e, j| {
            // Each read's offset at (row `from`, reduced index `j`), once per
            // `j`: Cranelift would recompute it for every vector of the span.
            let at_j: Vec<Value> = pro
                .accesses
                .iter()
                .zip(&bases)
                .map(|(a, b)| {
                    let (offset, _) = e.element(a, *b, j);
                    e.pin(offset)
                })
                .collect();
            e.row_span(from, to, &mut |e, rr, lanes| {
                let d = e.b.ins().isub(rr, from);
                let shifted: Vec<RowBase> = pro
                    .accesses
                    .iter()
                    .zip(&at_j)
                    .map(|(a, &at)| {
                        let step = a.outer.last().map_or(0, |o| o.stride);
                        let off = e.b.ins().imul_imm_s(d, step);
                        RowBase {
                            base: e.b.ins().iadd(at, off),
                            valid: None,
                        }
                    })
                    .collect();
                e.row_lanes = true;
                let v = e.block(
                    prologue,
                    &pro.accesses,
                    Rows::One(&shifted),
                    &none,
                    zero,
                    None,
                    lanes,
                );
                e.row_lanes = false;
                let a = addr(e, rr);
                let ty = if lanes { types::F32X4 } else { types::F32 };
                let acc = e.b.ins().load(ty, flags, a, 0);
                let acc = e.combine(op, DType::F32, acc, v);
                e.b.ins().store(flags, acc, a, 0);
            });
        });
        let none = vec![None; body.values.len()];
        self.row_span(from, to, &mut |e, rr, lanes| {
            let a = addr(e, rr);
            let ty = if lanes { types::F32X4 } else { types::F32 };
            let acc = e.b.ins().load(ty, flags, a, 0);
            let v = e.block(body, &[], Rows::One(&[]), &none, zero, Some(acc), lanes);
            e.b.ins().store(flags, v, a, 0);
        });
    }

    /// `for rr in from..to`: `UNROLL` vectors of four at a time, then four
    /// (`lanes`), then one at a time.
    fn row_span(&mut self, from: Value, to: Value, f: &mut dyn FnMut(&mut Self, Value, bool)) {
        let rest = self.counted_loop(from, to, 4 * UNROLL as i64, |e, rr| {
            for u in 0..UNROLL {
                let at = e.b.ins().iadd_imm_s(rr, 4 * u as i64);
                f(e, at, true);
            }
        });
        let rest = self.counted_loop(rest, to, 4, |e, rr| f(e, rr, true));
        self.counted_loop(rest, to, 1, |e, rr| f(e, rr, false));
    }

    fn combine(&mut self, op: ReduceOp, dtype: DType, a: Value, x: Value) -> Value {
        match (op, dtype) {
            (ReduceOp::Sum, DType::F32) => self.b.ins().fadd(a, x),
            (ReduceOp::Sum, _) => self.b.ins().iadd(a, x),
            (ReduceOp::Max, DType::F32) => self.math_of(a).maximum(a, x),
            (ReduceOp::Max, DType::I32) => self.b.ins().smax(a, x),
            (ReduceOp::Max, _) => self.b.ins().umax(a, x),
        }
    }
}
