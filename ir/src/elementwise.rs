//! The elementwise ops and the typing rules that graph nodes and kernel
//! bodies share.
//!
//! `UnaryOp`, `BinaryOp` and `ReduceOp` appear both in graph ops (`Op`) and
//! in the expressions of fused kernels (`Expr`, `KernelKind`), so their
//! names, the dtypes they accept and their typing rules live here once. The
//! rule for `where` is here for the same reason, and so is matmul's: a fused
//! kernel checks its GEMM core by the graph op's rule. This module reads only
//! `types` and `error`, which lets `view`, `kernel` and `op` build on it in
//! one direction.
//!
//! The typing functions give the result type, or the user-facing error that
//! says why the operands do not fit; `Op::infer` adds the arity and size
//! checks that every op shares.

use crate::Error;
use crate::types::{DType, Scalar, Shape, TensorType};

/// Elementwise ops of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// -x
    Neg,
    /// e^x
    Exp,
    /// natural log; NaN below 0, -inf at 0
    Log,
    /// square root; NaN below 0
    Sqrt,
    /// 1/x
    Recip,
    /// max(x, 0), NaN propagates
    Relu,
    /// 1/(1+e^-x)
    Sigmoid,
    /// hyperbolic tangent
    Tanh,
    /// a trigonometric or hyperbolic function (tanh aside)
    Trig(TrigOp),
    /// |x|
    Abs,
    /// x itself, through which no gradient flows (JAX's `stop_gradient`,
    /// PyTorch's `detach`); `simplify` removes it before fusion.
    Detach,
}

/// The trigonometric and hyperbolic functions (tanh aside), of floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TrigOp {
    /// sine
    Sin,
    /// cosine
    Cos,
    /// tangent
    Tan,
    /// arcsine; NaN outside [-1, 1]
    Asin,
    /// arccosine; NaN outside [-1, 1]
    Acos,
    /// arctangent
    Atan,
    /// hyperbolic sine
    Sinh,
    /// hyperbolic cosine
    Cosh,
    /// inverse hyperbolic sine
    Asinh,
    /// inverse hyperbolic cosine; NaN below 1
    Acosh,
    /// inverse hyperbolic tangent; NaN outside [-1, 1]
    Atanh,
}

impl TrigOp {
    /// Every one, in order.
    pub const ALL: [TrigOp; 11] = [
        TrigOp::Sin,
        TrigOp::Cos,
        TrigOp::Tan,
        TrigOp::Asin,
        TrigOp::Acos,
        TrigOp::Atan,
        TrigOp::Sinh,
        TrigOp::Cosh,
        TrigOp::Asinh,
        TrigOp::Acosh,
        TrigOp::Atanh,
    ];

    /// The name in printed IR and errors, and C's (with `f` for f32).
    pub fn name(self) -> &'static str {
        match self {
            TrigOp::Sin => "sin",
            TrigOp::Cos => "cos",
            TrigOp::Tan => "tan",
            TrigOp::Asin => "asin",
            TrigOp::Acos => "acos",
            TrigOp::Atan => "atan",
            TrigOp::Sinh => "sinh",
            TrigOp::Cosh => "cosh",
            TrigOp::Asinh => "asinh",
            TrigOp::Acosh => "acosh",
            TrigOp::Atanh => "atanh",
        }
    }

    /// Its value at `x`, in f64: how the interpreter computes every float
    /// type.
    pub fn eval(self, x: f64) -> f64 {
        match self {
            TrigOp::Sin => x.sin(),
            TrigOp::Cos => x.cos(),
            TrigOp::Tan => x.tan(),
            TrigOp::Asin => x.asin(),
            TrigOp::Acos => x.acos(),
            TrigOp::Atan => x.atan(),
            TrigOp::Sinh => x.sinh(),
            TrigOp::Cosh => x.cosh(),
            TrigOp::Asinh => x.asinh(),
            TrigOp::Acosh => x.acosh(),
            TrigOp::Atanh => x.atanh(),
        }
    }
}

/// Elementwise ops of two operands of the same shape and dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b (floats only)
    Div,
    /// the larger, NaN propagates, +0 above -0
    Max,
    /// the smaller, NaN propagates, -0 below +0
    Min,
    /// a^b (floats only)
    Pow,
    /// The remainder of a / b, the quotient truncated toward zero: the sign
    /// of a, as C's `fmod` and Rust's `%` (exact for floats). For integers
    /// a remainder by 0 is 0, as is `MIN % -1`.
    Rem,
    /// a < b
    Lt,
    /// a <= b
    Le,
    /// a > b
    Gt,
    /// a >= b
    Ge,
    /// a == b
    Eq,
    /// a != b
    Ne,
    /// `uniform(key, counter)`: an f32 in [0, 1) that is a pure function of
    /// the two i32s (Threefry-2x32-20, `random::uniform`); a tensor of
    /// counters that number its elements gives a random tensor.
    Uniform,
}

