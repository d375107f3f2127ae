//! ONNX's movement ops as kiln views and index composites: reshapes,
//! transposes, slices (a negative step through `index_select`),
//! concatenation as a `where` over padded operands, padding in every mode
//! as a gather of positions, and masks over the diagonal.

use kiln_ir::{DType, Scalar, Shape};

use super::{axes, axis, numel, one, scalar};
use crate::onnx::graph::{Node, Value};
use crate::ops::ramp;
use crate::{Result, Tensor};

/// The node's outputs, or `None` if the op is not a movement op.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    Some(match node.op() {
        "Reshape" => reshape(node),
        "Flatten" => flatten(node),
        "Squeeze" => squeeze(node),
        "Unsqueeze" => unsqueeze(node),
        "Transpose" => transpose(node),
        "Expand" => expand(node),
        "Slice" => slice(node),
        "Concat" => concat(node),
        "Split" => split(node),
        "Tile" => tile(node),
        "Pad" => pad(node),
        "CenterCropPad" => center_crop_pad(node),
        "DepthToSpace" => depth_to_space(node),
        "SpaceToDepth" => space_to_depth(node),
        "Trilu" => trilu(node),
        "EyeLike" => eye_like(node),
        _ => return None,
    })
}

/// Known dimensions from i64 values, each checked to be a size.
pub(super) fn sizes(node: &Node, values: &[i64]) -> Result<Vec<usize>> {
    values
        .iter()
        .map(|&v| usize::try_from(v).map_err(|_| node.invalid(format!("dimension {v}"))))
        .collect()
}

/// The dimensions ONNX's `Reshape` gives `dims` for the requested `shape`:
/// 0 copies the input's dimension (unless `allow_zero`), -1 is inferred.
pub(super) fn reshape_dims(
    node: &Node,
    dims: &[usize],
    shape: &[i64],
    allow_zero: bool,
) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(shape.len());
    let mut infer = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allow_zero => {
                out.push(*dims.get(i).ok_or_else(|| {
                    node.invalid(format!("shape {shape:?} copies a missing axis"))
                })?)
            }
            s => out.push(sizes(node, &[s])?[0]),
        }
    }
    if let Some(i) = infer {
        let known = numel(&out);
        if known == 0 || !numel(dims).is_multiple_of(known) {
            return Err(node.invalid(format!("shape {shape:?} does not fit {dims:?}")));
        }
        out[i] = numel(dims) / known;
    }
    Ok(out)
}

fn reshape(node: &Node) -> Result<Vec<Value>> {
    let allow_zero = node.attr_int("allowzero", 0)? != 0;
    let shape = match node.opset < 5 {
        true => node.attr_ints("shape")?.unwrap_or_default(),
        false => node.ints(1)?,
    };
    let x = node.tensor(0)?;
    let dims = reshape_dims(node, x.dims(), &shape, allow_zero)?;
    one(x.reshape(dims)?)
}

/// The flattened dims of `dims` at `axis` (in `[-rank, rank]`).
pub(super) fn flatten_dims(node: &Node, dims: &[usize], axis: i64) -> Result<Vec<usize>> {
    let rank = dims.len() as i64;
    let a = if axis < 0 { axis + rank } else { axis };
    if !(0..=rank).contains(&a) {
        return Err(node.invalid(format!("axis {axis} is outside rank {rank}")));
    }
    let (head, tail) = dims.split_at(a as usize);
    Ok(vec![numel(head), numel(tail)])
}

fn flatten(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let dims = flatten_dims(node, x.dims(), node.attr_int("axis", 1)?)?;
    one(x.reshape(dims)?)
}

/// Axes from the attribute (older opsets) or the optional input `i`.
pub(super) fn axes_param(node: &Node, i: usize) -> Result<Option<Vec<i64>>> {
    match node.attr_ints("axes")? {
        Some(a) => Ok(Some(a)),
        None => node.opt_ints(i),
    }
}

