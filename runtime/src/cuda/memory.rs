//! Device memory: the caching allocator (freed buffers go back to their
//! GPU's pool by size, and are reused in the order of its one compute
//! stream), the buffers it hands out, values that live on the device
//! (`Resident`), the feed that copies batches in through pinned memory on
//! a copy stream while the runs before them compute, a device-to-device
//! copy for measuring bandwidth, and the bytes of host data as the device
//! holds them.

#![allow(unsafe_code)]

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaViewMut, DevicePtr, PinnedHostSlice};
use kiln_ir::{Data, DataRef, OutOfMemory, TensorType};

use super::context::{Gpu, driver};
use crate::{Error, Role, Storage};

impl Gpu {
    /// Two device buffers of `bytes` and a copy between them: the device's
    /// copy bandwidth, the yardstick of memory-bound kernels.
    pub fn copier(self: &Arc<Gpu>, bytes: usize) -> Result<Copier, Error> {
        Ok(Copier {
            from: self.alloc(bytes)?,
            to: self.alloc(bytes)?,
        })
    }

    /// `bytes` of device memory, from the pool when a buffer of that size
    /// was freed; contents undefined (every buffer is written before read).
    /// Where the device has no more, the pool's buffers are freed and the
    /// allocation tried once again; failing that, the `Err` is
    /// `kiln_ir::Error::OutOfMemory` for the bytes asked, named by `op`
    /// and `what`.
    pub(super) fn alloc_for(
        self: &Arc<Gpu>,
        bytes: usize,
        op: &str,
        what: impl std::fmt::Display,
    ) -> Result<Buffer, Error> {
        let size = bytes
            .max(1)
            .checked_next_power_of_two()
            .ok_or_else(|| self.out_of_memory(bytes, op, &what))?
            .max(256);
        let reused = self
            .pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&size)
            .and_then(Vec::pop);
        let slice = match reused {
            Some(s) => s,
            None => match self.stream.alloc_zeros::<u8>(size) {
                Ok(s) => s,
                Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                    self.trim()?;
                    self.stream.alloc_zeros::<u8>(size).map_err(|e| {
                        match e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                            true => self.out_of_memory(bytes, op, &what),
                            false => driver("allocating device memory", e),
                        }
                    })?
                }
                Err(e) => return Err(driver("allocating device memory", e)),
            },
        };
        self.counters.handed_out(slice.len());
        Ok(Buffer {
            slice: Some(slice),
            bytes,
            gpu: self.clone(),
        })
    }

    /// `alloc_for` a buffer of the runtime's own.
    pub(super) fn alloc(self: &Arc<Gpu>, bytes: usize) -> Result<Buffer, Error> {
        self.alloc_for(bytes, "cuda", "a device buffer")
    }

    fn out_of_memory(&self, bytes: usize, op: &str, what: &dyn std::fmt::Display) -> Error {
        let what = format_args!("{what} on GPU {}", self.ordinal);
        OutOfMemory { bytes }.in_op(op, what).into()
    }

    /// Frees every buffer the pool keeps: the frees are queued on the
    /// stream, after the work that may still use the buffers, and the
    /// driver has the memory back once the stream has run them.
    fn trim(&self) -> Result<(), Error> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.wait("freeing the memory pool")
    }

    /// A device buffer holding `data`, copied in on the compute stream.
    pub(super) fn upload(self: &Arc<Gpu>, data: DataRef<'_>, op: &str) -> Result<Buffer, Error> {
        let bytes = host_bytes(data);
        let what = format_args!("{} values of {}", data.len(), data.dtype());
        let mut buffer = self.alloc_for(bytes.len(), op, what)?;
        buffer.write(&bytes)?;
        Ok(buffer)
    }
}

/// Device memory that goes back to its device's pool when dropped.
pub(super) struct Buffer {
    pub(super) slice: Option<CudaSlice<u8>>,
    /// The bytes asked for (the slice may be larger).
    pub(super) bytes: usize,
    gpu: Arc<Gpu>,
}

impl Buffer {
    pub(super) fn slice(&self) -> Result<&CudaSlice<u8>, Error> {
        self.slice
            .as_ref()
            .ok_or_else(|| crate::cuda("device memory", "a freed device buffer"))
    }

