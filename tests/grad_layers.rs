//! Gradients of the windowed ops, slices, binary extremes, attention and
//! every `nn` layer (by its input and its parameters) to second order, in
//! f32 and f64, against central finite differences on the interpreter
//! (`differences`), beside `tests/grad.rs`' elementwise, reduction and
//! composite rules.

mod differences;

use differences::{Loss, assert_second_order, check_in, gradients_of};
use kiln::nn::{
    BatchNorm2d, Conv2d, Dropout, Embedding, Flatten, LayerNorm, Linear, Module, Sequential,
};
use kiln::{DType, Pool2d, Result, Tensor};
use kiln_support::gradcheck::Rng;

/// `sum(tanh(y) * w)` for a fixed `w` drawn from `seed`: a loss that bends,
/// so that no Hessian-vector product it gives is zero by construction.
fn bent(y: &Tensor, seed: u64) -> Result<Tensor> {
    let w = Tensor::randn(y.dims(), seed)?.cast(y.dtype())?;
    y.tanh()?.mul(&w)?.sum_all()
}

/// `n` distinct values 0.04 apart in a shuffled order, within 2 of zero for
/// `n` up to 100: no central difference (steps of at most 0.02 there) moves
/// a maximum.
fn distinct(n: usize, rng: &mut Rng) -> Vec<f32> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order
        .iter()
        .map(|&k| (k as f32 - n as f32 / 2.0) * 0.04)
        .collect()
}

/// Each case's input shape, its values and its loss of the input, with
/// every tensor of `dtype`, f32 or f64.
fn cases(dtype: DType) -> Vec<(&'static str, Vec<usize>, Vec<f32>, Loss)> {
    let mut rng = Rng(31);
    let mut signed = |n: usize| rng.fill(n, |r| r.signed(0.2, 1.0));
    let fixed = |dims: &[usize], seed: u64| {
        (Tensor::randn(dims, seed).and_then(|t| t.cast(dtype))).expect("small")
    };
    let image = vec![2usize, 2, 5, 5];
    let img = signed(100);
    let (weight, picture) = (fixed(&[4, 1, 3, 3], 1), fixed(&[2, 2, 5, 5], 2));
    let (t_weight, t_input) = (fixed(&[2, 3, 3, 3], 3), fixed(&[1, 2, 3, 3], 4));
    let (k, v) = (fixed(&[1, 2, 4, 3], 5), fixed(&[1, 2, 4, 3], 6));
    let mask = fixed(&[4, 4], 7);
    let q = signed(24);
    // Each element of `other` is 0.2 to 1 away from its partner in `x`.
    let x = signed(15);
    let other: Vec<f32> = (x.iter().zip(signed(15))).map(|(a, d)| a + d).collect();
    let other = (Tensor::from_vec(other, [3, 5]).and_then(|t| t.cast(dtype))).expect("fills");
    let window = Pool2d {
        stride: [2, 1],
        padding: [(1, 1), (0, 1)],
        ..Pool2d::new([3, 2])
    };
    let mut shuffle = Rng(37);
    let mut cases: Vec<(&'static str, Vec<usize>, Vec<f32>, Loss)> = vec![
        (
            "conv2d, by its input",
            image.clone(),
            img.clone(),
            Box::new(move |x: &Tensor| {
                let y = x.conv2d(&weight, None, [2, 1], [(1, 0), (1, 1)], [1, 2], 2)?;
                bent(&y, 10)
            }),
        ),
        (
            "conv2d, by its weight",
            vec![3, 2, 3, 3],
            signed(54),
            Box::new(move |w: &Tensor| {
                bent(
                    &picture.conv2d(w, None, [1, 2], [(1, 1), (0, 0)], [1, 1], 1)?,
                    11,
                )
            }),
        ),
        (
            "conv_transpose2d, by its input",
            vec![1, 2, 3, 3],
            signed(18),
            Box::new(move |x: &Tensor| {
                let y =
                    x.conv_transpose2d(&t_weight, None, [2, 2], [(1, 1); 2], [1, 0], [1, 1], 1)?;
                bent(&y, 12)
            }),
        ),
        (
            "conv_transpose2d, by its weight",
            vec![2, 3, 3, 3],
            signed(54),
            Box::new(move |w: &Tensor| {
                let y = t_input.conv_transpose2d(
                    w,
                    None,
                    [2, 1],
                    [(0, 1), (1, 0)],
                    [1, 0],
                    [1, 1],
                    1,
                )?;
                bent(&y, 13)
            }),
        ),
        (
            "max_pool2d",
            image.clone(),
            distinct(100, &mut shuffle),
            Box::new(move |x: &Tensor| bent(&x.max_pool2d(&window)?, 14)),
        ),
        (
            "avg_pool2d",
            image.clone(),
            img.clone(),
            Box::new(move |x: &Tensor| bent(&x.avg_pool2d(&window, false)?, 15)),
        ),
        (
            "slice",
            vec![3, 5],
            x.clone(),
            Box::new(|x: &Tensor| bent(&x.slice(1, 1, 5, 2)?, 16)),
        ),
        ("maximum", vec![3, 5], x.clone(), {
            let other = other.clone();
            Box::new(move |x: &Tensor| bent(&x.maximum(&other)?, 17))
        }),
        (
            "minimum",
            vec![3, 5],
            x,
            Box::new(move |x: &Tensor| bent(&other.minimum(x)?, 18)),
        ),
        (
            "attention, causal, by the query",
            vec![1, 2, 4, 3],
            q.clone(),
            {
                let (k, v) = (k.clone(), v.clone());
                Box::new(move |q: &Tensor| {
                    bent(
                        &q.scaled_dot_product_attention(&k, &v, None, true, None)?,
                        19,
                    )
                })
            },
        ),
        (
            "attention, masked, by the key",
            vec![1, 2, 4, 3],
            q,
            Box::new(move |k: &Tensor| {
                let q = v.mul(&Tensor::scalar(0.5f32).cast(dtype)?)?;
                bent(
                    &q.scaled_dot_product_attention(k, &v, Some(&mask), false, Some(0.7))?,
                    20,
                )
            }),
        ),
    ];
    let norm = BatchNorm2d {
        weight: fixed(&[2], 8),
        bias: fixed(&[2], 9),
        ..BatchNorm2d::new(2)
            .and_then(|m| m.to_dtype(dtype))
            .expect("small")
    };
    cases.push((
        "batch norm, training",
        image,
        img,
        Box::new(move |x: &Tensor| bent(&norm.forward_train(x, &mut Vec::new())?, 21)),
    ));
    cases
}

