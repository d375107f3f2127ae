//! Optimizers against PyTorch's formulas written out in f64, step by step,
//! eagerly and inside compiled steps; and what a compiled step does with the
//! state it carries.

use kiln::optim::{AdamW, Optimizer, Sgd};
use kiln::{DType, Data, Result, Tensor, TensorType};

/// Parameters and a gradient per step, of awkward sizes.
fn initial() -> Result<Vec<Tensor>> {
    Ok(vec![Tensor::randn([7, 3], 1)?, Tensor::randn([5], 2)?])
}

fn grads(step: u64) -> Result<Vec<Tensor>> {
    Ok(vec![
        Tensor::randn([7, 3], 100 + step)?,
        Tensor::randn([5], 200 + step)?,
    ])
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f32>()
        .expect("realizes")
        .into_iter()
        .map(f64::from)
        .collect()
}

/// `torch.optim.SGD` (no dampening) on one parameter, in f64.
fn sgd_reference(o: &Sgd, p: &mut [f64], buf: &mut [f64], g: &[f64]) {
    for i in 0..p.len() {
        let mut d = g[i] + f64::from(o.weight_decay) * p[i];
        if o.momentum != 0.0 {
            buf[i] = f64::from(o.momentum) * buf[i] + d;
            d = if o.nesterov {
                d + f64::from(o.momentum) * buf[i]
            } else {
                buf[i]
            };
        }
        p[i] -= f64::from(o.lr) * d;
    }
}

