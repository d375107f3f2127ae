//! `Dataset`: random access to items, each a tuple of fixed-shape fields
//! (an image and its label), read straight out of memory-mapped files.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_ir::{DType, Data, DataRef, Shape, TensorType};
use safetensors::{Dtype, SafeTensors};

use super::DataError;
use super::npy::{NpyDType, NpyHeader};
use crate::Tensor;

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

    /// Item `index` as one tensor per field: for looking at single items;
    /// the loader reads batches straight into their buffers instead.
    fn get(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        self.fields()
            .into_iter()
            .enumerate()
            .map(|(f, ty)| {
                let n = ty.shape.numel();
                let mut data = Data::zeros(ty.dtype, n)
                    .map_err(|e| DataError::out_of_memory(e, "Dataset::get", &ty))?;
                match &mut data {
                    Data::F32(v) => self.read(index, f, bytemuck::cast_slice_mut(v))?,
                    Data::I32(v) => self.read(index, f, bytemuck::cast_slice_mut(v))?,
                    Data::I64(v) => self.read(index, f, bytemuck::cast_slice_mut(v))?,
                    Data::F64(v) => self.read(index, f, bytemuck::cast_slice_mut(v))?,
                    Data::BF16(v) => self.read(index, f, bytemuck::cast_slice_mut(v))?,
                    Data::F16(v) => self.read(index, f, bytemuck::cast_slice_mut(v))?,
                    Data::U8(v) => self.read(index, f, v)?,
                    Data::Bool(v) => {
                        let mut bytes = vec![0u8; n];
                        self.read(index, f, &mut bytes)?;
                        v.iter_mut().zip(&bytes).for_each(|(v, &b)| *v = b != 0);
                    }
                }
                Ok(Tensor::from_data(ty, data))
            })
            .collect()
    }

    /// Field `field` of the items `items`, in place, when the file holds
    /// them one after another exactly as they lie in memory: a batch of them
    /// is then a view of the file, not a copy. `None` when they must be read.
    fn mapped(&self, field: usize, items: Range<usize>) -> Option<Mapped> {
        let _ = (field, items);
        None
    }
}

/// Elements of one dtype lying in a memory-mapped file exactly as in
/// memory (little-endian, aligned), kept mapped while anyone holds them.
#[derive(Clone)]
pub struct Mapped {
    map: Arc<memmap2::Mmap>,
    start: usize,
    len: usize,
    dtype: DType,
}

impl Mapped {
    /// `len` elements of `dtype` from byte `start` of `map`, if they lie
    /// inside it and can be borrowed as they are: aligned, little-endian on
    /// a little-endian machine, and not bool (whose bytes must be checked).
    fn new(map: Arc<memmap2::Mmap>, start: usize, len: usize, dtype: DType) -> Option<Mapped> {
        let bytes = map.get(start..start.checked_add(len.checked_mul(dtype.size())?)?)?;
        let fits = match dtype {
            DType::F32 => bytemuck::try_cast_slice::<u8, f32>(bytes).is_ok(),
            DType::I32 => bytemuck::try_cast_slice::<u8, i32>(bytes).is_ok(),
            DType::I64 => bytemuck::try_cast_slice::<u8, i64>(bytes).is_ok(),
            DType::F64 => bytemuck::try_cast_slice::<u8, f64>(bytes).is_ok(),
            DType::BF16 => bytemuck::try_cast_slice::<u8, kiln_ir::bf16>(bytes).is_ok(),
            DType::F16 => bytemuck::try_cast_slice::<u8, kiln_ir::f16>(bytes).is_ok(),
            DType::U8 => true,
            DType::Bool => false,
        };
        (fits && cfg!(target_endian = "little")).then_some(Mapped {
            map,
            start,
            len,
            dtype,
        })
    }

    /// The elements.
    pub fn data(&self) -> DataRef<'_> {
        let bytes = &self.map[self.start..self.start + self.len * self.dtype.size()];
        // `new` checked the range, the alignment and the dtype.
        match self.dtype {
            DType::F32 => DataRef::F32(bytemuck::cast_slice(bytes)),
            DType::I32 => DataRef::I32(bytemuck::cast_slice(bytes)),
            DType::I64 => DataRef::I64(bytemuck::cast_slice(bytes)),
            DType::F64 => DataRef::F64(bytemuck::cast_slice(bytes)),
            DType::BF16 => DataRef::BF16(bytemuck::cast_slice(bytes)),
            DType::F16 => DataRef::F16(bytemuck::cast_slice(bytes)),
            DType::U8 | DType::Bool => DataRef::U8(bytes),
        }
    }
}

