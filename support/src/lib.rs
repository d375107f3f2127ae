//! Code that kiln's tests, benches and examples share, in one unpublished
//! crate so that each target imports it instead of including its source:
//! random graphs for the property tests.

pub mod random_graph;