/// `torch.optim.AdamW` on one parameter at step `t` (from 1), in f64.
fn adamw_reference(o: &AdamW, t: i32, p: &mut [f64], m: &mut [f64], v: &mut [f64], g: &[f64]) {
    let (b1, b2) = (f64::from(o.beta1), f64::from(o.beta2));
    let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
    for i in 0..p.len() {
        p[i] *= 1.0 - f64::from(o.lr) * f64::from(o.weight_decay);
        m[i] = b1 * m[i] + (1.0 - b1) * g[i];
        v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
        let denominator = (v[i] / c2).sqrt() + f64::from(o.eps);
        p[i] -= f64::from(o.lr) * (m[i] / c1) / denominator;
    }
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// Five steps of `optimizer`, eagerly and in a compiled step (each step's
/// gradients as arguments), against `reference` run on the same values.
fn check(
    optimizer: &impl Optimizer,
    mut reference: impl FnMut(usize, &mut [f64], &[f64]),
) -> Result<()> {
    let params = initial()?;
    let refs: Vec<&Tensor> = params.iter().collect();
    let mut want: Vec<Vec<f64>> = params.iter().map(values).collect();
    // Eager.
    let (mut p, mut state) = (params.clone(), optimizer.state(&refs)?);
    for step in 0..5 {
        (p, state) = optimizer.update(&p, &grads(step)?, &state)?;
        for (k, w) in want.iter_mut().enumerate() {
            reference(k, w, &values(&grads(step)?[k]));
        }
    }
    for (k, (p, w)) in p.iter().zip(&want).enumerate() {
        assert_close(&format!("eager parameter {k}"), &values(p), w);
    }
    // Compiled: the state is the parameters, then the optimizer's.
    let mut carried: Vec<Tensor> = params.clone();
    carried.extend(optimizer.state(&refs)?);
    let carried_refs: Vec<&Tensor> = carried.iter().collect();
    let specs: Vec<TensorType> = params.iter().map(|p| p.ty().clone()).collect();
    let n = params.len();
    let mut compiled = kiln::compile_step("optimize", &carried_refs, &specs, |state, grads| {
        let (p, opt) = state.split_at(n);
        let (new_p, new_opt) = optimizer.update(p, grads, opt)?;
        Ok((Vec::new(), new_p.into_iter().chain(new_opt).collect()))
    })?;
    assert!(
        compiled.in_place().iter().all(|&b| b),
        "parameters and state written in place"
    );
    for step in 0..5 {
        let g: Vec<Data> = grads(step)?
            .iter()
            .map(|g| Data::F32(g.to_vec::<f32>().expect("realizes")))
            .collect();
        let g: Vec<&Data> = g.iter().collect();
        assert!(compiled.run(&g)?.is_empty());
    }
    let state = compiled.state()?;
    for (k, w) in want.iter().enumerate() {
        assert_close(&format!("compiled parameter {k}"), &values(&state[k]), w);
    }
    // The tensors the step started from are the caller's, untouched.
    for (k, p) in params.iter().enumerate() {
        assert_eq!(
            values(p),
            values(&initial()?[k]),
            "parameter {k} was written"
        );
    }
    Ok(())
}

#[test]
fn sgd_follows_pytorch() -> Result<()> {
    for (momentum, nesterov, weight_decay) in [
        (0.0, false, 0.0),
        (0.9, false, 0.0),
        (0.9, true, 1e-2),
        (0.0, false, 1e-2),
    ] {
        let o = Sgd {
            lr: 0.1,
            momentum,
            nesterov,
            weight_decay,
        };
        let mut bufs: Vec<Vec<f64>> = vec![vec![0.0; 21], vec![0.0; 5]];
        check(&o, |k, p, g| sgd_reference(&o, p, &mut bufs[k], g))?;
    }
    Ok(())
}

#[test]
fn adamw_follows_pytorch() -> Result<()> {
    let o = AdamW {
        lr: 0.05,
        ..AdamW::new(0.05)
    };
    let mut moments: Vec<(Vec<f64>, Vec<f64>, i32)> = vec![
        (vec![0.0; 21], vec![0.0; 21], 0),
        (vec![0.0; 5], vec![0.0; 5], 0),
    ];
    check(&o, |k, p, g| {
        let (m, v, t) = &mut moments[k];
        *t += 1;
        adamw_reference(&o, *t, p, m, v, g);
    })
}

#[test]
fn a_step_carries_its_state_and_lets_it_be_read_and_written() -> Result<()> {
    // x <- x + a, with the sum of x as output: the state is x.
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3])?;
    let spec = TensorType::new(DType::F32, [3]);
    let mut step = kiln::compile_step("accumulate", &[&x], &[spec], |s, a| {
        let next = (&s[0] + &a[0])?;
        Ok((vec![next.sum_all()?], vec![next]))
    })?;
    // x' is computed over x's own buffer: the sum reads x', not x.
    assert_eq!(step.in_place(), [true]);
    let a = Data::F32(vec![1.0, 1.0, 1.0]);
    assert_eq!(step.run(&[&a])?[0].to_vec::<f32>()?, [9.0]);
    assert_eq!(step.run(&[&a])?[0].to_vec::<f32>()?, [12.0]);
    assert_eq!(step.state()?[0].to_vec::<f32>()?, vec![3.0, 4.0, 5.0]);
    // The caller's tensor keeps its value, and so does a state read out as
    // the step goes on.
    assert_eq!(x.to_vec::<f32>()?, vec![1.0, 2.0, 3.0]);
    let read = step.state()?.remove(0);
    step.run(&[&a])?;
    assert_eq!(read.to_vec::<f32>()?, vec![3.0, 4.0, 5.0]);
    // Written back, the state goes on from the new value.
    step.set_state(0, &Tensor::from_slice(&[0.0f32, 0.0, 0.0], [3])?)?;
    assert_eq!(step.run(&[&a])?[0].to_vec::<f32>()?, [3.0]);
    let wrong = step.set_state(0, &Tensor::from_slice(&[0.0f32; 2], [2])?);
    assert_eq!(
        wrong.err().map(|e| e.to_string()).as_deref(),
        Some("compile_step: state 0 must be f32[3], got f32[2]")
    );
    Ok(())
}

#[test]
fn a_state_read_where_it_is_not_written_keeps_a_second_buffer() -> Result<()> {
    // x <- x + xᵀ reads element (j, i) after writing (i, j): written in
    // place it would read its own new values.
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [2, 2])?;
    let mut step = kiln::compile_step("symmetric", &[&x], &[], |s, _| {
        Ok((Vec::new(), vec![(&s[0] + &s[0].transpose(0, 1)?)?]))
    })?;
    assert_eq!(step.in_place(), [false]);
    let none: [&Data; 0] = [];
    step.run(&none)?;
    assert_eq!(step.state()?[0].to_vec::<f32>()?, vec![2.0, 5.0, 5.0, 8.0]);
    step.run(&none)?;
    assert_eq!(
        step.state()?[0].to_vec::<f32>()?,
        vec![4.0, 10.0, 10.0, 16.0]
    );
    Ok(())
}