#[test]
fn windows_and_layers_match_differences_to_second_order() {
    assert_second_order(DType::F32, cases(DType::F32));
}

#[test]
fn windows_and_layers_in_f64_match_differences_to_second_order() {
    assert_second_order(DType::F64, cases(DType::F64));
}

/// What a module is given: a float input drawn by the check, and so
/// differentiated, or fixed ids.
enum Input {
    Drawn(Vec<usize>),
    Fixed(Tensor),
}

/// `model` cast to `dtype`, in training mode, every parameter drawn in
/// place of its own: the gradients of a bent loss of its output by its
/// input (where drawn) and by each parameter against differences, and the
/// Hessian-vector products across all of them together.
fn check_module<M: Module + Clone>(
    name: &str,
    dtype: DType,
    model: &M,
    input: &Input,
) -> Vec<String> {
    let model = model.to_dtype(dtype).expect("a float type");
    let mut rng = Rng(name.len() as u64);
    let mut draw = |dims: &[usize]| {
        (
            dims.to_vec(),
            rng.fill(dims.iter().product(), |r| r.signed(0.2, 1.0)),
        )
    };
    let mut inputs = Vec::new();
    if let Input::Drawn(dims) = input {
        inputs.push(draw(dims));
    }
    inputs.extend(model.parameters().iter().map(|(_, p)| draw(p.dims())));
    let loss = |p: &[Tensor]| {
        let (x, params) = match input {
            Input::Drawn(_) => (&p[0], &p[1..]),
            Input::Fixed(ids) => (ids, p),
        };
        let y = model
            .with_parameters(params)?
            .forward_train(x, &mut Vec::new())?;
        bent(&y, 22)
    };
    let inputs: Vec<(&[usize], Vec<f32>)> = (inputs.iter())
        .map(|(d, v)| (d.as_slice(), v.clone()))
        .collect();
    let mut failures = Vec::new();
    if let Err(e) = check_in(dtype, &inputs, 1, loss) {
        failures.push(format!("{name}, first order: {e}"));
    }
    if let Err(e) = check_in(dtype, &inputs, 2, gradients_of(loss)) {
        failures.push(format!("{name}, second order: {e}"));
    }
    failures
}

