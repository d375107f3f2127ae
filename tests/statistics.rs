//! `min`, `var`, `std`, `logsumexp`, `cumsum`, `cumprod`, `clamp`, `topk` and
//! `cross_entropy`'s options against direct f64 loops, realized on the CPU
//! and the interpreter and compiled fused and unfused, on awkward shapes
//! with NaN, infinities and signed zeros.

use kiln::{CompileOptions, DType, Device, Options, Result, Tensor};

/// `f(x)` along every path, each with its name.
fn every_path(
    x: &Tensor,
    f: &dyn Fn(&Tensor) -> Result<Tensor>,
) -> Result<Vec<(String, Vec<f64>)>> {
    let values = |t: &Tensor| -> Result<Vec<f64>> {
        Ok(match t.dtype() {
            DType::F64 => t.to_vec::<f64>()?,
            DType::I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
            _ => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        })
    };
    let mut out = Vec::new();
    for device in [Device::Cpu, Device::Reference] {
        out.push((
            format!("realized on {device:?}"),
            values(&f(&x.to(device)?)?)?,
        ));
    }
    for fusion in [true, false] {
        let options = CompileOptions {
            optimizer: Options {
                fusion,
                ..Options::default()
            },
            ..CompileOptions::default()
        };
        let mut graph = kiln::compile_with("statistics", &[x.ty().clone()], options, |t| {
            Ok(vec![f(&t[0])?])
        })?;
        let y = graph.call(&[x])?.remove(0);
        out.push((format!("compiled, fusion {fusion}"), values(&y)?));
    }
    Ok(out)
}

/// Every path within `tol` of `want` (relative, at least absolute), NaN
/// for NaN, infinities equal.
fn check(
    what: &str,
    x: &Tensor,
    f: &dyn Fn(&Tensor) -> Result<Tensor>,
    want: &[f64],
    tol: f64,
) -> Result<()> {
    for (path, got) in every_path(x, f)? {
        assert_eq!(got.len(), want.len(), "{what}, {path}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let same =
                g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol * w.abs().max(1.0);
            assert!(same, "{what}, {path}: element {i}: got {g}, want {w}");
        }
    }
    Ok(())
}

/// Rows of `x` ([rows, cols], row-major) mapped by `f`.
fn by_rows(x: &[f64], cols: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    x.chunks(cols).map(f).collect()
}

/// [5, 37] values with a NaN row, an infinite row, -0 and +0.
fn awkward() -> Result<(Tensor, Vec<f64>)> {
    let mut v: Vec<f32> = Tensor::randn([5, 37], 9)?.to_vec()?;
    v[37 + 3] = f32::NAN;
    v[2 * 37 + 5] = f32::INFINITY;
    v[3 * 37] = -0.0;
    v[3 * 37 + 1] = 0.0;
    let want = v.iter().map(|&x| f64::from(x)).collect();
    Ok((Tensor::from_vec(v, [5, 37])?, want))
}

#[test]
fn min_takes_the_smallest_nan_first_and_minus_zero_below_plus_zero() -> Result<()> {
    let (x, v) = awkward()?;
    let min = |row: &[f64]| {
        if row.iter().any(|x| x.is_nan()) {
            return f64::NAN;
        }
        row.iter().copied().fold(f64::INFINITY, |m, x| {
            if x < m || (x == 0.0 && m == 0.0 && x.is_sign_negative()) {
                x
            } else {
                m
            }
        })
    };
    check(
        "min over rows",
        &x,
        &|t| t.min(&[1], false),
        &by_rows(&v, 37, min),
        0.0,
    )?;
    // -0 against +0: the minimum is -0.
    let zeros = Tensor::from_vec(vec![0.0f32, -0.0, 0.0], [3])?;
    for (path, got) in every_path(&zeros, &|t| t.min(&[0], false))? {
        assert!(
            got[0] == 0.0 && got[0].is_sign_negative(),
            "{path}: {got:?}"
        );
    }
    // Integers at their extremes.
    let ints = Tensor::from_vec(vec![i32::MAX, i32::MIN, 5, -1, 0, i32::MIN + 1], [2, 3])?;
    check(
        "min of i32",
        &ints,
        &|t| t.min(&[1], false),
        &[f64::from(i32::MIN), f64::from(i32::MIN + 1)],
        0.0,
    )
}

