//! `Tensor::cat`, `stack`, `split` and `chunk` against the joined and cut
//! values computed directly, on every path a graph can take (realized on
//! the CPU and the interpreter, compiled fused and unfused): awkward
//! lengths, every axis, empty parts, integers, NaN and -0 kept bit for bit,
//! the gradient of a join, and errors that name the op and the shapes.

// The paths' checks this file does not use (`close`) are the index tests'.
#[allow(dead_code)]
mod paths;

use kiln::{DType, Device, Result, Tensor};
use paths::check;

/// Row-major `dims` filled by `f` of the flat index.
fn filled(dims: &[usize], f: impl Fn(usize) -> f32) -> Result<Tensor> {
    let n = dims.iter().product();
    Tensor::from_vec((0..n).map(f).collect::<Vec<f32>>(), dims)
}

/// `parts` (row-major, of `dims[i]`) joined along `axis` directly.
fn joined(parts: &[(Vec<f32>, Vec<usize>)], axis: usize) -> (Vec<f64>, Vec<usize>) {
    let first = &parts[0].1;
    let outer: usize = first[..axis].iter().product();
    let inner: usize = first[axis + 1..].iter().product();
    let mut dims = first.clone();
    dims[axis] = parts.iter().map(|(_, d)| d[axis]).sum();
    let mut out = Vec::new();
    for o in 0..outer {
        for (values, d) in parts {
            let run = d[axis] * inner;
            out.extend(values[o * run..(o + 1) * run].iter().map(|&v| f64::from(v)));
        }
    }
    (out, dims)
}

#[test]
fn cat_joins_parts_along_every_axis() -> Result<()> {
    let shapes = [[3usize, 1, 5], [3, 7, 5], [3, 0, 5], [3, 2, 5]];
    for axis in 0..3 {
        let dims: Vec<Vec<usize>> = (shapes.iter())
            .map(|s| {
                let mut d = vec![3, 4, 5];
                d[axis] = s[1];
                d
            })
            .collect();
        let parts: Vec<Tensor> = (dims.iter().enumerate())
            .map(|(p, d)| filled(d, |i| (i as f32 * 0.5 - 3.0) * (p + 1) as f32))
            .collect::<Result<_>>()?;
        // Counted from the end, as PyTorch allows.
        cat_checked(
            &format!("cat along {axis}"),
            &parts,
            axis,
            axis as isize - 3,
        )?;
    }
    Ok(())
}

/// `parts` joined along `axis` (`given` as the op is asked: from the end
/// or not) on every path, against the join computed directly.
fn cat_checked(what: &str, parts: &[Tensor], axis: usize, given: isize) -> Result<()> {
    let values: Vec<(Vec<f32>, Vec<usize>)> = (parts.iter())
        .map(|t| Ok((t.to_vec::<f32>()?, t.dims().to_vec())))
        .collect::<Result<_>>()?;
    let (want, want_dims) = joined(&values, axis);
    check(
        what,
        parts,
        |t| Tensor::cat(&t.iter().collect::<Vec<_>>(), given),
        DType::F32,
        &want_dims,
        &want,
    )
}

#[test]
fn cat_of_more_parts_than_a_row_loop_branches_on() -> Result<()> {
    // 70 parts along the channels, rows of 13: the compiled row loop
    // branches to a copy of the part each row lies in for the first 65
    // parts, and selects element by element past its budget; and the same
    // parts along the rows' own axis, where nothing is constant over a row.
    for axis in [1usize, 2] {
        let dims: Vec<Vec<usize>> = (0..70)
            .map(|p| {
                let mut d = vec![2, 3, 13];
                d[axis] = 1 + p % 3;
                d
            })
            .collect();
        let parts: Vec<Tensor> = (dims.iter().enumerate())
            .map(|(p, d)| filled(d, |i| i as f32 * 0.25 - p as f32))
            .collect::<Result<_>>()?;
        cat_checked(
            &format!("70 parts along {axis}"),
            &parts,
            axis,
            axis as isize,
        )?;
    }
    Ok(())
}

