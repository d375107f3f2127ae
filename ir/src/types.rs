//! Element types, shapes, scalars and host data (`data`, re-exported here):
//! the values the IR talks about.
//!
//! Everything here is plain data. `Shape` prints as `[2, 3]` in error messages
//! and `TensorType` as `f32[2,3]` in the printed IR.

use std::fmt;
use std::hash::{Hash, Hasher};

use half::{bf16, f16};
use smallvec::SmallVec;

use crate::Error;
pub use crate::data::{Data, DataRef, Element, OutOfMemory, try_capacity, try_vec};

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 32-bit signed integer; arithmetic wraps.
    I32,
    /// 8-bit unsigned integer, what image datasets hold; arithmetic wraps.
    U8,
    /// Truth values: what comparisons produce and `where` consumes.
    Bool,
    /// 64-bit signed integer, what ONNX models index and count with;
    /// arithmetic wraps.
    I64,
    /// 64-bit IEEE float.
    F64,
    /// bfloat16: f32's exponent with an 8-bit significand. Ops compute in
    /// f32 and round to nearest even at their result.
    BF16,
    /// 16-bit IEEE float (binary16). Ops compute in f32 and round to
    /// nearest even at their result.
    F16,
}

impl DType {
    /// Every dtype, for code and tests that go through all of them.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];

    /// The name used in printed IR and error messages.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F64 => "f64",
            DType::U8 => "u8",
            DType::Bool => "bool",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::I64 | DType::F64 => 8,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether the type is a float type.
    pub fn is_float(self) -> bool {
        match self {
            DType::F32 | DType::F64 | DType::BF16 | DType::F16 => true,
            DType::I32 | DType::I64 | DType::U8 | DType::Bool => false,
        }
    }

