//! `kiln::onnx::export` end to end: an MLP trained on the shipped digits,
//! exported and read back by kiln's own ONNX reader, compiles to the same
//! graph and computes the same bits; every kiln op, exported alone on
//! random inputs of awkward shapes, reads back to the values of the
//! original on the interpreter and on the CPU; a graph the optimizer
//! fused is refused with an error naming the op.
//!
//! Each model is also left in `target/tmp/onnx_export/`, a folder per
//! model with its inputs and kiln's outputs on the CPU, for
//! `tests/onnx/check_export.py`, which checks them with onnx's checker and
//! onnxruntime (see `tests/onnx/README.md`).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::sync::Arc;

use kiln::data::npy::{NpyArray, NpyDType, write_npy};
use kiln::data::{ArrayDataset, DataLoader, Dataset, LoaderOptions, Subset, Zip};
use kiln::nn::{Mlp, Module};
use kiln::onnx::{Feed, Model, OnnxError};
use kiln::optim::{AdamW, Optimizer};
use kiln::{CompileOptions, DType, Device, Error, Result, Scalar, Tensor, TensorType};

/// Images per training step and per exported batch.
const BATCH: usize = 250;

/// The quickstart's normalization of the bytes, flattened.
fn pixels(images: &Tensor) -> Result<Tensor> {
    let rows = images.dims()[0];
    let x = ((images.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081);
    x?.reshape([rows, 784])
}

/// A 784-64-10 MLP trained for two epochs on the first 1,000 digits.
fn trained_mlp(dir: &Path) -> Result<Mlp> {
    let images: Arc<dyn Dataset> = Arc::new(ArrayDataset::npy(dir.join("images.npy"))?);
    let labels: Arc<dyn Dataset> = Arc::new(ArrayDataset::npy(dir.join("labels.npy"))?);
    let train = Zip::new(vec![
        Box::new(Subset::new(images, 0..1000)?),
        Box::new(Subset::new(labels, 0..1000)?),
    ])?;
    let options = LoaderOptions {
        batch_size: BATCH,
        shuffle: Some(1),
        drop_last: true,
        ..LoaderOptions::default()
    };
    let mut loader = DataLoader::new(Arc::new(train), options)?;
    let mlp = Mlp::new(&[784, 64, 10], 3)?;
    let adam = AdamW::new(1e-3);
    let params: Vec<&Tensor> = mlp.parameters().into_iter().map(|(_, p)| p).collect();
    let n = params.len();
    let mut state: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    state.extend(adam.state(&params)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let batch = [
        TensorType::new(DType::U8, [BATCH, 28, 28]),
        TensorType::new(DType::I32, [BATCH]),
    ];
    let mut step = kiln::compile_step("train", &state, &batch, |s, b| {
        let (p, moments) = s.split_at(n);
        let loss = mlp
            .with_parameters(p)?
            .forward(&pixels(&b[0])?)?
            .cross_entropy(&b[1])?;
        let grads = kiln::grad(&loss, &p.iter().collect::<Vec<_>>())?;
        let (p, moments) = adam.update(p, &grads, moments)?;
        Ok((vec![loss], p.into_iter().chain(moments).collect()))
    })?;
    for epoch in 0..2 {
        let mut batches = loader.epoch(epoch);
        while let Some(b) = batches.next() {
            let b = b?;
            step.run(&b.inputs())?;
            batches.recycle(b);
        }
    }
    mlp.with_parameters(&step.state()?[..n])
}

#[test]
fn a_trained_mlp_reads_back_to_the_same_graph_and_bits() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    let mlp = trained_mlp(&dir)?;
    let spec = TensorType::new(DType::U8, [BATCH, 28, 28]);
    let forward = |x: &[Tensor]| -> Result<Vec<Tensor>> {
        let logits = mlp.forward(&pixels(&x[0])?)?;
        let log_probs = logits.log_softmax(-1)?;
        Ok(vec![logits, log_probs])
    };
    let bytes = kiln::onnx::export("mlp", std::slice::from_ref(&spec), forward)?;
    let model = Model::from_bytes(&bytes, "mlp.onnx")?;
    assert_eq!(
        model.op_types(),
        [
            "Cast",
            "Constant",
            "Expand",
            "Mul",
            "Sub",
            "Reshape",
            "MatMul",
            "Add",
            "Relu",
            "ReduceMax",
            "Identity",
            "Exp",
            "ReduceSum",
            "Log"
        ]
    );
    let images = NpyArray::open(dir.join("images.npy"))?.rows(4000, 4000 + BATCH)?;
    for device in [Device::Cpu, Device::Reference] {
        let options = CompileOptions::on(device);
        let mut original =
            kiln::compile_with("mlp", std::slice::from_ref(&spec), options, forward)?;
        let mut read_back = model.compile_with(&[Feed::Input(spec.clone())], options)?;
        // The same graph, so the same kernels and the same bits.
        assert_eq!(
            original.optimized().graph,
            read_back.optimized().graph,
            "{device:?}"
        );
        let want = original.call(&[&images])?;
        let got = read_back.call(&[&images])?;
        for (w, g) in want.iter().zip(&got) {
            let (w, g) = (w.to_vec::<f32>()?, g.to_vec::<f32>()?);
            assert!(w.iter().zip(&g).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        if device == Device::Cpu {
            save("mlp", &bytes, std::slice::from_ref(&images), &want)?;
        }
    }
    Ok(())
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    OnnxError::Io {
        file: path.display().to_string(),
        message: e.to_string(),
    }
    .into()
}

/// Writes `model.onnx`, `input_{i}.npy` and `output_{k}.npy` to a folder
/// of `target/tmp/onnx_export/` named by `what` and a hash of the model
/// and its inputs, so that the same case always lands in the same folder.
fn save(what: &str, model: &[u8], inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
    // kiln's `.npy` has no 16-bit floats: such cases are checked here only.
    if inputs.iter().chain(outputs).any(|t| t.dtype().is_half()) {
        return Ok(());
    }
    let npy = |t: &Tensor| -> Result<(NpyDType, Vec<u8>)> {
        Ok(match t.dtype() {
            DType::F32 => (
                NpyDType::F32,
                t.to_vec::<f32>()?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            DType::F64 => (
                NpyDType::F64,
                t.to_vec::<f64>()?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            DType::I64 => (
                NpyDType::I64,
                t.to_vec::<i64>()?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            DType::I32 => (
                NpyDType::I32,
                t.to_vec::<i32>()?
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            DType::U8 => (NpyDType::U8, t.to_vec::<u8>()?),
            DType::Bool => (
                NpyDType::Bool,
                t.to_vec::<bool>()?.iter().map(|&b| u8::from(b)).collect(),
            ),
            // Returned above.
            dtype @ (DType::BF16 | DType::F16) => panic!("{what}: no .npy of {dtype}"),
        })
    };
    let mut hasher = DefaultHasher::new();
    model.hash(&mut hasher);
    for t in inputs {
        npy(t)?.1.hash(&mut hasher);
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("onnx_export")
        .join(format!("{what}-{:08x}", hasher.finish() as u32));
    std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
    let path = dir.join("model.onnx");
    std::fs::write(&path, model).map_err(|e| io_error(&path, e))?;
    let files = (inputs
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("input_{i}"), t)))
    .chain(
        outputs
            .iter()
            .enumerate()
            .map(|(k, t)| (format!("output_{k}"), t)),
    );
    for (name, t) in files {
        let (dtype, bytes) = npy(t)?;
        write_npy(&dir.join(format!("{name}.npy")), dtype, t.dims(), &bytes)?;
    }
    Ok(())
}

/// The elements as bits, NaNs made one: what "the same values" means.
fn bits(t: &Tensor) -> Result<Vec<u64>> {
    Ok(match t.dtype() {
        DType::F32 => (t.to_vec::<f32>()?.iter())
            .map(|x| {
                if x.is_nan() {
                    u64::MAX
                } else {
                    x.to_bits().into()
                }
            })
            .collect(),
        DType::F64 => (t.to_vec::<f64>()?.iter())
            .map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() })
            .collect(),
        DType::I32 => t.to_vec::<i32>()?.iter().map(|&x| x as u64).collect(),
        DType::I64 => t.to_vec::<i64>()?.iter().map(|&x| x as u64).collect(),
        DType::U8 => t.to_vec::<u8>()?.iter().map(|&x| u64::from(x)).collect(),
        DType::Bool => t.to_vec::<bool>()?.iter().map(|&x| u64::from(x)).collect(),
        DType::BF16 => (t.to_vec::<kiln::bf16>()?.iter())
            .map(|x| {
                if x.is_nan() {
                    u64::MAX
                } else {
                    x.to_bits().into()
                }
            })
            .collect(),
        DType::F16 => (t.to_vec::<kiln::f16>()?.iter())
            .map(|x| {
                if x.is_nan() {
                    u64::MAX
                } else {
                    x.to_bits().into()
                }
            })
            .collect(),
    })
}

type Traced<'a> = &'a dyn Fn(&[Tensor]) -> Result<Vec<Tensor>>;

/// Exports `f` over the types of `inputs`, checks that the model uses ONNX
/// op `op`, reads it back, and checks that it computes the original's
/// values on `inputs`, bit for bit, on the interpreter and on the CPU.
fn round_trip(what: &str, op: &str, inputs: &[Tensor], f: Traced) -> Result<()> {
    let specs: Vec<TensorType> = inputs.iter().map(|t| t.ty().clone()).collect();
    let bytes = kiln::onnx::export(what, &specs, |x| f(x))?;
    let model = Model::from_bytes(&bytes, what)?;
    let ops = model.op_types();
    assert!(ops.iter().any(|o| o == op), "{what}: {op} not in {ops:?}");
    let feeds: Vec<Feed> = specs.iter().cloned().map(Feed::Input).collect();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    for device in [Device::Reference, Device::Cpu] {
        let options = CompileOptions::on(device);
        let want = kiln::compile_with(what, &specs, options, |x| f(x))?.call(&refs)?;
        let got = model.compile_with(&feeds, options)?.call(&refs)?;
        assert_eq!(want.len(), got.len(), "{what}");
        if device == Device::Cpu {
            save(what, &bytes, inputs, &want)?;
        }
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(w.ty(), g.ty(), "{what}: output {k} on {device:?}");
            assert!(
                bits(w)? == bits(g)?,
                "{what}: output {k} differs on {device:?}"
            );
        }
    }
    Ok(())
}

fn f32s(dims: &[usize], seed: u64) -> Result<Tensor> {
    Tensor::randn(dims, seed)
}

fn i32s(dims: &[usize], seed: u64) -> Result<Tensor> {
    (Tensor::randn(dims, seed)? * 40.0f32)?.cast(DType::I32)
}

fn u8s(dims: &[usize], seed: u64) -> Result<Tensor> {
    (Tensor::rand(dims, seed)? * 255.0f32)?.cast(DType::U8)
}

fn bools(dims: &[usize], seed: u64) -> Result<Tensor> {
    Tensor::randn(dims, seed)?.gt(&Tensor::scalar(0.0f32))
}

#[test]
fn unary_ops_round_trip() -> Result<()> {
    type Unary = fn(&Tensor) -> Result<Tensor>;
    let x = f32s(&[3, 5, 7], 1)?;
    let f32_ops: [(&str, Unary); 21] = [
        ("Neg", Tensor::neg),
        ("Exp", Tensor::exp),
        // Negative inputs give NaN, which must read back as NaN.
        ("Log", Tensor::log),
        ("Sqrt", Tensor::sqrt),
        ("Reciprocal", Tensor::recip),
        ("Relu", Tensor::relu),
        ("Sigmoid", Tensor::sigmoid),
        ("Tanh", Tensor::tanh),
        ("Abs", Tensor::abs),
        ("Identity", Tensor::detach),
        // Outside their domains, NaN too.
        ("Sin", Tensor::sin),
        ("Cos", Tensor::cos),
        ("Tan", Tensor::tan),
        ("Asin", Tensor::asin),
        ("Acos", Tensor::acos),
        ("Atan", Tensor::atan),
        ("Sinh", Tensor::sinh),
        ("Cosh", Tensor::cosh),
        ("Asinh", Tensor::asinh),
        ("Acosh", Tensor::acosh),
        ("Atanh", Tensor::atanh),
    ];
    for (op, u) in f32_ops {
        round_trip(op, op, std::slice::from_ref(&x), &|t| Ok(vec![u(&t[0])?]))?;
    }
    let n = i32s(&[7, 3], 2)?;
    let i32_ops: [(&str, Unary); 3] = [
        ("Neg", Tensor::neg),
        ("Relu", Tensor::relu),
        ("Abs", Tensor::abs),
    ];
    for (op, u) in i32_ops {
        round_trip(op, op, std::slice::from_ref(&n), &|t| Ok(vec![u(&t[0])?]))?;
    }
    Ok(())
}

#[test]
fn binary_ops_round_trip_broadcasting() -> Result<()> {
    type Binary = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let ops: [(&str, Binary); 14] = [
        ("Add", Tensor::add),
        ("Sub", Tensor::sub),
        ("Mul", Tensor::mul),
        ("Div", Tensor::div),
        ("Max", Tensor::maximum),
        ("Min", Tensor::minimum),
        ("Pow", Tensor::pow),
        ("Mod", Tensor::fmod),
        ("Less", Tensor::lt),
        ("LessOrEqual", Tensor::le),
        ("Greater", Tensor::gt),
        ("GreaterOrEqual", Tensor::ge),
        ("Equal", Tensor::eq),
        ("Not", Tensor::ne),
    ];
    let (a, b) = (f32s(&[3, 1, 5], 3)?, f32s(&[4, 5], 4)?);
    for (op, g) in ops {
        let inputs = [a.clone(), b.clone()];
        round_trip(op, op, &inputs, &|t| Ok(vec![g(&t[0], &t[1])?]))?;
    }
    // The integer types, where kiln's ops take them.
    let int_ops: [(&str, Binary); 6] = [
        ("Add", Tensor::add),
        ("Sub", Tensor::sub),
        ("Mul", Tensor::mul),
        ("Max", Tensor::maximum),
        ("Less", Tensor::lt),
        ("Not", Tensor::ne),
    ];
    for inputs in [
        [i32s(&[6, 5], 5)?, i32s(&[5], 6)?],
        [u8s(&[6, 5], 7)?, u8s(&[6, 1], 8)?],
    ] {
        for (op, g) in int_ops {
            round_trip(op, op, &inputs, &|t| Ok(vec![g(&t[0], &t[1])?]))?;
        }
    }
    let p = [bools(&[4, 3], 9)?, bools(&[3], 10)?];
    round_trip("Equal", "Equal", &p, &|t| Ok(vec![t[0].eq(&t[1])?]))?;
    round_trip("Not", "Not", &p, &|t| Ok(vec![t[0].ne(&t[1])?]))?;
    Ok(())
}

#[test]
fn where_cast_and_constants_round_trip() -> Result<()> {
    let inputs = [bools(&[3, 4], 11)?, f32s(&[4], 12)?];
    round_trip("Where", "Where", &inputs, &|t| {
        Ok(vec![t[0].where_cond(&t[1], &Tensor::scalar(-2.5f32))?])
    })?;
    // Floats inside u8's range: ONNX leaves casts outside it to the runtime.
    let casts = [
        (Tensor::rand([5, 3], 13)? * 200.0f32)?,
        i32s(&[5, 3], 14)?,
        u8s(&[5, 3], 15)?,
        bools(&[5, 3], 16)?,
        (Tensor::rand([5, 3], 18)? * 200.0f32)?.cast(DType::F64)?,
        i32s(&[5, 3], 19)?.cast(DType::I64)?,
    ];
    let dtypes = DType::ALL;
    for x in &casts {
        for to in dtypes {
            if to == x.dtype() {
                continue;
            }
            round_trip("Cast", "Cast", std::slice::from_ref(x), &|t| {
                Ok(vec![t[0].cast(to)?])
            })?;
        }
    }
    // Scalars of every dtype, broadcast: `Constant`, then `Expand`.
    let x = i32s(&[2, 3], 17)?;
    round_trip("Constant", "Constant", std::slice::from_ref(&x), &|t| {
        let m = (&t[0] * 3i32)?.maximum(&Tensor::full([3], 7i32)?)?;
        let flag = t[0].gt(&Tensor::scalar(0i32))?.eq(&Tensor::scalar(true))?;
        let byte = Tensor::full([2, 3], 200u8)?.add(&Tensor::scalar(100u8))?;
        Ok(vec![m, flag, byte, Tensor::scalar(1.5f32)])
    })?;
    // i64 and f64 inputs, constants and outputs, i64 beyond i32.
    let wide = [
        i32s(&[2, 3], 20)?.cast(DType::I64)?,
        f32s(&[2, 3], 21)?.cast(DType::F64)?,
    ];
    round_trip("Wide", "Constant", &wide, &|t| {
        let big = (&t[0] * Tensor::scalar(3_000_000_000i64))?;
        let x = t[1].mul(&Tensor::scalar(Scalar::F64(0.1)))?.exp()?;
        Ok(vec![
            big,
            x,
            Tensor::scalar(-7i64),
            Tensor::scalar(Scalar::F64(1e300)),
        ])
    })?;
    Ok(())
}

#[test]
fn movement_ops_round_trip() -> Result<()> {
    let x = f32s(&[3, 4, 5], 18)?;
    let one = std::slice::from_ref(&x);
    round_trip("Reshape", "Reshape", one, &|t| {
        Ok(vec![t[0].reshape([5, 12])?])
    })?;
    round_trip("Transpose", "Transpose", one, &|t| {
        Ok(vec![t[0].permute(&[2, 0, 1])?])
    })?;
    let row = f32s(&[1, 5], 19)?;
    round_trip("Expand", "Expand", std::slice::from_ref(&row), &|t| {
        Ok(vec![t[0].expand([3, 4, 5])?])
    })?;
    let wide = f32s(&[3, 10, 7], 20)?;
    round_trip("Slice", "Slice", std::slice::from_ref(&wide), &|t| {
        Ok(vec![
            t[0].slice(1, 2, 9, 3)?.slice(2, 1, 6, 1)?,
            t[0].slice(0, 0, 3, 1)?,
        ])
    })?;
    round_trip("Pad", "Pad", one, &|t| {
        Ok(vec![t[0].pad(&[(1, 2), (0, 0), (0, 3)], -1.5f32)?])
    })?;
    // Windows overlapping along one axis, apart along another.
    round_trip("Unfold", "Gather", std::slice::from_ref(&wide), &|t| {
        Ok(vec![
            t[0].unfold(1, 4, 3)?.unfold(2, 2, 3)?,
            t[0].unfold(0, 2, 1)?,
        ])
    })?;
    let n = i32s(&[4, 3], 21)?;
    round_trip("Pad", "Pad", std::slice::from_ref(&n), &|t| {
        Ok(vec![t[0].pad(&[(2, 0), (1, 1)], 9i32)?])
    })?;
    // Empty tensors: a 0 in a reshape's target needs `allowzero`.
    let empty = f32s(&[0, 3], 22)?;
    round_trip("Reshape", "Reshape", std::slice::from_ref(&empty), &|t| {
        Ok(vec![t[0].reshape([3, 0, 2])?.exp()?])
    })?;
    Ok(())
}

#[test]
fn reductions_and_matmuls_round_trip() -> Result<()> {
    let x = f32s(&[3, 4, 5], 23)?;
    let one = std::slice::from_ref(&x);
    round_trip("ReduceSum", "ReduceSum", one, &|t| {
        Ok(vec![t[0].sum(&[0, 2], false)?])
    })?;
    round_trip("ReduceMax", "ReduceMax", one, &|t| {
        Ok(vec![t[0].max(&[1], true)?])
    })?;
    // No axes: the value unchanged.
    round_trip("ReduceSum", "Identity", one, &|t| {
        Ok(vec![t[0].sum(&[], true)?])
    })?;
    let n = i32s(&[6, 7], 24)?;
    round_trip("ReduceSum", "ReduceSum", std::slice::from_ref(&n), &|t| {
        Ok(vec![t[0].sum(&[-1], true)?])
    })?;
    let b = u8s(&[6, 7], 25)?;
    round_trip("ReduceMax", "ReduceMax", std::slice::from_ref(&b), &|t| {
        Ok(vec![t[0].max(&[0], false)?])
    })?;
    round_trip("ReduceProd", "ReduceProd", one, &|t| {
        Ok(vec![t[0].prod(&[1, 2], true)?, t[0].prod(&[0], false)?])
    })?;
    // Products of four i32 values of about 40 stay in range, where ONNX
    // readers need not wrap.
    let small = i32s(&[3, 4], 36)?;
    round_trip(
        "ReduceProd",
        "ReduceProd",
        std::slice::from_ref(&small),
        &|t| Ok(vec![t[0].prod(&[-1], false)?]),
    )?;
    let pairs = [
        [f32s(&[2, 3, 5], 26)?, f32s(&[2, 5, 7], 27)?],
        [f32s(&[7, 13], 28)?, f32s(&[13, 1], 29)?],
        [f32s(&[5], 30)?, f32s(&[3, 5, 2], 31)?],
    ];
    for p in &pairs {
        round_trip("MatMul", "MatMul", p, &|t| Ok(vec![t[0].matmul(&t[1])?]))?;
    }
    Ok(())
}

#[test]
fn gathers_and_scatter_adds_round_trip() -> Result<()> {
    // Indices inside the axis (ONNX leaves others an error), from the end too.
    let idx: Vec<i64> = (0..4 * 5).map(|k| (k * 7) % 13 - 6).collect();
    let inputs = [f32s(&[4, 7], 37)?, Tensor::from_vec(idx, [4, 5])?];
    round_trip("GatherElements", "GatherElements", &inputs, &|t| {
        Ok(vec![t[0].gather(1, &t[1])?])
    })?;
    let inputs = [f32s(&[4, 7], 38)?, inputs[1].clone(), f32s(&[4, 5], 39)?];
    round_trip("ScatterElements", "ScatterElements", &inputs, &|t| {
        let sums = t[0].scatter_add(1, &t[1], &t[2])?;
        let dx = kiln::grad(&(t[0].gather(1, &t[1])? * &t[2])?.sum_all()?, &[&t[0]])?;
        Ok(vec![sums, dx[0].clone()])
    })
}

#[test]
fn composites_and_captured_tensors_round_trip() -> Result<()> {
    let x = f32s(&[6, 9], 32)?;
    let (w, bias) = (f32s(&[9], 33)?, f32s(&[9], 34)?);
    let scale = Tensor::from_vec(vec![0.75f32], [])?;
    round_trip("composites", "ReduceMax", std::slice::from_ref(&x), &|t| {
        Ok(vec![
            t[0].softmax(-1)?,
            t[0].layer_norm(&w, &bias, 1e-5)?,
            (t[0].gelu()? * &scale)?,
            t[0].mean(&[0], false)?,
        ])
    })?;
    // An output that is an input, and one value returned twice.
    round_trip("outputs", "Identity", std::slice::from_ref(&x), &|t| {
        let y = t[0].relu()?;
        Ok(vec![t[0].clone(), y.clone(), y])
    })?;
    Ok(())
}

#[test]
fn a_u8_product_is_refused_as_onnx_types_none() {
    let spec = TensorType::new(DType::U8, [4, 3]);
    let f = |x: &[Tensor]| Ok(vec![x[0].prod(&[1], false)?]);
    match kiln::onnx::export("u8 prod", std::slice::from_ref(&spec), f) {
        Err(Error::Onnx(e @ OnnxError::Export { .. })) => {
            let message = e.to_string();
            assert!(
                message.contains("(prod)") && message.contains("UINT8"),
                "{message}"
            );
        }
        Err(other) => panic!("expected an export error, got {other}"),
        Ok(_) => panic!("a u8 product exported"),
    }
}

#[test]
fn a_fused_graph_is_refused_naming_its_op() -> Result<()> {
    let spec = TensorType::new(DType::F32, [4, 3]);
    let f = |x: &[Tensor]| Ok(vec![(x[0].exp()? + 1.0f32)?.t()?]);
    let compiled = kiln::compile("fused", std::slice::from_ref(&spec), f)?;
    match kiln::onnx::export_graph(&compiled.optimized().graph) {
        Err(Error::Onnx(e @ OnnxError::Export { .. })) => {
            assert!(e.is_unsupported());
            let OnnxError::Export { op, node, .. } = &e else {
                unreachable!()
            };
            assert!(
                ["view", "kernel", "side_output"].contains(&op.as_str()),
                "{e}"
            );
            let message = e.to_string();
            assert!(message.contains(&format!("{node} ({op})")), "{message}");
            assert!(
                message.contains("export the graph before the optimizer"),
                "{message}"
            );
        }
        Err(other) => panic!("expected an export error, got {other}"),
        Ok(_) => panic!("a fused graph exported"),
    }
    // The traced graph itself exports, its inputs as graph inputs.
    let x = f32s(&[4, 3], 35)?;
    let y = (x.exp()? + 1.0f32)?.t()?;
    let bytes = kiln::onnx::export_graph(&kiln::capture("traced", &[&y]))?;
    let model = Model::from_bytes(&bytes, "traced.onnx")?;
    assert_eq!(model.inputs().len(), 1);
    let got = model.compile(&[Feed::Input(spec)])?.call(&[&x])?;
    assert_eq!(bits(&got[0])?, bits(&y)?);
    Ok(())
}
