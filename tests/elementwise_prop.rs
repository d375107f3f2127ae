//! Random elementwise graphs, built with the Tensor API (broadcasting
//! included) and realized by the interpreter (`Device::Reference`), agree bit for bit with a direct
//! scalar evaluation of the same expression, element by element.
//!
//! The scalar evaluator is written independently from the op definitions:
//! f32 arithmetic for `+ - * /` and `sqrt` (IEEE, so exact), f64 rounded once
//! for the transcendental functions, NaN-propagating max, min and relu.

use kiln::{Device, Result, Tensor};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
enum Un {
    Neg,
    Exp,
    Log,
    Sqrt,
    Recip,
    Relu,
    Sigmoid,
    Tanh,
    Abs,
}

#[derive(Clone, Copy, Debug)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
    Rem,
}

#[derive(Clone, Copy, Debug)]
enum Cmp {
    Lt,
    Le,
    Eq,
    Ne,
}

#[derive(Clone, Debug)]
enum Expr {
    Input(usize),
    Const(f32),
    Unary(Un, Box<Expr>),
    Binary(Bin, Box<Expr>, Box<Expr>),
    /// `where(cmp(a, b), x, y)`
    Select(Cmp, Box<[Expr; 4]>),
}

const INPUTS: usize = 3;

fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -4.0f32..4.0,
        1 => prop::sample::select(vec![0.0, -0.0, 1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]),
    ]
}

fn expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        3 => (0..INPUTS).prop_map(Expr::Input),
        1 => value().prop_map(Expr::Const),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        let un = prop::sample::select(vec![
            Un::Neg,
            Un::Exp,
            Un::Log,
            Un::Sqrt,
            Un::Recip,
            Un::Relu,
            Un::Sigmoid,
            Un::Tanh,
            Un::Abs,
        ]);
        let bin = prop::sample::select(vec![
            Bin::Add,
            Bin::Sub,
            Bin::Mul,
            Bin::Div,
            Bin::Max,
            Bin::Min,
            Bin::Pow,
            Bin::Rem,
        ]);
        let cmp = prop::sample::select(vec![Cmp::Lt, Cmp::Le, Cmp::Eq, Cmp::Ne]);
        prop_oneof![
            (un, inner.clone()).prop_map(|(op, a)| Expr::Unary(op, Box::new(a))),
            (bin, inner.clone(), inner.clone()).prop_map(|(op, a, b)| Expr::Binary(
                op,
                Box::new(a),
                Box::new(b)
            )),
            (cmp, [inner.clone(), inner.clone(), inner.clone(), inner])
                .prop_map(|(c, e)| Expr::Select(c, Box::new(e))),
        ]
    })
}

/// An output shape of rank 0..=3, and for each input a shape that broadcasts
/// to it (leading axes dropped, some axes set to 1), with its values.
fn inputs() -> impl Strategy<Value = Vec<(Vec<usize>, Vec<f32>)>> {
    prop::collection::vec(1usize..=5, 0..=3).prop_flat_map(|out| {
        let one = move || {
            let out = out.clone();
            (
                0..=out.len(),
                prop::collection::vec(any::<bool>(), out.len()),
            )
                .prop_flat_map(move |(drop, ones)| {
                    let shape: Vec<usize> = out
                        .iter()
                        .zip(&ones)
                        .skip(drop)
                        .map(|(&d, &one)| if one { 1 } else { d })
                        .collect();
                    let n: usize = shape.iter().product();
                    (Just(shape), prop::collection::vec(value(), n))
                })
        };
        prop::collection::vec(one(), INPUTS)
    })
}

fn build(e: &Expr, inputs: &[Tensor]) -> Result<Tensor> {
    Ok(match e {
        Expr::Input(i) => inputs[*i].clone(),
        Expr::Const(v) => Tensor::scalar(*v),
        Expr::Unary(op, a) => {
            let a = build(a, inputs)?;
            match op {
                Un::Neg => a.neg()?,
                Un::Exp => a.exp()?,
                Un::Log => a.log()?,
                Un::Sqrt => a.sqrt()?,
                Un::Recip => a.recip()?,
                Un::Relu => a.relu()?,
                Un::Sigmoid => a.sigmoid()?,
                Un::Tanh => a.tanh()?,
                Un::Abs => a.abs()?,
            }
        }
        Expr::Binary(op, a, b) => {
            let (a, b) = (build(a, inputs)?, build(b, inputs)?);
            match op {
                Bin::Add => (&a + &b)?,
                Bin::Sub => (&a - &b)?,
                Bin::Mul => (&a * &b)?,
                Bin::Div => (&a / &b)?,
                Bin::Max => a.maximum(&b)?,
                Bin::Min => a.minimum(&b)?,
                Bin::Pow => a.pow(&b)?,
                Bin::Rem => a.fmod(&b)?,
            }
        }
        Expr::Select(cmp, e) => {
            let [a, b, x, y] = &**e;
            let (a, b) = (build(a, inputs)?, build(b, inputs)?);
            let cond = match cmp {
                Cmp::Lt => a.lt(&b)?,
                Cmp::Le => a.le(&b)?,
                Cmp::Eq => a.eq(&b)?,
                Cmp::Ne => a.ne(&b)?,
            };
            cond.where_cond(&build(x, inputs)?, &build(y, inputs)?)?
        }
    })
}

