//! `argmax`, `argmin`, `gather` and `index_select` against direct loops, on
//! every path a graph can take: realized on the CPU and on the reference
//! interpreter, and compiled on the CPU fused and unfused (and on the GPU
//! that `KILN_TEST_DEVICE=cuda:N` names). Awkward shapes (1, 7, 50, 1027,
//! size-1 axes), ties, NaN, infinities, signed zeros, the extremes of each
//! integer type, broadcast indices, and indices out of range.

use kiln::{CompileOptions, DType, Device, Error, Options, Result, Tensor, TensorType};

/// The results of `f` on `inputs` along every path, each with its name.
fn every_path(
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let mut results = Vec::new();
    for device in [Device::Cpu, Device::Reference] {
        let moved: Vec<Tensor> = inputs.iter().map(|t| t.to(device)).collect::<Result<_>>()?;
        results.push((format!("realized on {device:?}"), f(&moved)?));
    }
    let mut compiled = vec![
        (
            Device::Cpu,
            Options {
                fusion: true,
                ..Options::default()
            },
        ),
        (
            Device::Cpu,
            Options {
                fusion: false,
                ..Options::default()
            },
        ),
    ];
    if let Some(n) = std::env::var("KILN_TEST_DEVICE")
        .ok()
        .and_then(|d| d.strip_prefix("cuda:").and_then(|n| n.parse().ok()))
    {
        compiled.push((
            Device::Cuda(n),
            Options {
                fusion: true,
                ..Options::default()
            },
        ));
        compiled.push((
            Device::Cuda(n),
            Options {
                fusion: false,
                ..Options::default()
            },
        ));
    }
    let specs: Vec<_> = inputs
        .iter()
        .map(|t| TensorType::new(t.dtype(), t.shape().clone()))
        .collect();
    for (device, options) in compiled {
        let mut graph = kiln::compile_with(
            "index",
            &specs,
            CompileOptions {
                device,
                optimizer: options,
                ..CompileOptions::default()
            },
            |x| Ok(vec![f(x)?]),
        )?;
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let out = graph.call(&refs)?.remove(0);
        results.push((format!("compiled on {device:?}, {options:?}"), out));
    }
    Ok(results)
}

/// Every element as f64 (which holds each dtype's values exactly, i64's
/// up to 2^53).
fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::F64 => t.to_vec::<f64>()?,
        DType::I64 => t.to_vec::<i64>()?.into_iter().map(|x| x as f64).collect(),
        DType::I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        DType::U8 => t.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
        DType::Bool => t.to_vec::<bool>()?.into_iter().map(f64::from).collect(),
    })
}

/// `f` on `inputs` along every path equals `want` of shape `dims` and dtype
/// `dtype` exactly (NaN matches NaN).
fn check(
    what: &str,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    dtype: DType,
    dims: &[usize],
    want: &[f64],
) -> Result<()> {
    for (path, out) in every_path(inputs, &f)? {
        assert_eq!(out.dims(), dims, "{what}, {path}: shape");
        assert_eq!(out.dtype(), dtype, "{what}, {path}: dtype");
        let got = values(&out)?;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                g == w || (g.is_nan() && w.is_nan()),
                "{what}, {path}: element {i}: got {g}, want {w}"
            );
        }
    }
    Ok(())
}

/// A seeded stream of small integers: cheap, and the same on every machine.
struct Stream(u64);

