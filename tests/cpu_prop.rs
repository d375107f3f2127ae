//! Random graphs (see `support/src/random_graph.rs`) optimized, compiled
//! for the CPU and run, against the interpreter on the graph as built;
//! half of them with every output written over an input of its type where
//! `pass::donate` allows it.
//!
//! Graphs of ops the CPU computes exactly (sliding windows and i64
//! products included) must agree bit for bit (NaNs counted equal). Graphs
//! of continuous ops (transcendentals, sums, products and matmuls
//! included) must agree within a tolerance that covers f32 accumulation
//! and the polynomial approximations through a few ops.

use kiln_ir::pass::{Options, donate, optimize};
use kiln_ir::{Data, DataRef, interp};
use kiln_runtime::{Backend, BackendOptions, cpu::Cpu};
use kiln_support::random_graph::{Mode, inputs, random_graph, same};
use proptest::prelude::*;

fn run(
    seed: u64,
    steps: usize,
    mode: Mode,
    fusion: bool,
    in_place: bool,
) -> Result<(Vec<Data>, Vec<Data>, String), TestCaseError> {
    let graph = random_graph(seed, steps, mode);
    let data = inputs(&graph, seed, mode);
    let refs: Vec<&Data> = data.iter().collect();
    let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(format!("{e}\nfrom:\n{graph}"));
    let expected = interp::eval(&graph, &refs).map_err(|e| fail(&e))?;
    let mut optimized = optimize(
        &graph,
        Options {
            fusion,
            ..Options::default()
        },
        &mut |_, _| {},
    )
    .map_err(|e| fail(&e))?;
    if in_place {
        // Each output offered the first input of its type not yet taken.
        let types = graph.output_types();
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for (o, ty) in types.iter().enumerate() {
            let free = |&(i, t): &(usize, _)| t == ty && !pairs.iter().any(|p| p.0 == i as u32);
            if let Some((i, _)) = graph.inputs.iter().enumerate().find(free) {
                pairs.push((i as u32, o as u32));
            }
        }
        (optimized, _) = donate(&optimized, &pairs).map_err(|e| fail(&e))?;
    }
    let text = format!(
        "{graph}\n{}\n{}",
        optimized.graph,
        optimized.schedule.print(&optimized.graph)
    );
    let pairs = optimized.schedule.donated.clone();
    let mut exec = Cpu
        .compile(optimized, BackendOptions::default())
        .map_err(|e| fail(&e))?;
    let given = |i: usize| pairs.iter().any(|p| p.0 as usize == i);
    let mut donated: Vec<Data> = pairs.iter().map(|p| data[p.0 as usize].clone()).collect();
    let args: Vec<DataRef> = (data.iter().enumerate())
        .filter(|&(i, _)| !given(i))
        .map(|(_, d)| DataRef::from(d))
        .collect();
    let mut all = exec.output_buffers().map_err(|e| fail(&e))?;
    let mut outputs: Vec<Data> = (all.iter().enumerate())
        .filter(|&(o, _)| !pairs.iter().any(|p| p.1 as usize == o))
        .map(|(_, d)| d.clone())
        .collect();
    let mut donated_refs: Vec<&mut Data> = donated.iter_mut().collect();
    let mut output_refs: Vec<&mut Data> = outputs.iter_mut().collect();
    exec.run_donated(&mut donated_refs, &args, &mut output_refs)
        .map_err(|e| fail(&e))?;
    let mut rest = outputs.into_iter();
    for (o, out) in all.iter_mut().enumerate() {
        *out = match pairs.iter().position(|p| p.1 as usize == o) {
            Some(j) => donated[j].clone(),
            None => rest.next().expect("one per output"),
        };
    }
    Ok((expected, all, text))
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
    fn exact_graphs_agree_bit_for_bit(seed in any::<u64>(), steps in 1usize..10, fusion in any::<bool>(), in_place in any::<bool>()) {
        let (want, have, text) = run(seed, steps, Mode::Exact, fusion, in_place)?;
        for (k, (w, h)) in want.iter().zip(&have).enumerate() {
            prop_assert!(same(w, h), "output {k}:\n{text}\nwant {w:?}\nhave {h:?}");
        }
    }

    #[test]
    fn continuous_graphs_agree_closely(seed in any::<u64>(), steps in 1usize..8, fusion in any::<bool>(), in_place in any::<bool>()) {
        let (want, have, text) = run(seed, steps, Mode::Continuous, fusion, in_place)?;
        for (k, (w, h)) in want.iter().zip(&have).enumerate() {
            prop_assert!(close(w, h), "output {k}:\n{text}\nwant {w:?}\nhave {h:?}");
        }
    }
}