/// Every layer of `nn` that holds parameters or draws, and a model of
/// several, in `dtype` (`Module::to_dtype`).
fn check_modules(dtype: DType) -> Result<()> {
    let mut conv = Conv2d::new(2, 3, [3, 3], 1)?;
    (conv.stride, conv.padding) = ([2, 1], [(1, 1), (0, 1)]);
    let mut small_conv = Conv2d::new(1, 2, [3, 3], 2)?;
    small_conv.padding = [(1, 1); 2];
    let model = Sequential::new(vec![
        Box::new(small_conv),
        Box::new(BatchNorm2d::new(2)?),
        Box::new(Flatten),
        Box::new(Dropout::new(0.25, 3)?),
        Box::new(Linear::new(32, 3, 4)?),
    ]);
    // Repeated ids and one from the end.
    let ids = Tensor::from_vec(vec![0i64, 3, 3, -1, 5, 0], [2, 3])?;
    let drawn = |dims: &[usize]| Input::Drawn(dims.to_vec());
    let failures = [
        check_module("Linear", dtype, &Linear::new(5, 3, 5)?, &drawn(&[4, 5])),
        check_module("Conv2d", dtype, &conv, &drawn(&[2, 2, 5, 4])),
        check_module(
            "BatchNorm2d",
            dtype,
            &BatchNorm2d::new(2)?,
            &drawn(&[3, 2, 3, 3]),
        ),
        check_module("LayerNorm", dtype, &LayerNorm::new(5)?, &drawn(&[3, 5])),
        check_module(
            "Embedding",
            dtype,
            &Embedding::new(6, 3, 6)?,
            &Input::Fixed(ids),
        ),
        check_module("Dropout", dtype, &Dropout::new(0.5, 7)?, &drawn(&[3, 5])),
        check_module("Sequential", dtype, &model, &drawn(&[2, 1, 4, 4])),
    ]
    .concat();
    assert!(failures.is_empty(), "{dtype}: {}", failures.join("\n"));
    Ok(())
}

#[test]
fn modules_match_differences_to_second_order() -> Result<()> {
    check_modules(DType::F32)
}

#[test]
fn modules_in_f64_match_differences_to_second_order() -> Result<()> {
    check_modules(DType::F64)
}

#[test]
fn a_weights_gradient_over_a_batch_is_one_product() -> Result<()> {
    // x [16, 64, 64] @ w [64, 80]: the weight's gradient, `sum_b x[b]^T @
    // dy[b]`, is one product of depth 16 * 64 (`sum-of-products`), against
    // the definition in f64.
    let (b, t, d, o) = (16, 64, 64, 80);
    let x = Tensor::randn([b, t, d], 40)?;
    let w = Tensor::randn([d, o], 41)?;
    let r = Tensor::randn([b, t, o], 42)?;
    let loss = x.matmul(&w)?.mul(&r)?.sum_all()?;
    let dw = kiln::grad(&loss, &[&w])?.remove(0);
    let text = kiln::explain("dw", &[&dw], kiln::Options::default())?;
    assert!(text.contains("sum-of-products x1"), "{text}");
    let (xs, rs) = (x.to_vec::<f32>()?, r.to_vec::<f32>()?);
    let got = dw.to_vec::<f32>()?;
    for (i, g) in got.iter().enumerate() {
        let (row, col) = (i / o, i % o);
        let want: f64 = (0..b * t)
            .map(|p| f64::from(xs[p * d + row]) * f64::from(rs[p * o + col]))
            .sum();
        let tolerance = 1e-5 * (b * t) as f64;
        assert!(
            (f64::from(*g) - want).abs() <= tolerance,
            "dw[{i}]: {g} against {want}"
        );
    }
    Ok(())
}
