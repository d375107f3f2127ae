//! Data loading: memory-mapped datasets whose rows are read in place.
//!
//! `npy` parses and maps `.npy` arrays, checking every header against the
//! file; `ArrayDataset` serves the rows of such an array, or of a
//! safetensors tensor, as items; `record` holds variable-length items; `Zip`
//! puts datasets side by side (features and labels); `DataLoader` batches
//! them with persistent worker threads, in an order that is a pure function
//! of the seed and the epoch. A corrupt or truncated file is a `DataError` naming
//! the file, the byte offset or item, and what is wrong; it never panics.

mod dataset;
mod loader;
pub mod npy;
pub mod record;

pub use dataset::{ArrayDataset, Dataset, Mapped, Subset, Zip};
pub use loader::{Batch, DataLoader, Epoch, Field, LoaderOptions, Metrics, OnDevice, OnError};

use std::path::{Path, PathBuf};

/// What can be wrong with a data file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened, read or mapped.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's message.
        message: String,
    },
    /// One item could not be read.
    #[error("{}: item {index}: {message}", path.display())]
    Item {
        /// The file.
        path: PathBuf,
        /// The item's index in the dataset.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// Datasets or options that do not fit together.
    #[error("{message}")]
    Mismatch {
        /// What does not fit.
        message: String,
    },
    /// A worker thread panicked while reading a batch.
    #[error("data loader: batch {batch}: a worker panicked: {message}")]
    Worker {
        /// The batch it was reading.
        batch: usize,
        /// The panic's message.
        message: String,
    },
    /// Memory for an item or a batch could not be had.
    #[error("{op}: out of memory: {bytes} bytes for {what}")]
    OutOfMemory {
        /// What was reading.
        op: &'static str,
        /// What the buffer was for.
        what: String,
        /// The bytes asked for.
        bytes: usize,
    },
    /// The file's contents are not what its format requires.
    #[error("{}: at byte {offset}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// Where the problem is.
        offset: usize,
        /// What is wrong.
        message: String,
    },
}

impl DataError {
    pub(crate) fn out_of_memory(
        e: kiln_ir::OutOfMemory,
        op: &'static str,
        what: impl std::fmt::Display,
    ) -> DataError {
        DataError::OutOfMemory {
            op,
            what: what.to_string(),
            bytes: e.bytes,
        }
    }

    pub(crate) fn io(path: &Path, e: &std::io::Error) -> DataError {
        DataError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }
}

/// Opens the file at `path` read-only and maps it into memory.
#[allow(unsafe_code)]
pub(crate) fn map(path: &Path) -> Result<memmap2::Mmap, DataError> {
    let file = std::fs::File::open(path).map_err(|e| DataError::io(path, &e))?;
    // SAFETY: the mapping is read-only and kiln reads it only as bytes, for
    // which every bit pattern is valid. memmap2 cannot rule out another
    // process truncating the file while it is mapped (reads past the new end
    // would fault); datasets are treated as immutable while they are open,
    // as every memory-mapping loader does.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| DataError::io(path, &e))
}
