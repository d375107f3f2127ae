//! Host data: dense arrays of elements (`Data`), borrowed ones
//! (`DataRef`), the Rust element types behind them (`Element`), and
//! allocation that fails with an `Err` (`OutOfMemory`, `try_capacity`).

use std::fmt;

use half::{bf16, f16};

use crate::Error;
use crate::types::{DType, Scalar};

/// A dense, row-major array of elements on the host: what graph inputs are fed
/// with and what the interpreter returns.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// f32 elements.
    F32(Vec<f32>),
    /// i32 elements.
    I32(Vec<i32>),
    /// i64 elements.
    I64(Vec<i64>),
    /// f64 elements.
    F64(Vec<f64>),
    /// u8 elements.
    U8(Vec<u8>),
    /// bool elements.
    Bool(Vec<bool>),
    /// bfloat16 elements.
    BF16(Vec<bf16>),
    /// binary16 elements.
    F16(Vec<f16>),
}

impl Data {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::F64(_) => DType::F64,
            Data::U8(_) => DType::U8,
            Data::Bool(_) => DType::Bool,
            Data::BF16(_) => DType::BF16,
            Data::F16(_) => DType::F16,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::U8(v) => v.len(),
            Data::Bool(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::F16(v) => v.len(),
        }
    }

    /// The bytes its buffer holds, room beyond its elements included.
    pub fn capacity_bytes(&self) -> usize {
        let elements = match self {
            Data::F32(v) => v.capacity(),
            Data::I32(v) => v.capacity(),
            Data::I64(v) => v.capacity(),
            Data::F64(v) => v.capacity(),
            Data::U8(v) => v.capacity(),
            Data::Bool(v) => v.capacity(),
            Data::BF16(v) => v.capacity(),
            Data::F16(v) => v.capacity(),
        };
        elements * self.dtype().size()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element at `i`.
    pub fn get(&self, i: usize) -> Scalar {
        match self {
            Data::F32(v) => Scalar::F32(v[i]),
            Data::I32(v) => Scalar::I32(v[i]),
            Data::I64(v) => Scalar::I64(v[i]),
            Data::F64(v) => Scalar::F64(v[i]),
            Data::U8(v) => Scalar::U8(v[i]),
            Data::Bool(v) => Scalar::Bool(v[i]),
            Data::BF16(v) => Scalar::BF16(v[i]),
            Data::F16(v) => Scalar::F16(v[i]),
        }
    }

    /// `n` zeros (false for bool) of `dtype`, or the bytes that could not be
    /// had.
    pub fn zeros(dtype: DType, n: usize) -> Result<Data, OutOfMemory> {
        Ok(match dtype {
            DType::F32 => Data::F32(try_vec(n, 0.0)?),
            DType::I32 => Data::I32(try_vec(n, 0)?),
            DType::I64 => Data::I64(try_vec(n, 0)?),
            DType::F64 => Data::F64(try_vec(n, 0.0)?),
            DType::U8 => Data::U8(try_vec(n, 0)?),
            DType::Bool => Data::Bool(try_vec(n, false)?),
            DType::BF16 => Data::BF16(try_vec(n, bf16::ZERO)?),
            DType::F16 => Data::F16(try_vec(n, f16::ZERO)?),
        })
    }

    /// A copy, or the bytes that could not be had.
    pub fn try_clone(&self) -> Result<Data, OutOfMemory> {
        DataRef::from(self).try_to_data()
    }

    /// `n` elements of `dtype`, the `i`-th being `f(i)` converted to `dtype`,
    /// or the bytes that could not be had.
    pub fn from_fn(
        dtype: DType,
        n: usize,
        f: impl FnMut(usize) -> Scalar,
    ) -> Result<Data, OutOfMemory> {
        fn build<T: Element>(
            n: usize,
            mut f: impl FnMut(usize) -> Scalar,
        ) -> Result<Vec<T>, OutOfMemory> {
            let mut v = try_capacity(n)?;
            // `cast` to T's own dtype always yields T, so the default is never used.
            v.extend((0..n).map(|i| T::from_scalar(f(i).cast(T::DTYPE)).unwrap_or_default()));
            Ok(v)
        }
        Ok(match dtype {
            DType::F32 => Data::F32(build(n, f)?),
            DType::I32 => Data::I32(build(n, f)?),
            DType::I64 => Data::I64(build(n, f)?),
            DType::F64 => Data::F64(build(n, f)?),
            DType::U8 => Data::U8(build(n, f)?),
            DType::Bool => Data::Bool(build(n, f)?),
            DType::BF16 => Data::BF16(build(n, f)?),
            DType::F16 => Data::F16(build(n, f)?),
        })
    }
}

/// Memory the allocator could not give: the bytes asked for. Every buffer
/// of values kiln allocates (constructors, interpreters, backends) goes
/// through `try_capacity`, so that running out of memory is an `Err`, not
/// an abort; `in_op` gives it the op and the type it was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The bytes asked for.
    pub bytes: usize,
}

impl OutOfMemory {
    /// The error of `op` failing to allocate a value described by `what`
    /// (its type, or which buffer).
    pub fn in_op(self, op: impl Into<String>, what: impl fmt::Display) -> Error {
        Error::OutOfMemory {
            op: op.into(),
            what: what.to_string(),
            bytes: self.bytes,
        }
    }
}

