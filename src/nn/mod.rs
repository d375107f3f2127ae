//! Layers that hold parameters, and saving and loading parameters.
//!
//! kiln's models are plain structs of tensors: `Linear`, `LayerNorm` and
//! `Mlp` hold theirs in public fields, name them with `parameters()` (the
//! field path, as PyTorch's `state_dict` does: `layers.0.weight`), and take
//! new values by name with `set_parameters`. Everything without parameters
//! (softmax, gelu, the losses) stays a `Tensor` method. `save` and `load`
//! write and read named tensors as a safetensors file, the format PyTorch,
//! JAX and candle checkpoints share.
//!
//! ```
//! use kiln::{Tensor, nn};
//! # fn main() -> kiln::Result<()> {
//! let mlp = nn::Mlp::new(&[784, 128, 10], 0)?;
//! let logits = mlp.forward(&Tensor::rand([32, 784], 1)?)?;
//! assert_eq!(logits.dims(), [32, 10]);
//! let names: Vec<String> = mlp.parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]);
//! # Ok(())
//! # }
//! ```

mod checkpoint;
mod layer;

pub use checkpoint::{load, save};
pub use layer::{Embedding, LayerNorm, Linear, Mlp, set_parameters};
