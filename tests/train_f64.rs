//! f64 training: gradients through products and convolutions against the
//! definition, and SGD and AdamW steps of f64 parameters computed in f64.

mod f64s;

use f64s::{close, naive_matmul, normals};
use kiln::{DType, Data, Result, Tensor};
use kiln_support::data;

#[test]
fn f64_gradients_flow_through_matmuls_and_convolutions() -> Result<()> {
    // loss = sum((a @ b) * c): da = c @ bᵀ, db = aᵀ @ c, by the definition.
    let (m, k, n) = (5, 9, 4);
    let (a, b, c) = (normals(m * k, 7), normals(k * n, 8), normals(m * n, 9));
    let ta = Tensor::from_vec(a.clone(), [m, k])?;
    let tb = Tensor::from_vec(b.clone(), [k, n])?;
    let tc = Tensor::from_vec(c.clone(), [m, n])?;
    let loss = ta.matmul(&tb)?.mul(&tc)?.sum_all()?;
    let grads = kiln::grad(&loss, &[&ta, &tb])?;
    let transpose = |v: &[f64], rows: usize, cols: usize| -> Vec<f64> {
        (0..cols * rows)
            .map(|e| v[(e % rows) * cols + e / rows])
            .collect()
    };
    let da = naive_matmul(&c, &transpose(&b, k, n), m, n, k);
    let db = naive_matmul(&transpose(&a, m, k), &c, k, m, n);
    close("da", &grads[0].to_vec::<f64>()?, &da, 1e-14);
    close("db", &grads[1].to_vec::<f64>()?, &db, 1e-14);
    // A convolution in f64 (the im2col product, and a depthwise chain)
    // against the same convolution in f32 on the same values, to f32's
    // precision, and its gradient likewise.
    let x32 = Tensor::randn([2, 4, 9, 7], 10)?;
    for (weight, groups) in [([6, 4, 3, 3], 1), ([4, 1, 3, 3], 4)] {
        let w32 = Tensor::randn(weight, 11)?;
        let b32 = Tensor::randn([weight[0]], 12)?;
        let conv = |x: &Tensor, w: &Tensor, b: &Tensor| {
            x.conv2d(w, Some(b), [1, 2], [(1, 1), (0, 2)], [1, 1], groups)?
                .tanh()?
                .sum_all()
        };
        let (x64, w64, b64) = (
            x32.cast(DType::F64)?,
            w32.cast(DType::F64)?,
            b32.cast(DType::F64)?,
        );
        let (l32, l64) = (conv(&x32, &w32, &b32)?, conv(&x64, &w64, &b64)?);
        assert_eq!(l64.dtype(), DType::F64);
        // The gradients before the losses are read: a read value has none.
        let g32 = kiln::grad(&l32, &[&w32])?.remove(0).to_vec::<f32>()?;
        let g64 = kiln::grad(&l64, &[&w64])?.remove(0).to_vec::<f64>()?;
        let (v32, v64) = (l32.to_scalar::<f32>()?, l64.to_scalar::<f64>()?);
        assert!(
            (f64::from(v32) - v64).abs() <= 1e-5 * v64.abs().max(1.0),
            "{v32} against {v64}"
        );
        let g32: Vec<f64> = g32.into_iter().map(f64::from).collect();
        close(
            &format!("conv weight gradient, {groups} groups"),
            &g32,
            &g64,
            1e-5,
        );
    }
    let wrong = Tensor::ones([2, 4, 3, 3], DType::F32)?;
    let err = x32
        .cast(DType::F64)?
        .conv2d(&wrong, None, [1, 1], [(0, 0); 2], [1, 1], 1);
    let err = err.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("conv2d") && err.contains("f32"), "{err}");
    Ok(())
}

