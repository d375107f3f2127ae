//! ONNX's reductions over kiln's sum, max and prod: min as a max of the order
//! reversed, the norms and log-sums as elementwise ops around a sum, with
//! ONNX's rules for axes (an attribute in older opsets, an input since),
//! `keepdims` and `noop_with_empty_axes`.

use kiln_ir::{DType, ReduceOp, Scalar};

use super::{axes, axis, numel, one, scalar};
use crate::onnx::graph::{Node, Value};
use crate::onnx::ops::shape::axes_param;
use crate::{Result, Tensor};

/// The node's outputs, or `None` if the op is not a reduction.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    let kind = match node.op() {
        "ReduceSum" => Kind::Sum,
        "ReduceMean" => Kind::Mean,
        "ReduceMax" => Kind::Max,
        "ReduceMin" => Kind::Min,
        "ReduceProd" => Kind::Prod,
        "ReduceL1" => Kind::L1,
        "ReduceL2" => Kind::L2,
        "ReduceSumSquare" => Kind::SumSquare,
        "ReduceLogSum" => Kind::LogSum,
        "ReduceLogSumExp" => Kind::LogSumExp,
        "GlobalAveragePool" | "GlobalMaxPool" => return Some(global_pool(node)),
        "ArgMax" => return Some(arg_extreme(node, false)),
        "ArgMin" => return Some(arg_extreme(node, true)),
        "CumSum" => return Some(running(node, ReduceOp::Sum)),
        "CumProd" => return Some(running(node, ReduceOp::Prod)),
        "TopK" => return Some(top_k(node)),
        _ => return None,
    };
    Some(reduce(node, kind))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    SumSquare,
    LogSum,
    LogSumExp,
}

fn reduce(node: &Node, kind: Kind) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let keep = node.attr_int("keepdims", 1)? != 0;
    let noop = node.attr_int("noop_with_empty_axes", 0)? != 0;
    let list = axes_param(node, 1)?.unwrap_or_default();
    // No axes reduce all of them, unless asked to reduce none.
    let list: Vec<usize> = match (list.is_empty(), noop) {
        (true, true) => Vec::new(),
        (true, false) => (0..x.rank()).collect(),
        (false, _) => axes(node, &list, x.rank())?,
    };
    let signed: Vec<isize> = list.iter().map(|&a| a as isize).collect();
    let count = numel(&list.iter().map(|&a| x.dims()[a]).collect::<Vec<_>>());
    let sum = |t: &Tensor| t.sum(&signed, keep);
    let empty = count == 0 && !list.is_empty();
    let y = match kind {
        Kind::Sum => sum(&x)?,
        Kind::Mean => sum(&x)?.div(&scalar(count as f64, x.dtype()))?,
        Kind::Max | Kind::Min if empty => {
            // ONNX gives the identity of the order: -inf (or the type's
            // lowest value) for max, its highest for min.
            let dims = reduced_dims(x.dims(), &list, keep);
            let value = match (kind, x.dtype().is_float()) {
                (Kind::Max, true) => f64::NEG_INFINITY,
                (Kind::Min, true) => f64::INFINITY,
                _ => return Err(node.unsupported("an empty integer reduction")),
            };
            Tensor::full(dims, Scalar::F64(value).cast(x.dtype()))?
        }
        Kind::Max => max(&x, &signed, keep)?,
        Kind::Min => min(&x, &signed, keep)?,
        // 1 over an empty axis, as ONNX's identity of the product.
        Kind::Prod => x.prod(&signed, keep)?,
        Kind::L1 => sum(&x.abs()?)?,
        Kind::L2 => sum(&x.square()?)?.sqrt()?,
        Kind::SumSquare => sum(&x.square()?)?,
        Kind::LogSum => sum(&x)?.log()?,
        Kind::LogSumExp => {
            if empty {
                sum(&x)?.log()?
            } else {
                let m = max(&x, &signed, true)?;
                let s = x.sub(&m)?.exp()?.sum(&signed, true)?.log()?.add(&m)?;
                s.reshape(reduced_dims(x.dims(), &list, keep))?
            }
        }
    };
    one(y)
}