    /// The raw device address of byte `at`, for a kernel argument.
    pub(super) fn address(&self, at: usize) -> Result<u64, Error> {
        let slice = self.slice()?;
        if at > self.bytes {
            return Err(Error::Fit {
                kernel: "a kernel argument".into(),
                buffer: Role::Device,
                bytes: self.bytes,
                needs: at,
            });
        }
        let (ptr, _sync) = slice.device_ptr(&self.gpu.stream);
        Ok(ptr + at as u64)
    }
}

impl Buffer {
    /// Its first `bytes` bytes, to write.
    pub(super) fn first_mut(&mut self, bytes: usize) -> Result<CudaViewMut<'_, u8>, Error> {
        let slice = (self.slice.as_mut())
            .ok_or_else(|| crate::cuda("device memory", "a freed device buffer"))?;
        Ok(slice.slice_mut(..bytes))
    }

    /// Copies `bytes` (at most the buffer's) to its start, on the compute
    /// stream. The copy is from pageable memory: the driver stages it
    /// before this returns, so `bytes` may go at once.
    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        if bytes.is_empty() {
            return Ok(());
        }
        let gpu = self.gpu.clone();
        let mut dst = self.first_mut(bytes.len())?;
        gpu.stream
            .memcpy_htod(bytes, &mut dst)
            .map_err(|e| driver("copying an input to the device", e))?;
        gpu.counters.copied_to_device(bytes.len());
        Ok(())
    }

    /// Its first `bytes` bytes copied to the host, after the work on the
    /// compute stream that writes them (a copy into pageable memory ends
    /// before it returns). The caller waits for the stream before it uses
    /// them: the wait says whether that work failed.
    pub(super) fn read(&self, bytes: usize, what: &str) -> Result<Vec<u8>, Error> {
        let mut host =
            kiln_ir::try_vec(bytes, 0u8).map_err(|e| Error::from(e.in_op(what, "a host copy")))?;
        if bytes > 0 {
            let src = self.slice()?.slice(..bytes);
            self.gpu
                .stream
                .memcpy_dtoh(&src, &mut host)
                .map_err(|e| driver("copying a value to the host", e))?;
        }
        self.gpu.counters.copied_to_host(bytes);
        Ok(host)
    }

    /// Copies the first `bytes` bytes of `from` over its own, on `stream`
    /// (the compute stream, or the capture stream).
    pub(super) fn copy_from(
        &self,
        from: &Buffer,
        bytes: usize,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        if bytes > self.bytes || bytes > from.bytes {
            return Err(Error::Fit {
                kernel: "a copy on the device".into(),
                buffer: Role::Device,
                bytes: self.bytes.min(from.bytes),
                needs: bytes,
            });
        }
        if bytes == 0 {
            return Ok(());
        }
        let (dst, src) = (self.address(0)?, from.address(0)?);
        // SAFETY: both ranges lie in their buffers (checked above), which
        // are device memory of this context, used in the compute stream's
        // order (a captured copy runs there too).
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
            .map_err(|e| driver("copying on the device", e))
    }
}

impl Drop for Buffer {
    /// Back to the pool: the next allocation reuses it after the work
    /// already enqueued on the compute stream, which is all the work that
    /// may read or write it.
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            self.gpu.counters.given_back(slice.len());
            let mut pool = self.gpu.pool.lock().unwrap_or_else(|e| e.into_inner());
            pool.entry(slice.len()).or_default().push(slice);
        }
    }
}

/// A value that lives in a GPU's memory: a realized tensor on the device,
/// or a compiled step's state. Reading it copies it out after the work
/// that computes it.
pub struct Resident {
    pub(super) buffer: Buffer,
    ty: TensorType,
}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Resident({} on GPU {})",
            self.ty, self.buffer.gpu.ordinal
        )
    }
}

impl Resident {
    /// Device memory for a value of `ty`, to be written by a run.
    pub(super) fn alloc(gpu: &Arc<Gpu>, op: &str, ty: &TensorType) -> Result<Resident, Error> {
        let buffer = gpu.alloc_for(ty.shape.numel() * ty.dtype.size(), op, ty)?;
        Ok(Resident {
            buffer,
            ty: ty.clone(),
        })
    }