#[test]
fn picks_constant_over_a_row_keep_every_output() -> Result<()> {
    // Two independent picks by row, one of them twice, and a value stored
    // beside the result (a side output), each side of each pick taken by
    // some rows.
    let (rows, len) = (6usize, 9usize);
    let a = filled(&[rows, len], |i| i as f32 * 0.5 - 7.0)?;
    let b = filled(&[rows, len], |i| 3.0 - i as f32 * 0.25)?;
    let m1 = Tensor::from_vec(vec![true, false, true, true, false, false], [rows, 1])?;
    let m2 = Tensor::from_vec(vec![false, false, true, false, true, true], [rows, 1])?;
    let f = |t: &[Tensor]| -> Result<[Tensor; 2]> {
        let doubled = t[0].mul(&Tensor::scalar(2.0f32))?;
        let first = t[2].where_cond(&doubled, &t[1])?;
        let second = t[3].where_cond(&first.add(&Tensor::scalar(1.0f32))?, &t[0])?;
        // The first pick's condition again: one branch decides both.
        let third = t[2].where_cond(&second, &second.sub(&t[1])?)?;
        Ok([third, doubled])
    };
    let inputs = [a, b, m1, m2];
    let want: Vec<Vec<f32>> = {
        let r: Vec<Tensor> = (inputs.iter())
            .map(|t| t.to(Device::Reference))
            .collect::<Result<_>>()?;
        f(&r)?
            .iter()
            .map(|t| t.to_vec::<f32>())
            .collect::<Result<_>>()?
    };
    let specs: Vec<_> = inputs.iter().map(|t| t.ty().clone()).collect();
    let mut compiled = kiln::compile("picks", &specs, |t| Ok(f(t)?.to_vec()))?;
    let got = compiled.call(&inputs.iter().collect::<Vec<_>>())?;
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(&g.to_vec::<f32>()?, w, "output {k}");
    }
    Ok(())
}

#[test]
fn cat_keeps_nan_minus_zero_and_integers_exactly() -> Result<()> {
    let a = Tensor::from_vec(vec![-0.0f32, f32::NAN, f32::INFINITY], [3])?;
    let b = Tensor::from_vec(vec![-0.0f32, 1.5], [2])?;
    for device in [Device::Cpu, Device::Reference] {
        let (a, b) = (a.to(device)?, b.to(device)?);
        let got = Tensor::cat(&[&a, &b, &a], 0)?.to_vec::<f32>()?;
        let want = [
            -0.0f32,
            f32::NAN,
            f32::INFINITY,
            -0.0,
            1.5,
            -0.0,
            f32::NAN,
            f32::INFINITY,
        ];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{device:?}");
    }
    let i = Tensor::from_vec(vec![i64::MIN, 7], [1, 2])?;
    let j = Tensor::from_vec(vec![i64::MAX, -1, 0, 3], [2, 2])?;
    let got = Tensor::cat(&[&i, &j], 0)?;
    assert_eq!(got.dims(), [3, 2]);
    assert_eq!(got.to_vec::<i64>()?, [i64::MIN, 7, i64::MAX, -1, 0, 3]);
    Ok(())
}

