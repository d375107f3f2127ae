//! The gradients of the trigonometric and hyperbolic functions.

use super::{binary, like, unary};
use crate::Error;
use crate::graph::{Graph, NodeId};
use crate::{BinaryOp, UnaryOp};

/// The gradient of `y = op(x)` for a trigonometric or hyperbolic `op`.
pub(super) fn rule(g: &mut Graph, op: UnaryOp, [x, y, dy]: [NodeId; 3]) -> Result<NodeId, Error> {
    use BinaryOp::{Div, Mul, Sub};
    match op {
        UnaryOp::Sin => {
            let slope = unary(g, UnaryOp::Cos, x)?;
            binary(g, Mul, dy, slope)
        }
        UnaryOp::Cos => {
            let sin = unary(g, UnaryOp::Sin, x)?;
            let product = binary(g, Mul, dy, sin)?;
            unary(g, UnaryOp::Neg, product)
        }
        UnaryOp::Tan => {
            // 1 + tan²
            let one = like(g, 1.0, y)?;
            let yy = binary(g, Mul, y, y)?;
            let slope = binary(g, BinaryOp::Add, one, yy)?;
            binary(g, Mul, dy, slope)
        }
        UnaryOp::Sinh => {
            let slope = unary(g, UnaryOp::Cosh, x)?;
            binary(g, Mul, dy, slope)
        }
        UnaryOp::Cosh => {
            let slope = unary(g, UnaryOp::Sinh, x)?;
            binary(g, Mul, dy, slope)
        }
        // dy / sqrt(1 - x²), its negation, and dy / (1 - x²).
        UnaryOp::Asin | UnaryOp::Acos | UnaryOp::Atanh => {
            let one = like(g, 1.0, x)?;
            let xx = binary(g, Mul, x, x)?;
            let base = binary(g, Sub, one, xx)?;
            let slope = match op {
                UnaryOp::Atanh => base,
                _ => unary(g, UnaryOp::Sqrt, base)?,
            };
            let dx = binary(g, Div, dy, slope)?;
            match op {
                UnaryOp::Acos => unary(g, UnaryOp::Neg, dx),
                _ => Ok(dx),
            }
        }
        // From the output, where x² would overflow a 16-bit float: atan's
        // 1 / (1 + x²) is cos²(y), asinh's 1 / sqrt(x² + 1) is 1 / cosh(y),
        // acosh's 1 / sqrt(x² - 1) is 1 / sinh(y).
        UnaryOp::Atan => {
            let cos = unary(g, UnaryOp::Cos, y)?;
            let slope = binary(g, Mul, cos, cos)?;
            binary(g, Mul, dy, slope)
        }
        UnaryOp::Asinh => {
            let slope = unary(g, UnaryOp::Cosh, y)?;
            binary(g, Div, dy, slope)
        }
        UnaryOp::Acosh => {
            let slope = unary(g, UnaryOp::Sinh, y)?;
            binary(g, Div, dy, slope)
        }
        _ => unreachable!("a trigonometric or hyperbolic op"),
    }
}
