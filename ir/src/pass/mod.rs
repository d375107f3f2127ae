//! The optimizer: a pipeline of passes from a captured graph to fused
//! kernels, with the verifier after every stage.
//!
//! ```text
//! simplify -> widen -> cse -> attention -> batch-rows -> autocast -> split-reduce -> fold-views -> fuse -> dce
//! ```
//!
//! then the schedule, and for a compiled step `donate`, which writes
//! outputs over the inputs they replace where that is safe.
//!
//! The pipeline takes graph ops only (checked on entry): `simplify`,
//! `widen`, `cse`, `attention`, `batch-rows`, `autocast` (asked for) and `split-reduce` rewrite graph ops into graph ops, `fold-views` brings
//! in the post-fusion `View` and `fuse` the `Kernel` (see `op`'s module doc).
//!
//! A pass is one function `&Graph -> Graph` or a list of small named rules
//! applied by `rewrite`. Rules never make the graph worse and never change a
//! result beyond what their comment says.

use smallvec::SmallVec;

use crate::Error;
use crate::graph::{Graph, Node, NodeId};
use crate::op::Op;
use crate::schedule::Schedule;
use crate::types::{DType, TensorType};
use crate::verify::{verify, verify_graph_ops};

mod attention;
mod autocast;
mod batch_rows;
mod cse;
mod dce;
mod donate;
mod fold_views;
mod fuse;
mod simplify;
mod split_reduce;
mod widen;

pub use donate::donate;

/// The stages in pipeline order, as `KILN_DUMP` names them.
pub const STAGES: [&str; 12] = [
    "simplify",
    "widen",
    "cse",
    "attention",
    "batch-rows",
    "autocast",
    "split-reduce",
    "fold-views",
    "fuse",
    "dce",
    "schedule",
    "donate",
];

/// How the pipeline runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// Fuse ops into shared kernels. Off, every primitive op is its own kernel
    /// (movement ops still fold into reads): the baseline of the fused-vs-unfused
    /// benchmarks.
    pub fusion: bool,
    /// How many pieces of work the target runs at once, which sizes the
    /// splits a pass makes (`split-reduce`'s partial results): a fact of the
    /// backend, which kiln's compile sets from it (`Backend::parallel`).
    pub parallel: usize,
    /// Whether the target runs `Op::Attention` as one kernel, so that the
    /// `attention` stage finds it (with fusion on). A fact of the backend,
    /// which kiln's compile sets from it (`Backend::attention`).
    pub attention: bool,
    /// Mixed precision: the operands of f32 matmuls rounded to 16 bits,
    /// products accumulated and kept in f32 (`torch.autocast`; the lists
    /// are `Autocast`'s). Unlike the other options this changes results,
    /// by that rounding. None by default.
    pub autocast: Option<Autocast>,
}

/// The 16-bit type mixed precision multiplies in (`Options::autocast`).
///
/// The lists, against `torch.autocast`'s on CUDA:
///
/// - **In 16 bits:** matmuls, batched or not, and so the convolutions kiln
///   computes as products (those with more than one output channel per
///   group, or more than 64 terms per output) and attention written as two
///   products. These are where the tensor cores and the bytes are.
/// - **In f32:** everything else: sums, means and maxima, softmax and
///   log-softmax, the normalizations, exp, log, pow and the other
///   elementwise ops, the losses, an optimizer's update, and convolutions
///   kiln computes as sums of products rather than as a matmul (one output
///   channel per group and at most 64 terms per output: depthwise ones).
///   torch runs these in f32 too (but its convolutions in 16 bits), or in
///   whatever type their operands have, which here is f32. And attention that the backend
///   runs as one kernel (`Options::attention`, the CPU's): it computes in
///   f32 inside it, and its operands rounded would be kernels of their own.
/// - **Left as they are:** f64 and integer products, as torch leaves them.
///
/// One departure from torch: torch rounds a product to 16 bits, kiln keeps
/// it in f32 (JAX's `preferred_element_type=float32`). The product is in
/// f32 registers when the matmul's epilogue (bias, activation) reads it, so
/// rounding it would cost accuracy and save nothing; where a product feeds
/// another product, that one rounds it as its operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Autocast {
    /// bf16: f32's range, 8 bits of significand. Trains without loss
    /// scaling.
    BF16,
    /// f16: 11 bits of significand, but a range that small gradients fall
    /// out of: train with loss scaling (kiln's `GradScaler`).
    F16,
}