#[test]
fn optimizers_step_f64_parameters_in_f64() -> Result<()> {
    use kiln::optim::{Accumulate, AdamW, Optimizer, Sgd};
    let (p, g) = (normals(11, 13), normals(11, 14));
    let param = Tensor::from_vec(p.clone(), [11])?;
    let grad = Tensor::from_vec(g.clone(), [11])?;
    // SGD with momentum, Nesterov and weight decay, two steps.
    let sgd = Sgd {
        momentum: 0.9,
        nesterov: true,
        weight_decay: 0.01,
        ..Sgd::new(0.1)
    };
    let (lr, mu, wd) = (f64::from(0.1f32), f64::from(0.9f32), f64::from(0.01f32));
    let mut state = sgd.state(&[&param])?;
    let mut current = param.clone();
    let (mut want, mut buf) = (p.clone(), vec![0.0; 11]);
    for _ in 0..2 {
        let (new, next) = sgd.update(&[current], std::slice::from_ref(&grad), &state)?;
        (current, state) = (new[0].clone(), next);
        for i in 0..11 {
            let d = g[i] + wd * want[i];
            buf[i] = mu * buf[i] + d;
            want[i] -= lr * (d + mu * buf[i]);
        }
    }
    assert_eq!(current.dtype(), DType::F64);
    close("sgd", &current.to_vec::<f64>()?, &want, 1e-15);
    // AdamW, two steps.
    let adam = AdamW::new(0.01);
    let [lr, b1, b2, eps, wd] = [0.01f32, 0.9, 0.999, 1e-8, 0.01].map(f64::from);
    let mut state = adam.state(&[&param])?;
    let mut current = param.clone();
    let (mut want, mut m, mut v) = (p.clone(), vec![0.0; 11], vec![0.0; 11]);
    for t in 1..=2 {
        let (new, next) = adam.update(&[current], std::slice::from_ref(&grad), &state)?;
        (current, state) = (new[0].clone(), next);
        for i in 0..11 {
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let (mh, vh) = (m[i] / (1.0 - b1.powi(t)), v[i] / (1.0 - b2.powi(t)));
            want[i] = want[i] * (1.0 - lr * wd) - lr * mh / (vh.sqrt() + eps);
        }
    }
    close("adamw", &current.to_vec::<f64>()?, &want, 1e-13);
    // f32 and f64 parameters side by side: each updated as it is alone.
    let param32 = Tensor::from_vec(p.iter().map(|&x| x as f32).collect(), [11])?;
    let grad32 = Tensor::from_vec(g.iter().map(|&x| x as f32).collect(), [11])?;
    let alone = |param: &Tensor, grad: &Tensor| -> Result<Data> {
        let state = adam.state(&[param])?;
        let (new, _) = adam.update(
            std::slice::from_ref(param),
            std::slice::from_ref(grad),
            &state,
        )?;
        data(&new[0])
    };
    let state = adam.state(&[&param32, &param])?;
    let (mixed, _) = adam.update(
        &[param32.clone(), param.clone()],
        &[grad32.clone(), grad.clone()],
        &state,
    )?;
    assert_eq!(
        data(&mixed[0])?,
        alone(&param32, &grad32)?,
        "the f32 parameter"
    );
    assert_eq!(data(&mixed[1])?, alone(&param, &grad)?, "the f64 parameter");
    // Accumulated over two updates: one SGD step on the f64 mean.
    let every = Accumulate {
        optimizer: Sgd::new(0.1),
        every: 2,
    };
    let g2 = normals(11, 15);
    let mut state = every.state(&[&param])?;
    let mut current = param.clone();
    for grad in [&g, &g2] {
        let grad = Tensor::from_vec(grad.clone(), [11])?;
        let (new, next) = every.update(&[current], &[grad], &state)?;
        (current, state) = (new[0].clone(), next);
    }
    let want: Vec<f64> = (0..11)
        .map(|i| p[i] - f64::from(0.1f32) * ((g[i] + g2[i]) * 0.5))
        .collect();
    close("accumulated", &current.to_vec::<f64>()?, &want, 1e-15);
    Ok(())
}

