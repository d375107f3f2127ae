//! Mixed precision (`Options::autocast`): a compiled graph's f32 products
//! multiply their operands rounded to bf16 or f16 and sum in f32, whatever
//! kernel the rounding lands in, against the interpreter computing the same
//! products on operands rounded by hand, in as many kernels as without
//! autocast (on the device under test, `KILN_TEST_DEVICE`); on the CPU,
//! attention run as one kernel stays in f32, the roundings cost a training
//! step no kernel, and the quickstart's MLP trains to the f32 run's
//! accuracy.

// The shared helpers, of which this file uses some.
#[allow(dead_code)]
mod agree;

use std::path::Path;

use agree::{compare, device, input, sum_tol};
use kiln::data::npy::NpyArray;
use kiln::nn::{Mlp, Module};
use kiln::optim::{AdamW, GradScaler, Optimizer};
use kiln::{
    Autocast, CompileOptions, CompiledStep, DType, Device, Options, Result, Tensor, TensorType,
};
use kiln_support::data;

/// How a test graph rounds a product's operand.
type Round<'a> = &'a dyn Fn(&Tensor) -> Result<Tensor>;

/// A graph of tensors whose products read their operands through `round`.
type Products = fn(&[Tensor], Round) -> Result<Vec<Tensor>>;

/// `f` compiled with `to`'s autocast on the device under test against `f`
/// on the interpreter without it, each product's operands rounded by hand;
/// and against the interpreter without any rounding, to show that the
/// rounding happened; in as many kernels as `f` without autocast (the
/// roundings fused). `k` is the longest sum, for the tolerance.
fn check(what: &str, inputs: &[Tensor], k: usize, to: Autocast, f: Products) -> Result<()> {
    check_adding(what, inputs, k, to, 0, f)
}

/// `check`, autocast adding `extra` kernels.
fn check_adding(
    what: &str,
    inputs: &[Tensor],
    k: usize,
    to: Autocast,
    extra: usize,
    f: Products,
) -> Result<()> {
    let specs: Vec<TensorType> = inputs.iter().map(|t| t.ty().clone()).collect();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let compile = |options: CompileOptions, round: Round| {
        kiln::compile_with(what, &specs, options, |t| f(t, round))
    };
    let run = |options, round| -> Result<Vec<Tensor>> { compile(options, round)?.call(&refs) };
    let half = to.dtype();
    let plain = CompileOptions::on(device());
    let tested = CompileOptions {
        optimizer: Options {
            autocast: Some(to),
            ..Options::default()
        },
        ..plain
    };
    let same: Round = &|x| Ok(x.clone());
    let mut graph = compile(tested, same)?;
    let kernels = compile(plain, same)?.launches();
    assert_eq!(graph.launches(), kernels + extra, "{what} {half}: kernels");
    let got = graph.call(&refs)?;
    let reference = CompileOptions::on(Device::Reference);
    let by_hand: Round = &|x| x.cast(half)?.cast(DType::F32);
    let want = run(reference, by_hand)?;
    let exact = run(reference, same)?;
    let tol = sum_tol(k, 16.0);
    for (j, ((got, want), exact)) in got.iter().zip(&want).zip(&exact).enumerate() {
        let (got, want, exact) = (data(got)?, data(want)?, data(exact)?);
        compare(&format!("{what} {half} output {j}"), &got, &want, tol);
        let moved = (0..got.len()).any(|i| {
            let (a, b) = (got.get(i).to_f64(), exact.get(i).to_f64());
            (a - b).abs() > tol.atol.max(tol.rtol * b.abs())
        });
        assert!(moved, "{what} {half} output {j}: no product was rounded");
    }
    Ok(())
}

#[test]
fn products_multiply_operands_rounded_to_16_bits() -> Result<()> {
    let x = input(&[37, 53], 1, false)?;
    let w = input(&[53, 29], 2, false)?;
    let bias = input(&[29], 3, false)?;
    let batched = [input(&[3, 17, 45], 4, false)?, input(&[45, 11], 5, false)?];
    for to in [Autocast::BF16, Autocast::F16] {
        check("x@w", &[x.clone(), w.clone()], 53, to, |t, r| {
            Ok(vec![r(&t[0])?.matmul(&r(&t[1])?)?])
        })?;
        check(
            "relu(x@w+b)",
            &[x.clone(), w.clone(), bias.clone()],
            53,
            to,
            |t, r| Ok(vec![((r(&t[0])?.matmul(&r(&t[1])?)? + &t[2])?.relu()?)]),
        )?;
        check("x@x.T", std::slice::from_ref(&x), 53, to, |t, r| {
            Ok(vec![r(&t[0])?.matmul(&r(&t[0].t()?)?)?])
        })?;
        check("batched", &batched, 45, to, |t, r| {
            Ok(vec![r(&t[0])?.matmul(&r(&t[1])?)?])
        })?;
    }
    Ok(())
}

