//! The optimizer never changes a result: random graphs (elementwise ops,
//! broadcasts, reductions, the sum+broadcast pattern, every view, matmul;
//! shapes full of 1s) evaluated by the interpreter give the same numbers
//! before and after the pipeline, fused and unfused.
//!
//! Every f32 value a kernel computes is rounded exactly as the graph op it
//! replaces, and reductions accumulate the same way, so the comparison is
//! exact (all NaNs counted equal, as payloads are not part of the semantics).

use kiln_ir::pass::{Options, optimize};
use kiln_ir::{Data, interp};
use kiln_support::random_graph::{Mode, inputs, random_graph, same};
use proptest::prelude::*;

fn check(seed: u64, steps: usize) -> Result<(), TestCaseError> {
    let graph = random_graph(seed, steps, Mode::All);
    let data = inputs(&graph, seed, Mode::All);
    let refs: Vec<&Data> = data.iter().collect();
    let expected = interp::eval(&graph, &refs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    for fusion in [true, false] {
        let optimized = optimize(
            &graph,
            Options {
                fusion,
                ..Options::default()
            },
            &mut |_, _| {},
        )
        .map_err(|e| TestCaseError::fail(format!("{e}\nfrom:\n{graph}")))?;
        let got = interp::eval(&optimized.graph, &refs)
            .map_err(|e| TestCaseError::fail(format!("{e}\nfrom:\n{graph}")))?;
        for (k, (want, have)) in expected.iter().zip(&got).enumerate() {
            prop_assert!(
                same(want, have),
                "output {k} differs (fusion {fusion}):\n{graph}\n{}\nwant {want:?}\nhave {have:?}",
                optimized.graph
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn optimized_graphs_compute_what_the_graph_does(seed in any::<u64>(), steps in 1usize..12) {
        check(seed, steps)?;
    }
}