impl fmt::Debug for Mapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Mapped({} x {} at byte {})",
            self.len, self.dtype, self.start
        )
    }
}

/// The rows of one memory-mapped array (a `.npy` file, or one tensor of a
/// safetensors file) as items of one field: row `i` of the first axis is
/// item `i`, read in place.
pub struct ArrayDataset {
    path: PathBuf,
    map: Arc<memmap2::Mmap>,
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
        let Some(stored) = stored_dtype(view.dtype()) else {
            return Err(fail(format!(
                "tensor '{name}' has unsupported dtype {:?}",
                view.dtype()
            )));
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
            map: Arc::new(map),
            offset,
            stored,
            rows,
            field: TensorType::new(stored.dtype(), Shape::new(row)),
            row_bytes: row.iter().product::<usize>() * stored.size(),
        })
    }
}

/// How kiln reads elements stored as safetensors' `dtype`: the dtypes it
/// holds, and f64 and i64 narrowed as in `.npy` files; `None` for the rest.
fn stored_dtype(dtype: Dtype) -> Option<NpyDType> {
    Some(match dtype {
        Dtype::F32 => NpyDType::F32,
        Dtype::F64 => NpyDType::F64,
        Dtype::F16 => NpyDType::F16,
        Dtype::I32 => NpyDType::I32,
        Dtype::I64 => NpyDType::I64,
        Dtype::U8 => NpyDType::U8,
        Dtype::BOOL => NpyDType::Bool,
        _ => return None,
    })
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

    fn mapped(&self, field: usize, items: Range<usize>) -> Option<Mapped> {
        // Stored as the field's dtype: not narrowed from f64 or i64.
        if field != 0 || items.end > self.rows || self.stored.size() != self.field.dtype.size() {
            return None;
        }
        Mapped::new(
            self.map.clone(),
            self.offset + items.start * self.row_bytes,
            items.len() * self.field.shape.numel(),
            self.field.dtype,
        )
    }
}

/// Several datasets of the same length side by side: item `i` is the
/// fields of item `i` of each (features and labels).
pub struct Zip {
    parts: Vec<Box<dyn Dataset>>,
    /// The fields of all parts, in order, and the part and field each is.
    fields: Vec<TensorType>,
    owners: Vec<(usize, usize)>,
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
        let mut fields = Vec::new();
        let mut owners = Vec::new();
        for (p, part) in parts.iter().enumerate() {
            for (f, field) in part.fields().into_iter().enumerate() {
                fields.push(field);
                owners.push((p, f));
            }
        }
        Ok(Zip {
            parts,
            fields,
            owners,
        })
    }
}

impl Dataset for Zip {
    fn len(&self) -> usize {
        self.parts.first().map_or(0, |p| p.len())
    }

    fn fields(&self) -> Vec<TensorType> {
        self.fields.clone()
    }

    fn read(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        match self.owners.get(field) {
            Some(&(p, f)) => self.parts[p].read(index, f, out),
            None => Err(DataError::Mismatch {
                message: format!("zip: no field {field}"),
            }),
        }
    }

    fn mapped(&self, field: usize, items: Range<usize>) -> Option<Mapped> {
        let &(p, f) = self.owners.get(field)?;
        self.parts[p].mapped(f, items)
    }
}

/// A contiguous run of another dataset's items, such as a train or test
/// split: item `i` is item `range.start + i` of the whole.
pub struct Subset {
    whole: Arc<dyn Dataset>,
    range: Range<usize>,
}

impl Subset {
    /// The items `range` of `whole`, which must lie inside it.
    pub fn new(whole: Arc<dyn Dataset>, range: Range<usize>) -> Result<Subset, DataError> {
        if range.start > range.end || range.end > whole.len() {
            return Err(DataError::Mismatch {
                message: format!(
                    "subset: items {range:?} of a dataset of {} items",
                    whole.len()
                ),
            });
        }
        Ok(Subset { whole, range })
    }
}

impl Dataset for Subset {
    fn len(&self) -> usize {
        self.range.len()
    }

    fn fields(&self) -> Vec<TensorType> {
        self.whole.fields()
    }

    fn read(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        if index >= self.len() {
            return Err(DataError::Mismatch {
                message: format!("subset: no item {index} of {}", self.len()),
            });
        }
        self.whole.read(self.range.start + index, field, out)
    }

    fn mapped(&self, field: usize, items: Range<usize>) -> Option<Mapped> {
        if items.end > self.len() {
            return None;
        }
        let start = self.range.start;
        self.whole
            .mapped(field, start + items.start..start + items.end)
    }
}