/// The dims after ONNX's `Squeeze` of `axes` (all size-1 axes if none).
pub(super) fn squeeze_dims(
    node: &Node,
    dims: &[usize],
    list: Option<&[i64]>,
) -> Result<Vec<usize>> {
    let squeezed: Vec<usize> = match list {
        Some(list) => axes(node, list, dims.len())?,
        None => (0..dims.len()).filter(|&a| dims[a] == 1).collect(),
    };
    if let Some(&a) = squeezed.iter().find(|&&a| dims[a] != 1) {
        return Err(node.invalid(format!("axis {a} of {dims:?} is not of size 1")));
    }
    Ok((0..dims.len())
        .filter(|a| !squeezed.contains(a))
        .map(|a| dims[a])
        .collect())
}

fn squeeze(node: &Node) -> Result<Vec<Value>> {
    let list = axes_param(node, 1)?;
    let x = node.tensor(0)?;
    let dims = squeeze_dims(node, x.dims(), list.as_deref())?;
    one(x.reshape(dims)?)
}

/// The dims after ONNX's `Unsqueeze` at `list` (axes of the result).
pub(super) fn unsqueeze_dims(node: &Node, dims: &[usize], list: &[i64]) -> Result<Vec<usize>> {
    let rank = dims.len() + list.len();
    let mut at = axes(node, list, rank)?;
    at.sort_unstable();
    if at.windows(2).any(|w| w[0] == w[1]) {
        return Err(node.invalid(format!("axes {list:?} repeat")));
    }
    let mut rest = dims.iter();
    Ok((0..rank)
        .map(|a| match at.contains(&a) {
            true => 1,
            false => rest.next().copied().unwrap_or(1),
        })
        .collect())
}

fn unsqueeze(node: &Node) -> Result<Vec<Value>> {
    let list = axes_param(node, 1)?.ok_or_else(|| node.invalid("no axes"))?;
    let x = node.tensor(0)?;
    let dims = unsqueeze_dims(node, x.dims(), &list)?;
    one(x.reshape(dims)?)
}

fn transpose(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let perm = match node.attr_ints("perm")? {
        Some(p) => axes(node, &p, x.rank())?,
        None => (0..x.rank()).rev().collect(),
    };
    one(x.permute(&perm)?)
}

fn expand(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let shape = Shape::new(&sizes(node, &node.ints(1)?)?);
    // ONNX's Expand broadcasts both ways: the shape may be the smaller.
    let to = Shape::broadcast("Expand", x.shape(), &shape)?;
    one(x.expand(to)?)
}

/// One axis of ONNX's `Slice`: `start`, `end` and `step` clamped to an axis
/// of length `dim` as onnx does, giving the first index and the count.
pub(super) fn slice_range(dim: usize, start: i64, end: i64, step: i64) -> (i64, usize) {
    let d = dim as i64;
    let fix = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (start, end) = (fix(start), fix(end));
    let (start, end) = match step > 0 {
        true => (start.clamp(0, d), end.clamp(0, d)),
        false => (start.clamp(0, (d - 1).max(0)), end.clamp(-1, d - 1)),
    };
    let span = match step > 0 {
        true => end - start,
        false => start - end,
    };
    let count = match span > 0 {
        true => (span + step.abs() - 1) / step.abs(),
        false => 0,
    };
    (start, count as usize)
}

/// `Slice`'s starts, ends, axes and steps.
type SliceParams = (Vec<i64>, Vec<i64>, Option<Vec<i64>>, Option<Vec<i64>>);

/// `Slice`'s parameters: attributes before opset 10, inputs since.
fn slice_params(node: &Node) -> Result<SliceParams> {
    match node.opset < 10 {
        true => Ok((
            node.attr_ints("starts")?.unwrap_or_default(),
            node.attr_ints("ends")?.unwrap_or_default(),
            node.attr_ints("axes")?,
            None,
        )),
        false => Ok((
            node.ints(1)?,
            node.ints(2)?,
            node.opt_ints(3)?,
            node.opt_ints(4)?,
        )),
    }
}

