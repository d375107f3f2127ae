//! `Tensor::scaled_dot_product_attention` against its definition, computed
//! here in f64, on awkward sizes with the batch axes broadcast: no mask, an
//! additive mask, a bool mask, causal, a given scale; the same on the CPU
//! compiled, fused and unfused, and on the interpreter; a query every key
//! is hidden from gets zeros, as in PyTorch; its gradients flow; misuse is
//! an `Err` naming the op.
//!
//! Then attention as one kernel on the CPU (`Op::Attention`, found by the
//! optimizer's `attention` stage) against the interpreter running the ops
//! it stands for, on sizes where it is found: queries that straddle the
//! kernel's blocks and batches, keys past one block, permuted and
//! broadcast operands, bool, additive and causal masks, a query every key
//! is hidden from, and a plain softmax between two products (ONNX's form);
//! and where it is not: softmax weights read again, attention without a
//! mask over a few keys, and ops that are not attention.
use kiln::{CompileOptions, CompiledGraph, DType, Device, Options, Result, Tensor};
use kiln_ir::Op;
use kiln_ir::kernel::KernelKind;

/// Batch axes of the queries (the keys' broadcast over the first), query
/// and key lengths, and the two head sizes.
const Q_BATCH: [usize; 2] = [2, 3];
const L: usize = 5;
const S: usize = 7;
const E: usize = 4;
const EV: usize = 6;

/// What a test masks with: values to add, or to keep where true (`[L,
/// S]`), or causal.
enum Mask {
    None,
    Added(Vec<f32>),
    Kept(Vec<bool>),
    Causal,
}

impl Mask {
    /// The mask and `causal` arguments it is.
    fn args(&self) -> Result<(Option<Tensor>, bool)> {
        Ok(match self {
            Mask::None => (None, false),
            Mask::Added(m) => (Some(Tensor::from_vec(m.clone(), [L, S])?), false),
            Mask::Kept(m) => (Some(Tensor::from_vec(m.clone(), [L, S])?), false),
            Mask::Causal => (None, true),
        })
    }
}

/// `softmax(q kᵀ · scale + bias) v` by the definition, `q` `[b, L, E]`,
/// `k` `[1, S, E]` broadcast over `b`, `v` `[1, S, EV]`, a mask `[L, S]`.
fn definition(q: &[f32], k: &[f32], v: &[f32], mask: &Mask, scale: f64) -> Vec<f64> {
    let b = q.len() / (L * E);
    let mut out = Vec::with_capacity(b * L * EV);
    for n in 0..b {
        for i in 0..L {
            let scores: Vec<f64> = (0..S)
                .map(|j| {
                    let dot: f64 = (0..E)
                        .map(|e| f64::from(q[(n * L + i) * E + e]) * f64::from(k[j * E + e]))
                        .sum();
                    let bias = match mask {
                        Mask::None => 0.0,
                        Mask::Added(m) => f64::from(m[i * S + j]),
                        Mask::Kept(m) if m[i * S + j] => 0.0,
                        Mask::Kept(_) => f64::NEG_INFINITY,
                        Mask::Causal if j <= i => 0.0,
                        Mask::Causal => f64::NEG_INFINITY,
                    };
                    dot * scale + bias
                })
                .collect();
            let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            for c in 0..EV {
                let sum: f64 = (0..S).map(|j| weights[j] * f64::from(v[j * EV + c])).sum();
                out.push(sum / total);
            }
        }
    }
    out
}

fn inputs() -> Result<[Tensor; 3]> {
    let mut q_dims = Q_BATCH.to_vec();
    q_dims.extend([L, E]);
    Ok([
        Tensor::randn(q_dims, 1)?,
        Tensor::randn([1, 1, S, E], 2)?,
        Tensor::randn([1, 1, S, EV], 3)?,
    ])
}

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