impl Stream {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// `n` values drawn from `levels`, so that ties are common.
fn draw<T: Copy>(levels: &[T], n: usize, seed: u64) -> Vec<T> {
    let mut s = Stream(seed);
    (0..n)
        .map(|_| levels[s.below(levels.len() as u64) as usize])
        .collect()
}

/// f32 levels: few, so rows tie; with infinities and both zeros.
const FLOATS: [f32; 9] = [
    -2.0,
    -0.5,
    -0.0,
    0.0,
    0.5,
    2.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    1.0,
];

/// The shapes and axes the index ops are checked on.
const CASES: [(&[usize], isize); 11] = [
    (&[1], 0),
    (&[7], 0),
    (&[7], -1),
    (&[3, 50], 0),
    (&[3, 50], 1),
    (&[5, 1027], 1),
    (&[1027, 3], 0),
    (&[2, 3, 7], 0),
    (&[2, 3, 7], 1),
    (&[2, 3, 7], -1),
    (&[4, 1, 5], 1),
];

/// The first index of the largest (`smallest` false) or smallest element of
/// each lane along `axis`, or of the first NaN: NumPy's rule, looped.
fn first_extreme(x: &[f64], dims: &[usize], axis: usize, smallest: bool) -> Vec<f64> {
    let (outer, n) = (dims[..axis].iter().product::<usize>(), dims[axis]);
    let inner: usize = dims[axis + 1..].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| x[(o * n + j) * inner + i];
            let mut best = 0;
            for j in 0..n {
                if at(best).is_nan() {
                    break;
                }
                let better = if smallest {
                    at(j) < at(best)
                } else {
                    at(j) > at(best)
                };
                if at(j).is_nan() || better {
                    best = j;
                }
            }
            out.push(best as f64);
        }
    }
    out
}

/// `dims` with `axis` dropped, or kept as 1.
fn reduced(dims: &[usize], axis: usize, keepdim: bool) -> Vec<usize> {
    let mut d = dims.to_vec();
    if keepdim {
        d[axis] = 1;
    } else {
        d.remove(axis);
    }
    d
}

/// Checks argmax and argmin of `x` on every case shape against the loop.
fn check_arg_extremes(name: &str, make: impl Fn(&[usize], u64) -> Result<Tensor>) -> Result<()> {
    for (seed, &(dims, axis)) in CASES.iter().enumerate() {
        let x = make(dims, seed as u64)?;
        let a = axis.rem_euclid(dims.len() as isize) as usize;
        let xs = values(&x)?;
        for keepdim in [false, true] {
            for smallest in [false, true] {
                let op = if smallest { "argmin" } else { "argmax" };
                check(
                    &format!("{op} of {name} {dims:?} along {axis}, keepdim {keepdim}"),
                    std::slice::from_ref(&x),
                    |t| match smallest {
                        true => t[0].argmin(axis, keepdim),
                        false => t[0].argmax(axis, keepdim),
                    },
                    DType::I32,
                    &reduced(dims, a, keepdim),
                    &first_extreme(&xs, dims, a, smallest),
                )?;
            }
        }
    }
    Ok(())
}

#[test]
fn argmax_and_argmin_of_f32_pick_the_first_of_ties() -> Result<()> {
    check_arg_extremes("f32", |dims, seed| {
        let n = dims.iter().product();
        Tensor::from_vec(draw(&FLOATS, n, seed), dims)
    })
}

#[test]
fn argmax_and_argmin_of_f32_pick_the_first_nan() -> Result<()> {
    // About one element in eight is NaN: most lanes of 7 or more hold one,
    // some several, some none.
    let mut levels = FLOATS.to_vec();
    levels.push(f32::NAN);
    check_arg_extremes("f32 with NaN", |dims, seed| {
        let n = dims.iter().product();
        Tensor::from_vec(draw(&levels, n, seed + 100), dims)
    })
}

#[test]
fn argmax_and_argmin_of_integers_reach_the_extremes_of_the_type() -> Result<()> {
    let ints = [i32::MIN, i32::MIN + 1, -1, 0, 1, i32::MAX - 1, i32::MAX];
    check_arg_extremes("i32", |dims, seed| {
        let n = dims.iter().product();
        Tensor::from_vec(draw(&ints, n, seed), dims)
    })?;
    check_arg_extremes("u8", |dims, seed| {
        let n = dims.iter().product();
        Tensor::from_vec(draw(&[0u8, 1, 128, 254, 255], n, seed), dims)
    })?;
    check_arg_extremes("bool", |dims, seed| {
        let n = dims.iter().product();
        Tensor::from_vec(draw(&[false, true], n, seed), dims)
    })
}

