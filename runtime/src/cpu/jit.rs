//! The one module of the CPU backend with `unsafe`: it owns the JIT code
//! memory, turns it into function pointers, hands raw buffer pointers to
//! generated code and to the GEMM core, and calls them.
//!
//! Every call is made safe by checks first: buffer lengths against the
//! types the kernel was compiled for, row ranges against the kernel's own
//! range. The generated code reads and writes only through the kernel's
//! index maps, which the verifier has proved stay inside buffers of those
//! types, and writes only the rows it is given.

#![allow(unsafe_code)]

use std::sync::{Mutex, OnceLock};

use cranelift_codegen::ir::{AbiParam, types};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use kiln_ir::kernel::{Kernel, KernelKind, Operand};
use kiln_ir::view::View;
use kiln_ir::{DType, TensorType};
use kiln_ir::{Data, DataRef};
use rayon::prelude::*;

use super::lower::{self, Launch};
use crate::Error;

/// A kernel function: buffer table, first and last-plus-one row, and how
/// many rows ahead it reads a line in advance (see `lower::signature`).
type KernelFn = unsafe extern "C" fn(*const *mut u8, i64, i64, i64);

/// Work below this many elements runs on the calling thread.
const PARALLEL_ELEMENTS: usize = 1 << 15;

/// The bytes of the widest row of a row group that one block of rows
/// spans: within L1 beside the rows the kernels write.
const ROW_BLOCK_BYTES: usize = 16 << 10;

/// `pow` for the generated code, computed as the interpreter defines it.
extern "C" fn kiln_powf(x: f32, y: f32) -> f32 {
    (f64::from(x)).powf(f64::from(y)) as f32
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
    .map_err(|e| Error::Codegen(format!("host ISA: {e}")))
}

/// A kernel compiled to machine code, with what it takes to call it.
pub(crate) struct CompiledKernel {
    /// Owns the code memory `func` points into; never touched again, held
    /// in a mutex only so the kernel can be shared between threads.
    _module: Mutex<JITModule>,
    func: KernelFn,
    launch: Launch,
    kernel: Kernel,
    /// For a matmul, each computed operand's block as an elementwise kernel
    /// that writes the operand into scratch memory.
    operands: [Option<Box<CompiledKernel>>; 2],
}

