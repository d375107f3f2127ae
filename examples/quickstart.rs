//! kiln's main job, end to end: build a small MLP forward pass lazily, look at
//! the graph kiln captured, realize it and print the class probabilities.
//!
//! Run with `cargo run --release --example quickstart`.

use kiln::{Result, Tensor};

fn main() -> Result<()> {
    // A batch of 4 inputs of 8 features, and a 8-16-3 network with seeded weights.
    let x = Tensor::randn([4, 8], 0)?;
    let (w1, b1) = (Tensor::randn([8, 16], 1)?, Tensor::randn([16], 2)?);
    let (w2, b2) = (Tensor::randn([16, 3], 3)?, Tensor::randn([3], 4)?);

    // Nothing below computes anything: each line records nodes in a graph.
    let hidden = (x.matmul(&w1)? + &b1)?.relu()?;
    let probs = (hidden.matmul(&w2)? + &b2)?.softmax(-1)?;
    println!("{}", kiln::capture("mlp", &[&probs]));

    // Reading the value captures the graph, evaluates it and stores the result.
    let values: Vec<f32> = probs.to_vec()?;
    println!("class probabilities on {:?}:", probs.device());
    for (row, p) in values.chunks(3).enumerate() {
        println!("  sample {row}: {p:.4?} (sum {:.6})", p.iter().sum::<f32>());
    }
    Ok(())
}