#[test]
fn indices_past_2_pow_24_are_exact() -> Result<()> {
    // 2^24 + 1 is the first integer f32 cannot hold: an index computed in
    // f32 would come back as 2^24. On the CPU only, fused and unfused: the
    // interpreter takes long over 2^24 elements.
    let n = (1 << 24) + 3;
    let mut v = vec![0.0f32; n];
    v[(1 << 24) + 1] = 1.0;
    v[(1 << 24) + 2] = -1.0;
    let x = Tensor::from_vec(v, [n])?;
    let at = Tensor::from_vec(vec![(1 << 24) + 1, (1 << 24) + 2], [2])?;
    for fusion in [true, false] {
        let mut graph = kiln::compile_with(
            "far",
            &[
                TensorType::new(DType::F32, [n]),
                TensorType::new(DType::I32, [2]),
            ],
            CompileOptions {
                optimizer: Options {
                    fusion,
                    ..Options::default()
                },
                ..CompileOptions::default()
            },
            |t| {
                Ok(vec![
                    t[0].argmax(0, false)?,
                    t[0].argmin(0, false)?,
                    t[0].gather(0, &t[1])?,
                ])
            },
        )?;
        let out = graph.call(&[&x, &at])?;
        assert_eq!(out[0].to_scalar::<i32>()?, (1 << 24) + 1, "fusion {fusion}");
        assert_eq!(out[1].to_scalar::<i32>()?, (1 << 24) + 2, "fusion {fusion}");
        assert_eq!(out[2].to_vec::<f32>()?, [1.0, -1.0], "fusion {fusion}");
    }
    Ok(())
}

#[test]
fn argmax_errors_name_the_op() -> Result<()> {
    let message = |r: Result<Tensor>| r.map(|_| ()).expect_err("an error").to_string();
    let x = Tensor::zeros([3, 0], DType::F32)?;
    assert_eq!(
        message(x.argmax(1, false)),
        "argmax: cannot reduce axis 1 of shape [3, 0]: it is empty"
    );
    assert_eq!(
        message(x.argmin(2, false)),
        "argmin: axis 2 is out of range for rank 2"
    );
    // Lazy: no memory is asked for a tensor that is never realized.
    let long = Tensor::full([1usize << 31], 0.0f32)?;
    assert_eq!(
        long.argmax(0, false).map(|_| ()),
        Err(Error::AxisTooLong {
            op: "argmax",
            axis: 0,
            len: 1 << 31
        })
    );
    assert_eq!(
        message(long.argmax(0, false)),
        "argmax: axis 0 has 2147483648 elements, more than i32 indices can name"
    );
    Ok(())
}

/// `take_along_axis` looped: out of range is NaN for f32, 0 otherwise.
fn take_along_axis(
    x: &[f64],
    xd: &[usize],
    idx: &[i64],
    id: &[usize],
    axis: usize,
    float: bool,
) -> (Vec<usize>, Vec<f64>) {
    let out: Vec<usize> = (0..xd.len())
        .map(|a| if a == axis { id[a] } else { xd[a].max(id[a]) })
        .collect();
    let offset = |dims: &[usize], coords: &[usize]| {
        dims.iter()
            .zip(coords)
            .fold(0, |acc, (&d, &c)| acc * d + if d == 1 { 0 } else { c })
    };
    let mut values = Vec::new();
    let mut coords = vec![0; out.len()];
    for _ in 0..out.iter().product::<usize>() {
        let len = xd[axis] as i64;
        let j = idx[offset(id, &coords)];
        let j = if j < 0 { j + len } else { j };
        values.push(if (0..len).contains(&j) {
            let mut at = coords.clone();
            at[axis] = j as usize;
            x[offset(xd, &at)]
        } else if float {
            f64::NAN
        } else {
            0.0
        });
        for a in (0..out.len()).rev() {
            coords[a] += 1;
            if coords[a] < out[a] {
                break;
            }
            coords[a] = 0;
        }
    }
    (out, values)
}