/// `f` of the inputs on `device`, fused or not, read back.
fn on(
    device: Device,
    fusion: bool,
    t: &[Tensor],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Vec<f32>> {
    let mut g = compiled(device, fusion, t, &|x| Ok(vec![f(x)?]))?;
    g.call(&t.iter().collect::<Vec<_>>())?
        .remove(0)
        .to_vec::<f32>()
}

#[test]
fn attention_matches_its_definition_with_every_mask() -> Result<()> {
    let [q, k, v] = inputs()?;
    let (qv, kv, vv) = (q.to_vec::<f32>()?, k.to_vec::<f32>()?, v.to_vec::<f32>()?);
    let kept: Vec<bool> = (0..L * S).map(|x| x % 3 != 1 || x % S == 0).collect();
    let cases = [
        ("no mask", Mask::None, None),
        (
            "added",
            Mask::Added(Tensor::randn([L, S], 4)?.to_vec()?),
            None,
        ),
        ("kept", Mask::Kept(kept), None),
        ("causal", Mask::Causal, None),
        ("scaled", Mask::None, Some(0.3)),
    ];
    for (name, mask, scale) in cases {
        let (tensor, causal) = mask.args()?;
        let f = |t: &[Tensor]| {
            t[0].scaled_dot_product_attention(&t[1], &t[2], tensor.as_ref(), causal, scale)
        };
        let want = definition(
            &qv,
            &kv,
            &vv,
            &mask,
            scale.unwrap_or(1.0 / (E as f64).sqrt()),
        );
        let mut dims = Q_BATCH.to_vec();
        dims.extend([L, EV]);
        let eager = f(&[q.clone(), k.clone(), v.clone()])?;
        assert_eq!(eager.dims(), dims, "{name}");
        let runs = [
            ("eager", eager.to_vec::<f32>()?),
            (
                "fused",
                on(Device::Cpu, true, &[q.clone(), k.clone(), v.clone()], &f)?,
            ),
            (
                "unfused",
                on(Device::Cpu, false, &[q.clone(), k.clone(), v.clone()], &f)?,
            ),
            (
                "interpreter",
                on(
                    Device::Reference,
                    true,
                    &[q.clone(), k.clone(), v.clone()],
                    &f,
                )?,
            ),
        ];
        for (run, got) in runs {
            assert_eq!(got.len(), want.len(), "{name}, {run}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{name}, {run}, element {i}: {g} against {w}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn a_query_with_every_key_hidden_gets_zeros() -> Result<()> {
    let [q, k, v] = inputs()?;
    let mut kept = vec![true; L * S];
    kept[2 * S..3 * S].fill(false);
    let mask = Tensor::from_vec(kept, [L, S])?;
    let y = q.scaled_dot_product_attention(&k, &v, Some(&mask), false, None)?;
    let y = y.to_vec::<f32>()?;
    for (i, value) in y.iter().enumerate() {
        let row = (i / EV) % L;
        assert!(value.is_finite(), "element {i}: {value}");
        assert_eq!(*value == 0.0, row == 2, "element {i}: {value}");
    }
    // Nor does its gradient carry NaN to the keys and values.
    let loss = q
        .scaled_dot_product_attention(&k, &v, Some(&mask), false, None)?
        .sum_all()?;
    for g in kiln::grad(&loss, &[&q, &k, &v])? {
        assert!(
            g.to_vec::<f32>()?.iter().all(|x| x.is_finite()),
            "{}",
            g.ty()
        );
    }
    Ok(())
}

#[test]
fn attention_gradients_flow_to_queries_keys_and_values() -> Result<()> {
    // Against central differences of the definition's loss, in f64.
    let [q, k, v] = inputs()?.map(|t| t.cast(DType::F64).expect("a cast"));
    let loss = |q: &Tensor, k: &Tensor, v: &Tensor| -> Result<Tensor> {
        q.scaled_dot_product_attention(k, v, None, true, None)?
            .square()?
            .sum_all()
    };
    let grads = kiln::grad(&loss(&q, &k, &v)?, &[&q, &k, &v])?;
    for (which, grad) in grads.iter().enumerate() {
        let got = grad.to_vec::<f64>()?;
        for at in [0, got.len() / 2, got.len() - 1] {
            let nudged = |by: f64| -> Result<f64> {
                let mut args = [q.clone(), k.clone(), v.clone()];
                let mut values = args[which].to_vec::<f64>()?;
                values[at] += by;
                args[which] = Tensor::from_vec(values, args[which].dims())?;
                loss(&args[0], &args[1], &args[2])?.to_scalar::<f64>()
            };
            let want = (nudged(1e-6)? - nudged(-1e-6)?) / 2e-6;
            assert!(
                (got[at] - want).abs() <= 1e-6 * want.abs().max(1.0),
                "input {which}, element {at}: {} against {want}",
                got[at]
            );
        }
    }
    Ok(())
}

#[test]
fn misuse_is_an_err_naming_the_op() -> Result<()> {
    let [q, k, v] = inputs()?;
    let mask = Tensor::ones([L, S], DType::Bool)?;
    let wrong = Tensor::ones([1, 1, S, E + 1], DType::F32)?;
    let ints = Tensor::ones([L, S], DType::I32)?;
    let int_values = Tensor::ones([1, 1, S, EV], DType::I32)?;
    let vector = Tensor::ones([S], DType::F32)?;
    let errors = [
        q.scaled_dot_product_attention(&k, &v, Some(&mask), true, None),
        q.scaled_dot_product_attention(&wrong, &v, None, false, None),
        q.scaled_dot_product_attention(&k, &v, Some(&ints), false, None),
        q.scaled_dot_product_attention(&k, &int_values, None, false, None),
        q.scaled_dot_product_attention(&k, &vector, None, false, None),
    ];
    for (i, result) in errors.into_iter().enumerate() {
        let message = result.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("attention"), "case {i}: {message:?}");
    }
    Ok(())
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
