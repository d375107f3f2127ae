//! Gradients against central finite differences on the interpreter
//! (`kiln_support::gradcheck`, which states the tolerance), in f32 or f64:
//! shared by the front end's gradient tests, each of which uses a part.
#![allow(dead_code)]

use kiln::{CompileOptions, DType, Data, Device, Result, Tensor, TensorType, compile_with, grad};
use kiln_support::gradcheck::{self, Rng};

/// The values of f32 or f64 `data` as f32s, the checker's type.
fn floats(data: &Data) -> Vec<f32> {
    match data {
        Data::F32(v) => v.clone(),
        Data::F64(v) => v.iter().map(|&x| x as f32).collect(),
        other => panic!("expected f32 or f64 data, got {other:?}"),
    }
}

/// `values` as data of `dtype`, f32 or f64.
fn data(dtype: DType, values: &[f32]) -> Data {
    match dtype {
        DType::F64 => Data::F64(values.iter().map(|&x| f64::from(x)).collect()),
        _ => Data::F32(values.to_vec()),
    }
}

/// Checks the gradients of `sum(f(inputs) * r)` with respect to every f32
/// input against finite differences of `f`; see `check_in`.
pub fn check(
    inputs: &[(&[usize], Vec<f32>)],
    seed: u64,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> std::result::Result<(), String> {
    check_in(DType::F32, inputs, seed, f)
}

/// Checks the gradients of `sum(f(inputs) * r)` with respect to every input,
/// all of `dtype` (f32 or f64), against finite differences of `f`, both
/// compiled for the interpreter (`Device::Reference`) with the inputs as
/// placeholders, so that each difference is one run, not a new trace. f64
/// runs compute in f64 and are compared at the checker's f32 tolerance:
/// what they check is that each f64 rule is the right one.
pub fn check_in(
    dtype: DType,
    inputs: &[(&[usize], Vec<f32>)],
    seed: u64,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> std::result::Result<(), String> {
    let specs: Vec<TensorType> = inputs
        .iter()
        .map(|(d, _)| TensorType::new(dtype, *d))
        .collect();
    let on_reference =
        |name: &str, specs: &[TensorType], body: &dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>| {
            compile_with(name, specs, CompileOptions::on(Device::Reference), body)
                .map_err(|e| e.to_string())
        };
    let mut forward = on_reference("f", &specs, &|p| Ok(vec![f(p)?]))?;
    let y_type = forward.optimized().graph.output_types()[0].clone();
    let r = Rng(seed).fill(y_type.shape.numel(), |rng| rng.uniform(-1.0, 1.0));
    let n = inputs.len();
    let mut with_r = specs.clone();
    with_r.push(y_type);
    let mut backward = on_reference("df", &with_r, &|p| {
        let loss = f(&p[..n])?.mul(&p[n])?.sum_all()?;
        grad(&loss, &p[..n].iter().collect::<Vec<_>>())
    })?;
    let mut args: Vec<Data> = inputs.iter().map(|(_, v)| data(dtype, v)).collect();
    args.push(data(dtype, &r));
    let refs: Vec<&Data> = args.iter().collect();
    let analytic: Vec<Vec<f32>> = backward
        .run(&refs)
        .map_err(|e| e.to_string())?
        .iter()
        .map(floats)
        .collect();
    let values: Vec<Vec<f32>> = inputs.iter().map(|(_, v)| v.clone()).collect();
    let wrt: Vec<usize> = (0..n).collect();
    gradcheck::check(&values, &wrt, &r, &analytic, |point| {
        let point: Vec<Data> = point.iter().map(|v| data(dtype, v)).collect();
        let refs: Vec<&Data> = point.iter().collect();
        let out = forward.run(&refs).map_err(|e| e.to_string())?;
        Ok(floats(&out[0]))
    })
}

/// The gradient of `loss(x)` with respect to `x`, as a function of `x`:
/// what `check` takes to test second-order gradients, the vector-Jacobian
/// products of a gradient being Hessian-vector products.
pub fn gradient_of(
    loss: impl Fn(&Tensor) -> Result<Tensor>,
) -> impl Fn(&[Tensor]) -> Result<Tensor> {
    move |p: &[Tensor]| Ok(grad(&loss(&p[0])?, &[&p[0]])?.remove(0))
}

/// The gradients of `loss(inputs)` with respect to every input, flattened
/// and joined into one vector, as a function of the inputs: its
/// vector-Jacobian products are Hessian-vector products across all of
/// them (a layer's input and its parameters together).
pub fn gradients_of(
    loss: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> impl Fn(&[Tensor]) -> Result<Tensor> {
    move |p: &[Tensor]| {
        let grads = grad(&loss(p)?, &p.iter().collect::<Vec<_>>())?;
        let flat: Vec<Tensor> = (grads.iter())
            .map(|g| g.reshape([g.numel()]))
            .collect::<Result<_>>()?;
        Tensor::cat(&flat.iter().collect::<Vec<_>>(), 0)
    }
}

/// A loss of one tensor.
pub type Loss = Box<dyn Fn(&Tensor) -> Result<Tensor>>;

/// Each case (a name, its input's shape and values, its loss) with its
/// input of `dtype`: its gradient against differences of its loss, and its
/// Hessian-vector products against differences of its gradient; panics
/// naming every failure.
pub fn assert_second_order(dtype: DType, cases: Vec<(&'static str, Vec<usize>, Vec<f32>, Loss)>) {
    let mut failures = Vec::new();
    for (seed, (name, shape, x, loss)) in cases.into_iter().enumerate() {
        let seed = seed as u64;
        if let Err(e) = check_in(dtype, &[(&shape, x.clone())], seed, |p| loss(&p[0])) {
            failures.push(format!("{name}, first order: {e}"));
        }
        if let Err(e) = check_in(dtype, &[(&shape, x)], seed, gradient_of(&loss)) {
            failures.push(format!("{name}, second order: {e}"));
        }
    }
    assert!(failures.is_empty(), "{dtype}: {}", failures.join("\n"));
}
