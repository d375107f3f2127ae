//! The lazy Tensor API on the reference device: constructors, broadcasting,
//! reductions, matmul conventions, operators and composites, each against
//! values computed by hand or by a direct f64 formula.

use kiln::{DType, Device, Result, Tensor};

fn vec(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().expect("realizes")
}

fn t(values: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(values, shape).expect("values fill the shape")
}

/// `|a-b| <= max(rtol*max(|a|,|b|), atol)`, printing the index, both values
/// and the largest error on failure.
fn assert_close(actual: &[f32], expected: &[f64], rtol: f64, atol: f64) {
    assert_eq!(actual.len(), expected.len(), "length");
    let mut worst = (0, 0.0f64);
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let err = (a as f64 - e).abs();
        if err > worst.1 {
            worst = (i, err);
        }
        let ok = err <= (rtol * (a as f64).abs().max(e.abs())).max(atol);
        assert!(
            ok,
            "element {i}: got {a}, expected {e}; max error {} at {}",
            worst.1, worst.0
        );
    }
}

#[test]
fn constructors() -> Result<()> {
    assert_eq!(vec(&Tensor::zeros([2, 2], DType::F32)?), [0.0; 4]);
    assert_eq!(Tensor::ones([3], DType::I32)?.to_vec::<i32>()?, [1, 1, 1]);
    assert_eq!(Tensor::full([2], 7u8)?.to_vec::<u8>()?, [7, 7]);
    assert_eq!(Tensor::full([2], true)?.to_vec::<bool>()?, [true, true]);
    assert_eq!(Tensor::arange(-2, 3).to_vec::<i32>()?, [-2, -1, 0, 1, 2]);
    assert_eq!(Tensor::arange(3, 3).dims(), [0]);
    assert_eq!(Tensor::scalar(2.5f32).to_scalar::<f32>()?, 2.5);
    assert_eq!(
        Tensor::from_vec(vec![1u8, 2, 3, 4], [2, 2])?.to_vec::<u8>()?,
        [1, 2, 3, 4]
    );
    assert_eq!(Tensor::zeros([2, 3], DType::F32)?.device(), Device::Cpu);
    Ok(())
}

#[test]
fn random_tensors_are_seeded_and_distributed_as_promised() -> Result<()> {
    let u = vec(&Tensor::rand([10_000], 7)?);
    assert_eq!(
        u,
        vec(&Tensor::rand([10_000], 7)?),
        "same seed, same values"
    );
    assert_ne!(
        u,
        vec(&Tensor::rand([10_000], 8)?),
        "another seed, other values"
    );
    assert!(u.iter().all(|&v| (0.0..1.0).contains(&v)));
    let mean = u.iter().map(|&v| v as f64).sum::<f64>() / 1e4;
    assert!((mean - 0.5).abs() < 0.01, "uniform mean {mean}");
    let n = vec(&Tensor::randn([10_000], 7)?);
    let mean = n.iter().map(|&v| v as f64).sum::<f64>() / 1e4;
    let var = n.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 1e4;
    // Standard errors are 0.01 for the mean and 0.014 for the variance: 4 sigma each.
    assert!(mean.abs() < 0.04, "normal mean {mean}");
    assert!((var - 1.0).abs() < 0.06, "normal variance {var}");
    Ok(())
}

