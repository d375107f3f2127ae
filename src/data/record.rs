//! Record files: variable-length items (encoded images, token sequences) in
//! one memory-mapped file, each read in place.
//!
//! The format, all integers little-endian u64:
//!
//! ```text
//! offset 0        magic "KILNREC1"
//! offset 8        n, the number of records
//! offset 16       n + 1 offsets into the payload: record i is payload[o[i]..o[i+1]]
//! offset 24 + 8n  the payload
//! ```
//!
//! Opening checks the magic, that the index fits in the file, and that the
//! offsets start at 0, never decrease, and end exactly at the end of the
//! payload, so a record read afterwards is always in bounds.

use std::path::{Path, PathBuf};

use super::DataError;

const MAGIC: &[u8; 8] = b"KILNREC1";

/// Writes `records` as a record file at `path`.
pub fn write_records<'r>(
    path: &Path,
    records: impl IntoIterator<Item = &'r [u8]>,
) -> Result<(), DataError> {
    let records: Vec<&[u8]> = records.into_iter().collect();
    let mut bytes =
        Vec::with_capacity(24 + 8 * records.len() + records.iter().map(|r| r.len()).sum::<usize>());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(records.len() as u64).to_le_bytes());
    let mut offset = 0u64;
    bytes.extend_from_slice(&offset.to_le_bytes());
    for r in &records {
        offset += r.len() as u64;
        bytes.extend_from_slice(&offset.to_le_bytes());
    }
    for r in &records {
        bytes.extend_from_slice(r);
    }
    std::fs::write(path, bytes).map_err(|e| DataError::io(path, &e))
}

/// A memory-mapped record file.
pub struct RecordFile {
    path: PathBuf,
    map: memmap2::Mmap,
    count: usize,
    payload: usize,
}

impl RecordFile {
    /// Maps and checks the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<RecordFile, DataError> {
        let path = path.as_ref();
        let map = super::map(path)?;
        let fail = |offset: usize, message: String| DataError::Format {
            path: path.to_path_buf(),
            offset,
            message,
        };
        if map.len() < 16 || &map[..8] != MAGIC {
            return Err(fail(0, "not a record file: bad magic".into()));
        }
        let word = |at: usize| u64::from_le_bytes(map[at..at + 8].try_into().unwrap_or_default());
        let count =
            usize::try_from(word(8)).map_err(|_| fail(8, "record count too large".into()))?;
        let payload = count
            .checked_add(1)
            .and_then(|n| n.checked_mul(8))
            .and_then(|n| n.checked_add(16))
            .filter(|&end| end <= map.len())
            .ok_or_else(|| {
                fail(
                    8,
                    format!(
                        "an index of {count} records runs past the end of the file ({} bytes)",
                        map.len()
                    ),
                )
            })?;
        let length = (map.len() - payload) as u64;
        let mut previous = 0u64;
        for i in 0..=count {
            let at = 16 + 8 * i;
            let o = word(at);
            let first_nonzero = i == 0 && o != 0;
            if first_nonzero || o < previous || o > length {
                return Err(fail(
                    at,
                    format!(
                        "record offset {o} is outside 0..={length} or before the previous one ({previous})"
                    ),
                ));
            }
            previous = o;
        }
        if previous != length {
            return Err(fail(
                16 + 8 * count,
                format!("the records end at {previous}, the payload has {length} bytes"),
            ));
        }
        Ok(RecordFile {
            path: path.to_path_buf(),
            map,
            count,
            payload,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Record `index`, in place in the mapping.
    pub fn get(&self, index: usize) -> Result<&[u8], DataError> {
        if index >= self.count {
            return Err(DataError::Item {
                path: self.path.clone(),
                index,
                message: format!("no such record: the file holds {}", self.count),
            });
        }
        let word = |i: usize| {
            let at = 16 + 8 * i;
            u64::from_le_bytes(self.map[at..at + 8].try_into().unwrap_or_default()) as usize
        };
        // `open` checked that the offsets are in order and inside the payload.
        Ok(&self.map[self.payload + word(index)..self.payload + word(index + 1)])
    }
}
