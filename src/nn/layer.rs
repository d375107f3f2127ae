//! `Linear`, `Conv2d`, `Embedding`, `LayerNorm` and `Mlp`: parameters in
//! public fields, seeded initialization as PyTorch's, named for saving and
//! for setting by name (`Module`).

use std::collections::HashMap;

use super::Module;
use super::module::layered;
use crate::rng::SplitMix64;
use crate::{Error, Result, Scalar, Tensor};

/// `y = x @ weight + bias`.
///
/// The weight is `[in, out]`, as JAX and Flax store it and as kiln's
/// quickstart and benchmarks always have: the forward pass is a matmul with
/// no transpose. PyTorch stores `[out, in]` and multiplies by the
/// transpose; a weight from a PyTorch checkpoint goes in as `w.t()`.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[in, out]`.
    pub weight: Tensor,
    /// `[out]`.
    pub bias: Tensor,
}

impl Linear {
    /// A layer from `inputs` to `outputs` features, initialized as
    /// PyTorch's `nn.Linear`: weight and bias uniform in
    /// `[-1/sqrt(inputs), 1/sqrt(inputs))` (Kaiming-uniform with
    /// `a = sqrt(5)`), drawn from `seed`, weight first.
    pub fn new(inputs: usize, outputs: usize, seed: u64) -> Result<Linear> {
        Linear::drawn(inputs, outputs, &mut SplitMix64::new(seed))
    }

    fn drawn(inputs: usize, outputs: usize, rng: &mut SplitMix64) -> Result<Linear> {
        let mut uniform = fan_in_uniform(inputs, rng);
        Ok(Linear {
            weight: Tensor::from_vec(uniform(inputs * outputs), [inputs, outputs])?,
            bias: Tensor::from_vec(uniform(outputs), [outputs])?,
        })
    }
}

impl Module for Linear {
    /// `x @ weight + bias` for `x` of shape `[.., in]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.matmul(&self.weight)?.add(&self.bias)
    }

    /// `weight` and `bias`, by name.
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }

    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(self.clone())
    }
}

/// Batch normalization of NCHW data over the batch and the plane, per
/// channel, with a learned scale and shift, as PyTorch's `nn.BatchNorm2d`:
/// `forward_train` normalizes by the batch's mean and (biased) variance
/// and moves the running statistics toward them by `momentum` (the
/// variance unbiased, as PyTorch's); `forward` normalizes by the running
/// statistics.
#[derive(Clone, Debug)]
pub struct BatchNorm2d {
    /// `[channels]`, initially ones.
    pub weight: Tensor,
    /// `[channels]`, initially zeros.
    pub bias: Tensor,
    /// `[channels]`, initially zeros: a buffer.
    pub running_mean: Tensor,
    /// `[channels]`, initially ones: a buffer.
    pub running_var: Tensor,
    /// Added to the variance: 1e-5.
    pub eps: f32,
    /// How far a step moves the running statistics: 0.1.
    pub momentum: f32,
}

impl BatchNorm2d {
    /// Normalization of `channels` channels: the identity scale and shift,
    /// PyTorch's defaults.
    pub fn new(channels: usize) -> Result<BatchNorm2d> {
        let ones = Tensor::from_vec(vec![1.0f32; channels], [channels])?;
        let zeros = Tensor::from_vec(vec![0.0f32; channels], [channels])?;
        Ok(BatchNorm2d {
            weight: ones.clone(),
            bias: zeros.clone(),
            running_mean: zeros,
            running_var: ones,
            eps: 1e-5,
            momentum: 0.1,
        })
    }

    /// `x` normalized by `mean` and `var` (`[1, C, 1, 1]`), scaled and shifted.
    fn normalized(&self, x: &Tensor, mean: &Tensor, var: &Tensor) -> Result<Tensor> {
        let c = self.weight.numel();
        let channel = |t: &Tensor| t.reshape([1, c, 1, 1]);
        let inv_std = var.add(&like(self.eps, var))?.sqrt()?.recip()?;
        let y = x.sub(mean)?.mul(&inv_std)?;
        y.mul(&channel(&self.weight)?)?.add(&channel(&self.bias)?)
    }

    fn check(&self, x: &Tensor) -> Result<()> {
        let c = self.weight.numel();
        if x.rank() != 4 || x.dims()[1] != c {
            return Err(kiln_ir::Error::ShapeMismatch {
                op: "BatchNorm2d",
                lhs: x.shape().clone(),
                rhs: self.weight.shape().clone(),
            }
            .into());
        }
        Ok(())
    }
}

