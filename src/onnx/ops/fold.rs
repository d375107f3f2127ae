//! Constant folding of ONNX's integer shape computations: a node whose
//! inputs are all known while tracing and one of which is INT64 (a shape,
//! axes, indices) is computed here, on the host, because kiln compiles for
//! static shapes and must know them while tracing. What exported models do
//! with shapes (`Shape`, then `Gather`, `Concat`, arithmetic, into
//! `Reshape`) stays known this way.
//!
//! Values bound from graph inputs (`Value::Bound`) are only moved here
//! (reshaped, sliced, gathered, concatenated), never computed on: that
//! would be computing on an input outside kiln.

use kiln_ir::{DType, Data};

use super::axis;
use super::shape::{
    axes_param, flatten_dims, reshape_dims, slice_plan, squeeze_dims, unsqueeze_dims,
};
use crate::onnx::graph::{Node, Value};
use crate::onnx::tensor::{Array, code, kiln_dtype};
use crate::{Result, Shape};

/// Integers (bools as 0 and 1) under their dims: a known input as the
/// folds read it.
struct Host {
    dims: Vec<usize>,
    v: Vec<i64>,
}

/// The node's outputs computed on the host, or `None` where the node is
/// not a shape computation on known values.
pub(super) fn fold(node: &Node) -> Result<Option<Vec<Value>>> {
    let given: Vec<&Value> = (0..node.input_count())
        .filter(|&i| node.has(i))
        .filter_map(|i| node.value(i).ok())
        .collect();
    let arrays: Option<Vec<&Array>> = given.iter().map(|v| v.array()).collect();
    let Some(arrays) = arrays else {
        return Ok(None);
    };
    let any_i64 = arrays.iter().any(|a| matches!(a.data, Data::I64(_)));
    let any_float = arrays
        .iter()
        .any(|a| matches!(a.data, Data::F32(_) | Data::F64(_)));
    let to_i64 = node.op() == "Cast"
        && node
            .proto
            .attributes
            .iter()
            .any(|a| a.name == "to" && a.i == code::INT64);
    // Logic on the bools that folded comparisons made stays folded too.
    let all_bool = arrays.iter().all(|a| matches!(a.data, Data::Bool(_)));
    let logic = all_bool && matches!(node.op(), "Not" | "And" | "Or" | "Xor");
    if arrays.is_empty() || !(any_i64 || to_i64 || logic) || (any_float && !to_i64) {
        return Ok(None);
    }
    let bound = given.iter().any(|v| matches!(v, Value::Bound(_)));
    let moved = match node.op() {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Slice" | "Expand" => {
            let x = host(node, 0)?;
            let dims = moved_dims(node, &x)?;
            let v = match node.op() {
                "Slice" => slice(node, &x)?,
                "Expand" => broadcast(&x, &dims),
                _ => x.v,
            };
            Some(Host { dims, v })
        }
        "Concat" => Some(concat(node)?),
        "Gather" => Some(gather(node)?),
        _ => None,
    };
    if let Some(h) = moved {
        let out = like_first(node, h);
        let data_bound =
            matches!(node.value(0)?, Value::Bound(_)) || node.op() == "Concat" && bound;
        return Ok(Some(vec![match data_bound {
            true => Value::Bound(out),
            false => Value::Known(out),
        }]));
    }
    if bound {
        return Ok(None);
    }
    let out = match node.op() {
        "Cast" => cast(node, arrays[0])?,
        "Neg" => map(node, |x| x.wrapping_neg())?,
        "Abs" => map(node, |x| x.wrapping_abs())?,
        "Add" => zip(node, |a, b| Some(a.wrapping_add(b)))?,
        "Sub" => zip(node, |a, b| Some(a.wrapping_sub(b)))?,
        "Mul" => zip(node, |a, b| Some(a.wrapping_mul(b)))?,
        // Integer division truncates, as onnx's reference does.
        "Div" => zip(node, |a, b| a.checked_div(b))?,
        "Mod" => {
            let c_style = node.attr_int("fmod", 0)? != 0;
            zip(node, move |a, b| match c_style {
                true => a.checked_rem(b),
                // The sign of the divisor, as Python's %.
                false => a.checked_rem(b).map(|r| {
                    if r != 0 && (r < 0) != (b < 0) {
                        r + b
                    } else {
                        r
                    }
                }),
            })?
        }
        "Max" => zip(node, |a, b| Some(a.max(b)))?,
        "Min" => zip(node, |a, b| Some(a.min(b)))?,
        "Equal" => compare(node, |a, b| a == b)?,
        "Less" => compare(node, |a, b| a < b)?,
        "LessOrEqual" => compare(node, |a, b| a <= b)?,
        "Greater" => compare(node, |a, b| a > b)?,
        "GreaterOrEqual" => compare(node, |a, b| a >= b)?,
        "Where" => where_(node)?,
        "Not" => {
            let x = host(node, 0)?;
            bools(x.dims, x.v.iter().map(|&b| b == 0).collect())
        }
        "And" => compare(node, |a, b| a != 0 && b != 0)?,
        "Or" => compare(node, |a, b| a != 0 || b != 0)?,
        "Xor" => compare(node, |a, b| (a != 0) != (b != 0))?,
        "Range" => range(node)?,
        _ => return Ok(None),
    };
    Ok(Some(vec![Value::Known(out)]))
}

