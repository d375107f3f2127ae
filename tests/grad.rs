//! `kiln::grad` and `kiln::value_and_grad`: the composites' gradients
//! against central finite differences on the interpreter
//! (`kiln_support::gradcheck`, which states the tolerance), and what the
//! front end promises: lazy gradients that share the forward pass, that
//! trace once inside `kiln::compile`, zeros for tensors the loss does not
//! read, and errors that name the op.

mod differences;

use differences::{Loss, assert_second_order, check, gradient_of};
use kiln::{
    DType, Device, Result, Tensor, TensorType, capture, compile, grad, realize, value_and_grad,
};
use kiln_support::gradcheck::Rng;
use proptest::prelude::*;

/// The shape of `rule_cases`' inputs.
const SHAPE: [usize; 2] = [3, 5];

/// Each rule family's case: a name, the input's values (of shape `SHAPE`)
/// and a loss of the input, every tensor of `dtype`, f32 or f64.
fn rule_cases(dtype: DType) -> Vec<(&'static str, Vec<usize>, Vec<f32>, Loss)> {
    let f = Fixtures::new(dtype);
    let cases = elementwise_cases(&f, dtype)
        .into_iter()
        .chain(composite_cases(&f, dtype));
    cases
        .map(|(name, x, loss)| (name, SHAPE.to_vec(), x.to_vec(), loss))
        .collect()
}

/// The values and the fixed tensors the rule families' cases share.
struct Fixtures {
    w: Tensor,
    m: Tensor,
    targets: Tensor,
    picks: Tensor,
    scattered: Tensor,
    signed: Vec<f32>,
    positive: Vec<f32>,
    zeros: Vec<f32>,
}

impl Fixtures {
    fn new(dtype: DType) -> Fixtures {
        let mut rng = Rng(17);
        let of = |values: Vec<f32>, dims: &[usize]| {
            (Tensor::from_vec(values, dims).and_then(|t| t.cast(dtype))).expect("fills")
        };
        let w = of(rng.fill(15, |r| r.uniform(-1.0, 1.0)), &SHAPE);
        let m = of(rng.fill(5 * 4, |r| r.uniform(-1.0, 1.0)), &[5, 4]);
        let targets = Tensor::from_vec(vec![1i32, 4, 0], [3]).expect("fills");
        // Repeated picks and picks from the end; scatter_add's also outside
        // the axis, which it drops (a gather reads NaN there, which no
        // difference checks: `tests/scatter.rs` does).
        let picks = [0i64, 4, 4, -1, 2, 1, 1, 3, 3, 3, -5, 0, 2, -2, 4];
        let picks = Tensor::from_vec(picks.to_vec(), SHAPE).expect("fills");
        let scattered = [0i64, 4, 4, -1, 2, 9, 1, 3, 3, 3, -5, 0, 2, -6, 4];
        let scattered = Tensor::from_vec(scattered.to_vec(), SHAPE).expect("fills");
        // Away from every kink: magnitudes in [0.2, 1) of either sign, or
        // positive where the op needs it; distinct, so no maximum ties.
        let signed = rng.fill(15, |r| r.signed(0.2, 1.0));
        let positive = rng.fill(15, |r| r.uniform(0.5, 2.0));
        // Rows with one zero, two zeros and none: prod's rule is exact there.
        let mut zeros = signed.clone();
        zeros[2] = 0.0;
        zeros[5] = 0.0;
        zeros[9] = 0.0;
        Fixtures {
            w,
            m,
            targets,
            picks,
            scattered,
            signed,
            positive,
            zeros,
        }
    }
}

/// `sum(f(x) * w)`.
fn weighted(
    w: &Tensor,
    f: fn(&Tensor) -> Result<Tensor>,
) -> impl Fn(&Tensor) -> Result<Tensor> + use<> {
    let w = w.clone();
    move |x: &Tensor| f(x)?.mul(&w)?.sum_all()
}

/// `value` as a scalar of `dtype`.
fn constant(dtype: DType, value: f32) -> Tensor {
    Tensor::scalar(value).cast(dtype).expect("a float type")
}

/// A case: a name, the input's values and its loss.
type Case<'f> = (&'static str, &'f [f32], Loss);

