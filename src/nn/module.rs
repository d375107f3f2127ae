//! The `Module` trait: a layer's forward pass, its parameters and buffers
//! by name, so that layers compose (`Sequential`) and a traced training
//! step puts the state it is given into any model
//! (`Module::with_parameters`, `Module::with_buffers`). A module trains by
//! `forward_train`, which also gives its buffers' new values (a batch
//! norm's running statistics), and infers by `forward`: PyTorch's train and
//! eval modes, as Flax passes them, by the call. `Relu`, `Flatten` and
//! `MaxPool2d` are modules without parameters, for `Sequential`, and so is
//! `Dropout`, whose random key is a buffer.

use crate::{DType, Pool2d, Result, Tensor};

use super::set_parameters;

/// A layer or model: a forward pass of one tensor, and parameters named by
/// their field paths (`layers.0.weight`, PyTorch's `state_dict` names).
pub trait Module: Send + Sync {
    /// The output for `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// The parameters, by name, in a fixed order (none by default).
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        Vec::new()
    }

    /// The parameters, named and ordered as `parameters`, to be replaced.
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }

    /// State carried from step to step that is not learned (a batch norm's
    /// running statistics), by name, as PyTorch's buffers; none by default.
    fn buffers(&self) -> Vec<(String, &Tensor)> {
        Vec::new()
    }

    /// The buffers, named and ordered as `buffers`, to be replaced.
    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }

    /// The output for `x` in training, each buffer's new value pushed onto
    /// `buffers` in `buffers` order: a batch norm normalizes by the batch's
    /// statistics and moves its running ones toward them. A module without
    /// buffers trains as it infers.
    fn forward_train(&self, x: &Tensor, _buffers: &mut Vec<Tensor>) -> Result<Tensor> {
        self.forward(x)
    }

    /// A copy of this module behind a box: how `Sequential` copies layers
    /// of any type.
    fn boxed(&self) -> Box<dyn Module>;

    /// A copy holding `values`, in `parameters` order, in place of its own
    /// parameters: how a traced training step puts the state it is given
    /// into the model. Each value is checked as `set_parameters` checks it.
    fn with_parameters(&self, values: &[Tensor]) -> Result<Self>
    where
        Self: Sized + Clone,
    {
        let names = self.parameters().into_iter().map(|(n, _)| n).collect();
        replaced(self, names, values, "parameters", |m| m.parameters_mut())
    }

    /// A copy holding `values`, in `buffers` order, in place of its own
    /// buffers, checked as `set_parameters` checks them.
    fn with_buffers(&self, values: &[Tensor]) -> Result<Self>
    where
        Self: Sized + Clone,
    {
        let names = self.buffers().into_iter().map(|(n, _)| n).collect();
        replaced(self, names, values, "buffers", |m| m.buffers_mut())
    }

    /// A copy whose floating-point parameters and buffers are cast to
    /// float type `dtype`, as PyTorch's `module.to(dtype)`: `to_dtype(DType::F64)`
    /// trains in f64. Integer buffers (a dropout's key) stay as they are.
    fn to_dtype(&self, dtype: DType) -> Result<Self>
    where
        Self: Sized + Clone,
    {
        if !dtype.is_float() {
            return Err(kiln_ir::Error::DType {
                op: "Module::to_dtype",
                dtype,
                expected: "a float type",
            }
            .into());
        }
        let mut copy = self.clone();
        cast_floats(copy.parameters_mut(), dtype)?;
        cast_floats(copy.buffers_mut(), dtype)?;
        Ok(copy)
    }
}

/// A copy of `model` whose tensors `targets` names (`names`, in order)
/// hold `values`, each checked as `set_parameters` checks it; `what` they
/// are, for the error.
fn replaced<M: Clone>(
    model: &M,
    names: Vec<String>,
    values: &[Tensor],
    what: &str,
    targets: impl FnOnce(&mut M) -> Vec<(String, &mut Tensor)>,
) -> Result<M> {
    // Too few values leave a target with none, which `set_parameters` names.
    if values.len() > names.len() {
        return Err(crate::Error::Parameter {
            name: format!("#{}", names.len()),
            message: format!("{} values for {} {what}", values.len(), names.len()),
        });
    }
    let mut copy = model.clone();
    set_parameters(
        targets(&mut copy),
        names.into_iter().zip(values.iter().cloned()),
    )?;
    Ok(copy)
}

