//! Lowering of one kernel to a Cranelift function: the entry point, which
//! arranges the kernel's reads and write into loop nests and picks how each
//! block runs.
//!
//! Every kernel becomes `fn(buffers: *const *mut u8, start: i64, end: i64)`:
//! `buffers` holds the input pointers, the output pointer, then the side
//! outputs' (stored with the output, at the same element), and the
//! function computes the rows `start..end` of its loop nest (`crate::nest`),
//! so that threads can split a launch into disjoint row ranges. A contiguous
//! elementwise kernel is one flat loop whose `start..end` are element
//! indices. Per row each read's base offset is computed once from the row's
//! coordinates. Padded reads clamp their coordinates into the valid range
//! (so the address is always inside the buffer) and select the fill value
//! outside it; in a row that every padded read of an elementwise kernel
//! reads, the stretch inside all their valid ranges runs as unpadded reads.
//!
//! The inner loop of an elementwise kernel or a matmul's epilogue runs four
//! lanes at a time with a scalar tail when every value has a lane form
//! (`lane_op`: f32 and i32 arithmetic, comparisons, `where` and casts
//! between f32, i32, u8 and bool, in f32x4 or i32x4) and every read is
//! contiguous or constant along it; reads constant along the inner loop are
//! loaded once per row. Reductions run in f32x4 where their blocks are pure
//! f32 arithmetic; one over short rows runs four rows at once instead, one
//! per lane. Everything else runs one element at a time. Either way the
//! results are the interpreter's, bit for bit.
//!
//! - `emit`: the emitter, its loops, addresses, loads and stores, and the
//!   evaluation of a block at an inner index;
//! - `ops`: one value of a block, a cast or a reduction's combine;
//! - `elementwise`: elementwise kernels and matmul epilogues;
//! - `reduce`: reductions, by rows, four short rows at once, or by columns;
//! - `scatter`: scatter-adds, pick by pick into zeroed rows;
//! - `exp_sum`: a row's sum of exponentials by a call of 256-bit code;
//! - `row_call`: a row's max or sum, and an epilogue scaling a row, by calls
//!   of 256-bit code, and how a block is matched to a row function's form.

mod elementwise;
mod emit;
mod exp_sum;
mod half;
mod memory;
mod ops;
mod reduce;
mod row_call;
mod row_fold;
mod scatter;

use cranelift_codegen::ir::{
    AbiParam, FuncRef, Function, InstBuilder, MemFlagsData, Signature, Type, Value, types,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{Linkage, Module};
use kiln_ir::elementwise::infer_matmul;
use kiln_ir::kernel::{Block, Expr, Kernel, KernelKind, Operand};
use kiln_ir::view::View;
use kiln_ir::{BinaryOp, DType, ReduceOp, Scalar, Shape, TensorType};

use crate::nest::{Access, Reduction, loads, nest};
use emit::Emitter;
use reduce::Reduce;
use scatter::Scatter;

/// How a lowered kernel is driven: the range of `start..end` and what one
/// unit of it costs, for splitting across threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowRange {
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
/// prefetch instruction; a load whose value goes unused does the same. (A
/// plain read's max or sum by a call, `row_call`, reads nothing ahead.)
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

/// Vectors per trip of an unrolled loop: enough independent work to keep the
/// load and FMA units busy.
const UNROLL: usize = 4;

/// A host function that generated code calls.
#[derive(Clone, Copy)]
pub(crate) enum Host {
    /// `kiln_powf(x, y)`: f32 `pow`, as the interpreter computes it.
    PowF,
    /// `kiln_powd(x, y)` (`cpu::f64_math`): f64 `pow`.
    PowD,
    /// `kiln_unary_f64(x, code)` (`cpu::f64_math`): the f64 transcendentals,
    /// by `f64_math::unary_code`.
    UnaryF64,
    /// `kiln_exp_sum(src, shift, dst, n, ahead) -> sum` (`cpu::exp_row`).
    ExpSum,
    /// `kiln_max_row(src, n) -> max` (`cpu::row_ops`).
    MaxRow,
    /// `kiln_sum_row(src, n) -> sum` (`cpu::row_ops`).
    SumRow,
    /// `kiln_scale_row(src, c, dst, n)` (`cpu::row_ops`).
    ScaleRow,
}

impl Host {
    pub(crate) const ALL: [Host; 7] = [
        Host::PowF,
        Host::PowD,
        Host::UnaryF64,
        Host::ExpSum,
        Host::MaxRow,
        Host::SumRow,
        Host::ScaleRow,
    ];

    /// The symbol the JIT resolves.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Host::PowF => "kiln_powf",
            Host::PowD => "kiln_powd",
            Host::UnaryF64 => "kiln_unary_f64",
            Host::ExpSum => "kiln_exp_sum",
            Host::MaxRow => "kiln_max_row",
            Host::SumRow => "kiln_sum_row",
            Host::ScaleRow => "kiln_scale_row",
        }
    }

    /// Parameter and result types, `ptr` being the target's pointer type.
    fn signature(self, ptr: Type) -> (Vec<Type>, Option<Type>) {
        let (f, d, n) = (types::F32, types::F64, types::I64);
        match self {
            Host::PowF => (vec![f, f], Some(f)),
            Host::PowD => (vec![d, d], Some(d)),
            Host::UnaryF64 => (vec![d, n], Some(d)),
            Host::ExpSum => (vec![ptr, f, ptr, n, ptr], Some(f)),
            Host::MaxRow | Host::SumRow => (vec![ptr, n], Some(f)),
            Host::ScaleRow => (vec![ptr, f, ptr, n], None),
        }
    }
}

