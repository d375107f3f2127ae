//! Layers that hold parameters, and saving and loading parameters.
//!
//! kiln's models are plain structs of tensors behind one trait, `Module`:
//! a forward pass, and parameters named by their field paths (as PyTorch's
//! `state_dict` names them: `layers.0.weight`), which `set_parameters` and
//! `Module::with_parameters` replace by name, and buffers (a batch norm's
//! running statistics). `Linear`, `Conv2d`, `BatchNorm2d`, `Embedding`,
//! `LayerNorm` and `Mlp` hold parameters; `Relu`, `Flatten` and
//! `MaxPool2d` do not, and `Dropout` holds only its random key, a buffer;
//! `Sequential` chains any of them. Everything else
//! without parameters (softmax, gelu, the losses) stays a `Tensor` method.
//! Layers are made in f32; `Module::to_dtype` casts a model's parameters
//! and buffers to f64 (or bf16, f16), and its forward pass and gradients
//! then take and give values of that type.
//! `save` and `load` write and read named tensors as a safetensors file,
//! the format PyTorch, JAX and candle checkpoints share.
//!
//! ```
//! use kiln::nn::{self, Module};
//! use kiln::{Pool2d, Tensor};
//! # fn main() -> kiln::Result<()> {
//! let mlp = nn::Mlp::new(&[784, 128, 10], 0)?;
//! let logits = mlp.forward(&Tensor::rand([32, 784], 1)?)?;
//! assert_eq!(logits.dims(), [32, 10]);
//! let names: Vec<String> = mlp.parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]);
//!
//! let mut conv = nn::Conv2d::new(1, 8, [3, 3], 2)?;
//! conv.padding = [(1, 1); 2];
//! let cnn = nn::Sequential::new(vec![
//!     Box::new(conv),
//!     Box::new(nn::Relu),
//!     Box::new(nn::MaxPool2d(Pool2d::new([2, 2]))),
//!     Box::new(nn::Flatten),
//!     Box::new(nn::Linear::new(8 * 14 * 14, 10, 3)?),
//! ]);
//! assert_eq!(cnn.forward(&Tensor::rand([4, 1, 28, 28], 4)?)?.dims(), [4, 10]);
//! assert_eq!(cnn.parameters()[2].0, "layers.4.weight");
//! # Ok(())
//! # }
//! ```

mod checkpoint;
mod layer;
mod module;

pub use checkpoint::{load, save};
pub use layer::{BatchNorm2d, Conv2d, Embedding, LayerNorm, Linear, Mlp, set_parameters};
pub use module::{Dropout, Flatten, MaxPool2d, Module, Relu, Sequential};
