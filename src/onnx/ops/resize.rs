//! ONNX `Resize` in the modes exporters emit: `nearest` (every
//! `nearest_mode`) and `linear`, with every `coordinate_transformation_mode`
//! but `tf_crop_and_resize`, from `scales` or `sizes` (`axes` and
//! `keep_aspect_ratio_policy` included). Each resized axis is read at
//! positions computed while compiling: nearest reads one element of the
//! input per element of the output, linear two, mixed by their weights,
//! one axis after another (bilinear is linear along each axis in turn).
//! `cubic` and `antialias` are refused as unsupported.

use kiln_ir::{DType, TensorType};

use super::{axes, one};
use crate::onnx::graph::{Node, Value};
use crate::{Result, Tensor};

/// The mapping of `node`, if it is a `Resize`.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    match node.op() {
        "Resize" => Some(resize(node)),
        _ => None,
    }
}

/// How an output coordinate maps to the input's, as ONNX names it.
#[derive(Clone, Copy)]
enum Transform {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfHalfPixelForNn,
}

fn resize(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let linear = match node.attr_string("mode", "nearest")?.as_str() {
        "nearest" => false,
        "linear" => true,
        other => return Err(node.unsupported(format!("mode '{other}'"))),
    };
    let transform = match node
        .attr_string("coordinate_transformation_mode", "half_pixel")?
        .as_str()
    {
        "half_pixel" => Transform::HalfPixel,
        "half_pixel_symmetric" => Transform::HalfPixelSymmetric,
        "pytorch_half_pixel" => Transform::PytorchHalfPixel,
        "align_corners" => Transform::AlignCorners,
        "asymmetric" => Transform::Asymmetric,
        "tf_half_pixel_for_nn" => Transform::TfHalfPixelForNn,
        other => return Err(node.unsupported(format!("coordinate_transformation_mode '{other}'"))),
    };
    let rounding = match node
        .attr_string("nearest_mode", "round_prefer_floor")?
        .as_str()
    {
        "round_prefer_floor" => Rounding::PreferFloor,
        "round_prefer_ceil" => Rounding::PreferCeil,
        "floor" => Rounding::Floor,
        "ceil" => Rounding::Ceil,
        other => return Err(node.unsupported(format!("nearest_mode '{other}'"))),
    };
    if node.attr_int("antialias", 0)? != 0 {
        return Err(node.unsupported("antialias"));
    }
    // Cubic's and tf_crop_and_resize's alone, both refused above.
    node.attr_float("cubic_coeff_a", -0.75)?;
    node.attr_int("exclude_outside", 0)?;
    node.attr_float("extrapolation_value", 0.0)?;
    let policy = node.attr_string("keep_aspect_ratio_policy", "stretch")?;
    let axes = match node.attr_ints("axes")? {
        Some(list) => axes(node, &list, x.rank())?,
        None => (0..x.rank()).collect(),
    };
    let dims = x.dims().to_vec();
    // The scales decide the output's shape: they must be known (an
    // initializer or a constant, as exporters write them).
    let scales: Option<Vec<f64>> = match (node.has(2), node.known(2)) {
        (_, Some(a)) if !a.is_empty() => {
            Some((0..a.len()).map(|i| a.data.get(i).to_f64()).collect())
        }
        (true, None) if node.dims(2)?.iter().product::<usize>() > 0 => {
            return Err(node.unsupported(
                "input 2 (scales) is computed at run time, and kiln needs its values when compiling",
            ));
        }
        _ => None,
    };
    let sizes = node.opt_ints(3)?.filter(|s| !s.is_empty());
    // (output length, scale) per resized axis.
    let targets: Vec<(usize, f64)> = match (scales, sizes) {
        (Some(scales), None) if scales.len() == axes.len() => {
            if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                return Err(node.invalid(format!("scale {s}")));
            }
            axes.iter()
                .zip(&scales)
                .map(|(&a, &s)| ((dims[a] as f64 * s).floor() as usize, s))
                .collect()
        }
        (None, Some(sizes)) if sizes.len() == axes.len() => {
            if let Some(s) = sizes.iter().find(|&&s| s < 0) {
                return Err(node.invalid(format!("size {s}")));
            }
            let ratios = axes
                .iter()
                .zip(&sizes)
                .map(|(&a, &s)| s as f64 / dims[a] as f64);
            let kept = match policy.as_str() {
                "stretch" => None,
                "not_larger" => Some(ratios.clone().fold(f64::INFINITY, f64::min)),
                "not_smaller" => Some(ratios.clone().fold(0.0, f64::max)),
                other => {
                    return Err(node.unsupported(format!("keep_aspect_ratio_policy '{other}'")));
                }
            };
            match kept {
                Some(s) => axes
                    .iter()
                    .map(|&a| (((dims[a] as f64) * s + 0.5) as usize, s))
                    .collect(),
                None => axes
                    .iter()
                    .zip(ratios)
                    .zip(&sizes)
                    .map(|((_, r), &s)| (s as usize, r))
                    .collect(),
            }
        }
        _ => return Err(node.invalid("exactly one of scales and sizes, one value per axis")),
    };
    // The output addressable before any position is computed.
    let mut out_dims = dims.clone();
    for (&axis, &(out, _)) in axes.iter().zip(&targets) {
        out_dims[axis] = out;
    }
    TensorType::new(x.dtype(), out_dims).checked("Resize")?;
    let mut y = x;
    for (&axis, &(out, scale)) in axes.iter().zip(&targets) {
        let len = dims[axis];
        if out == len && scale == 1.0 {
            continue;
        }
        if len == 0 || out == 0 {
            return Err(node.unsupported("resizing an empty axis, or to none"));
        }
        let from: Vec<f64> = (0..out)
            .map(|i| source(transform, i, (len, out), scale))
            .collect();
        y = if linear {
            along_linear(&y, axis, &from)?
        } else {
            let picks: Vec<i32> = from.iter().map(|&c| nearest(rounding, c, len)).collect();
            y.index_select(axis as isize, &Tensor::from_vec(picks, [out])?)?
        };
    }
    one(y)
}

