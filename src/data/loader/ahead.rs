//! Reading the next epoch ahead: once an epoch has asked for its last
//! batch, the first batches of the one after it, which `epoch_from` takes
//! up or drops, and the tags of the jobs workers still read.

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
