//! Rendering of one kernel's loop plan (`crate::loops`) as a Cranelift
//! function.
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
//! Lanes are f32x4 or i32x4 (`loops::lanes`); reads constant along the
//! inner loop are loaded once per row. A reduction runs as its plan says:
//! a row at a time (in lanes where the plan says), four short rows at once,
//! one per lane, or blocks of neighbouring rows accumulated in place.
//! Either way the results are the interpreter's, bit for bit.
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
use kiln_ir::DType;
use kiln_ir::kernel::Kernel;

use crate::loops::{self, Loops, Target};
use emit::Emitter;

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
    /// `kiln_remd(x, y)` (`cpu::f64_math`): f64 `rem` (C's `fmod`).
    RemD,
    /// `kiln_unary_f64(x, code)` (`cpu::f64_math`): the f64 transcendentals,
    /// by `f64_math::unary_code`.
    UnaryF64,
    /// `kiln_exp_sum(src, shift, dst, n, ahead) -> sum` (`kiln_machine::rows`).
    ExpSum,
    /// `kiln_max_row(src, n) -> max` (`kiln_machine::rows`).
    MaxRow,
    /// `kiln_sum_row(src, n) -> sum` (`kiln_machine::rows`).
    SumRow,
    /// `kiln_scale_row(src, c, dst, n)` (`kiln_machine::rows`).
    ScaleRow,
    /// `kiln_bf16_row(src, dst, n)` (`kiln_machine::rows`).
    Bf16Row,
    /// `kiln_silu_row(src, dst, n)` (`kiln_machine::rows`).
    SiluRow,
}

impl Host {
    pub(crate) const ALL: [Host; 10] = [
        Host::PowF,
        Host::PowD,
        Host::RemD,
        Host::UnaryF64,
        Host::ExpSum,
        Host::MaxRow,
        Host::SumRow,
        Host::ScaleRow,
        Host::Bf16Row,
        Host::SiluRow,
    ];

    /// The symbol the JIT resolves.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Host::PowF => "kiln_powf",
            Host::PowD => "kiln_powd",
            Host::RemD => "kiln_remd",
            Host::UnaryF64 => "kiln_unary_f64",
            Host::ExpSum => "kiln_exp_sum",
            Host::MaxRow => "kiln_max_row",
            Host::SumRow => "kiln_sum_row",
            Host::ScaleRow => "kiln_scale_row",
            Host::Bf16Row => "kiln_bf16_row",
            Host::SiluRow => "kiln_silu_row",
        }
    }

    /// Parameter and result types, `ptr` being the target's pointer type.
    fn signature(self, ptr: Type) -> (Vec<Type>, Option<Type>) {
        let (f, d, n) = (types::F32, types::F64, types::I64);
        match self {
            Host::PowF => (vec![f, f], Some(f)),
            Host::PowD | Host::RemD => (vec![d, d], Some(d)),
            Host::UnaryF64 => (vec![d, n], Some(d)),
            Host::ExpSum => (vec![ptr, f, ptr, n, ptr], Some(f)),
            Host::MaxRow | Host::SumRow => (vec![ptr, n], Some(f)),
            Host::ScaleRow => (vec![ptr, f, ptr, n], None),
            Host::Bf16Row | Host::SiluRow => (vec![ptr, ptr, n], None),
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
    /// `ScaleRow`, `Bf16Row`, `SiluRow`) may be called: where the CPU runs
    /// them.
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

/// Emits the kernel into `func` and says how to launch it; a matmul's
/// epilogue reads the product from a buffer after the side outputs where
/// `product_apart`, else from the output.
pub(crate) fn lower<'a>(
    kernel: &Kernel,
    func: &'a mut Function,
    fbc: &'a mut FunctionBuilderContext,
    ptr: Type,
    calls: Calls<'a>,
    (target, product_apart): (TargetFrontendConfig, bool),
) -> RowRange {
    let mut b = FunctionBuilder::new(func, fbc);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry);
    let (table, start, end, ahead) = (params[0], params[1], params[2], params[3]);
    // A product apart follows the side outputs (`CompiledKernel::bind`).
    let mut buffers = kernel.inputs.len() + 1 + kernel.side.len();
    let product = product_apart.then_some(buffers);
    buffers += usize::from(product_apart);
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
        ahead,
        side: (0..kernel.side.len())
            .map(|k| (out_buffer + 1 + k, kernel.side[k].value))
            .collect(),
        product,
    };
    let range = match &loops::plan(kernel, Target::CPU).kind {
        Loops::Map(m) => e.map(m, start, end),
        Loops::Reduce(r) => e.reduce(r, start, end),
        Loops::Scatter(s) => e.scatter(s, start, end),
    };
    e.b.ins().return_(&[]);
    e.b.seal_all_blocks();
    e.b.finalize(target);
    range
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
