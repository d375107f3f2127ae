//! Every workload of benches/README.md on the CPU backend, fused and unfused
//! (`fusion: false`: one kernel per primitive op), for
//! day-to-day work with criterion's reports. Groups are `workload/cpu`, ids
//! `fused/<shape>` and `unfused/<shape>`; compilation happens before the
//! timed loop, which runs the compiled graph with reused output buffers.
//! `examples/bench_report` times the same workloads for comparison across
//! frameworks.

// criterion_group! defines a public function that cannot carry a doc comment.
#![allow(missing_docs)]

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kiln::{CompileOptions, Data, Options};
use kiln_support::workloads;

fn bench(c: &mut Criterion) {
    for w in workloads::all() {
        let inputs = w.inputs().expect("seeded inputs");
        let refs: Vec<&Data> = inputs.iter().collect();
        let mut group = c.benchmark_group(format!("{}/cpu", w.id));
        group
            .sample_size(10)
            .measurement_time(Duration::from_secs(2));
        if w.bytes > 0 {
            group.throughput(Throughput::Bytes(w.bytes));
        } else if w.flops > 0 {
            group.throughput(Throughput::Elements(w.flops));
        }
        for (variant, fusion) in [("fused", true), ("unfused", false)] {
            let mut g = kiln::compile_with(
                w.id,
                &w.specs,
                CompileOptions {
                    optimizer: Options {
                        fusion,
                        ..Options::default()
                    },
                    ..CompileOptions::default()
                },
                |t| (w.build)(t),
            )
            .expect("the workload compiles");
            let mut outputs = g.output_buffers().expect("output buffers");
            group.bench_function(BenchmarkId::new(variant, &w.shape), |b| {
                b.iter(|| g.run_into(&refs, &mut outputs).expect("the workload runs"))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