#[test]
fn a_new_state_of_another_type_is_an_error() {
    let x = Tensor::from_slice(&[1.0f32, 2.0], [2]).expect("fills");
    let spec = TensorType::new(DType::F32, [2]);
    let made = kiln::compile_step("bad", &[&x], &[spec], |s, _| {
        Ok((Vec::new(), vec![s[0].sum_all()?]))
    });
    assert_eq!(
        made.err().map(|e| e.to_string()).as_deref(),
        Some("compile_step: state 0 must be f32[2], got f32[]")
    );
}

#[test]
fn hyperparameters_out_of_range_are_errors() {
    let p = Tensor::from_slice(&[1.0f32, 2.0], [2]).expect("fills");
    let sgd = |sgd: Sgd| sgd.state(&[&p]).err().map(|e| e.to_string());
    let nesterov = Sgd {
        nesterov: true,
        ..Sgd::new(0.1)
    };
    assert_eq!(
        sgd(nesterov).as_deref(),
        Some("Sgd: nesterov needs a momentum above 0")
    );
    assert_eq!(
        sgd(Sgd::new(-0.1)).as_deref(),
        Some("Sgd: lr must be 0 or more, not -0.1")
    );
    assert_eq!(
        sgd(Sgd::new(f32::NAN)).as_deref(),
        Some("Sgd: lr must be 0 or more, not NaN")
    );
    let momentum = Sgd {
        momentum: -0.9,
        ..Sgd::new(0.1)
    };
    assert!(sgd(momentum).is_some_and(|e| e.contains("momentum must be 0 or more")));
    let adam = |adam: AdamW| adam.state(&[&p]).err().map(|e| e.to_string());
    let beta = AdamW {
        beta2: 1.0,
        ..AdamW::new(1e-3)
    };
    assert_eq!(
        adam(beta).as_deref(),
        Some("AdamW: beta2 must be in [0, 1), not 1")
    );
    let eps = AdamW {
        eps: -1e-8,
        ..AdamW::new(1e-3)
    };
    assert!(adam(eps).is_some_and(|e| e.contains("eps must be 0 or more")));
    // The update checks them too, for optimizers built after the state.
    let one = std::slice::from_ref(&p);
    let update = nesterov.update(one, one, one);
    assert!(update.is_err());
    assert!(
        sgd(Sgd::new(0.0)).is_none(),
        "a learning rate of 0 is allowed"
    );
}

#[test]
fn schedules_give_their_rates_at_the_boundaries() -> Result<()> {
    use kiln::optim::Schedule;
    let rates =
        |s: Schedule, steps: usize| -> Result<Vec<f32>> { (0..steps).map(|k| s.lr(k)).collect() };
    let near = |got: Vec<f32>, want: &[f32]| {
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1e-6),
                "step {k}: got {g}, want {w}"
            );
        }
    };
    near(rates(Schedule::Constant { lr: 0.5 }, 3)?, &[0.5, 0.5, 0.5]);
    let step = Schedule::Step {
        lr: 1.0,
        every: 3,
        gamma: 0.5,
    };
    near(rates(step, 7)?, &[1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]);
    let warmup = Schedule::Warmup { lr: 1.0, steps: 4 };
    near(rates(warmup, 5)?, &[0.25, 0.5, 0.75, 1.0, 1.0]);
    // Up from 0 over two steps, half a cosine over four, the floor after.
    let cosine = Schedule::Cosine {
        lr: 1.0,
        warmup: 2,
        total: 6,
        floor: 0.1,
    };
    let mid = 0.1 + 0.9 * 0.5 * (1.0 + (std::f32::consts::PI / 4.0).cos());
    near(
        rates(cosine, 8)?,
        &[
            0.0,
            0.5,
            1.0,
            mid,
            0.55,
            0.1 + 0.9 * 0.5 * (1.0 - (std::f32::consts::PI / 4.0).cos()),
            0.1,
            0.1,
        ],
    );
    // OneCycleLR(max_lr=1, total_steps=10): up to step 2, down to step 9.
    let one = rates(Schedule::one_cycle(1.0, 10), 10)?;
    near(
        vec![one[0], one[1], one[2], one[9]],
        &[0.04, 0.52, 1.0, 4e-6],
    );
    assert!(one[2..].windows(2).all(|w| w[1] < w[0]), "{one:?}");
    // Its momentum the other way: 0.95 down to 0.85 at the peak, back up.
    let one = Schedule::one_cycle(1.0, 10);
    let momenta = (0..10)
        .map(|k| Ok(one.momentum(k)?.expect("cycled")))
        .collect::<Result<Vec<f32>>>()?;
    near(
        vec![momenta[0], momenta[1], momenta[2], momenta[9]],
        &[0.95, 0.9, 0.85, 0.95],
    );
    assert_eq!(Schedule::Constant { lr: 0.5 }.momentum(0)?, None);
    let bad = [
        (
            Schedule::Warmup { lr: 1.0, steps: 0 },
            0,
            "needs steps >= 1",
        ),
        (
            Schedule::one_cycle(1.0, 10),
            10,
            "OneCycle has 10 steps; step 10 is past them",
        ),
        (
            Schedule::Constant { lr: -1.0 },
            0,
            "the rate must be 0 or more, not -1",
        ),
        (
            Schedule::OneCycle {
                max: 1.0,
                total: 10,
                pct_start: 0.3,
                div: 25.0,
                final_div: 1e4,
                momentum: Some([0.9, 1.0]),
            },
            0,
            "momentum [base, max] with 0 <= base <= max < 1",
        ),
    ];
    for (s, k, message) in bad {
        let e = s.lr(k).expect_err("an error").to_string();
        assert!(e.contains(message), "{e}");
    }
    Ok(())
}

