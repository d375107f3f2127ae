//! The quickstart's training step (MLP 784-256-256-10, batches of 250
//! digits normalized inside the step, cross-entropy, gradients, the update)
//! as fused for the CPU, for SGD with momentum and for AdamW: the printed
//! fused graph and schedule as snapshots, the kernel count per step pinned,
//! and one fused step checked against the same step unfused (one kernel per
//! op), parameters and optimizer state alike.

use kiln::nn::Mlp;
use kiln::optim::{AdamW, Optimizer, Sgd};
use kiln::{CompiledStep, DType, Data, Options, Result, Tensor, TensorType};

const BATCH: usize = 250;

fn pixels(images: &Tensor) -> Result<Tensor> {
    let x = ((images.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081);
    x?.reshape([BATCH, 784])
}

/// The quickstart's step with `optimizer`, fused or not.
fn step(optimizer: &dyn Optimizer, fusion: bool) -> Result<CompiledStep> {
    let mlp = Mlp::new(&[784, 256, 256, 10], 0)?;
    let params: Vec<&Tensor> = mlp.parameters().into_iter().map(|(_, p)| p).collect();
    let mut state: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    state.extend(optimizer.state(&params)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let batch = [
        TensorType::new(DType::U8, [BATCH, 28, 28]),
        TensorType::new(DType::I32, [BATCH]),
    ];
    let n = params.len();
    kiln::compile_step("train", &state, &batch, Options { fusion }, |s, b| {
        let (params, moments) = s.split_at(n);
        let mut model = mlp.clone();
        for ((_, p), v) in model.parameters_mut().into_iter().zip(params) {
            *p = v.clone();
        }
        let loss = model.forward(&pixels(&b[0])?)?.cross_entropy(&b[1])?;
        let grads = kiln::grad(&loss, &params.iter().collect::<Vec<_>>())?;
        let (params, moments) = optimizer.update(params, &grads, moments)?;
        Ok((vec![loss], params.into_iter().chain(moments).collect()))
    })
}

/// The fused graph and its schedule, as `KILN_DUMP=fuse,schedule` prints them.
fn printed(step: &CompiledStep) -> String {
    let optimized = step.graph().optimized();
    format!(
        "{}\n{}",
        optimized.graph,
        optimized.schedule.print(&optimized.graph)
    )
}

/// One step fused and one unfused on the same batch agree: the loss, and
/// every parameter and moment after the update.
fn fused_matches_unfused(optimizer: &dyn Optimizer) -> Result<()> {
    let images: Vec<u8> = (0..BATCH * 784).map(|i| (i * 7919 % 256) as u8).collect();
    let labels: Vec<i32> = (0..BATCH as i32).map(|i| i * 31 % 10).collect();
    let batch = [Data::U8(images), Data::I32(labels)];
    let batch: Vec<&Data> = batch.iter().collect();
    let mut runs = Vec::new();
    for fusion in [true, false] {
        let mut s = step(optimizer, fusion)?;
        let loss = s.run(&batch)?[0].clone();
        let state = s.state()?;
        let mut values = vec![loss];
        for t in &state {
            values.push(Data::F32(t.to_vec::<f32>()?));
        }
        runs.push(values);
    }
    for (k, (fused, unfused)) in runs[0].iter().zip(&runs[1]).enumerate() {
        let (Data::F32(a), Data::F32(b)) = (fused, unfused) else {
            panic!("value {k} is not f32");
        };
        // The fused kernels sum and multiply in other orders: a few ulps.
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let tol = 1e-5 * y.abs().max(1e-3);
            assert!(
                (x - y).abs() <= tol,
                "value {k}[{i}]: fused {x}, unfused {y}"
            );
        }
    }
    Ok(())
}

#[test]
fn an_sgd_step_is_16_kernels() -> Result<()> {
    let sgd = Sgd {
        momentum: 0.9,
        ..Sgd::new(0.05)
    };
    let s = step(&sgd, true)?;
    // Three products with their bias and relu (the first normalizing the
    // images as it packs them); the loss's max, sum of exponentials, loss
    // and gradient; per layer the weight gradient's product and the bias
    // gradient's sum, each writing the parameter and its momentum; the
    // gradients through the two relus.
    assert_eq!(s.graph().launches(), 16, "kernels per fused SGD step");
    insta::assert_snapshot!("sgd_step", printed(&s));
    fused_matches_unfused(&sgd)
}

#[test]
fn an_adamw_step_is_16_kernels() -> Result<()> {
    let adam = AdamW::new(1e-3);
    let s = step(&adam, true)?;
    // SGD's 16: the moments are written beside the parameters, and the step
    // count beside the loss.
    assert_eq!(s.graph().launches(), 16, "kernels per fused AdamW step");
    insta::assert_snapshot!("adamw_step", printed(&s));
    fused_matches_unfused(&adam)
}
