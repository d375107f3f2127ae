//! The plans of matmul kernels (`kiln_runtime::matmul`), made for kiln's CPU
//! cores and for cuBLASLt from the same kernels: a bias and ReLU the GEMM
//! applies, bytes normalized on the way into the product and into its
//! weight gradient (written transposed for the CPU), a convolution's
//! windows (read in place through tables on the CPU, copied for CUDA), and
//! batch axes swapped by a permute, mixed precision's operands written as
//! bf16. A change to either backend's decisions shows up here as a
//! reviewable diff.

use kiln::{Autocast, DType, Options, Result, Tensor};
use kiln_ir::Op;
use kiln_ir::kernel::{Kernel, KernelKind};
use kiln_runtime::matmul::{Target, plan};

/// The plans of every matmul kernel of `outputs`, optimized, for the CPU
/// and for CUDA in TF32.
fn plans(name: &str, outputs: &[&Tensor]) -> Result<String> {
    plans_on(
        name,
        outputs,
        &[(Target::CPU, "cpu"), (Target::cuda(true), "cuda")],
    )
}

/// The plans of every matmul kernel of `outputs`, optimized, for each
/// target.
fn plans_on(name: &str, outputs: &[&Tensor], targets: &[(Target, &str)]) -> Result<String> {
    plans_with(name, outputs, Options::default(), targets)
}

/// `plans_on` with the optimizer's `options`.
fn plans_with(
    name: &str,
    outputs: &[&Tensor],
    options: Options,
    targets: &[(Target, &str)],
) -> Result<String> {
    let optimized = kiln::optimize(name, outputs, options)?;
    let mut text = String::new();
    for launch in &optimized.schedule.launches {
        let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
            continue;
        };
        let kernel: &Kernel = kernel;
        if !matches!(kernel.kind, KernelKind::MatMul { .. }) {
            continue;
        }
        for &(target, on) in targets {
            let plan = plan(kernel, target).map_err(kiln::Error::from)?;
            text += &format!("// {} on {on}\n{plan}", launch.node);
        }
    }
    Ok(text)
}

#[test]
fn a_bias_and_relu_are_the_gemms_own() -> Result<()> {
    let (x, w, b) = (
        Tensor::randn([64, 96], 0)?,
        Tensor::randn([96, 32], 1)?,
        Tensor::randn([32], 2)?,
    );
    // ReLU6 without a bias, the GEMM's too.
    let relu6 = x
        .matmul(&Tensor::randn([96, 32], 3)?)?
        .maximum(&Tensor::scalar(0.0f32))?
        .minimum(&Tensor::scalar(6.0f32))?;
    insta::assert_snapshot!(plans("dense", &[&(x.matmul(&w)? + &b)?.relu()?, &relu6])?);
    Ok(())
}

#[test]
fn bf16_operands_are_read_as_they_are_by_a_bf16_gemm() -> Result<()> {
    // Widened to f32 by `pass::widen`, the operands are casts: read in
    // place by a GEMM that multiplies bf16 (kiln's CPU cores, which widen
    // them as they pack them or multiply them on AMX; cuBLASLt), the bias
    // and ReLU left to the kernel's epilogue after it, over the product in
    // scratch; a bare product's rounding to bf16 is that epilogue too on
    // the CPU, and cuBLASLt's own store. cuBLAS's sgemm (IEEE f32)
    // multiplies f32 alone: the operands are written as f32 for it.
    let (x, w, b) = (
        Tensor::randn([64, 96], 0)?.cast(DType::BF16)?,
        Tensor::randn([96, 32], 1)?.cast(DType::BF16)?,
        Tensor::randn([32], 2)?.cast(DType::BF16)?,
    );
    for t in [&x, &w, &b] {
        t.realize()?;
    }
    let targets = [
        (Target::CPU, "cpu"),
        (Target::cuda(true), "cuda"),
        (Target::cuda(false), "cuda f32"),
    ];
    let y = (x.matmul(&w)? + &b)?.relu()?;
    // The same product in f32 of the bf16 values, its bias and ReLU in f32:
    // the f32 GEMM's own, a kernel after the bf16 GEMM.
    let f32s =
        (x.cast(DType::F32)?.matmul(&w.cast(DType::F32)?)? + &b.cast(DType::F32)?)?.relu()?;
    let text = plans_on("dense_bf16", &[&y], &targets)?
        + &plans_on("f32_of_bf16", &[&f32s], &targets)?
        + &plans_on("bf16_product", &[&x.matmul(&w)?], &targets)?;
    insta::assert_snapshot!(text);
    Ok(())
}

