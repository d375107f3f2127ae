//! ONNX's convolution and pooling over one or two spatial axes, as
//! `Tensor::conv2d`, `conv_transpose2d`, `max_pool2d` and `avg_pool2d`:
//! `Conv`, `ConvTranspose` (its `output_padding` and `output_shape` too),
//! `MaxPool` and `AveragePool`, their `auto_pad`, `pads`, `strides`, `dilations`,
//! `group`, `kernel_shape`, `ceil_mode` and `count_include_pad`. One
//! spatial axis runs as two, the first of height one. What kiln cannot
//! compute (three spatial axes, MaxPool's indices) is an unsupported `Err`.

use super::one;
use crate::onnx::graph::{Node, Value};
use crate::{Pool2d, Result, Tensor};

/// The node's outputs, or `None` if the op is not one of these.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    Some(match node.op() {
        "Conv" => conv(node),
        "ConvTranspose" => conv_transpose(node),
        "MaxPool" | "AveragePool" => pool(node),
        _ => return None,
    })
}

/// A window's parameters over two spatial axes, as the node gives them.
struct Window {
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    padding: [(usize, usize); 2],
}

/// The input as NCHW: one spatial axis becomes two, the first of height one.
fn as_2d(node: &Node, x: &Tensor) -> Result<Tensor> {
    match x.rank() {
        3 => x.unsqueeze(2),
        4 => Ok(x.clone()),
        5.. => Err(node.unsupported(format!(
            "{} spatial axes (kiln has 2-D windows)",
            x.rank() - 2
        ))),
        _ => Err(node.invalid(format!("input {} has no spatial axes", x.shape()))),
    }
}

/// An ints attribute of one value per spatial axis (`spatial` of them),
/// each at least `min`, or `default` for each axis.
fn per_axis(
    node: &Node,
    name: &str,
    spatial: usize,
    default: usize,
    min: usize,
) -> Result<Vec<usize>> {
    let Some(values) = node.attr_ints(name)? else {
        return Ok(vec![default; spatial]);
    };
    if values.len() != spatial {
        return Err(node.invalid(format!("{name} {values:?} for {spatial} spatial axes")));
    }
    values
        .iter()
        .map(|&v| {
            usize::try_from(v)
                .ok()
                .filter(|&v| v >= min)
                .ok_or_else(|| node.invalid(format!("{name} {values:?}")))
        })
        .collect()
}

/// The window of the node over the spatial axes of `dims`, `kernel` given
/// by the weight for `Conv`, with `auto_pad` resolved into padding.
fn window(node: &Node, dims: &[usize], kernel: Option<Vec<usize>>) -> Result<Window> {
    let spatial = dims.len() - 2;
    let kernel = match (node.attr_ints("kernel_shape")?, kernel) {
        (Some(_), _) => per_axis(node, "kernel_shape", spatial, 1, 1)?,
        (None, Some(k)) => k,
        (None, None) => return Err(node.invalid("kernel_shape is required")),
    };
    let stride = per_axis(node, "strides", spatial, 1, 1)?;
    let dilation = per_axis(node, "dilations", spatial, 1, 1)?;
    let pads = match node.attr_ints("pads")? {
        None => vec![0; 2 * spatial],
        Some(_) => per_axis(node, "pads", 2 * spatial, 0, 0)?,
    };
    let auto_pad = node.attr_string("auto_pad", "NOTSET")?;
    let mut padding: Vec<(usize, usize)> =
        (0..spatial).map(|a| (pads[a], pads[spatial + a])).collect();
    match auto_pad.as_str() {
        "NOTSET" => {}
        "VALID" => padding.fill((0, 0)),
        "SAME_UPPER" | "SAME_LOWER" => {
            // The output keeps ceil(input / stride) positions; the odd one of
            // the padding goes at the end (upper) or the start (lower).
            for a in 0..spatial {
                let len = dims[2 + a];
                let span = dilation[a] * (kernel[a] - 1) + 1;
                let total = ((len.div_ceil(stride[a]) - 1) * stride[a] + span).saturating_sub(len);
                let small = total / 2;
                padding[a] = match auto_pad.as_str() {
                    "SAME_UPPER" => (small, total - small),
                    _ => (total - small, small),
                };
            }
        }
        other => return Err(node.invalid(format!("auto_pad '{other}'"))),
    }
    // One spatial axis is the second of two.
    let two = |v: &[usize], unit: usize| match v {
        [w] => [unit, *w],
        _ => [v[0], v[1]],
    };
    let padding = match padding.as_slice() {
        [w] => [(0, 0), *w],
        _ => [padding[0], padding[1]],
    };
    Ok(Window {
        kernel: two(&kernel, 1),
        stride: two(&stride, 1),
        dilation: two(&dilation, 1),
        padding,
    })
}

/// The result back in the input's rank: one spatial axis drops the height.
fn back(y: Tensor, rank: usize) -> Result<Tensor> {
    match rank {
        3 => y.reshape([y.dims()[0], y.dims()[1], y.dims()[3]]),
        _ => Ok(y),
    }
}

