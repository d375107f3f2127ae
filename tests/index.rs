//! `argmax`, `argmin`, `gather` and `index_select` against direct loops, on
//! every path a graph can take: realized on the CPU and on the reference
//! interpreter, and compiled on the CPU fused and unfused (and on the GPU
//! that `KILN_TEST_DEVICE=cuda:N` names). Awkward shapes (1, 7, 50, 1027,
//! size-1 axes), ties, NaN, infinities, signed zeros, the extremes of each
//! integer type, broadcast indices, and indices out of range.

mod paths;

use kiln::{CompileOptions, DType, Error, Options, Result, Tensor, TensorType};
use paths::{check, close, values};

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