#[test]
fn normalized_bytes_are_written_and_transposed_for_the_weight_gradient() -> Result<()> {
    let bytes = Tensor::from_vec(
        (0..8 * 20)
            .map(|i| (i * 7 % 256) as u8)
            .collect::<Vec<u8>>(),
        [8, 20],
    )?;
    let x = (bytes.cast(DType::F32)? * (1.0f32 / 255.0))?;
    let g = Tensor::randn([8, 5], 1)?;
    let forward = x.matmul(&Tensor::randn([20, 5], 2)?)?;
    let weight_gradient = x.t()?.matmul(&g)?;
    insta::assert_snapshot!(plans("normalized", &[&forward, &weight_gradient])?);
    Ok(())
}

#[test]
fn convolution_windows_are_read_in_place_or_copied() -> Result<()> {
    let x = Tensor::randn([2, 3, 9, 9], 0)?;
    let w = Tensor::randn([4, 3, 3, 3], 1)?;
    insta::assert_snapshot!(plans(
        "conv",
        &[&x.conv2d(&w, None, [1, 1], [(1, 1), (1, 1)], [1, 1], 1)?]
    )?);
    Ok(())
}

#[test]
fn a_convolutions_bias_per_channel_and_relu6_are_the_cpu_gemms_own() -> Result<()> {
    // A value per row of each image's product, then ReLU6: kiln's cores
    // apply them as they store; cuBLASLt's bias is per column and it has no
    // cap, so CUDA keeps the kernel.
    let x = Tensor::randn([2, 3, 6, 5], 0)?;
    let w = Tensor::randn([4, 3, 1, 1], 1)?;
    let b = Tensor::randn([4], 2)?;
    let y = x.conv2d(&w, Some(&b), [1, 1], [(0, 0), (0, 0)], [1, 1], 1)?;
    // ReLU6 as ONNX's Clip imports it: the cap is 6.0's bits.
    let relu6 = y
        .maximum(&Tensor::scalar(0.0f32))?
        .minimum(&Tensor::scalar(6.0f32))?;
    insta::assert_snapshot!(plans("conv_bias", &[&relu6])?);
    Ok(())
}

#[test]
fn batch_axes_of_one_stride_are_read_in_place() -> Result<()> {
    let w = Tensor::randn([2, 3, 5, 6], 1)?;
    let in_place = Tensor::randn([2, 3, 4, 5], 0)?.matmul(&w)?;
    let swapped = Tensor::randn([3, 2, 4, 5], 0)?
        .permute(&[1, 0, 2, 3])?
        .matmul(&w)?;
    insta::assert_snapshot!(plans("batched", &[&in_place, &swapped])?);
    Ok(())
}

#[test]
fn mixed_precision_operands_are_written_for_the_faster_gemm() -> Result<()> {
    // Under bf16 autocast: a hidden value read by two products (one
    // transposed) and the inputs, each rounded by the product's prologue
    // and written as bf16 for a GEMM whose bf16 is the faster (cuBLASLt,
    // kiln's cores on AMX; after the operands, the product where an
    // epilogue kernel reads it), as f32 for the others (kiln's AVX cores,
    // cuBLAS's sgemm); a bf16 input (read where it lies) times a rounded
    // weight; a bf16 image through a convolution's padding, copied as f32
    // (as a view that pads a product's operand is), so that its product is
    // f32's.
    let (x, w, v, g) = (
        Tensor::randn([64, 96], 0)?,
        Tensor::randn([96, 40], 1)?,
        Tensor::randn([40, 24], 2)?,
        Tensor::randn([64, 16], 3)?,
    );
    let h = x.matmul(&w)?.relu()?;
    let (y, z, hh) = (h.matmul(&v)?, h.t()?.matmul(&g)?, h.mul(&h)?);
    let half = Tensor::randn([64, 96], 4)?.cast(DType::BF16)?;
    let image = Tensor::randn([1, 3, 9, 9], 5)?.cast(DType::BF16)?;
    for t in [&half, &image] {
        t.realize()?;
    }
    let mixed = half.cast(DType::F32)?.matmul(&w)?;
    let filter = Tensor::randn([4, 3, 3, 3], 6)?;
    let conv =
        (image.cast(DType::F32)?).conv2d(&filter, None, [1, 1], [(1, 1), (1, 1)], [1, 1], 1)?;
    let options = Options {
        autocast: Some(Autocast::BF16),
        ..Options::default()
    };
    let targets = [
        (Target::CPU, "cpu"),
        // `Target::cpu` on the AMX path.
        (
            Target {
                bf16_faster: true,
                ..Target::CPU
            },
            "cpu amx",
        ),
        (Target::cuda(true), "cuda"),
        (Target::cuda(false), "cuda f32"),
    ];
    let outputs = [&y, &z, &hh, &mixed, &conv];
    insta::assert_snapshot!(plans_with("autocast", &outputs, options, &targets)?);
    Ok(())
}
