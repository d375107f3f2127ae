//! `DataLoader`: batches of a dataset, read by persistent worker threads,
//! delivered in order.
//!
//! - The order of an epoch is a pure function of (seed, epoch): a
//!   Fisher-Yates shuffle driven by SplitMix64, computed on the consumer
//!   side. So it does not depend on the number of workers, changes every
//!   epoch, and an epoch can resume at any batch.
//! - Sharding by (rank, world size) takes every `world`-th position of the
//!   epoch's order, starting at `rank`: disjoint parts that cover it.
//! - Workers are started once and serve every epoch; at most `prefetch`
//!   batches are in flight; results come back tagged and are delivered in
//!   batch order. Once an epoch has asked for its last batch, the workers
//!   read on into the first batches of the next epoch, which an `epoch`
//!   call for it from its start takes up, so that its first batch does not
//!   wait for a worker to start. Any other call drops them: workers skip
//!   the jobs of epochs no longer wanted (`Live`), and batches read for
//!   them go back to the pool.
//! - Workers run at the lowest scheduling priority (nice 19 on Linux):
//!   where the compiled graph keeps every core busy, it preempts them, and
//!   they read ahead in the time it leaves. Dropping the loader closes the
//!   job channel, and the workers finish their current batch and exit;
//!   `drop` joins them.
//! - A batch of consecutive items (unshuffled) whose field the file holds
//!   as it lies in memory is a view of the mapped file (`Field::Mapped`),
//!   not a copy. Other fields are read into buffers; buffers handed back
//!   with `recycle` are filled again, so a consumer that recycles allocates
//!   nothing per batch in steady state.
//! - A panic while reading a batch becomes an `Err` for that batch; a
//!   corrupt item fails its batch (`OnError::Fail`, naming the item and the
//!   file) or is left out and counted (`OnError::Skip`).

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kiln_ir::{DType, Data, DataRef, OutOfMemory};

use super::{DataError, Dataset, Mapped};
use crate::rng::SplitMix64;

mod ahead;
mod on_device;

use ahead::{Ahead, Live};
use on_device::Kept;
pub use on_device::OnDevice;

/// What to do with an item that cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    /// The batch is an `Err` naming the item and the file.
    Fail,
    /// The item is left out of its batch and counted in `Batch::skipped`.
    Skip,
}

/// How a loader batches.
#[derive(Clone, Copy, Debug)]
pub struct LoaderOptions {
    /// Items per batch.
    pub batch_size: usize,
    /// Shuffle with this seed (a fresh order each epoch), or keep file order.
    pub shuffle: Option<u64>,
    /// Leave out a last batch smaller than `batch_size`.
    pub drop_last: bool,
    /// Worker threads; 0 reads batches on the consumer's thread.
    pub workers: usize,
    /// Batches in flight at most.
    pub prefetch: usize,
    /// This process's part: (rank, world size).
    pub shard: (usize, usize),
    /// What to do with an item that cannot be read.
    pub on_error: OnError,
}

impl Default for LoaderOptions {
    fn default() -> LoaderOptions {
        LoaderOptions {
            batch_size: 32,
            shuffle: None,
            drop_last: false,
            workers: 2,
            prefetch: 4,
            shard: (0, 1),
            on_error: OnError::Fail,
        }
    }
}

/// One batch: each field's items stacked along a new leading axis.
#[derive(Debug)]
pub struct Batch {
    /// Its position in the epoch.
    pub index: usize,
    /// The dataset indices of its items, in order.
    pub items: Vec<usize>,
    /// Per field, its items stacked: `[items.len(), field dims..]`, row-major.
    pub fields: Vec<Field>,
    /// Items left out because they could not be read (`OnError::Skip`).
    pub skipped: usize,
}

impl Batch {
    /// Every field's elements, in field order: the inputs of a compiled graph.
    pub fn inputs(&self) -> Vec<DataRef<'_>> {
        self.fields.iter().map(Field::data).collect()
    }
}

/// One field of a batch.
#[derive(Debug)]
pub enum Field {
    /// Read into a buffer (of the loader's pool, when recycled).
    Owned(Data),
    /// Consecutive rows of a memory-mapped file, in place.
    Mapped(Mapped),
}

