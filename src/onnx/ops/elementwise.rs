//! Elementwise ONNX ops: arithmetic, comparisons and logic with NumPy
//! broadcasting, `Where`, `Cast`, `Clip`, the activations as compositions
//! of kiln's unary ops, and rounding and `Erf` built from casts and
//! polynomials whose error stays far inside ONNX's tolerances.

use kiln_ir::DType;

use super::{one, scalar};
use crate::onnx::graph::{Node, Value};
use crate::onnx::tensor::kiln_dtype;
use crate::{Result, Tensor};

/// The node's outputs, or `None` if the op is not elementwise.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    let x = || node.tensor(0);
    let y = || node.tensor(1);
    Some(match node.op() {
        "Identity" => node.value(0).map(|v| vec![v.clone()]),
        "Neg" => x().and_then(|x| one(x.neg()?)),
        "Abs" => x().and_then(|x| one(abs(&x)?)),
        "Exp" => x().and_then(|x| one(x.exp()?)),
        "Log" => x().and_then(|x| one(x.log()?)),
        "Sqrt" => x().and_then(|x| one(x.sqrt()?)),
        "Reciprocal" => x().and_then(|x| one(x.recip()?)),
        "Relu" => x().and_then(|x| one(x.relu()?)),
        "Sigmoid" => x().and_then(|x| one(x.sigmoid()?)),
        "Tanh" => x().and_then(|x| one(x.tanh()?)),
        "Sin" => x().and_then(|x| one(x.sin()?)),
        "Cos" => x().and_then(|x| one(x.cos()?)),
        "Tan" => x().and_then(|x| one(x.tan()?)),
        "Asin" => x().and_then(|x| one(x.asin()?)),
        "Acos" => x().and_then(|x| one(x.acos()?)),
        "Atan" => x().and_then(|x| one(x.atan()?)),
        "Sinh" => x().and_then(|x| one(x.sinh()?)),
        "Cosh" => x().and_then(|x| one(x.cosh()?)),
        "Asinh" => x().and_then(|x| one(x.asinh()?)),
        "Acosh" => x().and_then(|x| one(x.acosh()?)),
        "Atanh" => x().and_then(|x| one(x.atanh()?)),
        "Add" => x().and_then(|x| one(x.add(&y()?)?)),
        "Sub" => x().and_then(|x| one(x.sub(&y()?)?)),
        "Mul" => x().and_then(|x| one(x.mul(&y()?)?)),
        "Div" => x().and_then(|x| one(x.div(&y()?)?)),
        "Pow" => pow(node),
        "Mod" => modulo(node),
        "Equal" => x().and_then(|x| one(x.eq(&y()?)?)),
        "Less" => x().and_then(|x| one(x.lt(&y()?)?)),
        "LessOrEqual" => x().and_then(|x| one(x.le(&y()?)?)),
        "Greater" => x().and_then(|x| one(x.gt(&y()?)?)),
        "GreaterOrEqual" => x().and_then(|x| one(x.ge(&y()?)?)),
        "Not" => x().and_then(|x| one(not(&x)?)),
        "And" => x().and_then(|x| one(x.where_cond(&y()?, &Tensor::scalar(false))?)),
        "Or" => x().and_then(|x| one(x.where_cond(&Tensor::scalar(true), &y()?)?)),
        "Xor" => x().and_then(|x| one(x.ne(&y()?)?)),
        "Where" => x().and_then(|c| one(c.where_cond(&y()?, &node.tensor(2)?)?)),
        "Max" => variadic(node, Tensor::maximum),
        "Min" => variadic(node, Tensor::minimum),
        "Sum" => variadic(node, Tensor::add),
        "Mean" => mean(node),
        "Cast" => cast(node),
        "CastLike" => x().and_then(|x| one(x.cast(y()?.dtype())?)),
        "Clip" => clip(node),
        "Sign" => x().and_then(|x| one(sign(&x)?)),
        "IsNaN" => x().and_then(|x| one(x.ne(&x)?)),
        "IsInf" => is_inf(node),
        "Floor" => x().and_then(|x| one(floor(&x)?)),
        "Ceil" => x().and_then(|x| one(floor(&x.neg()?)?.neg()?)),
        "Round" => x().and_then(|x| one(round(&x)?)),
        "Erf" => x().and_then(|x| one(erf(&x)?)),
        op => return activation(node, op),
    })
}

