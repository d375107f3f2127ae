//! Attention as one kernel on the CPU (`Op::Attention`, found by the
//! optimizer's `attention` stage) against the interpreter running the ops
//! it stands for, on awkward sizes: queries that straddle the kernel's
//! blocks and batches, keys past one block, permuted and broadcast
//! operands, bool, additive and causal masks, a query every key is hidden
//! from, and a plain softmax between two products (ONNX's form); and where
//! it is not found: a training step that reads the softmax again, and
//! attention without a mask over a few keys.

use kiln::{CompileOptions, CompiledGraph, Device, Options, Result, Tensor};
use kiln_ir::Op;
use kiln_ir::kernel::KernelKind;

/// `f` compiled on `device`, fused or not.
fn compiled(
    device: Device,
    fusion: bool,
    t: &[Tensor],
    f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<CompiledGraph> {
    let specs: Vec<_> = t.iter().map(|t| t.ty().clone()).collect();
    let options = CompileOptions {
        device,
        optimizer: Options {
            fusion,
            ..Options::default()
        },
        ..CompileOptions::default()
    };
    kiln::compile_with("attention", &specs, options, f)
}

/// How many attention kernels the compiled graph launches.
fn attentions(g: &CompiledGraph) -> usize {
    let graph = &g.optimized().graph;
    (graph.nodes.iter())
        .filter(
            |n| matches!(&n.op, Op::Kernel(k) if matches!(k.kind, KernelKind::Attention { .. })),
        )
        .count()
}

/// Checks `f`'s outputs on the CPU (fused: `found` attention kernels;
/// unfused: none) against the interpreter's, NaN where it is NaN.
fn check(
    name: &str,
    t: &[Tensor],
    found: usize,
    f: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<()> {
    let args: Vec<&Tensor> = t.iter().collect();
    let want = compiled(Device::Reference, true, t, f)?.call(&args)?;
    for (fusion, kernels) in [(true, found), (false, 0)] {
        let mut g = compiled(Device::Cpu, fusion, t, f)?;
        assert_eq!(attentions(&g), kernels, "{name}, fusion {fusion}");
        for (out, (got, want)) in g.call(&args)?.iter().zip(&want).enumerate() {
            let (got, want) = (got.to_vec::<f32>()?, want.to_vec::<f32>()?);
            assert_eq!(got.len(), want.len(), "{name}, output {out}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // As `tests/attention.rs`: scores reach |x| ~ 30 here, and
                // e^x carries the rounding of x (30 x 2^-24) into its result.
                let close = (g - w).abs() <= 1e-5 * w.abs().max(1.0);
                assert!(
                    close || (g.is_nan() && w.is_nan()),
                    "{name}, fusion {fusion}, output {out}, element {i}: {g} against {w}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn attention_with_a_mask_over_two_blocks_of_keys() -> Result<()> {
    // Queries [2, 67, 3, 40] read as [2, 3, 67, 40]; keys and values of
    // one head broadcast over three; 600 keys, four blocks of 128 and one
    // of 88; a bool mask broadcast over the batch with one query hidden
    // from every key.
    let (l, s) = (67, 600);
    let kept: Vec<bool> = (0..l * s)
        .map(|x| x / s != 5 && (x % 7 != 3 || x % s == 0))
        .collect();
    let t = [
        Tensor::randn([2, l, 3, 40], 1)?,
        Tensor::randn([2, 1, s, 40], 2)?,
        Tensor::randn([2, 1, s, 24], 3)?,
        Tensor::from_vec(kept, [l, s])?,
    ];
    let f = |t: &[Tensor]| {
        let q = t[0].permute(&[0, 2, 1, 3])?;
        let y = q.scaled_dot_product_attention(&t[1], &t[2], Some(&t[3]), false, Some(0.2))?;
        Ok(vec![y])
    };
    check("masked", &t, 1, &f)?;
    // The first 300 keys hidden from every query: the first blocks the
    // kernel reads are past them.
    let late: Vec<bool> = (0..l * s).map(|x| x % s >= 300).collect();
    let t = [
        t[0].clone(),
        t[1].clone(),
        t[2].clone(),
        Tensor::from_vec(late, [l, s])?,
    ];
    check("late keys", &t, 1, &f)
}

#[test]
fn causal_attention_with_an_added_mask_and_no_scale() -> Result<()> {
    let (l, s) = (130, 130);
    let t = [
        Tensor::randn([1, 4, l, 32], 4)?,
        Tensor::randn([1, 4, s, 32], 5)?,
        Tensor::randn([1, 4, s, 32], 6)?,
        Tensor::randn([4, l, s], 7)?,
    ];
    check("causal", &t[..3], 1, &|t| {
        let y = t[0].scaled_dot_product_attention(&t[1], &t[2], None, true, None)?;
        Ok(vec![y])
    })?;
    check("added", &t, 1, &|t| {
        let y = t[0].scaled_dot_product_attention(&t[1], &t[2], Some(&t[3]), false, None)?;
        Ok(vec![y.relu()?])
    })
}

#[test]
fn a_plain_softmax_between_two_products_is_one_kernel() -> Result<()> {
    // ONNX's form of attention written by hand: the scores over a
    // constant, no guard, so that a query every key is hidden from gets
    // NaN, as the ops give.
    let mut hidden = vec![0.0f32; 70 * 90];
    hidden[3 * 90..4 * 90].fill(f32::NEG_INFINITY);
    let t = [
        Tensor::randn([3, 70, 16], 8)?,
        Tensor::randn([3, 16, 90], 9)?,
        Tensor::randn([3, 90, 20], 10)?,
        Tensor::from_vec(hidden, [70, 90])?,
    ];
    check("plain", &t, 1, &|t| {
        let scores = t[0].matmul(&t[1])?.div(&Tensor::scalar(8.0f32))?;
        let y = scores.add(&t[3])?.softmax(-1)?.matmul(&t[2])?;
        Ok(vec![y])
    })
}

#[test]
fn softmax_weights_read_again_and_a_few_keys_stay_as_ops() -> Result<()> {
    let t = [
        Tensor::randn([2, 64, 16], 11)?,
        Tensor::randn([2, 80, 16], 12)?,
        Tensor::randn([2, 80, 8], 13)?,
    ];
    check("read again", &t, 0, &|t| {
        let w = t[0].matmul(&t[1].transpose(-2, -1)?)?.softmax(-1)?;
        Ok(vec![w.matmul(&t[2])?, w])
    })?;
    // 64 queries by 80 keys: too few scores to be worth a kernel without a
    // mask, whose blocks it could skip.
    check("few", &t, 0, &|t| {
        let y = t[0].scaled_dot_product_attention(&t[1], &t[2], None, false, None)?;
        Ok(vec![y])
    })
}

#[test]
fn what_is_not_attention_stays_as_ops() -> Result<()> {
    let t = [
        Tensor::randn([2, 64, 16], 17)?,
        Tensor::randn([2, 64, 16], 18)?,
        Tensor::randn([2, 64, 8], 19)?,
        Tensor::randn([2, 64, 64], 20)?,
    ];
    let scores = |t: &[Tensor]| t[0].matmul(&t[1].transpose(-2, -1)?);
    check("softmax over the queries", &t, 0, &|t| {
        let w = scores(t)?.add(&t[3])?.softmax(-2)?;
        Ok(vec![w.matmul(&t[2])?])
    })?;
    check("scaled by a tensor", &t, 0, &|t| {
        let w = scores(t)?.mul(&t[3])?.add(&t[3])?.softmax(-1)?;
        Ok(vec![w.matmul(&t[2])?])
    })?;
    check("biased by the scores", &t, 0, &|t| {
        let x = scores(t)?;
        Ok(vec![x.add(&x)?.softmax(-1)?.matmul(&t[2])?])
    })
}

#[test]
fn attention_without_a_mask_over_many_keys() -> Result<()> {
    let t = [
        Tensor::randn([1, 2, 260, 16], 14)?,
        Tensor::randn([1, 2, 260, 16], 15)?,
        Tensor::randn([1, 2, 260, 8], 16)?,
    ];
    check("unmasked", &t, 1, &|t| {
        let y = t[0].scaled_dot_product_attention(&t[1], &t[2], None, false, None)?;
        Ok(vec![y])
    })
}