impl Field {
    /// The elements.
    pub fn data(&self) -> DataRef<'_> {
        match self {
            Field::Owned(d) => d.into(),
            Field::Mapped(m) => m.data(),
        }
    }
}

/// Throughput and latency of a loader so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Metrics {
    /// Items delivered per second of the consumer's time since its first batch.
    pub samples_per_second: f64,
    /// Median time from asking a worker for a batch to its being ready.
    pub batch_latency_p50: Duration,
    /// 95th percentile of the same.
    pub batch_latency_p95: Duration,
    /// Total time the consumer spent waiting for batches.
    pub waited: Duration,
}

/// A request to read one batch of one epoch generation.
struct Job {
    generation: u64,
    index: usize,
    items: Vec<usize>,
    sent: Instant,
}

/// A batch read, or why not.
struct Done {
    generation: u64,
    index: usize,
    batch: Result<Batch, DataError>,
    latency: Duration,
}

#[derive(Default)]
struct Counters {
    latencies: Vec<Duration>,
    waited: Duration,
    delivered: usize,
    first: Option<Instant>,
}

/// Batches of a dataset, read ahead by persistent worker threads.
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    options: LoaderOptions,
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    done_tx: Sender<Done>,
    workers: Vec<JoinHandle<()>>,
    /// The tag of the current epoch's jobs.
    generation: u64,
    /// The tags whose jobs workers still read.
    live: Arc<Live>,
    /// The last tag given out.
    tags: u64,
    /// The next epoch's first batches, asked for while the last ended.
    ahead: Option<Ahead>,
    /// The feed of the last epoch moved to a device, for the next.
    feed: Option<Kept>,
    counters: Counters,
    pool: Pool,
}

/// Per field, buffers handed back by the consumer for the next batches to fill.
type Pool = Arc<Mutex<Vec<Vec<Data>>>>;

