//! Code that kiln's tests, benches and examples share, in one unpublished
//! crate so that each target imports it instead of including its source:
//! random graphs for the property tests, central finite differences for the
//! gradient tests, the workloads of benches/README.md, the data bench's
//! MLP epoch, the CNN example's network, and a tensor's values whatever
//! their dtype (`data`).

pub mod digits_cnn;
pub mod gradcheck;
pub mod mlp_epoch;
pub mod random_graph;
pub mod workloads;

use kiln::{DType, Data, Result, Tensor};

/// The values of `t`, computed if they are not yet, in its own dtype.
pub fn data(t: &Tensor) -> Result<Data> {
    Ok(match t.dtype() {
        DType::F32 => Data::F32(t.to_vec()?),
        DType::F64 => Data::F64(t.to_vec()?),
        DType::I32 => Data::I32(t.to_vec()?),
        DType::I64 => Data::I64(t.to_vec()?),
        DType::U8 => Data::U8(t.to_vec()?),
        DType::Bool => Data::Bool(t.to_vec()?),
        DType::BF16 => Data::BF16(t.to_vec()?),
        DType::F16 => Data::F16(t.to_vec()?),
    })
}