    /// `data`, of type `ty`, copied in; running out of memory is `op`'s
    /// `Err`.
    pub(super) fn upload(
        gpu: &Arc<Gpu>,
        data: DataRef<'_>,
        ty: &TensorType,
        op: &str,
    ) -> Result<Resident, Error> {
        let buffer = gpu.upload(data, op)?;
        Ok(Resident {
            buffer,
            ty: ty.clone(),
        })
    }

    /// A copy on the same device, enqueued; running out of memory is
    /// `op`'s `Err`.
    pub(super) fn duplicate(&self, op: &str) -> Result<Resident, Error> {
        let copy = Resident::alloc(&self.buffer.gpu, op, &self.ty)?;
        let stream = &self.buffer.gpu.stream;
        copy.buffer
            .copy_from(&self.buffer, self.buffer.bytes, stream)?;
        Ok(copy)
    }

    /// Its type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The ordinal of the GPU that holds it.
    pub fn ordinal(&self) -> usize {
        self.buffer.gpu.ordinal
    }

    /// The value copied to the host, after the work that computes it; a
    /// failure of that work is the `Err`.
    pub fn read(&self) -> Result<Data, Error> {
        let what = "reading a value";
        let bytes = self.buffer.read(self.buffer.bytes, what)?;
        self.buffer.gpu.wait(what)?;
        let mut data = Data::zeros(self.ty.dtype, self.ty.shape.numel())
            .map_err(|e| e.in_op(what, &self.ty))?;
        fill(&mut data, &bytes);
        Ok(data)
    }
}

/// A device-to-device copy, for measuring bandwidth.
pub struct Copier {
    from: Buffer,
    to: Buffer,
}

impl Copier {
    /// Copies the buffer once, waits for it, and returns the device's time
    /// for the copy in seconds.
    pub fn run(&mut self) -> Result<f64, Error> {
        let gpu = self.from.gpu.clone();
        let bytes = self.from.bytes;
        let src = self.from.slice()?.slice(..bytes);
        let mut dst = self.to.first_mut(bytes)?;
        gpu.timed(|| {
            gpu.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(|e| driver("copying on the device", e))
        })
    }
}

/// A feed of batches into a GPU's memory (`crate::Feed`): each batch is
/// copied into pinned host memory, then on a copy stream into device
/// memory, while the work already enqueued on the compute stream runs; the
/// compute stream waits for the copy where the batch is taken.
///
/// Two sets of buffers take turns: a `put` fills the set of the batch
/// before last, after the work enqueued so far (which includes every run
/// that read that batch), and where someone still holds one of that
/// batch's values, into new memory instead of over it.
pub struct Feeder {
    gpu: Arc<Gpu>,
    copy: Arc<CudaStream>,
    sets: [FeedSet; 2],
    /// The set the next `put` fills.
    next: usize,
    /// Whether a `put` waits for its `take`.
    waiting: bool,
}

/// One batch's buffers: pinned host memory and device values, per value.
#[derive(Default)]
struct FeedSet {
    pinned: Vec<Pinned>,
    values: Vec<Arc<Resident>>,
    /// Recorded on the copy stream after the set's last copy.
    copied: Option<CudaEvent>,
}

impl Drop for Feeder {
    fn drop(&mut self) {
        // Pinned memory goes back to its pool for the next feed, and device
        // buffers to theirs in the compute stream's order only: a copy
        // still reading the one or writing the other must end first. A
        // failure leaves nothing better to do than to give them back.
        let _ = self.copy.synchronize();
    }
}

/// Pinned host memory that goes back to its GPU's pool when dropped, for
/// the next feed: pinning memory costs a millisecond where a feed's batch
/// takes microseconds (`benches/RESULTS-cuda.md`), and every epoch of a
/// loader opens a feed.
struct Pinned {
    slice: Option<PinnedHostSlice<u8>>,
    gpu: Arc<Gpu>,
}