impl DataLoader {
    /// A loader over `dataset`, its worker threads started.
    pub fn new(dataset: Arc<dyn Dataset>, options: LoaderOptions) -> Result<DataLoader, DataError> {
        let (rank, world) = options.shard;
        if options.batch_size == 0 || world == 0 || rank >= world {
            return Err(DataError::Mismatch {
                message: format!(
                    "data loader: batch size {} and shard {rank} of {world} do not make batches",
                    options.batch_size
                ),
            });
        }
        let (jobs_tx, jobs_rx) = channel::<Job>();
        let (done_tx, done) = channel::<Done>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let pool: Pool = Arc::new(Mutex::new(vec![Vec::new(); dataset.fields().len()]));
        let live = Arc::new(Live::default());
        let workers = (0..options.workers)
            .map(|_| {
                let (jobs, done, dataset) = (jobs_rx.clone(), done_tx.clone(), dataset.clone());
                let (pool, live) = (pool.clone(), live.clone());
                let on_error = options.on_error;
                std::thread::spawn(move || {
                    // Best effort: at the default priority the loader still works.
                    let _ = thread_priority::set_current_thread_priority(
                        thread_priority::ThreadPriority::Min,
                    );
                    while let Some(job) = next_job(&jobs) {
                        if !live.wants(job.generation) {
                            continue;
                        }
                        let finished = run(dataset.as_ref(), on_error, &pool, job);
                        if done.send(finished).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        Ok(DataLoader {
            dataset,
            options,
            jobs: Some(jobs_tx),
            done,
            done_tx,
            workers,
            generation: 0,
            live,
            tags: 0,
            ahead: None,
            feed: None,
            counters: Counters::default(),
            pool,
        })
    }

    /// This shard's items of `epoch`, in order: a pure function of the seed
    /// and the epoch.
    pub fn order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.dataset.len()).collect();
        if let Some(seed) = self.options.shuffle {
            let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
            for i in (1..order.len()).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
        }
        let (rank, world) = self.options.shard;
        order.into_iter().skip(rank).step_by(world).collect()
    }

    /// The batches of `epoch`, as dataset indices.
    pub fn batches(&self, epoch: u64) -> Vec<Vec<usize>> {
        let b = self.options.batch_size;
        let order = self.order(epoch);
        let mut batches: Vec<Vec<usize>> = order.chunks(b).map(<[usize]>::to_vec).collect();
        if self.options.drop_last && batches.last().is_some_and(|l| l.len() < b) {
            batches.pop();
        }
        batches
    }

    /// The batches of `epoch`, in order.
    pub fn epoch(&mut self, epoch: u64) -> Epoch<'_> {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch` from batch `start` on: resuming an epoch that
    /// stopped after `start` batches. From its start, an epoch takes up
    /// the batches read ahead for it while the last one ended; any other
    /// call drops them.
    pub fn epoch_from(&mut self, epoch: u64, start: usize) -> Epoch<'_> {
        // The first batches read ahead for this epoch are taken up.
        if let Some(ahead) = self.ahead.take_if(|a| a.epoch == epoch && start == 0) {
            self.generation = ahead.generation;
            self.live.set(self.generation, 0);
            return Epoch {
                loader: self,
                epoch,
                batches: ahead.batches,
                dispatched: ahead.dispatched,
                delivered: 0,
                ready: ahead.ready,
            };
        }
        // Results of an abandoned epoch still in flight, or of batches read
        // ahead for another, are recognized and dropped.
        if let Some(dropped) = self.ahead.take() {
            dropped
                .ready
                .into_values()
                .flatten()
                .for_each(|b| self.recycle(b));
        }
        self.generation = self.tag();
        self.live.set(self.generation, 0);
        let batches = self.batches(epoch);
        let next = start.min(batches.len());
        Epoch {
            loader: self,
            epoch,
            batches,
            dispatched: next,
            delivered: next,
            ready: BTreeMap::new(),
        }
    }

    /// A tag no job has had.
    fn tag(&mut self) -> u64 {
        self.tags += 1;
        self.tags
    }

    /// Hands a batch's buffers back for later batches to fill: a consumer
    /// that recycles every batch it is done with makes the loader allocate
    /// nothing in steady state.
    pub fn recycle(&self, batch: Batch) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        // Enough for every batch that can be in flight at once.
        let keep = self.options.prefetch + self.options.workers + 1;
        for (buffers, field) in pool.iter_mut().zip(batch.fields) {
            if let Field::Owned(data) = field
                && buffers.len() < keep
            {
                buffers.push(data);
            }
        }
    }

    /// Throughput and latency so far.
    pub fn metrics(&self) -> Metrics {
        let c = &self.counters;
        let mut sorted = c.latencies.clone();
        sorted.sort();
        let at = |q: f64| {
            sorted
                .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        let elapsed = c.first.map_or(0.0, |t| t.elapsed().as_secs_f64());
        Metrics {
            samples_per_second: if elapsed > 0.0 {
                c.delivered as f64 / elapsed
            } else {
                0.0
            },
            batch_latency_p50: at(0.5),
            batch_latency_p95: at(0.95),
            waited: c.waited,
        }
    }

    /// A batch a worker has read: the current epoch's, returned; one read
    /// ahead, filed with the next epoch's; a dropped epoch's, recycled.
    fn file(&mut self, done: Done) -> Option<(usize, Result<Batch, DataError>)> {
        if done.generation == self.generation {
            self.counters.latencies.push(done.latency);
            return Some((done.index, done.batch));
        }
        match &mut self.ahead {
            Some(ahead) if ahead.generation == done.generation => {
                self.counters.latencies.push(done.latency);
                ahead.ready.insert(done.index, done.batch);
            }
            _ => {
                if let Ok(b) = done.batch {
                    self.recycle(b);
                }
            }
        }
        None
    }

    fn dispatch(&mut self, generation: u64, index: usize, items: Vec<usize>) {
        let job = Job {
            generation,
            index,
            items,
            sent: Instant::now(),
        };
        match &self.jobs {
            Some(jobs) if !self.workers.is_empty() => {
                // Workers live as long as the sender; a send cannot fail before drop.
                let _ = jobs.send(job);
            }
            _ => {
                let finished = run(
                    self.dataset.as_ref(),
                    self.options.on_error,
                    &self.pool,
                    job,
                );
                let _ = self.done_tx.send(finished);
            }
        }
    }
}

impl Drop for DataLoader {
    /// Closes the job channel and joins the workers, which exit after the
    /// batch they are reading.
    fn drop(&mut self) {
        self.live.set(0, 0);
        self.jobs = None;
        for worker in self.workers.drain(..) {
            // A worker that panicked has already reported it as a batch error.
            let _ = worker.join();
        }
    }
}

/// The batches of one epoch, read ahead and delivered in order.
pub struct Epoch<'l> {
    loader: &'l mut DataLoader,
    epoch: u64,
    batches: Vec<Vec<usize>>,
    dispatched: usize,
    delivered: usize,
    ready: BTreeMap<usize, Result<Batch, DataError>>,
}

impl<'l> Epoch<'l> {
    /// `DataLoader::recycle` while the epoch runs.
    pub fn recycle(&self, batch: Batch) {
        self.loader.recycle(batch);
    }
}

impl Iterator for Epoch<'_> {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        let prefetch = self.loader.options.prefetch.max(1);
        while self.dispatched < self.batches.len() && self.dispatched < self.delivered + prefetch {
            let items = std::mem::take(&mut self.batches[self.dispatched]);
            let generation = self.loader.generation;
            self.loader.dispatch(generation, self.dispatched, items);
            self.dispatched += 1;
        }
        self.read_ahead(prefetch);
        if self.delivered >= self.batches.len() {
            return None;
        }
        let counters = &mut self.loader.counters;
        counters.first.get_or_insert_with(Instant::now);
        let waiting = Instant::now();
        let batch = loop {
            if let Some(b) = self.ready.remove(&self.delivered) {
                break b;
            }
            match self.loader.done.recv() {
                Ok(d) => {
                    if let Some((index, batch)) = self.loader.file(d) {
                        self.ready.insert(index, batch);
                    }
                }
                // The loader holds a sender itself, so the channel cannot close.
                Err(_) => return None,
            }
        };
        let counters = &mut self.loader.counters;
        counters.waited += waiting.elapsed();
        if let Ok(b) = &batch {
            counters.delivered += b.items.len();
        }
        self.delivered += 1;
        Some(batch)
    }
}

