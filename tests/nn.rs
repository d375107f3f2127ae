//! `kiln::nn`: initialization as PyTorch's, forward passes on the CPU
//! against the reference interpreter, parameters and buffers by name, the
//! modules (embedding, convolution, batch norm, sequential). Saving and
//! loading are `tests/checkpoint.rs`'s.

use kiln::nn::{self, LayerNorm, Linear, Mlp, Module};
use kiln::{DType, Device, Result, Tensor};

fn message<T>(r: Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn linear_draws_uniformly_within_pytorchs_bound() -> Result<()> {
    let layer = Linear::new(784, 256, 0)?;
    assert_eq!(layer.weight.dims(), [784, 256]);
    assert_eq!(layer.bias.dims(), [256]);
    let bound = 1.0 / 784f32.sqrt();
    for (name, t) in layer.parameters() {
        let v = t.to_vec::<f32>()?;
        let (lo, hi) = v
            .iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        assert!(
            lo >= -bound && hi < bound,
            "{name}: [{lo}, {hi}] vs {bound}"
        );
        // Uniform: the extremes come close to the bound, the mean near 0
        // and the variance near bound^2 / 3.
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        let b = f64::from(bound);
        assert!(
            lo < -0.95 * bound && hi > 0.95 * bound,
            "{name}: [{lo}, {hi}]"
        );
        assert!(mean.abs() < 4.0 * b / n.sqrt(), "{name}: mean {mean}");
        assert!((var / (b * b / 3.0) - 1.0).abs() < 0.2, "{name}: var {var}");
    }
    // Seeded: the same seed gives the same layer, another seed another.
    let again = Linear::new(784, 256, 0)?;
    assert_eq!(again.weight.to_vec::<f32>()?, layer.weight.to_vec::<f32>()?);
    let other = Linear::new(784, 256, 1)?;
    assert_ne!(other.weight.to_vec::<f32>()?, layer.weight.to_vec::<f32>()?);
    Ok(())
}

/// `f` on the CPU within `rtol` (relative to the largest magnitude) of `f`
/// on the reference interpreter.
fn check_against_interpreter(
    what: &str,
    x: &Tensor,
    rtol: f32,
    f: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<()> {
    let cpu = f(x)?.to_vec::<f32>()?;
    let reference = f(&x.to(Device::Reference)?)?;
    assert_eq!(reference.device(), Device::Reference);
    let reference = reference.to_vec::<f32>()?;
    let scale = reference.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in cpu.iter().zip(&reference).enumerate() {
        assert!(
            (a - b).abs() <= rtol * scale,
            "{what}: element {i}: cpu {a}, reference {b}"
        );
    }
    Ok(())
}

#[test]
fn forward_passes_match_the_interpreter() -> Result<()> {
    // Awkward sizes: a row, a batch of 7, features of 1, 3 and 50.
    let linear = Linear::new(50, 3, 4)?;
    for batch in [1, 7] {
        let x = Tensor::randn([batch, 50], batch as u64)?;
        check_against_interpreter("linear", &x, 1e-5, |x| linear.forward(x))?;
    }
    check_against_interpreter("linear of a vector", &Tensor::randn([50], 9)?, 1e-5, |x| {
        linear.forward(x)
    })?;
    let mlp = Mlp::new(&[784, 128, 1, 10], 2)?;
    check_against_interpreter("mlp", &Tensor::rand([7, 784], 3)?, 1e-5, |x| mlp.forward(x))?;
    let mut norm = LayerNorm::new(50)?;
    norm.weight = Tensor::randn([50], 5)?;
    norm.bias = Tensor::randn([50], 6)?;
    check_against_interpreter("layer norm", &Tensor::randn([7, 50], 7)?, 1e-5, |x| {
        norm.forward(x)
    })
}

#[test]
fn mlp_names_its_parameters_by_field_path() -> Result<()> {
    let mut mlp = Mlp::new(&[4, 3, 2], 0)?;
    let names = |pairs: Vec<(String, &Tensor)>| -> Vec<(String, Vec<usize>)> {
        pairs
            .into_iter()
            .map(|(n, t)| (n, t.dims().to_vec()))
            .collect()
    };
    let expected = [
        ("layers.0.weight", vec![4, 3]),
        ("layers.0.bias", vec![3]),
        ("layers.1.weight", vec![3, 2]),
        ("layers.1.bias", vec![2]),
    ]
    .map(|(n, d)| (n.to_string(), d));
    assert_eq!(names(mlp.parameters()), expected);
    let mutable: Vec<String> = mlp.parameters_mut().into_iter().map(|(n, _)| n).collect();
    assert_eq!(mutable, expected.map(|(n, _)| n));
    // Layers are drawn from one stream: they differ from one another.
    assert_ne!(
        mlp.layers[0].bias.to_vec::<f32>()?[..2],
        mlp.layers[1].bias.to_vec::<f32>()?[..]
    );
    Ok(())
}

#[test]
fn with_parameters_takes_values_in_order_and_checks_them() -> Result<()> {
    let mlp = Mlp::new(&[4, 3, 2], 0)?;
    let other = Mlp::new(&[4, 3, 2], 1)?;
    let values: Vec<Tensor> = other
        .parameters()
        .into_iter()
        .map(|(_, t)| t.clone())
        .collect();
    let copy = mlp.with_parameters(&values)?;
    for ((_, got), (_, want)) in copy.parameters().into_iter().zip(other.parameters()) {
        assert_eq!(got.to_vec::<f32>()?, want.to_vec::<f32>()?);
    }
    let message = |r: Result<Mlp>| r.err().map(|e| e.to_string());
    assert_eq!(
        message(mlp.with_parameters(&values[..3])),
        Some("parameter 'layers.1.bias': no value given".to_string())
    );
    let five: Vec<Tensor> = values.iter().chain(&values[..1]).cloned().collect();
    assert_eq!(
        message(mlp.with_parameters(&five)),
        Some("parameter '#4': 5 values for 4 parameters".to_string())
    );
    let mut swapped = values.clone();
    swapped.swap(0, 2);
    assert!(message(mlp.with_parameters(&swapped)).is_some_and(|m| m.contains("layers.0.weight")));
    Ok(())
}

#[test]
fn set_parameters_replaces_by_name_or_nothing() -> Result<()> {
    let mut mlp = Mlp::new(&[4, 3, 2], 0)?;
    let other = Mlp::new(&[4, 3, 2], 1)?;
    let values = || -> Vec<(String, Tensor)> {
        other
            .parameters()
            .into_iter()
            .map(|(n, t)| (n, t.clone()))
            .collect()
    };
    let before = mlp.layers[0].weight.to_vec::<f32>()?;

    // Each failure leaves every parameter as it was.
    let mut short = values();
    short.pop();
    assert_eq!(
        message(nn::set_parameters(mlp.parameters_mut(), short)),
        "parameter 'layers.1.bias': no value given"
    );
    let mut extra = values();
    extra.push(("layers.2.weight".into(), Tensor::scalar(1.0f32)));
    assert_eq!(
        message(nn::set_parameters(mlp.parameters_mut(), extra)),
        "parameter 'layers.2.weight': is not a parameter of the model"
    );
    let mut twice = values();
    twice.push(twice[0].clone());
    assert_eq!(
        message(nn::set_parameters(mlp.parameters_mut(), twice)),
        "parameter 'layers.0.weight': given twice"
    );
    let mut wrong = values();
    wrong[3].1 = Tensor::zeros([3], DType::F32)?;
    assert_eq!(
        message(nn::set_parameters(mlp.parameters_mut(), wrong)),
        "parameter 'layers.1.bias': a value of f32[3] for a parameter of f32[2]"
    );
    let mut wrong = values();
    wrong[3].1 = Tensor::zeros([2], DType::I32)?;
    assert_eq!(
        message(nn::set_parameters(mlp.parameters_mut(), wrong)),
        "parameter 'layers.1.bias': a value of i32[2] for a parameter of f32[2]"
    );
    assert_eq!(mlp.layers[0].weight.to_vec::<f32>()?, before);

    nn::set_parameters(mlp.parameters_mut(), values())?;
    for ((name, a), (_, b)) in mlp.parameters().into_iter().zip(other.parameters()) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?, "{name}");
    }
    Ok(())
}