#[test]
fn var_and_std_correct_by_the_count_as_pytorch() -> Result<()> {
    let (x, v) = awkward()?;
    for correction in [0usize, 1] {
        let var = |row: &[f64]| {
            let mean = row.iter().sum::<f64>() / row.len() as f64;
            row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (row.len() - correction) as f64
        };
        let want = by_rows(&v, 37, var);
        check(
            &format!("var, correction {correction}"),
            &x,
            &|t| t.var(&[1], correction, false),
            &want,
            1e-5,
        )?;
        let std: Vec<f64> = want.iter().map(|w| w.sqrt()).collect();
        check(
            &format!("std, correction {correction}"),
            &x,
            &|t| t.std(&[-1], correction, false),
            &std,
            1e-5,
        )?;
    }
    // One element, unbiased: no estimate (NaN), as PyTorch.
    let one = Tensor::from_vec(vec![3.0f32], [1])?;
    check(
        "var of one element",
        &one,
        &|t| t.var(&[0], 1, false),
        &[f64::NAN],
        0.0,
    )
}

#[test]
fn logsumexp_stays_finite_for_large_inputs_and_exact_at_infinities() -> Result<()> {
    let (x, v) = awkward()?;
    let lse = |row: &[f64]| {
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if row.iter().any(|x| x.is_nan()) {
            return f64::NAN;
        }
        if m.is_infinite() {
            return m;
        }
        m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    };
    check(
        "logsumexp over rows",
        &x,
        &|t| t.logsumexp(&[1], false),
        &by_rows(&v, 37, lse),
        1e-5,
    )?;
    let edges = Tensor::from_vec(
        vec![1000.0f32, 1000.0, f32::NEG_INFINITY, f32::NEG_INFINITY],
        [2, 2],
    )?;
    let want = [1000.0 + 2f64.ln(), f64::NEG_INFINITY];
    check(
        "logsumexp at the edges",
        &edges,
        &|t| t.logsumexp(&[1], true),
        &want,
        1e-6,
    )
}

#[test]
fn clamp_bounds_each_element_and_keeps_nan() -> Result<()> {
    let (x, v) = awkward()?;
    let clamp = |lo: f64, hi: f64| -> Vec<f64> {
        v.iter()
            .map(|&e| {
                if e.is_nan() {
                    e
                } else if e > hi {
                    hi
                } else if e < lo {
                    lo
                } else {
                    e
                }
            })
            .collect()
    };
    check(
        "clamp to [-0.5, 0.5]",
        &x,
        &|t| t.clamp(-0.5, 0.5),
        &clamp(-0.5, 0.5),
        0.0,
    )?;
    check(
        "clamp below",
        &x,
        &|t| t.clamp(f64::NEG_INFINITY, 0.0),
        &clamp(f64::NEG_INFINITY, 0.0),
        0.0,
    )?;
    // min above max: every element max, as PyTorch.
    check(
        "clamp to [1, -1]",
        &x,
        &|t| t.clamp(1.0, -1.0),
        &clamp(1.0, -1.0),
        0.0,
    )?;
    let ints = Tensor::from_vec(vec![-7i32, 0, 3, 9], [4])?;
    check(
        "clamp of i32",
        &ints,
        &|t| t.clamp(-2.0, 5.0),
        &[-2.0, 0.0, 3.0, 5.0],
        0.0,
    )
}

/// PyTorch's `F.cross_entropy` (mean reduction) in f64, as its docs
/// write it: weighed negative log-likelihoods over the weights of the rows
/// counted, plus the label-smoothing share of the mean over classes.
fn cross_entropy_reference(
    x: &[f64],
    classes: usize,
    targets: &[i32],
    weight: Option<&[f64]>,
    ignore: Option<i32>,
    smoothing: f64,
) -> f64 {
    let w = |c: usize| weight.map_or(1.0, |w| w[c]);
    let (mut nll, mut smooth, mut total) = (0.0, 0.0, 0.0);
    for (row, &t) in x.chunks(classes).zip(targets) {
        if Some(t) == ignore {
            continue;
        }
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        let t = t as usize;
        nll -= w(t) * (row[t] - lse);
        smooth -= (0..classes).map(|c| w(c) * (row[c] - lse)).sum::<f64>();
        total += w(t);
    }
    ((1.0 - smoothing) * nll + smoothing / classes as f64 * smooth) / total
}