/// A value read by two products (one transposed) and by an elementwise op
/// is stored once and rounded in each product's operand; a value read by
/// one product alone is rounded by the kernel that computes it.
#[test]
fn a_value_several_kernels_read_is_rounded_by_each_product() -> Result<()> {
    let inputs = [
        input(&[31, 40], 6, false)?,
        input(&[40, 23], 7, false)?,
        input(&[23, 9], 8, false)?,
        input(&[31, 19], 9, false)?,
    ];
    for to in [Autocast::BF16, Autocast::F16] {
        check("shared hidden value", &inputs, 40, to, |t, r| {
            let h = r(&t[0])?.matmul(&r(&t[1])?)?.relu()?;
            let once = (r(&h)?.matmul(&r(&t[2])?)?.tanh()?, h.mul(&h)?);
            let twice = r(&h.t()?)?.matmul(&r(&t[3])?)?;
            Ok(vec![r(&once.0)?.matmul(&r(&t[2].t()?)?)?, once.1, twice])
        })?;
    }
    Ok(())
}

/// Linear layers over `[batch, tokens, features]` (one product of the
/// batch's rows each, `batch-rows`) of a value a sum reads too, as a
/// transformer's queries, keys and values read a block's input beside its
/// residual: each product rounds it as it reads it.
#[test]
fn linear_layers_over_a_batch_round_a_shared_input_as_they_read_it() -> Result<()> {
    let inputs = [
        input(&[2, 17, 45], 13, false)?,
        input(&[45, 11], 14, false)?,
        input(&[45, 6], 15, false)?,
    ];
    for to in [Autocast::BF16, Autocast::F16] {
        check("batched layers", &inputs, 45, to, |t, r| {
            let x = (&t[0] - &t[0].mean_all()?)?;
            let (q, k) = (r(&x)?.matmul(&r(&t[1])?)?, r(&x)?.matmul(&r(&t[2])?)?);
            let residual = (&x + &q.slice(2, 0, 1, 1)?)?;
            Ok(vec![q, k, residual])
        })?;
    }
    Ok(())
}

/// A convolution's windows rounded as the image is stored: a layer's
/// input computed by the kernel before it, read by the convolution through
/// its padding and by a residual sum after it (rounded as its padded copy
/// is written), then a 1x1 convolution of the block's output (rounded by
/// the kernel computing it), in as many kernels as in f32; the graph's
/// input image through padding in one more, which rounds it before its
/// padded copy.
#[test]
fn a_convolution_multiplies_rounded_windows() -> Result<()> {
    let inputs = [
        input(&[2, 5, 11, 9], 10, false)?,
        input(&[5, 5, 3, 3], 11, false)?,
        input(&[4, 5, 1, 1], 12, false)?,
    ];
    for to in [Autocast::BF16, Autocast::F16] {
        check("conv2d", &inputs, 45, to, |t, r| {
            let x = (&t[0] - &t[0].mean_all()?)?;
            let padding = [(1, 1), (1, 1)];
            let y = r(&x)?.conv2d(&r(&t[1])?, None, [1, 1], padding, [1, 1], 1)?;
            let block = (&y + &x)?.relu()?;
            let z = r(&block)?.conv2d(&r(&t[2])?, None, [1, 1], [(0, 0); 2], [1, 1], 1)?;
            Ok(vec![y, z])
        })?;
        check_adding("first conv2d", &inputs[..2], 45, to, 1, |t, r| {
            let padding = [(1, 1), (1, 1)];
            Ok(vec![r(&t[0])?.conv2d(
                &r(&t[1])?,
                None,
                [1, 1],
                padding,
                [1, 1],
                1,
            )?])
        })?;
        // Normalized and reshaped first, as `examples/train_cnn.rs` does.
        check_adding("first conv2d, reshaped", &inputs[..2], 45, to, 1, |t, r| {
            let x = ((&t[0] - 0.5f32)? * 2.0f32)?.reshape([2, 5, 9, 11])?;
            let padding = [(1, 1), (1, 1)];
            let y = r(&x)?.conv2d(&r(&t[1])?, None, [1, 1], padding, [1, 1], 1)?;
            Ok(vec![y])
        })?;
    }
    Ok(())
}

/// Attention the CPU runs as one kernel computes in f32 inside it: under
/// autocast it is the same kernels and the same bits.
#[test]
fn attention_run_as_one_kernel_stays_in_f32() -> Result<()> {
    if device() != Device::Cpu {
        return Ok(());
    }
    // Over enough keys that the CPU runs it as one kernel
    // (`tests/attention.rs`).
    let inputs = [
        input(&[1, 2, 260, 16], 12, false)?,
        input(&[1, 2, 260, 16], 13, false)?,
        input(&[1, 2, 260, 8], 14, false)?,
    ];
    let specs: Vec<TensorType> = inputs.iter().map(|t| t.ty().clone()).collect();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let run = |autocast| -> Result<(Vec<f32>, usize)> {
        let options = CompileOptions {
            optimizer: Options {
                autocast,
                ..Options::default()
            },
            ..CompileOptions::default()
        };
        let mut graph = kiln::compile_with("attention", &specs, options, |t| {
            let y = t[0].scaled_dot_product_attention(&t[1], &t[2], None, false, None)?;
            Ok(vec![y])
        })?;
        Ok((graph.call(&refs)?[0].to_vec()?, graph.launches()))
    };
    let (f32_values, f32_kernels) = run(None)?;
    assert_eq!(f32_kernels, 1, "attention as one kernel");
    for to in [Autocast::BF16, Autocast::F16] {
        let (values, kernels) = run(Some(to))?;
        assert_eq!(kernels, f32_kernels, "{to:?}");
        assert!(
            values
                .iter()
                .zip(&f32_values)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{to:?}"
        );
    }
    Ok(())
}