/// The gather cases: the data's shape, the indices' shape, the axis.
const GATHERS: [(&[usize], &[usize], isize); 9] = [
    (&[5, 7], &[5, 3], 1),
    (&[5, 7], &[2, 7], 0),
    (&[5, 7], &[1, 4], 1),
    (&[1, 7], &[6, 2], -1),
    (&[2, 3, 50], &[2, 3, 1], 2),
    (&[2, 3, 50], &[2, 1, 50], 1),
    (&[3, 1027], &[3, 9], 1),
    (&[1], &[5], 0),
    (&[4, 0], &[4, 2], 1),
];

/// Checks `gather` of `x` made by `make` on every gather case.
fn check_gathers(name: &str, make: impl Fn(&[usize], u64) -> Result<Tensor>) -> Result<()> {
    for (seed, &(xd, id, axis)) in GATHERS.iter().enumerate() {
        let x = make(xd, seed as u64)?;
        let a = axis.rem_euclid(xd.len() as isize) as usize;
        // Every index in range, from the start and from the end, then one
        // in six out of it (-len - 1, -len - 3, len, len + 2).
        let len = xd[a] as i64;
        let mut levels: Vec<i64> = (0..len).chain(-len..0).collect();
        levels.extend(levels.clone());
        levels.extend(levels.clone());
        levels.extend([-len - 1, -len - 3, len, len + 2]);
        let idx = draw(&levels, id.iter().product(), seed as u64 + 7);
        let (dims, want) = take_along_axis(&values(&x)?, xd, &idx, id, a, x.dtype().is_float());
        let narrow: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
        for indices in [Tensor::from_vec(idx, id)?, Tensor::from_vec(narrow, id)?] {
            check(
                &format!("gather of {name} {xd:?} along {axis} by {:?}", indices.ty()),
                &[x.clone(), indices],
                |t| t[0].gather(axis, &t[1]),
                x.dtype(),
                &dims,
                &want,
            )?;
        }
    }
    Ok(())
}

#[test]
fn gather_of_every_dtype_picks_along_the_axis() -> Result<()> {
    let mut floats = FLOATS.to_vec();
    floats.push(f32::NAN);
    check_gathers("f32", |dims, seed| {
        Tensor::from_vec(draw(&floats, dims.iter().product(), seed), dims)
    })?;
    check_gathers("i32", |dims, seed| {
        let ints = [i32::MIN, -7, -1, 0, 1, 5, i32::MAX];
        Tensor::from_vec(draw(&ints, dims.iter().product(), seed), dims)
    })?;
    check_gathers("u8", |dims, seed| {
        Tensor::from_vec(draw(&[0u8, 1, 200, 255], dims.iter().product(), seed), dims)
    })?;
    check_gathers("bool", |dims, seed| {
        Tensor::from_vec(draw(&[false, true], dims.iter().product(), seed), dims)
    })
}

#[test]
fn gather_picks_each_label_log_prob() -> Result<()> {
    // The log-probabilities realized first, so that every path picks from
    // the same values.
    let (log_probs, labels) = (
        Tensor::randn([9, 10], 3)?.log_softmax(1)?,
        Tensor::from_vec(vec![0i32, 9, 3, 3, 5, 1, 8, 2, 7], [9])?,
    );
    log_probs.realize()?;
    let picked = values(&log_probs)?;
    let want: Vec<f64> = (0..9)
        .map(|r| picked[r * 10 + [0, 9, 3, 3, 5, 1, 8, 2, 7][r]])
        .collect();
    check(
        "the labels' log-probabilities",
        &[log_probs, labels],
        |t| t[0].gather(1, &t[1].unsqueeze(1)?),
        DType::F32,
        &[9, 1],
        &want,
    )
}

