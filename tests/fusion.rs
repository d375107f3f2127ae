//! The optimizer on the mission's patterns: every stage snapshotted (the
//! captured graph, each pass with its notes, the schedule), and the kernel
//! count asserted in code so a lost fusion fails even when snapshots are
//! re-blessed.

use kiln::{DType, Options, Result, Tensor};

/// Snapshots every stage of `outputs` and checks the fused kernel count.
fn check(name: &str, outputs: &[&Tensor], kernels: usize) -> Result<()> {
    let optimized = kiln::optimize(name, outputs, Options::default())?;
    assert_eq!(
        optimized.schedule.kernels(),
        kernels,
        "{name}:\n{}",
        optimized.graph
    );
    let text = kiln::explain(name, outputs, Options::default())?;
    insta::assert_snapshot!(name, text);
    Ok(())
}

fn randn(dims: &[usize], seed: u64) -> Result<Tensor> {
    Tensor::randn(dims, seed)
}

#[test]
fn relu_add_is_one_kernel() -> Result<()> {
    let (a, b) = (randn(&[64, 64], 0)?, randn(&[64, 64], 1)?);
    check("relu_add", &[&(&a + &b)?.relu()?], 1)
}

#[test]
fn relu_mul_add_scale_is_one_kernel() -> Result<()> {
    let (a, b, c) = (
        randn(&[64, 64], 0)?,
        randn(&[64, 64], 1)?,
        randn(&[64, 64], 2)?,
    );
    let y = ((&a * &b)? + &c)?.relu()?;
    check("ew_chain", &[&(y * 0.5f32)?], 1)
}

#[test]
fn matmul_bias_relu_is_one_kernel() -> Result<()> {
    let x = randn(&[64, 784], 0)?;
    let w = randn(&[784, 256], 1)?;
    let b = randn(&[256], 2)?;
    check("matmul_bias_relu", &[&(x.matmul(&w)? + &b)?.relu()?], 1)
}

#[test]
fn bf16_matmul_bias_relu_is_one_kernel() -> Result<()> {
    // The product stays f32 until the epilogue rounds it, in the same
    // kernel: no cast costs a kernel of its own.
    let half = |t: Tensor| -> Result<Tensor> {
        let t = t.cast(DType::BF16)?;
        t.realize()?;
        Ok(t)
    };
    let x = half(randn(&[64, 784], 0)?)?;
    let w = half(randn(&[784, 256], 1)?)?;
    let b = half(randn(&[256], 2)?)?;
    check(
        "bf16_matmul_bias_relu",
        &[&(x.matmul(&w)? + &b)?.relu()?],
        1,
    )
}

#[test]
fn softmax_is_two_kernels() -> Result<()> {
    let x = randn(&[4096, 1000], 0)?;
    check("softmax", &[&x.softmax(-1)?], 2)
}

#[test]
fn log_softmax_is_two_kernels() -> Result<()> {
    let x = randn(&[4096, 10], 0)?;
    check("log_softmax", &[&x.log_softmax(-1)?], 2)
}

#[test]
fn centering_is_one_kernel() -> Result<()> {
    let x = randn(&[64, 100], 0)?;
    check("x_minus_mean", &[&(&x - &x.mean(&[1], true)?)?], 1)
}

#[test]
fn sum_of_squares_is_one_kernel() -> Result<()> {
    let x = randn(&[1000], 0)?;
    check("sum_of_squares", &[&(&x * &x)?.sum_all()?], 1)
}

