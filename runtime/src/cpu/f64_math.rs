//! The f64 functions generated code calls, one element per call: CLIF has
//! no exp, log or tanh, and `math`'s polynomials are accurate to f32 only,
//! so f64 values go through Rust's own functions, computed as the
//! interpreter computes them. So do f32 values of the trigonometric and
//! hyperbolic functions `math` has no polynomial for
//! (`loops::lanes::called`), widened and rounded back, as the interpreter
//! rounds them.

use kiln_ir::{TrigOp, UnaryOp};

/// The code of `op` that `kiln_unary_f64` takes, for the unary ops that
/// need a call; `None` for the others, which CLIF computes exactly.
pub(crate) fn unary_code(op: UnaryOp) -> Option<i64> {
    match op {
        UnaryOp::Exp => Some(0),
        UnaryOp::Log => Some(1),
        UnaryOp::Tanh => Some(2),
        UnaryOp::Sigmoid => Some(3),
        UnaryOp::Trig(t) => Some(4 + t as i64),
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
        4..=14 => TrigOp::ALL[(op - 4) as usize].eval(x),
        _ => f64::NAN,
    }
}

/// `x^y` in f64.
pub(crate) extern "C" fn kiln_powd(x: f64, y: f64) -> f64 {
    x.powf(y)
}

/// The remainder of `x / y`, the quotient truncated (C's `fmod`), in f64.
pub(crate) extern "C" fn kiln_remd(x: f64, y: f64) -> f64 {
    x % y
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
        ];
        for (op, want) in cases {
            let code = unary_code(op).expect("a called op");
            assert_eq!(kiln_unary_f64(x, code), want, "{op:?}");
        }
        for t in TrigOp::ALL {
            let code = unary_code(UnaryOp::Trig(t)).expect("a called op");
            // acosh is defined from 1.
            let at = if t == TrigOp::Acosh { 1.0 + x } else { x };
            assert_eq!(kiln_unary_f64(at, code), t.eval(at), "{t:?}");
        }
        assert!(kiln_unary_f64(x, 99).is_nan());
        assert_eq!(kiln_powd(2.0, 10.0), 1024.0);
        assert_eq!(kiln_remd(-7.5, 2.0), -1.5);
    }
}
