//! Code that kiln's tests, benches and examples share, in one unpublished
//! crate so that each target imports it instead of including its source:
//! random graphs for the property tests, central finite differences for the
//! gradient tests, the workloads of benches/README.md, and the quickstart's
//! dataset and model for the data bench.

pub mod gradcheck;
pub mod quickstart;
pub mod random_graph;
pub mod workloads;