    /// Whether the type is a 16-bit float, which backends hold in f32
    /// registers and compute on in f32 (`pass::widen`).
    pub fn is_half(self) -> bool {
        match self {
            DType::BF16 | DType::F16 => true,
            DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::U8 | DType::Bool => false,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The dimensions of a tensor, outermost first. Rank 0 is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub SmallVec<[usize; 4]>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: &[usize]) -> Shape {
        Shape(SmallVec::from_slice(dims))
    }

    /// The rank-0 shape of a scalar.
    pub fn scalar() -> Shape {
        Shape(SmallVec::new())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The number of elements (1 for a scalar, 0 if any dimension is 0).
    /// Saturates at `usize::MAX`: typing rejects every shape that large, but a
    /// user may still ask a constructor for one.
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// The number of elements, or `None` if it does not fit in a `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// Row-major (C order) strides in elements.
    pub fn strides(&self) -> SmallVec<[usize; 4]> {
        let mut strides: SmallVec<[usize; 4]> = SmallVec::from_elem(0, self.rank());
        let mut acc = 1;
        for (s, d) in strides.iter_mut().zip(self.0.iter()).rev() {
            *s = acc;
            acc *= d;
        }
        strides
    }

    /// The shape that `lhs` and `rhs` broadcast to under NumPy rules: shapes are
    /// aligned at the right, and each pair of dimensions must be equal or one of
    /// them 1. `op` names the operation in the error.
    pub fn broadcast(op: &'static str, lhs: &Shape, rhs: &Shape) -> Result<Shape, Error> {
        let rank = lhs.rank().max(rhs.rank());
        let mut out = SmallVec::with_capacity(rank);
        for i in 0..rank {
            let l = dim_from_right(lhs, rank - i);
            let r = dim_from_right(rhs, rank - i);
            out.push(match (l, r) {
                (l, r) if l == r => l,
                (1, r) => r,
                (l, 1) => l,
                _ => {
                    return Err(Error::Broadcast {
                        op,
                        lhs: lhs.clone(),
                        rhs: rhs.clone(),
                    });
                }
            });
        }
        Ok(Shape(out))
    }

    /// Whether this shape broadcasts to `target` by NumPy rules (right-aligned,
    /// each dimension equal to the target's or 1, leading dimensions added).
    pub fn broadcasts_to(&self, target: &Shape) -> bool {
        self.rank() <= target.rank()
            && (1..=self.rank()).all(|k| {
                let d = dim_from_right(self, k);
                d == 1 || d == dim_from_right(target, k)
            })
    }
}

/// The `k`-th dimension counted from the right (k = 1 is the last), 1 past the rank.
fn dim_from_right(shape: &Shape, k: usize) -> usize {
    if k <= shape.rank() {
        shape.0[shape.rank() - k]
    } else {
        1
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Shape {
        Shape::new(dims)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Shape {
        Shape::new(&dims)
    }
}

impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(dims: &[usize; N]) -> Shape {
        Shape::new(dims)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Shape {
        Shape(SmallVec::from_vec(dims))
    }
}

impl From<&Shape> for Shape {
    fn from(shape: &Shape) -> Shape {
        shape.clone()
    }
}

/// The type of a value in the graph: element type and shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Shape,
}

impl TensorType {
    /// A type from its parts.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    /// The type itself if every byte of a value of it is addressable (at most
    /// `isize::MAX` bytes, so index arithmetic in generated code cannot
    /// wrap), or the error naming `op` and the shape.
    pub fn checked(self, op: &'static str) -> Result<TensorType, Error> {
        let bytes = self
            .shape
            .checked_numel()
            .and_then(|n| n.checked_mul(self.dtype.size()));
        match bytes {
            Some(b) if b <= isize::MAX as usize => Ok(self),
            _ => Err(Error::TooLarge {
                op,
                shape: self.shape,
            }),
        }
    }
}

impl fmt::Display for TensorType {
    /// The printed-IR form, `f32[64,256]`, with no spaces so lines stay short.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.dims().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// One value of some element type: the payload of a constant.
///
/// Equality and hashing compare bits, so `NaN == NaN` and `0.0 != -0.0` here:
/// two constants are the same exactly when they behave the same.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// An f32 value.
    F32(f32),
    /// An i32 value.
    I32(i32),
    /// An i64 value.
    I64(i64),
    /// An f64 value.
    F64(f64),
    /// A u8 value.
    U8(u8),
    /// A bool value.
    Bool(bool),
    /// A bfloat16 value.
    BF16(bf16),
    /// A binary16 value.
    F16(f16),
}

impl Scalar {
    /// The element type of the value.
    pub fn dtype(self) -> DType {
        match self {
            Scalar::F32(_) => DType::F32,
            Scalar::I32(_) => DType::I32,
            Scalar::I64(_) => DType::I64,
            Scalar::F64(_) => DType::F64,
            Scalar::U8(_) => DType::U8,
            Scalar::Bool(_) => DType::Bool,
            Scalar::BF16(_) => DType::BF16,
            Scalar::F16(_) => DType::F16,
        }
    }

    /// The value as f64: exact for every element type but i64, which rounds
    /// beyond 2^53.
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::F32(v) => v as f64,
            Scalar::I32(v) => v as f64,
            Scalar::I64(v) => v as f64,
            Scalar::F64(v) => v,
            Scalar::U8(v) => v as f64,
            Scalar::Bool(v) => v as u8 as f64,
            Scalar::BF16(v) => v.to_f64(),
            Scalar::F16(v) => v.to_f64(),
        }
    }

    /// The value converted to `dtype` with the semantics of `Op::Cast`.
    pub fn cast(self, dtype: DType) -> Scalar {
        match self {
            Scalar::F32(v) => cast_f64(v as f64, dtype),
            Scalar::I32(v) => cast_int(v as i64, dtype),
            Scalar::I64(v) => cast_int(v, dtype),
            Scalar::F64(v) => cast_f64(v, dtype),
            Scalar::U8(v) => cast_int(v as i64, dtype),
            Scalar::Bool(v) => cast_int(v as i64, dtype),
            Scalar::BF16(v) => cast_f64(v.to_f64(), dtype),
            Scalar::F16(v) => cast_f64(v.to_f64(), dtype),
        }
    }

    fn bits(self) -> (DType, u64) {
        let bits = match self {
            Scalar::F32(v) => u64::from(v.to_bits()),
            Scalar::I32(v) => v as u32 as u64,
            Scalar::I64(v) => v as u64,
            Scalar::F64(v) => v.to_bits(),
            Scalar::U8(v) => u64::from(v),
            Scalar::Bool(v) => u64::from(v),
            Scalar::BF16(v) => u64::from(v.to_bits()),
            Scalar::F16(v) => u64::from(v.to_bits()),
        };
        (self.dtype(), bits)
    }
}

/// Float to any type: saturating toward the integer range, NaN to 0, and
/// nonzero (NaN included) to true, as Rust's `as` and NumPy's `bool` do.
pub(crate) fn cast_f64(v: f64, dtype: DType) -> Scalar {
    match dtype {
        DType::F32 => Scalar::F32(v as f32),
        DType::F64 => Scalar::F64(v),
        DType::I32 => Scalar::I32(v as i32),
        DType::I64 => Scalar::I64(v as i64),
        DType::U8 => Scalar::U8(v as u8),
        DType::Bool => Scalar::Bool(v != 0.0),
        DType::BF16 => Scalar::BF16(bf16::from_f32(round_to_odd(v))),
        DType::F16 => Scalar::F16(f16::from_f32(round_to_odd(v))),
    }
}

/// `v` as f32 rounded to odd: toward zero, with the last bit set where
/// that dropped anything. Rounded again to nearest even into a type at
/// least two bits narrower (bf16, f16), it gives what rounding `v` there
/// directly gives, where rounding to f32 first can round twice: a value
/// just above a tie of bf16 would land on the tie and go to even.
fn round_to_odd(v: f64) -> f32 {
    let r = v as f32;
    if !r.is_finite() || f64::from(r) == v {
        return r;
    }
    // `r` is nearest; step back toward zero where it rounded away.
    let toward_zero = if f64::from(r).abs() > v.abs() {
        f32::from_bits(r.to_bits() - 1)
    } else {
        r
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

/// Integer to any type: two's-complement wrapping to narrower integers.
pub(crate) fn cast_int(v: i64, dtype: DType) -> Scalar {
    match dtype {
        DType::F32 => Scalar::F32(v as f32),
        DType::F64 => Scalar::F64(v as f64),
        DType::I32 => Scalar::I32(v as i32),
        DType::I64 => Scalar::I64(v),
        DType::U8 => Scalar::U8(v as u8),
        DType::Bool => Scalar::Bool(v != 0),
        // Through f64, which holds every integer up to 2^53 exactly; one
        // beyond rounds to f64 first, then to 16 bits.
        DType::BF16 | DType::F16 => cast_f64(v as f64, dtype),
    }
}

impl PartialEq for Scalar {
    fn eq(&self, other: &Scalar) -> bool {
        self.bits() == other.bits()
    }
}

impl Eq for Scalar {}

impl Hash for Scalar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.bits().hash(state);
    }
}

impl fmt::Display for Scalar {
    /// Floats print with `{:?}` so that they round-trip and always show a point.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::F32(v) => write!(f, "{v:?}"),
            Scalar::I32(v) => write!(f, "{v}"),
            Scalar::I64(v) => write!(f, "{v}"),
            Scalar::F64(v) => write!(f, "{v:?}"),
            Scalar::U8(v) => write!(f, "{v}"),
            Scalar::Bool(v) => write!(f, "{v}"),
            Scalar::BF16(v) => write!(f, "{:?}", v.to_f32()),
            Scalar::F16(v) => write!(f, "{:?}", v.to_f32()),
        }
    }
}

// No `From<f64>`: an unsuffixed float literal would then default to f64 and
// `Tensor::scalar(0.5)` beside f32 tensors be a type error; an f64 scalar
// is written `Scalar::F64(..)`.
impl From<f32> for Scalar {
    fn from(v: f32) -> Scalar {
        Scalar::F32(v)
    }
}

impl From<i32> for Scalar {
    fn from(v: i32) -> Scalar {
        Scalar::I32(v)
    }
}

impl From<i64> for Scalar {
    fn from(v: i64) -> Scalar {
        Scalar::I64(v)
    }
}

impl From<u8> for Scalar {
    fn from(v: u8) -> Scalar {
        Scalar::U8(v)
    }
}

impl From<bool> for Scalar {
    fn from(v: bool) -> Scalar {
        Scalar::Bool(v)
    }
}

impl From<bf16> for Scalar {
    fn from(v: bf16) -> Scalar {
        Scalar::BF16(v)
    }
}

impl From<f16> for Scalar {
    fn from(v: f16) -> Scalar {
        Scalar::F16(v)
    }
}