/// The dims of reducing `axes` of `dims`, kept as 1 or dropped.
fn reduced_dims(dims: &[usize], axes: &[usize], keep: bool) -> Vec<usize> {
    (0..dims.len())
        .filter_map(|a| match (axes.contains(&a), keep) {
            (false, _) => Some(dims[a]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// Max over `axes`; bool through u8, which kiln's max takes.
fn max(x: &Tensor, axes: &[isize], keep: bool) -> Result<Tensor> {
    match x.dtype() {
        DType::Bool => x.cast(DType::U8)?.max(axes, keep)?.cast(DType::Bool),
        _ => x.max(axes, keep),
    }
}

/// Min over `axes` as the max of the order reversed, exactly: -x for f32
/// (NaN stays NaN), -1 - x (bitwise not) for i32 and i64, 255 - x for u8.
fn min(x: &Tensor, axes: &[isize], keep: bool) -> Result<Tensor> {
    match x.dtype() {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => x.neg()?.max(axes, keep)?.neg(),
        DType::I32 => {
            let flip = |t: &Tensor| Tensor::scalar(-1i32).sub(t);
            flip(&flip(x)?.max(axes, keep)?)
        }
        DType::I64 => {
            let flip = |t: &Tensor| Tensor::scalar(-1i64).sub(t);
            flip(&flip(x)?.max(axes, keep)?)
        }
        DType::U8 => {
            let flip = |t: &Tensor| Tensor::scalar(u8::MAX).sub(t);
            flip(&flip(x)?.max(axes, keep)?)
        }
        DType::Bool => min(&x.cast(DType::U8)?, axes, keep)?.cast(DType::Bool),
    }
}

/// ArgMax or ArgMin: the index of the first (or with `select_last_index`
/// the last) largest or smallest element along `axis`, as INT64; NaN
/// counts as the extreme, as NumPy's.
fn arg_extreme(node: &Node, smallest: bool) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node, node.attr_int("axis", 0)?, x.rank())?;
    let keep = node.attr_int("keepdims", 1)? != 0;
    let last = node.attr_int("select_last_index", 0)? != 0;
    let pick = |t: &Tensor| match smallest {
        true => t.argmin(a as isize, keep),
        false => t.argmax(a as isize, keep),
    };
    let index = match last {
        // The first extreme of the axis reversed is the last of the original.
        true => {
            let len = x.dims()[a];
            let reversed: Vec<i32> = (0..len as i32).rev().collect();
            let flipped = x.index_select(a as isize, &Tensor::from_vec(reversed, [len])?)?;
            scalar(len as f64 - 1.0, DType::I32).sub(&pick(&flipped)?)?
        }
        false => pick(&x)?,
    };
    one(index.cast(DType::I64)?)
}

/// The mean or max over every spatial axis (2 onwards), kept as size 1.
fn global_pool(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let spatial: Vec<isize> = (2..x.rank() as isize).collect();
    one(match node.op() {
        "GlobalMaxPool" => max(&x, &spatial, true)?,
        _ => x.mean(&spatial, true)?,
    })
}

/// Running sums (`CumSum`) or products (`CumProd`) along the axis input 1
/// names (known when compiling), with `exclusive` and `reverse`.
fn running(node: &Node, op: ReduceOp) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node, node.int(1)?, x.rank())?;
    let exclusive = node.attr_int("exclusive", 0)? != 0;
    let reverse = node.attr_int("reverse", 0)? != 0;
    one(x.running(op, a as isize, (exclusive, reverse))?)
}

/// The `k` (input 1, known when compiling; an attribute before opset 10)
/// largest or smallest elements along `axis`, and their indices; sorted
/// whether `sorted` asks or not (any order is allowed then).
fn top_k(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let k = match node.opset < 10 {
        true => node.attr_int("k", 0)?,
        false => match node.ints(1)?.as_slice() {
            [k] => *k,
            other => return Err(node.invalid(format!("K {other:?} is not one value"))),
        },
    };
    let k = usize::try_from(k).map_err(|_| node.invalid(format!("K {k}")))?;
    let a = axis(node, node.attr_int("axis", -1)?, x.rank())?;
    let largest = node.attr_int("largest", 1)? != 0;
    node.attr_int("sorted", 1)?;
    let (values, indices) = x.topk(k, a as isize, largest)?;
    Ok(vec![Value::Tensor(values), Value::Tensor(indices)])
}
