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
    pub fn to_device(self, device: Device) -> crate::Result<OnDevice<'l>> {
        let feed = crate::backend::backend(device)?.feed()?;
        let fields = self.loader.dataset.fields();
        Ok(OnDevice {
            epoch: self,
            feed,
            fields,
            device,
            waiting: None,
            failed: None,
        })
    }
}

/// The batches of one epoch as tensors on a device, each copied in one
/// batch ahead (`Epoch::to_device`).
pub struct OnDevice<'l> {
    epoch: Epoch<'l>,
    feed: Box<dyn Feed>,
    fields: Vec<TensorType>,
    device: Device,
    /// The types of the batch put into the feed and not yet taken.
    waiting: Option<Vec<TensorType>>,
    /// Why the batch after the last one handed out could not be put.
    failed: Option<crate::Error>,
}

impl OnDevice<'_> {
    /// Puts the epoch's next batch into the feed; false after the last.
    fn put_next(&mut self) -> crate::Result<bool> {
        let Some(batch) = self.epoch.next() else {
            return Ok(false);
        };
        let batch = batch?;
        let types = batch_types(&self.fields, &batch)?;
        self.feed.put(&types, &batch.inputs())?;
        self.epoch.recycle(batch);
        self.waiting = Some(types);
        Ok(true)
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
        let stored = self.feed.take()?;
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
