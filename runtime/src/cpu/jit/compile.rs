//! Compiling one kernel: the host ISA, a Cranelift JIT module per kernel,
//! the kernel lowered into it (`lower`) and finalized into a function
//! pointer, with a matmul's plan made and the prologues of its written
//! operands compiled as kernels of their own.

#![allow(unsafe_code)]

use std::sync::{Mutex, OnceLock};

use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use kiln_ir::kernel::{Block, Kernel, KernelKind};
use kiln_ir::{NodeId, Shape};

#[cfg(target_arch = "x86_64")]
use kiln_machine::rows;

use crate::Error;
use crate::cpu::f64_math;
use crate::cpu::jit::matmul::Strided;
use crate::cpu::lower::{self, RowRange};
use crate::cpu::taps::{self, TapsPlan};
use crate::matmul::{self, Plan, PlanOperand, Source, Target};

/// A kernel function: buffer table, first and last-plus-one row, and how
/// many rows ahead it reads a line in advance (see `lower::signature`).
type KernelFn = unsafe extern "C" fn(*const *mut u8, i64, i64, i64);

/// `pow` for the generated code, computed as the interpreter defines it.
extern "C" fn kiln_powf(x: f32, y: f32) -> f32 {
    (f64::from(x)).powf(f64::from(y)) as f32
}

/// Where the host function named `name` lies, for the JIT to resolve
/// generated code's calls (`lower::Host`).
fn host_address(name: &str) -> Option<*const u8> {
    let host = lower::Host::ALL.into_iter().find(|h| h.name() == name)?;
    Some(match host {
        lower::Host::PowF => kiln_powf as *const u8,
        lower::Host::PowD => f64_math::kiln_powd as *const u8,
        lower::Host::RemD => f64_math::kiln_remd as *const u8,
        lower::Host::UnaryF64 => f64_math::kiln_unary_f64 as *const u8,
        #[cfg(target_arch = "x86_64")]
        lower::Host::ExpSum => rows::kiln_exp_sum as *const u8,
        #[cfg(target_arch = "x86_64")]
        lower::Host::MaxRow => rows::kiln_max_row as *const u8,
        #[cfg(target_arch = "x86_64")]
        lower::Host::SumRow => rows::kiln_sum_row as *const u8,
        #[cfg(target_arch = "x86_64")]
        lower::Host::ScaleRow => rows::kiln_scale_row as *const u8,
        #[cfg(target_arch = "x86_64")]
        lower::Host::Bf16Row => rows::kiln_bf16_row as *const u8,
        #[cfg(target_arch = "x86_64")]
        lower::Host::SiluRow => rows::kiln_silu_row as *const u8,
        // Called only where `row_calls` holds.
        #[cfg(not(target_arch = "x86_64"))]
        _ => return None,
    })
}

/// Whether generated code calls the 256-bit row functions
/// (`kiln_machine::rows`): where the CPU has AVX2 and FMA, unless
/// `KILN_CPU_ISA` is `generic`, which keeps every row in the generated code.
fn row_calls() -> Result<bool, Error> {
    Ok(crate::cpu_isa()?.row_calls())
}

/// The host's ISA with kiln's settings, made once.
fn isa() -> Result<&'static OwnedTargetIsa, Error> {
    static ISA: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        let set =
            |f: &mut settings::Builder, k: &str, v: &str| f.set(k, v).map_err(|e| e.to_string());
        set(&mut flags, "opt_level", "speed")?;
        // cranelift-jit needs non-PIC code and absolute libcalls.
        set(&mut flags, "is_pic", "false")?;
        set(&mut flags, "use_colocated_libcalls", "false")?;
        let verify = if cfg!(debug_assertions) {
            "true"
        } else {
            "false"
        };
        set(&mut flags, "enable_verifier", verify)?;
        let builder = cranelift_native::builder().map_err(|e| e.to_string())?;
        builder
            .finish(settings::Flags::new(flags))
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| crate::codegen("the host ISA", e.to_string()))
}

/// A kernel compiled to machine code, with what it takes to call it.
pub(crate) struct CompiledKernel {
    /// Owns the code memory `func` points into; never touched again, held
    /// in a mutex only so the kernel can be shared between threads.
    _module: Mutex<JITModule>,
    pub(super) func: KernelFn,
    pub(super) range: RowRange,
    pub(super) kernel: Kernel,
    /// For a matmul, its plan and the prologues of its written operands.
    pub(super) matmul: Option<MatMul>,
    /// For a sum of taps run by the machine kernel (`cpu::taps`), its plan;
    /// `func` is then the rest of the body over the sum.
    pub(super) taps: Option<Taps>,
}