#[test]
fn normalized_images_are_computed_inside_the_first_layer() -> Result<()> {
    // u8 -> f32, (x/255 - mean)/std, flattened: the prologue of the matmul's
    // left operand, so the layer is one kernel.
    let bytes: Vec<u8> = (0..8 * 28 * 28).map(|i| (i * 37 % 256) as u8).collect();
    let x = Tensor::from_vec(bytes, [8, 28, 28])?;
    let (w, b) = (randn(&[784, 16], 1)?, randn(&[16], 2)?);
    let pixels = ((x.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081);
    let h = (pixels?.reshape([8, 784])?.matmul(&w)? + &b)?.relu()?;
    check("normalized_first_layer", &[&h], 1)
}

#[test]
fn transpose_add_is_one_kernel_with_a_strided_read() -> Result<()> {
    let (a, b) = (randn(&[32, 48], 0)?, randn(&[48, 32], 1)?);
    check("transpose_add", &[&(a.t()? + &b)?], 1)
}

#[test]
fn a_stack_of_many_steps_read_as_rows_is_one_kernel() -> Result<()> {
    // An LSTM's output: its steps' states stacked, then read as one matrix
    // of rows by the next layer's product. Moved below the stack's
    // `where`s, that reshape would make every step's padded view and every
    // condition a copy of its own.
    let steps: Vec<Tensor> = (0..12).map(|t| randn(&[8, 16], t)).collect::<Result<_>>()?;
    let w = randn(&[16, 4], 99)?;
    let stacked = Tensor::stack(&steps.iter().collect::<Vec<_>>(), 0)?;
    let y = stacked.reshape([96, 16])?.matmul(&w)?;
    check("stack_of_steps_as_rows", &[&y], 2)
}

fn mlp3() -> Result<Tensor> {
    let sizes = [784, 256, 256, 10];
    let mut h = randn(&[64, 784], 0)?;
    for (i, pair) in sizes.windows(2).enumerate() {
        let w = randn(&[pair[0], pair[1]], 2 * i as u64 + 1)?;
        let b = randn(&[pair[1]], 2 * i as u64 + 2)?;
        let z = (h.matmul(&w)? + &b)?;
        // relu between layers, none after the last.
        h = if i + 2 < sizes.len() { z.relu()? } else { z };
    }
    Ok(h)
}

#[test]
fn mlp3_forward_is_three_kernels() -> Result<()> {
    check("mlp3", &[&mlp3()?], 3)
}

#[test]
fn mlp3_memory_plan_peaks_at_two_hidden_activations() -> Result<()> {
    let optimized = kiln::optimize("mlp3", &[&mlp3()?], Options::default())?;
    // Layer 2 reads h1 while it writes h2: two [64,256] f32 buffers live at
    // once. The [64,10] logits then reuse h1's slot, so nothing else is added.
    let hidden = 64 * 256 * 4;
    assert_eq!(optimized.schedule.peak_bytes(), 2 * hidden);
    assert_eq!(optimized.schedule.slots, vec![hidden, hidden]);
    Ok(())
}

#[test]
fn fusion_off_gives_one_kernel_per_op() -> Result<()> {
    let x = randn(&[64, 784], 0)?;
    let w = randn(&[784, 256], 1)?;
    let b = randn(&[256], 2)?;
    let y = (x.matmul(&w)? + &b)?.relu()?;
    let off = Options {
        fusion: false,
        ..Options::default()
    };
    let optimized = kiln::optimize("unfused", &[&y], off)?;
    // matmul, add (the broadcast folds into its read), relu.
    assert_eq!(optimized.schedule.kernels(), 3);
    insta::assert_snapshot!(
        "unfused_matmul_bias_relu",
        kiln::explain("unfused", &[&y], off)?
    );
    Ok(())
}

#[test]
fn same_shapes_give_equal_kernels_for_the_cache() -> Result<()> {
    let layer = |seed| -> Result<Tensor> {
        let x = randn(&[8, 16], seed)?;
        let w = randn(&[16, 4], seed + 1)?;
        (x.matmul(&w)? + &randn(&[4], seed + 2)?)?.relu()
    };
    let first = kiln::optimize("a", &[&layer(0)?], Options::default())?;
    let second = kiln::optimize("b", &[&layer(10)?], Options::default())?;
    // Other data, same shapes: the same kernels, so the same cache keys.
    assert_eq!(first.graph.nodes, second.graph.nodes);
    Ok(())
}

/// The graph inputs of `f` compiled over an f32 `[4, 5]` placeholder on
/// `device`, whether the compiled graph multiplies, and its value at `x`.
fn compiled_inputs(
    device: kiln::Device,
    x: &Tensor,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<(Vec<String>, bool, Vec<f32>)> {
    let spec = kiln::TensorType::new(DType::F32, [4, 5]);
    let mut compiled =
        kiln::compile_with("folded", &[spec], kiln::CompileOptions::on(device), |p| {
            Ok(vec![f(&p[0])?])
        })?;
    let inputs = (compiled.optimized().graph.inputs.iter())
        .map(|ty| ty.to_string())
        .collect();
    let multiplies = compiled.optimized().graph.to_string().contains(" mul ");
    let y = compiled.call(&[x])?.remove(0).to_vec::<f32>()?;
    Ok((inputs, multiplies, y))
}

#[test]
fn values_of_captured_weights_alone_are_computed_when_compiling() -> Result<()> {
    let (w, bias) = (randn(&[7, 5], 1)?, randn(&[7], 2)?);
    // The scaled transpose and the doubled bias read captured weights
    // alone: each is computed once and captured in its place, the bias
    // below its broadcast (a [7], never the [4, 7] it is read as). The
    // placeholder's value is computed per call.
    let f = |x: &Tensor| -> Result<Tensor> {
        let scaled = (w.t()? * 0.5f32)?;
        x.matmul(&scaled)?.add(&(&bias * 2.0f32)?.expand([4, 7])?)
    };
    let x = randn(&[4, 5], 3)?;
    let want = f(&x)?.to_vec::<f32>()?;
    for device in [kiln::Device::Reference, kiln::Device::Cpu] {
        let (inputs, multiplies, y) = compiled_inputs(device, &x, f)?;
        assert_eq!(inputs, ["f32[4,5]", "f32[5,7]", "f32[7]"], "{device:?}");
        assert!(!multiplies, "{device:?}");
        for (a, b) in y.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{device:?}: {a} {b}"
            );
        }
    }
    // Read as a view alone, a weight stays the captured value it is; views
    // over a computed one stay views over the folded value (the product
    // reads the scaled weight transposed, where it lies).
    let (inputs, _, _) = compiled_inputs(kiln::Device::Cpu, &x, |x| x.matmul(&w.t()?))?;
    assert_eq!(inputs, ["f32[4,5]", "f32[7,5]"]);
    let (inputs, multiplies, y) =
        compiled_inputs(kiln::Device::Cpu, &x, |x| x.matmul(&(&w * 0.5f32)?.t()?))?;
    assert_eq!(inputs, ["f32[4,5]", "f32[7,5]"]);
    assert!(!multiplies);
    let want = x.matmul(&(&w * 0.5f32)?.t()?)?.to_vec::<f32>()?;
    for (a, b) in y.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} {b}");
    }
    Ok(())
}