/// The host functions a kernel calls, each declared in the module and
/// imported into the function at its first call: most kernels call none,
/// and declaring all seven in every kernel made compiling one take more
/// instructions (callgrind, `compile_mlp3`'s kernels;
/// `benches/RESULTS-cpu.md`).
pub(crate) struct Calls<'a> {
    module: &'a mut dyn Module,
    imported: [Option<FuncRef>; Host::ALL.len()],
    /// Whether the 256-bit row functions (`ExpSum`, `MaxRow`, `SumRow`,
    /// `ScaleRow`) may be called: where the CPU runs them.
    rows: bool,
}

impl<'a> Calls<'a> {
    pub(crate) fn new(module: &'a mut dyn Module, rows: bool) -> Self {
        Calls {
            module,
            imported: [None; Host::ALL.len()],
            rows,
        }
    }

    /// `host`'s reference in `func`, declared at the first call.
    fn import(&mut self, host: Host, func: &mut Function) -> FuncRef {
        let module = &mut *self.module;
        *self.imported[host as usize].get_or_insert_with(|| {
            let ptr = module.target_config().pointer_type();
            let (params, ret) = host.signature(ptr);
            let mut sig = module.make_signature();
            sig.params.extend(params.into_iter().map(AbiParam::new));
            sig.returns.extend(ret.map(AbiParam::new));
            // `declare_function` fails only for a name declared before as
            // data or with another signature: each host function is
            // declared here, once per module, with its one signature.
            let id = module
                .declare_function(host.name(), Linkage::Import, &sig)
                .expect("host functions are declared once per module");
            module.declare_func_in_func(id, func)
        })
    }
}

/// For a matmul whose output reshapes the product (a convolution's
/// `[N, O, H, W]` from `[N, groups, O / groups, H * W]`), the product's
/// shape and the epilogue with every read reshaped to it; `None` when the
/// output is the product's shape already or a read does not reshape.
fn product_rows(kernel: &Kernel) -> Option<(Shape, Block)> {
    let KernelKind::MatMul { a, b } = &kernel.kind else {
        return None;
    };
    let operand = |o: &Operand| TensorType::new(DType::F32, o.shape().clone());
    let product = infer_matmul(&operand(a), &operand(b)).ok()?.shape;
    if product == kernel.out.shape || product.numel() != kernel.out.shape.numel() {
        return None;
    }
    let mut body = kernel.body.clone();
    for value in &mut body.values {
        if let Some((_, view)) = value.expr.read_mut() {
            *view = view.reshape(&product)?;
        }
    }
    Some((product, body))
}