/// The elementwise ops', the reductions' and the product's cases.
fn elementwise_cases(f: &Fixtures, dtype: DType) -> Vec<Case<'_>> {
    let Fixtures {
        w,
        m,
        signed,
        positive,
        zeros,
        ..
    } = f;
    vec![
        ("exp", signed, Box::new(weighted(w, |x| x.exp()))),
        ("tanh", signed, Box::new(weighted(w, |x| x.tanh()))),
        ("sigmoid", signed, Box::new(weighted(w, |x| x.sigmoid()))),
        ("recip", signed, Box::new(weighted(w, |x| x.recip()))),
        ("log", positive, Box::new(weighted(w, |x| x.log()))),
        ("sqrt", positive, Box::new(weighted(w, |x| x.sqrt()))),
        (
            "cube",
            positive,
            Box::new({
                let (w, three) = (w.clone(), constant(dtype, 3.0));
                move |x: &Tensor| x.pow(&three)?.mul(&w)?.sum_all()
            }),
        ),
        ("abs", signed, Box::new(weighted(w, |x| x.abs()?.square()))),
        (
            "relu",
            signed,
            Box::new(weighted(w, |x| x.relu()?.square())),
        ),
        ("gelu", signed, Box::new(weighted(w, |x| x.gelu()))),
        (
            "div",
            signed,
            Box::new({
                let (w, one) = (w.clone(), constant(dtype, 1.0));
                move |x: &Tensor| x.div(&x.square()?.add(&one)?)?.mul(&w)?.sum_all()
            }),
        ),
        (
            "max",
            signed,
            Box::new(|x: &Tensor| x.max(&[1], false)?.square()?.sum_all()),
        ),
        (
            "prod",
            signed,
            Box::new(|x: &Tensor| x.prod(&[1], false)?.sum_all()),
        ),
        (
            "prod at zeros",
            zeros,
            Box::new(|x: &Tensor| x.prod(&[1], false)?.sum_all()),
        ),
        (
            "mean",
            signed,
            Box::new(|x: &Tensor| x.mean(&[0], false)?.exp()?.sum_all()),
        ),
        (
            "matmul",
            signed,
            Box::new({
                let m = m.clone();
                move |x: &Tensor| x.matmul(&m)?.tanh()?.sum_all()
            }),
        ),
    ]
}

/// The composites' and the indexed ops' cases.
fn composite_cases(f: &Fixtures, dtype: DType) -> Vec<Case<'_>> {
    let Fixtures {
        w,
        targets,
        picks,
        scattered,
        ..
    } = f;
    let signed = &f.signed[..];
    vec![
        ("softmax", signed, Box::new(weighted(w, |x| x.softmax(-1)))),
        (
            "log_softmax",
            signed,
            Box::new(weighted(w, |x| x.log_softmax(-1))),
        ),
        (
            "cross_entropy",
            signed,
            Box::new({
                let targets = targets.clone();
                move |x: &Tensor| x.cross_entropy(&targets)
            }),
        ),
        (
            "layer_norm",
            signed,
            Box::new({
                let (g, b) = (
                    Tensor::ones([5], dtype).expect("small"),
                    Tensor::zeros([5], dtype).expect("small"),
                );
                let w = w.clone();
                move |x: &Tensor| x.layer_norm(&g, &b, 1e-5)?.mul(&w)?.sum_all()
            }),
        ),
        (
            "cross_entropy with options",
            signed,
            Box::new({
                let targets = targets.clone();
                let weight = Tensor::from_vec(vec![0.5f32, 2.0, 1.0, 0.25, 3.0], [5])
                    .and_then(|t| t.cast(dtype))
                    .expect("fills");
                move |x: &Tensor| {
                    let options = kiln::CrossEntropy {
                        weight: Some(&weight),
                        ignore_index: Some(4),
                        label_smoothing: 0.1,
                    };
                    x.cross_entropy_with(&targets, &options)
                }
            }),
        ),
        (
            "min",
            signed,
            Box::new(|x: &Tensor| x.min(&[1], false)?.square()?.sum_all()),
        ),
        (
            "var",
            signed,
            Box::new(weighted(w, |x| x.var(&[1], 1, true)?.sqrt())),
        ),
        (
            "std",
            signed,
            Box::new(|x: &Tensor| x.std(&[0], 0, false)?.exp()?.sum_all()),
        ),
        (
            "logsumexp",
            signed,
            Box::new(|x: &Tensor| x.logsumexp(&[1], false)?.square()?.sum_all()),
        ),
        (
            "cumsum",
            signed,
            Box::new(weighted(w, |x| x.cumsum(1)?.square())),
        ),
        (
            "clamp",
            signed,
            Box::new(weighted(w, |x| x.clamp(-0.5, 0.5)?.square())),
        ),
        (
            "gather",
            signed,
            Box::new({
                let (picks, w) = (picks.clone(), w.clone());
                move |x: &Tensor| x.gather(1, &picks)?.tanh()?.mul(&w)?.sum_all()
            }),
        ),
        (
            "scatter_add",
            signed,
            Box::new({
                let base = Tensor::zeros([3, 6], dtype).expect("small");
                let scattered = scattered.clone();
                move |x: &Tensor| {
                    base.scatter_add(1, &scattered, x)?
                        .tanh()?
                        .square()?
                        .sum_all()
                }
            }),
        ),
        (
            "mse",
            signed,
            Box::new({
                let w = w.clone();
                move |x: &Tensor| x.mse_loss(&w)
            }),
        ),
    ]
}