/// The axes, first indices, counts and steps of a `Slice` of `dims`.
pub(super) fn slice_plan(node: &Node, dims: &[usize]) -> Result<Vec<(usize, i64, usize, i64)>> {
    let (starts, ends, axes_list, steps) = slice_params(node)?;
    let n = starts.len();
    let axes_list = axes_list.unwrap_or_else(|| (0..n as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; n]);
    if ends.len() != n || axes_list.len() != n || steps.len() != n {
        return Err(node.invalid("starts, ends, axes and steps differ in length"));
    }
    let resolved = axes(node, &axes_list, dims.len())?;
    (0..n)
        .map(|i| {
            if steps[i] == 0 {
                return Err(node.invalid("a step of 0"));
            }
            let (first, count) = slice_range(dims[resolved[i]], starts[i], ends[i], steps[i]);
            Ok((resolved[i], first, count, steps[i]))
        })
        .collect()
}

fn slice(node: &Node) -> Result<Vec<Value>> {
    let mut x = node.tensor(0)?;
    for (a, first, count, step) in slice_plan(node, x.dims())? {
        x = slice_axis(&x, a, first, count, step)?;
    }
    one(x)
}

/// `count` elements of axis `a` from `first` every `step`: a strided view,
/// or for a negative step a gather of the positions.
fn slice_axis(x: &Tensor, a: usize, first: i64, count: usize, step: i64) -> Result<Tensor> {
    if step > 0 || count == 0 {
        let start = if count == 0 { 0 } else { first as usize };
        let end = start + (count.saturating_sub(1)) * step.max(1) as usize + usize::from(count > 0);
        return x.slice(a as isize, start, end, step.max(1) as usize);
    }
    let positions: Vec<i32> = (0..count as i64)
        .map(|k| (first + k * step) as i32)
        .collect();
    take(x, a, positions)
}

/// The slices of `x` at `positions` (in range) along axis `a`.
fn take(x: &Tensor, a: usize, positions: Vec<i32>) -> Result<Tensor> {
    let n = positions.len();
    x.index_select(a as isize, &Tensor::from_vec(positions, [n])?)
}

fn concat(node: &Node) -> Result<Vec<Value>> {
    let parts: Vec<Tensor> = (0..node.input_count())
        .map(|i| node.tensor(i))
        .collect::<Result<_>>()?;
    let rank = parts.first().map_or(0, Tensor::rank);
    let a = axis(node, node.attr_int("axis", 0)?, rank)?;
    one(Tensor::cat(&parts.iter().collect::<Vec<_>>(), a as isize)?)
}

/// The lengths of `Split`'s outputs along an axis of length `len`.
fn split_lengths(node: &Node, len: usize) -> Result<Vec<usize>> {
    let given = match node.attr_ints("split")? {
        Some(s) => Some(s),
        None if node.opset >= 13 => node.opt_ints(1)?,
        None => None,
    };
    if let Some(s) = given {
        let s = sizes(node, &s)?;
        if s.iter().sum::<usize>() != len {
            return Err(node.invalid(format!("split {s:?} does not sum to {len}")));
        }
        return Ok(s);
    }
    let n = match node.attr_int("num_outputs", 0)? {
        0 => node.proto.outputs.len(),
        n => n as usize,
    };
    if n == 0 {
        return Err(node.invalid("no outputs"));
    }
    let piece = len.div_ceil(n);
    Ok((0..n)
        .map(|i| len.saturating_sub(i * piece).min(piece))
        .collect())
}

fn split(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node, node.attr_int("axis", 0)?, x.rank())?;
    let mut start = 0;
    let mut out = Vec::new();
    for len in split_lengths(node, x.dims()[a])? {
        out.push(Value::Tensor(x.slice(a as isize, start, start + len, 1)?));
        start += len;
    }
    Ok(out)
}

fn tile(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let repeats = sizes(node, &node.ints(1)?)?;
    if repeats.len() != x.rank() {
        return Err(node.invalid(format!("{} repeats for rank {}", repeats.len(), x.rank())));
    }
    // [d0, d1] -> [1, d0, 1, d1] -> [r0, d0, r1, d1] -> [r0*d0, r1*d1].
    let spaced: Vec<usize> = x.dims().iter().flat_map(|&d| [1, d]).collect();
    let wide: Vec<usize> = x
        .dims()
        .iter()
        .zip(&repeats)
        .flat_map(|(&d, &r)| [r, d])
        .collect();
    let out: Vec<usize> = x
        .dims()
        .iter()
        .zip(&repeats)
        .map(|(&d, &r)| d * r)
        .collect();
    one(x.reshape(spaced)?.expand(wide)?.reshape(out)?)
}