/// A kernel's sum of taps, and whether the generated code has anything
/// left to do after it (its body is more than the sum, or it writes side
/// outputs).
pub(super) struct Taps {
    pub(super) plan: TapsPlan,
    pub(super) epilogue: bool,
}

/// A matmul kernel's plan (`matmul::plan` for kiln's cores, made once here,
/// not at every launch), and, for `a` and `b`, the prologue that writes
/// the operand where the plan has one, and the layout the GEMM reads it
/// through (a convolution's, a table of an offset per output position).
pub(super) struct MatMul {
    pub(super) plan: Plan,
    pub(super) prologues: [Option<Box<CompiledKernel>>; 2],
    pub(super) layouts: [Strided; 2],
}

impl MatMul {
    /// Matmul `kernel`'s plan for kiln's cores, its operands' prologues
    /// compiled (`code` as `CompiledKernel::new`'s) and their layouts.
    fn compile(kernel: &Kernel, code: &mut Option<&mut dyn FnMut(&str)>) -> Result<MatMul, Error> {
        let plan = matmul::plan(kernel, Target::cpu(crate::cpu_isa()?))?;
        // The schedule gave the launch the scratch of the kernel's
        // computed operands and of a product its output cannot hold
        // (`Kernel::scratch_bytes`); kiln's cores read every other
        // operand in place.
        if plan.scratch_bytes > kernel.scratch_bytes() {
            return Err(crate::codegen(
                crate::label(kernel),
                format!(
                    "a matmul plan needs {} scratch bytes, the schedule gave {}",
                    plan.scratch_bytes,
                    kernel.scratch_bytes()
                ),
            ));
        }
        let mut prologues = [None, None];
        for (slot, o) in prologues.iter_mut().zip([&plan.a, &plan.b]) {
            if let Source::Written { prologue, .. } = &o.source {
                let code = code.as_mut().map(|c| &mut **c as &mut dyn FnMut(&str));
                *slot = Some(Box::new(CompiledKernel::new(prologue, code)?));
            }
        }
        let layout = |o: &PlanOperand| {
            Strided::of(o).map_err(|problem| crate::codegen(crate::label(kernel), problem))
        };
        let layouts = [layout(&plan.a)?, layout(&plan.b)?];
        Ok(MatMul {
            plan,
            prologues,
            layouts,
        })
    }
}

impl CompiledKernel {
    /// For each operand of a matmul written before the product, what its
    /// prologue writes: its block with each read naming the value it reads
    /// (`nodes`, the launch's inputs), and the shape it writes (how the
    /// product reads that, as it is or transposed, is the plan's).
    /// Two launches with the same write the same values.
    pub(crate) fn computed(&self, nodes: &[NodeId]) -> [Option<(Block, Shape)>; 2] {
        let written = |o: &PlanOperand| match &o.source {
            Source::Written { prologue, .. } => {
                let mut block = prologue.body.clone();
                for v in &mut block.values {
                    if let Some((input, _)) = v.expr.read_mut() {
                        *input = nodes.get(*input as usize)?.0;
                    }
                }
                Some((block, prologue.out.shape.clone()))
            }
            Source::Input { .. } => None,
        };
        match &self.matmul {
            Some(m) => [written(&m.plan.a), written(&m.plan.b)],
            None => [None, None],
        }
    }

