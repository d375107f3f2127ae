//! The gradients of the trigonometric and hyperbolic functions.

use super::{binary, like, unary};
use crate::Error;
use crate::graph::{Graph, NodeId};
use crate::{BinaryOp, TrigOp, UnaryOp};

/// The gradient of `y = op(x)`.
pub(super) fn rule(g: &mut Graph, op: TrigOp, [x, y, dy]: [NodeId; 3]) -> Result<NodeId, Error> {
    use BinaryOp::{Div, Mul, Sub};
    match op {
        TrigOp::Sin => {
            let slope = unary(g, UnaryOp::Trig(TrigOp::Cos), x)?;
            binary(g, Mul, dy, slope)
        }
        TrigOp::Cos => {
            let sin = unary(g, UnaryOp::Trig(TrigOp::Sin), x)?;
            let product = binary(g, Mul, dy, sin)?;
            unary(g, UnaryOp::Neg, product)
        }
        TrigOp::Tan => {
            // 1 + tan²
            let one = like(g, 1.0, y)?;
            let yy = binary(g, Mul, y, y)?;
            let slope = binary(g, BinaryOp::Add, one, yy)?;
            binary(g, Mul, dy, slope)
        }
        TrigOp::Sinh => {
            let slope = unary(g, UnaryOp::Trig(TrigOp::Cosh), x)?;
            binary(g, Mul, dy, slope)
        }
        TrigOp::Cosh => {
            let slope = unary(g, UnaryOp::Trig(TrigOp::Sinh), x)?;
            binary(g, Mul, dy, slope)
        }
        // dy / sqrt(1 - x²), its negation, and dy / (1 - x²).
        TrigOp::Asin | TrigOp::Acos | TrigOp::Atanh => {
            let one = like(g, 1.0, x)?;
            let xx = binary(g, Mul, x, x)?;
            let base = binary(g, Sub, one, xx)?;
            let slope = match op {
                TrigOp::Atanh => base,
                _ => unary(g, UnaryOp::Sqrt, base)?,
            };
            let dx = binary(g, Div, dy, slope)?;
            match op {
                TrigOp::Acos => unary(g, UnaryOp::Neg, dx),
                _ => Ok(dx),
            }
        }
        // From the output, where x² would overflow a 16-bit float: atan's
        // 1 / (1 + x²) is cos²(y), asinh's 1 / sqrt(x² + 1) is 1 / cosh(y),
        // acosh's 1 / sqrt(x² - 1) is 1 / sinh(y).
        TrigOp::Atan => {
            let cos = unary(g, UnaryOp::Trig(TrigOp::Cos), y)?;
            let slope = binary(g, Mul, cos, cos)?;
            binary(g, Mul, dy, slope)
        }
        TrigOp::Asinh => {
            let slope = unary(g, UnaryOp::Trig(TrigOp::Cosh), y)?;
            binary(g, Div, dy, slope)
        }
        TrigOp::Acosh => {
            let slope = unary(g, UnaryOp::Trig(TrigOp::Sinh), y)?;
            binary(g, Div, dy, slope)
        }
    }
}
