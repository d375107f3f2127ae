//! `Tensor::scaled_dot_product_attention` against its definition, computed
//! here in f64, on awkward sizes with the batch axes broadcast: no mask, an
//! additive mask, a bool mask, causal, a given scale; the same on the CPU
//! compiled, fused and unfused, and on the interpreter; a query every key
//! is hidden from gets zeros, as in PyTorch; its gradients flow; misuse is
//! an `Err` naming the op.

use kiln::{CompileOptions, DType, Device, Options, Result, Tensor};

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

/// `f` of the inputs on `device`, fused or not, read back.
fn on(
    device: Device,
    fusion: bool,
    t: &[Tensor],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<Vec<f32>> {
    let specs: Vec<_> = t.iter().map(|t| t.ty().clone()).collect();
    let options = CompileOptions {
        device,
        optimizer: Options {
            fusion,
            ..Options::default()
        },
        ..CompileOptions::default()
    };
    let mut g = kiln::compile_with("attention", &specs, options, |x| Ok(vec![f(x)?]))?;
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
