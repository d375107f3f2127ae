//! Launching compiled kernels: buffers checked against a kernel's types and
//! tabled for its code, and the code called over row ranges, split across
//! threads when the work is large, several kernels of a row group block of
//! rows by block of rows.

#![allow(unsafe_code)]

use kiln_ir::kernel::{Kernel, KernelKind};
use kiln_ir::{Data, DataRef, TensorType};

use kiln_machine::team;

use super::{CompiledKernel, Computed, PackedOperand};
use crate::{Error, Role};

/// Work below this many elements runs on the calling thread.
pub(super) const PARALLEL_ELEMENTS: usize = 1 << 15;

/// The bytes of the widest row of a row group that one block of rows
/// spans: within L1 beside the rows the kernels write.
const ROW_BLOCK_BYTES: usize = 16 << 10;

impl CompiledKernel {
    /// Checks the buffers against the kernel's types and makes the table of
    /// pointers its code is called with: the inputs, the output, the side
    /// outputs, and a matmul's product where it lies apart (`product`).
    pub(crate) fn bind(
        &self,
        inputs: &[&Buffer],
        out: &mut Buffer,
        side: &mut [Buffer],
        scratch: &mut Buffer,
    ) -> Result<Bound<'_>, Error> {
        let k = &self.kernel;
        let counts = [("input", k.inputs.len(), inputs.len())];
        let counts = counts
            .into_iter()
            .chain([("side output", k.side.len(), side.len())]);
        if let Some((what, wants, got)) = counts.into_iter().find(|c| c.1 != c.2) {
            return Err(crate::launch(
                crate::label(k),
                format!("{what}s: {wants} wanted, {got} given"),
            ));
        }
        let fits = |buffer: Role, buf: &Buffer, needs: usize| match buf.bytes < needs {
            true => Err(Error::Fit {
                kernel: crate::label(k),
                buffer,
                bytes: buf.bytes,
                needs,
            }),
            false => Ok(()),
        };
        let bytes = |ty: &TensorType| ty.shape.numel() * ty.dtype.size();
        for (i, (buf, ty)) in inputs.iter().zip(&k.inputs).enumerate() {
            fits(Role::Input(i), buf, bytes(ty))?;
        }
        fits(Role::Output, out, bytes(&k.out))?;
        for (i, (buf, s)) in side.iter().zip(&k.side).enumerate() {
            fits(Role::Side(i), buf, bytes(&s.ty))?;
        }
        fits(Role::Scratch, scratch, k.scratch_bytes())?;
        let mut table: Vec<*mut u8> = inputs.iter().map(|b| b.ptr).collect();
        table.push(out.ptr);
        table.extend(side.iter().map(|b| b.ptr));
        if let Some(matmul) = self
            .matmul
            .as_ref()
            .filter(|m| m.plan.product_at().is_some())
        {
            table.push(matmul.product(out, scratch).ptr);
        }
        Ok(Bound {
            kernel: self,
            table: Table(table),
        })
    }

    /// Runs the kernel over its whole range: for a matmul, its computed
    /// operands into `scratch` and the GEMM core first, for an attention
    /// or a sum of taps its machine kernel; then the generated
    /// code, split across threads in row ranges when the work is large.
    pub(crate) fn run(
        &self,
        inputs: &[&Buffer],
        out: &mut Buffer,
        side: &mut [Buffer],
        scratch: &mut Buffer,
    ) -> Result<(), Error> {
        let computed = [Computed::Scratch, Computed::Scratch];
        self.run_computed(inputs, out, side, scratch, (&computed, None))
    }

    /// `run`, a matmul's computed operands where `computed` says, its
    /// right operand from `packed` where that was packed from the input
    /// the launch passes.
    pub(crate) fn run_computed(
        &self,
        inputs: &[&Buffer],
        out: &mut Buffer,
        side: &mut [Buffer],
        scratch: &mut Buffer,
        (computed, packed): (&[Computed; 2], Option<&PackedOperand>),
    ) -> Result<(), Error> {
        let bound = self.bind(inputs, out, side, scratch)?;
        match (&self.matmul, &self.taps, &self.kernel.kind) {
            (Some(matmul), _, _) => {
                let product = matmul.product(out, scratch);
                self.run_matmul(
                    matmul,
                    &bound,
                    (inputs, &product, scratch),
                    computed,
                    packed,
                )
            }
            (None, Some(taps), _) => self.run_taps(taps, &bound, inputs, out),
            (None, None, KernelKind::Attention { .. }) => self.run_attention(inputs, out),
            (None, None, _) => run_rows(std::slice::from_ref(&bound)),
        }
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
    pub(super) unsafe fn call(&self, start: usize, end: usize, ahead: i64) {
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
    let rows = first.kernel.range.rows;
    if let Some(b) = group.iter().find(|b| b.kernel.range.rows != rows) {
        return Err(crate::launch(
            crate::label(&b.kernel.kernel),
            format!(
                "its {} rows run row by row with a kernel of {rows}",
                b.kernel.range.rows
            ),
        ));
    }
    let widest = group.iter().map(|b| b.kernel.range.row_len).max();
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
    team::for_each(chunks.len(), &|i| call(&chunks[i]));
    Ok(())
}

/// Splits `rows` of `row_len` elements into contiguous ranges: one when the
/// work is small, else a few per thread, in whole multiples of 16 rows when
/// rows are single elements (so vector loops stay aligned to their tails).
fn row_blocks(rows: usize, row_len: usize) -> Vec<(usize, usize)> {
    let work = rows.saturating_mul(row_len.max(1));
    let threads = team::threads();
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

/// The buffer table handed to generated code: the inputs, the output, the
/// side outputs, and a matmul's product where it lies apart.
struct Table(Vec<*mut u8>);

// SAFETY: the table is read-only while kernels run; the pointers it holds are
// written only by calls that own disjoint row ranges (see `run`).
unsafe impl Sync for Table {}

impl Table {
    fn base(&self) -> *const *mut u8 {
        self.0.as_ptr()
    }
}

/// A buffer for one kernel call: where it is and how many bytes it holds.
/// Made only from live Rust storage, and used only while that is borrowed.
pub(crate) struct Buffer {
    pub(super) ptr: *mut u8,
    pub(super) bytes: usize,
}

impl Buffer {
    /// A buffer the kernel reads. Generated code never writes through it.
    pub(crate) fn input(data: DataRef<'_>) -> Buffer {
        let (ptr, bytes) = match data {
            DataRef::F32(v) => (v.as_ptr() as *mut u8, v.len() * 4),
            DataRef::I32(v) => (v.as_ptr() as *mut u8, v.len() * 4),
            DataRef::I64(v) => (v.as_ptr() as *mut u8, v.len() * 8),
            DataRef::F64(v) => (v.as_ptr() as *mut u8, v.len() * 8),
            DataRef::U8(v) => (v.as_ptr() as *mut u8, v.len()),
            DataRef::Bool(v) => (v.as_ptr() as *mut u8, v.len()),
            DataRef::BF16(v) => (v.as_ptr() as *mut u8, v.len() * 2),
            DataRef::F16(v) => (v.as_ptr() as *mut u8, v.len() * 2),
        };
        Buffer { ptr, bytes }
    }

    /// A buffer the kernel writes: a graph output.
    pub(crate) fn output(data: &mut Data) -> Buffer {
        let (ptr, bytes) = match data {
            Data::F32(v) => (v.as_mut_ptr() as *mut u8, v.len() * 4),
            Data::I32(v) => (v.as_mut_ptr() as *mut u8, v.len() * 4),
            Data::I64(v) => (v.as_mut_ptr() as *mut u8, v.len() * 8),
            Data::F64(v) => (v.as_mut_ptr() as *mut u8, v.len() * 8),
            Data::U8(v) => (v.as_mut_ptr(), v.len()),
            // `bool` is one byte holding 0 or 1, which is all generated code stores.
            Data::Bool(v) => (v.as_mut_ptr() as *mut u8, v.len()),
            Data::BF16(v) => (v.as_mut_ptr() as *mut u8, v.len() * 2),
            Data::F16(v) => (v.as_mut_ptr() as *mut u8, v.len() * 2),
        };
        Buffer { ptr, bytes }
    }

    /// An arena slot, read or written: 8-byte words, aligned for every
    /// element type.
    pub(crate) fn slot(words: &mut [u64]) -> Buffer {
        Buffer {
            ptr: words.as_mut_ptr() as *mut u8,
            bytes: words.len() * 8,
        }
    }

    /// The same memory, for a second use in one run (a donated buffer is
    /// an input of one kernel and the output it writes).
    pub(crate) fn alias(&self) -> Buffer {
        Buffer {
            ptr: self.ptr,
            bytes: self.bytes,
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
    pub(super) fn part(&self, at: usize, bytes: usize) -> Buffer {
        let at = at.min(self.bytes);
        Buffer {
            ptr: self.ptr.wrapping_add(at),
            bytes: bytes.min(self.bytes - at),
        }
    }
}

/// An element type every bit pattern of which is a value: what the bytes
/// of a buffer can be read as.
pub(super) trait Plain: Copy {}

impl Plain for f32 {}

/// bf16 values, as their bits.
impl Plain for u16 {}

/// The values of a machine kernel's buffers (a matmul's, an attention's,
/// a sum of taps'): those it reads (its operands and bias) as `T`, and the
/// product it writes as f32. The product must share
/// no byte with what is read, and every buffer be aligned for its type.
pub(super) fn views<'b, T: Plain, const N: usize>(
    kernel: &Kernel,
    read: &'b [(Role, Buffer); N],
    out: &'b mut Buffer,
) -> Result<([&'b [T]; N], &'b mut [f32]), Error> {
    let unaligned = |b: &Buffer, align: usize| !(b.ptr as usize).is_multiple_of(align);
    let bytes = |b: &Buffer| b.ptr as usize..b.ptr as usize + b.bytes;
    let out_bytes = bytes(out);
    let overlaps = |b: &Buffer| {
        let b = bytes(b);
        !b.is_empty() && !out_bytes.is_empty() && b.start < out_bytes.end && out_bytes.start < b.end
    };
    let problem = std::iter::once((Role::Output, &*out, align_of::<f32>()))
        .chain(read.iter().map(|(role, b)| (*role, b, align_of::<T>())))
        .find_map(|(role, b, align)| {
            match (unaligned(b, align), role != Role::Output && overlaps(b)) {
                (true, _) => Some(format!(
                    "{role} of {} bytes is not aligned for its values",
                    b.bytes
                )),
                (false, true) => Some(format!("{role} overlaps the product it writes")),
                (false, false) => None,
            }
        });
    if let Some(problem) = problem {
        return Err(crate::launch(crate::label(kernel), problem));
    }
    // SAFETY: a buffer is made only from live Rust storage, borrowed while
    // it is used (`Buffer`), of initialized bytes, whose every pattern is
    // some `T` (`Plain`) where aligned (checked); these are only read here,
    // and share no byte with the product (checked).
    let values = read.each_ref().map(|(_, b)| unsafe {
        std::slice::from_raw_parts(b.ptr.cast::<T>().cast_const(), b.bytes / size_of::<T>())
    });
    // SAFETY: as above; the product is written through this slice while the
    // views live (`out` is borrowed mutably), and besides it only by the
    // epilogue's generated code over rows the machine kernel hands back
    // finished and no longer touches (`run_matmul`, `run_taps`): a write
    // (or, for a product apart from the output, a read) through the
    // launch's own pointer to memory this slice covers, which Rust's
    // aliasing rules do not grant; no access of the machine kernel's
    // overlaps it.
    let product = unsafe {
        std::slice::from_raw_parts_mut(out.ptr.cast::<f32>(), out.bytes / size_of::<f32>())
    };
    Ok((values, product))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{DType, Data, Graph, Op, ReduceOp, Shape, TensorType, UnaryOp};
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
        let kernel = crate::cpu::jit::first_kernel(&g);
        let input: Vec<f32> = (0..rows * len).map(|i| (i % 11) as f32 / 4.0).collect();
        let sums = |ahead: i64| {
            let mut out = Data::zeros(DType::F32, rows).unwrap();
            let x = Buffer::input(DataRef::F32(&input));
            let bound = kernel
                .bind(
                    &[&x],
                    &mut Buffer::output(&mut out),
                    &mut [],
                    &mut Buffer::empty(),
                )
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

    /// A buffer too small for a kernel is an error naming the kernel, the
    /// buffer and both sizes, and runs nothing.
    #[test]
    fn a_buffer_too_small_is_named_with_its_kernel_and_sizes() {
        let mut g = Graph::new("g");
        let x = g.input(TensorType::new(DType::F32, Shape::new(&[3, 5])));
        let r = g.push(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
        g.outputs.push(r);
        let kernel = crate::cpu::jit::first_kernel(&g);
        let input = vec![-1.0f32; 15];
        let x = Buffer::input(DataRef::F32(&input));
        let mut short = Data::zeros(DType::F32, 14).unwrap();
        let mut out = Buffer::output(&mut short);
        let err = kernel
            .run(&[&x], &mut out, &mut [], &mut Buffer::empty())
            .expect_err("an output of 14 values for 15");
        assert_eq!(
            err,
            Error::Fit {
                kernel: "elementwise kernel of f32[3,5]".into(),
                buffer: Role::Output,
                bytes: 56,
                needs: 60,
            }
        );
        assert_eq!(
            err.to_string(),
            "elementwise kernel of f32[3,5]: the output holds 56 bytes, 60 needed"
        );
        assert_eq!(
            short,
            Data::zeros(DType::F32, 14).unwrap(),
            "nothing written"
        );
        let err = kernel
            .run(&[], &mut out, &mut [], &mut Buffer::empty())
            .expect_err("no input");
        assert_eq!(
            err.to_string(),
            "elementwise kernel of f32[3,5]: inputs: 1 wanted, 0 given"
        );
    }
}