#[test]
fn clipping_takes_the_norm_in_f64_and_loss_scaling_refuses_f64() -> Result<()> {
    use kiln::optim::{GradScaler, Optimizer, Sgd, clip_grad_norm};
    let (a, b) = (normals(7, 16), normals(5, 17));
    let norm = a.iter().chain(&b).map(|x| x * x).sum::<f64>().sqrt();
    let scale = f64::from(0.5f32) / (norm + f64::from(1e-6f32));
    // f64 gradients: the norm and the scaling in f64.
    let grads = [
        Tensor::from_vec(a.clone(), [7])?,
        Tensor::from_vec(b.clone(), [5])?,
    ];
    let (clipped, n) = clip_grad_norm(&grads, 0.5)?;
    close("the norm", &[n.to_scalar::<f64>()?], &[norm], 1e-15);
    for (k, v) in [&a, &b].into_iter().enumerate() {
        let want: Vec<f64> = v.iter().map(|x| x * scale).collect();
        close(
            &format!("gradient {k}"),
            &clipped[k].to_vec::<f64>()?,
            &want,
            1e-15,
        );
    }
    // With an f32 gradient beside: its squares summed in f32, the norm in
    // f64, each gradient scaled in its own type.
    let b32: Vec<f32> = b.iter().map(|&x| x as f32).collect();
    let grads = [
        Tensor::from_vec(a.clone(), [7])?,
        Tensor::from_vec(b32, [5])?,
    ];
    let (clipped, n) = clip_grad_norm(&grads, 0.5)?;
    assert_eq!(
        (n.dtype(), clipped[0].dtype(), clipped[1].dtype()),
        (DType::F64, DType::F64, DType::F32)
    );
    close("the mixed norm", &[n.to_scalar::<f64>()?], &[norm], 1e-6);
    // Loss scaling keeps f32 master weights: f64 ones are refused by name.
    let scaler = GradScaler::new(Sgd::new(0.1));
    let param = Tensor::from_vec(a, [7])?;
    let state = scaler.state(&[&param])?;
    let param = std::slice::from_ref(&param);
    let err = scaler.update(param, param, &state).err();
    let err = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        err.starts_with("GradScaler") && err.contains("f64"),
        "{err}"
    );
    Ok(())
}

#[test]
fn average_pools_and_transposed_convolutions_run_in_f64() -> Result<()> {
    use kiln::Pool2d;
    // Each against the same op in f32 on the same values, to f32's
    // precision: its structure in f64 is the f32 one's.
    let x32 = Tensor::randn([2, 3, 7, 6], 21)?;
    let x64 = x32.cast(DType::F64)?;
    let agree = |name: &str, got: &Tensor, want: &Tensor| -> Result<()> {
        assert_eq!(got.dtype(), DType::F64, "{name}");
        let want: Vec<f64> = want.to_vec::<f32>()?.into_iter().map(f64::from).collect();
        close(name, &got.to_vec::<f64>()?, &want, 1e-6);
        Ok(())
    };
    // One count for every window (no padding), and counts by position.
    let windows = [
        (Pool2d::new([2, 3]), false),
        (
            Pool2d {
                stride: [2, 1],
                padding: [(1, 0), (1, 1)],
                ceil_mode: true,
                ..Pool2d::new([3, 3])
            },
            false,
        ),
        (
            Pool2d {
                padding: [(1, 1), (0, 1)],
                ..Pool2d::new([3, 2])
            },
            true,
        ),
    ];
    for (k, (window, with_pad)) in windows.iter().enumerate() {
        let got = x64.avg_pool2d(window, *with_pad)?;
        agree(
            &format!("avg_pool2d {k}"),
            &got,
            &x32.avg_pool2d(window, *with_pad)?,
        )?;
    }
    let w32 = Tensor::randn([3, 2, 3, 2], 22)?;
    let transposed = |x: &Tensor, w: &Tensor| {
        x.conv_transpose2d(w, None, [2, 1], [(1, 0), (0, 1)], [1, 0], [1, 2], 1)
    };
    let got = transposed(&x64, &w32.cast(DType::F64)?)?;
    agree("conv_transpose2d", &got, &transposed(&x32, &w32)?)?;
    Ok(())
}
