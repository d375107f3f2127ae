//! Reading the next epoch ahead: once an epoch has asked for its last
//! batch, the first batches of the one after it, which `epoch_from` takes
//! up or drops, and the tags of the jobs workers still read; the first of
//! them moved to a device while this epoch ends (`OnDevice`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Batch, Epoch};
use crate::data::DataError;

/// The batches of the epoch after the last one run, the first of them
/// asked for while it ended (`Epoch::read_ahead`).
pub(super) struct Ahead {
    pub(super) epoch: u64,
    pub(super) generation: u64,
    pub(super) batches: Vec<Vec<usize>>,
    pub(super) dispatched: usize,
    pub(super) ready: BTreeMap<usize, Result<Batch, DataError>>,
}

/// The tags of the jobs still wanted, the current epoch's and the one read
/// ahead (0: none); a worker skips any other job, so that a dropped epoch
/// or a wrong guess does not delay the next epoch's first batch.
#[derive(Default)]
pub(super) struct Live {
    current: AtomicU64,
    ahead: AtomicU64,
}

impl Live {
    pub(super) fn wants(&self, generation: u64) -> bool {
        generation == self.current.load(Ordering::Acquire)
            || generation == self.ahead.load(Ordering::Acquire)
    }

    pub(super) fn set(&self, current: u64, ahead: u64) {
        self.current.store(current, Ordering::Release);
        self.ahead.store(ahead, Ordering::Release);
    }
}

impl Epoch<'_> {
    /// Once every batch of this epoch is asked for, the first batches of
    /// the next epoch, within the `prefetch` batches in flight: workers
    /// read them while this epoch's last batches are used. Not without
    /// workers, where reading ahead would only delay this epoch's batches.
    pub(super) fn read_ahead(&mut self, prefetch: usize) {
        let loader = &mut *self.loader;
        if self.dispatched < self.batches.len() || loader.workers.is_empty() {
            return;
        }
        if loader.ahead.is_none() {
            // The loader's guess: the epoch after this one.
            let Some(epoch) = self.epoch.checked_add(1) else {
                return;
            };
            let generation = loader.tag();
            loader.live.set(loader.generation, generation);
            loader.ahead = Some(Ahead {
                epoch,
                generation,
                batches: loader.batches(epoch),
                dispatched: 0,
                ready: BTreeMap::new(),
            });
        }
        let in_flight = self.dispatched - self.delivered;
        while let Some(ahead) = loader.ahead.as_mut()
            && ahead.dispatched < ahead.batches.len()
            && in_flight + ahead.dispatched < prefetch
        {
            let index = ahead.dispatched;
            let items = std::mem::take(&mut ahead.batches[index]);
            ahead.dispatched += 1;
            let generation = ahead.generation;
            loader.dispatch(generation, index, items);
        }
    }
}

impl Epoch<'_> {
    /// The next epoch's first batch, read ahead, and the tag of its jobs:
    /// waits while a worker reads it. `None` where none is read ahead (no
    /// workers, or batches left in this epoch), or where reading it failed
    /// (the epoch that takes it up reports that).
    pub(super) fn next_first(&mut self) -> Option<(u64, &Batch)> {
        loop {
            let ahead = self.loader.ahead.as_ref()?;
            if ahead.dispatched == 0 {
                return None;
            }
            if ahead.ready.contains_key(&0) {
                break;
            }
            // The loader holds a sender itself, so the channel cannot close.
            let done = self.loader.done.recv().ok()?;
            if let Some((index, batch)) = self.loader.file(done) {
                self.ready.insert(index, batch);
            }
        }
        let ahead = self.loader.ahead.as_ref()?;
        let first = ahead.ready.get(&0)?.as_ref().ok()?;
        Some((ahead.generation, first))
    }

    /// Hands this epoch's first batch back unused, where the epoch has
    /// delivered nothing and it is read: its values were moved to a
    /// device ahead (`Epoch::to_device`). False where it cannot.
    pub(super) fn skip_first(&mut self, generation: u64) -> bool {
        let read = matches!(self.ready.get(&0), Some(Ok(_)));
        if generation != self.loader.generation || self.delivered != 0 || !read {
            return false;
        }
        let Some(Ok(first)) = self.ready.remove(&0) else {
            return false;
        };
        self.loader.counters.delivered += first.items.len();
        self.loader.recycle(first);
        self.delivered = 1;
        true
    }
}
