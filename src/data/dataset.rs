//! `Dataset`: random access to items, each a tuple of fixed-shape fields
//! (an image and its label), read straight out of memory-mapped files.

use std::path::Path;

use kiln_ir::{DType, Shape, TensorType};

use super::DataError;
use super::npy::{NpyArray, NpyDType};

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

/// The rows of one `.npy` array as items of one field.
pub struct NpyDataset {
    array: NpyArray,
    field: TensorType,
    /// Bytes of one row in the file.
    row_bytes: usize,
}

impl NpyDataset {
    /// Maps the array at `path`; its first axis indexes the items.
    pub fn open(path: impl AsRef<Path>) -> Result<NpyDataset, DataError> {
        let array = NpyArray::open(path)?;
        let header = array.header();
        let Some((_, row)) = header.shape.split_first() else {
            return Err(DataError::Format {
                path: array.path().to_path_buf(),
                offset: 0,
                message: "a rank-0 array has no rows to serve as items".into(),
            });
        };
        let field = TensorType::new(header.dtype.dtype(), Shape::new(row));
        let row_bytes = row.iter().product::<usize>() * header.dtype.size();
        Ok(NpyDataset {
            array,
            field,
            row_bytes,
        })
    }
}

impl Dataset for NpyDataset {
    fn len(&self) -> usize {
        self.array.header().shape.first().copied().unwrap_or(0)
    }

    fn fields(&self) -> Vec<TensorType> {
        vec![self.field.clone()]
    }

    fn read(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        let fail = |message: String| DataError::Item {
            path: self.array.path().to_path_buf(),
            index,
            message,
        };
        if field != 0 || index >= self.len() {
            return Err(fail(format!(
                "no field {field} of item {index} in {} items",
                self.len()
            )));
        }
        let row = &self.array.bytes()[index * self.row_bytes..(index + 1) * self.row_bytes];
        let dtype = self.array.header().dtype;
        let want = self.field.shape.numel() * self.field.dtype.size();
        if out.len() != want {
            return Err(fail(format!(
                "a buffer of {} bytes for a row of {want}",
                out.len()
            )));
        }
        match dtype {
            NpyDType::F32 | NpyDType::I32 | NpyDType::U8 | NpyDType::Bool => {
                out.copy_from_slice(row)
            }
            // Narrowed to the kiln dtype, four bytes per element.
            NpyDType::F64 => {
                for (o, b) in out.chunks_exact_mut(4).zip(row.chunks_exact(8)) {
                    let v = f64::from_le_bytes(b.try_into().unwrap_or_default()) as f32;
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            NpyDType::I64 => {
                for (o, b) in out.chunks_exact_mut(4).zip(row.chunks_exact(8)) {
                    let v = i64::from_le_bytes(b.try_into().unwrap_or_default()) as i32;
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
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