#[test]
fn index_select_looks_up_embeddings() -> Result<()> {
    let table = Tensor::randn([11, 4], 5)?;
    let ids = [3i32, 0, 10, 3, 11, -1, -11, -12];
    let rows = values(&table)?;
    let want: Vec<f64> = ids
        .iter()
        .flat_map(|&i| {
            match usize::try_from(i.rem_euclid(11))
                .ok()
                .filter(|_| (-11..11).contains(&i))
            {
                Some(i) => rows[i * 4..i * 4 + 4].to_vec(),
                None => vec![f64::NAN; 4],
            }
        })
        .collect();
    check(
        "embedding rows",
        &[table, Tensor::from_vec(ids.to_vec(), [ids.len()])?],
        |t| t[0].index_select(0, &t[1]),
        DType::F32,
        &[8, 4],
        &want,
    )?;
    // Along a middle axis of an i32 tensor: x[:, ids, :].
    let x = Tensor::from_vec((0..30).collect::<Vec<i32>>(), [3, 5, 2])?;
    let ids = [4i32, 4, 0];
    let want: Vec<f64> = (0..3)
        .flat_map(|a| {
            ids.iter()
                .flat_map(move |&i| (0..2).map(move |c| a * 10 + i * 2 + c))
        })
        .map(f64::from)
        .collect();
    check(
        "x[:, ids, :]",
        &[x, Tensor::from_vec(ids.to_vec(), [3])?],
        |t| t[0].index_select(-2, &t[1]),
        DType::I32,
        &[3, 3, 2],
        &want,
    )
}

#[test]
fn gather_errors_name_the_op_and_shapes() -> Result<()> {
    let message = |r: Result<Tensor>| r.map(|_| ()).expect_err("an error").to_string();
    let x = Tensor::zeros([4, 5], DType::F32)?;
    assert_eq!(
        message(x.gather(1, &Tensor::zeros([4, 2], DType::F32)?)),
        "gather: expected i32 or i64 indices, got f32"
    );
    assert_eq!(
        message(x.gather(1, &Tensor::zeros([4], DType::I32)?)),
        "gather: shapes [4, 5] and [4] do not broadcast"
    );
    assert_eq!(
        message(x.gather(1, &Tensor::zeros([3, 2], DType::I32)?)),
        "gather: shapes [4, 5] and [3, 2] do not broadcast"
    );
    assert_eq!(
        message(x.gather(2, &Tensor::zeros([4, 2], DType::I32)?)),
        "gather: axis 2 is out of range for rank 2"
    );
    assert_eq!(
        message(x.index_select(0, &Tensor::zeros([1, 2], DType::I32)?)),
        "index_select: expected a tensor of rank 1, got shape [1, 2]"
    );
    Ok(())
}

#[test]
fn accuracy_by_argmax_fuses_into_the_logits_kernels() -> Result<()> {
    // Logits of a linear layer, their argmax against labels, the mean hit
    // rate: the matmul; the rows' max; the first hit, its compare and where
    // fused into the loads of the second max; the compare with the labels
    // fused into the mean.
    let (x, w) = (Tensor::randn([250, 784], 0)?, Tensor::randn([784, 10], 1)?);
    let labels = Tensor::from_vec(draw(&[0i32, 1, 2, 3, 4, 5, 6, 7, 8, 9], 250, 2), [250])?;
    let logits = x.matmul(&w)?;
    let accuracy = logits
        .argmax(1, false)?
        .eq(&labels)?
        .cast(DType::F32)?
        .mean_all()?;
    let optimized = kiln::optimize("accuracy", &[&accuracy], Options::default())?;
    assert_eq!(
        optimized.schedule.kernels(),
        4,
        "accuracy:\n{}",
        optimized.graph
    );
    let predicted = first_extreme(&values(&logits)?, &[250, 10], 1, false);
    let hits = predicted
        .iter()
        .zip(values(&labels)?)
        .filter(|(p, l)| **p == *l)
        .count();
    // The mean is the count times 1/250, within an ulp of the quotient.
    let got = accuracy.to_scalar::<f32>()?;
    assert!(
        (got - hits as f32 / 250.0).abs() <= f32::EPSILON,
        "{got} vs {hits}/250"
    );
    Ok(())
}

