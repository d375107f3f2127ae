//! Code that kiln's tests, benches and examples share, in one unpublished
//! crate so that each target imports it instead of including its source:
//! random graphs for the property tests, central finite differences for the
//! gradient tests, the workloads of benches/README.md, and the data bench's
//! MLP epoch.

pub mod gradcheck;
pub mod mlp_epoch;
pub mod random_graph;
pub mod workloads;
