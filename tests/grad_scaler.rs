//! `optim::GradScaler` in a compiled step: an f16 forward pass whose
//! scaled gradients overflow skips its updates and halves the scale, the
//! first finite step updates, clean steps grow the scale again; with
//! finite gradients it moves the parameters exactly as its optimizer does.

use kiln::optim::{GradScaler, Optimizer, Sgd};
use kiln::{CompiledStep, DType, Result, Tensor, TensorType};

/// A step of `optimizer` on `w` for `loss(w, x)`, the loss scaled by the
/// scaler's state where `scaled`; outputs the loss.
fn step<O: Optimizer>(
    optimizer: &O,
    w: &Tensor,
    x: &TensorType,
    loss: fn(&Tensor, &Tensor) -> Result<Tensor>,
    scaled: Option<&GradScaler<Sgd>>,
) -> Result<CompiledStep> {
    let mut state = vec![w.clone()];
    state.extend(optimizer.state(&[w])?);
    let state: Vec<&Tensor> = state.iter().collect();
    kiln::compile_step("scaled", &state, std::slice::from_ref(x), |s, b| {
        let l = loss(&s[0], &b[0])?;
        let target = match scaled {
            Some(scaler) => scaler.loss(&l, &s[1..])?,
            None => l.clone(),
        };
        let grads = kiln::grad(&target, &[&s[0]])?;
        let (w, opt) = optimizer.update(&s[..1], &grads, &s[1..])?;
        Ok((vec![l], w.into_iter().chain(opt).collect()))
    })
}

/// sum((w * x)²) computed in f16, as f32.
fn half_loss(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    let h = w.cast(DType::F16)?.mul(x)?;
    h.mul(&h)?.sum_all()?.cast(DType::F32)
}

#[test]
fn overflowing_steps_are_skipped_and_the_scale_backs_off_then_grows() -> Result<()> {
    let scaler = GradScaler {
        init_scale: 2f32.powi(20),
        growth_interval: 3,
        ..GradScaler::new(Sgd::new(0.01))
    };
    let w = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3])?;
    let x_ty = TensorType::new(DType::F16, [3]);
    let mut s = step(&scaler, &w, &x_ty, half_loss, Some(&scaler))?;
    let x = Tensor::from_vec([1.0f32, 0.5, 1.0].map(kiln::f16::from_f32).to_vec(), [3])?;
    let mut scales = Vec::new();
    let mut skipped = Vec::new();
    let mut before = w.to_vec::<f32>()?;
    for _ in 0..14 {
        s.call(&[&x])?;
        let state = s.state()?;
        let after = state[0].to_vec::<f32>()?;
        scales.push(state[1].to_scalar::<f32>()?);
        skipped.push(after == before);
        assert!(after.iter().all(|v| v.is_finite()), "{after:?}");
        before = after;
    }
    // 2w²x² summed: its gradient 2·(w·x)·x·2^k in f16 overflows from 2^14
    // on (6·2^14 > 65504): seven halvings, then steps that update, the
    // scale doubling after three of them and backing off at once.
    let k = |e: i32| 2f32.powi(e);
    assert_eq!(
        scales,
        [
            k(19),
            k(18),
            k(17),
            k(16),
            k(15),
            k(14),
            k(13),
            k(13),
            k(13),
            k(14),
            k(13),
            k(13),
            k(13),
            k(14)
        ],
        "skipped: {skipped:?}"
    );
    assert_eq!(
        skipped,
        [
            true, true, true, true, true, true, true, false, false, false, true, false, false,
            false
        ]
    );
    Ok(())
}

#[test]
fn with_finite_gradients_it_moves_as_its_optimizer() -> Result<()> {
    let sgd = Sgd {
        momentum: 0.9,
        ..Sgd::new(0.05)
    };
    let scaler = GradScaler::new(sgd);
    let w = Tensor::randn([17], 3)?;
    let x_ty = TensorType::new(DType::F32, [17]);
    let loss: fn(&Tensor, &Tensor) -> Result<Tensor> = |w, x| (w * x)?.square()?.sum_all();
    let mut plain = step(&sgd, &w, &x_ty, loss, None)?;
    let mut scaled = step(&scaler, &w, &x_ty, loss, Some(&scaler))?;
    let x = Tensor::randn([17], 4)?;
    for _ in 0..5 {
        let a = plain.call(&[&x])?.remove(0).to_scalar::<f32>()?;
        let b = scaled.call(&[&x])?.remove(0).to_scalar::<f32>()?;
        assert_eq!(a, b);
    }
    // The scale is a power of two: dividing by it is exact.
    let (p, s) = (plain.state()?, scaled.state()?);
    assert_eq!(p[0].to_vec::<f32>()?, s[0].to_vec::<f32>()?);
    assert_eq!(s[1].to_scalar::<f32>()?, 65536.0);
    assert_eq!(s[2].to_scalar::<f32>()?, 5.0);
    Ok(())
}

#[test]
fn bad_settings_are_errors_naming_them() -> Result<()> {
    let w = Tensor::zeros([2], DType::F32)?;
    for (scaler, what) in [
        (
            GradScaler {
                init_scale: 0.0,
                ..GradScaler::new(Sgd::new(0.1))
            },
            "init_scale",
        ),
        (
            GradScaler {
                backoff_factor: 1.0,
                ..GradScaler::new(Sgd::new(0.1))
            },
            "backoff_factor",
        ),
        (
            GradScaler {
                growth_interval: 0,
                ..GradScaler::new(Sgd::new(0.1))
            },
            "growth_interval",
        ),
    ] {
        let e = scaler
            .state(&[&w])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("GradScaler") && e.contains(what), "{e}");
    }
    // f16 gradients would be unscaled below f16's range, as PyTorch refuses.
    let scaler = GradScaler::new(Sgd::new(0.1));
    let h = w.cast(DType::F16)?;
    let state = scaler.state(&[&h])?;
    let e = scaler
        .update(std::slice::from_ref(&h), std::slice::from_ref(&h), &state)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("unscaled in f32") && e.contains("f16[2]"), "{e}");
    Ok(())
}