/// Known input `i` as integers.
fn host(node: &Node, i: usize) -> Result<Host> {
    let a = node
        .known(i)
        .ok_or_else(|| node.invalid(format!("input {i} is not known")))?;
    let v = match &a.data {
        Data::Bool(b) => b.iter().map(|&b| i64::from(b)).collect(),
        _ => a
            .ints()
            .ok_or_else(|| node.invalid(format!("input {i} is not integers")))?,
    };
    Ok(Host {
        dims: a.dims.clone(),
        v,
    })
}

fn i64_array(h: Host) -> Array {
    Array::i64(h.dims, h.v)
}

/// Values moved out of the node's first input, in its element type: a
/// shape stays INT64, and an i32, u8 or bool constant reshaped or
/// broadcast by an INT64 shape stays what it was.
fn like_first(node: &Node, h: Host) -> Array {
    let Some(d) = node.known(0).map(|a| &a.data) else {
        return i64_array(h);
    };
    let data = match d.dtype() {
        DType::I64 => Data::I64(h.v),
        DType::I32 => Data::I32(h.v.iter().map(|&v| v as i32).collect()),
        DType::U8 => Data::U8(h.v.iter().map(|&v| v as u8).collect()),
        DType::Bool => Data::Bool(h.v.iter().map(|&v| v != 0).collect()),
        // Floats are never folded (see `fold`), so never moved here.
        DType::F32 => Data::F32(h.v.iter().map(|&v| v as f32).collect()),
        DType::F64 => Data::F64(h.v.iter().map(|&v| v as f64).collect()),
        DType::BF16 => Data::BF16(
            h.v.iter()
                .map(|&v| kiln_ir::bf16::from_f64(v as f64))
                .collect(),
        ),
        DType::F16 => Data::F16(
            h.v.iter()
                .map(|&v| kiln_ir::f16::from_f64(v as f64))
                .collect(),
        ),
    };
    Array { dims: h.dims, data }
}

/// The dims a movement op gives its first input.
fn moved_dims(node: &Node, x: &Host) -> Result<Vec<usize>> {
    match node.op() {
        "Reshape" => {
            let allow_zero = node.attr_int("allowzero", 0)? != 0;
            reshape_dims(node, &x.dims, &node.ints(1)?, allow_zero)
        }
        "Flatten" => flatten_dims(node, &x.dims, node.attr_int("axis", 1)?),
        "Squeeze" => squeeze_dims(node, &x.dims, axes_param(node, 1)?.as_deref()),
        "Unsqueeze" => {
            let list = axes_param(node, 1)?.ok_or_else(|| node.invalid("no axes"))?;
            unsqueeze_dims(node, &x.dims, &list)
        }
        "Slice" => Ok(slice_plan(node, &x.dims)?.into_iter().fold(
            x.dims.clone(),
            |mut d, (a, _, count, _)| {
                d[a] = count;
                d
            },
        )),
        _ => {
            let shape: Vec<usize> = node
                .ints(1)?
                .iter()
                .map(|&d| usize::try_from(d).map_err(|_| node.invalid(format!("dimension {d}"))))
                .collect::<Result<_>>()?;
            let to = Shape::broadcast("Expand", &Shape::new(&x.dims), &Shape::new(&shape))?;
            Ok(to.dims().to_vec())
        }
    }
}

/// The elements at every combination of `positions` (one list per axis).
fn select(dims: &[usize], v: &[i64], positions: &[Vec<usize>]) -> Vec<i64> {
    let strides = Shape::new(dims).strides();
    let mut out = vec![0i64];
    for (list, &stride) in positions.iter().zip(&strides) {
        out = out
            .iter()
            .flat_map(|&base| list.iter().map(move |&p| base + (p * stride) as i64))
            .collect();
    }
    out.iter().map(|&o| v[o as usize]).collect()
}

/// `x` broadcast to `dims` by NumPy rules.
fn broadcast(x: &Host, dims: &[usize]) -> Vec<i64> {
    let lead = dims.len() - x.dims.len();
    let mut padded = vec![1; lead];
    padded.extend_from_slice(&x.dims);
    let positions: Vec<Vec<usize>> = padded
        .iter()
        .zip(dims)
        .map(|(&d, &n)| match d == 1 {
            true => vec![0; n],
            false => (0..n).collect(),
        })
        .collect();
    select(&padded, &x.v, &positions)
}

fn slice(node: &Node, x: &Host) -> Result<Vec<i64>> {
    let mut positions: Vec<Vec<usize>> = x.dims.iter().map(|&d| (0..d).collect()).collect();
    for (a, first, count, step) in slice_plan(node, &x.dims)? {
        positions[a] = (0..count as i64)
            .map(|k| (first + k * step) as usize)
            .collect();
    }
    Ok(select(&x.dims, &x.v, &positions))
}

