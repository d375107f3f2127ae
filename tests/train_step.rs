//! The quickstart's training step (MLP 784-256-256-10, batches of 250
//! digits normalized inside the step, cross-entropy, gradients, the update)
//! as fused for the CPU, for SGD with momentum and for AdamW: the printed
//! fused graph and schedule as snapshots, the kernel count per step pinned,
//! one fused step checked against the same step unfused (one kernel per
//! op), parameters and optimizer state alike, steps writing the state
//! in place against the same steps writing it to buffers of their own, and
//! the buffers each launch reads and writes, which every backend follows
//! (`kiln_runtime::bind`): each new state tensor written by its kernel over
//! the old one, nothing copied after.

use kiln::nn::{Mlp, Module};
use kiln::optim::{AdamW, Optimizer, Sgd};
use kiln::{CompileOptions, CompiledStep, DType, Data, Options, Result, Tensor, TensorType};
use kiln_runtime::bind::{Bindings, Bound};
use kiln_support::data;

const BATCH: usize = 250;

fn pixels(images: &Tensor) -> Result<Tensor> {
    let x = ((images.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081);
    x?.reshape([BATCH, 784])
}

/// The quickstart's MLP, its parameters and `optimizer`'s state for them.
fn initial_state(optimizer: &dyn Optimizer) -> Result<(Mlp, Vec<Tensor>)> {
    let mlp = Mlp::new(&[784, 256, 256, 10], 0)?;
    let params: Vec<&Tensor> = mlp.parameters().into_iter().map(|(_, p)| p).collect();
    let mut state: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    state.extend(optimizer.state(&params)?);
    Ok((mlp, state))
}

/// The quickstart's step on `state` and a batch: the loss, then the new state.
fn train(
    mlp: &Mlp,
    optimizer: &dyn Optimizer,
    state: &[Tensor],
    batch: &[Tensor],
) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let n = mlp.parameters().len();
    let (params, moments) = state.split_at(n);
    let mut model = mlp.clone();
    for ((_, p), v) in model.parameters_mut().into_iter().zip(params) {
        *p = v.clone();
    }
    let loss = model
        .forward(&pixels(&batch[0])?)?
        .cross_entropy(&batch[1])?;
    let grads = kiln::grad(&loss, &params.iter().collect::<Vec<_>>())?;
    let (params, moments) = optimizer.update(params, &grads, moments)?;
    Ok((vec![loss], params.into_iter().chain(moments).collect()))
}

fn batch_types() -> [TensorType; 2] {
    [
        TensorType::new(DType::U8, [BATCH, 28, 28]),
        TensorType::new(DType::I32, [BATCH]),
    ]
}

/// A batch of made-up digits.
fn batch() -> [Data; 2] {
    let images: Vec<u8> = (0..BATCH * 784).map(|i| (i * 7919 % 256) as u8).collect();
    let labels: Vec<i32> = (0..BATCH as i32).map(|i| i * 31 % 10).collect();
    [Data::U8(images), Data::I32(labels)]
}

/// The quickstart's step with `optimizer`, fused or not.
fn step(optimizer: &dyn Optimizer, fusion: bool) -> Result<CompiledStep> {
    let (mlp, state) = initial_state(optimizer)?;
    let state: Vec<&Tensor> = state.iter().collect();
    kiln::compile_step_with(
        "train",
        &state,
        &batch_types(),
        CompileOptions {
            optimizer: Options {
                fusion,
                ..Options::default()
            },
            ..CompileOptions::default()
        },
        |s, b| train(&mlp, optimizer, s, b),
    )
}

/// Three steps that write the state in place give bit for bit the state
/// of the same fused steps compiled as a plain graph, whose new state is
/// written to buffers of its own and passed back in by hand.
fn in_place_matches_copies(optimizer: &dyn Optimizer) -> Result<()> {
    let mut s = step(optimizer, true)?;
    assert!(
        s.in_place().iter().all(|&b| b),
        "every state tensor is written in place"
    );
    let (mlp, state) = initial_state(optimizer)?;
    let mut specs: Vec<TensorType> = state.iter().map(|t| t.ty().clone()).collect();
    specs.extend(batch_types());
    let n = state.len();
    let mut plain = kiln::compile("train", &specs, |inputs| {
        let (state, batch) = inputs.split_at(n);
        let (loss, next) = train(&mlp, optimizer, state, batch)?;
        Ok(loss.into_iter().chain(next).collect())
    })?;
    let batch = batch();
    let mut current: Vec<Data> = state.iter().map(data).collect::<Result<_>>()?;
    for round in 0..3 {
        let loss = data(&s.run(&[&batch[0], &batch[1]])?[0])?;
        let inputs: Vec<&Data> = current.iter().chain(&batch).collect();
        let mut out = plain.run(&inputs)?;
        assert_eq!(loss, out[0], "loss of step {round}");
        current = out.split_off(1);
    }
    for (k, (t, want)) in s.state()?.iter().zip(&current).enumerate() {
        assert_eq!(&data(t)?, want, "state tensor {k} after three steps");
    }
    Ok(())
}

/// The buffers of the step's launches, as `KILN_DUMP=donate` prints them,
/// after checking that each donated output is written by a kernel over its
/// input (or is that input, left as it was) and none is copied.
fn buffers(step: &CompiledStep) -> String {
    let optimized = step.graph().optimized();
    let bindings = Bindings::new(optimized);
    let graph = &optimized.graph;
    for &(input, output) in &optimized.schedule.donated {
        let k = output as usize;
        let written = (bindings.launches.iter())
            .flat_map(|b| std::iter::once(&b.out).chain(&b.side))
            .filter(|&&b| b == Bound::Output(k))
            .count();
        let unchanged = matches!(graph.node(graph.outputs[k]).op, kiln_ir::Op::Input { index } if index == input);
        assert_eq!(
            written + usize::from(unchanged),
            1,
            "output {k} over input {input}"
        );
        assert!(
            bindings.copies.iter().all(|c| c.0 != k),
            "output {k} is copied"
        );
    }
    bindings.print(optimized)
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
    let batch = batch();
    let batch: Vec<&Data> = batch.iter().collect();
    let mut runs = Vec::new();
    for fusion in [true, false] {
        let mut s = step(optimizer, fusion)?;
        let loss = data(&s.run(&batch)?[0])?;
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
    insta::assert_snapshot!("sgd_step_buffers", buffers(&s));
    fused_matches_unfused(&sgd)?;
    in_place_matches_copies(&sgd)
}

#[test]
fn an_adamw_step_is_16_kernels() -> Result<()> {
    let adam = AdamW::new(1e-3);
    let s = step(&adam, true)?;
    // SGD's 16: the moments are written beside the parameters, and the step
    // count beside the loss.
    assert_eq!(s.graph().launches(), 16, "kernels per fused AdamW step");
    insta::assert_snapshot!("adamw_step", printed(&s));
    insta::assert_snapshot!("adamw_step_buffers", buffers(&s));
    fused_matches_unfused(&adam)?;
    in_place_matches_copies(&adam)
}
