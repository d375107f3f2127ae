//! The `Module` trait: a layer's forward pass and its parameters by name,
//! so that layers compose (`Sequential`) and a traced training step puts
//! the state it is given into any model (`Module::with_parameters`).
//! `Relu`, `Flatten` and `MaxPool2d` are modules without parameters, for
//! `Sequential`.

use crate::{Pool2d, Result, Tensor};

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
        let names: Vec<String> = self.parameters().into_iter().map(|(n, _)| n).collect();
        // Too few values leave a parameter with none, which `set_parameters` names.
        if values.len() > names.len() {
            return Err(crate::Error::Parameter {
                name: format!("#{}", names.len()),
                message: format!("{} values for {} parameters", values.len(), names.len()),
            });
        }
        let mut model = self.clone();
        set_parameters(
            model.parameters_mut(),
            names.into_iter().zip(values.iter().cloned()),
        )?;
        Ok(model)
    }
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