/// Emits the kernel into `func` and says how to launch it.
pub(crate) fn lower<'a>(
    kernel: &Kernel,
    func: &'a mut Function,
    fbc: &'a mut FunctionBuilderContext,
    ptr: Type,
    calls: Calls<'a>,
    target: TargetFrontendConfig,
) -> RowRange {
    let mut b = FunctionBuilder::new(func, fbc);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry);
    let (table, start, end, ahead) = (params[0], params[1], params[2], params[3]);
    let buffers = kernel.inputs.len() + 1 + kernel.side.len();
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
    let mut e = Emitter {
        b,
        ptrs,
        calls,
        out_dtype: kernel.out.dtype,
        row_lanes: false,
        store_prologue: false,
        ahead,
        side: (0..kernel.side.len())
            .map(|k| (out_buffer + 1 + k, kernel.side[k].value))
            .collect(),
    };
    let range = match &kernel.kind {
        KernelKind::Elementwise | KernelKind::MatMul { .. } => {
            elementwise(&mut e, kernel, start, end)
        }
        KernelKind::Reduce {
            op,
            axes,
            shape,
            prologue,
        } => {
            let reduction = Reduction::new(shape, axes);
            reduce(
                &mut e,
                kernel,
                (*op, &reduction, shape, prologue),
                start,
                end,
            )
        }
        KernelKind::Scatter {
            axis,
            shape,
            prologue,
            index,
        } => scatter(&mut e, kernel, (*axis, shape, prologue, *index), start, end),
    };
    e.b.ins().return_(&[]);
    e.b.seal_all_blocks();
    e.b.finalize(target);
    range
}

/// An elementwise kernel, or a matmul's epilogue over the product in place.
fn elementwise(e: &mut Emitter, kernel: &Kernel, start: Value, end: Value) -> RowRange {
    let out_buffer = kernel.inputs.len();
    let space = &kernel.out.shape;
    // An epilogue over a reshape of the product runs over the
    // product's own shape where its reads allow, so that its rows
    // are the product's and follow the GEMM's row blocks.
    let product = product_rows(kernel);
    let (space, body) = product
        .as_ref()
        .map_or((space, &kernel.body), |(s, b)| (s, b));
    let identity: Vec<usize> = (0..space.rank()).collect();
    let out_view = View::contiguous(space);
    let mut views = loads(body);
    views.push((out_buffer, &out_view));
    // A matmul's product is already in the output and its epilogue reads
    // it in place, a row of the output's last axis per unit, so that it
    // can follow the GEMM's row blocks.
    let acc = matches!(kernel.kind, KernelKind::MatMul { .. });
    let split = acc.then(|| space.rank().saturating_sub(1));
    let nest = nest(space, &identity, split, &views);
    e.elementwise(body, &nest, acc, start, end)
}

/// A reduction kernel: its prologue's nest along the reduced axes, the
/// epilogue's over the output, and a prologue value the epilogue reuses.
fn reduce(
    e: &mut Emitter,
    kernel: &Kernel,
    (op, reduction, shape, prologue): (ReduceOp, &Reduction, &Shape, &Block),
    start: Value,
    end: Value,
) -> RowRange {
    let out_buffer = kernel.inputs.len();
    let space = &kernel.out.shape;
    let pro = reduction.nest(shape, &loads(prologue));
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
        let out_nest = reduction.nest(space, &[(out_buffer, &out_view)]);
        if vectorizable(prologue, &pro.accesses, None) && !out_nest.accesses[0].unit_stride() {
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
            drop_dead_loads(&mut body, &e.side);
            body
        }
        None => kernel.body.clone(),
    };
    let mut views = loads(&body);
    views.push((out_buffer, &out_view));
    let epilogue = if broadcast {
        reduction.nest(space, &views)
    } else {
        let all: Vec<usize> = (0..space.rank()).collect();
        nest(space, &all, Some(space.rank()), &views)
    };
    e.store_prologue = reuse.is_some();
    let reduce = Reduce {
        op,
        prologue,
        pro: &pro,
        body: &body,
        epi: &epilogue,
        broadcast,
    };
    e.reduce(reduce, start, end)
}