/// `f` on `inputs` along every path within `tol` (relative to the largest
/// magnitude) of the interpreter's result, NaN where it has NaN.
fn close(
    what: &str,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    tol: f64,
) -> Result<()> {
    let paths = every_path(inputs, &f)?;
    let want = values(&paths[1].1)?;
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(1.0f64, |m, w| m.max(w.abs()));
    for (path, out) in &paths {
        assert_eq!(out.dims(), paths[1].1.dims(), "{what}, {path}: shape");
        for (i, (g, w)) in values(out)?.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= tol * scale || (g.is_nan() && w.is_nan()),
                "{what}, {path}: element {i}: got {g}, want {w}"
            );
        }
    }
    Ok(())
}

#[test]
fn gathered_rows_fuse_into_elementwise_work_sums_and_products() -> Result<()> {
    // 67 columns: vectors of four and a tail; ids from the end and two
    // outside the table, which read NaN.
    let table = Tensor::randn([1000, 67], 11)?;
    let ids: Vec<i64> = (0..37).map(|t| (t * 389) % 2003 - 1001).collect();
    let ids = Tensor::from_vec(ids, [37])?;
    let inputs = [
        table,
        ids,
        Tensor::randn([37, 67], 12)?,
        Tensor::randn([37, 13], 13)?,
        Tensor::randn([13, 67], 14)?,
    ];
    close(
        "rows scaled and added to positions",
        &inputs,
        |t| (t[0].index_select(0, &t[1])? * 2.0f32)? + &t[2],
        0.0,
    )?;
    close(
        "rows summed",
        &inputs,
        |t| t[0].index_select(0, &t[1])?.sum(&[1], false),
        1e-5,
    )?;
    close(
        "rows added to a product",
        &inputs,
        |t| t[3].matmul(&t[4])? + t[0].index_select(0, &t[1])?,
        1e-5,
    )?;
    // Each a kernel of its own: the rows are read inside it, never copied.
    let t = &inputs;
    let rows = t[0].index_select(0, &t[1])?;
    for (what, y) in [
        ("sum", rows.sum(&[1], false)?),
        ("product", (t[3].matmul(&t[4])? + &rows)?),
    ] {
        let optimized = kiln::optimize(what, &[&y], Options::default())?;
        assert_eq!(
            optimized.schedule.kernels(),
            1,
            "{what}:\n{}",
            optimized.graph
        );
    }
    Ok(())
}

#[test]
fn a_gather_sends_each_gradient_to_the_element_it_picked() -> Result<()> {
    let x = Tensor::randn([7, 5], 21)?;
    // Repeated picks add up; -7 is 0, 7 and -8 pick nothing.
    let idx = [
        0i32, 3, -1, 6, 7, 3, 3, -7, 2, -8, 6, 0, 1, 1, 4, 5, 3, 0, -2, 2,
    ];
    let w = Tensor::randn([4, 5], 22)?;
    let ws = values(&w)?;
    let mut want = vec![0.0f64; 35];
    for (k, &i) in idx.iter().enumerate() {
        let row = if i < 0 { i + 7 } else { i };
        if (0..7).contains(&row) {
            want[row as usize * 5 + k % 5] += ws[k];
        }
    }
    let inputs = [x, Tensor::from_vec(idx.to_vec(), [4, 5])?, w];
    let dx = |t: &[Tensor]| -> Result<Tensor> {
        let loss = (t[0].gather(0, &t[1])? * &t[2])?.sum_all()?;
        Ok(kiln::grad(&loss, &[&t[0]])?.remove(0))
    };
    for (path, got) in every_path(&inputs, dx)? {
        for (i, (g, w)) in values(&got)?.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6,
                "dx, {path}: element {i}: got {g}, want {w}"
            );
        }
    }
    Ok(())
}

