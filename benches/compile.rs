//! The parts of a cold compile of the 3-layer MLP of BENCHMARKS.md
//! (`compile_mlp3`, 784-256-256-10, batch 64): recording it through the
//! Tensor API, capturing it as a verified IR graph, and running the whole
//! optimizer (every pass with the verifier after each, then the schedule).
//! The whole cold path has a 5 ms budget; these parts must stay a small
//! slice of it.

// criterion_group! defines a public function that cannot carry a doc comment.
#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use kiln::{Options, Result, Tensor};

/// The weights are made once, outside the timed loop: building them is data
/// generation, not compilation.
fn weights() -> Vec<(Tensor, Tensor)> {
    let sizes = [784, 256, 256, 10];
    sizes
        .windows(2)
        .enumerate()
        .map(|(i, p)| {
            (
                Tensor::randn([p[0], p[1]], 2 * i as u64).expect("a small shape is valid"),
                Tensor::randn([p[1]], 2 * i as u64 + 1).expect("a small shape is valid"),
            )
        })
        .collect()
}

fn mlp3(x: &Tensor, layers: &[(Tensor, Tensor)]) -> Result<Tensor> {
    let mut h = x.clone();
    for (i, (w, b)) in layers.iter().enumerate() {
        let z = (h.matmul(w)? + b)?;
        h = if i + 1 < layers.len() { z.relu()? } else { z };
    }
    Ok(h)
}

fn bench(c: &mut Criterion) {
    let x = Tensor::randn([64, 784], 9).expect("a small shape is valid");
    let layers = weights();
    let mut group = c.benchmark_group("compile_mlp3");
    group.bench_function("record", |b| b.iter(|| mlp3(&x, &layers)));
    group.bench_function("record+capture+verify", |b| {
        b.iter(|| -> Result<()> {
            let graph = kiln::capture("mlp3", &[&mlp3(&x, &layers)?]);
            kiln_ir::verify(&graph)?;
            Ok(())
        })
    });
    let graph = kiln::capture(
        "mlp3",
        &[&mlp3(&x, &layers).expect("the MLP is well typed")],
    );
    group.bench_function("optimize", |b| {
        b.iter(|| kiln_ir::pass::optimize(&graph, Options::default(), &mut |_, _| {}))
    });
    group.bench_function("record+capture+optimize", |b| {
        b.iter(|| -> Result<usize> {
            let optimized = kiln::optimize("mlp3", &[&mlp3(&x, &layers)?], Options::default())?;
            Ok(optimized.schedule.kernels())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