/// The activations: compositions of kiln's unary ops, with ONNX's defaults.
fn activation(node: &Node, op: &str) -> Option<Result<Vec<Value>>> {
    let compute = |f: &dyn Fn(&Tensor) -> Result<Tensor>| node.tensor(0).and_then(|x| one(f(&x)?));
    // A constant in the input's float type.
    let c = |v: f32, x: &Tensor| scalar(f64::from(v), x.dtype());
    Some(match op {
        "Elu" => node.attr_float("alpha", 1.0).and_then(|alpha| {
            compute(&|x| {
                x.gt(&c(0.0, x))?
                    .where_cond(x, &expm1(x)?.mul(&c(alpha, x))?)
            })
        }),
        "Selu" => node.attr_float("alpha", 1.673_263_2).and_then(|alpha| {
            let gamma = node.attr_float("gamma", 1.050_701)?;
            compute(&|x| {
                let neg = expm1(x)?.mul(&c(alpha, x))?;
                x.gt(&c(0.0, x))?.where_cond(x, &neg)?.mul(&c(gamma, x))
            })
        }),
        "Celu" => node.attr_float("alpha", 1.0).and_then(|alpha| {
            compute(&|x| {
                let neg = expm1(&x.mul(&c(1.0 / alpha, x))?)?.mul(&c(alpha, x))?;
                x.relu()?.add(&neg.minimum(&c(0.0, x))?)
            })
        }),
        "LeakyRelu" => node
            .attr_float("alpha", 0.01)
            .and_then(|alpha| compute(&|x| x.lt(&c(0.0, x))?.where_cond(&x.mul(&c(alpha, x))?, x))),
        "PRelu" => node.tensor(1).and_then(|slope| {
            compute(&|x| {
                // Before opset 7 a 1-D slope of the channels' length is per channel.
                let slope = match node.opset < 7 && slope.rank() == 1 && x.rank() > 2 {
                    true => slope.reshape(per_channel_dims(slope.numel(), x.rank()))?,
                    false => slope.clone(),
                };
                let y = x
                    .lt(&scalar(0.0, x.dtype()))?
                    .where_cond(&x.mul(&slope)?, x)?;
                // The slope broadcasts to the input, never the other way.
                match y.shape() == x.shape() {
                    true => Ok(y),
                    false => Err(node.invalid("the slope does not broadcast to the input")),
                }
            })
        }),
        "ThresholdedRelu" => node
            .attr_float("alpha", 1.0)
            .and_then(|alpha| compute(&|x| x.gt(&c(alpha, x))?.where_cond(x, &c(0.0, x)))),
        "HardSigmoid" => node.attr_float("alpha", 0.2).and_then(|alpha| {
            let beta = node.attr_float("beta", 0.5)?;
            compute(&|x| hard_sigmoid(x, alpha, beta))
        }),
        "HardSwish" => compute(&|x| x.mul(&hard_sigmoid(x, 1.0 / 6.0, 0.5)?)),
        "Softplus" => compute(&softplus),
        "Softsign" => compute(&|x| x.div(&x.abs()?.add(&c(1.0, x))?)),
        "Mish" => compute(&|x| x.mul(&softplus(x)?.tanh()?)),
        "Shrink" => node.attr_float("lambd", 0.5).and_then(|lambd| {
            let bias = node.attr_float("bias", 0.0)?;
            compute(&|x| {
                let dt = x.dtype();
                let low = x.lt(&scalar(-f64::from(lambd), dt))?;
                let high = x.gt(&scalar(f64::from(lambd), dt))?;
                let b = scalar(f64::from(bias), dt);
                let zero = scalar(0.0, dt);
                low.where_cond(&x.add(&b)?, &high.where_cond(&x.sub(&b)?, &zero)?)
            })
        }),
        "Gelu" => {
            node.attr_string("approximate", "none")
                .and_then(|approx| match approx.as_str() {
                    "tanh" => compute(&Tensor::gelu),
                    "none" => compute(&gelu_erf),
                    other => Err(node.invalid(format!("approximate = '{other}'"))),
                })
        }
        _ => return None,
    })
}

