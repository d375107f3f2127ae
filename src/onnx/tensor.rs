//! ONNX tensors on the host: `TensorProto` payloads converted to `Array`s
//! of kiln's dtypes (f32, f64, i32, i64, u8, bool).

use std::collections::HashMap;
use std::path::{Component, Path};

use kiln_ir::{DType, Data, Shape, TensorType, bf16, f16};

use super::OnnxError;
use super::proto::{GraphProto, TensorProto};
use crate::Tensor;

/// The `TensorProto.DataType` numbers of onnx.proto.
pub(super) mod code {
    pub const FLOAT: i64 = 1;
    pub const UINT8: i64 = 2;
    pub const INT32: i64 = 6;
    pub const INT64: i64 = 7;
    pub const BOOL: i64 = 9;
    pub const DOUBLE: i64 = 11;
    pub const FLOAT16: i64 = 10;
    pub const BFLOAT16: i64 = 16;
}

/// The name onnx.proto gives a `DataType` number, for errors.
pub(super) fn dtype_name(code: i64) -> &'static str {
    const NAMES: [&str; 27] = [
        "UNDEFINED",
        "FLOAT",
        "UINT8",
        "INT8",
        "UINT16",
        "INT16",
        "INT32",
        "INT64",
        "STRING",
        "BOOL",
        "FLOAT16",
        "DOUBLE",
        "UINT32",
        "UINT64",
        "COMPLEX64",
        "COMPLEX128",
        "BFLOAT16",
        "FLOAT8E4M3FN",
        "FLOAT8E4M3FNUZ",
        "FLOAT8E5M2",
        "FLOAT8E5M2FNUZ",
        "UINT4",
        "INT4",
        "FLOAT4E2M1",
        "FLOAT8E8M0",
        "UINT2",
        "INT2",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("an unknown data type")
}

/// The kiln dtype of an ONNX `DataType`, or `None` where kiln has none.
pub(super) fn kiln_dtype(code: i64) -> Option<DType> {
    match code {
        code::FLOAT => Some(DType::F32),
        code::INT32 => Some(DType::I32),
        code::INT64 => Some(DType::I64),
        code::DOUBLE => Some(DType::F64),
        code::UINT8 => Some(DType::U8),
        code::BOOL => Some(DType::Bool),
        code::FLOAT16 => Some(DType::F16),
        code::BFLOAT16 => Some(DType::BF16),
        _ => None,
    }
}

/// The `DataType` number of a kiln dtype.
pub(super) fn onnx_code(dtype: DType) -> i64 {
    match dtype {
        DType::F32 => code::FLOAT,
        DType::I32 => code::INT32,
        DType::I64 => code::INT64,
        DType::F64 => code::DOUBLE,
        DType::U8 => code::UINT8,
        DType::Bool => code::BOOL,
        DType::F16 => code::FLOAT16,
        DType::BF16 => code::BFLOAT16,
    }
}

/// A tensor of an ONNX file on the host: an initializer, a `Constant`, a
/// test's input or expected output.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    /// The dimensions, outermost first.
    pub dims: Vec<usize>,
    /// The elements in row-major order.
    pub data: Data,
}

impl Array {
    /// The ONNX `DataType` number of the elements.
    pub fn onnx_dtype(&self) -> i64 {
        onnx_code(self.data.dtype())
    }

    /// The ONNX name of the element type (`FLOAT`, `INT64`, ...).
    pub fn dtype_name(&self) -> &'static str {
        dtype_name(self.onnx_dtype())
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An i64 array.
    pub(super) fn i64(dims: Vec<usize>, values: Vec<i64>) -> Array {
        Array {
            dims,
            data: Data::I64(values),
        }
    }

    /// The integers held, whatever their integer type; `None` for floats
    /// and bools.
    pub(super) fn ints(&self) -> Option<Vec<i64>> {
        match &self.data {
            Data::I64(v) => Some(v.clone()),
            Data::I32(v) => Some(v.iter().map(|&x| i64::from(x)).collect()),
            Data::U8(v) => Some(v.iter().map(|&x| i64::from(x)).collect()),
            Data::F32(_) | Data::F64(_) | Data::BF16(_) | Data::F16(_) | Data::Bool(_) => None,
        }
    }

    /// The array as a kiln tensor. One of rank 0 is a constant of the
    /// graph (`Tensor::scalar`), which kernels read inline, as kiln's own
    /// scalars.
    pub fn to_tensor(&self) -> Tensor {
        let d = &self.data;
        if self.dims.is_empty() && d.len() == 1 {
            return Tensor::scalar(d.get(0));
        }
        Tensor::from_data(
            TensorType::new(d.dtype(), Shape::new(&self.dims)),
            d.clone(),
        )
    }
}