/// How a reduction combines elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum; 0 over an empty axis.
    Sum,
    /// Largest element, NaN propagates; an empty axis is an error.
    Max,
    /// Product; 1 over an empty axis. Integers wrap, as `mul` does.
    Prod,
}

impl UnaryOp {
    /// The name in printed IR and errors.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Relu => "relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Trig(t) => t.name(),
            UnaryOp::Abs => "abs",
            UnaryOp::Detach => "detach",
        }
    }

    /// The dtypes the op accepts: the sign ops take signed numbers, the
    /// transcendental ones floats (cast integers first, as JAX asks).
    fn accepts(self, dtype: DType) -> Result<(), &'static str> {
        match self {
            UnaryOp::Detach => Ok(()),
            UnaryOp::Neg | UnaryOp::Relu | UnaryOp::Abs => {
                accept(dtype, SIGNED, "a signed number type")
            }
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sqrt
            | UnaryOp::Recip
            | UnaryOp::Sigmoid
            | UnaryOp::Tanh
            | UnaryOp::Trig(_) => accept(dtype, FLOATS, "a float type"),
        }
    }

    /// The result type: the operand's, when the op accepts its dtype.
    pub fn infer(self, x: &TensorType) -> Result<TensorType, Error> {
        check_dtype(self.name(), x.dtype, self.accepts(x.dtype))?;
        Ok(x.clone())
    }
}

impl BinaryOp {
    /// The name in printed IR and errors.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Pow => "pow",
            BinaryOp::Rem => "rem",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Uniform => "uniform",
        }
    }

    /// Whether the op compares and so yields bool.
    pub fn is_comparison(self) -> bool {
        match self {
            BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge
            | BinaryOp::Eq
            | BinaryOp::Ne => true,
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Max
            | BinaryOp::Min
            | BinaryOp::Pow
            | BinaryOp::Rem
            | BinaryOp::Uniform => false,
        }
    }

    /// The dtypes the op accepts for its (equal) operand type.
    fn accepts(self, dtype: DType) -> Result<(), &'static str> {
        match self {
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Max
            | BinaryOp::Min
            | BinaryOp::Rem => accept(dtype, NUMBERS, "a number type"),
            BinaryOp::Div | BinaryOp::Pow => accept(dtype, FLOATS, "a float type"),
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
                accept(dtype, NUMBERS, "a number type")
            }
            BinaryOp::Eq | BinaryOp::Ne => Ok(()),
            BinaryOp::Uniform => accept(dtype, &[DType::I32], "i32"),
        }
    }

    /// The result type of `lhs op rhs`: operands of one shape and one dtype
    /// the op accepts; comparisons give bool, `uniform` f32.
    pub fn infer(self, lhs: &TensorType, rhs: &TensorType) -> Result<TensorType, Error> {
        let op = self.name();
        if lhs.dtype != rhs.dtype {
            return Err(Error::DTypeMismatch {
                op,
                lhs: lhs.dtype,
                rhs: rhs.dtype,
            });
        }
        same_shape(op, &lhs.shape, &rhs.shape)?;
        check_dtype(op, lhs.dtype, self.accepts(lhs.dtype))?;
        let dtype = match self {
            BinaryOp::Uniform => DType::F32,
            _ if self.is_comparison() => DType::Bool,
            _ => lhs.dtype,
        };
        Ok(TensorType::new(dtype, lhs.shape.clone()))
    }
}