#[test]
fn an_embedding_reads_rows_by_id_and_learns_them() -> Result<()> {
    use kiln::nn::Embedding;
    use kiln::optim::{AdamW, Optimizer};
    use kiln::{DType, TensorType};
    let table = Embedding::new(50, 6, 7)?;
    let ids = Tensor::from_vec(vec![3i64, 49, -1, 0, 3, 17], [2, 3])?;
    let rows = table.forward(&ids)?;
    assert_eq!(rows.dims(), [2, 3, 6]);
    let (got, all) = (rows.to_vec::<f32>()?, table.weight.to_vec::<f32>()?);
    for (k, id) in [3usize, 49, 49, 0, 3, 17].into_iter().enumerate() {
        assert_eq!(got[k * 6..k * 6 + 6], all[id * 6..id * 6 + 6], "id {k}");
    }
    // A compiled step pulls each id's row toward a target of its own: the
    // table's gradient reaches the rows read, and only those.
    // No weight decay: it would move every row.
    let adamw = AdamW {
        weight_decay: 0.0,
        ..AdamW::new(0.05)
    };
    let mut state = vec![table.weight.clone()];
    state.extend(adamw.state(&[&table.weight])?);
    let state_refs: Vec<&Tensor> = state.iter().collect();
    let specs = [
        TensorType::new(DType::I32, [8]),
        TensorType::new(DType::F32, [8, 6]),
    ];
    let mut step = kiln::compile_step("embedding", &state_refs, &specs, |s, b| {
        let model = Embedding {
            weight: s[0].clone(),
        };
        let loss = model.forward(&b[0])?.mse_loss(&b[1])?;
        let grads = kiln::grad(&loss, &[&s[0]])?;
        let (p, opt) = adamw.update(&s[..1], &grads, &s[1..])?;
        Ok((vec![loss], p.into_iter().chain(opt).collect()))
    })?;
    let batch = Tensor::from_vec(vec![1i32, 5, 9, 1, 30, 44, 5, 12], [8])?;
    let targets = Tensor::randn([8, 6], 8)?;
    // Rows 1 and 5 appear twice, with different targets.
    let mut losses = Vec::new();
    for _ in 0..200 {
        losses.push(
            step.call(&[&batch, &targets])?
                .remove(0)
                .to_scalar::<f32>()?,
        );
    }
    assert!(
        losses[199] < 0.5 * losses[0],
        "{} -> {}",
        losses[0],
        losses[199]
    );
    let learned = step.state()?[0].to_vec::<f32>()?;
    for untouched in [0usize, 2, 49] {
        assert_eq!(
            learned[untouched * 6..untouched * 6 + 6],
            all[untouched * 6..untouched * 6 + 6],
            "row {untouched}"
        );
    }
    Ok(())
}