#[test]
fn rules_match_differences_to_second_order() {
    assert_second_order(DType::F32, rule_cases(DType::F32));
}

#[test]
fn rules_in_f64_match_differences_to_second_order() {
    assert_second_order(DType::F64, rule_cases(DType::F64));
}

/// One composite on random awkward shapes.
fn composite_case(seed: u64) -> std::result::Result<(), String> {
    let mut rng = Rng(seed);
    let dim = |rng: &mut Rng| [1, 2, 3, 5, 7][rng.below(5)];
    let (rows, cols) = (dim(&mut rng), dim(&mut rng));
    let values = |n: usize, rng: &mut Rng| rng.fill(n, |r| r.uniform(-2.0, 2.0));
    let x = values(rows * cols, &mut rng);
    let shape = [rows, cols];
    let kind = rng.below(7);
    let result = match kind {
        0 => {
            let axis = [-1, 0][rng.below(2)];
            check(&[(&shape, x)], seed, |p| p[0].softmax(axis))
        }
        1 => {
            let axis = [-1, 0][rng.below(2)];
            check(&[(&shape, x)], seed, |p| p[0].log_softmax(axis))
        }
        2 => {
            // Normalization bends on the scale of a row's spread, so rows
            // are spread well beyond a difference's step: 3 or more values
            // about 0.7 apart (a row of two normalizes to about (-1, 1)
            // whatever its values).
            let cols = [3, 5, 7][rng.below(3)];
            let shape = [rows, cols];
            let mut x = Vec::new();
            for _ in 0..rows {
                let mut order: Vec<usize> = (0..cols).collect();
                for i in (1..cols).rev() {
                    order.swap(i, rng.below(i + 1));
                }
                x.extend(
                    order
                        .iter()
                        .map(|&k| (k as f32 - cols as f32 / 2.0) * 0.7 + rng.uniform(-0.2, 0.2)),
                );
            }
            let (w, b) = (values(cols, &mut rng), values(cols, &mut rng));
            check(&[(&shape, x), (&[cols], w), (&[cols], b)], seed, |p| {
                p[0].layer_norm(&p[1], &p[2], 1e-5)
            })
        }
        3 => check(&[(&shape, x)], seed, |p| p[0].gelu()),
        4 => {
            let targets: Vec<i32> = (0..rows).map(|_| rng.below(cols) as i32).collect();
            let targets = Tensor::from_vec(targets, [rows]).map_err(|e| e.to_string())?;
            check(&[(&shape, x)], seed, |p| p[0].cross_entropy(&targets))
        }
        5 => {
            // The target broadcast along the rows: its gradient sums them.
            let t = values(cols, &mut rng);
            check(&[(&shape, x), (&[cols], t)], seed, |p| {
                p[0].mse_loss(&p[1].expand(p[0].shape().clone())?)
            })
        }
        _ => {
            // A small network through several composites at once.
            let w = values(cols * 3, &mut rng);
            check(&[(&shape, x), (&[cols, 3], w)], seed, |p| {
                p[0].matmul(&p[1])?.gelu()?.log_softmax(-1)
            })
        }
    };
    result.map_err(|e| format!("case {kind}: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn composites_match_differences(seed in any::<u64>()) {
        composite_case(seed).map_err(TestCaseError::fail)?;
    }
}

/// The trigonometric and hyperbolic functions, inside their domains.
#[test]
fn trigonometric_and_hyperbolic_gradients_match_differences() {
    let mut rng = Rng(23);
    // Inside each domain, away from its edges and poles.
    let signed = rng.fill(12, |r| r.signed(0.1, 1.2));
    let inside = rng.fill(12, |r| r.signed(0.1, 0.8));
    let above = rng.fill(12, |r| r.uniform(1.3, 3.0));
    type Op = fn(&Tensor) -> Result<Tensor>;
    let cases: [(&str, &[f32], Op); 11] = [
        ("sin", &signed, Tensor::sin),
        ("cos", &signed, Tensor::cos),
        ("tan", &inside, Tensor::tan),
        ("asin", &inside, Tensor::asin),
        ("acos", &inside, Tensor::acos),
        ("atan", &signed, Tensor::atan),
        ("sinh", &signed, Tensor::sinh),
        ("cosh", &signed, Tensor::cosh),
        ("asinh", &signed, Tensor::asinh),
        ("acosh", &above, Tensor::acosh),
        ("atanh", &inside, Tensor::atanh),
    ];
    for (i, (name, values, op)) in cases.into_iter().enumerate() {
        let result = check(&[(&[3, 4], values.to_vec())], i as u64, |t| op(&t[0]));
        assert!(result.is_ok(), "{name}: {result:?}");
        // And their second order, through the first's rule.
        let loss = move |x: &Tensor| op(x)?.sum_all();
        let result = check(&[(&[3, 4], values.to_vec())], i as u64, gradient_of(loss));
        assert!(result.is_ok(), "{name}, second order: {result:?}");
    }
}

/// Convolutions by both of their forms and pooling, differentiated through
/// their windows: stride, dilation, padding on one side, groups, bias.
#[test]
fn convolution_and_pooling_match_differences() {
    let mut rng = Rng(19);
    let mut values = |n: usize| rng.fill(n, |r| r.uniform(-1.0, 1.0));
    let x = values(2 * 4 * 6 * 5);
    let x_shape: &[usize] = &[2, 4, 6, 5];
    // Four channels in two groups: the multiply-and-sum.
    let (w, b) = (values(6 * 2 * 3 * 2), values(6));
    check(
        &[(x_shape, x.clone()), (&[6, 2, 3, 2], w), (&[6], b)],
        1,
        |p| p[0].conv2d(&p[1], Some(&p[2]), [2, 1], [(1, 0), (0, 2)], [1, 2], 2),
    )
    .unwrap();
    // 8 channels x 9 positions: above the multiply-and-sum's limit, im2col and the GEMM.
    let (x8, w) = (values(8 * 5 * 4), values(3 * 8 * 3 * 3));
    check(&[(&[1, 8, 5, 4], x8), (&[3, 8, 3, 3], w)], 2, |p| {
        p[0].conv2d(&p[1], None, [1, 1], [(1, 1), (0, 1)], [1, 1], 1)
    })
    .unwrap();
    // Transposed, strided, in two groups: with output padding, and without
    // it, where the strides are as long as the kernel (one product per
    // group).
    for (seed, extra) in [(5, [1, 2]), (6, [0, 0])] {
        let (w, b) = (values(4 * 3 * 2 * 3), values(6));
        check(
            &[(x_shape, x.clone()), (&[4, 3, 2, 3], w), (&[6], b)],
            seed,
            |p| {
                p[0].conv_transpose2d(
                    &p[1],
                    Some(&p[2]),
                    [2, 3],
                    [(1, 0), (0, 1)],
                    extra,
                    [1, 1],
                    2,
                )
            },
        )
        .unwrap();
    }
    let window = kiln::Pool2d {
        stride: [2, 1],
        padding: [(1, 0), (0, 1)],
        ceil_mode: true,
        ..kiln::Pool2d::new([2, 3])
    };
    check(&[(x_shape, x.clone())], 3, |p| {
        p[0].avg_pool2d(&window, false)
    })
    .unwrap();
    // Distinct values a step apart, so that no difference moves a maximum.
    let spread: Vec<f32> = (0..x.len())
        .map(|i| ((i * 37) % x.len()) as f32 * 0.1)
        .collect();
    check(&[(x_shape, spread)], 4, |p| p[0].max_pool2d(&window)).unwrap();
}

fn t(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(values, shape).expect("values fill the shape")
}

/// How many nodes of `op`'s kind the graph behind `outputs` holds.
fn count(outputs: &[&Tensor], op: &str) -> usize {
    let graph = capture("count", outputs);
    graph.nodes.iter().filter(|n| n.op.name() == op).count()
}

#[test]
fn gradients_are_lazy_tensors_that_share_the_forward_pass() -> Result<()> {
    let x = t(&[1.0, -2.0, 0.5, 3.0, -1.0, 2.0], &[2, 3]);
    let w = t(&[0.5, -1.0, 1.0, 0.25, -0.5, 2.0], &[3, 2]);
    let h = x.matmul(&w)?.relu()?;
    let loss = h.sum_all()?;
    let (loss, grads) = value_and_grad(&loss, &[&w])?;
    let dw = &grads[0];
    assert!(!dw.is_realized() && !loss.is_realized());
    // Users keep computing with the gradient: an SGD step, still lazy.
    let stepped = w.sub(&dw.mul(&Tensor::scalar(0.1f32))?)?;
    // One forward matmul shared by the loss and the step, one for dW and
    // none for dx, which nobody asked for.
    assert_eq!(count(&[&loss, &stepped], "matmul"), 2);
    realize(&[&loss, &stepped])?;
    // h = relu(x @ w) = relu([[-1.75, -0.5], [-0.5, 0.75]]).
    assert_eq!(loss.to_scalar::<f32>()?, 0.75);
    // dW = x^T @ (h > 0): only h[1][1] is positive, so column 1 is x's row 1.
    let want = [0.0, 3.0, 0.0, -1.0, 0.0, 2.0];
    assert_eq!(dw.to_vec::<f32>()?, want);
    let expect: Vec<f32> = [0.5, -1.0, 1.0, 0.25, -0.5, 2.0]
        .iter()
        .zip(want)
        .map(|(w, g): (&f32, f32)| w - g * 0.1)
        .collect();
    assert_eq!(stepped.to_vec::<f32>()?, expect);
    Ok(())
}

fn f32s(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

#[test]
fn a_compiled_training_step_traces_once_and_matches_eager_gradients() -> Result<()> {
    // Fit y = 2x + 1 by full-batch gradient descent; the weights go in and
    // come out as values of the compiled step.
    let xs: Vec<f32> = (0..8).map(|i| i as f32 / 4.0 - 1.0).collect();
    let ys: Vec<f32> = xs.iter().map(|x| 2.0 * x + 1.0).collect();
    let (x, y) = (t(&xs, &[8, 1]), t(&ys, &[8, 1]));
    let mut traces = 0;
    let mut step = compile("step", &[f32s(&[1, 1]), f32s(&[1])], |p| {
        traces += 1;
        let loss = x.matmul(&p[0])?.add(&p[1])?.mse_loss(&y)?;
        let (loss, g) = value_and_grad(&loss, &[&p[0], &p[1]])?;
        let lr = Tensor::scalar(0.3f32);
        Ok(vec![
            loss,
            p[0].sub(&g[0].mul(&lr)?)?,
            p[1].sub(&g[1].mul(&lr)?)?,
        ])
    })?;
    let (mut w, mut b) = (t(&[0.0], &[1, 1]), t(&[0.0], &[1]));
    // The first step's gradients as the eager API computes them.
    let eager_loss = x.matmul(&w)?.add(&b)?.mse_loss(&y)?;
    let eager = grad(&eager_loss, &[&w, &b])?;
    let mut losses = Vec::new();
    for i in 0..60 {
        let out = step.call(&[&w, &b])?;
        if i == 0 {
            let lr = 0.3f32;
            let dw = -out[1].to_scalar::<f32>()? / lr;
            let db = -out[2].to_scalar::<f32>()? / lr;
            let (ew, eb) = (eager[0].to_scalar::<f32>()?, eager[1].to_scalar::<f32>()?);
            assert!((dw - ew).abs() <= 1e-5 * ew.abs() && (db - eb).abs() <= 1e-5 * eb.abs());
        }
        losses.push(out[0].to_scalar::<f32>()?);
        (w, b) = (out[1].clone(), out[2].clone());
    }
    assert_eq!(traces, 1);
    assert!(losses[59] < 1e-4 * losses[0], "{losses:?}");
    assert!((w.to_scalar::<f32>()? - 2.0).abs() < 1e-2);
    assert!((b.to_scalar::<f32>()? - 1.0).abs() < 1e-2);
    Ok(())
}

#[test]
fn a_nan_input_shows_in_abs_and_max_gradients_as_in_jax() -> Result<()> {
    let x = t(&[f32::NAN, -2.0, 0.0, 3.0], &[4]);
    let g = grad(&x.abs()?.sum_all()?, &[&x])?
        .remove(0)
        .to_vec::<f32>()?;
    assert!(g[0].is_nan(), "{g:?}");
    assert_eq!(&g[1..], [-1.0, 0.0, 1.0]);
    // relu's is 0 there, as JAX's (PyTorch passes the gradient through).
    let g = grad(&x.relu()?.sum_all()?, &[&x])?
        .remove(0)
        .to_vec::<f32>()?;
    assert_eq!(g, [0.0, 0.0, 0.0, 1.0]);
    // A row whose maximum (or minimum) is NaN gets NaN everywhere, as in
    // JAX and PyTorch (`amax`); ties share the rest.
    let rows = t(&[f32::NAN, 1.0, 2.0, 2.0, 5.0, -1.0], &[3, 2]);
    type Extreme = fn(&Tensor, &[isize], bool) -> Result<Tensor>;
    let extremes: [(&str, Extreme); 2] = [("max", Tensor::max), ("min", Tensor::min)];
    for (name, extreme) in extremes {
        let loss = extreme(&rows, &[1], false)?.sum_all()?;
        let g = grad(&loss, &[&rows])?.remove(0).to_vec::<f32>()?;
        assert!(g[0].is_nan() && g[1].is_nan(), "{name}: {g:?}");
        let last = if name == "max" {
            [1.0, 0.0]
        } else {
            [0.0, 1.0]
        };
        assert_eq!(g[2..], [0.5, 0.5, last[0], last[1]], "{name}");
    }
    Ok(())
}

#[test]
fn tensors_the_loss_does_not_read_get_zeros() -> Result<()> {
    let x = t(&[1.0, 2.0], &[2]);
    let unused = t(&[5.0; 6], &[2, 3]);
    let g = grad(&x.square()?.sum_all()?, &[&unused, &x])?;
    assert_eq!(g[0].dims(), [2, 3]);
    assert_eq!(g[0].to_vec::<f32>()?, [0.0; 6]);
    assert_eq!(g[1].to_vec::<f32>()?, [2.0, 4.0]);
    Ok(())
}

#[test]
fn a_gradient_cut_by_a_value_already_read_is_an_error() -> Result<()> {
    let cut = "grad: tensor 1 of wrt (f32[1]) reaches the loss through a value already computed";
    let cut_at_0 =
        "grad: tensor 0 of wrt (f32[1]) reaches the loss through a value already computed";
    let w = t(&[3.0], &[1]);
    let h = w.mul(&w)?;
    h.realize()?;
    // h has forgotten that it came from w: w's gradient would miss it.
    let err = grad(&h.sum_all()?, &[&h, &w]).err().map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.starts_with(cut)),
        "{err:?}"
    );
    // h itself is a constant with a gradient of its own.
    assert_eq!(grad(&h.sum_all()?, &[&h])?[0].to_vec::<f32>()?, [1.0]);
    // The loss read before its gradients, as a training loop logs it.
    let x = t(&[1.0, 2.0], &[2]);
    let loss = (&x * &w)?.sum_all()?;
    assert_eq!(loss.to_scalar::<f32>()?, 9.0);
    let err = grad(&loss, &[&w]).err();
    assert!(err.is_some_and(|e| e.to_string().starts_with(cut_at_0)));
    // An activation logged on the way to the loss.
    let a = (&x * &w)?;
    a.to_vec::<f32>()?;
    let err = grad(&a.square()?.sum_all()?, &[&w]).err();
    assert!(err.is_some_and(|e| e.to_string().starts_with(cut_at_0)));
    // A tensor moved to another device is read too.
    let moved = w.to(Device::Reference)?;
    let err = grad(&(&x * &moved)?.sum_all()?, &[&x, &w]).err();
    assert!(err.is_some_and(|e| e.to_string().starts_with(cut)));
    // Read together with its gradients, the loss is no cut.
    let (value, g) = kiln::value_and_grad(&(&x * &w)?.sum_all()?, &[&w])?;
    realize(&[&value, &g[0]])?;
    assert_eq!(
        (value.to_scalar::<f32>()?, g[0].to_vec::<f32>()?),
        (9.0, vec![3.0])
    );
    // A value computed from data alone and read first is a constant, as
    // any data is.
    let scale = (x.sum_all()? * 0.5f32)?;
    scale.realize()?;
    let g = grad(&(&w * &scale)?.sum_all()?, &[&w])?;
    assert_eq!(g[0].to_vec::<f32>()?, [1.5]);
    // An eager chain of reads whose earlier values are gone still says so.
    let mut h = (&x * &w)?;
    for _ in 0..3 {
        h = (&h * 2.0f32)?;
        h.realize()?;
    }
    let err = grad(&h.sum_all()?, &[&w]).err();
    assert!(err.is_some_and(|e| e.to_string().starts_with(cut_at_0)));
    Ok(())
}