/// A scatter-add kernel: its updates' nest, row by row of its outer axes.
fn scatter(
    e: &mut Emitter,
    kernel: &Kernel,
    (axis, shape, prologue, index): (usize, &Shape, &Block, u32),
    start: Value,
    end: Value,
) -> RowRange {
    let out_buffer = kernel.inputs.len();
    let space = &kernel.out.shape;
    let identity: Vec<usize> = (0..shape.rank()).collect();
    let nest = nest(shape, &identity, Some(axis + 1), &loads(prologue));
    let dims = shape.dims();
    let scatter = Scatter {
        prologue,
        index,
        nest: &nest,
        outer: dims[..axis].iter().product(),
        picks: dims[axis],
        len: space.dims()[axis],
        out: out_buffer,
    };
    e.scatter(scatter, start, end)
}

/// Makes the loads that neither `block`'s result nor a side output
/// `stored` depends on constants: a load is an instruction Cranelift keeps
/// even when its value is unused.
fn drop_dead_loads(block: &mut Block, stored: &[(usize, u32)]) {
    let live = live(block, stored);
    for (v, live) in block.values.iter_mut().zip(live) {
        if !live && v.expr.read().is_some() {
            v.expr = Expr::Const(Scalar::I32(0).cast(v.dtype));
        }
    }
}

/// Which values of `block` its result or a side output `stored` (buffer,
/// value) needs.
fn live(block: &Block, stored: &[(usize, u32)]) -> Vec<bool> {
    let mut live = vec![false; block.values.len()];
    if let Some(last) = live.last_mut() {
        *last = true;
    }
    for &(_, v) in stored {
        live[v as usize] = true;
    }
    for i in (0..block.values.len()).rev() {
        if live[i] {
            for x in block.values[i].expr.operands() {
                live[x as usize] = true;
            }
        }
    }
    live
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
        // 16-bit floats are held as the f32 of their value (`half`).
        DType::F32 | DType::BF16 | DType::F16 => types::F32,
        DType::F64 => types::F64,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        DType::U8 | DType::Bool => types::I8,
    }
}

/// Whether `block`, of an f32 result, can run four lanes at a time: every
/// value one with a lane form (`lane_op`: f32 arithmetic, and the i32
/// values, comparisons, `where`s and casts a mask makes on the way, as a
/// causal attention's `where(row >= col, s, -inf)`), with reads as
/// `lanes_read` takes them.
fn vectorizable(block: &Block, accesses: &[Access], out: Option<&Access>) -> bool {
    block.dtype() == Some(DType::F32)
        && block.values.iter().all(|v| lane_op(block, v))
        && lanes_read(block, accesses, out)
}

/// Whether every read of `block` (`accesses`, in its order) is contiguous
/// or constant along the inner loop, or a 4-byte load of every other
/// element (two vectors and a shuffle, `Emitter::load_at`), and the write
/// (if any) contiguous.
fn lanes_read(block: &Block, accesses: &[Access], out: Option<&Access>) -> bool {
    let mut reads = block.values.iter().filter(|v| v.expr.read().is_some());
    let reads_ok = accesses.iter().all(|a| {
        let paired = reads
            .next()
            .is_some_and(|v| matches!(v.expr, Expr::Load { .. }) && v.dtype.size() == 4);
        a.row_invariant() || a.unit_stride() || (paired && a.stride_two())
    });
    reads_ok && out.is_none_or(Access::unit_stride)
}

/// Whether every value of `block` is f32 arithmetic that has a vector form.
fn f32_arithmetic(block: &Block) -> bool {
    block.values.iter().all(f32_lane_op)
}