fn concat(node: &Node) -> Result<Host> {
    let parts: Vec<Host> = (0..node.input_count())
        .map(|i| host(node, i))
        .collect::<Result<_>>()?;
    let first = parts.first().ok_or_else(|| node.invalid("no inputs"))?;
    let a = axis(node, node.attr_int("axis", 0)?, first.dims.len())?;
    let outer: usize = first.dims[..a].iter().product();
    let mut dims = first.dims.clone();
    dims[a] = parts.iter().map(|p| p.dims[a]).sum();
    let mut v = Vec::new();
    for o in 0..outer {
        for p in &parts {
            let chunk: usize = p.dims[a..].iter().product();
            v.extend_from_slice(&p.v[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(Host { dims, v })
}

fn gather(node: &Node) -> Result<Host> {
    let (x, idx) = (host(node, 0)?, host(node, 1)?);
    let a = axis(node, node.attr_int("axis", 0)?, x.dims.len())?;
    let len = x.dims[a] as i64;
    let picks = idx
        .v
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + len } else { i };
            match (0..len).contains(&j) {
                true => Ok(j as usize),
                false => Err(node.invalid(format!("index {i} is outside an axis of {len}"))),
            }
        })
        .collect::<Result<Vec<usize>>>()?;
    let mut positions: Vec<Vec<usize>> = x.dims.iter().map(|&d| (0..d).collect()).collect();
    positions[a] = picks;
    let v = select(&x.dims, &x.v, &positions);
    let mut dims = x.dims[..a].to_vec();
    dims.extend_from_slice(&idx.dims);
    dims.extend_from_slice(&x.dims[a + 1..]);
    Ok(Host { dims, v })
}

/// `Cast` of known values, with the semantics of kiln's own cast.
fn cast(node: &Node, a: &Array) -> Result<Array> {
    let to = node.attr_int("to", 0)?;
    node.attr_int("saturate", 1)?;
    let Some(dtype) = kiln_dtype(to) else {
        return Err(node.unsupported(format!(
            "casting to {}",
            crate::onnx::tensor::dtype_name(to)
        )));
    };
    let data = Data::from_fn(dtype, a.data.len(), |i| a.data.get(i).cast(dtype))
        .map_err(|e| node.invalid(format!("out of memory ({} bytes)", e.bytes)))?;
    Ok(Array {
        dims: a.dims.clone(),
        data,
    })
}

fn map(node: &Node, f: fn(i64) -> i64) -> Result<Array> {
    let x = host(node, 0)?;
    Ok(Array::i64(x.dims, x.v.into_iter().map(f).collect()))
}

/// The inputs broadcast against each other.
fn broadcast_all(node: &Node, n: usize) -> Result<(Vec<usize>, Vec<Vec<i64>>)> {
    let hosts: Vec<Host> = (0..n).map(|i| host(node, i)).collect::<Result<_>>()?;
    let mut shape = Shape::new(&hosts[0].dims);
    for h in &hosts[1..] {
        shape = Shape::broadcast("onnx fold", &shape, &Shape::new(&h.dims))?;
    }
    let dims = shape.dims().to_vec();
    let values = hosts.iter().map(|h| broadcast(h, &dims)).collect();
    Ok((dims, values))
}

fn zip(node: &Node, f: impl Fn(i64, i64) -> Option<i64>) -> Result<Array> {
    let (dims, v) = broadcast_all(node, 2)?;
    let out = v[0]
        .iter()
        .zip(&v[1])
        .map(|(&a, &b)| f(a, b).ok_or_else(|| node.invalid("integer division by zero")))
        .collect::<Result<_>>()?;
    Ok(Array::i64(dims, out))
}

fn compare(node: &Node, f: fn(i64, i64) -> bool) -> Result<Array> {
    let (dims, v) = broadcast_all(node, 2)?;
    Ok(bools(
        dims,
        v[0].iter().zip(&v[1]).map(|(&a, &b)| f(a, b)).collect(),
    ))
}

fn bools(dims: Vec<usize>, values: Vec<bool>) -> Array {
    Array {
        dims,
        data: Data::Bool(values),
    }
}

fn where_(node: &Node) -> Result<Array> {
    let (dims, v) = broadcast_all(node, 3)?;
    let out = (0..v[0].len())
        .map(|i| if v[0][i] != 0 { v[1][i] } else { v[2][i] })
        .collect();
    Ok(Array::i64(dims, out))
}

fn range(node: &Node) -> Result<Array> {
    let (start, limit, delta) = (node.int(0)?, node.int(1)?, node.int(2)?);
    if delta == 0 {
        return Err(node.invalid("a delta of 0"));
    }
    let span = limit.saturating_sub(start);
    let count = match (span > 0) == (delta > 0) && span != 0 {
        true => (span.abs() + delta.abs() - 1) / delta.abs(),
        false => 0,
    };
    let v: Vec<i64> = (0..count).map(|k| start + k * delta).collect();
    Ok(Array::i64(vec![v.len()], v))
}