/// Each floating-point tensor of `targets` cast to `dtype`, computed now,
/// as PyTorch's `to` copies: left lazy, every forward pass would cast again.
fn cast_floats(targets: Vec<(String, &mut Tensor)>, dtype: DType) -> Result<()> {
    let mut cast = Vec::new();
    for (_, t) in targets {
        if t.dtype().is_float() {
            *t = t.cast(dtype)?;
            cast.push(t.clone());
        }
    }
    crate::realize(&cast.iter().collect::<Vec<_>>())
}

/// Layers applied in order, as PyTorch's `nn.Sequential`; layer `i`'s
/// parameters are named `layers.{i}.{name}`, as `Mlp` names its layers'
/// (PyTorch's `Sequential` names them `{i}.{name}`).
pub struct Sequential {
    /// The layers, input first.
    pub layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// The layers, input first.
    pub fn new(layers: Vec<Box<dyn Module>>) -> Sequential {
        Sequential { layers }
    }
}

impl Clone for Sequential {
    fn clone(&self) -> Sequential {
        Sequential::new(self.layers.iter().map(|l| l.boxed()).collect())
    }
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.parameters().into_iter().map(|(n, _)| n).collect();
        write!(
            f,
            "Sequential({} layers, parameters {names:?})",
            self.layers.len()
        )
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.layers
            .iter()
            .try_fold(x.clone(), |h, layer| layer.forward(&h))
    }

    fn parameters(&self) -> Vec<(String, &Tensor)> {
        layered(self.layers.iter().map(|l| l.parameters()))
    }

    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        layered(self.layers.iter_mut().map(|l| l.parameters_mut()))
    }

    fn buffers(&self) -> Vec<(String, &Tensor)> {
        layered(self.layers.iter().map(|l| l.buffers()))
    }

    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        layered(self.layers.iter_mut().map(|l| l.buffers_mut()))
    }

    fn forward_train(&self, x: &Tensor, buffers: &mut Vec<Tensor>) -> Result<Tensor> {
        self.layers
            .iter()
            .try_fold(x.clone(), |h, layer| layer.forward_train(&h, buffers))
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(self.clone())
    }
}

/// Each layer's parameters named `layers.{i}.{name}`, in order: the names
/// of a list of layers.
pub(super) fn layered<T>(layers: impl Iterator<Item = Vec<(String, T)>>) -> Vec<(String, T)> {
    let mut all = Vec::new();
    for (i, params) in layers.enumerate() {
        for (name, t) in params {
            all.push((format!("layers.{i}.{name}"), t));
        }
    }
    all
}

/// `relu`, as a layer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Relu;

impl Module for Relu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.relu()
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(*self)
    }
}

/// Every axis after the first merged into one: `[N, C, H, W]` to
/// `[N, C * H * W]`, between convolutions and linear layers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        let rows = dims.first().copied().unwrap_or(1);
        x.reshape([rows, dims.iter().skip(1).product()])
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(*self)
    }
}

/// `max_pool2d` over a window, as a layer.
#[derive(Clone, Copy, Debug)]
pub struct MaxPool2d(pub Pool2d);

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(&self.0)
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(*self)
    }
}

/// Dropout (`Tensor::dropout`) in training, nothing in inference, as a
/// layer. Its key is a buffer: a training step draws with it and moves it
/// on, so a compiled step that carries its buffers draws a new mask each
/// step without a recompile. The next key is `key * 1103515245 + 12345`
/// (wrapping: a linear congruential step of full period over the i32s):
/// every layer walks the same cycle of keys, each from where its seed put
/// it, and draws one key's numbers only where two walks meet.
#[derive(Clone, Debug)]
pub struct Dropout {
    /// The probability of zeroing an element.
    pub p: f32,
    key: Tensor,
}

impl Dropout {
    /// Dropout with probability `p` (in [0, 1], else an `Err`), its first
    /// key from `seed`.
    pub fn new(p: f32, seed: u64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(crate::Error::Argument {
                op: "Dropout",
                message: format!("p must lie in [0, 1], not {p}"),
            });
        }
        // The seed's 64 bits mixed (SplitMix64's output), so that seeds
        // differing only in their high bits start at different keys.
        let key = Tensor::scalar(crate::rng::SplitMix64::new(seed).next_u64() as u32 as i32);
        Ok(Dropout { p, key })
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn buffers(&self) -> Vec<(String, &Tensor)> {
        vec![("key".to_string(), &self.key)]
    }

    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("key".to_string(), &mut self.key)]
    }

    fn forward_train(&self, x: &Tensor, buffers: &mut Vec<Tensor>) -> Result<Tensor> {
        let y = x.dropout(self.p, &self.key)?;
        buffers.push(((&self.key * 1_103_515_245i32)? + 12_345i32)?);
        Ok(y)
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(self.clone())
    }
}