/// The next job, or `None` once the loader is gone. The lock is held only
/// to take the job, not while it runs.
fn next_job(jobs: &Mutex<Receiver<Job>>) -> Option<Job> {
    jobs.lock().unwrap_or_else(|e| e.into_inner()).recv().ok()
}

/// Reads one batch; a panic in the dataset becomes the batch's error.
fn run(dataset: &dyn Dataset, on_error: OnError, pool: &Pool, job: Job) -> Done {
    let index = job.index;
    let batch = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_batch(dataset, on_error, pool, &job)
    }))
    .unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(DataError::Worker {
            batch: index,
            message,
        })
    });
    Done {
        generation: job.generation,
        index,
        batch,
        latency: job.sent.elapsed(),
    }
}

fn read_batch(
    dataset: &dyn Dataset,
    on_error: OnError,
    pool: &Pool,
    job: &Job,
) -> Result<Batch, DataError> {
    let items = &job.items;
    let consecutive = items.windows(2).all(|w| w[1] == w[0] + 1);
    let mapped: Vec<Option<Mapped>> = (0..dataset.fields().len())
        .map(|f| match items.first() {
            Some(&first) if consecutive => dataset.mapped(f, first..first + items.len()),
            _ => None,
        })
        .collect();
    let batch = read_items(dataset, on_error, pool, job, &mapped)?;
    if batch.skipped > 0 && mapped.iter().any(Option::is_some) {
        // The views would still hold the skipped items: read every field.
        let owned = vec![None; mapped.len()];
        return read_items(dataset, on_error, pool, job, &owned);
    }
    Ok(batch)
}