/// The position of the input that padded position `p` (of `-before..`)
/// reads in `mode` along an axis of length `len`.
fn pad_source(mode: &str, p: i64, len: i64) -> i64 {
    match mode {
        "edge" => p.clamp(0, len - 1),
        "wrap" => p.rem_euclid(len),
        // reflect: mirror about the first and last elements.
        _ => {
            if len == 1 {
                return 0;
            }
            let period = 2 * (len - 1);
            let q = p.rem_euclid(period);
            if q < len { q } else { period - q }
        }
    }
}

fn pad(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let mode = node.attr_string("mode", "constant")?;
    let (pads, value, axes_list) = match node.opset < 11 {
        true => {
            let pads = match node.attr_ints("pads")? {
                Some(p) => p,
                None => node.attr_ints("paddings")?.unwrap_or_default(),
            };
            (pads, f64::from(node.attr_float("value", 0.0)?), None)
        }
        false => {
            let value = match node.has(2) {
                false => 0.0,
                true => match node.known(2).map(|a| &a.data) {
                    Some(d) if d.len() == 1 => d.get(0).to_f64(),
                    _ => return Err(node.unsupported("a constant_value computed at run time")),
                },
            };
            (node.ints(1)?, value, node.opt_ints(3)?)
        }
    };
    let rank = x.rank();
    let axes_list = match axes_list {
        Some(a) => axes(node, &a, rank)?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes_list.len() {
        return Err(node.invalid(format!("{} pads for {} axes", pads.len(), axes_list.len())));
    }
    let n = axes_list.len();
    let mut y = x;
    let mut grow = vec![(0usize, 0usize); rank];
    for (k, &a) in axes_list.iter().enumerate() {
        let (before, after) = (pads[k], pads[k + n]);
        // Negative pads crop.
        let len = y.dims()[a] as i64;
        let start = (-before).max(0).min(len);
        let end = (len + after.min(0)).max(start);
        if start != 0 || end != len {
            y = y.slice(a as isize, start as usize, end as usize, 1)?;
        }
        grow[a] = (before.max(0) as usize, after.max(0) as usize);
    }
    if mode == "constant" {
        let v = match y.dtype() {
            dtype @ (DType::F32 | DType::F64 | DType::I64) => Scalar::F64(value).cast(dtype),
            dtype => Scalar::I32(value as i32).cast(dtype),
        };
        return one(y.pad(&grow, v)?);
    }
    if !matches!(mode.as_str(), "edge" | "reflect" | "wrap") {
        return Err(node.unsupported(format!("mode '{mode}'")));
    }
    for (a, &(before, after)) in grow.iter().enumerate() {
        if before == 0 && after == 0 {
            continue;
        }
        let len = y.dims()[a] as i64;
        if len == 0 {
            return Err(node.invalid(format!("{mode} padding of an empty axis")));
        }
        let positions = (-(before as i64)..len + after as i64)
            .map(|p| pad_source(&mode, p, len) as i32)
            .collect();
        y = take(&y, a, positions)?;
    }
    one(y)
}

fn block(node: &Node) -> Result<usize> {
    let b = node.attr_int("blocksize", 0)?;
    usize::try_from(b)
        .ok()
        .filter(|&b| b > 0)
        .ok_or_else(|| node.invalid(format!("blocksize {b}")))
}

fn depth_to_space(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let b = block(node)?;
    let crd = node.attr_string("mode", "DCR")? == "CRD";
    let &[n, c, h, w] = x.dims() else {
        return Err(node.invalid(format!("input {} is not 4-D", x.shape())));
    };
    if c % (b * b) != 0 {
        return Err(node.invalid(format!("{c} channels for blocksize {b}")));
    }
    let c2 = c / (b * b);
    let y = match crd {
        true => x
            .reshape([n, c2, b, b, h, w])?
            .permute(&[0, 1, 4, 2, 5, 3])?,
        false => x
            .reshape([n, b, b, c2, h, w])?
            .permute(&[0, 3, 4, 1, 5, 2])?,
    };
    one(y.reshape([n, c2, h * b, w * b])?)
}

fn space_to_depth(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let b = block(node)?;
    let &[n, c, h, w] = x.dims() else {
        return Err(node.invalid(format!("input {} is not 4-D", x.shape())));
    };
    if h % b != 0 || w % b != 0 {
        return Err(node.invalid(format!("{h}x{w} for blocksize {b}")));
    }
    let y = x
        .reshape([n, c, h / b, b, w / b, b])?
        .permute(&[0, 3, 5, 1, 2, 4])?;
    one(y.reshape([n, c * b * b, h / b, w / b])?)
}

/// The column index minus the row index over the last two axes of `dims`,
/// as i32 shaped to broadcast against them.
fn diagonal_offset(dims: &[usize]) -> Result<Tensor> {
    let r = dims.len();
    let rows = ramp(0..dims[r - 2] as i32, r - 2, r)?;
    let cols = ramp(0..dims[r - 1] as i32, r - 1, r)?;
    cols.sub(&rows)
}

fn trilu(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    if x.rank() < 2 {
        return Err(node.invalid(format!("input {} has rank below 2", x.shape())));
    }
    let upper = node.attr_int("upper", 1)? != 0;
    let limit = (x.dims()[x.rank() - 2] + x.dims()[x.rank() - 1]) as i64;
    let k = node.opt_ints(1)?.map_or(Ok(0), |k| match k.as_slice() {
        [k] => Ok(*k),
        _ => Err(node.invalid("k is not one value")),
    })?;
    // Beyond the matrix's size every k keeps all or nothing alike.
    let k = k.clamp(-limit, limit) as i32;
    let offset = diagonal_offset(x.dims())?;
    let keep = match upper {
        true => offset.ge(&Tensor::scalar(k))?,
        false => offset.le(&Tensor::scalar(k))?,
    };
    one(keep.where_cond(&x, &scalar(0.0, x.dtype()))?)
}

fn eye_like(node: &Node) -> Result<Vec<Value>> {
    let dims = node.dims(0)?;
    let dtype = match node.attr("dtype") {
        Some(a) => crate::onnx::tensor::kiln_dtype(a.i).ok_or_else(|| {
            node.unsupported(format!("dtype {}", crate::onnx::tensor::dtype_name(a.i)))
        })?,
        None => node.tensor(0)?.dtype(),
    };
    if dims.len() != 2 {
        return Err(node.invalid(format!("input {dims:?} is not 2-D")));
    }
    let k = node.attr_int("k", 0)?.clamp(-(1 << 30), 1 << 30) as i32;
    let on = diagonal_offset(&dims)?.eq(&Tensor::scalar(k))?;
    one(on.where_cond(&scalar(1.0, dtype), &scalar(0.0, dtype))?)
}

/// Each axis cropped or zero-padded to its target length about its
/// centre; an odd difference puts the extra element at the end.
fn center_crop_pad(node: &Node) -> Result<Vec<Value>> {
    let mut x = node.tensor(0)?;
    let targets = sizes(node, &node.ints(1)?)?;
    let list = match node.attr_ints("axes")? {
        Some(a) => axes(node, &a, x.rank())?,
        None => (0..x.rank()).collect(),
    };
    if targets.len() != list.len() {
        return Err(node.invalid(format!("{} lengths for {} axes", targets.len(), list.len())));
    }
    for (&a, &want) in list.iter().zip(&targets) {
        let dim = x.dims()[a];
        if want < dim {
            let start = (dim - want) / 2;
            x = x.slice(a as isize, start, start + want, 1)?;
        } else if want > dim {
            let mut pads = vec![(0, 0); x.rank()];
            let before = (want - dim) / 2;
            pads[a] = (before, want - dim - before);
            x = x.pad(&pads, Scalar::I32(0).cast(x.dtype()))?;
        }
    }
    one(x)
}
