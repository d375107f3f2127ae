//! Code that kiln's tests, benches and examples share, in one unpublished
//! crate so that each target imports it instead of including its source:
//! random graphs for the property tests and the workloads of
//! benches/README.md.

pub mod random_graph;
pub mod workloads;