#[test]
fn broadcasting_follows_numpy() -> Result<()> {
    let col = t(&[1.0, 2.0], &[2, 1]);
    let row = t(&[10.0, 20.0, 30.0], &[3]);
    let sum = (&col + &row)?;
    assert_eq!(sum.dims(), [2, 3]);
    assert_eq!(vec(&sum), [11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
    let batched = (&t(&[1.0, 2.0, 3.0, 4.0], &[2, 1, 2]) * &t(&[1.0, 10.0, 100.0], &[3, 1]))?;
    assert_eq!(batched.dims(), [2, 3, 2]);
    assert_eq!(
        vec(&batched),
        [
            1.0, 2.0, 10.0, 20.0, 100.0, 200.0, 3.0, 4.0, 30.0, 40.0, 300.0, 400.0
        ]
    );
    let cond = t(&[1.0, -1.0], &[2, 1]).gt(&Tensor::scalar(0.0f32))?;
    let picked = cond.where_cond(&row, &Tensor::scalar(0.0f32))?;
    assert_eq!(vec(&picked), [10.0, 20.0, 30.0, 0.0, 0.0, 0.0]);
    Ok(())
}

#[test]
fn operators_with_tensors_and_scalars() -> Result<()> {
    let a = t(&[1.0, -2.0, 3.0], &[3]);
    let b = t(&[4.0, 5.0, -6.0], &[3]);
    assert_eq!(vec(&(&a + &b)?), [5.0, 3.0, -3.0]);
    assert_eq!(vec(&(&a - &b)?), [-3.0, -7.0, 9.0]);
    assert_eq!(vec(&(&a * &b)?), [4.0, -10.0, -18.0]);
    assert_eq!(vec(&(&a / &b)?), [0.25, -0.4, -0.5]);
    assert_eq!(vec(&(-&a)?), [-1.0, 2.0, -3.0]);
    assert_eq!(vec(&(&a * 2.0)?), [2.0, -4.0, 6.0]);
    assert_eq!(vec(&(1.0 - &a)?), [0.0, 3.0, -2.0]);
    assert_eq!(vec(&(a.clone() + b.clone())?), [5.0, 3.0, -3.0]);
    assert_eq!((Tensor::arange(0, 3) * 3)?.to_vec::<i32>()?, [0, 3, 6]);
    // The documented style: `(&a + &b)?.relu()`.
    assert_eq!(vec(&(&a + &b)?.relu()?), [5.0, 3.0, 0.0]);
    assert_eq!(vec(&a.maximum(&b)?), [4.0, 5.0, 3.0]);
    assert_eq!(vec(&a.minimum(&b)?), [1.0, -2.0, -6.0]);
    assert_eq!(
        vec(&a.abs()?.pow(&Tensor::scalar(2.0f32))?),
        [1.0, 4.0, 9.0]
    );
    assert_eq!(a.ge(&b)?.to_vec::<bool>()?, [false, false, true]);
    assert_eq!(a.ne(&a)?.to_vec::<bool>()?, [false, false, false]);
    Ok(())
}

#[test]
fn reductions_with_keepdim_and_negative_axes() -> Result<()> {
    let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let rows = x.sum(&[-1], false)?;
    assert_eq!((rows.dims(), vec(&rows)), (&[2][..], vec![6.0, 15.0]));
    let cols = x.sum(&[0], true)?;
    assert_eq!(
        (cols.dims(), vec(&cols)),
        (&[1, 3][..], vec![5.0, 7.0, 9.0])
    );
    assert_eq!(vec(&x.max(&[1], false)?), [3.0, 6.0]);
    assert_eq!(vec(&x.mean(&[0, 1], false)?), [3.5]);
    assert_eq!(x.sum_all()?.dims(), [0usize; 0]);
    assert_eq!(x.sum_all()?.to_scalar::<f32>()?, 21.0);
    assert_eq!(x.mean_all()?.to_scalar::<f32>()?, 3.5);
    assert!(
        Tensor::zeros([0, 2], DType::F32)?
            .mean_all()?
            .to_scalar::<f32>()?
            .is_nan()
    );
    assert_eq!(Tensor::arange(1, 5).sum_all()?.to_scalar::<i32>()?, 10);
    Ok(())
}

#[test]
fn views() -> Result<()> {
    let x = t(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]);
    assert_eq!(vec(&x.t()?), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(vec(&x.slice(1, 0, 3, 2)?), [0.0, 2.0, 3.0, 5.0]);
    assert_eq!(vec(&x.slice(-2, 1, 2, 1)?), [3.0, 4.0, 5.0]);
    assert_eq!(
        vec(&x.pad(&[(0, 1), (1, 0)], 9.0f32)?),
        [9.0, 0.0, 1.0, 2.0, 9.0, 3.0, 4.0, 5.0, 9.0, 9.0, 9.0, 9.0]
    );
    assert_eq!(x.unsqueeze(-1)?.dims(), [2, 3, 1]);
    assert_eq!(
        vec(&x.reshape([3, 2])?.t()?),
        [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]
    );
    assert_eq!(vec(&x.cast(DType::I32)?.cast(DType::F32)?), vec(&x));
    Ok(())
}

#[test]
fn matmul_conventions() -> Result<()> {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = t(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
    assert_eq!(vec(&a.matmul(&b)?), [4.0, 5.0, 10.0, 11.0]);
    // Vector on either side drops its axis.
    let v = t(&[1.0, 1.0, 1.0], &[3]);
    let mv = a.matmul(&v)?;
    assert_eq!((mv.dims(), vec(&mv)), (&[2][..], vec![6.0, 15.0]));
    let vm = v.matmul(&b)?;
    assert_eq!((vm.dims(), vec(&vm)), (&[2][..], vec![2.0, 2.0]));
    assert_eq!(v.matmul(&v)?.to_scalar::<f32>()?, 3.0);
    // A [3,2] weight broadcasts over a batch of two [2,3] matrices.
    let batch = Tensor::from_vec([a.to_vec::<f32>()?, vec![0.0; 6]].concat(), [2, 2, 3])?;
    let out = batch.matmul(&b)?;
    assert_eq!(
        (out.dims(), vec(&out)),
        (
            &[2, 2, 2][..],
            vec![4.0, 5.0, 10.0, 11.0, 0.0, 0.0, 0.0, 0.0]
        )
    );
    Ok(())
}

#[test]
fn softmax_and_log_softmax() -> Result<()> {
    let values = [1.0f32, 2.0, 3.0, -1.0, 0.0, 1000.0];
    let x = t(&values, &[2, 3]);
    let mut expected = Vec::new();
    for row in values.chunks(3) {
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        expected.extend(row.iter().map(|&v| (v as f64 - m).exp() / s));
    }
    assert_close(&vec(&x.softmax(-1)?), &expected, 1e-6, 1e-7);
    let logs: Vec<f64> = expected.iter().map(|p| p.ln()).collect();
    assert_close(&vec(&x.log_softmax(1)?), &logs, 1e-6, 1e-6);
    // Softmax over the first axis of the same data: columns sum to 1.
    let cols = x.softmax(0)?.sum(&[0], false)?;
    assert_close(&vec(&cols), &[1.0; 3], 1e-6, 0.0);
    Ok(())
}

#[test]
fn layer_norm_gelu_and_losses() -> Result<()> {
    let x = t(&[1.0, 2.0, 3.0, 4.0, 2.0, 2.0, 2.0, 2.0], &[2, 4]);
    let w = t(&[1.0, 2.0, 1.0, 1.0], &[4]);
    let b = t(&[0.0, 0.0, 0.0, 1.0], &[4]);
    // Row 0: mean 2.5, variance 1.25; row 1 is constant, so it normalizes to 0.
    let s = (1.25f64 + 1e-5).sqrt();
    let expected = [
        -1.5 / s,
        2.0 * -0.5 / s,
        0.5 / s,
        1.5 / s + 1.0,
        0.0,
        0.0,
        0.0,
        1.0,
    ];
    assert_close(&vec(&x.layer_norm(&w, &b, 1e-5)?), &expected, 1e-6, 1e-6);

    let g = t(&[-3.0, -1.0, 0.0, 0.5, 2.0], &[5]);
    let expected: Vec<f64> = [-3.0f64, -1.0, 0.0, 0.5, 2.0]
        .iter()
        .map(|&v| {
            0.5 * v
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
        })
        .collect();
    assert_close(&vec(&g.gelu()?), &expected, 1e-6, 1e-7);

    let mse = t(&[1.0, 2.0, 3.0], &[3]).mse_loss(&t(&[1.0, 0.0, 6.0], &[3]))?;
    assert_eq!(mse.to_scalar::<f32>()?, 13.0 / 3.0);

    let logits = t(&[2.0, 1.0, 0.1, 0.5, 2.5, 0.3], &[2, 3]);
    let targets = Tensor::from_vec(vec![0i32, 2], [2])?;
    let nll = |row: &[f64], k: usize| {
        let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
        lse - row[k]
    };
    let expected = (nll(&[2.0, 1.0, 0.1], 0) + nll(&[0.5, 2.5, 0.3], 2)) / 2.0;
    assert_close(
        &[logits.cross_entropy(&targets)?.to_scalar::<f32>()?],
        &[expected],
        1e-6,
        0.0,
    );
    // A class index out of range poisons the loss instead of skipping the row.
    let bad = Tensor::from_vec(vec![0i32, 3], [2])?;
    assert!(logits.cross_entropy(&bad)?.to_scalar::<f32>()?.is_nan());
    let negative = Tensor::from_vec(vec![-1i32, 0], [2])?;
    assert!(
        logits
            .cross_entropy(&negative)?
            .to_scalar::<f32>()?
            .is_nan()
    );
    // A mean over no rows, or over rows with no class to pick, is NaN too.
    let no_rows = Tensor::zeros([0, 3], kiln::DType::F32)?;
    let no_targets = Tensor::from_vec(Vec::<i32>::new(), [0])?;
    assert!(
        no_rows
            .cross_entropy(&no_targets)?
            .to_scalar::<f32>()?
            .is_nan()
    );
    let no_classes = Tensor::zeros([2, 0], kiln::DType::F32)?;
    assert!(
        no_classes
            .cross_entropy(&negative)?
            .to_scalar::<f32>()?
            .is_nan()
    );
    Ok(())
}

#[test]
fn cross_entropy_masks_classes_with_minus_infinity() -> Result<()> {
    // Classes masked out with -inf (as action masks are) drop out of the
    // softmax: the loss is the one over the others, and so are the
    // gradients, zero at the masked logits.
    let inf = f32::NEG_INFINITY;
    let masked = t(&[2.0, inf, 0.1, inf, 2.5, 0.3, 1.0, 1.0, inf], &[3, 3]);
    let targets = Tensor::from_vec(vec![0i32, 2, 1], [3])?;
    let loss = masked.cross_entropy(&targets)?;
    let nll = |row: &[f64], k: usize| {
        let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
        lse - row[k]
    };
    let expected = (nll(&[2.0, 0.1], 0) + nll(&[2.5, 0.3], 1) + nll(&[1.0, 1.0], 1)) / 3.0;
    assert_close(&[loss.to_scalar::<f32>()?], &[expected], 1e-6, 0.0);
    let loss = masked.cross_entropy(&targets)?;
    let grad = kiln::grad(&loss, &[&masked])?.remove(0).to_vec::<f32>()?;
    assert!(grad.iter().all(|g| g.is_finite()), "{grad:?}");
    for masked_at in [1, 3, 8] {
        assert_eq!(grad[masked_at], 0.0, "{grad:?}");
    }
    // The target itself masked: no probability left for it, as PyTorch's.
    let on_target = masked.cross_entropy(&Tensor::from_vec(vec![1i32, 2, 1], [3])?)?;
    assert_eq!(on_target.to_scalar::<f32>()?, f32::INFINITY);
    Ok(())
}

#[test]
fn realize_shares_work_and_keeps_results() -> Result<()> {
    let a = t(&[1.0, 2.0], &[2]);
    let shared = a.exp()?;
    let (p, q) = ((&shared + 1.0)?, (&shared * 2.0)?);
    kiln::realize(&[&p, &q])?;
    assert!(p.is_realized() && q.is_realized());
    // Both outputs came from one graph in which `exp` appears once.
    let graph = kiln::capture("pq", &[&(&shared + 1.0)?, &(&shared * 2.0)?]);
    assert_eq!(
        graph.nodes.iter().filter(|n| n.op.name() == "exp").count(),
        1
    );
    let e = std::f32::consts::E;
    assert_eq!(vec(&p), [1.0 + e, 1.0 + (2.0f64.exp() as f32)]);
    assert_eq!(vec(&q), [2.0 * e, 2.0 * (2.0f64.exp() as f32)]);
    // A realized tensor is an input of later graphs, not recomputed.
    let later = kiln::capture("later", &[&(&p + 1.0)?]);
    assert_eq!(later.inputs.len(), 1);
    assert!(later.nodes.iter().all(|n| n.op.name() != "exp"));
    Ok(())
}

#[test]
fn long_chains_realize_and_drop_without_recursion() -> Result<()> {
    let mut x = Tensor::zeros([2], DType::F32)?;
    for _ in 0..100_000 {
        x = (&x + 1.0)?;
    }
    assert_eq!(vec(&x), [100_000.0, 100_000.0]);
    let mut y = Tensor::zeros([1], DType::F32)?;
    for _ in 0..100_000 {
        y = (&y + 1.0)?;
    }
    drop(y);
    Ok(())
}

#[test]
fn a_graph_realized_again_computes_each_new_value() -> Result<()> {
    // The second realize of each structure runs the executable the first
    // compiled: new data, another constant or another device still count.
    for (seed, c, device) in [
        (0, 1.0f32, Device::Cpu),
        (1, 1.0, Device::Cpu),
        (1, 2.0, Device::Cpu),
        (1, 2.0, Device::Reference),
        (0, 1.0, Device::Cpu),
    ] {
        let x = Tensor::randn([33, 7], seed)?.to(device)?;
        let got = (&x + c)?.relu()?.sum(&[1], false)?.to_vec::<f32>()?;
        let data = x.to_vec::<f32>()?;
        let want: Vec<f32> = (data.chunks(7))
            .map(|row| row.iter().map(|v| (v + c).max(0.0)).sum())
            .collect();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "seed {seed}, {c}, {device:?}: [{i}] {g} against {w}"
            );
        }
    }
    Ok(())
}