fn conv(node: &Node) -> Result<Vec<Value>> {
    let (x, w) = (node.tensor(0)?, node.tensor(1)?);
    let rank = x.rank();
    let x2 = as_2d(node, &x)?;
    if w.rank() != rank {
        return Err(node.invalid(format!("weight {} for input {}", w.shape(), x.shape())));
    }
    let kernel = w.dims()[2..].to_vec();
    let win = window(node, x.dims(), Some(kernel.clone()))?;
    let given = match kernel.as_slice() {
        [k] => [1, *k],
        ks => [ks[0], ks[1]],
    };
    if win.kernel != given {
        return Err(node.invalid(format!(
            "kernel_shape {:?} for weight {}",
            win.kernel,
            w.shape()
        )));
    }
    let group = usize::try_from(node.attr_int("group", 1)?)
        .map_err(|_| node.invalid("group must be positive"))?;
    let w2 = as_2d(node, &w)?;
    let bias = node.opt_tensor(2)?;
    let y = x2.conv2d(
        &w2,
        bias.as_ref(),
        win.stride,
        win.padding,
        win.dilation,
        group,
    )?;
    one(back(y, rank)?)
}

/// `ConvTranspose`: the padding from `pads`, or worked out from
/// `output_shape` (or `auto_pad`'s `input * stride`) as ONNX says, the odd
/// element of a split at the end for `SAME_UPPER` and at the start
/// otherwise.
fn conv_transpose(node: &Node) -> Result<Vec<Value>> {
    let (x, w) = (node.tensor(0)?, node.tensor(1)?);
    let rank = x.rank();
    let x2 = as_2d(node, &x)?;
    if w.rank() != rank {
        return Err(node.invalid(format!("weight {} for input {}", w.shape(), x.shape())));
    }
    let spatial = rank - 2;
    let kernel = w.dims()[2..].to_vec();
    if node.attr_ints("kernel_shape")?.is_some()
        && per_axis(node, "kernel_shape", spatial, 1, 1)? != kernel
    {
        return Err(node.invalid(format!("kernel_shape for weight {}", w.shape())));
    }
    let stride = per_axis(node, "strides", spatial, 1, 1)?;
    let dilation = per_axis(node, "dilations", spatial, 1, 1)?;
    let extra = per_axis(node, "output_padding", spatial, 0, 0)?;
    let group = usize::try_from(node.attr_int("group", 1)?)
        .map_err(|_| node.invalid("group must be positive"))?;
    let auto_pad = node.attr_string("auto_pad", "NOTSET")?;
    let inputs = &x.dims()[2..];
    if inputs.contains(&0) || kernel.contains(&0) {
        return Err(node.invalid(format!("input {} and weight {}", x.shape(), w.shape())));
    }
    let wanted: Option<Vec<usize>> = match (node.attr_ints("output_shape")?, auto_pad.as_str()) {
        (Some(shape), _) => {
            if shape.len() < spatial {
                return Err(
                    node.invalid(format!("output_shape {shape:?} for {spatial} spatial axes"))
                );
            }
            // The spatial sizes, alone or after N and C.
            let shape = &shape[shape.len() - spatial..];
            let sizes = shape.iter().map(|&s| usize::try_from(s).ok());
            Some(
                sizes
                    .collect::<Option<_>>()
                    .ok_or_else(|| node.invalid("output_shape"))?,
            )
        }
        (None, "SAME_UPPER" | "SAME_LOWER") => {
            Some((0..spatial).map(|a| inputs[a] * stride[a]).collect())
        }
        (None, "NOTSET" | "VALID") => None,
        (None, other) => return Err(node.invalid(format!("auto_pad '{other}'"))),
    };
    let padding: Vec<(usize, usize)> = match wanted {
        Some(out) => (0..spatial)
            .map(|a| {
                let full =
                    stride[a] * (inputs[a] - 1) + extra[a] + (kernel[a] - 1) * dilation[a] + 1;
                let total = full.checked_sub(out[a]).ok_or_else(|| {
                    node.unsupported(format!("output_shape {out:?} past the full output"))
                })?;
                Ok(match auto_pad.as_str() {
                    "SAME_UPPER" => (total / 2, total - total / 2),
                    _ => (total - total / 2, total / 2),
                })
            })
            .collect::<Result<_>>()?,
        None if auto_pad == "VALID" => vec![(0, 0); spatial],
        None => {
            let pads = match node.attr_ints("pads")? {
                None => vec![0; 2 * spatial],
                Some(_) => per_axis(node, "pads", 2 * spatial, 0, 0)?,
            };
            (0..spatial).map(|a| (pads[a], pads[spatial + a])).collect()
        }
    };
    let two = |v: &[usize], unit: usize| match v {
        [w] => [unit, *w],
        _ => [v[0], v[1]],
    };
    let padding = match padding.as_slice() {
        [w] => [(0, 0), *w],
        _ => [padding[0], padding[1]],
    };
    let w2 = as_2d(node, &w)?;
    let bias = node.opt_tensor(2)?;
    let y = x2.conv_transpose2d(
        &w2,
        bias.as_ref(),
        two(&stride, 1),
        padding,
        two(&extra, 0),
        two(&dilation, 1),
        group,
    )?;
    one(back(y, rank)?)
}

fn pool(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let rank = x.rank();
    let x2 = as_2d(node, &x)?;
    let win = window(node, x.dims(), None)?;
    let ceil_mode = node.attr_int("ceil_mode", 0)? != 0;
    let p = Pool2d {
        kernel: win.kernel,
        stride: win.stride,
        padding: win.padding,
        dilation: win.dilation,
        ceil_mode,
    };
    let y = match node.op() {
        "MaxPool" => {
            if node.proto.outputs.get(1).is_some_and(|o| !o.is_empty()) {
                return Err(node.unsupported("the Indices output"));
            }
            if node.attr_int("storage_order", 0)? != 0 {
                return Err(node.unsupported("storage_order 1"));
            }
            x2.max_pool2d(&p)?
        }
        _ => {
            let include = node.attr_int("count_include_pad", 0)? != 0;
            x2.avg_pool2d(&p, include)?
        }
    };
    one(back(y, rank)?)
}
