//! ONNX ops as kiln ops: each family's mappings, and the dispatch by op
//! type. A mapping reads the node's inputs and attributes through `Node`
//! and returns one value per output; what it cannot express exactly is an
//! unsupported `Err`, never an approximation beyond ONNX's tolerances.

mod attention;
mod constant;
mod conv;
mod elementwise;
mod fold;
mod index;
mod nn;
mod recurrent;
mod reduce;
mod resize;
mod rotary;
mod shape;

use kiln_ir::{DType, Scalar};

use super::graph::{Node, Value};
use crate::ops::normalize_axis;
use crate::{Result, Tensor};

/// The values the node computes, one per output.
pub(super) fn convert(node: &Node) -> Result<Vec<Value>> {
    let domain = node.proto.domain.as_str();
    if !matches!(domain, "" | "ai.onnx") {
        return Err(node.unsupported(format!("ops of domain '{domain}'")));
    }
    if let Some(values) = fold::fold(node)? {
        return Ok(values);
    }
    let converted = constant::convert(node)
        .or_else(|| elementwise::convert(node))
        .or_else(|| shape::convert(node))
        .or_else(|| index::convert(node))
        .or_else(|| resize::convert(node))
        .or_else(|| recurrent::convert(node))
        .or_else(|| reduce::convert(node))
        .or_else(|| nn::convert(node))
        .or_else(|| attention::convert(node))
        .or_else(|| rotary::convert(node))
        .or_else(|| conv::convert(node));
    match converted {
        Some(values) => values,
        None => Err(node.unsupported("kiln has no mapping for this op")),
    }
}

/// One tensor as the node's only output.
fn one(t: Tensor) -> Result<Vec<Value>> {
    Ok(vec![Value::Tensor(t)])
}

/// An ONNX axis (negative counts from the end) checked against `rank`.
fn axis(node: &Node, axis: i64, rank: usize) -> Result<usize> {
    let a = isize::try_from(axis).map_err(|_| node.invalid(format!("axis {axis}")))?;
    normalize_axis("onnx", a, rank)
        .map_err(|_| node.invalid(format!("axis {axis} is outside rank {rank}")))
}

/// ONNX axes, each normalized against `rank`.
fn axes(node: &Node, list: &[i64], rank: usize) -> Result<Vec<usize>> {
    list.iter().map(|&a| axis(node, a, rank)).collect()
}

/// A rank-0 constant of `dtype` holding `value` (converted as `cast` does;
/// to the narrower integers through i32).
fn scalar(value: f64, dtype: DType) -> Tensor {
    let s = match dtype {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 | DType::I64 => {
            Scalar::F64(value).cast(dtype)
        }
        DType::I32 | DType::U8 | DType::Bool => Scalar::I32(value as i32).cast(dtype),
    };
    Tensor::scalar(s)
}

/// The element count of `dims`.
fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}