impl Pinned {
    /// At least `bytes` of pinned memory, from the pool where it has some.
    fn new(gpu: &Arc<Gpu>, bytes: usize) -> Result<Pinned, Error> {
        let size = bytes.max(1).next_power_of_two();
        let pooled = (gpu.pinned.lock().unwrap_or_else(|e| e.into_inner()))
            .get_mut(&size)
            .and_then(Vec::pop);
        let slice = match pooled {
            Some(slice) => slice,
            // SAFETY: the memory is written before any copy reads it
            // (`Feeder::copy`). Flags 0: cached host memory, fast for the
            // CPU to write.
            None => unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(size, 0) }
                .map_err(|e| driver("allocating pinned memory", e))?,
        };
        Ok(Pinned {
            slice: Some(slice),
            gpu: gpu.clone(),
        })
    }

    fn len(&self) -> usize {
        self.slice.as_ref().map_or(0, PinnedHostSlice::len)
    }

    /// Its first `bytes` bytes, to write.
    fn first_mut(&mut self, bytes: usize) -> Result<&mut [u8], Error> {
        let slice = (self.slice.as_mut())
            .ok_or_else(|| crate::cuda("device memory", "a freed pinned buffer"))?
            .as_mut_slice()
            .map_err(|e| driver("writing pinned memory", e))?;
        let len = slice.len();
        (slice.get_mut(..bytes)).ok_or_else(|| Error::Fit {
            kernel: "a batch's copy".into(),
            buffer: Role::Host,
            bytes: len,
            needs: bytes,
        })
    }
}

/// Pinned buffers of one size the pool keeps: two feeds' worth for one
/// value (a feed holds two batches). Pinned memory is the host's, locked
/// in place: more is freed.
const PINNED_KEPT: usize = 4;

impl Drop for Pinned {
    /// Back to the pool, or freed where it has enough of its size: its
    /// owner has waited for the copies that read it.
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            let mut pool = self.gpu.pinned.lock().unwrap_or_else(|e| e.into_inner());
            let kept = pool.entry(slice.len()).or_default();
            if kept.len() < PINNED_KEPT {
                kept.push(slice);
            }
        }
    }
}

impl Feeder {
    /// A feed into `gpu`'s memory, with a copy stream of its own.
    pub(super) fn new(gpu: Arc<Gpu>) -> Result<Feeder, Error> {
        gpu.bind()?;
        let copy = (gpu.ctx.new_stream()).map_err(|e| driver("creating a copy stream", e))?;
        Ok(Feeder {
            gpu,
            copy,
            sets: Default::default(),
            next: 0,
            waiting: false,
        })
    }
}

