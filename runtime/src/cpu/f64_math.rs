//! The f64 functions generated code calls, one element per call: CLIF has
//! no exp, log or tanh, and `math`'s polynomials are accurate to f32 only,
//! so f64 values go through Rust's own functions, computed as the
//! interpreter computes them. So do f32 values of the trigonometric and
//! hyperbolic functions `math` has no polynomial for
//! (`loops::lanes::called`), widened and rounded back, as the interpreter
//! rounds them.

use kiln_ir::UnaryOp;

/// The code of `op` that `kiln_unary_f64` takes, for the unary ops that
/// need a call; `None` for the others, which CLIF computes exactly.
pub(crate) fn unary_code(op: UnaryOp) -> Option<i64> {
    match op {
        UnaryOp::Exp => Some(0),
        UnaryOp::Log => Some(1),
        UnaryOp::Tanh => Some(2),
        UnaryOp::Sigmoid => Some(3),
        UnaryOp::Sin => Some(4),
        UnaryOp::Cos => Some(5),
        UnaryOp::Tan => Some(6),
        UnaryOp::Asin => Some(7),
        UnaryOp::Acos => Some(8),
        UnaryOp::Atan => Some(9),
        UnaryOp::Sinh => Some(10),
        UnaryOp::Cosh => Some(11),
        UnaryOp::Asinh => Some(12),
        UnaryOp::Acosh => Some(13),
        UnaryOp::Atanh => Some(14),
        UnaryOp::Neg
        | UnaryOp::Sqrt
        | UnaryOp::Recip
        | UnaryOp::Relu
        | UnaryOp::Abs
        | UnaryOp::Detach => None,
    }
}

/// The transcendental of code `op` (`unary_code`) at `x`; NaN for a code
/// that names none.
pub(crate) extern "C" fn kiln_unary_f64(x: f64, op: i64) -> f64 {
    match op {
        0 => x.exp(),
        1 => x.ln(),
        2 => x.tanh(),
        3 => 1.0 / (1.0 + (-x).exp()),
        4 => x.sin(),
        5 => x.cos(),
        6 => x.tan(),
        7 => x.asin(),
        8 => x.acos(),
        9 => x.atan(),
        10 => x.sinh(),
        11 => x.cosh(),
        12 => x.asinh(),
        13 => x.acosh(),
        14 => x.atanh(),
        _ => f64::NAN,
    }
}

/// `x^y` in f64.
pub(crate) extern "C" fn kiln_powd(x: f64, y: f64) -> f64 {
    x.powf(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_its_op() {
        let x = 0.75f64;
        let cases = [
            (UnaryOp::Exp, x.exp()),
            (UnaryOp::Log, x.ln()),
            (UnaryOp::Tanh, x.tanh()),
            (UnaryOp::Sigmoid, 1.0 / (1.0 + (-x).exp())),
            (UnaryOp::Sin, x.sin()),
            (UnaryOp::Cos, x.cos()),
            (UnaryOp::Tan, x.tan()),
            (UnaryOp::Asin, x.asin()),
            (UnaryOp::Acos, x.acos()),
            (UnaryOp::Atan, x.atan()),
            (UnaryOp::Sinh, x.sinh()),
            (UnaryOp::Cosh, x.cosh()),
            (UnaryOp::Asinh, x.asinh()),
            (UnaryOp::Acosh, (1.0 + x).acosh()),
            (UnaryOp::Atanh, x.atanh()),
        ];
        for (op, want) in cases {
            let code = unary_code(op).expect("a called op");
            // acosh is defined from 1.
            let at = if op == UnaryOp::Acosh { 1.0 + x } else { x };
            assert_eq!(kiln_unary_f64(at, code), want, "{op:?}");
        }
        assert!(kiln_unary_f64(x, 99).is_nan());
        assert_eq!(kiln_powd(2.0, 10.0), 1024.0);
    }
}