impl ReduceOp {
    /// The name in printed IR and errors.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Prod => "prod",
        }
    }

    /// Sums need an accumulating type (cast u8 and bool first); max and
    /// product take any number type (a u8 product wraps, as `mul` of u8).
    fn accepts(self, dtype: DType) -> Result<(), &'static str> {
        match self {
            ReduceOp::Sum => accept(dtype, SIGNED, "a signed number type"),
            ReduceOp::Max | ReduceOp::Prod => accept(dtype, NUMBERS, "a number type"),
        }
    }

    /// The value a reduction starts from: 0 for sums, the lowest value of the
    /// type for max (-inf for floats), 1 for products.
    pub fn init(self, dtype: DType) -> Scalar {
        match (self, dtype) {
            (ReduceOp::Sum, dtype) => Scalar::I32(0).cast(dtype),
            (ReduceOp::Prod, dtype) => Scalar::I32(1).cast(dtype),
            (ReduceOp::Max, DType::F32) => Scalar::F32(f32::NEG_INFINITY),
            (ReduceOp::Max, DType::F64) => Scalar::F64(f64::NEG_INFINITY),
            (ReduceOp::Max, DType::I32) => Scalar::I32(i32::MIN),
            (ReduceOp::Max, DType::I64) => Scalar::I64(i64::MIN),
            (ReduceOp::Max, DType::U8) => Scalar::U8(0),
            (ReduceOp::Max, DType::Bool) => Scalar::Bool(false),
            (ReduceOp::Max, DType::BF16) => Scalar::BF16(crate::bf16::NEG_INFINITY),
            (ReduceOp::Max, DType::F16) => Scalar::F16(crate::f16::NEG_INFINITY),
        }
    }

    /// The result type of reducing `x` over `axes` (sorted, distinct, in
    /// range; max needs every reduced axis non-empty): `x` with those axes
    /// kept as size 1.
    pub fn infer(self, axes: &[usize], x: &TensorType) -> Result<TensorType, Error> {
        let op = self.name();
        let shape = &x.shape;
        check_dtype(op, x.dtype, self.accepts(x.dtype))?;
        for (i, &axis) in axes.iter().enumerate() {
            if axis >= shape.rank() {
                return Err(Error::Axis {
                    op,
                    axis: axis as isize,
                    rank: shape.rank(),
                });
            }
            if i > 0 && axes[i - 1] >= axis {
                return Err(Error::Axes {
                    op,
                    axes: axes.to_vec(),
                });
            }
            if self == ReduceOp::Max && shape.dims()[axis] == 0 {
                return Err(Error::EmptyReduce {
                    op,
                    shape: shape.clone(),
                    axis,
                });
            }
        }
        let mut dims = shape.0.clone();
        for &axis in axes {
            dims[axis] = 1;
        }
        Ok(TensorType::new(x.dtype, Shape(dims)))
    }
}

/// The result type of `where(cond, a, b)`: `cond` bool, `a` and `b` of one
/// dtype, all three of one shape.
pub fn infer_where(cond: &TensorType, a: &TensorType, b: &TensorType) -> Result<TensorType, Error> {
    let op = "where";
    check_dtype(op, cond.dtype, accept(cond.dtype, &[DType::Bool], "bool"))?;
    if a.dtype != b.dtype {
        return Err(Error::DTypeMismatch {
            op,
            lhs: a.dtype,
            rhs: b.dtype,
        });
    }
    same_shape(op, &cond.shape, &a.shape)?;
    same_shape(op, &a.shape, &b.shape)?;
    Ok(a.clone())
}

/// The result type of `lhs @ rhs`: `[..., m, k] @ [..., k, n] -> [..., m, n]`
/// over equal batch dims, f32.
pub fn infer_matmul(lhs: &TensorType, rhs: &TensorType) -> Result<TensorType, Error> {
    let op = "matmul";
    if lhs.dtype != rhs.dtype {
        return Err(Error::DTypeMismatch {
            op,
            lhs: lhs.dtype,
            rhs: rhs.dtype,
        });
    }
    check_dtype(
        op,
        lhs.dtype,
        accept(lhs.dtype, HALVES_AND_F32, "f32, bf16 or f16"),
    )?;
    let (ls, rs) = (lhs.shape.dims(), rhs.shape.dims());
    let rank = ls.len();
    if rank < 2
        || rs.len() != rank
        || ls[..rank - 2] != rs[..rank - 2]
        || ls[rank - 1] != rs[rank - 2]
    {
        return Err(Error::MatMul {
            lhs: lhs.shape.clone(),
            rhs: rhs.shape.clone(),
        });
    }
    let mut dims = lhs.shape.0.clone();
    dims[rank - 1] = rs[rank - 1];
    Ok(TensorType::new(lhs.dtype, Shape(dims)))
}

/// The float types.
const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::BF16, DType::F16];

/// The matmul's types: f32, and the 16-bit floats it computes in f32.
const HALVES_AND_F32: &[DType] = &[DType::F32, DType::BF16, DType::F16];

/// The signed number types: what negation and sums take.
const SIGNED: &[DType] = &[
    DType::F32,
    DType::F64,
    DType::BF16,
    DType::F16,
    DType::I32,
    DType::I64,
];

/// Every number type (not bool).
const NUMBERS: &[DType] = &[
    DType::F32,
    DType::F64,
    DType::BF16,
    DType::F16,
    DType::I32,
    DType::I64,
    DType::U8,
];

fn accept(dtype: DType, allowed: &[DType], expected: &'static str) -> Result<(), &'static str> {
    if allowed.contains(&dtype) {
        Ok(())
    } else {
        Err(expected)
    }
}

fn check_dtype(
    op: &'static str,
    dtype: DType,
    accepted: Result<(), &'static str>,
) -> Result<(), Error> {
    accepted.map_err(|expected| Error::DType {
        op,
        dtype,
        expected,
    })
}

fn same_shape(op: &'static str, lhs: &Shape, rhs: &Shape) -> Result<(), Error> {
    if lhs == rhs {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op,
            lhs: lhs.clone(),
            rhs: rhs.clone(),
        })
    }
}