    /// Lowers and compiles `kernel`; `code` receives the Cranelift IR, then
    /// the machine code, when asked for (`KILN_DUMP=code`).
    pub(crate) fn new(
        kernel: &Kernel,
        mut code: Option<&mut dyn FnMut(&str)>,
    ) -> Result<CompiledKernel, Error> {
        let matmul = match &kernel.kind {
            KernelKind::MatMul { .. } => Some(MatMul::compile(kernel, &mut code)?),
            _ => None,
        };
        // A depthwise convolution's sum by the machine kernel, on kiln's
        // own paths, and ReLU and a cap where they are all the rest; the
        // generated code computes any other rest of the body.
        let own_paths = crate::cpu_isa()? != kiln_machine::Isa::Generic;
        let (taps, tail) = match own_paths.then(|| taps::plan(kernel)).flatten() {
            Some((plan, tail)) => {
                let epilogue = tail.body.values.len() > 1 || !tail.side.is_empty();
                (Some(Taps { plan, epilogue }), Some(tail))
            }
            None => (None, None),
        };
        let isa = isa()?;
        let mut jit = JITBuilder::with_isa(isa.clone(), default_libcall_names());
        jit.symbol_lookup_fn(Box::new(host_address));
        let mut module = JITModule::new(jit);
        let target = module.target_config();
        let ptr = target.pointer_type();
        let mut ctx = module.make_context();
        ctx.func.signature = lower::signature(ptr, target.default_call_conv);
        // A verifier error names the instruction it rejects, which the
        // error's own text leaves out.
        let codegen = |e: cranelift_module::ModuleError| match e {
            cranelift_module::ModuleError::Compilation(
                cranelift_codegen::CodegenError::Verifier(errors),
            ) => crate::codegen(
                crate::label(kernel),
                format!("generated code failed verification: {errors}"),
            ),
            e => crate::codegen(crate::label(kernel), e.to_string()),
        };
        let mut fbc = FunctionBuilderContext::new();
        let calls = lower::Calls::new(&mut module, row_calls()?);
        if let (Some(code), Some(taps)) = (code.as_mut(), &taps) {
            let plan = &taps.plan;
            code(&format!(
                "// {} taps of input {} by weights of input {}: kiln_machine::taps ({:?}), then this code over their sums",
                plan.taps.len(),
                plan.x,
                plan.w,
                plan.activation
            ));
        }
        let product_apart = matmul
            .as_ref()
            .is_some_and(|m| m.plan.product_at().is_some());
        let range = lower::lower(
            tail.as_ref().unwrap_or(kernel),
            &mut ctx.func,
            &mut fbc,
            ptr,
            calls,
            (target, product_apart),
        );
        if let Some(code) = code.as_mut() {
            code(&ctx.func.display().to_string());
            ctx.set_disasm(true);
        }
        let id = module
            .declare_function("kernel", Linkage::Export, &ctx.func.signature)
            .map_err(codegen)?;
        module.define_function(id, &mut ctx).map_err(codegen)?;
        if let Some(code) = code {
            // The machine code, as Cranelift emitted it.
            let asm = ctx.compiled_code().and_then(|c| c.vcode.as_deref());
            code(asm.unwrap_or_default());
        }
        module.clear_context(&mut ctx);
        module.finalize_definitions().map_err(codegen)?;
        let code = module.get_finalized_function(id);
        // SAFETY: `code` is the finalized entry of a function declared with
        // `lower::signature`, which is `KernelFn`'s ABI; `module` owns the
        // memory and lives as long as `func` (both in `self`).
        let func = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
        Ok(CompiledKernel {
            _module: Mutex::new(module),
            func,
            range,
            kernel: kernel.clone(),
            matmul,
            taps,
        })
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::pass::{Options, optimize};
    use kiln_ir::{BinaryOp, DType, Data, DataRef, Graph, Op, ReduceOp, TensorType, UnaryOp};
    use smallvec::SmallVec;

    use super::*;
    use crate::cpu::jit::Buffer;

    /// The CLIF of `f`'s one kernel, `f` making the output of a graph of
    /// two f32 inputs of shape `dims`.
    fn clif(dims: &[usize], f: impl Fn(&mut Graph, NodeId, NodeId) -> NodeId) -> String {
        let mut g = Graph::new("g");
        let ty = TensorType::new(DType::F32, Shape::new(dims));
        let (x, y) = (g.input(ty.clone()), g.input(ty));
        let out = f(&mut g, x, y);
        g.outputs.push(out);
        let optimized = optimize(&g, Options::default(), &mut |_, _| {}).unwrap();
        let [launch] = &optimized.schedule.launches[..] else {
            panic!("one launch")
        };
        let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
            panic!("the launch is a kernel")
        };
        let mut clif = String::new();
        let mut code = |text: &str| {
            if clif.is_empty() {
                clif = text.to_string();
            }
        };
        CompiledKernel::new(kernel, Some(&mut code)).unwrap();
        clif
    }