/// Images per training step, as the quickstart's.
const BATCH: usize = 250;

/// The quickstart's bytes to normalized pixels.
fn pixels(images: &Tensor) -> Result<Tensor> {
    let rows = images.dims()[0];
    let x = ((images.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081);
    x?.reshape([rows, 784])
}

/// The quickstart's training step under `autocast`, with `optimizer` (the
/// loss scaled where it is a `GradScaler`, `scaled`).
fn step<O: Optimizer>(
    mlp: &Mlp,
    optimizer: &O,
    scaled: Option<&GradScaler<AdamW>>,
    autocast: Option<Autocast>,
) -> Result<CompiledStep> {
    let params: Vec<&Tensor> = mlp.parameters().into_iter().map(|(_, p)| p).collect();
    let mut state: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    state.extend(optimizer.state(&params)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let batch = [
        TensorType::new(DType::U8, [BATCH, 28, 28]),
        TensorType::new(DType::I32, [BATCH]),
    ];
    let options = CompileOptions {
        optimizer: Options {
            autocast,
            ..Options::default()
        },
        ..CompileOptions::default()
    };
    let n = params.len();
    kiln::compile_step_with("train", &state, &batch, options, |state, batch| {
        let (params, rest) = state.split_at(n);
        let logits = mlp.with_parameters(params)?.forward(&pixels(&batch[0])?)?;
        let loss = logits.cross_entropy(&batch[1])?;
        let target = match scaled {
            Some(scaler) => scaler.loss(&loss, rest)?,
            None => loss.clone(),
        };
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = kiln::grad(&target, &refs)?;
        let (params, rest) = optimizer.update(params, &grads, rest)?;
        Ok((vec![loss], params.into_iter().chain(rest).collect()))
    })
}

/// Trains for eight epochs over the first 4,000 digits in order; returns
/// the test accuracy on the last 1,000 and the step's kernels.
fn train(mut step: CompiledStep, mlp: &Mlp) -> Result<(f32, usize)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    let images = NpyArray::open(dir.join("images.npy"))?;
    let labels = NpyArray::open(dir.join("labels.npy"))?;
    let batches: Vec<[Tensor; 2]> = (0..4000 / BATCH)
        .map(|b| {
            Ok([
                images.rows(b * BATCH, (b + 1) * BATCH)?,
                labels.rows(b * BATCH, (b + 1) * BATCH)?,
            ])
        })
        .collect::<Result<_>>()?;
    for _ in 0..8 {
        for [x, y] in &batches {
            step.call(&[x, y])?;
        }
    }
    let n = mlp.parameters().len();
    let trained = mlp.with_parameters(&step.state()?[..n])?;
    let logits = trained.forward(&pixels(&images.rows(4000, 5000)?)?)?;
    let right = logits.argmax(-1, false)?.eq(&labels.rows(4000, 5000)?)?;
    let accuracy = right.cast(DType::F32)?.mean_all()?.to_scalar()?;
    Ok((accuracy, step.graph().launches()))
}

/// bf16, and f16 with dynamic loss scaling, reach the f32 run's test
/// accuracy within a point, each in as many kernels per step as the same
/// step in f32.
#[test]
fn mixed_precision_trains_the_quickstart_mlp_as_f32_does() -> Result<()> {
    let mlp = Mlp::new(&[784, 256, 256, 10], 0)?;
    let adamw = AdamW::new(1e-3);
    let scaler = GradScaler::new(AdamW::new(1e-3));
    let (f32_accuracy, f32_kernels) = train(step(&mlp, &adamw, None, None)?, &mlp)?;
    assert!(f32_accuracy > 0.9, "f32 trains: {f32_accuracy}");
    let scaled_kernels = step(&mlp, &scaler, Some(&scaler), None)?.graph().launches();
    let bf16 = train(step(&mlp, &adamw, None, Some(Autocast::BF16))?, &mlp)?;
    let f16 = train(
        step(&mlp, &scaler, Some(&scaler), Some(Autocast::F16))?,
        &mlp,
    )?;
    for (what, (accuracy, kernels), f32_kernels) in [
        ("bf16", bf16, f32_kernels),
        ("f16 scaled", f16, scaled_kernels),
    ] {
        assert!(
            (accuracy - f32_accuracy).abs() <= 0.01,
            "{what}: test accuracy {accuracy}, f32's {f32_accuracy}"
        );
        assert_eq!(kernels, f32_kernels, "{what}: kernels per step");
    }
    Ok(())
}
