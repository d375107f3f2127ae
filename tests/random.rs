//! Random numbers inside the graph: `Tensor::uniform` gives
//! `kiln_ir::random::uniform(key, position)` bit for bit on every path (the
//! CPU and the interpreter, compiled fused and unfused), read through views
//! and fused into other work; its draws look uniform; `dropout` zeroes
//! about `p` of the elements and scales the rest, its gradient alike; a
//! compiled step with `nn::Dropout` draws a new mask each step from the key
//! it carries, as the same steps run eagerly do.

// The paths' checks this file does not use (`close`) are the index tests'.
#[allow(dead_code)]
mod paths;

use kiln::nn::{Dropout, Module};
use kiln::{DType, Result, Tensor, TensorType};
use kiln_ir::random::uniform;
use paths::check;

fn key(k: i32) -> Tensor {
    Tensor::scalar(k)
}

#[test]
fn draws_are_threefry_of_the_position_on_every_path() -> Result<()> {
    for dims in [
        vec![5usize, 7],
        vec![1027],
        vec![3, 1, 4],
        vec![],
        vec![0, 3],
    ] {
        let n: usize = dims.iter().product();
        let want: Vec<f64> = (0..n).map(|i| f64::from(uniform(-77, i as i32))).collect();
        check(
            &format!("uniform {dims:?}"),
            &[key(-77)],
            |t| Tensor::uniform(&t[0], dims.clone()),
            DType::F32,
            &dims,
            &want,
        )?;
    }
    Ok(())
}

#[test]
fn draws_read_through_views_and_fused_keep_their_positions() -> Result<()> {
    // Element [i, j] of the transposed draw is draw [j, i].
    let want: Vec<f64> = (0..35)
        .map(|e| {
            let (i, j) = (e / 5, e % 5);
            f64::from(uniform(9, j * 7 + i) * 2.0)
        })
        .collect();
    check(
        "2 * uniform([5, 7])ᵀ",
        &[key(9)],
        |t| Tensor::uniform(&t[0], [5, 7])?.t()? * 2.0f32,
        DType::F32,
        &[7, 5],
        &want,
    )?;
    // A slice of a draw is those positions of the whole draw.
    let want: Vec<f64> = (0..3).map(|i| f64::from(uniform(9, 10 + 2 * i))).collect();
    check(
        "uniform([20])[10..15:2]",
        &[key(9)],
        |t| Tensor::uniform(&t[0], [20])?.slice(0, 10, 15, 2),
        DType::F32,
        &[3],
        &want,
    )
}

#[test]
fn draws_look_uniform_and_keys_give_new_draws() -> Result<()> {
    let n = 1 << 16;
    let a = Tensor::uniform(&key(1), [n])?.to_vec::<f32>()?;
    let b = Tensor::uniform(&key(2), [n])?.to_vec::<f32>()?;
    assert!(a.iter().all(|&u| (0.0..1.0).contains(&u)));
    let mean = a.iter().map(|&u| f64::from(u)).sum::<f64>() / n as f64;
    let var = a
        .iter()
        .map(|&u| (f64::from(u) - mean).powi(2))
        .sum::<f64>()
        / n as f64;
    // Standard errors: 1/sqrt(12 n) for the mean, about 0.0011; a tenth
    // of that for the variance.
    assert!((mean - 0.5).abs() < 0.006, "mean {mean}");
    assert!((var - 1.0 / 12.0).abs() < 0.003, "variance {var}");
    // Sixteen bins, each within 5 standard deviations of n / 16.
    let mut bins = [0usize; 16];
    for &u in &a {
        bins[(u * 16.0) as usize] += 1;
    }
    let (expected, sd) = (n as f64 / 16.0, (n as f64 / 16.0 * 15.0 / 16.0).sqrt());
    assert!(
        bins.iter().all(|&c| (c as f64 - expected).abs() < 5.0 * sd),
        "{bins:?}"
    );
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(same < 10, "{same} equal draws under two keys");
    Ok(())
}

