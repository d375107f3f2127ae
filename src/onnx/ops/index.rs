//! Index ops: `Gather`, `GatherElements`, `ScatterElements` (and the
//! older `Scatter`), over indices known while compiling or fed at run time.

use super::{axis, one};
use crate::onnx::graph::{Node, Value};
use crate::{DType, Result, Tensor};

/// The mapping of `node`, if it is an index op.
pub(super) fn convert(node: &Node) -> Option<Result<Vec<Value>>> {
    Some(match node.op() {
        "Gather" => gather(node),
        "GatherElements" => gather_elements(node),
        "ScatterElements" | "Scatter" => scatter_elements(node),
        _ => return None,
    })
}

/// Known indices along an axis of length `len`, negative ones counted from
/// the end, as i32; one out of range is an error.
fn known_indices(node: &Node, values: &[i64], len: usize) -> Result<Vec<i32>> {
    values
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + len as i64 } else { i };
            match (0..len as i64).contains(&j) {
                true => Ok(j as i32),
                false => Err(node.invalid(format!("index {i} is outside an axis of {len}"))),
            }
        })
        .collect()
}

/// Input `i`'s indices into an axis of `len` with their dims, where they
/// are known: checked and normalized (as i32).
fn known_values(node: &Node, i: usize, len: usize) -> Result<Option<(Vec<i32>, Vec<usize>)>> {
    let Some(a) = node.known(i) else {
        return Ok(None);
    };
    let values = a
        .ints()
        .ok_or_else(|| node.invalid(format!("input {i} is not integers")))?;
    Ok(Some((known_indices(node, &values, len)?, a.dims.clone())))
}

/// Indices as a tensor: known ones checked and normalized (as i32),
/// run-time i32 or i64 ones with negatives counted from the end.
fn indices(node: &Node, i: usize, len: usize) -> Result<Tensor> {
    match known_values(node, i, len)? {
        Some((values, dims)) => Tensor::from_vec(values, dims),
        None => runtime_indices(node, i),
    }
}

/// Input `i` as indices given at run time: they count from the end when
/// negative in `gather` itself, as ONNX's do.
fn runtime_indices(node: &Node, i: usize) -> Result<Tensor> {
    let t = node.tensor(i)?;
    let dtype = t.dtype();
    if !matches!(dtype, DType::I32 | DType::I64) {
        return Err(node.unsupported(format!("indices of {dtype}")));
    }
    Ok(t)
}

fn gather(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node, node.attr_int("axis", 0)?, x.rank())?;
    let output = |index_dims: &[usize]| {
        let mut dims = x.dims()[..a].to_vec();
        dims.extend_from_slice(index_dims);
        dims.extend_from_slice(&x.dims()[a + 1..]);
        dims
    };
    let idx = match known_values(node, 1, x.dims()[a])? {
        // Known indices that step evenly (one index, or attention's split of
        // a fused q, k, v projection) pick a slice: a view, read where it lies.
        Some((values, dims)) => match even_steps(&values) {
            Some((start, step)) => {
                let end = start + step * (values.len() - 1) + 1;
                let sliced = x.slice(a as isize, start, end, step)?;
                return one(sliced.reshape(output(&dims))?);
            }
            None => Tensor::from_vec(values, dims)?,
        },
        None => runtime_indices(node, 1)?,
    };
    let picked = x.index_select(a as isize, &idx.reshape([idx.numel()])?)?;
    one(picked.reshape(output(idx.dims()))?)
}

/// The first index and the step of `indices` when they rise by one step of
/// at least 1 each (a single index steps by 1); `None` otherwise.
fn even_steps(indices: &[i32]) -> Option<(usize, usize)> {
    let first = usize::try_from(*indices.first()?).ok()?;
    let step = match indices {
        [a, b, ..] => usize::try_from(b - a).ok().filter(|&s| s >= 1)?,
        _ => 1,
    };
    // A fall is negative, which no step equals.
    let even = indices
        .windows(2)
        .all(|w| usize::try_from(w[1] - w[0]) == Ok(step));
    even.then_some((first, step))
}

fn gather_elements(node: &Node) -> Result<Vec<Value>> {
    let x = node.tensor(0)?;
    let a = axis(node, node.attr_int("axis", 0)?, x.rank())?;
    let idx = indices(node, 1, x.dims()[a])?;
    if idx.rank() != x.rank() {
        return Err(node.invalid("indices and data differ in rank"));
    }
    // The output has the indices' shape: the other axes of the data are cut
    // to it (ONNX reads only that corner).
    let mut cut = x.clone();
    for (b, (&n, &d)) in idx.dims().iter().zip(x.dims()).enumerate() {
        if b != a && n != d {
            if n > d {
                return Err(node.invalid(format!(
                    "indices {:?} exceed data {:?}",
                    idx.dims(),
                    x.dims()
                )));
            }
            cut = cut.slice(b as isize, 0, n, 1)?;
        }
    }
    one(cut.gather(a as isize, &idx)?)
}

/// `data` with `updates` added at (`reduction` "add") or written over
/// (the default, "none") the positions `indices` give along `axis`. A write
/// is a where over the positions some index picks, of the updates summed
/// there: ONNX leaves two writes to one position undefined.
fn scatter_elements(node: &Node) -> Result<Vec<Value>> {
    let (data, updates) = (node.tensor(0)?, node.tensor(2)?);
    let a = axis(node, node.attr_int("axis", 0)?, data.rank())?;
    let idx = indices(node, 1, data.dims()[a])?;
    if idx.dims() != updates.dims() {
        return Err(node.invalid("indices and updates differ in shape"));
    }
    let added = data.scatter_add(a as isize, &idx, &updates)?;
    match node.attr_string("reduction", "none")?.as_str() {
        "add" => one(added),
        "none" => {
            let dtype = data.dtype();
            let zeros = Tensor::zeros(data.shape().clone(), dtype)?;
            let ones = Tensor::ones(updates.shape().clone(), dtype)?;
            let hit = zeros.scatter_add(a as isize, &idx, &ones)?;
            let written = zeros.scatter_add(a as isize, &idx, &updates)?;
            let picked = hit.gt(&Tensor::zeros([], dtype)?)?;
            one(picked.where_cond(&written, &data)?)
        }
        other => Err(node.unsupported(format!("reduction {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::even_steps;

    #[test]
    fn indices_that_rise_evenly_are_a_slice() {
        assert_eq!(even_steps(&[3]), Some((3, 1)));
        assert_eq!(even_steps(&[0, 1, 2]), Some((0, 1)));
        assert_eq!(even_steps(&[1, 4, 7]), Some((1, 3)));
        // Falling, repeated, uneven: a gather.
        for picks in [&[2, 1][..], &[1, 1], &[0, 1, 3], &[]] {
            assert_eq!(even_steps(picks), None, "{picks:?}");
        }
    }
}
