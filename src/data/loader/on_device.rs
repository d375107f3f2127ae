//! An epoch's batches as tensors on a device (`Epoch::to_device`), each
//! put into the device's feed one batch ahead.

use kiln_ir::TensorType;
use kiln_runtime::Feed;

use super::{Batch, Epoch};
use crate::data::DataError;
use crate::{Device, Tensor};

impl<'l> Epoch<'l> {
    /// Its batches as tensors on `device`, one per field (`[items, field
    /// dims..]`), each batch copied in while the work on the one before
    /// runs: on a GPU, through pinned memory on a copy stream, so that a
    /// training step on batch k overlaps the copy of batch k + 1. Each
    /// batch's host buffers go back to the loader once they are copied. On
    /// the CPU, a batch is copied once into tensors of its own (a compiled
    /// graph's `run(&batch.inputs())` reads the loader's buffers in place).
    ///
    /// The loader keeps the feed (on a GPU, its copy stream, two batches'
    /// device buffers and pinned memory) from one epoch to the next, until
    /// the loader is dropped. Before it hands out an epoch's last batch, it
    /// waits for a worker to read the next epoch's first batch and copies
    /// that in while the device still runs the steps before: an epoch taken
    /// up from its start finds it there.
    pub fn to_device(mut self, device: Device) -> crate::Result<OnDevice<'l>> {
        let kept = (self.loader.feed.take()).filter(|kept| kept.device == device);
        let (mut feed, first) = match kept {
            Some(kept) => (kept.feed, kept.first),
            None => (crate::backend::backend(device)?.feed()?, None),
        };
        let mut waiting = None;
        if let Some((generation, types)) = first {
            if self.skip_first(generation) {
                waiting = Some(types);
            } else if feed.take().is_err() {
                // Another epoch's first batch, which the feed could not
                // hand back: a fresh feed rather than an error of this
                // epoch.
                feed = crate::backend::backend(device)?.feed()?;
            }
        }
        let fields = self.loader.dataset.fields();
        Ok(OnDevice {
            epoch: self,
            feed: Some(feed),
            fields,
            device,
            waiting,
            keep: true,
            ended: false,
            next_first: None,
            failed: None,
        })
    }
}

/// A feed its loader keeps between epochs (`Epoch::to_device`): a GPU's
/// feed holds a copy stream, device buffers and pinned memory, and may hold
/// the next epoch's first batch.
pub(super) struct Kept {
    device: Device,
    feed: Box<dyn Feed>,
    /// The batch waiting in the feed: the first of the epoch read ahead
    /// with this tag, of these types.
    first: Option<(u64, Vec<TensorType>)>,
}

/// The batches of one epoch as tensors on a device, each copied in one
/// batch ahead (`Epoch::to_device`).
pub struct OnDevice<'l> {
    epoch: Epoch<'l>,
    /// Taken by `drop`, to go back to the loader.
    feed: Option<Box<dyn Feed>>,
    /// False after a put or take of the feed failed: the loader does not
    /// keep a feed that may still hold a batch, or be broken.
    keep: bool,
    fields: Vec<TensorType>,
    device: Device,
    /// The types of the batch put into the feed and not yet taken.
    waiting: Option<Vec<TensorType>>,
    /// Whether the epoch has no batch left to put.
    ended: bool,
    /// The next epoch's first batch, put after this epoch's last.
    next_first: Option<(u64, Vec<TensorType>)>,
    /// Why the batch after the last one handed out could not be put.
    failed: Option<crate::Error>,
}

impl OnDevice<'_> {
    fn feed(&mut self) -> &mut dyn Feed {
        (self.feed.as_deref_mut()).expect("only `drop` takes the feed")
    }

    /// Puts the epoch's next batch into the feed; false after the last,
    /// when the next epoch's first batch goes in instead, where it is read
    /// ahead.
    fn put_next(&mut self) -> crate::Result<bool> {
        if self.ended {
            return Ok(false);
        }
        let Some(batch) = self.epoch.next() else {
            self.ended = true;
            self.put_next_first();
            return Ok(false);
        };
        let batch = batch?;
        let types = batch_types(&self.fields, &batch)?;
        let put = self.feed().put(&types, &batch.inputs());
        self.keep &= put.is_ok();
        put?;
        self.epoch.recycle(batch);
        self.waiting = Some(types);
        Ok(true)
    }

    /// Puts the first batch read ahead for the next epoch, waiting for a
    /// worker where it is not read yet: this epoch's last batch has been
    /// taken, and the device still runs the work on the ones before. A
    /// failure is left for the next epoch to meet: the feed is not kept.
    fn put_next_first(&mut self) {
        let Some((generation, batch)) = self.epoch.next_first() else {
            return;
        };
        // `self.feed()` would borrow all of `self`, and `batch` borrows the epoch.
        let feed = (self.feed.as_deref_mut()).expect("only `drop` takes the feed");
        let put = (batch_types(&self.fields, batch))
            .map_err(crate::Error::from)
            .and_then(|types| Ok(feed.put(&types, &batch.inputs()).map(|()| types)?));
        match put {
            Ok(types) => self.next_first = Some((generation, types)),
            Err(_) => self.keep = false,
        }
    }

    /// The batch put last, taken, with the next one put behind it.
    fn take_next(&mut self) -> crate::Result<Option<Vec<Tensor>>> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if self.waiting.is_none() && !self.put_next()? {
            return Ok(None);
        }
        let types = self.waiting.take().unwrap_or_default();
        let stored = self.feed().take();
        self.keep &= stored.is_ok();
        let stored = stored?;
        // An error of the next batch is the next call's, not this batch's.
        if let Err(e) = self.put_next() {
            self.failed = Some(e);
        }
        Ok(Some(
            (types.into_iter().zip(stored))
                .map(|(ty, storage)| Tensor::from_storage(ty, storage, self.device))
                .collect(),
        ))
    }
}

impl Drop for OnDevice<'_> {
    /// The feed goes back to the loader, for the next epoch, with the
    /// next epoch's first batch where it was put; a batch of this epoch
    /// still waiting in it (a loop that stopped early) is dropped here.
    fn drop(&mut self) {
        let unused = self.waiting.take().is_some();
        if unused && self.feed().take().is_err() {
            self.keep = false;
        }
        if let Some(feed) = self.feed.take().filter(|_| self.keep) {
            self.epoch.loader.feed = Some(Kept {
                device: self.device,
                feed,
                first: self.next_first.take(),
            });
        }
    }
}

impl Iterator for OnDevice<'_> {
    type Item = crate::Result<Vec<Tensor>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.take_next().transpose()
    }
}

/// The type of each field of `batch`: `[items, field dims..]`.
fn batch_types(fields: &[TensorType], batch: &Batch) -> Result<Vec<TensorType>, DataError> {
    let rows = batch.items.len();
    (fields.iter().zip(&batch.fields))
        .map(|(ty, field)| {
            let dims: Vec<usize> = std::iter::once(rows)
                .chain(ty.shape.dims().iter().copied())
                .collect();
            let batched = TensorType::new(ty.dtype, dims);
            match batched.shape.numel() == field.data().len() {
                true => Ok(batched),
                false => Err(DataError::Mismatch {
                    message: format!(
                        "batch {}: {} values for {batched}",
                        batch.index,
                        field.data().len()
                    ),
                }),
            }
        })
        .collect()
}