/// The expression at output coordinates `coords`, reading each input through
/// NumPy broadcasting by hand.
fn scalar(e: &Expr, coords: &[usize], inputs: &[(Vec<usize>, Vec<f32>)]) -> f32 {
    let rounded = |v: f64| v as f32;
    match e {
        Expr::Input(i) => {
            let (shape, values) = &inputs[*i];
            let lead = coords.len() - shape.len();
            let flat = shape.iter().enumerate().fold(0, |acc, (a, &d)| {
                acc * d + if d == 1 { 0 } else { coords[lead + a] }
            });
            values[flat]
        }
        Expr::Const(v) => *v,
        Expr::Unary(op, a) => {
            let a = scalar(a, coords, inputs);
            match op {
                Un::Neg => -a,
                Un::Exp => rounded((a as f64).exp()),
                Un::Log => rounded((a as f64).ln()),
                Un::Sqrt => a.sqrt(),
                Un::Recip => 1.0 / a,
                Un::Relu if a.is_nan() => a,
                Un::Relu => {
                    if a > 0.0 {
                        a
                    } else {
                        0.0
                    }
                }
                Un::Sigmoid => rounded(1.0 / (1.0 + (-(a as f64)).exp())),
                Un::Tanh => rounded((a as f64).tanh()),
                Un::Abs => a.abs(),
            }
        }
        Expr::Binary(op, a, b) => {
            let (a, b) = (scalar(a, coords, inputs), scalar(b, coords, inputs));
            match op {
                Bin::Add => a + b,
                Bin::Sub => a - b,
                Bin::Mul => a * b,
                Bin::Div => a / b,
                Bin::Max | Bin::Min if a.is_nan() || b.is_nan() => f32::NAN,
                // kiln's maximum and minimum order -0 below +0 (IEEE
                // 754-2019), where `f32::max` may return either zero, and a
                // `recip` after them tells the zeros apart.
                Bin::Max if a == b => {
                    if a.is_sign_negative() {
                        b
                    } else {
                        a
                    }
                }
                Bin::Min if a == b => {
                    if a.is_sign_positive() {
                        b
                    } else {
                        a
                    }
                }
                Bin::Max => a.max(b),
                Bin::Min => a.min(b),
                Bin::Pow => rounded((a as f64).powf(b as f64)),
                Bin::Rem => a % b,
            }
        }
        Expr::Select(cmp, e) => {
            let [a, b, x, y] = &**e;
            let (a, b) = (scalar(a, coords, inputs), scalar(b, coords, inputs));
            let holds = match cmp {
                Cmp::Lt => a < b,
                Cmp::Le => a <= b,
                Cmp::Eq => a == b,
                Cmp::Ne => a != b,
            };
            scalar(if holds { x } else { y }, coords, inputs)
        }
    }
}

/// Equal as values, any NaN equal to any NaN, +0 equal to -0 (a zero's
/// sign shows only through a division or `recip`, after ops the reference
/// computes as kiln does).
fn same(a: f32, b: f32) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_elementwise_graphs_match_scalar_evaluation(e in expr(), data in inputs()) {
        let tensors: Vec<Tensor> = data
            .iter()
            .map(|(shape, values)| Tensor::from_slice(values, shape.as_slice()).unwrap().to(Device::Reference).unwrap())
            .collect();
        let out = build(&e, &tensors).unwrap();
        let got = out.to_vec::<f32>().unwrap();
        let dims = out.dims().to_vec();
        for (i, &g) in got.iter().enumerate() {
            let mut coords = vec![0; dims.len()];
            let mut rest = i;
            for (c, &d) in coords.iter_mut().zip(&dims).rev() {
                *c = rest % d;
                rest /= d;
            }
            let want = scalar(&e, &coords, &data);
            prop_assert!(same(g, want), "element {i} at {coords:?}: graph {g:?}, scalar {want:?}\n{}", kiln::capture("case", &[&out]));
        }
    }
}
