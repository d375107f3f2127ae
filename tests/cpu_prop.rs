//! Random graphs (see `support/src/random_graph.rs`) optimized, compiled
//! for the CPU and run, against the interpreter on the graph as built.
//!
//! Graphs of ops the CPU computes exactly must agree bit for bit (NaNs
//! counted equal). Graphs of continuous ops (transcendentals, sums and
//! matmuls included) must agree within a tolerance that covers f32
//! accumulation and the polynomial approximations through a few ops.

use kiln_ir::pass::{Options, optimize};
use kiln_ir::{Data, DataRef, interp};
use kiln_runtime::{Backend, BackendOptions, cpu::Cpu};
use kiln_support::random_graph::{Mode, inputs, random_graph, same};
use proptest::prelude::*;

fn run(
    seed: u64,
    steps: usize,
    mode: Mode,
    fusion: bool,
) -> Result<(Vec<Data>, Vec<Data>, String), TestCaseError> {
    let graph = random_graph(seed, steps, mode);
    let data = inputs(&graph, seed);
    let refs: Vec<&Data> = data.iter().collect();
    let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(format!("{e}\nfrom:\n{graph}"));
    let expected = interp::eval(&graph, &refs).map_err(|e| fail(&e))?;
    let optimized = optimize(&graph, Options { fusion }, &mut |_, _| {}).map_err(|e| fail(&e))?;
    let text = format!("{graph}\n{}", optimized.graph);
    let mut exec = Cpu
        .compile(optimized, BackendOptions::default())
        .map_err(|e| fail(&e))?;
    let args: Vec<DataRef> = data.iter().map(DataRef::from).collect();
    let mut got = exec.output_buffers().map_err(|e| fail(&e))?;
    exec.run_into(&args, &mut got).map_err(|e| fail(&e))?;
    Ok((expected, got, text))
}

fn close(a: &Data, b: &Data) -> bool {
    a.len() == b.len()
        && (0..a.len()).all(|i| {
            let (x, y) = (a.get(i).to_f64(), b.get(i).to_f64());
            (x.is_nan() && y.is_nan())
                || x == y
                || (x - y).abs() <= 1e-3 * x.abs().max(y.abs()).max(1.0)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn exact_graphs_agree_bit_for_bit(seed in any::<u64>(), steps in 1usize..10, fusion in any::<bool>()) {
        let (want, have, text) = run(seed, steps, Mode::Exact, fusion)?;
        for (k, (w, h)) in want.iter().zip(&have).enumerate() {
            prop_assert!(same(w, h), "output {k}:\n{text}\nwant {w:?}\nhave {h:?}");
        }
    }

    #[test]
    fn continuous_graphs_agree_closely(seed in any::<u64>(), steps in 1usize..8, fusion in any::<bool>()) {
        let (want, have, text) = run(seed, steps, Mode::Continuous, fusion)?;
        for (k, (w, h)) in want.iter().zip(&have).enumerate() {
            prop_assert!(close(w, h), "output {k}:\n{text}\nwant {w:?}\nhave {h:?}");
        }
    }
}