#[test]
fn a_compiled_step_takes_its_rates_as_inputs_each_step() -> Result<()> {
    use kiln::optim::{Rates, Schedule};
    let cosine = Schedule::Cosine {
        lr: 0.05,
        warmup: 2,
        total: 5,
        floor: 0.1,
    };
    let sgd = Sgd {
        momentum: 0.9,
        nesterov: true,
        ..Sgd::new(0.0)
    };
    let adamw = AdamW::new(0.0);
    let optimizers: [&dyn Optimizer; 2] = [&sgd, &adamw];
    // A rate alone, and a rate with a cycled momentum (SGD's, Nesterov's
    // included, and AdamW's beta1).
    for schedule in [cosine, Schedule::one_cycle(0.05, 7)] {
        for (which, optimizer) in optimizers.into_iter().enumerate() {
            let params = initial()?;
            let refs: Vec<&Tensor> = params.iter().collect();
            let n = params.len();
            let mut carried = params.clone();
            carried.extend(optimizer.state(&refs)?);
            let carried_refs: Vec<&Tensor> = carried.iter().collect();
            let mut specs: Vec<TensorType> = params.iter().map(|p| p.ty().clone()).collect();
            let scalar = TensorType::new(DType::F32, Vec::<usize>::new());
            specs.extend([scalar.clone(), scalar]);
            let cycled = schedule.momentum(0)?.is_some();
            let mut compiled =
                kiln::compile_step("scheduled", &carried_refs, &specs, |state, args| {
                    let (p, opt) = state.split_at(n);
                    let rates = Rates {
                        lr: args[n].clone(),
                        momentum: cycled.then(|| args[n + 1].clone()),
                    };
                    let (new_p, new_opt) = optimizer.update_at(p, &args[..n], opt, &rates)?;
                    Ok((Vec::new(), new_p.into_iter().chain(new_opt).collect()))
                })?;
            // The same steps eagerly, each at its step's rates as constants.
            let (mut p, mut state) = (params.clone(), optimizer.state(&refs)?);
            for step in 0..7 {
                let lr = schedule.lr(step)?;
                let m = schedule.momentum(step)?;
                let g = grads(step as u64)?;
                let rates = [Tensor::scalar(lr), Tensor::scalar(m.unwrap_or(0.0))];
                let args: Vec<&Tensor> = g.iter().chain(&rates).collect();
                compiled.call(&args)?;
                (p, state) = match which {
                    0 => Sgd {
                        lr,
                        momentum: m.unwrap_or(sgd.momentum),
                        ..sgd
                    }
                    .update(&p, &g, &state)?,
                    _ => AdamW {
                        lr,
                        beta1: m.unwrap_or(adamw.beta1),
                        ..adamw
                    }
                    .update(&p, &g, &state)?,
                };
            }
            let carried = compiled.state()?;
            for k in 0..n {
                assert_close(
                    &format!("{schedule:?}, optimizer {which}, parameter {k}"),
                    &values(&carried[k]),
                    &values(&p[k]),
                );
            }
        }
    }
    // A momentum scheduled for SGD without one has no buffers to move.
    let rates = Rates {
        lr: Tensor::scalar(0.1f32),
        momentum: Some(Tensor::scalar(0.9f32)),
    };
    let p = initial()?;
    let e = Sgd::new(0.1).update_at(&p, &p, &[], &rates).map(|_| ());
    let e = e.expect_err("an error").to_string();
    assert!(
        e.starts_with("Sgd: a scheduled momentum needs a momentum above 0"),
        "{e}"
    );
    Ok(())
}