#[test]
fn cross_entropy_weighs_ignores_and_smooths_as_pytorch() -> Result<()> {
    use kiln::CrossEntropy;
    let x: Vec<f64> = (0..6)
        .flat_map(|i| (0..5).map(move |j| f64::from(((i * 5 + j) * 7 % 11) - 5) * 0.37))
        .collect();
    let logits = Tensor::from_vec(x.iter().map(|&v| v as f32).collect::<Vec<f32>>(), [6, 5])?;
    let weights = [0.5, 2.0, 1.0, 0.25, 3.0];
    let weight = Tensor::from_vec(weights.iter().map(|&v| v as f32).collect::<Vec<f32>>(), [5])?;
    let (t1, t2) = ([1, -100, 4, 0, 3, 4], [1, 3, 4, 0, 3, 2]);
    // (targets, weighed, ignored, smoothing, torch 2.x's F.cross_entropy
    // on these f64 logits)
    type Case<'a> = (&'a [i32], bool, Option<i32>, f64, f64);
    let cases: [Case; 5] = [
        (&t1, true, Some(-100), 0.0, 1.5351757600084106),
        (&t2, false, Some(3), 0.1, 1.88487623007492),
        (&t1, true, Some(-100), 0.2, 1.5915729566748722),
        (&[3; 6], false, Some(3), 0.0, f64::NAN),
        (&t2, false, None, 0.3, 2.080086609649353),
    ];
    for (k, &(targets, weighed, ignore_index, smoothing, torch)) in cases.iter().enumerate() {
        let w = weighed.then_some(&weights[..]);
        let reference = |s: f64| cross_entropy_reference(&x, 5, targets, w, ignore_index, s);
        let exact = reference(smoothing);
        assert!(
            (exact - torch).abs() <= 1e-12 || (exact.is_nan() && torch.is_nan()),
            "case {k}: the reference {exact} is not torch's {torch}"
        );
        // kiln's smoothing is an f32, a little off the decimal.
        let label_smoothing = smoothing as f32;
        let want = reference(f64::from(label_smoothing));
        let options = CrossEntropy {
            weight: weighed.then_some(&weight),
            ignore_index,
            label_smoothing,
        };
        let labels = Tensor::from_vec(targets.to_vec(), [6])?;
        check(
            &format!("cross_entropy case {k}"),
            &logits,
            &|t| t.cross_entropy_with(&labels, &options),
            &[want],
            1e-5,
        )?;
    }
    let labels = Tensor::from_vec(t2.to_vec(), [6])?;
    let bad = CrossEntropy {
        label_smoothing: 1.5,
        ..CrossEntropy::default()
    };
    let e = logits
        .cross_entropy_with(&labels, &bad)
        .map(|_| ())
        .expect_err("an error");
    assert_eq!(
        e.to_string(),
        "cross_entropy: label_smoothing must be in [0, 1], not 1.5"
    );
    let f64_weight = CrossEntropy {
        weight: Some(&Tensor::from_vec(weights.to_vec(), [5])?),
        ..CrossEntropy::default()
    };
    let e = logits
        .cross_entropy_with(&labels, &f64_weight)
        .map(|_| ())
        .expect_err("an error");
    assert_eq!(
        e.to_string(),
        "cross_entropy: dtypes f32 and f64 differ (cast one of them first)"
    );
    // A class masked with -inf in an ignored row, with smoothing: the row
    // counts for nothing, and the loss is the other rows' alone.
    let mut masked = x.clone();
    masked[5] = f64::NEG_INFINITY;
    let masked_logits = Tensor::from_vec(
        masked.iter().map(|&v| v as f32).collect::<Vec<f32>>(),
        [6, 5],
    )?;
    let targets = [1, 3, 4, 0, 3, 2];
    let ignored = Tensor::from_vec(targets.to_vec(), [6])?;
    let options = CrossEntropy {
        ignore_index: Some(3),
        label_smoothing: 0.25,
        ..CrossEntropy::default()
    };
    let want = cross_entropy_reference(&masked, 5, &targets, None, Some(3), 0.25);
    assert!(want.is_finite());
    check(
        "an ignored row with -inf",
        &masked_logits,
        &|t| t.cross_entropy_with(&ignored, &options),
        &[want],
        1e-5,
    )
}