/// The input coordinate of output position `i` along an axis of `len`
/// resized to `out` elements by `scale`. As ONNX's reference, the
/// resized length in the formulas is `len * scale` unrounded (`out` itself
/// where sizes were given, the scale being `out / len`).
fn source(t: Transform, i: usize, (len, out): (usize, usize), scale: f64) -> f64 {
    let (i, resized) = (i as f64, len as f64 * scale);
    match t {
        Transform::HalfPixel => (i + 0.5) / scale - 0.5,
        Transform::HalfPixelSymmetric => {
            let adjustment = out as f64 / resized;
            let center = len as f64 / 2.0;
            center * (1.0 - adjustment) + (i + 0.5) / scale - 0.5
        }
        Transform::PytorchHalfPixel if resized > 1.0 => (i + 0.5) / scale - 0.5,
        Transform::PytorchHalfPixel => 0.0,
        Transform::AlignCorners if resized != 1.0 => i * (len - 1) as f64 / (resized - 1.0),
        Transform::AlignCorners => 0.0,
        Transform::Asymmetric => i / scale,
        Transform::TfHalfPixelForNn => (i + 0.5) / scale,
    }
}

/// How `nearest` rounds a coordinate, as ONNX's `nearest_mode` names it.
#[derive(Clone, Copy)]
enum Rounding {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
}

/// The position `rounding` picks for coordinate `c`, inside `0..len`.
fn nearest(rounding: Rounding, c: f64, len: usize) -> i32 {
    let half = c.fract().abs() == 0.5;
    let p = match rounding {
        Rounding::PreferFloor if half => c.floor(),
        Rounding::PreferCeil if half => c.ceil(),
        Rounding::PreferFloor | Rounding::PreferCeil => c.round(),
        Rounding::Floor => c.floor(),
        Rounding::Ceil => c.ceil(),
    };
    p.clamp(0.0, (len - 1) as f64) as i32
}

/// `x` along `axis` read at coordinates `from`: each the mix of its two
/// neighbours (the edge element past either end).
fn along_linear(x: &Tensor, axis: usize, from: &[f64]) -> Result<Tensor> {
    let last = x.dims()[axis] as f64 - 1.0;
    let lower: Vec<i32> = from
        .iter()
        .map(|c| c.floor().clamp(0.0, last) as i32)
        .collect();
    let upper: Vec<i32> = from
        .iter()
        .map(|c| (c.floor() + 1.0).clamp(0.0, last) as i32)
        .collect();
    let mut shape = vec![1; x.rank()];
    shape[axis] = from.len();
    let weight = |w: Vec<f64>| -> Result<Tensor> {
        match x.dtype() {
            DType::F64 => Tensor::from_vec(w, shape.clone()),
            _ => Tensor::from_vec(
                w.into_iter().map(|v| v as f32).collect::<Vec<f32>>(),
                shape.clone(),
            ),
        }
    };
    let frac: Vec<f64> = from.iter().map(|c| c - c.floor()).collect();
    let (high, low) = (
        weight(frac.clone())?,
        weight(frac.iter().map(|f| 1.0 - f).collect())?,
    );
    let n = from.len();
    let a = x.index_select(axis as isize, &Tensor::from_vec(lower, [n])?)?;
    let b = x.index_select(axis as isize, &Tensor::from_vec(upper, [n])?)?;
    a.mul(&low)?.add(&b.mul(&high)?)
}
