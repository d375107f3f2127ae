//! Device memory: the caching allocator (freed buffers go back to their
//! GPU's pool by size), the buffers it hands out, the pinned host memory
//! and standby buffers that stage the next run's inputs while the current
//! one computes, a device-to-device copy for measuring bandwidth, and the
//! bytes of host data as the device holds them.

#![allow(unsafe_code)]

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice};
use kiln_ir::{Data, DataRef, TensorType};

use super::context::{Gpu, driver};
use crate::Error;

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
    pub(super) fn alloc(self: &Arc<Gpu>, bytes: usize) -> Result<Buffer, Error> {
        let size = bytes.max(1).next_power_of_two().max(256);
        let reused = self
            .pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&size)
            .and_then(Vec::pop);
        let slice = match reused {
            Some(s) => s,
            None => self
                .stream
                .alloc_zeros::<u8>(size)
                .map_err(|e| driver("allocating device memory", e))?,
        };
        Ok(Buffer {
            slice: Some(slice),
            bytes,
            gpu: self.clone(),
        })
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
            .ok_or_else(|| Error::Cuda("a freed device buffer".into()))
    }

    /// The raw device address of byte `at`, for a kernel argument.
    pub(super) fn address(&self, at: usize) -> Result<u64, Error> {
        let slice = self.slice()?;
        if at > self.bytes {
            return Err(Error::Launch(format!(
                "byte {at} of a {}-byte buffer",
                self.bytes
            )));
        }
        let (ptr, _sync) = slice.device_ptr(&self.gpu.stream);
        Ok(ptr + at as u64)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            let mut pool = self.gpu.pool.lock().unwrap_or_else(|e| e.into_inner());
            pool.entry(slice.len()).or_default().push(slice);
        }
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
        let mut dst = self
            .to
            .slice
            .as_mut()
            .ok_or_else(|| Error::Cuda("a freed device buffer".into()))?
            .slice_mut(..bytes);
        gpu.timed(|| {
            gpu.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(|e| driver("copying on the device", e))
        })
    }
}

/// Inputs staged for the next launch: copied into pinned host memory, then
/// to a second set of device input buffers on a copy stream, while the
/// current launch computes on the first set.
pub(super) struct Staging {
    copy: Arc<CudaStream>,
    pinned: Vec<PinnedHostSlice<u8>>,
    pub(super) standby: Vec<Buffer>,
    /// Recorded on the copy stream after the last copy into `standby`.
    pub(super) copied: Option<CudaEvent>,
    /// Recorded on the compute stream when the work that read the buffers
    /// now in `standby` was enqueued in full, and first when they were
    /// allocated (and zeroed) there: a pooled buffer may still be read by
    /// the work of an executable that was dropped, and a new one's zeroing
    /// is stream-ordered; the copy stream waits for either.
    pub(super) released: CudaEvent,
    /// Whether `standby` holds inputs that no launch has taken yet.
    pub(super) ready: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // With cudarc's event tracking off, freeing pinned memory waits on
        // nothing: a copy still reading it (or writing a standby buffer that
        // goes back to the pool) must end first. A failure leaves nothing
        // better to do than to free.
        let _ = self.copy.synchronize();
    }
}

impl Staging {
    /// A copy stream, and pinned host memory and a standby device buffer
    /// for each input of `types`.
    pub(super) fn new(gpu: &Arc<Gpu>, types: &[TensorType]) -> Result<Staging, Error> {
        let copy = gpu
            .ctx
            .new_stream()
            .map_err(|e| driver("creating a copy stream", e))?;
        let mut pinned = Vec::with_capacity(types.len());
        let mut standby = Vec::with_capacity(types.len());
        for ty in types {
            let bytes = ty.shape.numel() * ty.dtype.size();
            // SAFETY: the memory is written in full (`stage`) before any read.
            // Flags 0: cached host memory, fast for the CPU to write. At
            // least a byte: cuMemHostAlloc of 0 bytes may leave the
            // pointer unwritten.
            let host = unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), 0) }
                .map_err(|e| driver("allocating pinned memory", e))?;
            pinned.push(host);
            standby.push(gpu.alloc(bytes)?);
        }
        let released = gpu
            .stream
            .record_event(None)
            .map_err(|e| driver("recording the standby buffers' allocation", e))?;
        Ok(Staging {
            copy,
            pinned,
            standby,
            copied: None,
            released,
            ready: false,
        })
    }

    /// Starts copying `inputs` (of the types `new` was given, checked by
    /// the caller) through the pinned buffers into the standby buffers, on
    /// the copy stream; they are `ready` once every copy is enqueued.
    pub(super) fn stage(&mut self, inputs: &[DataRef<'_>]) -> Result<(), Error> {
        // The pinned buffers are reused: the last copy out of them must be done.
        if let Some(copied) = &self.copied {
            copied
                .synchronize()
                .map_err(|e| driver("waiting for a copy", e))?;
        }
        // The device buffers are reused: the launch that read them must be done.
        self.copy
            .wait(&self.released)
            .map_err(|e| driver("ordering a copy after a launch", e))?;
        // Until the copies below are all enqueued, no launch may take them.
        self.ready = false;
        for ((host, device), data) in self.pinned.iter_mut().zip(&mut self.standby).zip(inputs) {
            let bytes = host_bytes(*data);
            if bytes.is_empty() {
                continue;
            }
            let host = &mut host
                .as_mut_slice()
                .map_err(|e| driver("writing pinned memory", e))?[..bytes.len()];
            host.copy_from_slice(&bytes);
            let mut dst = device
                .slice
                .as_mut()
                .ok_or_else(|| Error::Cuda("a freed device buffer".into()))?
                .slice_mut(..bytes.len());
            self.copy
                .memcpy_htod(&*host, &mut dst)
                .map_err(|e| driver("copying an input to the device", e))?;
        }
        self.copied = Some(
            self.copy
                .record_event(None)
                .map_err(|e| driver("recording a copy", e))?,
        );
        self.ready = true;
        Ok(())
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
    }
}