/// Reads the payload of every tensor of `graph` (initializers and node
/// attributes) that is stored outside the model `file` into its
/// `raw_data`, from the file its `location` names in `folder`, bytes
/// `offset` to `offset + length` (to the end without a `length`). A
/// location must stay inside `folder` (relative, no `..`), as ONNX's
/// checker asks; a file that is missing or too short is an `Err` naming it
/// and the bytes.
pub(super) fn read_external(
    graph: &mut GraphProto,
    folder: &Path,
    file: &str,
) -> Result<(), OnnxError> {
    let attributes = graph.nodes.iter_mut().flat_map(|n| n.attributes.iter_mut());
    let tensors = (graph.initializers.iter_mut()).chain(attributes.filter_map(|a| a.t.as_mut()));
    let mut files: HashMap<String, Vec<u8>> = HashMap::new();
    for t in tensors.filter(|t| t.external) {
        let invalid = |message: String| OnnxError::Tensor {
            file: file.to_string(),
            name: t.name.clone(),
            what: message,
        };
        let get = |key: &str| {
            (t.external_data.iter())
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let number = |key: &str| -> Result<Option<usize>, OnnxError> {
            get(key)
                .map(|v| {
                    v.parse::<usize>()
                        .map_err(|_| invalid(format!("external data {key} '{v}' is no byte count")))
                })
                .transpose()
        };
        let location =
            get("location").ok_or_else(|| invalid("its external data names no location".into()))?;
        let relative = Path::new(location);
        if relative.is_absolute()
            || !relative
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(invalid(format!(
                "its external data's location '{location}' leaves the model's folder"
            )));
        }
        let path = folder.join(relative);
        let shown = path.display().to_string();
        if !files.contains_key(location) {
            let bytes = std::fs::read(&path).map_err(|e| OnnxError::Io {
                file: shown.clone(),
                message: e.to_string(),
            })?;
            files.insert(location.to_string(), bytes);
        }
        let bytes = &files[location];
        let offset = number("offset")?.unwrap_or(0);
        let end = match number("length")? {
            Some(length) => offset.checked_add(length),
            None => Some(bytes.len()),
        };
        let payload = end
            .filter(|&end| offset <= end && end <= bytes.len())
            .map(|end| &bytes[offset..end])
            .ok_or_else(|| OnnxError::Decode {
                file: shown.clone(),
                offset,
                message: format!(
                    "tensor '{}' needs bytes from {offset} to {} of a {}-byte file",
                    t.name,
                    end.map_or("beyond".to_string(), |e| e.to_string()),
                    bytes.len()
                ),
            })?;
        t.raw_data = Some(payload.to_vec());
        t.external = false;
        t.external_data.clear();
    }
    Ok(())
}

/// Converts a decoded `TensorProto` of `file` to an `Array`: its payload
/// comes from `raw_data` (little-endian) or from the typed field that
/// onnx.proto names for its `DataType`.
pub(super) fn array(t: &TensorProto, file: &str) -> Result<Array, OnnxError> {
    let invalid = |message: String| OnnxError::Decode {
        file: file.to_string(),
        offset: t.offset,
        message: format!("TensorProto '{}': {message}", t.name),
    };
    let unsupported = |what: String| OnnxError::Tensor {
        file: file.to_string(),
        name: t.name.clone(),
        what,
    };
    if t.external {
        return Err(unsupported(
            "its data is stored outside the file (Model::load reads it from beside the model)"
                .into(),
        ));
    }
    if t.segment {
        return Err(unsupported("it is a segment of a larger tensor".into()));
    }
    let dims = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| invalid(format!("negative dimension {d}"))))
        .collect::<Result<Vec<usize>, _>>()?;
    let n = Shape::new(&dims)
        .checked_numel()
        .ok_or_else(|| invalid(format!("dimensions {dims:?} overflow")))?;
    let ty = t.data_type;
    let long = |c: &[u8]| [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
    let values = match &t.raw_data {
        Some(raw) => {
            let size = match ty {
                code::FLOAT | code::INT32 => 4,
                code::INT64 | code::DOUBLE => 8,
                code::FLOAT16 | code::BFLOAT16 => 2,
                code::UINT8 | code::BOOL => 1,
                _ => 0,
            };
            if size != 0 && raw.len() != n.saturating_mul(size) {
                return Err(invalid(format!(
                    "{} bytes of raw data for {n} elements of {}",
                    raw.len(),
                    dtype_name(ty)
                )));
            }
            match ty {
                code::FLOAT => Data::F32(
                    raw.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                ),
                code::INT32 => Data::I32(
                    raw.chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                ),
                code::INT64 => Data::I64(
                    raw.chunks_exact(8)
                        .map(|c| i64::from_le_bytes(long(c)))
                        .collect(),
                ),
                code::DOUBLE => Data::F64(
                    raw.chunks_exact(8)
                        .map(|c| f64::from_le_bytes(long(c)))
                        .collect(),
                ),
                code::UINT8 => Data::U8(raw.clone()),
                code::BOOL => Data::Bool(raw.iter().map(|&b| b != 0).collect()),
                code::FLOAT16 => Data::F16(
                    raw.chunks_exact(2)
                        .map(|c| f16::from_le_bytes([c[0], c[1]]))
                        .collect(),
                ),
                code::BFLOAT16 => Data::BF16(
                    raw.chunks_exact(2)
                        .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                        .collect(),
                ),
                _ => return Err(unsupported(format!("its type is {}", dtype_name(ty)))),
            }
        }
        None => match ty {
            code::FLOAT => Data::F32(t.float_data.clone()),
            // int32_data holds INT32, UINT8 and BOOL, one value per element.
            code::INT32 => Data::I32(t.int32_data.iter().map(|&v| v as i32).collect()),
            code::UINT8 => Data::U8(t.int32_data.iter().map(|&v| v as u8).collect()),
            code::BOOL => Data::Bool(t.int32_data.iter().map(|&v| v != 0).collect()),
            // and FLOAT16 and BFLOAT16 as their bits.
            code::FLOAT16 => Data::F16(
                t.int32_data
                    .iter()
                    .map(|&v| f16::from_bits(v as u16))
                    .collect(),
            ),
            code::BFLOAT16 => Data::BF16(
                t.int32_data
                    .iter()
                    .map(|&v| bf16::from_bits(v as u16))
                    .collect(),
            ),
            code::INT64 => Data::I64(t.int64_data.clone()),
            code::DOUBLE => Data::F64(t.double_data.clone()),
            _ => return Err(unsupported(format!("its type is {}", dtype_name(ty)))),
        },
    };
    let array = Array { dims, data: values };
    if array.len() != n {
        return Err(invalid(format!(
            "{} values for dimensions {:?}",
            array.len(),
            array.dims
        )));
    }
    Ok(array)
}