#[test]
fn values_read_that_no_gradient_would_cross_cut_nothing() -> Result<()> {
    let w = t(&[3.0, -1.0], &[2]);
    let x = t(&[1.0, 2.0], &[2]);
    // Realized together with a value that read w, a value that did not.
    let feats = (&x * 2.0f32)?;
    let w_norm = w.square()?.sum_all()?;
    realize(&[&feats, &w_norm])?;
    let g = grad(&(&feats * &w)?.sum_all()?, &[&w])?;
    assert_eq!(g[0].to_vec::<f32>()?, [2.0, 4.0]);
    // A detached baseline, read, then used in the loss.
    let baseline = (&x * &w)?.detach()?;
    baseline.realize()?;
    let g = grad(&((&x * &w)? - &baseline)?.sum_all()?, &[&w])?;
    assert_eq!(g[0].to_vec::<f32>()?, [1.0, 2.0]);
    // A mask of comparisons of w, read: no gradient crosses a comparison.
    let mask = w.gt(&Tensor::scalar(0.0f32))?.cast(DType::F32)?;
    mask.realize()?;
    let g = grad(&(&w * &mask)?.sum_all()?, &[&w])?;
    assert_eq!(g[0].to_vec::<f32>()?, [1.0, 0.0]);
    Ok(())
}