impl Autocast {
    /// The dtype products' operands are rounded to.
    pub fn dtype(self) -> DType {
        match self {
            Autocast::BF16 => DType::BF16,
            Autocast::F16 => DType::F16,
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        // A GPU's blocks: what the CUDA backend states, enough for a CPU.
        Options {
            fusion: true,
            parallel: 1024,
            attention: false,
            autocast: None,
        }
    }
}

/// A fused graph and its schedule: what a backend compiles and runs.
#[derive(Clone, Debug)]
pub struct Optimized {
    /// Inputs and kernel nodes only.
    pub graph: Graph,
    /// Launch order and memory plan.
    pub schedule: Schedule,
}

/// Runs the pipeline on `graph`, which holds graph ops only (a `View` or
/// `Kernel` in it is an `Err` naming the node). After every stage (and after
/// planning, as `schedule`) `on_stage` gets the stage's name and a function
/// that prints it: the graph, then the stage's notes (rules that fired,
/// fusions refused and why) as `//` lines. Printing costs nothing unless
/// asked for.
pub fn optimize(
    graph: &Graph,
    options: Options,
    on_stage: &mut dyn FnMut(&str, &dyn Fn() -> String),
) -> Result<Optimized, Error> {
    verify(graph)?;
    verify_graph_ops(graph, "optimize")?;
    let mut stage = |name: &str, (graph, notes): (Graph, Vec<String>)| -> Result<Graph, Error> {
        verify(&graph)?;
        on_stage(name, &|| {
            let notes: String = notes.iter().map(|n| format!("// {n}\n")).collect();
            format!("{graph}{notes}")
        });
        Ok(graph)
    };
    let graph = stage("simplify", simplify::run(graph))?;
    // Only graphs with 16-bit floats have anything to widen, or to show.
    let graph = if graph.nodes.iter().any(|n| n.ty.dtype.is_half()) {
        stage("widen", widen::run(&graph))?
    } else {
        graph
    };
    let graph = stage("cse", (cse::run(&graph), Vec::new()))?;
    let graph = match options.attention && options.fusion {
        true => stage("attention", attention::run(&graph))?,
        false => graph,
    };
    let graph = match batch_rows::run(&graph) {
        Some(rewritten) => stage("batch-rows", rewritten)?,
        None => graph,
    };
    // After `widen` (its casts are already ones a backend has), `attention`
    // (which keeps its products in f32) and `batch-rows` (which finds
    // products by their operands' views, the roundings not yet there).
    let graph = match options.autocast {
        Some(to) => stage("autocast", autocast::run(&graph, to))?,
        None => graph,
    };
    let graph = stage("split-reduce", split_reduce::run(&graph, options.parallel))?;
    let graph = stage("fold-views", (fold_views::run(&graph), Vec::new()))?;
    let graph = stage("fuse", fuse::run(&graph, options)?)?;
    let graph = stage("dce", (dce::run(&graph), Vec::new()))?;
    let schedule = Schedule::plan(&graph).map_err(|id| Error::Verify {
        message: format!("node {id} is neither an input nor a kernel after fusion"),
        dump: graph.to_string(),
    })?;
    on_stage("schedule", &|| schedule.print(&graph));
    Ok(Optimized { graph, schedule })
}

/// What a rule does with a node.
pub(crate) enum Rewrite {
    /// The node is this existing node.
    To(NodeId),
    /// The node is this op on these operands (the driver tries the rules again).
    Node(Op, SmallVec<[NodeId; 2]>),
}

/// A named rewrite rule. `apply` sees the node's op, its operands (already
/// rewritten) and its type, and may push helper nodes into the graph.
pub(crate) struct Rule {
    pub name: &'static str,
    pub apply: fn(&mut Graph, &Op, &[NodeId], &TensorType) -> Option<Rewrite>,
}

/// How many times the rules may rewrite one node before the driver stops.
const REWRITE_CAP: usize = 16;

/// Applies `rules` to every node, front to back, each node to a fixpoint or
/// `REWRITE_CAP` rewrites. Returns the graph and a note per rule that fired
/// and why the driver stopped.
pub(crate) fn rewrite(graph: &Graph, pass: &str, rules: &[Rule]) -> (Graph, Vec<String>) {
    let rules: Vec<(&str, &RuleFn)> = rules
        .iter()
        .map(|r| (r.name, &r.apply as &RuleFn))
        .collect();
    rewrite_with(graph, pass, &rules)
}

/// A rule's function, as `rewrite_with` takes it: a `Rule`'s, or a closure
/// over what a pass was told (`split-reduce`'s parallelism).
pub(crate) type RuleFn = dyn Fn(&mut Graph, &Op, &[NodeId], &TensorType) -> Option<Rewrite>;

/// `rewrite` with named rule functions.
pub(crate) fn rewrite_with(
    graph: &Graph,
    pass: &str,
    rules: &[(&str, &RuleFn)],
) -> (Graph, Vec<String>) {
    let mut fired = vec![0usize; rules.len()];
    let mut capped = 0;
    let out = rebuild(graph, |g, node, inputs| {
        let (mut op, mut inputs) = (node.op.clone(), inputs);
        for _ in 0..REWRITE_CAP {
            let Some((k, rw)) = rules
                .iter()
                .enumerate()
                .find_map(|(k, r)| (r.1)(g, &op, &inputs, &node.ty).map(|rw| (k, rw)))
            else {
                return g.push_typed(op, inputs, node.ty.clone());
            };
            fired[k] += 1;
            match rw {
                Rewrite::To(id) => return id,
                Rewrite::Node(o, i) => (op, inputs) = (o, i),
            }
        }
        capped += 1;
        g.push_typed(op, inputs, node.ty.clone())
    });
    let mut notes: Vec<String> = rules
        .iter()
        .zip(&fired)
        .filter(|(_, n)| **n > 0)
        .map(|(r, n)| format!("{pass}: {} x{n}", r.0))
        .collect();
    notes.push(match capped {
        0 => format!("{pass}: stopped at a fixpoint"),
        n => format!("{pass}: stopped at the cap of {REWRITE_CAP} rewrites on {n} nodes"),
    });
    (out, notes)
}

/// How many times each node of `graph` is read, by arena position, its
/// outputs counted as readers.
pub(crate) fn readers(graph: &Graph) -> Vec<usize> {
    let mut readers = vec![0usize; graph.nodes.len()];
    for id in graph
        .nodes
        .iter()
        .flat_map(|n| &n.inputs)
        .chain(&graph.outputs)
    {
        readers[id.index()] += 1;
    }
    readers
}

/// A new graph with the same name and inputs, built front to back: `f` gets
/// each node with its operands already mapped and returns the node that
/// stands for it. Inputs are copied as they are.
pub(crate) fn rebuild(
    graph: &Graph,
    mut f: impl FnMut(&mut Graph, &Node, SmallVec<[NodeId; 2]>) -> NodeId,
) -> Graph {
    let mut out = Graph::new(graph.name.clone());
    out.inputs = graph.inputs.clone();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        let inputs = node.inputs.iter().map(|id| map[id.index()]).collect();
        let id = match node.op {
            Op::Input { .. } => out.push_typed(node.op.clone(), inputs, node.ty.clone()),
            _ => f(&mut out, node, inputs),
        };
        map.push(id);
    }
    out.outputs = graph.outputs.iter().map(|id| map[id.index()]).collect();
    out
}