#[test]
fn a_conv2d_module_is_tensor_conv2d_with_its_fields_and_pytorch_init() -> Result<()> {
    let mut conv = nn::Conv2d::new(3, 5, [3, 2], 7)?;
    conv.stride = [2, 1];
    conv.padding = [(1, 0), (0, 1)];
    // PyTorch's bound: 1/sqrt(fan_in), fan_in = 3 * 3 * 2.
    let bound = 1.0 / 18f32.sqrt();
    for (name, t) in conv.parameters() {
        let values = t.to_vec::<f32>()?;
        assert!(values.iter().all(|v| v.abs() < bound), "{name}");
        assert!(
            values.iter().any(|v| v.abs() > bound / 2.0),
            "{name}: spread"
        );
    }
    assert_eq!(conv.weight.dims(), [5, 3, 3, 2]);
    let x = Tensor::randn([2, 3, 7, 6], 8)?;
    let want = x.conv2d(
        &conv.weight,
        Some(&conv.bias),
        [2, 1],
        conv.padding,
        [1, 1],
        1,
    )?;
    assert_eq!(conv.forward(&x)?.to_vec::<f32>()?, want.to_vec::<f32>()?);
    Ok(())
}

#[test]
fn sequential_names_chains_and_replaces_its_layers_parameters() -> Result<()> {
    let mut conv = nn::Conv2d::new(1, 4, [3, 3], 1)?;
    conv.padding = [(1, 1); 2];
    let net = nn::Sequential::new(vec![
        Box::new(conv.clone()),
        Box::new(nn::Relu),
        Box::new(nn::MaxPool2d(kiln::Pool2d::new([2, 2]))),
        Box::new(nn::Flatten),
        Box::new(Linear::new(4 * 3 * 3, 2, 2)?),
    ]);
    let named: Vec<String> = net.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        named,
        [
            "layers.0.weight",
            "layers.0.bias",
            "layers.4.weight",
            "layers.4.bias"
        ]
    );
    let x = Tensor::randn([5, 1, 6, 6], 3)?;
    let pooled = conv
        .forward(&x)?
        .relu()?
        .max_pool2d(&kiln::Pool2d::new([2, 2]))?;
    let linear = Linear {
        weight: net.parameters()[2].1.clone(),
        bias: net.parameters()[3].1.clone(),
    };
    let want = linear.forward(&pooled.reshape([5, 36])?)?;
    assert_eq!(net.forward(&x)?.to_vec::<f32>()?, want.to_vec::<f32>()?);
    // A copy with other values; the original keeps its own.
    let values: Vec<Tensor> = net
        .parameters()
        .iter()
        .map(|(_, t)| t.mul(&Tensor::scalar(2.0f32)))
        .collect::<Result<_>>()?;
    let doubled = net.with_parameters(&values)?;
    for ((name, a), (_, b)) in doubled.parameters().into_iter().zip(net.parameters()) {
        let twice: Vec<f32> = b.to_vec::<f32>()?.iter().map(|v| v * 2.0).collect();
        assert_eq!(a.to_vec::<f32>()?, twice, "{name}");
    }
    let short = message(net.with_parameters(&values[..3]));
    assert!(short.contains("layers.4.bias"), "{short}");
    Ok(())
}