impl Module for BatchNorm2d {
    /// `x` normalized by the running statistics (PyTorch's eval mode).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check(x)?;
        let c = self.weight.numel();
        let mean = self.running_mean.reshape([1, c, 1, 1])?;
        let var = self.running_var.reshape([1, c, 1, 1])?;
        self.normalized(x, &mean, &var)
    }

    /// `weight` and `bias`, by name.
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }

    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
    }

    /// `running_mean` and `running_var`, by name.
    fn buffers(&self) -> Vec<(String, &Tensor)> {
        vec![
            ("running_mean".into(), &self.running_mean),
            ("running_var".into(), &self.running_var),
        ]
    }

    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![
            ("running_mean".into(), &mut self.running_mean),
            ("running_var".into(), &mut self.running_var),
        ]
    }

    /// `x` normalized by the batch's statistics; the running statistics
    /// moved toward them pushed onto `buffers`.
    fn forward_train(&self, x: &Tensor, buffers: &mut Vec<Tensor>) -> Result<Tensor> {
        self.check(x)?;
        let axes = [0, 2, 3];
        let mean = x.mean(&axes, true)?;
        let var = x.var(&axes, 0, true)?;
        let n = x.numel() / self.weight.numel().max(1);
        // The running statistics carry no gradient; the variance unbiased.
        let c = self.weight.numel();
        let batch_mean = mean.detach()?.reshape([c])?;
        let unbiased = like(n as f32 / (n.max(2) - 1) as f32, x);
        let batch_var = var.detach()?.reshape([c])?.mul(&unbiased)?;
        let (m, rest) = (like(self.momentum, x), like(1.0 - self.momentum, x));
        for (running, batch) in [
            (&self.running_mean, batch_mean),
            (&self.running_var, batch_var),
        ] {
            buffers.push(running.mul(&rest)?.add(&batch.mul(&m)?)?);
        }
        self.normalized(x, &mean, &var)
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(self.clone())
    }
}

/// `value` as a scalar of `t`'s type: a hyperparameter of a module cast to
/// the type the module computes in (`Module::to_dtype`).
fn like(value: f32, t: &Tensor) -> Tensor {
    Tensor::scalar(Scalar::F32(value).cast(t.dtype()))
}

/// `n` values uniform in PyTorch's `[-1/sqrt(fan_in), 1/sqrt(fan_in))`,
/// from `rng`; zeros for a layer with no inputs, as PyTorch draws them.
fn fan_in_uniform(fan_in: usize, rng: &mut SplitMix64) -> impl FnMut(usize) -> Vec<f32> + '_ {
    let bound = if fan_in == 0 {
        0.0
    } else {
        1.0 / (fan_in as f32).sqrt()
    };
    move |n| {
        (0..n)
            .map(|_| (2.0 * rng.next_f32() - 1.0) * bound)
            .collect()
    }
}

/// A layer's `weight` and `bias`, by name.
fn weight_and_bias<'a>(weight: &'a Tensor, bias: &'a Tensor) -> Vec<(String, &'a Tensor)> {
    vec![("weight".into(), weight), ("bias".into(), bias)]
}

/// A layer's `weight` and `bias`, by name, to be replaced.
fn weight_and_bias_mut<'a>(
    weight: &'a mut Tensor,
    bias: &'a mut Tensor,
) -> Vec<(String, &'a mut Tensor)> {
    vec![("weight".into(), weight), ("bias".into(), bias)]
}

/// A table of learned vectors looked up by id, as PyTorch's
/// `nn.Embedding`: each id reads its row (`Tensor::index_select`, work the
/// size of the rows read), and the table's gradient adds each row's
/// gradient where its id points (a scatter-add).
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `[ids, width]`.
    pub weight: Tensor,
}

impl Embedding {
    /// A table of `ids` vectors of `width`, drawn from N(0, 1) by `seed`,
    /// as PyTorch's `nn.Embedding` initializes it.
    pub fn new(ids: usize, width: usize, seed: u64) -> Result<Embedding> {
        Ok(Embedding {
            weight: Tensor::randn([ids, width], seed)?,
        })
    }
}

impl Module for Embedding {
    /// The rows of i32 or i64 `ids` of any shape: `ids`' shape with the
    /// width last. A negative id counts from the end; one outside the table
    /// reads NaN (see `Tensor::gather`).
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if self.weight.rank() != 2 {
            return Err(Error::Rank {
                op: "Embedding",
                shape: self.weight.shape().clone(),
                rank: 2,
            });
        }
        let rows = self.weight.index_select(0, &ids.reshape([ids.numel()])?)?;
        let mut dims = ids.dims().to_vec();
        dims.push(self.weight.dims()[1]);
        rows.reshape(dims)
    }

    /// `weight`, by name.
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("weight".into(), &self.weight)]
    }

    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("weight".into(), &mut self.weight)]
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(self.clone())
    }
}

/// Layer normalization over the last axis with a learned scale and shift
/// (`Tensor::layer_norm`).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// `[features]`, initially ones.
    pub weight: Tensor,
    /// `[features]`, initially zeros.
    pub bias: Tensor,
    /// Added to the variance: 1e-5, as PyTorch's default.
    pub eps: f32,
}

impl LayerNorm {
    /// Normalization of `features` features, the identity scale and shift.
    pub fn new(features: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: Tensor::from_vec(vec![1.0f32; features], [features])?,
            bias: Tensor::from_vec(vec![0.0f32; features], [features])?,
            eps: 1e-5,
        })
    }
}

