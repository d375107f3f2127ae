//! Where a realized value lives: host memory for the CPU and the
//! interpreter (shared `Data`, handed from backend to backend without a
//! copy), a GPU's own memory for the CUDA backend, where it stays until it
//! is read. `Arg` is a value given to a run: borrowed host data (a loader's
//! batch) or storage. Host buffers that no value holds any more are kept
//! for the next value of their type (`recycle`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use kiln_ir::{DType, Data, DataRef, TensorType};

use crate::Error;

/// A realized value, kept by the backend that computed it.
#[derive(Clone, Debug)]
pub enum Storage {
    /// Host memory.
    Host(Arc<Data>),
    /// Memory of a GPU.
    #[cfg(feature = "cuda")]
    Cuda(Arc<crate::cuda::Resident>),
}

impl Storage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Host(d) => d.dtype(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.ty().dtype,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Storage::Host(d) => d.len(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.ty().shape.numel(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The host data, where the value is in host memory.
    pub fn as_host(&self) -> Option<&Arc<Data>> {
        match self {
            Storage::Host(d) => Some(d),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => None,
        }
    }

    /// The host data, where the value is in host memory.
    fn into_host(self) -> Option<Arc<Data>> {
        match self {
            Storage::Host(d) => Some(d),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => None,
        }
    }

    /// The value in host memory: shared where it is there; copied out of a
    /// GPU, after the work that computes it, where it is there.
    pub fn to_host(&self) -> Result<Arc<Data>, Error> {
        match self {
            Storage::Host(d) => Ok(d.clone()),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.read().map(Arc::new),
        }
    }

    /// Host data a run reads and then writes over (a donated input): moved
    /// to the host first, and copied where another holder shares it, so
    /// that no one else sees the write.
    pub(crate) fn host_to_update(&mut self, op: &str) -> Result<&mut Data, Error> {
        let data = self.host_slot()?;
        if Arc::get_mut(data).is_none() {
            let what = format_args!("{} values of {}", data.len(), data.dtype());
            *data = Arc::new(data.try_clone().map_err(|e| e.in_op(op, what))?);
        }
        Arc::get_mut(data).ok_or_else(|| crate::launch("storage", "a shared host buffer"))
    }

    /// Host data a run only writes (an output): a new buffer of the same
    /// type where this one is shared or not on the host.
    pub(crate) fn host_to_write(&mut self, op: &str) -> Result<&mut Data, Error> {
        let (dtype, len) = (self.dtype(), self.len());
        let fresh = match self {
            Storage::Host(d) => Arc::get_mut(d).is_none(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => true,
        };
        if fresh {
            let data = match host_buffer(dtype, len) {
                Some(data) => data,
                None => Data::zeros(dtype, len)
                    .map_err(|e| e.in_op(op, format_args!("{len} values of {dtype}")))?,
            };
            *self = Storage::Host(Arc::new(data));
        }
        self.host_to_update(op)
    }

    /// The host `Arc` behind this storage, after copying a device's value out.
    fn host_slot(&mut self) -> Result<&mut Arc<Data>, Error> {
        #[cfg(feature = "cuda")]
        if let Storage::Cuda(s) = self {
            *self = Storage::Host(Arc::new(s.read()?));
        }
        match self {
            Storage::Host(d) => Ok(d),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(crate::launch("storage", "device storage after a copy out")),
        }
    }
}

/// Host buffers given back by values no one holds any more, the oldest
/// first, and their bytes: the next value of the same dtype and length is
/// written into one (`host_buffer`) instead of memory the allocator hands
/// out and zeroes anew, which for buffers past glibc's mmap threshold means
/// fresh pages and a fault for each (eager code in a loop; measured in
/// `benches/RESULTS-cpu.md`). Bounded: buffers of `POOLED_MIN` to
/// `POOLED_MAX` bytes, at most `POOLED_COUNT` of them and `POOLED_BYTES`
/// in all, the oldest given up first.
struct HostPool {
    buffers: VecDeque<Data>,
    bytes: usize,
}

const POOLED_MIN: usize = 16 << 10;
const POOLED_MAX: usize = 16 << 20;
const POOLED_COUNT: usize = 64;
const POOLED_BYTES: usize = 64 << 20;

static HOST_POOL: Mutex<HostPool> = Mutex::new(HostPool {
    buffers: VecDeque::new(),
    bytes: 0,
});

fn bytes_of(data: &Data) -> usize {
    data.capacity_bytes()
}

/// Gives `storage` back to the host pool if it is a host buffer that no one
/// else holds and of a size the pool keeps; drops it otherwise.
pub fn recycle(storage: Storage) {
    let Some(Ok(data)) = storage.into_host().map(Arc::try_unwrap) else {
        return;
    };
    let bytes = bytes_of(&data);
    if !(POOLED_MIN..=POOLED_MAX).contains(&bytes) {
        return;
    }
    let mut pool = HOST_POOL.lock().unwrap_or_else(|e| e.into_inner());
    while pool.buffers.len() >= POOLED_COUNT || pool.bytes + bytes > POOLED_BYTES {
        match pool.buffers.pop_front() {
            Some(oldest) => pool.bytes -= bytes_of(&oldest),
            None => break,
        }
    }
    pool.bytes += bytes;
    pool.buffers.push_back(data);
}

/// A host buffer of `len` values of `dtype` from the pool, holding what
/// its last value left there, if the pool has one.
pub(crate) fn host_buffer(dtype: DType, len: usize) -> Option<Data> {
    let mut pool = HOST_POOL.lock().unwrap_or_else(|e| e.into_inner());
    let at = (pool.buffers.iter()).position(|d| d.dtype() == dtype && d.len() == len)?;
    let data = pool.buffers.remove(at)?;
    pool.bytes -= bytes_of(&data);
    Some(data)
}

/// A value given to a run.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    /// Host data, borrowed for the run.
    Host(DataRef<'a>),
    /// A realized value, wherever it is.
    Stored(&'a Storage),
}

impl Arg<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Arg::Host(d) => d.dtype(),
            Arg::Stored(s) => s.dtype(),
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Arg::Host(d) => d.len(),
            Arg::Stored(s) => s.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Batches moved into a backend's storage one ahead of their use, as a
/// data loader hands them out: `put` starts moving the next batch in while
/// the work enqueued so far runs (on a GPU, through pinned memory on a copy
/// stream), and `take` hands out the batch put last, as storage that every
/// run enqueued after it reads in full.
pub trait Feed: Send {
    /// Starts moving `values` (host data of `types`, one per value) in; the
    /// host data may go when this returns. Values not of their types, and a
    /// second `put` before a `take`, are an `Err`.
    fn put(&mut self, types: &[TensorType], values: &[DataRef<'_>]) -> Result<(), Error>;

    /// The values of the last `put`; an `Err` where none waits.
    fn take(&mut self) -> Result<Vec<Storage>, Error>;
}

/// What every feed checks of a `put`: that no batch waits for its `take`,
/// and `values` against `types`.
pub(crate) fn check_put(
    waiting: bool,
    types: &[TensorType],
    values: &[DataRef<'_>],
) -> Result<(), Error> {
    if waiting {
        return Err(crate::launch(
            "storage",
            "a feed's put before the last one was taken",
        ));
    }
    let given = values.iter().map(|v| (v.dtype(), v.len()));
    crate::check("feed", "value", types, given)
}

/// The feed of backends that keep values in host memory: each value copied
/// into a host buffer of its own at `put`.
#[derive(Default)]
pub struct HostFeed {
    waiting: Option<Vec<Storage>>,
}

impl Feed for HostFeed {
    fn put(&mut self, types: &[TensorType], values: &[DataRef<'_>]) -> Result<(), Error> {
        check_put(self.waiting.is_some(), types, values)?;
        let stored = (types.iter().zip(values))
            .map(|(ty, value)| {
                let data = value.try_to_data().map_err(|e| e.in_op("feed", ty))?;
                Ok(Storage::Host(Arc::new(data)))
            })
            .collect::<Result<_, Error>>()?;
        self.waiting = Some(stored);
        Ok(())
    }

    fn take(&mut self) -> Result<Vec<Storage>, Error> {
        (self.waiting.take())
            .ok_or_else(|| crate::launch("storage", "a feed's take with nothing put"))
    }
}

/// What a backend has moved and how often the host waited for it, since
/// the process started, as `torch.cuda.memory_stats` reports. The CPU and
/// the interpreter keep every value in host memory: they copy nothing,
/// never wait and launch no graph, and report zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes copied from the host to the device.
    pub bytes_to_device: u64,
    /// Bytes copied from the device to the host.
    pub bytes_to_host: u64,
    /// Times the host waited for the device's work to end.
    pub host_waits: u64,
    /// Runs replayed as one CUDA graph launch each.
    pub graph_launches: u64,
    /// Device memory handed out to values and buffers now, in bytes (as
    /// `torch.cuda.memory_allocated`); memory the pool keeps for reuse is
    /// not counted.
    pub bytes_in_use: u64,
    /// The most `bytes_in_use` has been (`torch.cuda.max_memory_allocated`).
    pub peak_bytes_in_use: u64,
}
