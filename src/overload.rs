//! Operators on tensors and scalars. Like the methods they call, they return
//! `Result<Tensor>`, so `(&a + &b)?.relu()` reads as math and still reports
//! shapes that do not broadcast. A scalar operand is a constant of its own
//! dtype: `&x + 1.0` needs an f32 tensor, `&n + 1` an i32 one.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::{Result, Tensor};

macro_rules! binary_operator {
    ($trait:ident, $method:ident) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(&self, rhs)
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(&self, &rhs)
            }
        }
        binary_operator!(@scalar $trait, $method, f32);
        binary_operator!(@scalar $trait, $method, i32);
    };
    (@scalar $trait:ident, $method:ident, $scalar:ty) => {
        impl $trait<$scalar> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: $scalar) -> Result<Tensor> {
                Tensor::$method(self, &Tensor::scalar(rhs))
            }
        }
        impl $trait<$scalar> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: $scalar) -> Result<Tensor> {
                Tensor::$method(&self, &Tensor::scalar(rhs))
            }
        }
        impl $trait<&Tensor> for $scalar {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(&Tensor::scalar(self), rhs)
            }
        }
        impl $trait<Tensor> for $scalar {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(&Tensor::scalar(self), &rhs)
            }
        }
    };
}

binary_operator!(Add, add);
binary_operator!(Sub, sub);
binary_operator!(Mul, mul);
binary_operator!(Div, div);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}