impl CompiledKernel {
    /// Lowers and compiles `kernel`; `code` receives the Cranelift IR, then
    /// the machine code, when asked for (`KILN_DUMP=code`).
    pub(crate) fn new(
        kernel: &Kernel,
        mut code: Option<&mut dyn FnMut(&str)>,
    ) -> Result<CompiledKernel, Error> {
        let mut operands = [None, None];
        if let KernelKind::MatMul { a, b } = &kernel.kind {
            for (slot, side) in operands.iter_mut().zip([a, b]) {
                if let Operand::Computed { shape, block } = side {
                    let prologue = Kernel {
                        inputs: kernel.inputs.clone(),
                        out: TensorType::new(DType::F32, shape.clone()),
                        kind: KernelKind::Elementwise,
                        body: block.clone(),
                    };
                    let code = code.as_mut().map(|c| &mut **c as &mut dyn FnMut(&str));
                    *slot = Some(Box::new(CompiledKernel::new(&prologue, code)?));
                }
            }
        }
        let isa = isa()?;
        let mut jit = JITBuilder::with_isa(isa.clone(), default_libcall_names());
        jit.symbol("kiln_powf", kiln_powf as *const u8);
        let mut module = JITModule::new(jit);
        let target = module.target_config();
        let ptr = target.pointer_type();
        let mut ctx = module.make_context();
        ctx.func.signature = lower::signature(ptr, target.default_call_conv);
        let mut pow_sig = module.make_signature();
        pow_sig
            .params
            .extend([AbiParam::new(types::F32), AbiParam::new(types::F32)]);
        pow_sig.returns.push(AbiParam::new(types::F32));
        let codegen = |e: cranelift_module::ModuleError| Error::Codegen(e.to_string());
        let pow_id = module
            .declare_function("kiln_powf", Linkage::Import, &pow_sig)
            .map_err(codegen)?;
        let powf = module.declare_func_in_func(pow_id, &mut ctx.func);
        let mut fbc = FunctionBuilderContext::new();
        let launch = lower::lower(kernel, &mut ctx.func, &mut fbc, ptr, powf, target);
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
            launch,
            kernel: kernel.clone(),
            operands,
        })
    }

    /// Checks the buffers against the kernel's types and makes the table of
    /// pointers its code is called with.
    pub(crate) fn bind(
        &self,
        inputs: &[&Buffer],
        out: &mut Buffer,
        scratch: &mut Buffer,
    ) -> Result<Bound<'_>, Error> {
        let k = &self.kernel;
        if inputs.len() != k.inputs.len() {
            return Err(Error::Launch(format!(
                "kernel takes {} buffers, got {}",
                k.inputs.len(),
                inputs.len()
            )));
        }
        for (i, (buf, ty)) in inputs.iter().zip(&k.inputs).enumerate() {
            if buf.bytes < ty.shape.numel() * ty.dtype.size() {
                return Err(Error::Launch(format!(
                    "buffer {i} has {} bytes, {ty} needs more",
                    buf.bytes
                )));
            }
        }
        if out.bytes < k.out.shape.numel() * k.out.dtype.size() {
            return Err(Error::Launch(format!(
                "the output has {} bytes, {} needs more",
                out.bytes, k.out
            )));
        }
        if scratch.bytes < k.scratch_bytes() {
            return Err(Error::Launch(format!(
                "the scratch buffer has {} bytes, the kernel needs {}",
                scratch.bytes,
                k.scratch_bytes()
            )));
        }
        let mut table: Vec<*mut u8> = inputs.iter().map(|b| b.ptr).collect();
        table.push(out.ptr);
        Ok(Bound {
            kernel: self,
            table: Table(table),
        })
    }

    /// Runs the kernel over its whole range: for a matmul, its computed
    /// operands into `scratch` and the GEMM core first; then the generated
    /// code, split across threads in row ranges when the work is large.
    pub(crate) fn run(
        &self,
        inputs: &[&Buffer],
        out: &mut Buffer,
        scratch: &mut Buffer,
    ) -> Result<(), Error> {
        let bound = self.bind(inputs, out, scratch)?;
        let (k, table) = (&self.kernel, &bound.table);
        match &k.kind {
            KernelKind::MatMul { a, b } => {
                // Computed operands lie one after the other in scratch.
                let mut parts = Vec::with_capacity(2);
                let mut at = 0;
                for (side, prologue) in [a, b].into_iter().zip(&self.operands) {
                    parts.push(match (side, prologue) {
                        (Operand::Read { input, view }, _) => {
                            Strided::new(view, inputs[*input as usize])
                        }
                        (Operand::Computed { shape, .. }, Some(prologue)) => {
                            let bytes = shape.numel() * DType::F32.size();
                            let mut part = scratch.part(at, bytes);
                            at += bytes;
                            prologue.run(inputs, &mut part, &mut Buffer::empty())?;
                            Strided::new(&View::contiguous(shape), &part)
                        }
                        (Operand::Computed { .. }, None) => {
                            return Err(Error::Launch(
                                "a computed operand was not compiled".to_string(),
                            ));
                        }
                    });
                }
                let (b, a) = (parts.pop(), parts.pop());
                let (Some(a), Some(b)) = (a, b) else {
                    return Err(Error::Launch("a matmul has two operands".to_string()));
                };
                // Only an epilogue that does more than copy the product needs a
                // pass: over each block of rows as the GEMM core finishes it,
                // or over the whole product after.
                let epilogue = k.body.values.len() > 1;
                let (batches, m, n) = (a.batches(), a.rows, b.cols);
                if a.cols != b.rows || batches * m * n > out.bytes / 4 {
                    return Err(Error::Launch(format!(
                        "a product of {batches} x [{m}, {}] @ [{}, {n}] does not fit {} output bytes",
                        a.cols, b.rows, out.bytes
                    )));
                }
                // The GEMM core splits its own work across threads (it packs the
                // operands once for all of them); the epilogue then sweeps the
                // output in row ranges.
                let work = batches * m * n * a.cols.max(1);
                let threads = if work < PARALLEL_ELEMENTS * 64 {
                    1
                } else {
                    rayon::current_num_threads()
                };
                let mut pending = epilogue;
                for batch in 0..batches {
                    let rows = |r0: usize, r1: usize| {
                        if epilogue {
                            // SAFETY: the product's rows `r0..r1` of this batch
                            // are rows of the epilogue's launch, finished and
                            // touched by no other thread meanwhile.
                            unsafe { bound.call(batch * m + r0, batch * m + r1, 0) }
                        }
                    };
                    // SAFETY: `a` and `b` read inside buffers whose lengths were
                    // checked against views the verifier bounded; the output holds
                    // every row of every batch (checked above).
                    pending &= !unsafe { gemm_block(&a, &b, table.out(), batch, threads, &rows) };
                }
                if pending {
                    run_rows(std::slice::from_ref(&bound))?;
                }
            }
            KernelKind::Elementwise | KernelKind::Reduce { .. } => {
                run_rows(std::slice::from_ref(&bound))?
            }
        }
        Ok(())
    }
}