/// `[c, 1, ..]`: a vector shaped to broadcast along axis 1 of rank `rank`.
fn per_channel_dims(c: usize, rank: usize) -> Vec<usize> {
    let mut dims = vec![1; rank - 1];
    dims[0] = c;
    dims
}

/// |x|, which is x itself for unsigned and boolean types.
fn abs(x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::U8 | DType::Bool => Ok(x.clone()),
        _ => x.abs(),
    }
}

/// e^x - 1.
fn expm1(x: &Tensor) -> Result<Tensor> {
    x.exp()?.sub(&scalar(1.0, x.dtype()))
}

/// max(0, min(1, alpha x + beta)).
fn hard_sigmoid(x: &Tensor, alpha: f32, beta: f32) -> Result<Tensor> {
    let dt = x.dtype();
    x.mul(&scalar(f64::from(alpha), dt))?
        .add(&scalar(f64::from(beta), dt))?
        .minimum(&scalar(1.0, dt))?
        .maximum(&scalar(0.0, dt))
}

/// log(1 + e^x), as max(x, 0) + log(1 + e^-|x|) so that large x do not
/// overflow.
fn softplus(x: &Tensor) -> Result<Tensor> {
    let tail = x.abs()?.neg()?.exp()?.add(&scalar(1.0, x.dtype()))?.log()?;
    x.relu()?.add(&tail)
}

/// Logical not.
fn not(x: &Tensor) -> Result<Tensor> {
    x.eq(&Tensor::scalar(false))
}

/// The inputs folded pairwise by `f`, broadcasting.
fn variadic(node: &Node, f: fn(&Tensor, &Tensor) -> Result<Tensor>) -> Result<Vec<Value>> {
    let mut acc = node.tensor(0)?;
    for i in 1..node.input_count() {
        acc = f(&acc, &node.tensor(i)?)?;
    }
    one(acc)
}

fn mean(node: &Node) -> Result<Vec<Value>> {
    let mut sum = node.tensor(0)?;
    for i in 1..node.input_count() {
        sum = sum.add(&node.tensor(i)?)?;
    }
    let count = scalar(node.input_count() as f64, sum.dtype());
    one(sum.div(&count)?)
}

/// Pow with an exponent of another type: a float base takes the exponent
/// in its own type (exact for i32 and u8 exponents, and for i64 ones up to
/// 2^24 in f32, beyond which f32's result is infinite or 0 or 1 alike);
/// integer bases kiln cannot raise.
fn pow(node: &Node) -> Result<Vec<Value>> {
    let (x, y) = (node.tensor(0)?, node.tensor(1)?);
    if !x.dtype().is_float() {
        return Err(node.unsupported(format!("Pow of a {} base", x.dtype())));
    }
    let y = match y.dtype() == x.dtype() {
        true => y,
        false => y.cast(x.dtype())?,
    };
    one(x.pow(&y)?)
}