/// `src` [n, m] added into `out` [len, m] (or, `along_rows`, [n, m] into
/// [n, len]) at `idx`'s positions, in f64.
fn scatter_rows(
    out: &mut [f64],
    src: &[f64],
    idx: &[i64],
    shape: (usize, usize),
    len: usize,
    along_rows: bool,
) {
    let (n, m) = shape;
    for r in 0..n {
        for c in 0..m {
            let k = r * m + c;
            let i = if idx[k] < 0 {
                idx[k] + len as i64
            } else {
                idx[k]
            };
            if (0..len as i64).contains(&i) {
                let at = if along_rows {
                    r * len + i as usize
                } else {
                    i as usize * m + c
                };
                out[at] += src[k];
            }
        }
    }
}

#[test]
fn an_embedding_gradient_adds_each_row_where_its_id_points() -> Result<()> {
    // 67 columns: vectors of four and a tail; ids repeated, from the end,
    // and outside the table.
    let table = Tensor::randn([1000, 67], 31)?;
    let ids: Vec<i64> = (0..45)
        .map(|t| (t * 389) % 2003 - 1001)
        .chain([5, 5, -995])
        .collect();
    let w = Tensor::randn([48, 67], 32)?;
    let expanded: Vec<i64> = ids.iter().flat_map(|&i| [i; 67]).collect();
    let mut want = vec![0.0; 1000 * 67];
    scatter_rows(&mut want, &values(&w)?, &expanded, (48, 67), 1000, false);
    let inputs = [table, Tensor::from_vec(ids, [48])?, w];
    let dx = |t: &[Tensor]| -> Result<Tensor> {
        let loss = (t[0].index_select(0, &t[1])? * &t[2])?.sum_all()?;
        Ok(kiln::grad(&loss, &[&t[0]])?.remove(0))
    };
    for (path, got) in every_path(&inputs, dx)? {
        for (i, (g, w)) in values(&got)?.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "dx, {path}: element {i}: got {g}, want {w}"
            );
        }
    }
    Ok(())
}

#[test]
fn scatter_add_sums_repeats_in_order_and_drops_what_falls_outside() -> Result<()> {
    // Along the last axis (one element per pick) and along the first
    // (rows), with i32 and i64 indices.
    let base = Tensor::randn([9, 13], 41)?;
    let src = Tensor::randn([9, 13], 42)?;
    let idx: Vec<i64> = (0..9 * 13).map(|k| (k * 7) % 31 - 15).collect();
    for axis in [1, 0] {
        let len = if axis == 1 { 13 } else { 9 };
        let mut want = values(&base)?;
        scatter_rows(&mut want, &values(&src)?, &idx, (9, 13), len, axis == 1);
        let narrow: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
        for indices in [
            Tensor::from_vec(idx.clone(), [9, 13])?,
            Tensor::from_vec(narrow, [9, 13])?,
        ] {
            close(
                &format!("scatter_add along {axis} by {:?}", indices.dtype()),
                &[base.clone(), indices, src.clone()],
                |t| t[0].scatter_add(axis, &t[1], &t[2]),
                1e-6,
            )?;
            let got =
                values(&base.scatter_add(axis, &Tensor::from_vec(idx.clone(), [9, 13])?, &src)?)?;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5,
                    "along {axis}: element {i}: got {g}, want {w}"
                );
            }
        }
    }
    let message = base.scatter_add(
        0,
        &Tensor::zeros([9, 12], DType::I32)?,
        &Tensor::zeros([9, 12], DType::F32)?,
    );
    assert_eq!(
        message.map(|_| ()).expect_err("an error").to_string(),
        "scatter_add: shapes [9, 13] and [9, 12] differ"
    );
    Ok(())
}