#[test]
fn stack_split_and_chunk_are_cat_and_views() -> Result<()> {
    let parts: Vec<Tensor> = (0..3)
        .map(|p| filled(&[2, 3], |i| (i + 10 * p) as f32))
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = parts.iter().collect();
    let stacked = Tensor::stack(&refs, 1)?;
    assert_eq!(stacked.dims(), [2, 3, 3]);
    // stacked[r, p, c] = parts[p][r, c].
    let want: Vec<f32> = (0..2)
        .flat_map(|r| (0..3).flat_map(move |p| (0..3).map(move |c| (r * 3 + c + 10 * p) as f32)))
        .collect();
    assert_eq!(stacked.to_vec::<f32>()?, want);
    let x = filled(&[10, 2], |i| i as f32)?;
    let pieces = x.split(&[4, 0, 6], 0)?;
    let dims: Vec<Vec<usize>> = pieces.iter().map(|p| p.dims().to_vec()).collect();
    assert_eq!(dims, [vec![4, 2], vec![0, 2], vec![6, 2]]);
    assert_eq!(
        pieces[2].to_vec::<f32>()?,
        (8..20).map(|v| v as f32).collect::<Vec<_>>()
    );
    // PyTorch's chunk: 10 in 4 is 3, 3, 3, 1; 2 in 4 is 1, 1.
    let lengths = |t: &Tensor, n| -> Result<Vec<usize>> {
        Ok(t.chunk(n, 0)?.iter().map(|c| c.dims()[0]).collect())
    };
    assert_eq!(lengths(&x, 4)?, [3, 3, 3, 1]);
    assert_eq!(lengths(&x.slice(0, 0, 2, 1)?, 4)?, [1, 1]);
    assert_eq!(lengths(&x.slice(0, 0, 0, 1)?, 3)?, [0, 0, 0]);
    // Parts all empty along the axis: the joined shape, empty.
    let empty = x.slice(0, 0, 0, 1)?;
    assert_eq!(Tensor::cat(&[&empty, &empty], 0)?.dims(), [0, 2]);
    let back: Vec<Tensor> = x.chunk(4, 0)?;
    let rejoined = Tensor::cat(&back.iter().collect::<Vec<_>>(), 0)?;
    assert_eq!(rejoined.to_vec::<f32>()?, x.to_vec::<f32>()?);
    Ok(())
}

#[test]
fn the_gradient_of_a_join_is_its_parts_slices() -> Result<()> {
    let a = filled(&[2, 3], |i| i as f32)?;
    let b = filled(&[2, 1], |i| -(i as f32))?;
    let w = filled(&[2, 4], |i| (i * i) as f32 * 0.25)?;
    let loss = (Tensor::cat(&[&a, &b], 1)? * &w)?.sum_all()?;
    let grads = kiln::grad(&loss, &[&a, &b])?;
    assert_eq!(
        grads[0].to_vec::<f32>()?,
        w.slice(1, 0, 3, 1)?.to_vec::<f32>()?
    );
    assert_eq!(
        grads[1].to_vec::<f32>()?,
        w.slice(1, 3, 4, 1)?.to_vec::<f32>()?
    );
    Ok(())
}

#[test]
fn joins_that_do_not_fit_are_errors_naming_the_shapes() -> Result<()> {
    let (a, b) = (
        Tensor::zeros([2, 3], DType::F32)?,
        Tensor::zeros([3, 3], DType::F32)?,
    );
    let message = |r: Result<Tensor>| r.err().map(|e| e.to_string());
    assert_eq!(
        message(Tensor::cat(&[&a, &b], 1)).as_deref(),
        Some("cat: shapes [2, 3] and [3, 3] differ")
    );
    assert_eq!(
        message(Tensor::cat(&[], 0)).as_deref(),
        Some("cat: no tensors to join")
    );
    let i = Tensor::zeros([2, 3], DType::I32)?;
    assert!(message(Tensor::cat(&[&a, &i], 0)).is_some_and(|m| m.starts_with("cat: dtypes")));
    assert!(message(Tensor::cat(&[&a, &b], 2)).is_some_and(|m| m.contains("axis 2")));
    assert_eq!(
        message(Tensor::stack(&[&a, &b], 0)).as_deref(),
        Some("stack: shapes [2, 3] and [3, 3] differ")
    );
    assert!(a.split(&[usize::MAX, 4], 1).is_err(), "sizes that overflow");
    let split = a.split(&[1, 1], 1).err().map(|e| e.to_string());
    assert_eq!(
        split.as_deref(),
        Some("split: sizes [1, 1] do not add up to axis 1 of [2, 3]")
    );
    Ok(())
}