#[test]
fn values_without_gradients_are_errors_that_name_the_op() -> Result<()> {
    let x = t(&[1.0, 2.0], &[2]);
    let labels = Tensor::from_vec(vec![1i32, 0], [2])?;
    let as_int = x.cast(DType::I32)?;
    let loss = x.sum_all()?;
    let errors = [
        grad(&loss, &[&labels]),
        grad(&loss, &[&as_int]),
        grad(&x.square()?, &[&x]),
        grad(&x.sum_all()?.gt(&Tensor::scalar(0.0f32))?, &[&x]),
    ];
    let text: Vec<String> = errors
        .iter()
        .map(|e| e.as_ref().expect_err("no gradient").to_string())
        .collect();
    assert_eq!(
        text,
        [
            "grad: the input node that makes the value to differentiate gives i32; only float values (f32, f64, bf16, f16) have gradients",
            "grad: the cast node that makes the value to differentiate gives i32; only float values (f32, f64, bf16, f16) have gradients",
            "grad: the loss must be one value, but the mul node that makes it has shape [2]",
            "grad: the gt node that makes the loss gives bool; only float values (f32, f64, bf16, f16) have gradients",
        ]
    );
    Ok(())
}

#[test]
fn gradients_of_long_chains_do_not_overflow_the_stack() -> Result<()> {
    let x = t(&[0.5], &[1]);
    let mut y = x.clone();
    for _ in 0..20_000 {
        y = y.mul(&Tensor::scalar(1.0f32))?;
    }
    let g = grad(&y.sum_all()?, &[&x])?;
    assert_eq!(g[0].to_vec::<f32>()?, [1.0]);
    Ok(())
}
