//! `Dataset`: random access to items, each a tuple of fixed-shape fields
//! (an image and its label), read straight out of memory-mapped files.

use std::path::{Path, PathBuf};

use kiln_ir::{DType, Shape, TensorType};
use safetensors::{Dtype, SafeTensors};

use super::DataError;
use super::npy::{NpyDType, NpyHeader};

/// Random access to items. Every item has the same fields, each of one
/// type; the loader batches them along a new leading axis.
pub trait Dataset: Send + Sync {
    /// How many items there are.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The type of each field of one item.
    fn fields(&self) -> Vec<TensorType>;

    /// Writes field `field` of item `index` into `out`, which holds exactly
    /// that field's bytes (little-endian elements of its dtype). A corrupt
    /// item is an `Err` naming the file and the item.
    fn read(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError>;
}

/// The rows of one memory-mapped array (a `.npy` file, or one tensor of a
/// safetensors file) as items of one field: row `i` of the first axis is
/// item `i`, read in place.
pub struct ArrayDataset {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Where the array's bytes start in the file.
    offset: usize,
    /// How elements are stored.
    stored: NpyDType,
    rows: usize,
    field: TensorType,
    /// Bytes of one row in the file.
    row_bytes: usize,
}

impl ArrayDataset {
    /// The rows of the `.npy` array at `path`.
    pub fn npy(path: impl AsRef<Path>) -> Result<ArrayDataset, DataError> {
        let path = path.as_ref();
        let map = super::map(path)?;
        let header = NpyHeader::parse(path, &map)?;
        ArrayDataset::new(path, map, header.data_offset, header.dtype, &header.shape)
    }

    /// The rows of tensor `name` of the safetensors file at `path` (f32,
    /// f64, i32, i64, u8 or bool).
    pub fn safetensors(path: impl AsRef<Path>, name: &str) -> Result<ArrayDataset, DataError> {
        let path = path.as_ref();
        let map = super::map(path)?;
        let fail = |message: String| DataError::Format {
            path: path.to_path_buf(),
            offset: 0,
            message,
        };
        let tensors = SafeTensors::deserialize(&map)
            .map_err(|e| fail(format!("not a safetensors file: {e}")))?;
        let view = tensors
            .tensor(name)
            .map_err(|e| fail(format!("tensor '{name}': {e}")))?;
        let stored = match view.dtype() {
            Dtype::F32 => NpyDType::F32,
            Dtype::F64 => NpyDType::F64,
            Dtype::I32 => NpyDType::I32,
            Dtype::I64 => NpyDType::I64,
            Dtype::U8 => NpyDType::U8,
            Dtype::BOOL => NpyDType::Bool,
            other => {
                return Err(fail(format!(
                    "tensor '{name}' has unsupported dtype {other:?}"
                )));
            }
        };
        // The view borrows the mapping: its offset is where its bytes start.
        let offset = view.data().as_ptr() as usize - map.as_ptr() as usize;
        let shape = view.shape().to_vec();
        drop(tensors);
        ArrayDataset::new(path, map, offset, stored, &shape)
    }

    fn new(
        path: &Path,
        map: memmap2::Mmap,
        offset: usize,
        stored: NpyDType,
        shape: &[usize],
    ) -> Result<ArrayDataset, DataError> {
        let Some((&rows, row)) = shape.split_first() else {
            return Err(DataError::Format {
                path: path.to_path_buf(),
                offset,
                message: "a rank-0 array has no rows to serve as items".into(),
            });
        };
        Ok(ArrayDataset {
            path: path.to_path_buf(),
            map,
            offset,
            stored,
            rows,
            field: TensorType::new(stored.dtype(), Shape::new(row)),
            row_bytes: row.iter().product::<usize>() * stored.size(),
        })
    }
}

impl Dataset for ArrayDataset {
    fn len(&self) -> usize {
        self.rows
    }

    fn fields(&self) -> Vec<TensorType> {
        vec![self.field.clone()]
    }

    fn read(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let fail = |message: String| DataError::Item {
            path: self.path.clone(),
            index,
            message,
        };
        if field != 0 || index >= self.len() {
            return Err(fail(format!(
                "no field {field} of item {index} in {} items",
                self.len()
            )));
        }
        let start = self.offset + index * self.row_bytes;
        let row = &self.map[start..start + self.row_bytes];
        let dtype = self.stored;
        let want = self.field.shape.numel() * self.field.dtype.size();
        if out.len() != want {
            return Err(fail(format!(
                "a buffer of {} bytes for a row of {want}",
                out.len()
            )));
        }
        dtype.narrow(row, out);
        if self.field.dtype == DType::Bool && out.iter().any(|&b| b > 1) {
            return Err(fail("a bool holds a byte other than 0 or 1".into()));
        }
        Ok(())
    }
}

/// Several datasets of the same length side by side: item `i` is the
/// fields of item `i` of each (features and labels).
pub struct Zip {
    parts: Vec<Box<dyn Dataset>>,
}

impl Zip {
    /// Zips `parts`, which must all have the same length.
    pub fn new(parts: Vec<Box<dyn Dataset>>) -> Result<Zip, DataError> {
        if let Some(first) = parts.first()
            && let Some(other) = parts.iter().find(|p| p.len() != first.len())
        {
            return Err(DataError::Mismatch {
                message: format!("zip: datasets of {} and {} items", first.len(), other.len()),
            });
        }
        Ok(Zip { parts })
    }
}

impl Dataset for Zip {
    fn len(&self) -> usize {
        self.parts.first().map_or(0, |p| p.len())
    }

    fn fields(&self) -> Vec<TensorType> {
        self.parts.iter().flat_map(|p| p.fields()).collect()
    }

    fn read(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let mut f = field;
        for part in &self.parts {
            let n = part.fields().len();
            if f < n {
                return part.read(index, f, out);
            }
            f -= n;
        }
        Err(DataError::Mismatch {
            message: format!("zip: no field {field}"),
        })
    }
}