#[test]
fn clip_grad_norm_scales_every_gradient_by_the_global_norm() -> Result<()> {
    use kiln::optim::clip_grad_norm;
    let g = grads(3)?;
    let flat: Vec<Vec<f64>> = g.iter().map(values).collect();
    let norm = flat.iter().flatten().map(|x| x * x).sum::<f64>().sqrt();
    let specs: Vec<TensorType> = g.iter().map(|t| t.ty().clone()).collect();
    // Below the norm (clipped) and above it (kept as they are).
    for max_norm in [0.5f32, 1e6] {
        let scale = (f64::from(max_norm) / (norm + 1e-6)).min(1.0);
        let mut compiled = kiln::compile("clip", &specs, |t| {
            let (clipped, n) = clip_grad_norm(t, max_norm)?;
            Ok(clipped.into_iter().chain([n]).collect())
        })?;
        let refs: Vec<&Tensor> = g.iter().collect();
        let from_step = compiled.call(&refs)?;
        let (eager, eager_norm) = clip_grad_norm(&g, max_norm)?;
        for out in [
            eager.into_iter().chain([eager_norm]).collect::<Vec<_>>(),
            from_step,
        ] {
            for (k, f) in flat.iter().enumerate() {
                let want: Vec<f64> = f.iter().map(|x| x * scale).collect();
                assert_close(
                    &format!("max_norm {max_norm}, gradient {k}"),
                    &values(&out[k]),
                    &want,
                );
            }
            assert_close("the norm", &values(&out[2]), &[norm]);
        }
    }
    let e = clip_grad_norm(&g, -1.0).map(|_| ()).expect_err("an error");
    assert_eq!(
        e.to_string(),
        "clip_grad_norm: max_norm must be 0 or more, not -1"
    );
    Ok(())
}

#[test]
fn optimizer_state_is_named_as_pytorch_names_it() -> Result<()> {
    let params = initial()?;
    let refs: Vec<&Tensor> = params.iter().collect();
    let names = ["w", "b"];
    let sgd = Sgd {
        momentum: 0.9,
        ..Sgd::new(0.1)
    };
    let cases: [(&dyn Optimizer, Vec<&str>); 3] = [
        (&sgd, vec!["momentum_buffer.w", "momentum_buffer.b"]),
        (&Sgd::new(0.1), vec![]),
        (
            &AdamW::new(1e-3),
            vec![
                "step",
                "exp_avg.w",
                "exp_avg.b",
                "exp_avg_sq.w",
                "exp_avg_sq.b",
            ],
        ),
    ];
    for (optimizer, want) in cases {
        assert_eq!(optimizer.state_names(&names), want);
        assert_eq!(optimizer.state(&refs)?.len(), want.len(), "{want:?}");
    }
    Ok(())
}