/// A kernel with the buffers of one launch checked and tabled.
pub(crate) struct Bound<'k> {
    kernel: &'k CompiledKernel,
    table: Table,
}

impl Bound<'_> {
    /// Runs the code over rows `start..end`, reading `ahead` rows on (any
    /// count: the code clamps the row it reads into the kernel's rows).
    ///
    /// # Safety
    /// `start..end` lies inside `0..rows` of the kernel's launch, and no
    /// other thread touches those rows of the output meanwhile.
    unsafe fn call(&self, start: usize, end: usize, ahead: i64) {
        // SAFETY: `bind` checked that the buffers hold what the kernel's
        // types need, and the caller keeps the rows inside them.
        unsafe { (self.kernel.func)(self.table.base(), start as i64, end as i64, ahead) }
    }
}

/// Runs the generated code of kernels over the same rows, split across
/// threads in row ranges when the work is large. Several kernels go block
/// of rows by block of rows: each kernel over a block, then the next kernel
/// over it, so that the later kernels find the rows the earlier ones read
/// still in cache. The caller has established that each kernel reads what
/// the ones before it wrote only at its own rows (`Executable`'s row groups).
pub(crate) fn run_rows(group: &[Bound<'_>]) -> Result<(), Error> {
    let Some(first) = group.first() else {
        return Ok(());
    };
    let rows = first.kernel.launch.rows;
    if let Some(b) = group.iter().find(|b| b.kernel.launch.rows != rows) {
        return Err(Error::Launch(format!(
            "kernels over {rows} and {} rows cannot run row by row together",
            b.kernel.launch.rows
        )));
    }
    let widest = group.iter().map(|b| b.kernel.launch.row_len).max();
    let row_len = widest.unwrap_or(1);
    let block = match group {
        [_] => rows.max(1),
        _ => (ROW_BLOCK_BYTES / (4 * row_len)).max(1),
    };
    // The last kernel over a block reads ahead into the next block, which
    // the first kernel then finds in cache.
    let ahead = if group.len() > 1 { block as i64 } else { 0 };
    let call = |&(lo, hi): &(usize, usize)| {
        for start in (lo..hi).step_by(block) {
            let end = (start + block).min(hi);
            for (i, b) in group.iter().enumerate() {
                let ahead = if i + 1 == group.len() { ahead } else { 0 };
                // SAFETY: `start..end` lies inside `0..rows`, the range of
                // every kernel of the group, and a call writes only its own
                // rows, which no other thread is given.
                unsafe { b.call(start, end, ahead) }
            }
        }
    };
    let chunks = row_blocks(rows, row_len * group.len());
    if chunks.len() == 1 {
        chunks.iter().for_each(call);
    } else {
        chunks.par_iter().with_max_len(1).for_each(call);
    }
    Ok(())
}

/// Splits `rows` of `row_len` elements into contiguous ranges: one when the
/// work is small, else a few per thread, in whole multiples of 16 rows when
/// rows are single elements (so vector loops stay aligned to their tails).
fn row_blocks(rows: usize, row_len: usize) -> Vec<(usize, usize)> {
    let work = rows.saturating_mul(row_len.max(1));
    let threads = rayon::current_num_threads();
    if work < PARALLEL_ELEMENTS || threads == 1 || rows < 2 {
        return vec![(0, rows)];
    }
    let pieces = (threads * 2).min(rows);
    let align = if row_len == 1 { 16 } else { 1 };
    let step = rows.div_ceil(pieces).div_ceil(align) * align;
    (0..rows)
        .step_by(step)
        .map(|lo| (lo, (lo + step).min(rows)))
        .collect()
}

/// The buffer table handed to generated code.
struct Table(Vec<*mut u8>);

// SAFETY: the table is read-only while kernels run; the pointers it holds are
// written only by calls that own disjoint row ranges (see `run`).
unsafe impl Sync for Table {}

impl Table {
    fn base(&self) -> *const *mut u8 {
        self.0.as_ptr()
    }

    /// The output buffer, last in the table.
    fn out(&self) -> *mut u8 {
        self.0[self.0.len() - 1]
    }
}

/// A buffer for one kernel call: where it is and how many bytes it holds.
/// Made only from live Rust storage, and used only while that is borrowed.
pub(crate) struct Buffer {
    ptr: *mut u8,
    bytes: usize,
}

impl Buffer {
    /// A buffer the kernel reads. Generated code never writes through it.
    pub(crate) fn input(data: DataRef<'_>) -> Buffer {
        let (ptr, bytes) = match data {
            DataRef::F32(v) => (v.as_ptr() as *mut u8, v.len() * 4),
            DataRef::I32(v) => (v.as_ptr() as *mut u8, v.len() * 4),
            DataRef::U8(v) => (v.as_ptr() as *mut u8, v.len()),
            DataRef::Bool(v) => (v.as_ptr() as *mut u8, v.len()),
        };
        Buffer { ptr, bytes }
    }

    /// A buffer the kernel writes: a graph output.
    pub(crate) fn output(data: &mut Data) -> Buffer {
        let (ptr, bytes) = match data {
            Data::F32(v) => (v.as_mut_ptr() as *mut u8, v.len() * 4),
            Data::I32(v) => (v.as_mut_ptr() as *mut u8, v.len() * 4),
            Data::U8(v) => (v.as_mut_ptr(), v.len()),
            // `bool` is one byte holding 0 or 1, which is all generated code stores.
            Data::Bool(v) => (v.as_mut_ptr() as *mut u8, v.len()),
        };
        Buffer { ptr, bytes }
    }

    /// An arena slot, read or written.
    pub(crate) fn slot(words: &mut [u32]) -> Buffer {
        Buffer {
            ptr: words.as_mut_ptr() as *mut u8,
            bytes: words.len() * 4,
        }
    }

    /// No memory: the scratch of a kernel that needs none.
    pub(crate) fn empty() -> Buffer {
        Buffer {
            ptr: std::ptr::NonNull::<u32>::dangling().as_ptr() as *mut u8,
            bytes: 0,
        }
    }

    /// `bytes` bytes from byte `at`, clamped to this buffer: callers check
    /// the length of what they get.
    fn part(&self, at: usize, bytes: usize) -> Buffer {
        let at = at.min(self.bytes);
        Buffer {
            ptr: self.ptr.wrapping_add(at),
            bytes: bytes.min(self.bytes - at),
        }
    }
}

/// A matmul operand as the GEMM core takes it: element strides in place of
/// a view.
struct Strided {
    ptr: *const f32,
    offset: isize,
    batch: Vec<(usize, isize)>,
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
}

// SAFETY: an operand is only read, and only while the buffers of the launch
// that made it are borrowed by `run`.
unsafe impl Sync for Strided {}

impl Strided {
    fn new(view: &View, buf: &Buffer) -> Strided {
        let dims = view.shape.dims();
        let r = dims.len();
        Strided {
            ptr: buf.ptr as *const f32,
            offset: view.offset,
            batch: dims[..r - 2]
                .iter()
                .zip(&view.strides)
                .map(|(&d, &s)| (d, s as isize))
                .collect(),
            rows: dims[r - 2],
            cols: dims[r - 1],
            row_stride: view.strides[r - 2] as isize,
            col_stride: view.strides[r - 1] as isize,
        }
    }

    fn batches(&self) -> usize {
        self.batch.iter().map(|b| b.0).product()
    }

    /// The element offset of batch `index`.
    fn batch_offset(&self, mut index: usize) -> isize {
        let mut offset = self.offset;
        for &(dim, stride) in self.batch.iter().rev() {
            offset += (index % dim) as isize * stride;
            index /= dim;
        }
        offset
    }
}

/// Products of at least this many multiply-adds run on kiln's AVX-512
/// kernels where the machine has them. Paired runs on two threads against
/// the `gemm` crate's 256-bit kernels: 2048^3 143-172 against 253-312 ms,
/// 256^3 0.42-0.47 against 0.54-0.60 ms, 64x784x256 0.44-0.46 against
/// 0.50-0.53 ms. Below, packing into panels costs more than the wider FMAs
/// save: 128^3 82-85 against 69-76 us, 64^3 14-20 against 9-15 us.
#[cfg(target_arch = "x86_64")]
const AVX512_GEMM_WORK: usize = 1 << 23;

/// `out[batch] = a[batch] @ b[batch]`, on `threads` threads: by
/// kiln's AVX-512 kernels for large products where the machine has AVX-512,
/// which call `finish(r0, r1)` on each block of rows as it is done (the
/// result is then true), else by the `gemm` crate's runtime-dispatched
/// microkernels.
///
/// # Safety
/// `a` and `b` must read inside live buffers for every row and batch, and
/// `out` must hold `batches * a.rows * b.cols` f32 that no one else writes in
/// those rows.
unsafe fn gemm_block(
    a: &Strided,
    b: &Strided,
    out: *mut u8,
    batch: usize,
    threads: usize,
    finish: &(dyn Fn(usize, usize) + Sync),
) -> bool {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if m == 0 || n == 0 {
        return false;
    }
    let out = out as *mut f32;
    // An operand with no elements (k == 0) may have any offset, even one
    // before its buffer (a padded empty view): its address is formed without
    // the in-bounds promise of `offset`, and the GEMM reads nothing through it.
    let lhs = a.ptr.wrapping_offset(a.batch_offset(batch));
    let rhs = b.ptr.wrapping_offset(b.batch_offset(batch));
    // SAFETY: the caller guarantees that the output rows and, when k > 0,
    // every operand element the GEMM reads lie inside their buffers.
    unsafe {
        let dst = out.add(batch * m * n);
        #[cfg(target_arch = "x86_64")]
        if m * n * k >= AVX512_GEMM_WORK && super::sgemm::available() {
            let operand = |ptr, s: &Strided| super::sgemm::Operand {
                ptr,
                rows: s.row_stride,
                cols: s.col_stride,
            };
            let c = std::slice::from_raw_parts_mut(dst, m * n);
            let (lhs, rhs) = (operand(lhs, a), operand(rhs, b));
            super::sgemm::sgemm(m, n, k, lhs, rhs, c, threads, finish);
            return true;
        }
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            false,
            lhs,
            a.col_stride,
            a.row_stride,
            rhs,
            b.col_stride,
            b.row_stride,
            0.0,
            1.0,
            false,
            false,
            false,
            if threads > 1 {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            },
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = finish;
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::pass::{Options, optimize};
    use kiln_ir::{Data, Graph, Op, ReduceOp, Shape, UnaryOp};
    use smallvec::smallvec;

    #[test]
    fn reading_ahead_stays_inside_the_rows_whatever_the_count() {
        // A sum of exponentials over rows long enough for the vector loop,
        // whose reads ahead would land far outside `x` unclamped.
        let (rows, len) = (7, 50);
        let mut g = Graph::new("g");
        let x = g.input(TensorType::new(DType::F32, Shape::new(&[rows, len])));
        let e = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
        let reduce = Op::Reduce {
            op: ReduceOp::Sum,
            axes: smallvec![1],
        };
        let s = g.push(reduce, &[e]).unwrap();
        g.outputs.push(s);
        let optimized = optimize(&g, Options::default(), &mut |_, _| {}).unwrap();
        let launch = &optimized.schedule.launches[0];
        let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
            panic!("the launch is a kernel")
        };
        let kernel = CompiledKernel::new(kernel, None).unwrap();
        let input: Vec<f32> = (0..rows * len).map(|i| (i % 11) as f32 / 4.0).collect();
        let sums = |ahead: i64| {
            let mut out = Data::zeros(DType::F32, rows);
            let x = Buffer::input(DataRef::F32(&input));
            let bound = kernel
                .bind(&[&x], &mut Buffer::output(&mut out), &mut Buffer::empty())
                .unwrap();
            // SAFETY: the rows are the kernel's own, on this thread alone.
            unsafe { bound.call(0, rows, ahead) };
            out
        };
        let want = sums(0);
        for ahead in [
            1,
            3,
            rows as i64,
            1 << 40,
            i64::MAX,
            -1,
            -(1 << 40),
            i64::MIN,
        ] {
            assert_eq!(sums(ahead), want, "ahead {ahead}");
        }
    }
}