#[test]
fn batch_norm_trains_by_the_batch_and_infers_by_its_running_statistics() -> Result<()> {
    let mut bn = nn::BatchNorm2d::new(3)?;
    bn.weight = Tensor::from_vec(vec![1.5f32, -0.5, 2.0], [3])?;
    bn.bias = Tensor::from_vec(vec![0.25f32, 0.0, -1.0], [3])?;
    let x = Tensor::randn([4, 3, 5, 6], 9)?;
    let xs = x.to_vec::<f32>()?;
    let (w, b) = (bn.weight.to_vec::<f32>()?, bn.bias.to_vec::<f32>()?);
    let at = |n: usize, c: usize, k: usize| xs[(n * 3 + c) * 30 + k];
    // Per channel, in f64: the batch's mean and biased variance over 120 values.
    let stats: Vec<(f64, f64)> = (0..3)
        .map(|c| {
            let v: Vec<f64> = (0..4)
                .flat_map(|n| (0..30).map(move |k| (n, k)))
                .map(|(n, k)| f64::from(at(n, c, k)))
                .collect();
            let mean = v.iter().sum::<f64>() / 120.0;
            let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 120.0;
            (mean, var)
        })
        .collect();
    let mut buffers = Vec::new();
    let y = bn.forward_train(&x, &mut buffers)?.to_vec::<f32>()?;
    for n in 0..4 {
        for c in 0..3 {
            let (mean, var) = stats[c];
            for k in 0..30 {
                let want = (f64::from(at(n, c, k)) - mean) / (var + 1e-5).sqrt() * f64::from(w[c])
                    + f64::from(b[c]);
                let got = f64::from(y[(n * 3 + c) * 30 + k]);
                assert!(
                    (got - want).abs() < 1e-5 * want.abs().max(1.0),
                    "{n} {c} {k}: {got} {want}"
                );
            }
        }
    }
    // The running statistics move a tenth of the way, the variance unbiased.
    let (rm, rv) = (buffers[0].to_vec::<f32>()?, buffers[1].to_vec::<f32>()?);
    for c in 0..3 {
        let (mean, var) = stats[c];
        assert!((f64::from(rm[c]) - 0.1 * mean).abs() < 1e-6, "mean {c}");
        assert!(
            (f64::from(rv[c]) - (0.9 + 0.1 * var * 120.0 / 119.0)).abs() < 1e-6,
            "var {c}"
        );
    }
    // Inference reads the running statistics.
    let trained = bn.with_buffers(&buffers)?;
    let y = trained.forward(&x)?.to_vec::<f32>()?;
    for c in 0..3 {
        let want = (f64::from(at(0, c, 0)) - f64::from(rm[c])) / (f64::from(rv[c]) + 1e-5).sqrt()
            * f64::from(w[c])
            + f64::from(b[c]);
        let got = f64::from(y[c * 30]);
        assert!(
            (got - want).abs() < 1e-5 * want.abs().max(1.0),
            "eval {c}: {got} {want}"
        );
    }
    // A wrong channel count is an error naming the layer and the shapes.
    let e = message(bn.forward(&Tensor::randn([2, 4, 3, 3], 1)?));
    assert!(
        e.contains("BatchNorm2d") && e.contains("[2, 4, 3, 3]"),
        "{e}"
    );
    Ok(())
}

