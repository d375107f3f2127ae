//! The ONNX ops whose values are known while tracing: `Constant`,
//! `ConstantOfShape`, and `Shape` and `Size` of kiln's static shapes.

use kiln_ir::Data;

use super::shape::sizes;
use super::{numel, one};
use crate::onnx::graph::{Node, Value, known_i64};
use crate::onnx::tensor::Array;
use crate::{Result, Tensor};

/// The node's outputs, or `None` if the op is not one of these.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    Some(match node.op() {
        "Shape" => shape(node),
        "Size" => node
            .dims(0)
            .map(|d| vec![known_i64(vec![], vec![numel(&d) as i64])]),
        "Constant" => constant(node),
        "ConstantOfShape" => constant_of_shape(node),
        _ => return None,
    })
}

fn shape(node: &Node) -> Result<Vec<Value>> {
    let dims = node.dims(0)?;
    let rank = dims.len() as i64;
    let fix = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let start = fix(node.attr_int("start", 0)?);
    let end = fix(node.attr_int("end", rank)?).max(start);
    let values: Vec<i64> = dims[start..end].iter().map(|&d| d as i64).collect();
    Ok(vec![known_i64(vec![values.len()], values)])
}

fn constant(node: &Node) -> Result<Vec<Value>> {
    if let Some(t) = node.attr_tensor("value")? {
        return Ok(vec![Value::Known(t)]);
    }
    let known = |dims: Vec<usize>, data: Data| Ok(vec![Value::Known(Array { dims, data })]);
    if let Some(a) = node.attr("value_float") {
        return known(vec![], Data::F32(vec![a.f]));
    }
    if let Some(v) = node.attr_floats("value_floats")? {
        return known(vec![v.len()], Data::F32(v));
    }
    if let Some(a) = node.attr("value_int") {
        return Ok(vec![known_i64(vec![], vec![a.i])]);
    }
    if let Some(v) = node.attr_ints("value_ints")? {
        return Ok(vec![known_i64(vec![v.len()], v)]);
    }
    for name in ["sparse_value", "value_string", "value_strings"] {
        if node.attr(name).is_some() {
            return Err(node.unsupported(format!("attribute '{name}'")));
        }
    }
    Err(node.invalid("no value"))
}

fn constant_of_shape(node: &Node) -> Result<Vec<Value>> {
    let dims = sizes(node, &node.ints(0)?)?;
    let value = node.attr_tensor("value")?.unwrap_or(Array {
        dims: vec![1],
        data: Data::F32(vec![0.0]),
    });
    if value.len() != 1 {
        return Err(node.invalid("value holds more than one element"));
    }
    // An i64 fill stays known: what it makes is a shape or indices.
    match value.data {
        Data::I64(v) => Ok(vec![known_i64(dims.clone(), vec![v[0]; numel(&dims)])]),
        d => one(Tensor::full(dims, d.get(0))?),
    }
}