/// Whether `v` is f32 arithmetic that has a vector form.
fn f32_lane_op(v: &kiln_ir::kernel::Value) -> bool {
    v.dtype == DType::F32
        && match &v.expr {
            Expr::Load { .. } | Expr::Const(_) | Expr::Acc | Expr::Unary(..) => true,
            // `uniform` is f32 from i32 operands: lanes of i32, not f32.
            Expr::Binary(op, _, _) => {
                !op.is_comparison() && !matches!(op, BinaryOp::Pow | BinaryOp::Uniform)
            }
            Expr::Where(..) | Expr::Cast(_) | Expr::Gather { .. } => false,
        }
}

/// Whether an elementwise block (or a matmul's epilogue) runs four lanes
/// at a time: every value a `lane_op`, except those `hoisted` computes once
/// per row as scalars and splats, which need only have lanes (an
/// optimizer's bias correction, a `pow` of the step count, leaves its
/// update in vectors; so does a row's label compared along it) or be read
/// only as gathers' index (an i64 id, kept a scalar), and gathers whose
/// index is hoisted (a row picked once per row); a result stored as f32,
/// i32, bf16 or f16; reads as `lanes_read` takes them.
fn vectorizable_hoisted(
    block: &Block,
    accesses: &[Access],
    out: &Access,
    hoisted: &[Option<Value>],
) -> bool {
    // A hoisted value that only gathers read as their index stays a scalar.
    let only_indexes = |i: usize| {
        block.values.iter().zip(hoisted).all(|(u, h)| {
            h.is_some()
                || matches!(u.expr, Expr::Gather { index, .. } if index as usize == i)
                || !u.expr.operands().contains(&(i as u32))
        })
    };
    let values_ok = block
        .values
        .iter()
        .zip(hoisted)
        .enumerate()
        .all(|(i, (v, h))| match (h, &v.expr) {
            (Some(_), _) => has_lanes(v.dtype) || only_indexes(i),
            // A gather runs in lanes along a row it picks once per row.
            (None, Expr::Gather { index, .. }) => {
                has_lanes(v.dtype) && hoisted[*index as usize].is_some()
            }
            (None, _) => lane_op(block, v),
        });
    let stored_ok = matches!(
        block.dtype(),
        Some(DType::F32 | DType::I32 | DType::BF16 | DType::F16)
    );
    values_ok && stored_ok && lanes_read(block, accesses, Some(out))
}

/// Whether values of `dtype` run four to a vector: f32, bf16 and f16 (as
/// f32, `half`) in f32x4; i32, u8 (zero-extended) and bool (a mask of all
/// ones or all zeros, as a comparison makes it) in i32x4. The 64-bit types do not: two lanes would
/// not pay for the conversions around them.
fn has_lanes(dtype: DType) -> bool {
    !matches!(dtype, DType::F64 | DType::I64)
}

/// Whether `v` of `block` has a lane form: f32 arithmetic but `pow`, i32
/// arithmetic, comparisons, `where`, casts between types with lanes. u8 and
/// bool lanes hold their values widened, where adding or multiplying would
/// not wrap at 8 bits: of those only comparisons, max and min.
fn lane_op(block: &Block, v: &kiln_ir::kernel::Value) -> bool {
    let dtype_of = |x: u32| block.values[x as usize].dtype;
    has_lanes(v.dtype)
        && match &v.expr {
            Expr::Load { .. } | Expr::Const(_) | Expr::Where(..) => true,
            Expr::Acc => v.dtype == DType::F32,
            Expr::Unary(..) => matches!(v.dtype, DType::F32 | DType::I32),
            Expr::Binary(op, x, _) => match dtype_of(*x) {
                DType::F32 => *op != BinaryOp::Pow,
                DType::I32 => true,
                DType::U8 | DType::Bool => {
                    op.is_comparison() || matches!(op, BinaryOp::Max | BinaryOp::Min)
                }
                DType::F64 | DType::I64 | DType::BF16 | DType::F16 => false,
            },
            // An i32 into a 16-bit float goes through f64 (`cast`), which
            // has no lanes: through f32 it could round twice.
            Expr::Cast(x) => {
                has_lanes(dtype_of(*x)) && !(dtype_of(*x) == DType::I32 && v.dtype.is_half())
            }
            // Only with its index hoisted (`vectorizable_hoisted`).
            Expr::Gather { .. } => false,
        }
}