#[test]
fn sequential_buffers_are_named_and_replaced_by_layer() -> Result<()> {
    let net = nn::Sequential::new(vec![
        Box::new(nn::Conv2d::new(1, 2, [3, 3], 1)?),
        Box::new(nn::BatchNorm2d::new(2)?),
        Box::new(nn::Relu),
    ]);
    let named: Vec<String> = net.buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(named, ["layers.1.running_mean", "layers.1.running_var"]);
    let x = Tensor::randn([3, 1, 6, 6], 2)?;
    let mut buffers = Vec::new();
    net.forward_train(&x, &mut buffers)?;
    assert_eq!(buffers.len(), 2);
    let trained = net.with_buffers(&buffers)?;
    for ((name, got), want) in trained.buffers().into_iter().zip(&buffers) {
        assert_eq!(got.to_vec::<f32>()?, want.to_vec::<f32>()?, "{name}");
    }
    let e = message(net.with_buffers(&buffers[..1]));
    assert!(e.contains("layers.1.running_var"), "{e}");
    Ok(())
}

#[test]
fn to_dtype_casts_float_parameters_and_buffers_and_computes_in_that_type() -> Result<()> {
    let net = nn::Sequential::new(vec![
        Box::new(nn::Conv2d::new(1, 2, [3, 3], 1)?),
        Box::new(nn::BatchNorm2d::new(2)?),
        Box::new(nn::Flatten),
        Box::new(nn::Dropout::new(0.25, 2)?),
        Box::new(nn::Linear::new(32, 3, 3)?),
    ]);
    let wide = net.to_dtype(DType::F64)?;
    for (name, p) in wide.parameters().into_iter().chain(wide.buffers()) {
        let want = if name.ends_with("key") {
            DType::I32
        } else {
            DType::F64
        };
        assert_eq!(p.dtype(), want, "{name}");
        // Cast once, now, not again in every forward pass.
        assert!(want == DType::I32 || p.is_realized(), "{name}");
    }
    // The same parameters widened: the f64 pass is the f32 one, closer.
    let x = Tensor::randn([2, 1, 6, 6], 4)?;
    let (mut narrow_buffers, mut wide_buffers) = (Vec::new(), Vec::new());
    let y = net
        .forward_train(&x, &mut narrow_buffers)?
        .to_vec::<f32>()?;
    let y64 = wide.forward_train(&x.cast(DType::F64)?, &mut wide_buffers)?;
    assert_eq!(y64.dtype(), DType::F64);
    for (a, b) in y.iter().zip(y64.to_vec::<f64>()?) {
        assert!(
            (f64::from(*a) - b).abs() < 1e-5 * b.abs().max(1.0),
            "{a} {b}"
        );
    }
    let dtypes: Vec<DType> = wide_buffers.iter().map(Tensor::dtype).collect();
    assert_eq!(dtypes, [DType::F64, DType::F64, DType::I32]);
    let e = message(net.to_dtype(DType::I32));
    assert!(e.contains("to_dtype") && e.contains("i32"), "{e}");
    Ok(())
}
