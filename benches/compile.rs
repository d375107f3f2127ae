//! The parts of a cold compile of the 3-layer MLP of benches/README.md
//! (`compile_mlp3`, 784-256-256-10, batch 64): recording it through the
//! Tensor API, capturing it as a verified IR graph, running the whole
//! optimizer (every pass with the verifier after each, then the schedule),
//! and the whole cold path (trace, optimize, generate and compile the CPU
//! kernels with an empty kernel cache). The cold path has a 5 ms budget.

// criterion_group! defines a public function that cannot carry a doc comment.
#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use kiln::{Options, Result, Tensor};
use kiln_support::workloads;

fn bench(c: &mut Criterion) {
    let mlp = workloads::Mlp3::new().expect("seeded weights");
    let x = Tensor::randn(mlp.spec.shape.clone(), 9).expect("a small shape is valid");
    let record = || -> Result<Tensor> { Ok(mlp.forward(std::slice::from_ref(&x))?.remove(0)) };
    let mut group = c.benchmark_group("compile_mlp3");
    group.bench_function("record", |b| b.iter(record));
    group.bench_function("record+capture+verify", |b| {
        b.iter(|| -> Result<()> {
            let graph = kiln::capture("mlp3", &[&record()?]);
            kiln_ir::verify(&graph)?;
            Ok(())
        })
    });
    let graph = kiln::capture("mlp3", &[&record().expect("the MLP is well typed")]);
    group.bench_function("optimize", |b| {
        b.iter(|| kiln_ir::pass::optimize(&graph, Options::default(), &mut |_, _| {}))
    });
    group.bench_function("cold", |b| {
        b.iter(|| -> Result<usize> {
            kiln_runtime::cpu::clear_kernel_cache();
            let g = kiln::compile("mlp3", std::slice::from_ref(&mlp.spec), |x| mlp.forward(x))?;
            Ok(g.optimized().schedule.kernels())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