/// An empty vector with room for `n` elements, or the bytes that could not
/// be had.
pub fn try_capacity<T>(n: usize) -> Result<Vec<T>, OutOfMemory> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| OutOfMemory {
        bytes: n.saturating_mul(size_of::<T>()),
    })?;
    Ok(v)
}

/// `n` copies of `value`, or the bytes that could not be had.
pub fn try_vec<T: Clone>(n: usize, value: T) -> Result<Vec<T>, OutOfMemory> {
    let mut v = try_capacity(n)?;
    v.resize(n, value);
    Ok(v)
}

/// Elements borrowed from storage kiln does not own (a `Data`, or rows of a
/// memory-mapped file): how inputs reach a compiled graph without a copy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DataRef<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// i32 elements.
    I32(&'a [i32]),
    /// i64 elements.
    I64(&'a [i64]),
    /// f64 elements.
    F64(&'a [f64]),
    /// u8 elements.
    U8(&'a [u8]),
    /// bool elements.
    Bool(&'a [bool]),
    /// bfloat16 elements.
    BF16(&'a [bf16]),
    /// binary16 elements.
    F16(&'a [f16]),
}

impl DataRef<'_> {
    /// The element type.
    pub fn dtype(self) -> DType {
        match self {
            DataRef::F32(_) => DType::F32,
            DataRef::I32(_) => DType::I32,
            DataRef::I64(_) => DType::I64,
            DataRef::F64(_) => DType::F64,
            DataRef::U8(_) => DType::U8,
            DataRef::Bool(_) => DType::Bool,
            DataRef::BF16(_) => DType::BF16,
            DataRef::F16(_) => DType::F16,
        }
    }

    /// The number of elements.
    pub fn len(self) -> usize {
        match self {
            DataRef::F32(v) => v.len(),
            DataRef::I32(v) => v.len(),
            DataRef::I64(v) => v.len(),
            DataRef::F64(v) => v.len(),
            DataRef::U8(v) => v.len(),
            DataRef::Bool(v) => v.len(),
            DataRef::BF16(v) => v.len(),
            DataRef::F16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// An owned copy, or the bytes that could not be had.
    pub fn try_to_data(self) -> Result<Data, OutOfMemory> {
        fn copy<T: Clone>(v: &[T]) -> Result<Vec<T>, OutOfMemory> {
            let mut c = try_capacity(v.len())?;
            c.extend_from_slice(v);
            Ok(c)
        }
        Ok(match self {
            DataRef::F32(v) => Data::F32(copy(v)?),
            DataRef::I32(v) => Data::I32(copy(v)?),
            DataRef::I64(v) => Data::I64(copy(v)?),
            DataRef::F64(v) => Data::F64(copy(v)?),
            DataRef::U8(v) => Data::U8(copy(v)?),
            DataRef::Bool(v) => Data::Bool(copy(v)?),
            DataRef::BF16(v) => Data::BF16(copy(v)?),
            DataRef::F16(v) => Data::F16(copy(v)?),
        })
    }

    /// An owned copy.
    pub fn to_data(self) -> Data {
        match self {
            DataRef::F32(v) => Data::F32(v.to_vec()),
            DataRef::I32(v) => Data::I32(v.to_vec()),
            DataRef::I64(v) => Data::I64(v.to_vec()),
            DataRef::F64(v) => Data::F64(v.to_vec()),
            DataRef::U8(v) => Data::U8(v.to_vec()),
            DataRef::Bool(v) => Data::Bool(v.to_vec()),
            DataRef::BF16(v) => Data::BF16(v.to_vec()),
            DataRef::F16(v) => Data::F16(v.to_vec()),
        }
    }
}

impl<'a> From<&'a Data> for DataRef<'a> {
    fn from(data: &'a Data) -> DataRef<'a> {
        match data {
            Data::F32(v) => DataRef::F32(v),
            Data::I32(v) => DataRef::I32(v),
            Data::I64(v) => DataRef::I64(v),
            Data::F64(v) => DataRef::F64(v),
            Data::U8(v) => DataRef::U8(v),
            Data::Bool(v) => DataRef::Bool(v),
            Data::BF16(v) => DataRef::BF16(v),
            Data::F16(v) => DataRef::F16(v),
        }
    }
}

/// Host element types that tensors can be built from and read back into.
pub trait Element: Copy + Default + Send + Sync + 'static {
    /// The matching `DType`.
    const DTYPE: DType;
    /// Wraps a vector of elements as `Data`.
    fn into_data(values: Vec<Self>) -> Data;
    /// The elements of `data`, if it holds this type.
    fn slice(data: &Data) -> Option<&[Self]>;
    /// The element held by `scalar`, if it is of this type.
    fn from_scalar(scalar: Scalar) -> Option<Self>;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn into_data(values: Vec<Self>) -> Data {
                Data::$variant(values)
            }
            fn slice(data: &Data) -> Option<&[Self]> {
                match data {
                    Data::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn from_scalar(scalar: Scalar) -> Option<Self> {
                match scalar {
                    Scalar::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

element!(f32, F32);
element!(i32, I32);
element!(i64, I64);
element!(f64, F64);
element!(u8, U8);
element!(bool, Bool);
element!(bf16, BF16);
element!(f16, F16);