/// `Mod`: C's remainder, the dividend's sign, where `fmod` is 1 (floats
/// must set it); else, for integers, Python's, the divisor's sign: C's
/// plus the divisor where the two signs differ. An integer remainder by 0
/// is 0.
fn modulo(node: &Node) -> Result<Vec<Value>> {
    let (x, y) = (node.tensor(0)?, node.tensor(1)?);
    let c_style = node.attr_int("fmod", 0)? != 0;
    if x.dtype().is_float() && !c_style {
        return Err(node.invalid("Mod of floats needs fmod = 1"));
    }
    let r = x.fmod(&y)?;
    if c_style || x.dtype() == DType::U8 {
        return one(r);
    }
    let zero = scalar(0.0, x.dtype());
    let signs_differ = r.lt(&zero)?.ne(&y.lt(&zero)?)?;
    let adjust = r
        .ne(&zero)?
        .where_cond(&signs_differ, &Tensor::scalar(false))?;
    one(adjust.where_cond(&r.add(&y)?, &r)?)
}

fn cast(node: &Node) -> Result<Vec<Value>> {
    let to = node.attr_int("to", 0)?;
    // `saturate` only concerns casts to 8-bit floats, which kiln refuses below.
    node.attr_int("saturate", 1)?;
    let dtype = kiln_dtype(to).ok_or_else(|| {
        node.unsupported(format!(
            "casting to {}",
            crate::onnx::tensor::dtype_name(to)
        ))
    })?;
    one(node.tensor(0)?.cast(dtype)?)
}

/// Clip to [min, max]: attributes before opset 11, optional inputs since.
fn clip(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let (lo, hi) = match node.opset < 11 {
        true => (
            node.attr("min").map(|a| Tensor::scalar(a.f)),
            node.attr("max").map(|a| Tensor::scalar(a.f)),
        ),
        false => (node.opt_tensor(1)?, node.opt_tensor(2)?),
    };
    let mut y = x;
    if let Some(lo) = lo {
        y = y.maximum(&lo)?;
    }
    if let Some(hi) = hi {
        y = y.minimum(&hi)?;
    }
    one(y)
}

/// -1, 0 or 1 by the sign of x (NaN stays NaN).
fn sign(x: &Tensor) -> Result<Tensor> {
    let dt = x.dtype();
    let (zero, one_) = (scalar(0.0, dt), scalar(1.0, dt));
    if matches!(dt, DType::U8 | DType::Bool) {
        return x.gt(&zero)?.where_cond(&one_, &zero);
    }
    let s = x
        .gt(&zero)?
        .where_cond(&one_, &x.lt(&zero)?.where_cond(&scalar(-1.0, dt), &zero)?)?;
    match dt.is_float() {
        true => x.ne(x)?.where_cond(x, &s),
        false => Ok(s),
    }
}

fn is_inf(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let negative = node.attr_int("detect_negative", 1)? != 0;
    let positive = node.attr_int("detect_positive", 1)? != 0;
    let inf = scalar(f64::INFINITY, x.dtype());
    let pos = x.eq(&inf)?;
    let neg = x.eq(&inf.neg()?)?;
    let f = Tensor::scalar(false);
    one(match (positive, negative) {
        (true, true) => pos.where_cond(&Tensor::scalar(true), &neg)?,
        (true, false) => pos,
        (false, true) => neg,
        (false, false) => x.ne(&x)?.where_cond(&f, &f)?,
    })
}

/// For a float type, the integer type its truncation goes through and the
/// magnitude (2^23 for f32, 2^52 for f64) from which on every value is
/// an integer; `None` for the integer types, whose values are integral.
fn integral(dtype: DType) -> Option<(DType, f64)> {
    match dtype {
        DType::F32 => Some((DType::I32, 8_388_608.0)),
        DType::F64 => Some((DType::I64, 4_503_599_627_370_496.0)),
        // 2^7 and 2^10: significands of 8 and 11 bits.
        DType::BF16 => Some((DType::I32, 128.0)),
        DType::F16 => Some((DType::I32, 1024.0)),
        DType::I32 | DType::I64 | DType::U8 | DType::Bool => None,
    }
}

