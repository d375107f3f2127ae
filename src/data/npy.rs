//! `.npy` files: a header parser that checks everything the header claims
//! against the file, and memory-mapped arrays whose rows are read in place.
//!
//! The format (NumPy's `format.py`): the magic `\x93NUMPY`, a major and a
//! minor version byte, the header length (u16 for version 1, u32 for 2 and
//! 3, little-endian), then the header, a Python dict literal
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (60000, 28, 28), }`
//! padded with spaces and ended by a newline, then the data.
//!
//! Supported: little-endian f32, f64, i32, i64, u8 and bool, C order.
//! Anything else, and any header that does not match the file byte for
//! byte, is an `Err` naming the file, the offset and what is wrong.

use std::path::{Path, PathBuf};

use kiln_ir::{DType, Data, Shape, TensorType};

use super::DataError;
use crate::{Result, Tensor};

const MAGIC: &[u8] = b"\x93NUMPY";

/// The element type stored in a `.npy` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpyDType {
    /// `<f4`
    F32,
    /// `<f8`, read as f32
    F64,
    /// `<f2`
    F16,
    /// `<i4`
    I32,
    /// `<i8`, read as i32 (wrapping)
    I64,
    /// `|u1`
    U8,
    /// `|b1`
    Bool,
}

impl NpyDType {
    fn from_descr(descr: &str) -> Option<NpyDType> {
        Some(match descr {
            "<f4" => NpyDType::F32,
            "<f8" => NpyDType::F64,
            "<f2" => NpyDType::F16,
            "<i4" => NpyDType::I32,
            "<i8" => NpyDType::I64,
            "|u1" | "<u1" | "u1" => NpyDType::U8,
            "|b1" | "<b1" | "b1" => NpyDType::Bool,
            _ => return None,
        })
    }

    /// The `descr` the writer puts in headers.
    pub fn descr(self) -> &'static str {
        match self {
            NpyDType::F32 => "<f4",
            NpyDType::F64 => "<f8",
            NpyDType::F16 => "<f2",
            NpyDType::I32 => "<i4",
            NpyDType::I64 => "<i8",
            NpyDType::U8 => "|u1",
            NpyDType::Bool => "|b1",
        }
    }

    /// Bytes per element in the file.
    pub fn size(self) -> usize {
        match self {
            NpyDType::F32 | NpyDType::I32 => 4,
            NpyDType::F64 | NpyDType::I64 => 8,
            NpyDType::F16 => 2,
            NpyDType::U8 | NpyDType::Bool => 1,
        }
    }

    /// Copies `stored` elements of this type into `out` as little-endian
    /// elements of the kiln dtype they are read as (f64 rounded to f32, i64
    /// wrapped to i32); `out` holds exactly that many bytes.
    pub(crate) fn narrow(self, stored: &[u8], out: &mut [u8]) {
        match self {
            NpyDType::F32 | NpyDType::F16 | NpyDType::I32 | NpyDType::U8 | NpyDType::Bool => {
                out.copy_from_slice(stored)
            }
            NpyDType::F64 => {
                for (o, b) in out.chunks_exact_mut(4).zip(stored.chunks_exact(8)) {
                    let v = f64::from_le_bytes(b.try_into().unwrap_or_default()) as f32;
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            NpyDType::I64 => {
                for (o, b) in out.chunks_exact_mut(4).zip(stored.chunks_exact(8)) {
                    let v = i64::from_le_bytes(b.try_into().unwrap_or_default()) as i32;
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }

    /// The kiln dtype the elements are read as.
    pub fn dtype(self) -> DType {
        match self {
            NpyDType::F32 | NpyDType::F64 => DType::F32,
            NpyDType::F16 => DType::F16,
            NpyDType::I32 | NpyDType::I64 => DType::I32,
            NpyDType::U8 => DType::U8,
            NpyDType::Bool => DType::Bool,
        }
    }
}

/// What a valid header says: element type, shape, and where the data starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// The element type.
    pub dtype: NpyDType,
    /// The dimensions.
    pub shape: Vec<usize>,
    /// The offset of the first data byte.
    pub data_offset: usize,
}

impl NpyHeader {
    /// Parses and checks the header of `bytes`, the whole file at `path`:
    /// the data that follows must be exactly as long as the shape says.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<NpyHeader, DataError> {
        let fail = |offset: usize, message: String| DataError::Format {
            path: path.to_path_buf(),
            offset,
            message,
        };
        if bytes.len() < 8 || &bytes[..6] != MAGIC {
            return Err(fail(0, "not a .npy file: bad magic".into()));
        }
        let (major, minor) = (bytes[6], bytes[7]);
        let (len_bytes, text_utf8) = match major {
            1 => (2, false),
            2 => (4, false),
            3 => (4, true),
            _ => return Err(fail(6, format!("unsupported .npy version {major}.{minor}"))),
        };
        let start = 8 + len_bytes;
        if bytes.len() < start {
            return Err(fail(8, "truncated header length".into()));
        }
        let header_len = bytes[8..start]
            .iter()
            .rev()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        let end = start
            .checked_add(header_len)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| {
                fail(
                    8,
                    format!(
                        "header of {header_len} bytes runs past the end of the file ({} bytes)",
                        bytes.len()
                    ),
                )
            })?;
        let raw = &bytes[start..end];
        let text = match std::str::from_utf8(raw) {
            Ok(t) if text_utf8 || t.is_ascii() => t,
            _ => return Err(fail(start, "the header is not text".into())),
        };
        let dict = Dict::parse(text).map_err(|(at, message)| fail(start + at, message))?;
        let descr = dict
            .descr
            .ok_or_else(|| fail(start, "the header has no 'descr'".into()))?;
        let dtype = NpyDType::from_descr(&descr)
            .ok_or_else(|| fail(start, format!("unsupported dtype '{descr}'")))?;
        match dict.fortran_order {
            Some(false) => {}
            Some(true) => return Err(fail(start, "Fortran-order arrays are not supported".into())),
            None => return Err(fail(start, "the header has no 'fortran_order'".into())),
        }
        let shape = dict
            .shape
            .ok_or_else(|| fail(start, "the header has no 'shape'".into()))?;
        let expected = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| fail(start, format!("shape {shape:?} is too large")))?;
        let actual = bytes.len() - end;
        if actual != expected {
            return Err(fail(
                end,
                format!(
                    "shape {shape:?} of {descr} needs {expected} data bytes, the file holds {actual}"
                ),
            ));
        }
        Ok(NpyHeader {
            dtype,
            shape,
            data_offset: end,
        })
    }
}

/// The three keys of a header dict.
#[derive(Default)]
struct Dict {
    descr: Option<String>,
    fortran_order: Option<bool>,
    shape: Option<Vec<usize>>,
}

impl Dict {
    /// Parses the Python literal; an error carries the offset in `text`.
    fn parse(text: &str) -> Result<Dict, (usize, String)> {
        let mut p = Parser { text, at: 0 };
        let mut dict = Dict::default();
        p.expect('{')?;
        loop {
            if p.eat('}') {
                break;
            }
            let key = p.string()?;
            p.expect(':')?;
            match key.as_str() {
                "descr" => dict.descr = Some(p.string()?),
                "fortran_order" => dict.fortran_order = Some(p.boolean()?),
                "shape" => dict.shape = Some(p.tuple()?),
                other => return Err((p.at, format!("unexpected key '{other}' in the header"))),
            }
            if !p.eat(',') {
                p.expect('}')?;
                break;
            }
        }
        p.skip_space();
        if p.at != text.len() {
            return Err((p.at, "unexpected text after the header dict".into()));
        }
        Ok(dict)
    }
}

struct Parser<'t> {
    text: &'t str,
    at: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_space();
        if self.text[self.at..].starts_with(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), (usize, String)> {
        if self.eat(c) {
            Ok(())
        } else {
            Err((self.at, format!("expected '{c}' in the header")))
        }
    }

    fn string(&mut self) -> Result<String, (usize, String)> {
        self.skip_space();
        let quote = match self.text[self.at..].chars().next() {
            Some(q @ ('\'' | '"')) => q,
            _ => return Err((self.at, "expected a quoted string in the header".into())),
        };
        let body = &self.text[self.at + 1..];
        let len = body
            .find(quote)
            .ok_or((self.at, "unterminated string in the header".to_string()))?;
        let s = body[..len].to_string();
        self.at += len + 2;
        Ok(s)
    }

    fn boolean(&mut self) -> Result<bool, (usize, String)> {
        self.skip_space();
        for (word, value) in [("True", true), ("False", false)] {
            if self.text[self.at..].starts_with(word) {
                self.at += word.len();
                return Ok(value);
            }
        }
        Err((self.at, "expected True or False in the header".into()))
    }

    /// `()`, `(n,)`, `(a, b)`, `(a, b,)`.
    fn tuple(&mut self) -> Result<Vec<usize>, (usize, String)> {
        self.expect('(')?;
        let mut dims = Vec::new();
        loop {
            if self.eat(')') {
                return Ok(dims);
            }
            self.skip_space();
            let digits = self.text[self.at..].len()
                - self.text[self.at..]
                    .trim_start_matches(|c: char| c.is_ascii_digit())
                    .len();
            let d = self.text[self.at..self.at + digits]
                .parse::<usize>()
                .map_err(|_| (self.at, "expected a dimension in the shape".to_string()))?;
            self.at += digits;
            dims.push(d);
            if !self.eat(',') {
                self.expect(')')?;
                return Ok(dims);
            }
        }
    }
}

/// Writes a `.npy` file (version 1.0, C order) of `shape` holding `data`,
/// the raw little-endian elements of `dtype`.
pub fn write_npy(
    path: &Path,
    dtype: NpyDType,
    shape: &[usize],
    data: &[u8],
) -> Result<(), DataError> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_text}, }}",
        dtype.descr()
    );
    // Pad so that the data starts on a 64-byte boundary, as NumPy does.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + data.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&[1, 0]);
    let len = u16::try_from(header.len()).map_err(|_| DataError::Format {
        path: path.to_path_buf(),
        offset: 8,
        message: "header too long for version 1".into(),
    })?;
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).map_err(|e| DataError::io(path, &e))
}

/// A memory-mapped `.npy` array.
pub struct NpyArray {
    path: PathBuf,
    map: memmap2::Mmap,
    header: NpyHeader,
}

impl NpyArray {
    /// Maps and checks the file.
    pub fn open(path: impl AsRef<Path>) -> Result<NpyArray, DataError> {
        let path = path.as_ref();
        let map = super::map(path)?;
        let header = NpyHeader::parse(path, &map)?;
        Ok(NpyArray {
            path: path.to_path_buf(),
            map,
            header,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn header(&self) -> &NpyHeader {
        &self.header
    }

    /// The raw bytes of all the data, in place in the mapping.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.header.data_offset..]
    }

    /// Rows `start..end` of the first axis as a tensor of the kiln dtype
    /// (f64 rounded to f32, i64 wrapped to i32), copied out of the mapping.
    pub fn rows(&self, start: usize, end: usize) -> Result<Tensor> {
        let shape = &self.header.shape;
        let count = shape.first().copied().unwrap_or(1);
        if start > end || end > count {
            return Err(kiln_ir::Error::Slice {
                shape: Shape::new(shape),
                axis: 0,
                start,
                end,
                step: 1,
            }
            .into());
        }
        let row: usize = shape.iter().skip(1).product();
        let size = self.header.dtype.size();
        let bytes = &self.bytes()[start * row * size..end * row * size];
        let mut dims = shape.clone();
        if let Some(first) = dims.first_mut() {
            *first = end - start;
        }
        let dtype = self.header.dtype;
        let ty = TensorType::new(dtype.dtype(), dims);
        let mut data = Data::zeros(ty.dtype, ty.shape.numel()).map_err(|e| e.in_op("rows", &ty))?;
        match &mut data {
            Data::F32(v) => dtype.narrow(bytes, bytemuck::cast_slice_mut(v)),
            Data::I32(v) => dtype.narrow(bytes, bytemuck::cast_slice_mut(v)),
            Data::F16(v) => dtype.narrow(bytes, bytemuck::cast_slice_mut(v)),
            // `NpyDType::dtype` narrows 64-bit files to f32 and i32, so that
            // datasets feed what losses take, and no `.npy` holds bf16:
            // these arms are never reached.
            Data::I64(v) => dtype.narrow(bytes, bytemuck::cast_slice_mut(v)),
            Data::F64(v) => dtype.narrow(bytes, bytemuck::cast_slice_mut(v)),
            Data::BF16(v) => dtype.narrow(bytes, bytemuck::cast_slice_mut(v)),
            Data::U8(v) => dtype.narrow(bytes, v),
            Data::Bool(v) => {
                for (o, &b) in v.iter_mut().zip(bytes) {
                    *o = b != 0;
                }
            }
        }
        Ok(Tensor::from_data(ty, data))
    }
}