impl Feeder {
    /// Copies `values` into `set`'s values through its pinned memory, on
    /// the copy stream (ordered after the runs before by the caller).
    fn copy(
        gpu: &Arc<Gpu>,
        copy: &Arc<CudaStream>,
        set: &mut FeedSet,
        values: &[DataRef<'_>],
    ) -> Result<(), Error> {
        for (k, data) in values.iter().enumerate() {
            let bytes = host_bytes(*data);
            if set.pinned.get(k).is_none_or(|p| p.len() < bytes.len()) {
                let host = Pinned::new(gpu, bytes.len())?;
                match set.pinned.get_mut(k) {
                    Some(p) => *p = host,
                    None => set.pinned.push(host),
                }
            }
            if bytes.is_empty() {
                continue;
            }
            let host = set.pinned[k].first_mut(bytes.len())?;
            host.copy_from_slice(&bytes);
            let value = (Arc::get_mut(&mut set.values[k]))
                .ok_or_else(|| crate::launch("device memory", "a fed value held elsewhere"))?;
            let mut dst = value.buffer.first_mut(bytes.len())?;
            copy.memcpy_htod(&*host, &mut dst)
                .map_err(|e| driver("copying a batch to the device", e))?;
            gpu.counters.copied_to_device(bytes.len());
        }
        Ok(())
    }
}

impl crate::Feed for Feeder {
    fn put(&mut self, types: &[TensorType], values: &[DataRef<'_>]) -> Result<(), Error> {
        crate::storage::check_put(self.waiting, types, values)?;
        self.gpu.bind()?;
        let (gpu, copy) = (&self.gpu, &self.copy);
        let set = &mut self.sets[self.next];
        // The pinned buffers are reused: their last copy must be done.
        if let Some(copied) = &set.copied {
            gpu.counters.waited();
            copied
                .synchronize()
                .map_err(|e| driver("waiting for a copy", e))?;
        }
        // A value of the set that someone holds, or of another type, is
        // replaced by new memory. Allocated before `released` is recorded:
        // a new buffer's zeroing is enqueued on the compute stream.
        set.values.truncate(types.len());
        for (k, ty) in types.iter().enumerate() {
            let reusable =
                (set.values.get_mut(k)).is_some_and(|v| v.ty() == ty && Arc::get_mut(v).is_some());
            if !reusable {
                let value = Arc::new(Resident::alloc(gpu, "feed", ty)?);
                match set.values.get_mut(k) {
                    Some(v) => *v = value,
                    None => set.values.push(value),
                }
            }
        }
        // Every run enqueued so far (those that read this set's last batch
        // among them, and those that used a pooled buffer before it was
        // freed) ends before the copies write.
        let released = (gpu.stream.record_event(None))
            .map_err(|e| driver("recording the feed's release", e))?;
        copy.wait(&released)
            .map_err(|e| driver("ordering a copy after the runs before it", e))?;
        let copied = Self::copy(gpu, copy, set, values);
        if copied.is_err() {
            // Copies enqueued before the failure may still read the pinned
            // memory and write the values: they end before either is reused.
            let _ = copy.synchronize();
        }
        copied?;
        set.copied = Some(
            copy.record_event(None)
                .map_err(|e| driver("recording a copy", e))?,
        );
        self.waiting = true;
        Ok(())
    }

    fn take(&mut self) -> Result<Vec<Storage>, Error> {
        if !self.waiting {
            return Err(crate::launch(
                "device memory",
                "a feed's take with nothing put",
            ));
        }
        let set = &self.sets[self.next];
        self.next = 1 - self.next;
        let copied = (set.copied.as_ref())
            .ok_or_else(|| crate::launch("device memory", "a feed's take before its copy"))?;
        self.gpu.bind()?;
        (self.gpu.stream.wait(copied))
            .map_err(|e| driver("ordering the runs after a batch's copy", e))?;
        self.waiting = false;
        Ok(set
            .values
            .iter()
            .map(|v| Storage::Cuda(v.clone()))
            .collect())
    }
}

/// The bytes of host elements as the device holds them (bool as 0/1 bytes).
pub(super) fn host_bytes(data: DataRef<'_>) -> Cow<'_, [u8]> {
    match data {
        DataRef::F32(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        DataRef::I32(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        DataRef::I64(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        DataRef::F64(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        DataRef::U8(v) => Cow::Borrowed(v),
        DataRef::Bool(v) => Cow::Owned(v.iter().map(|&b| u8::from(b)).collect()),
        DataRef::BF16(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        DataRef::F16(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    }
}

/// Host elements from the bytes the device wrote.
pub(super) fn fill(data: &mut Data, bytes: &[u8]) {
    let word = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    let long = |c: &[u8]| [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
    match data {
        Data::F32(v) => {
            for (x, c) in v.iter_mut().zip(bytes.chunks_exact(4)) {
                *x = f32::from_le_bytes(word(c));
            }
        }
        Data::I32(v) => {
            for (x, c) in v.iter_mut().zip(bytes.chunks_exact(4)) {
                *x = i32::from_le_bytes(word(c));
            }
        }
        Data::I64(v) => {
            for (x, c) in v.iter_mut().zip(bytes.chunks_exact(8)) {
                *x = i64::from_le_bytes(long(c));
            }
        }
        Data::F64(v) => {
            for (x, c) in v.iter_mut().zip(bytes.chunks_exact(8)) {
                *x = f64::from_le_bytes(long(c));
            }
        }
        Data::U8(v) => v.copy_from_slice(bytes),
        Data::Bool(v) => {
            for (x, &b) in v.iter_mut().zip(bytes) {
                *x = b != 0;
            }
        }
        Data::BF16(v) => {
            for (x, c) in v.iter_mut().zip(bytes.chunks_exact(2)) {
                *x = kiln_ir::bf16::from_le_bytes([c[0], c[1]]);
            }
        }
        Data::F16(v) => {
            for (x, c) in v.iter_mut().zip(bytes.chunks_exact(2)) {
                *x = kiln_ir::f16::from_le_bytes([c[0], c[1]]);
            }
        }
    }
}
