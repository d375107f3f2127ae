//! Every device through the one backend contract: the interpreter runs
//! compiled (fused) graphs as the CPU does, and a device this build has no
//! backend for is an `Err` naming the feature, wherever it is used.

use kiln::{CompileOptions, DType, Device, Result, Tensor, TensorType};

/// softmax(x @ w + b) over rows: a matmul with its epilogue and a row
/// reduction, fused.
fn model(t: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![(t[0].matmul(&t[1])? + &t[2])?.softmax(-1)?])
}

#[test]
fn the_interpreter_runs_the_fused_graph_the_cpu_compiles() -> Result<()> {
    let specs = [
        TensorType::new(DType::F32, [5, 7]),
        TensorType::new(DType::F32, [7, 3]),
        TensorType::new(DType::F32, [3]),
    ];
    let x = Tensor::randn([5, 7], 1)?;
    let w = Tensor::randn([7, 3], 2)?;
    let b = Tensor::randn([3], 3)?;
    let mut results = Vec::new();
    for device in [Device::Cpu, Device::Reference] {
        let mut g = kiln::compile_with("model", &specs, CompileOptions::on(device), model)?;
        results.push((
            g.launches(),
            g.call(&[&x, &w, &b])?.remove(0).to_vec::<f32>()?,
        ));
        assert_eq!(g.device_time()?, None, "{device:?} runs on the host");
    }
    let ((cpu_launches, cpu), (ref_launches, interpreted)) = (&results[0], &results[1]);
    assert_eq!(cpu_launches, ref_launches, "the same fused schedule");
    assert!(*cpu_launches <= 3, "fused: {cpu_launches} kernels");
    let eager = model(&[x, w, b])?.remove(0).to_vec::<f32>()?;
    for (k, ((&c, &i), &e)) in cpu.iter().zip(interpreted).zip(&eager).enumerate() {
        assert!(
            (c - i).abs() <= 1e-6 && (c - e).abs() <= 1e-6,
            "{k}: {c} {i} {e}"
        );
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
#[test]
fn the_interpreter_runs_a_step_in_place_as_the_cpu_does() -> Result<()> {
    // x <- x - 0.1 (a @ w + b), its sum as the output: a product whose
    // epilogue writes the new state over the old.
    let x = Tensor::randn([6, 4], 4)?;
    let a = Tensor::randn([6, 5], 7)?;
    let w = Tensor::randn([5, 4], 5)?;
    let b = Tensor::randn([4], 6)?;
    let specs = [a.ty().clone(), w.ty().clone(), b.ty().clone()];
    let args = [a, w, b].map(|t| kiln::Data::F32(t.to_vec::<f32>().expect("realizes")));
    let mut results = Vec::new();
    for device in [Device::Cpu, Device::Reference] {
        let mut step = kiln::compile_step_with(
            "descend",
            &[&x],
            &specs,
            CompileOptions::on(device),
            |s, a| {
                let next = (&s[0] - ((a[0].matmul(&a[1])? + &a[2])? * 0.1f32)?)?;
                Ok((vec![next.sum_all()?], vec![next]))
            },
        )?;
        assert_eq!(step.in_place(), [true], "{device:?}");
        for _ in 0..3 {
            step.run(&[&args[0], &args[1], &args[2]])?;
        }
        results.push(step.state()?.remove(0).to_vec::<f32>()?);
    }
    for (i, (c, r)) in results[0].iter().zip(&results[1]).enumerate() {
        assert!(
            (c - r).abs() <= 1e-5 * r.abs().max(1.0),
            "[{i}]: cpu {c}, interpreter {r}"
        );
    }
    Ok(())
}

// With the feature, a GPU that is not there is an `Err` of its own
// (`tests/cuda_device.rs`).
#[cfg(not(feature = "cuda"))]
#[test]
fn a_gpu_without_the_cuda_feature_is_an_error() -> Result<()> {
    let want = "Cuda(0): kiln was built without feature `cuda`";
    let x = Tensor::ones([2, 2], DType::F32)?;
    let err = x.to(Device::Cuda(0)).err().map(|e| e.to_string());
    assert_eq!(err.as_deref(), Some(want));
    let compiled = kiln::compile_with(
        "double",
        &[TensorType::new(DType::F32, [2, 2])],
        CompileOptions::on(Device::Cuda(0)),
        |t| Ok(vec![(&t[0] * 2.0f32)?]),
    );
    assert_eq!(compiled.err().map(|e| e.to_string()).as_deref(), Some(want));
    let waited = kiln::synchronize(Device::Cuda(0)).err();
    assert_eq!(waited.map(|e| e.to_string()).as_deref(), Some(want));
    // Host backends run before they return: nothing to wait for.
    kiln::synchronize(Device::Cpu)?;
    kiln::synchronize(Device::Reference)?;
    // The process goes on: the CPU still computes.
    assert_eq!((x * 2.0f32)?.to_vec::<f32>()?, vec![2.0; 4]);
    Ok(())
}

/// 2^50 f32 values: 4 PiB, addressable but more than any machine has.
const HUGE: [usize; 3] = [1 << 20, 1 << 20, 1 << 10];
const HUGE_BYTES: &str = "4503599627370496 bytes";

fn huge() -> TensorType {
    TensorType::new(DType::F32, HUGE)
}

/// The process goes on after each: a small tensor still computes.
fn still_computes() -> Result<()> {
    let x = Tensor::from_slice(&[1.0f32, -2.0], [2])?;
    assert_eq!(x.relu()?.to_vec::<f32>()?, vec![1.0, 0.0]);
    Ok(())
}

#[test]
fn a_constructor_out_of_memory_is_an_error() -> Result<()> {
    for (op, made) in [
        ("randn", Tensor::randn(HUGE, 0)),
        ("rand", Tensor::rand(HUGE, 0)),
    ] {
        let want = format!("{op}: out of memory: {HUGE_BYTES} for {}", huge());
        assert_eq!(made.err().map(|e| e.to_string()), Some(want));
    }
    still_computes()
}

#[test]
fn realizing_a_result_out_of_memory_is_an_error() -> Result<()> {
    let y = Tensor::zeros(HUGE, DType::F32)?.exp()?;
    let want = format!("exp: out of memory: {HUGE_BYTES} for {}", huge());
    assert_eq!(y.to_vec::<f32>().err().map(|e| e.to_string()), Some(want));
    still_computes()
}

#[test]
fn the_interpreter_out_of_memory_is_an_error() -> Result<()> {
    // A small result, but the interpreter materializes every value on the
    // way: the fused kernel's 4 PiB of exponentials.
    let zero = Tensor::scalar(0.0f32).to(Device::Reference)?;
    let total = zero.expand(HUGE)?.exp()?.sum_all()?;
    let err = total.to_scalar::<f32>().err().map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.starts_with("kernel: out of memory: ")
                && e.contains(&format!("{HUGE_BYTES} for evaluating f32["))),
        "{err:?}"
    );
    still_computes()
}

#[test]
fn a_compiled_graph_out_of_memory_is_an_error() -> Result<()> {
    // Its result: outputs are made per call (or once, by `output_buffers`).
    let sums = kiln::compile("sums", &[huge()], |t| Ok(vec![t[0].exp()?]))?;
    let want = format!("sums: out of memory: {HUGE_BYTES} for output 0, {}", huge());
    assert_eq!(
        sums.output_buffers().err().map(|e| e.to_string()),
        Some(want)
    );
    // An intermediate: the arena is made when the graph is compiled. The
    // exponentials feed a matmul, so they are written out first.
    let w = Tensor::ones([1 << 10, 1], DType::F32)?;
    let compiled = kiln::compile("project", &[huge()], |t| Ok(vec![t[0].exp()?.matmul(&w)?]));
    let err = compiled.err().map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.starts_with("project: out of memory: ")
                && e.contains(" bytes for intermediate buffer ")),
        "{err:?}"
    );
    still_computes()
}