/// Rounds toward -inf: truncation by a cast to an integer, less one where
/// that rounded up. Values of magnitude `integral` and above, infinities and
/// NaN are already integral and pass unchanged.
fn floor(x: &Tensor) -> Result<Tensor> {
    let dt = x.dtype();
    let Some((int, limit)) = integral(dt) else {
        return Ok(x.clone());
    };
    let t = x.cast(int)?.cast(dt)?;
    let f = x.lt(&t)?.where_cond(&t.sub(&scalar(1.0, dt))?, &t)?;
    let keep = x.abs()?.ge(&scalar(limit, dt))?;
    let keep = x.ne(x)?.where_cond(&Tensor::scalar(true), &keep)?;
    // Keep the sign of zero and of small negatives rounding to zero, as NumPy.
    let zero = scalar(0.0, dt);
    let f = f.eq(&zero)?.where_cond(&x.mul(&zero)?, &f)?;
    keep.where_cond(x, &f)
}

/// Rounds to the nearest integer, halves to even, as ONNX's `Round`.
fn round(x: &Tensor) -> Result<Tensor> {
    let dt = x.dtype();
    let Some((int, limit)) = integral(dt) else {
        return Ok(x.clone());
    };
    // x + 0.5 is exact below `limit`, so floor(x + 0.5) is the nearest
    // integer with halves rounded up; a half that landed on an odd number
    // goes back.
    let half = scalar(0.5, dt);
    let up = floor(&x.add(&half)?)?;
    let tie = up.sub(x)?.eq(&half)?;
    let odd = up
        .cast(int)?
        .sub(&up.mul(&half)?.cast(int)?.mul(&scalar(2.0, int))?)?
        .ne(&scalar(0.0, int))?;
    let down = tie
        .where_cond(&odd, &Tensor::scalar(false))?
        .where_cond(&up.sub(&scalar(1.0, dt))?, &up)?;
    let keep = x.abs()?.ge(&scalar(limit, dt))?;
    let keep = x.ne(x)?.where_cond(&Tensor::scalar(true), &keep)?;
    let zero = scalar(0.0, dt);
    let down = down.eq(&zero)?.where_cond(&x.mul(&zero)?, &down)?;
    keep.where_cond(x, &down)
}

/// erfc(|x|) by the Chebyshev fit of Numerical Recipes (`erfcc`), whose
/// relative error is below 1.2e-7 everywhere: far inside ONNX's rtol of
/// 1e-3, and relative, so the tails of erf and GELU stay accurate too.
fn erfc_abs(x: &Tensor) -> Result<Tensor> {
    // The coefficients as Numerical Recipes prints them, rounded to f32 for f32.
    const C: [f64; 10] = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let dt = x.dtype();
    let z = x.abs()?;
    let t = z.mul(&scalar(0.5, dt))?.add(&scalar(1.0, dt))?.recip()?;
    let mut poly = scalar(C[9], dt);
    for &c in C[..9].iter().rev() {
        poly = poly.mul(&t)?.add(&scalar(c, dt))?;
    }
    t.mul(&poly.sub(&z.square()?)?.exp()?)
}

/// erf(x) = ±(1 - erfc(|x|)).
fn erf(x: &Tensor) -> Result<Tensor> {
    let dt = x.dtype();
    let one_minus = scalar(1.0, dt).sub(&erfc_abs(x)?)?;
    x.lt(&scalar(0.0, dt))?
        .where_cond(&one_minus.neg()?, &one_minus)
}

/// GELU without approximation, 0.5 x (1 + erf(x / sqrt 2)); for negative x
/// 1 + erf is erfc(|x| / sqrt 2), kept relative in the tail.
fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    let dt = x.dtype();
    let c = erfc_abs(&x.mul(&scalar(std::f64::consts::FRAC_1_SQRT_2, dt))?)?;
    let factor = x
        .lt(&scalar(0.0, dt))?
        .where_cond(&c, &scalar(2.0, dt).sub(&c)?)?;
    x.mul(&scalar(0.5, dt))?.mul(&factor)
}