impl Module for LayerNorm {
    /// `x` normalized over its last axis, scaled and shifted.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(&self.weight, &self.bias, self.eps)
    }

    /// `weight` and `bias`, by name.
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }

    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(self.clone())
    }
}

/// Linear layers with relu between them (none after the last).
#[derive(Clone, Debug)]
pub struct Mlp {
    /// The layers, input first.
    pub layers: Vec<Linear>,
}

impl Mlp {
    /// Layers between consecutive `sizes` (`[784, 256, 10]`: two layers),
    /// each initialized as `Linear::new`, all drawn from one stream of `seed`.
    pub fn new(sizes: &[usize], seed: u64) -> Result<Mlp> {
        let mut rng = SplitMix64::new(seed);
        let layers = sizes
            .windows(2)
            .map(|pair| Linear::drawn(pair[0], pair[1], &mut rng))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers })
    }
}

impl Module for Mlp {
    /// The layers applied in order, relu between them.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }

    /// Every layer's parameters, named `layers.{i}.weight` and `layers.{i}.bias`.
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        layered(self.layers.iter().map(Module::parameters))
    }

    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        layered(self.layers.iter_mut().map(Module::parameters_mut))
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(self.clone())
    }
}

/// A 2-D convolution of NCHW data (`Tensor::conv2d`), as PyTorch's
/// `nn.Conv2d`.
#[derive(Clone, Debug)]
pub struct Conv2d {
    /// `[out, in / groups, kh, kw]`.
    pub weight: Tensor,
    /// `[out]`.
    pub bias: Tensor,
    /// Steps between windows along height and width.
    pub stride: [usize; 2],
    /// `(before, after)` zero padding of height and width.
    pub padding: [(usize, usize); 2],
    /// Steps between a window's elements along height and width.
    pub dilation: [usize; 2],
    /// Input and output channels split into this many groups.
    pub groups: usize,
}

impl Conv2d {
    /// A convolution from `inputs` to `outputs` channels over a `kernel`
    /// window, stride 1, no padding, no dilation, one group, initialized as
    /// PyTorch's `nn.Conv2d`: weight and bias uniform in `[-1/sqrt(fan_in),
    /// 1/sqrt(fan_in))`, `fan_in = inputs * kh * kw`, drawn from `seed`,
    /// weight first. Set `stride`, `padding` and `dilation` as needed; a
    /// grouped convolution also needs a weight of its own shape.
    pub fn new(inputs: usize, outputs: usize, kernel: [usize; 2], seed: u64) -> Result<Conv2d> {
        let fan_in = inputs * kernel[0] * kernel[1];
        let mut rng = SplitMix64::new(seed);
        let mut uniform = fan_in_uniform(fan_in, &mut rng);
        Ok(Conv2d {
            weight: Tensor::from_vec(
                uniform(outputs * fan_in),
                [outputs, inputs, kernel[0], kernel[1]],
            )?,
            bias: Tensor::from_vec(uniform(outputs), [outputs])?,
            stride: [1, 1],
            padding: [(0, 0); 2],
            dilation: [1, 1],
            groups: 1,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv2d(
            &self.weight,
            Some(&self.bias),
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )
    }

    /// `weight` and `bias`, by name.
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        weight_and_bias(&self.weight, &self.bias)
    }

    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        weight_and_bias_mut(&mut self.weight, &mut self.bias)
    }

    fn boxed(&self) -> Box<dyn Module> {
        Box::new(self.clone())
    }
}

/// Replaces each of `targets` by the value of the same name in `values`
/// (`nn::load`'s result, or a training step's new parameters):
/// `set_parameters(mlp.parameters_mut(), nn::load(path)?)`. Every target
/// needs exactly one value of its dtype and shape, and every value a
/// target; otherwise nothing is replaced and the `Err` names the parameter.
pub fn set_parameters(
    targets: Vec<(String, &mut Tensor)>,
    values: impl IntoIterator<Item = (String, Tensor)>,
) -> Result<()> {
    let fail = |name: &str, message: String| Error::Parameter {
        name: name.to_string(),
        message,
    };
    let mut by_name: HashMap<String, Tensor> = HashMap::new();
    for (name, value) in values {
        if by_name.contains_key(&name) {
            return Err(fail(&name, "given twice".into()));
        }
        by_name.insert(name, value);
    }
    let mut pairs = Vec::with_capacity(targets.len());
    for (name, target) in targets {
        let value = by_name
            .remove(&name)
            .ok_or_else(|| fail(&name, "no value given".into()))?;
        if value.dtype() != target.dtype() || value.shape() != target.shape() {
            return Err(fail(
                &name,
                format!(
                    "a value of {}{} for a parameter of {}{}",
                    value.dtype(),
                    value.shape(),
                    target.dtype(),
                    target.shape()
                ),
            ));
        }
        pairs.push((target, value));
    }
    if let Some(name) = by_name.keys().min() {
        return Err(fail(name, "is not a parameter of the model".into()));
    }
    for (target, value) in pairs {
        *target = value;
    }
    Ok(())
}