#[test]
fn a_scatter_add_differentiates_to_the_gather_of_its_gradient() -> Result<()> {
    // d/dsrc sum(scatter_add(base, idx, src) * v) = v at each index, zero
    // where the index falls outside.
    let v = Tensor::randn([6, 4], 51)?;
    let idx = [0i32, 5, -1, 6, 2, -7, 3, 3, 1, 0, -6, 4];
    let vs = values(&v)?;
    let want: Vec<f64> = idx
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let i = if i < 0 { i + 6 } else { i };
            if (0..6).contains(&i) {
                vs[i as usize * 4 + k % 4]
            } else {
                0.0
            }
        })
        .collect();
    let inputs = [
        Tensor::zeros([6, 4], DType::F32)?,
        Tensor::from_vec(idx.to_vec(), [3, 4])?,
        Tensor::randn([3, 4], 52)?,
        v,
    ];
    let dsrc = |t: &[Tensor]| -> Result<Tensor> {
        let loss = (t[0].scatter_add(0, &t[1], &t[2])? * &t[3])?.sum_all()?;
        Ok(kiln::grad(&loss, &[&t[2]])?.remove(0))
    };
    for (path, got) in every_path(&inputs, dsrc)? {
        assert_eq!(values(&got)?, want, "dsrc, {path}");
    }
    Ok(())
}

#[test]
fn a_scatter_add_of_no_picks_leaves_the_tensor_as_it_is() -> Result<()> {
    let base = Tensor::randn([9, 13], 61)?;
    let want = values(&base)?;
    let empty = [
        base,
        Tensor::from_vec(Vec::<i64>::new(), [9, 0])?,
        Tensor::zeros([9, 0], DType::F32)?,
    ];
    check(
        "scatter_add of [9, 0]",
        &empty,
        |t| t[0].scatter_add(1, &t[1], &t[2]),
        DType::F32,
        &[9, 13],
        &want,
    )
}

#[test]
fn a_one_element_gradient_kernel_stores_no_scalar_beside_it() -> Result<()> {
    // The gradient of a one-row table is a one-element scatter kernel, and
    // `t + 1` a one-element value of the inputs alone, which fusion stores
    // beside an earlier one-element kernel where it can: never a scatter's.
    let specs = [
        TensorType::new(DType::F32, [1]),
        TensorType::new(DType::I32, [3]),
        TensorType::new(DType::F32, [3]),
        TensorType::new(DType::F32, Vec::<usize>::new()),
    ];
    let mut graph = kiln::compile("one_row", &specs, |t| {
        let loss = (t[0].index_select(0, &t[1])? * &t[2])?.sum_all()?;
        let dtable = kiln::grad(&loss, &[&t[0]])?.remove(0);
        Ok(vec![dtable, (&t[3] + 1.0f32)?])
    })?;
    let inputs = [
        Tensor::from_vec(vec![0.5f32], [1])?,
        Tensor::from_vec(vec![0i32, -1, 1], [3])?,
        Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [3])?,
        Tensor::scalar(7.0f32),
    ];
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let out = graph.call(&refs)?;
    assert_eq!(
        values(&out[0])?,
        [3.0],
        "0 and -1 pick the row, 1 is outside"
    );
    assert_eq!(values(&out[1])?, [8.0]);
    Ok(())
}

#[test]
fn a_step_whose_new_state_is_a_scatter_writes_it_in_place() -> Result<()> {
    let table = Tensor::randn([7, 3], 71)?;
    let specs = [
        TensorType::new(DType::I32, [4]),
        TensorType::new(DType::F32, [4, 3]),
    ];
    // The old table is read (its sum, an output), then the scatter that
    // computes the new one writes over it.
    let mut step = kiln::compile_step("scatter_state", &[&table], &specs, |s, args| {
        let loss = (s[0].index_select(0, &args[0])? * &args[1])?.sum_all()?;
        Ok((vec![s[0].sum_all()?], kiln::grad(&loss, &[&s[0]])?))
    })?;
    let ids = Tensor::from_vec(vec![6i32, 0, 6, -7], [4])?;
    let w = Tensor::randn([4, 3], 72)?;
    step.call(&[&ids, &w])?;
    assert!(
        step.in_place().iter().all(|&b| b),
        "the scatter writes over the table"
    );
    let ws = values(&w)?;
    let mut want = vec![0.0; 21];
    for (k, row) in [6usize, 0, 6, 0].into_iter().enumerate() {
        for c in 0..3 {
            want[row * 3 + c] += ws[k * 3 + c];
        }
    }
    let got = values(&step.state()?[0])?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-6, "element {i}: got {g}, want {w}");
    }
    Ok(())
}