#[test]
fn dropout_zeroes_about_p_and_scales_the_rest_with_its_gradient() -> Result<()> {
    let x = (Tensor::rand([100, 300], 3)? + 0.5f32)?;
    let p = 0.3f32;
    // 1 / (1 - p) rounded once, from f64.
    let scale = (1.0 / (1.0 - f64::from(p))) as f32;
    let y = x.dropout(p, &key(5))?;
    let (xs, ys) = (x.to_vec::<f32>()?, y.to_vec::<f32>()?);
    let dropped = ys.iter().filter(|&&v| v == 0.0).count() as f64 / ys.len() as f64;
    assert!((dropped - 0.3).abs() < 0.01, "dropped {dropped}");
    for (i, (&a, &b)) in xs.iter().zip(&ys).enumerate() {
        let kept = uniform(5, i as i32) >= p;
        let want = if kept { a * scale } else { 0.0 };
        assert_eq!(b, want, "element {i}");
    }
    let w = Tensor::randn([100, 300], 4)?;
    let loss = (x.dropout(p, &key(5))? * &w)?.sum_all()?;
    let grad = kiln::grad(&loss, &[&x])?.remove(0).to_vec::<f32>()?;
    for (i, (g, w)) in grad.iter().zip(w.to_vec::<f32>()?).enumerate() {
        let want = if uniform(5, i as i32) >= p {
            w * scale
        } else {
            0.0
        };
        assert_eq!(*g, want, "gradient {i}");
    }
    assert_eq!(x.dropout(0.0, &key(5))?.to_vec::<f32>()?, xs);
    assert!(
        x.dropout(1.0, &key(5))?
            .to_vec::<f32>()?
            .iter()
            .all(|&v| v == 0.0)
    );
    Ok(())
}

#[test]
fn bad_keys_and_probabilities_are_errors() -> Result<()> {
    let message = |r: Result<Tensor>| r.err().map(|e| e.to_string());
    assert_eq!(
        message(Tensor::uniform(&Tensor::scalar(1i64), [3])).as_deref(),
        Some("uniform: the key must be one i32, not i64[]")
    );
    assert!(message(Tensor::uniform(&Tensor::zeros([2], DType::I32)?, [3])).is_some());
    let x = Tensor::zeros([3], DType::F32)?;
    assert_eq!(
        message(x.dropout(1.5, &key(0))).as_deref(),
        Some("dropout: p must lie in [0, 1], not 1.5")
    );
    assert!(Dropout::new(-0.1, 0).is_err());
    let ints = Tensor::zeros([3], DType::I32)?;
    assert!(message(ints.dropout(0.5, &key(0))).is_some_and(|m| m.starts_with("dropout:")));
    // Nothing to draw: no ramp of 2^40 positions is made.
    assert_eq!(Tensor::uniform(&key(0), [0, 1 << 40])?.dims(), [0, 1 << 40]);
    Ok(())
}

/// A step of `h = dropout(x @ w)`, loss `sum(h * h)`, SGD at 0.1: the new
/// weight, the dropout's next key, and the loss.
fn step(drop: &Dropout, w: &Tensor, key: &Tensor, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let layer = drop.with_buffers(std::slice::from_ref(key))?;
    let mut keys = Vec::new();
    let h = layer.forward_train(&x.matmul(w)?, &mut keys)?;
    let loss = (&h * &h)?.sum_all()?;
    let g = kiln::grad(&loss, &[w])?.remove(0);
    Ok(((w - (g * 0.1f32)?)?, keys.remove(0), loss))
}

#[test]
fn a_compiled_step_draws_a_new_mask_each_step_as_eager_steps_do() -> Result<()> {
    let drop = Dropout::new(0.5, 11)?;
    let w = (Tensor::randn([8, 16], 1)? * 0.3f32)?;
    let x = Tensor::randn([4, 8], 2)?;
    let first_key = drop.buffers()[0].1.clone();
    let mut compiled = kiln::compile_step(
        "dropout_step",
        &[&w, &first_key],
        &[TensorType::new(DType::F32, [4, 8])],
        |s, b| {
            let (w, key, loss) = step(&drop, &s[0], &s[1], &b[0])?;
            Ok((vec![loss], vec![w, key]))
        },
    )?;
    let (mut ew, mut ekey) = (w.clone(), first_key);
    let mut losses = Vec::new();
    for k in 0..4 {
        let got = compiled.call(&[&x])?.remove(0).to_scalar::<f32>()?;
        let (nw, nkey, loss) = step(&drop, &ew, &ekey, &x)?;
        let want = loss.to_scalar::<f32>()?;
        assert!(
            (got - want).abs() <= 1e-5 * want.abs(),
            "step {k}: {got} against {want}"
        );
        losses.push(got);
        (ew, ekey) = (nw, nkey);
    }
    let state = compiled.state()?;
    assert_eq!(
        state[1].to_vec::<i32>()?,
        ekey.to_vec::<i32>()?,
        "the key after 4 steps"
    );
    // A new mask each step: the keys differ, and so do the losses.
    assert!(losses.windows(2).all(|l| l[0] != l[1]), "{losses:?}");
    Ok(())
}
