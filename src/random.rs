//! Random numbers inside the graph (`Tensor::uniform`, `Tensor::dropout`):
//! element `i` of a draw is `uniform(key, i)`, Threefry-2x32-20 of its
//! position under an i32 key (`kiln_ir::random`), computed in whatever
//! kernel reads it. The same key gives the same numbers on every backend,
//! fused or not; a compiled step fed a new key each step (JAX's key
//! threading; `nn::Dropout` carries its key as a buffer) draws anew without
//! a recompile. `Tensor::rand` and `randn`, by contrast, draw on the host.

use kiln_ir::{BinaryOp, DType, Op, Scalar, Shape};

use crate::ops::ramp;
use crate::{Error, Result, Tensor};

/// A key must be one i32.
fn check_key(op: &'static str, key: &Tensor) -> Result<()> {
    match key.dtype() == DType::I32 && key.numel() == 1 {
        true => Ok(()),
        false => Err(Error::Argument {
            op,
            message: format!("the key must be one i32, not {}", key.ty()),
        }),
    }
}

impl Tensor {
    /// f32 values drawn uniformly from [0, 1) in the graph, of `shape`:
    /// element `i` (row-major) is `kiln_ir::random::uniform(key, i)`, a
    /// multiple of 2^-24. `key` is an i32 of one element (JAX's
    /// `random.uniform(key, shape)`); shapes of 2^31 elements or more are
    /// an `Err`.
    pub fn uniform(key: &Tensor, shape: impl Into<Shape>) -> Result<Tensor> {
        const OP: &str = "uniform";
        let shape = shape.into();
        check_key(OP, key)?;
        if shape.numel() == 0 {
            return Tensor::scalar(0.0f32).expand(shape);
        }
        if i32::try_from(shape.numel()).is_err() {
            return Err(Error::Argument {
                op: OP,
                message: format!("{shape} has more positions than an i32 counts"),
            });
        }
        // Each element's position: one ramp per axis (of more than one
        // element), scaled by its stride, added up: broadcast ramps as long
        // as the axes, not a tensor of positions.
        let dims = shape.dims();
        let mut position = Tensor::scalar(0i32).expand(shape.clone())?;
        let mut stride = 1;
        for a in (0..dims.len()).rev() {
            if dims[a] > 1 {
                let steps = (0..dims[a]).map(|i| (i * stride) as i32);
                position = (position + ramp(steps, a, dims.len())?)?;
            }
            stride *= dims[a];
        }
        let key = key.reshape(Shape::new(&[]))?.expand(shape)?;
        Tensor::lazy(Op::Binary(BinaryOp::Uniform), &[&key, &position])
    }

    /// Dropout as in training (PyTorch's `dropout`): each element zeroed
    /// with probability `p` and the others scaled by `1 / (1 - p)`, by the
    /// draws of `Tensor::uniform(key, self's shape)` (an element is kept
    /// where its draw is at least `p`). `p` = 0 keeps every element, `p` =
    /// 1 none; `p` outside [0, 1] is an `Err`. The gradient flows through
    /// the kept elements, scaled alike. Float tensors only.
    pub fn dropout(&self, p: f32, key: &Tensor) -> Result<Tensor> {
        const OP: &str = "dropout";
        check_key(OP, key)?;
        if !self.dtype().is_float() {
            return Err(kiln_ir::Error::DType {
                op: OP,
                dtype: self.dtype(),
                expected: "a float type",
            }
            .into());
        }
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::Argument {
                op: OP,
                message: format!("p must lie in [0, 1], not {p}"),
            });
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let zeros = Tensor::scalar(0.0f32)
            .cast(self.dtype())?
            .expand(self.shape().clone())?;
        if p == 1.0 {
            return Ok(zeros);
        }
        // Rounded once, from f64, to the tensor's type.
        let scale = Tensor::scalar(Scalar::F64(1.0 / (1.0 - f64::from(p)))).cast(self.dtype())?;
        let kept = Tensor::uniform(key, self.shape().clone())?.ge(&Tensor::scalar(p))?;
        kept.where_cond(&(self * &scale)?, &zeros)
    }
}