#[test]
fn cumsum_runs_along_either_axis_and_wraps_integers() -> Result<()> {
    let (x, v) = awkward()?;
    let prefix = |values: &[f64]| -> Vec<f64> {
        values
            .iter()
            .scan(0.0, |s, &e| {
                *s += e;
                Some(*s)
            })
            .collect()
    };
    let along_rows: Vec<f64> = v.chunks(37).flat_map(prefix).collect();
    check("cumsum along rows", &x, &|t| t.cumsum(1), &along_rows, 1e-5)?;
    let columns: Vec<Vec<f64>> = (0..37)
        .map(|c| prefix(&(0..5).map(|r| v[r * 37 + c]).collect::<Vec<_>>()))
        .collect();
    let down: Vec<f64> = (0..5)
        .flat_map(|r| columns.iter().map(move |col| col[r]))
        .collect();
    check("cumsum down columns", &x, &|t| t.cumsum(-2), &down, 1e-5)?;
    let ints = Tensor::from_vec(vec![i32::MAX, 1, 5, -7], [4])?;
    let wrapped = [i32::MAX, i32::MIN, i32::MIN + 5, i32::MAX - 1].map(f64::from);
    check("cumsum of i32", &ints, &|t| t.cumsum(0), &wrapped, 0.0)
}

#[test]
fn cumprod_runs_along_either_axis_through_zeros_and_wraps_integers() -> Result<()> {
    // Values near 1, so that the products stay in range; a zero and a NaN.
    let mut v: Vec<f32> = Tensor::randn([5, 13], 3)?.to_vec()?;
    v.iter_mut().for_each(|x| *x = 1.0 + 0.2 * *x);
    v[13 + 4] = 0.0;
    v[2 * 13 + 6] = f32::NAN;
    let x = Tensor::from_vec(v.clone(), [5, 13])?;
    let v: Vec<f64> = v.iter().map(|&e| f64::from(e)).collect();
    let prefix = |values: &[f64]| -> Vec<f64> {
        values
            .iter()
            .scan(1.0, |p, &e| {
                *p *= e;
                Some(*p)
            })
            .collect()
    };
    let along_rows: Vec<f64> = v.chunks(13).flat_map(prefix).collect();
    check(
        "cumprod along rows",
        &x,
        &|t| t.cumprod(1),
        &along_rows,
        1e-5,
    )?;
    let columns: Vec<Vec<f64>> = (0..13)
        .map(|c| prefix(&(0..5).map(|r| v[r * 13 + c]).collect::<Vec<_>>()))
        .collect();
    let down: Vec<f64> = (0..5)
        .flat_map(|r| columns.iter().map(move |col| col[r]))
        .collect();
    check("cumprod down columns", &x, &|t| t.cumprod(-2), &down, 1e-5)?;
    let ints = Tensor::from_vec(vec![3i32, -2, 1 << 20, 1 << 12], [4])?;
    let wrapped = [3, -6, -6 << 20, 0].map(f64::from);
    check("cumprod of i32", &ints, &|t| t.cumprod(0), &wrapped, 0.0)?;
    // d/dx_k of the sum of the running products: the products from k on,
    // each without x_k.
    let w = [0.5f32, -1.5, 2.0, 0.75, 1.25];
    let t = Tensor::from_vec(w.to_vec(), [5])?;
    let grad = kiln::grad(&t.cumprod(0)?.sum_all()?, &[&t])?.remove(0);
    for (k, g) in grad.to_vec::<f32>()?.into_iter().enumerate() {
        let want: f64 = (k..5)
            .map(|i| {
                (0..=i)
                    .filter(|&j| j != k)
                    .map(|j| f64::from(w[j]))
                    .product::<f64>()
            })
            .sum();
        assert!(
            (f64::from(g) - want).abs() <= 1e-5 * want.abs().max(1.0),
            "d/dx{k}: {g}, want {want}"
        );
    }
    Ok(())
}