    /// How many functions the CLIF of `f`'s one kernel imports, `f` making
    /// the output of a graph of two f32 inputs of 1000 elements.
    fn imports(f: impl Fn(&mut Graph, NodeId, NodeId) -> NodeId) -> usize {
        // An imported function's line: `fn0 = u0:0 sig0`.
        let clif = clif(&[1000], f);
        clif.lines().filter(|l| l.contains(" = u0:")).count()
    }

    /// `op` of `axes` over the first input.
    fn reduce(op: ReduceOp, axes: &[usize]) -> impl Fn(&mut Graph, NodeId, NodeId) -> NodeId {
        let axes = SmallVec::from_slice(axes);
        move |g: &mut Graph, x, _| {
            let reduce = Op::Reduce {
                op,
                axes: axes.clone(),
            };
            g.push(reduce, &[x]).unwrap()
        }
    }

    /// The Cranelift IR of kernels rendered from their loop plans
    /// (`tests/loop_kernels.rs` snapshots the plans): a flat loop in lanes,
    /// a sum down columns four rows a vector, sums of short rows four at a
    /// time. Rows shorter than `lower::row_call`'s calls, so that the text
    /// is the same on every x86-64.
    #[test]
    fn loop_plans_render_as_this_cranelift_ir() {
        let relu_add = |g: &mut Graph, x, y| {
            let s = g.push(Op::Binary(BinaryOp::Add), &[x, y]).unwrap();
            g.push(Op::Unary(UnaryOp::Relu), &[s]).unwrap()
        };
        insta::assert_snapshot!("flat_relu_add", clif(&[37, 11], relu_add));
        insta::assert_snapshot!("columns_sum", clif(&[300, 24], reduce(ReduceOp::Sum, &[0])));
        insta::assert_snapshot!(
            "four_short_rows_max",
            clif(&[64, 10], reduce(ReduceOp::Max, &[1]))
        );
    }

    #[test]
    fn kernels_import_only_the_host_functions_they_call() {
        let relu = |g: &mut Graph, x, y| {
            let s = g.push(Op::Binary(BinaryOp::Add), &[x, y]).unwrap();
            g.push(Op::Unary(UnaryOp::Relu), &[s]).unwrap()
        };
        assert_eq!(imports(relu), 0);
        // Two pows, one function.
        let pows = |g: &mut Graph, x, y| {
            let p = g.push(Op::Binary(BinaryOp::Pow), &[x, y]).unwrap();
            g.push(Op::Binary(BinaryOp::Pow), &[p, y]).unwrap()
        };
        assert_eq!(imports(pows), 1);
        // A long row's sum of exponentials: `kiln_exp_sum`, where called.
        let sum_exp = |g: &mut Graph, x, y| {
            let e = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
            reduce(ReduceOp::Sum, &[0])(g, e, y)
        };
        assert_eq!(imports(sum_exp), usize::from(row_calls().unwrap()));
    }

    /// Every 97th f32 bit pattern of each sign (the whole range, subnormals
    /// included) and the special values.
    fn values() -> Vec<f32> {
        let mut values: Vec<f32> = (0..u32::MAX / 97)
            .map(|k| f32::from_bits(k.wrapping_mul(97)))
            .filter(|v| v.is_finite())
            .collect();
        values.extend([
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
        ]);
        values
    }

    /// `op` of each value, by an elementwise kernel of generated code (no
    /// row function takes a lone `op`).
    fn generated(values: &[f32], op: UnaryOp) -> Vec<f32> {
        let mut g = Graph::new("g");
        let ty = TensorType::new(DType::F32, Shape::new(&[values.len()]));
        let x = g.input(ty);
        let e = g.push(Op::Unary(op), &[x]).unwrap();
        g.outputs.push(e);
        let kernel = crate::cpu::jit::first_kernel(&g);
        let mut out = Data::zeros(DType::F32, values.len()).unwrap();
        let input = Buffer::input(DataRef::F32(values));
        let mut output = Buffer::output(&mut out);
        kernel
            .run(&[&input], &mut output, &mut [], &mut Buffer::empty())
            .unwrap();
        match out {
            Data::F32(v) => v,
            _ => panic!("an f32 output"),
        }
    }

