//! Random graphs (see `support/src/random_graph.rs`) differentiated by
//! `kiln_ir::grad`, then optimized, compiled for the CPU and run, fused and
//! unfused, against the interpreter on the gradient graph as built.
//!
//! The loss is `sum(y * r)` of the graph's first output `y` and a random
//! cotangent `r`, differentiated with respect to every input. The inputs
//! are drawn continuously (`Rng::uniform`, not the generator's grid), so
//! that no comparison of the forward pass (relu's sign, a max's ties, the
//! generator's `where(x > k)`) sits where the CPU's rounding could flip it;
//! ties the graph makes itself (`x - max(x)`, `max(x, x)`) are exact on
//! both. What is compared:
//!
//! - graphs of ops the CPU computes exactly (`Mode::Exact`): the forward
//!   values agree bit for bit, so every mask agrees, and the gradients
//!   differ only by the f32 accumulation of the backward pass's sums;
//! - graphs of continuous ops (`Mode::Continuous`: transcendentals, sums,
//!   products and matmuls included), whose gradients carry the CPU's
//!   polynomial approximations through the forward and the backward pass.
//!
//! Both kinds of graph draw sliding windows (`unfold`), whose gradient
//! scatters back and adds where windows overlap. Both are compared within `|a - b| <= 1e-3 * max(|a|, |b|) + 1e-4 * m`, where `m` is
//! the largest finite magnitude in that gradient (at least 1): a gradient
//! element is a sum of terms as large as the gradient's others, and f32
//! rounding is relative to the terms, not to their sum. Where the graph
//! holds bf16 or f16 values, the relative part is 2^-7, two bf16 ulps at
//! worst: the interpreter rounds each 16-bit result from f64, the CPU from
//! f32, and the second rounding can move a result by one ulp of its type
//! (a bf16 sqrt's gradient, one ulp apart, is the saved case). NaNs and
//! infinities must match exactly.

use kiln_ir::pass::{Options, optimize};
use kiln_ir::{BinaryOp, Data, DataRef, Graph, NodeId, Op, ReduceOp, grad, interp};
use kiln_runtime::{Backend, BackendOptions, cpu::Cpu};
use kiln_support::gradcheck::Rng;
use kiln_support::random_graph::{Mode, random_graph};
use proptest::prelude::*;

/// The random graph of `seed`, extended by the loss and the gradient of
/// every input, with its inputs (the cotangent last).
fn gradient_graph(seed: u64, steps: usize, mode: Mode) -> Result<(Graph, Vec<Data>), String> {
    let mut g = random_graph(seed, steps, mode);
    let mut rng = Rng(seed ^ 0x6AD);
    let mut data: Vec<Data> = g
        .inputs
        .iter()
        .map(|ty| Data::F32(rng.fill(ty.shape.numel(), |r| r.uniform(-2.0, 2.0))))
        .collect();
    let wrt: Vec<NodeId> = (0..g.nodes.len())
        .filter(|&i| matches!(g.nodes[i].op, Op::Input { .. }))
        .map(|i| NodeId(i as u32))
        .collect();
    let y = g.outputs[0];
    let ty = g.node(y).ty.clone();
    data.push(Data::F32(
        rng.fill(ty.shape.numel(), |r| r.uniform(-1.0, 1.0)),
    ));
    let r = g.input(ty.clone());
    let fail = |e: kiln_ir::Error| format!("{e}");
    let product = g.push(Op::Binary(BinaryOp::Mul), &[y, r]).map_err(fail)?;
    let loss = g
        .push(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: (0..ty.shape.rank()).collect(),
            },
            &[product],
        )
        .map_err(fail)?;
    g.outputs = grad(&mut g, loss, &wrt).map_err(fail)?;
    Ok((g, data))
}

fn run(seed: u64, steps: usize, mode: Mode, fusion: bool) -> Result<(), TestCaseError> {
    let (graph, data) = gradient_graph(seed, steps, mode).map_err(TestCaseError::fail)?;
    let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(format!("{e}\nfrom:\n{graph}"));
    let refs: Vec<&Data> = data.iter().collect();
    let want = interp::eval(&graph, &refs).map_err(|e| fail(&e))?;
    let optimized = optimize(
        &graph,
        Options {
            fusion,
            ..Options::default()
        },
        &mut |_, _| {},
    )
    .map_err(|e| fail(&e))?;
    let text = format!("{graph}\n{}", optimized.graph);
    let mut exec = Cpu
        .compile(optimized, BackendOptions::default())
        .map_err(|e| fail(&e))?;
    let args: Vec<DataRef> = data.iter().map(DataRef::from).collect();
    let mut have = exec.output_buffers().map_err(|e| fail(&e))?;
    exec.run_into(&args, &mut have).map_err(|e| fail(&e))?;
    let halves = graph.nodes.iter().any(|n| n.ty.dtype.is_half());
    let rtol = if halves { 1.0 / 128.0 } else { 1e-3 };
    for (k, (w, h)) in want.iter().zip(&have).enumerate() {
        if let Some(i) = disagreement(w, h, rtol) {
            return Err(TestCaseError::fail(format!(
                "gradient {k} element {i}: interpreter {:?}, cpu {:?} (fusion {fusion})\n{text}",
                w.get(i),
                h.get(i)
            )));
        }
    }
    Ok(())
}

/// The first element where `a` and `b` differ by more than the tolerance
/// of the module doc, its relative part `rtol`.
fn disagreement(a: &Data, b: &Data, rtol: f64) -> Option<usize> {
    if a.len() != b.len() {
        return Some(0);
    }
    let values = |d: &Data| -> Vec<f64> { (0..d.len()).map(|i| d.get(i).to_f64()).collect() };
    let (a, b) = (values(a), values(b));
    let m = a
        .iter()
        .chain(&b)
        .filter(|v| v.is_finite())
        .fold(1.0f64, |m, v| m.max(v.abs()));
    (0..a.len()).find(|&i| {
        let (x, y) = (a[i], b[i]);
        let agree = if x.is_finite() && y.is_finite() {
            (x - y).abs() <= rtol * x.abs().max(y.abs()) + 1e-4 * m
        } else {
            x == y || (x.is_nan() && y.is_nan())
        };
        !agree
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn gradients_of_exact_graphs_agree(seed in any::<u64>(), steps in 1usize..10, fusion in any::<bool>()) {
        run(seed, steps, Mode::Exact, fusion)?;
    }

    #[test]
    fn gradients_of_continuous_graphs_agree(seed in any::<u64>(), steps in 1usize..8, fusion in any::<bool>()) {
        run(seed, steps, Mode::Continuous, fusion)?;
    }
}