/// The definition of `topk` along the rows of `x` (`[rows, cols]`): each
/// row's indices ordered by value (largest or smallest first), the first
/// of equal values first, NaN first, the first `k` of them.
fn top_rows(x: &[f64], cols: usize, k: usize, largest: bool) -> (Vec<f64>, Vec<f64>) {
    let (mut values, mut indices) = (Vec::new(), Vec::new());
    for row in x.chunks(cols) {
        let mut order: Vec<usize> = (0..cols).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (row[a], row[b]);
            let by_value = match (x.is_nan(), y.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Less,
                (false, true) => std::cmp::Ordering::Greater,
                // IEEE's order: -0 and +0 are equal.
                _ if largest => y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal),
                _ => x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal),
            };
            by_value.then(a.cmp(&b))
        });
        for &i in &order[..k] {
            values.push(row[i]);
            indices.push(i as f64);
        }
    }
    (values, indices)
}

#[test]
fn topk_picks_the_first_of_ties_and_nan_first() -> Result<()> {
    // Ties within rows (values rounded to halves), NaN, infinities, zeros
    // of both signs (equal as values: the first comes first).
    let (_, v) = awkward()?;
    let v: Vec<f64> = v.iter().map(|x| (x * 2.0).round() / 2.0).collect();
    let x = Tensor::from_vec(v.iter().map(|&x| x as f32).collect(), [5, 37])?;
    for (k, largest) in [(1, true), (5, true), (37, false), (4, false)] {
        let (values, indices) = top_rows(&v, 37, k, largest);
        let what = format!("top {k}, largest {largest}");
        check(
            &format!("{what}: values"),
            &x,
            &|t| Ok(t.topk(k, 1, largest)?.0),
            &values,
            0.0,
        )?;
        let picked = |t: &Tensor| t.topk(k, -1, largest)?.1.cast(DType::I32);
        check(&format!("{what}: indices"), &x, &picked, &indices, 0.0)?;
    }
    // In bf16 and f16 (every value above is exact in both), and argmin.
    for dtype in [DType::BF16, DType::F16] {
        let h = x.cast(dtype)?;
        for (k, largest) in [(3, true), (4, false)] {
            let (values, indices) = top_rows(&v, 37, k, largest);
            let what = format!("{dtype:?} top {k}, largest {largest}");
            let top = |t: &Tensor| t.cast(dtype)?.topk(k, 1, largest);
            check(
                &format!("{what}: values"),
                &x,
                &|t| top(t)?.0.cast(DType::F32),
                &values,
                0.0,
            )?;
            let picked = |t: &Tensor| top(t)?.1.cast(DType::I32);
            check(&format!("{what}: indices"), &x, &picked, &indices, 0.0)?;
        }
        let (_, first) = top_rows(&v, 37, 1, false);
        assert_eq!(
            h.argmin(1, false)?.to_vec::<i32>()?,
            first.iter().map(|&i| i as i32).collect::<Vec<_>>(),
            "{dtype:?} argmin"
        );
    }
    // Down the columns, of integers.
    let ints = Tensor::from_vec(vec![3i32, -1, 3, i32::MIN, 7, 3], [3, 2])?;
    let (values, indices) = ints.topk(2, 0, true)?;
    assert_eq!(values.to_vec::<i32>()?, [7, 3, 3, -1]);
    assert_eq!(indices.to_vec::<i64>()?, [2, 2, 0, 0]);
    let (values, indices) = ints.topk(3, 0, false)?;
    assert_eq!(values.to_vec::<i32>()?, [3, i32::MIN, 3, -1, 7, 3]);
    assert_eq!(indices.to_vec::<i64>()?, [0, 1, 1, 0, 2, 2]);
    // None, and more than there are.
    let (values, indices) = x.topk(0, 1, true)?;
    assert_eq!(
        (values.dims(), indices.dims()),
        ([5, 0].as_slice(), [5, 0].as_slice())
    );
    let err = x
        .topk(38, 1, true)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("topk") && err.contains("38"), "{err}");
    // The gradient goes to the picked elements.
    let loss = x.topk(3, 1, true)?.0.sum_all()?;
    let grad = kiln::grad(&loss, &[&x])?.remove(0).to_vec::<f32>()?;
    let (_, picked) = top_rows(&v, 37, 3, true);
    for r in 0..5 {
        for c in 0..37 {
            let want = picked[r * 3..r * 3 + 3].contains(&(c as f64));
            assert_eq!(grad[r * 37 + c] == 1.0, want, "row {r}, column {c}");
        }
    }
    Ok(())
}