#[test]
fn groups_update_each_run_of_parameters_with_its_own_optimizer() -> Result<()> {
    use kiln::optim::Groups;
    // Weight decay on the weight, none on the bias, one rate for both.
    let decayed = AdamW {
        weight_decay: 0.1,
        ..AdamW::new(1e-2)
    };
    let plain = AdamW {
        weight_decay: 0.0,
        ..AdamW::new(1e-2)
    };
    let groups = Groups::new(vec![(Box::new(decayed), 1), (Box::new(plain), 1)]);
    let params = initial()?;
    let refs: Vec<&Tensor> = params.iter().collect();
    assert_eq!(
        groups.state_names(&["w", "b"]),
        [
            "groups.0.step",
            "groups.0.exp_avg.w",
            "groups.0.exp_avg_sq.w",
            "groups.1.step",
            "groups.1.exp_avg.b",
            "groups.1.exp_avg_sq.b"
        ]
    );
    // Eagerly, against each optimizer on its own parameter.
    let (mut p, mut state) = (params.clone(), groups.state(&refs)?);
    let (mut w, mut w_state) = (params[..1].to_vec(), decayed.state(&refs[..1])?);
    let (mut b, mut b_state) = (params[1..].to_vec(), plain.state(&refs[1..])?);
    for step in 0..4 {
        let g = grads(step)?;
        (p, state) = groups.update(&p, &g, &state)?;
        (w, w_state) = decayed.update(&w, &g[..1], &w_state)?;
        (b, b_state) = plain.update(&b, &g[1..], &b_state)?;
    }
    assert_eq!(values(&p[0]), values(&w[0]));
    assert_eq!(values(&p[1]), values(&b[0]));
    assert_eq!(state.len(), w_state.len() + b_state.len());
    // The decay reached the weight alone: a group without it differs.
    let undecayed = Groups::new(vec![(Box::new(plain), 2)]);
    let (q, _) = undecayed.update(&params, &grads(0)?, &undecayed.state(&refs)?)?;
    let (once, _) = groups.update(&params, &grads(0)?, &groups.state(&refs)?)?;
    assert_ne!(values(&q[0]), values(&once[0]));
    assert_eq!(values(&q[1]), values(&once[1]));
    let e = groups
        .update(&params[..1], &grads(0)?[..1], &state)
        .map(|_| ())
        .expect_err("an error");
    assert_eq!(e.to_string(), "Groups: groups of 2 parameters given 1");
    Ok(())
}

#[test]
fn accumulate_applies_the_mean_gradient_every_few_updates() -> Result<()> {
    use kiln::optim::Accumulate;
    let adamw = AdamW::new(1e-2);
    let accumulate = Accumulate {
        optimizer: adamw,
        every: 3,
    };
    let params = initial()?;
    let refs: Vec<&Tensor> = params.iter().collect();
    // In a compiled step, the gradients as its arguments.
    let mut carried = params.clone();
    carried.extend(accumulate.state(&refs)?);
    let carried_refs: Vec<&Tensor> = carried.iter().collect();
    let specs: Vec<TensorType> = params.iter().map(|p| p.ty().clone()).collect();
    let mut step = kiln::compile_step("accumulate", &carried_refs, &specs, |s, g| {
        let (p, o) = s.split_at(2);
        let (new_p, new_o) = accumulate.update(p, g, o)?;
        Ok((Vec::new(), new_p.into_iter().chain(new_o).collect()))
    })?;
    // The same by hand: AdamW on each run's mean, ((0 + g0) + g1) + g2 over 3.
    let (mut want, mut adam_state) = (params.clone(), adamw.state(&refs)?);
    let mut sums: Vec<Tensor> = params
        .iter()
        .map(|p| Tensor::zeros(p.shape().clone(), DType::F32))
        .collect::<Result<_>>()?;
    for call in 0..6u64 {
        let g = grads(call)?;
        let g_refs: Vec<&Tensor> = g.iter().collect();
        step.call(&g_refs)?;
        sums = sums
            .iter()
            .zip(&g)
            .map(|(s, g)| s + g)
            .collect::<Result<_>>()?;
        if call % 3 == 2 {
            let means: Vec<Tensor> = sums
                .iter()
                .map(|s| s * (1.0f32 / 3.0))
                .collect::<Result<_>>()?;
            (want, adam_state) = adamw.update(&want, &means, &adam_state)?;
            sums = params
                .iter()
                .map(|p| Tensor::zeros(p.shape().clone(), DType::F32))
                .collect::<Result<_>>()?;
        }
        let got = step.state()?;
        for k in 0..2 {
            assert_close(
                &format!("call {call}, parameter {k}"),
                &values(&got[k]),
                &values(&want[k]),
            );
        }
        // Between applications the parameters are the ones before.
        if call < 2 {
            assert_eq!(values(&got[0]), values(&params[0]), "call {call}");
        }
    }
    let none = Accumulate {
        optimizer: adamw,
        every: 0,
    };
    let e = none.state(&refs).map(|_| ()).expect_err("an error");
    assert_eq!(e.to_string(), "Accumulate: every must be at least 1");
    Ok(())
}