    /// The row function generated code calls for `sum(exp(..))`
    /// (`kiln_machine::rows`) gives the generated exp's bits, on rows of
    /// every tail length, and stays within `Math::exp`'s bound.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_row_exp_is_the_generated_exp_bit_for_bit_within_its_bound() {
        if !rows::available() {
            eprintln!("skipped: this CPU lacks AVX2 or FMA");
            return;
        }
        let values = values();
        let want = generated(&values, UnaryOp::Exp);
        let mut got = values.clone();
        let mut rest = &mut got[..];
        for len in (1..=40).cycle() {
            if rest.is_empty() {
                break;
            }
            let (row, after) = rest.split_at_mut(len.min(rest.len()));
            rows::exp_sum_in_place(row, 0.0).unwrap();
            rest = after;
        }
        let mut worst = (0.0f64, 0.0f32);
        for ((&v, &g), &w) in values.iter().zip(&got).zip(&want) {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "exp({v:e}): {g:e} by the row function, {w:e} generated"
            );
            // `Math::exp`'s bound (tests/cpu_products.rs), against f64.
            let exact = f64::from(v).exp();
            let e32 = exact as f32;
            let err = if e32.is_nan() {
                if g.is_nan() { 0.0 } else { f64::INFINITY }
            } else if e32.is_infinite() || g.is_infinite() {
                if g == e32 { 0.0 } else { f64::INFINITY }
            } else if exact < f64::from(f32::MIN_POSITIVE) {
                (f64::from(g) - exact).abs() / f64::from(f32::MIN_POSITIVE) * 1e-7
            } else {
                (f64::from(g) - exact).abs() / exact
            };
            if err > worst.0 {
                worst = (err, v);
            }
        }
        assert!(worst.0 <= 2e-7, "exp: error {:e} at {:e}", worst.0, worst.1);
    }

    /// Rows that switch the row function to its second test (a lane beyond
    /// the fast path), then hold every kind of value after it: the same
    /// bits as the generated exp of `x - shift`, at every length and for a
    /// shift of 0 and another.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_row_exp_keeps_its_bits_after_a_lane_leaves_the_fast_path() {
        if !rows::available() {
            eprintln!("skipped: this CPU lacks AVX2 or FMA");
            return;
        }
        let kinds = [
            f32::NEG_INFINITY,
            -1e9,
            -104.0,
            -104.000_01,
            -103.98,
            -87.5,
            -20.0,
            0.0,
            1.5,
            88.0,
            f32::INFINITY,
            f32::NAN,
        ];
        for shift in [0.0f32, 3.25] {
            for len in [9, 16, 23, 40, 67] {
                for first in 0..kinds.len() {
                    // A masked lane first, then the kinds in turn.
                    let row: Vec<f32> = (0..len)
                        .map(|j| match j {
                            0 => -1e9,
                            _ => kinds[(first + j) % kinds.len()],
                        })
                        .collect();
                    let shifted: Vec<f32> = row.iter().map(|&x| x - shift).collect();
                    let want = generated(&shifted, UnaryOp::Exp);
                    let mut got = vec![0.0f32; len];
                    rows::exp_sum(&row, shift, Some(&mut got)).unwrap();
                    for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                            "exp({:e} - {shift}) at {j} of {len}: {g:e}, generated {w:e}",
                            row[j]
                        );
                    }
                }
            }
        }
    }

    /// SiLU's row function (`kiln_silu_row`, which generated code calls for
    /// `x * sigmoid(x)` over long rows) gives the generated code's bits: x
    /// times the generated sigmoid, on rows of every tail length.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_row_silu_is_the_generated_silu_bit_for_bit() {
        if !rows::available() {
            eprintln!("skipped: this CPU lacks AVX2 or FMA");
            return;
        }
        let values = values();
        let sigmoids = generated(&values, UnaryOp::Sigmoid);
        let mut got = vec![0.0f32; values.len()];
        let (mut src, mut dst) = (&values[..], &mut got[..]);
        for len in (1..=40).cycle() {
            if src.is_empty() {
                break;
            }
            let len = len.min(src.len());
            let (row, rest) = src.split_at(len);
            let (out, after) = dst.split_at_mut(len);
            rows::silu_into(row, out).unwrap();
            (src, dst) = (rest, after);
        }
        for ((&x, &s), &g) in values.iter().zip(&sigmoids).zip(&got) {
            let w = x * s;
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "silu({x:e}): {g:e} by the row function, {w:e} generated"
            );
        }
    }
}