/// Reads the items of `job` into buffers, except the fields given as views.
fn read_items(
    dataset: &dyn Dataset,
    on_error: OnError,
    pool: &Pool,
    job: &Job,
    mapped: &[Option<Mapped>],
) -> Result<Batch, DataError> {
    let fields = dataset.fields();
    // Every element of a buffer is written below, so recycled contents never show.
    let mut buffers: Vec<Field> = {
        let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
        fields
            .iter()
            .zip(mapped)
            .zip(pool.iter_mut())
            .map(|((f, view), free)| match view {
                Some(view) => Ok(Field::Mapped(view.clone())),
                None => {
                    let n = f.shape.numel() * job.items.len();
                    fit(free.pop(), f.dtype, n).map(Field::Owned).map_err(|e| {
                        let what = format_args!("batch {} of {n} values of {}", job.index, f.dtype);
                        DataError::out_of_memory(e, "data loader", what)
                    })
                }
            })
            .collect::<Result<_, DataError>>()?
    };
    let mut items = Vec::with_capacity(job.items.len());
    let mut skipped = 0;
    // Bools are bytes in files but not in `Vec<bool>`: they go through a row buffer.
    let mut bool_row: Vec<u8> = Vec::new();
    'items: for &item in &job.items {
        let slot = items.len();
        for (f, (field, buf)) in fields.iter().zip(&mut buffers).enumerate() {
            let n = field.shape.numel();
            let read = match buf {
                Field::Mapped(_) => Ok(()),
                Field::Owned(Data::F32(v)) => dataset.read(
                    item,
                    f,
                    bytemuck::cast_slice_mut(&mut v[slot * n..(slot + 1) * n]),
                ),
                Field::Owned(Data::I32(v)) => dataset.read(
                    item,
                    f,
                    bytemuck::cast_slice_mut(&mut v[slot * n..(slot + 1) * n]),
                ),
                Field::Owned(Data::I64(v)) => dataset.read(
                    item,
                    f,
                    bytemuck::cast_slice_mut(&mut v[slot * n..(slot + 1) * n]),
                ),
                Field::Owned(Data::F64(v)) => dataset.read(
                    item,
                    f,
                    bytemuck::cast_slice_mut(&mut v[slot * n..(slot + 1) * n]),
                ),
                Field::Owned(Data::BF16(v)) => dataset.read(
                    item,
                    f,
                    bytemuck::cast_slice_mut(&mut v[slot * n..(slot + 1) * n]),
                ),
                Field::Owned(Data::F16(v)) => dataset.read(
                    item,
                    f,
                    bytemuck::cast_slice_mut(&mut v[slot * n..(slot + 1) * n]),
                ),
                Field::Owned(Data::U8(v)) => {
                    dataset.read(item, f, &mut v[slot * n..(slot + 1) * n])
                }
                Field::Owned(Data::Bool(v)) => {
                    bool_row.resize(n, 0);
                    let r = dataset.read(item, f, &mut bool_row);
                    for (o, &b) in v[slot * n..(slot + 1) * n].iter_mut().zip(&bool_row) {
                        *o = b != 0;
                    }
                    r
                }
            };
            if let Err(e) = read {
                match on_error {
                    OnError::Fail => return Err(e),
                    // The next item overwrites this one's slot.
                    OnError::Skip => {
                        skipped += 1;
                        continue 'items;
                    }
                }
            }
        }
        items.push(item);
    }
    for (field, buf) in fields.iter().zip(&mut buffers) {
        if let Field::Owned(data) = buf {
            truncate(data, items.len() * field.shape.numel());
        }
    }
    Ok(Batch {
        index: job.index,
        items,
        fields: buffers,
        skipped,
    })
}

/// `buffer` resized to `n` elements of `dtype`, or a new one. A recycled
/// buffer held a full batch before (`truncate` keeps its capacity), so
/// resizing it allocates nothing.
fn fit(buffer: Option<Data>, dtype: DType, n: usize) -> Result<Data, OutOfMemory> {
    Ok(match buffer {
        Some(Data::F32(mut v)) if dtype == DType::F32 => {
            v.resize(n, 0.0);
            Data::F32(v)
        }
        Some(Data::I32(mut v)) if dtype == DType::I32 => {
            v.resize(n, 0);
            Data::I32(v)
        }
        Some(Data::U8(mut v)) if dtype == DType::U8 => {
            v.resize(n, 0);
            Data::U8(v)
        }
        Some(Data::Bool(mut v)) if dtype == DType::Bool => {
            v.resize(n, false);
            Data::Bool(v)
        }
        _ => Data::zeros(dtype, n)?,
    })
}

fn truncate(data: &mut Data, n: usize) {
    match data {
        Data::F32(v) => v.truncate(n),
        Data::I32(v) => v.truncate(n),
        Data::I64(v) => v.truncate(n),
        Data::F64(v) => v.truncate(n),
        Data::U8(v) => v.truncate(n),
        Data::Bool(v) => v.truncate(n),
        Data::BF16(v) => v.truncate(n),
        Data::F16(v) => v.truncate(n),
    }
}
