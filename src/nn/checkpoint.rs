//! Named tensors saved to and loaded from safetensors files. Loading maps
//! the file and reads each tensor in the dtype it was stored in (f64 and
//! i64 included, unlike datasets, which narrow them: a checkpoint must give
//! back what was saved); a corrupt or truncated file is an `Err` naming the
//! file, the byte offset and what is wrong.

use std::borrow::Cow;
use std::path::Path;

use kiln_ir::{DType, Data, TensorType, bf16, f16};
use safetensors::tensor::{SafeTensorError, View};
use safetensors::{Dtype, SafeTensors};

use crate::data::{DataError, map};
use crate::{Result, Tensor};

/// The header's length comes first, as a little-endian u64.
const LENGTH_BYTES: usize = 8;

/// One tensor's bytes, as safetensors writes them.
struct Stored<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Cow<'a, [u8]>,
}

impl View for &Stored<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }

    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// The elements of `data` as little-endian bytes: borrowed on a
/// little-endian machine, where they already are.
fn le_bytes(data: &Data) -> Cow<'_, [u8]> {
    let little = cfg!(target_endian = "little");
    match data {
        Data::F32(v) if little => Cow::Borrowed(bytemuck::cast_slice(v)),
        Data::I32(v) if little => Cow::Borrowed(bytemuck::cast_slice(v)),
        Data::I64(v) if little => Cow::Borrowed(bytemuck::cast_slice(v)),
        Data::F64(v) if little => Cow::Borrowed(bytemuck::cast_slice(v)),
        Data::BF16(v) if little => Cow::Borrowed(bytemuck::cast_slice(v)),
        Data::F16(v) if little => Cow::Borrowed(bytemuck::cast_slice(v)),
        Data::F32(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::I32(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::I64(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::F64(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::BF16(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::F16(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Data::U8(v) => Cow::Borrowed(v),
        Data::Bool(v) => Cow::Owned(v.iter().map(|&b| u8::from(b)).collect()),
    }
}

/// Writes `tensors` to a safetensors file at `path`, computing those not
/// yet computed (in one graph), each in its own dtype. Names must be
/// distinct; the file is written whole to a temporary file beside `path`
/// and then renamed over it.
pub fn save<S: AsRef<str>>(path: impl AsRef<Path>, tensors: &[(S, &Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let mismatch = |message: String| DataError::Mismatch {
        message: format!("{}: {message}", path.display()),
    };
    let mut names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_ref()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(mismatch(format!("tensor '{}' is given twice", pair[0])).into());
    }
    if names.contains(&"__metadata__") {
        return Err(
            mismatch("'__metadata__' is the format's own key, not a tensor name".into()).into(),
        );
    }
    let refs: Vec<&Tensor> = tensors.iter().map(|(_, t)| *t).collect();
    crate::realize(&refs)?;
    let data = refs
        .iter()
        .map(|t| t.data_of_any_dtype())
        .collect::<Result<Vec<_>>>()?;
    let stored: Vec<Stored> = refs
        .iter()
        .zip(&data)
        .map(|(t, d)| Stored {
            dtype: match t.dtype() {
                DType::F32 => Dtype::F32,
                DType::I32 => Dtype::I32,
                DType::I64 => Dtype::I64,
                DType::F64 => Dtype::F64,
                DType::U8 => Dtype::U8,
                DType::Bool => Dtype::BOOL,
                DType::BF16 => Dtype::BF16,
                DType::F16 => Dtype::F16,
            },
            shape: t.dims().to_vec(),
            bytes: le_bytes(d),
        })
        .collect();
    let named = tensors.iter().map(|(n, _)| n.as_ref()).zip(&stored);
    safetensors::serialize_to_file(named, None, path).map_err(|e| {
        DataError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
        .into()
    })
}

/// The tensors of the safetensors file at `path` with their names, in the
/// order their bytes lie in the file (match them by name:
/// `nn::set_parameters`). f32, f64, bf16, f16, i32, i64, u8 and bool load
/// as they are; other dtypes (i8, f8, ..) are an `Err`.
pub fn load(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let file = map(path)?;
    let bytes: &[u8] = &file;
    let fail = |offset: usize, message: String| DataError::Format {
        path: path.to_path_buf(),
        offset,
        message,
    };
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| {
        let (offset, message) = explain(bytes, &e);
        fail(offset, message)
    })?;
    let mut named: Vec<(String, Tensor)> = Vec::with_capacity(tensors.len());
    let mut views: Vec<_> = tensors.iter().collect();
    // The view borrows the mapping: where its bytes start is its offset.
    // Empty tensors share offsets; their names order them.
    let offset_of = |data: &[u8]| data.as_ptr() as usize - bytes.as_ptr() as usize;
    views.sort_by_key(|&(name, ref view)| (offset_of(view.data()), name));
    for (name, view) in views {
        let offset = offset_of(view.data());
        let data = match decode(view.dtype(), view.data()) {
            Some(Ok(data)) => data,
            Some(Err(bad)) => {
                let message = format!("tensor '{name}': a bool holds a byte other than 0 or 1");
                return Err(fail(offset + bad, message).into());
            }
            None => {
                let message = format!(
                    "tensor '{name}' is {:?}; kiln reads f32, f64, bf16, f16, i32, i64, u8 and bool",
                    view.dtype()
                );
                return Err(fail(offset, message).into());
            }
        };
        let ty = TensorType::new(data.dtype(), view.shape()).checked("load")?;
        if data.len() != ty.shape.numel() {
            return Err(fail(
                offset,
                format!("tensor '{name}': {} elements for {}", data.len(), ty.shape),
            )
            .into());
        }
        named.push((name.to_string(), Tensor::from_data(ty, data)));
    }
    Ok(named)
}

/// The elements stored as `stored` in `bytes`, little-endian, in the kiln
/// dtype of the same kind; `None` for a dtype kiln has none of, and for a
/// bool byte other than 0 or 1, its index.
fn decode(stored: Dtype, bytes: &[u8]) -> Option<std::result::Result<Data, usize>> {
    fn le<const N: usize, T>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
        (bytes.chunks_exact(N))
            .map(|c| from(c.try_into().unwrap_or([0; N])))
            .collect()
    }
    Some(Ok(match stored {
        Dtype::F32 => Data::F32(le(bytes, f32::from_le_bytes)),
        Dtype::F64 => Data::F64(le(bytes, f64::from_le_bytes)),
        Dtype::BF16 => Data::BF16(le(bytes, bf16::from_le_bytes)),
        Dtype::F16 => Data::F16(le(bytes, f16::from_le_bytes)),
        Dtype::I32 => Data::I32(le(bytes, i32::from_le_bytes)),
        Dtype::I64 => Data::I64(le(bytes, i64::from_le_bytes)),
        Dtype::U8 => Data::U8(bytes.to_vec()),
        Dtype::BOOL => match bytes.iter().position(|&b| b > 1) {
            Some(bad) => return Some(Err(bad)),
            None => Data::Bool(bytes.iter().map(|&b| b == 1).collect()),
        },
        _ => return None,
    }))
}

/// Where in `bytes` the safetensors reader's `error` lies, and what it is.
fn explain(bytes: &[u8], error: &SafeTensorError) -> (usize, String) {
    let header_len = bytes
        .get(..LENGTH_BYTES)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes);
    let data_start = header_len.map_or(0, |n| LENGTH_BYTES.saturating_add(n as usize));
    match error {
        SafeTensorError::HeaderTooSmall => (
            0,
            format!(
                "truncated: {} bytes, fewer than the header's {LENGTH_BYTES}-byte length",
                bytes.len()
            ),
        ),
        SafeTensorError::HeaderTooLarge => (
            0,
            format!(
                "the header's length, {}, is past the format's limit of 100 MB",
                header_len.unwrap_or_default()
            ),
        ),
        SafeTensorError::InvalidHeaderLength => (
            0,
            format!(
                "the header's length, {}, runs past the end of the file ({} bytes)",
                header_len.unwrap_or_default(),
                bytes.len()
            ),
        ),
        SafeTensorError::InvalidHeader(e) => (
            LENGTH_BYTES + e.valid_up_to(),
            "the header is not UTF-8".into(),
        ),
        SafeTensorError::InvalidHeaderDeserialization(e) | SafeTensorError::JsonError(e) => {
            // serde_json counts lines and columns (from 1) in the header text.
            let header = &bytes[LENGTH_BYTES.min(bytes.len())..data_start.min(bytes.len())];
            let line_start: usize = header
                .split(|&b| b == b'\n')
                .take(e.line().saturating_sub(1))
                .map(|line| line.len() + 1)
                .sum();
            (
                LENGTH_BYTES + line_start + e.column().saturating_sub(1),
                format!("the header is not valid: {e}"),
            )
        }
        SafeTensorError::MetadataIncompleteBuffer => (
            data_start,
            format!(
                "the tensors the header lists do not fill the {} bytes after it exactly: \
                 the file is truncated or has bytes appended",
                bytes.len().saturating_sub(data_start)
            ),
        ),
        other => (LENGTH_BYTES, format!("the header is not valid: {other}")),
    }
}
