//! Attention as one op (`Op::Attention`): `softmax(q kᵀ · scale + bias) v`,
//! which the `attention` pass finds among the ops it stands for where the
//! target runs it as one kernel, so that the scores never lie in memory
//! whole. Its meaning is those ops, rounded as each of them rounds
//! (`evaluate`): a backend's one kernel gives the same values within
//! rounding, its sums in another order.

use smallvec::SmallVec;

use crate::Error;
use crate::elementwise::{BinaryOp, ReduceOp, UnaryOp};
use crate::interp::{binary, materialize, matmul, reduce, unary};
use crate::types::{DType, Data, OutOfMemory, Scalar, Shape, TensorType};
use crate::view::View;

/// What an attention computes besides its products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attention {
    /// How the scores are scaled, where they are.
    pub scale: Option<Scale>,
    /// Whether a bias `[.., l, s]` is added to the scores: its fourth
    /// operand.
    pub bias: bool,
    /// Whether a query whose scores are all -inf gets zeros, as
    /// `Tensor::scaled_dot_product_attention` gives (its softmax's shift
    /// and sum guarded against such rows), rather than NaN, as a plain
    /// softmax gives.
    pub guarded: bool,
}

/// The permutation that swaps the last two of `rank` axes: keys `[.., s,
/// e]` as `kᵀ` `[.., e, s]` and back.
pub(crate) fn transposed(rank: usize) -> SmallVec<[usize; 4]> {
    let mut perm: SmallVec<[usize; 4]> = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    perm
}

/// How attention scales its scores: by an f32 constant, as
/// `Tensor::scaled_dot_product_attention` does, or over one, as attention
/// written by hand does (`q @ k.T / sqrt(d)`). (PyTorch's ONNX export of
/// `F.scaled_dot_product_attention` scales the queries and keys before
/// their product, which leaves the scores unscaled.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scale {
    /// `x * c`.
    Times(Scalar),
    /// `x / c`.
    Over(Scalar),
}

impl Scale {
    /// The factor, to rounding: `c` or `1 / c`.
    pub fn factor(self) -> f32 {
        match self {
            Scale::Times(c) => c.to_f64() as f32,
            Scale::Over(c) => (1.0 / c.to_f64()) as f32,
        }
    }
}

/// What the printed IR shows after the operands: ` scale 0.125 guarded`
/// (` over 8.0` for a scale over a constant).
impl std::fmt::Display for Attention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.scale {
            Some(Scale::Times(c)) => write!(f, " scale {c}")?,
            Some(Scale::Over(c)) => write!(f, " over {c}")?,
            None => {}
        }
        if self.guarded {
            f.write_str(" guarded")?;
        }
        Ok(())
    }
}

impl Attention {
    /// Its operands: queries, keys, values, and the bias where there is one.
    pub fn arity(&self) -> usize {
        3 + usize::from(self.bias)
    }

    /// Its output type, from queries `[.., l, e]`, keys `[.., s, e]`, values
    /// `[.., s, ev]` and the bias `[.., l, s]`, all f32, the leading axes
    /// equal: `[.., l, ev]`.
    pub fn infer(&self, args: &[&TensorType]) -> Result<TensorType, Error> {
        let op = "attention";
        if let Some(t) = args.iter().find(|t| t.dtype != DType::F32) {
            return Err(Error::DType {
                op,
                dtype: t.dtype,
                expected: "f32 operands",
            });
        }
        let (q, k, v) = (&args[0].shape, &args[1].shape, &args[2].shape);
        let r = q.rank();
        let mismatch = |lhs: &Shape, rhs: &Shape| Error::ShapeMismatch {
            op,
            lhs: lhs.clone(),
            rhs: rhs.clone(),
        };
        // Queries and keys share their batch axes and head size; keys and
        // values their batch axes and length.
        let keys = r >= 2
            && k.rank() == r
            && q.dims()[..r - 2] == k.dims()[..r - 2]
            && q.dims()[r - 1] == k.dims()[r - 1];
        if !keys {
            return Err(mismatch(q, k));
        }
        if v.rank() != r || k.dims()[..r - 1] != v.dims()[..r - 1] {
            return Err(mismatch(k, v));
        }
        let [l, s] = [q.dims()[r - 2], k.dims()[r - 2]];
        let mut scores = q.dims().to_vec();
        scores[r - 1] = s;
        if self.bias && args[3].shape.dims() != scores {
            return Err(mismatch(&Shape::new(&scores), &args[3].shape));
        }
        let mut out = q.dims().to_vec();
        (out[r - 2], out[r - 1]) = (l, v.dims()[r - 1]);
        Ok(TensorType::new(DType::F32, out))
    }

    /// The value of the ops it stands for, each rounded as that op is:
    ///
    /// ```text
    /// x = q @ kᵀ, times (or over) the scale, plus bias
    /// m = max(x) along the keys            (guarded: 0 where m is -inf)
    /// e = exp(x - m)
    /// d = sum(e) along the keys            (guarded: 1 where d is 0)
    /// out = (e * recip(d)) @ v
    /// ```
    pub(crate) fn evaluate(&self, args: &[&Data], shapes: &[&Shape]) -> Result<Data, OutOfMemory> {
        let (q, k, v) = (shapes[0], shapes[1], shapes[2]);
        let r = q.rank();
        let keys = View::contiguous(k).permute(&transposed(r));
        let kt = materialize(args[1], &keys)?;
        let s = k.dims()[r - 2];
        let mut dims = q.dims().to_vec();
        dims[r - 1] = s;
        let scores = Shape::new(&dims);
        let mut x = matmul(args[0], &kt, q, &keys.shape, &scores)?;
        let each = |x: &Data, f: &dyn Fn(usize, Scalar) -> Scalar| {
            Data::from_fn(DType::F32, x.len(), |i| f(i, x.get(i)))
        };
        if let Some(scale) = self.scale {
            let (op, c) = match scale {
                Scale::Times(c) => (BinaryOp::Mul, c),
                Scale::Over(c) => (BinaryOp::Div, c),
            };
            x = each(&x, &|_, x| binary(op, x, c))?;
        }
        if self.bias {
            x = each(&x, &|i, x| binary(BinaryOp::Add, x, args[3].get(i)))?;
        }
        dims[r - 1] = 1;
        let rows = Shape::new(&dims);
        let last = [r - 1];
        let guard = |d: &Data, when: f32, then: f32| {
            each(d, &|_, d| {
                let hit = binary(BinaryOp::Eq, d, Scalar::F32(when)) == Scalar::Bool(true);
                if self.guarded && hit {
                    Scalar::F32(then)
                } else {
                    d
                }
            })
        };
        let m = guard(
            &reduce(ReduceOp::Max, &last, &x, &scores, &rows)?,
            f32::NEG_INFINITY,
            0.0,
        )?;
        // Element `i` of the scores lies in row `i / s`.
        let e = each(&x, &|i, x| {
            unary(UnaryOp::Exp, binary(BinaryOp::Sub, x, m.get(i / s)))
        })?;
        let d = guard(&reduce(ReduceOp::Sum, &last, &e, &scores, &rows)?, 0.0, 1.0)?;
        let recip = each(&d, &|_, d| unary(UnaryOp::Recip, d))?;
        let w = each(&e, &|i, e| binary(BinaryOp::Mul, e, recip.get(i / s)))?;
        let mut out = q.dims().to_vec();
        out[r - 1] = v.dims()[r - 1];
        matmul(&w, args[2], &scores, v, &Shape::new(&out))
    }
}
