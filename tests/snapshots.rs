//! The captured graphs of the mission's patterns, as printed IR. A change to
//! what the Tensor API records shows up here as a reviewable diff
//! (`INSTA_UPDATE=always cargo test` rewrites them; review with `git diff`).

use kiln::{Result, Tensor};

fn mlp_layer(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    (x.matmul(w)? + b)?.relu()
}

#[test]
fn relu_add() -> Result<()> {
    let (a, b) = (Tensor::randn([4, 4], 0)?, Tensor::randn([4, 4], 1)?);
    let y = (&a + &b)?.relu()?;
    insta::assert_snapshot!(kiln::capture("relu_add", &[&y]));
    Ok(())
}

#[test]
fn mlp_layer_relu_xw_plus_b() -> Result<()> {
    let x = Tensor::randn([64, 784], 0)?;
    let w = Tensor::randn([784, 256], 1)?;
    let b = Tensor::randn([256], 2)?;
    insta::assert_snapshot!(kiln::capture("mlp_layer", &[&mlp_layer(&x, &w, &b)?]));
    Ok(())
}

#[test]
fn softmax_4x10() -> Result<()> {
    let x = Tensor::randn([4, 10], 0)?;
    insta::assert_snapshot!(kiln::capture("softmax", &[&x.softmax(-1)?]));
    Ok(())
}

#[test]
fn mlp3_forward() -> Result<()> {
    let x = Tensor::randn([64, 784], 0)?;
    let sizes = [784, 256, 256, 10];
    let mut h = x;
    for (i, pair) in sizes.windows(2).enumerate() {
        let w = Tensor::randn([pair[0], pair[1]], 2 * i as u64 + 1)?;
        let b = Tensor::randn([pair[1]], 2 * i as u64 + 2)?;
        let z = (h.matmul(&w)? + &b)?;
        // relu between layers, none after the last.
        h = if i + 2 < sizes.len() { z.relu()? } else { z };
    }
    insta::assert_snapshot!(kiln::capture("mlp3", &[&h]));
    Ok(())
}

#[test]
fn printed_form_of_every_kind_of_op() -> Result<()> {
    let x = Tensor::randn([2, 3], 0)?;
    let n = Tensor::arange(0, 3);
    let views = x
        .t()?
        .slice(0, 0, 3, 2)?
        .pad(&[(1, 0), (0, 1)], 0.5f32)?
        .reshape([9])?;
    let picked = n
        .cast(kiln::DType::F32)?
        .lt(&Tensor::scalar(1.5f32))?
        .where_cond(&x, &Tensor::scalar(-1.0f32))?;
    let out = (views.sum(&[0], true)? + picked.max(&[0, 1], false)?)?;
    insta::assert_snapshot!(kiln::capture("every_op", &[&out]));
    Ok(())
}
