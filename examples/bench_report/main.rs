//! The benchmark report of benches/README.md: every workload, fused and unfused,
//! checked against a reference, timed (the two variants taking turns, call
//! by call), and printed as one JSON object per line on stdout (progress on
//! stderr).
//!
//! `cargo run --release --example bench_report [-- --workload ID ... --shape SHAPE ... --quick --backend cpu|cuda|cuda-f32]`
//!
//! `--onnx FILE` (repeated) times whole ONNX models instead (`models`).
//!
//! `--serve` times workloads on request instead, for scripts that take
//! turns with other frameworks (see `serve`).
//!
//! With `--backend cuda` (feature `cuda`) each workload runs on GPU 0 with its
//! matmuls in TF32 (`cuda-f32`: IEEE f32, as `Precision::F32`) and its
//! inputs already on the device: the time is the device's work, launches
//! through synchronization. A `device_copy` line gives the device's own
//! copy bandwidth, measured in the same run, to compare memory-bound
//! workloads with. The training steps (`train_sgd`, `train_adam`,
//! `train_cnn`) are timed by the host's clock on every backend, the batch
//! already on the device, through the loss read back.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod embedding;
mod models;
mod train;

use kiln::{
    BackendOptions, CompileOptions, CompiledGraph, Data, DataRef, Device, Options, Precision,
    Result, Tensor,
};
use kiln_support::workloads::{self, Workload};

struct Args {
    workloads: Vec<String>,
    /// Only workloads of these shapes (as the report writes them), if any.
    shapes: Vec<String>,
    quick: bool,
    backend: Backend,
    serve: bool,
    /// ONNX models to time (`--onnx FILE`, `benches/models.py`'s).
    models: Vec<PathBuf>,
}

/// Where the workloads run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Cpu,
    /// GPU 0, matmuls in TF32.
    Cuda,
    /// GPU 0, matmuls in IEEE f32.
    CudaF32,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::CudaF32 => "cuda-f32",
        }
    }
}

fn args() -> std::result::Result<Args, String> {
    let mut args = Args {
        workloads: Vec::new(),
        shapes: Vec::new(),
        quick: false,
        backend: Backend::Cpu,
        serve: false,
        models: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => args.quick = true,
            "--serve" => args.serve = true,
            "--onnx" => args
                .models
                .push(it.next().ok_or("--onnx needs a file")?.into()),
            "--workload" => args
                .workloads
                .push(it.next().ok_or("--workload needs an id")?),
            "--shape" => args.shapes.push(it.next().ok_or("--shape needs a shape")?),
            "--backend" => match it.next().as_deref() {
                Some("cpu") => args.backend = Backend::Cpu,
                Some("cuda") => args.backend = Backend::Cuda,
                Some("cuda-f32") => args.backend = Backend::CudaF32,
                other => return Err(format!("unknown backend {other:?}")),
            },
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// Median and median absolute deviation of repeated calls of `f(v)` for
/// each of `variants`, after two warm-up calls each, within a time budget.
/// The variants take turns, in alternating order, so that a change in the
/// load of this shared machine falls on all of them alike: timed one after
/// the other, fused and unfused log_softmax compared the machine's moments
/// (0.207 against 0.144 ms in one run; 0.124 against 0.147 ms taking turns).
/// `f` returns the device's own time for the call where there is one.
fn time(
    quick: bool,
    variants: usize,
    f: impl FnMut(usize) -> Result<Option<f64>>,
) -> Result<Vec<Timing>> {
    let (budget, min_reps) = if quick {
        (Duration::from_millis(150), 3)
    } else {
        (Duration::from_secs(1), 7)
    };
    time_within(budget * variants as u32, min_reps, variants, f)
}

/// `time` within `budget` in all, and with at least `min_reps` calls of
/// each variant.
fn time_within(
    budget: Duration,
    min_reps: usize,
    variants: usize,
    mut f: impl FnMut(usize) -> Result<Option<f64>>,
) -> Result<Vec<Timing>> {
    for v in 0..variants {
        f(v)?;
        f(v)?;
    }
    let mut host = vec![Vec::new(); variants];
    let mut device = vec![Vec::new(); variants];
    let start = Instant::now();
    let mut round = 0;
    while host[0].len() < min_reps || (start.elapsed() < budget && host[0].len() < 500) {
        for k in 0..variants {
            let v = if round % 2 == 0 { k } else { variants - 1 - k };
            let t = Instant::now();
            device[v].extend(f(v)?);
            host[v].push(t.elapsed().as_secs_f64());
        }
        round += 1;
    }
    Ok(host
        .into_iter()
        .zip(device)
        .map(|(host, device)| Timing {
            host: median_and_spread(host),
            device: (!device.is_empty()).then(|| median_and_spread(device)),
        })
        .collect())
}

/// The times of one variant: (median, median absolute deviation) in seconds.
struct Timing {
    /// Around each call on the host, through the device's synchronization.
    host: (f64, f64),
    /// The device's own time from the first launch to the last one's end.
    device: Option<(f64, f64)>,
}

impl Timing {
    /// The report's fields for it: `median_s` and `spread_s` (host), then
    /// `device_s` and `device_spread_s` where the device timed itself.
    fn fields(&self) -> String {
        let (median, spread) = self.host;
        let mut text = format!("\"median_s\":{median:.6e},\"spread_s\":{spread:.3e}");
        if let Some((median, spread)) = self.device {
            text += &format!(",\"device_s\":{median:.6e},\"device_spread_s\":{spread:.3e}");
        }
        text
    }
}

fn median_and_spread(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    let mut dev: Vec<f64> = samples.iter().map(|x| (x - median).abs()).collect();
    dev.sort_by(f64::total_cmp);
    (median, dev[dev.len() / 2])
}

/// Largest error relative to the reference's scale: `|a-b| / max(|b|, 1e-3 max|b|)`.
fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs())) * 1e-3;
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs() / w.abs().max(scale).max(f64::MIN_POSITIVE))
        .fold(0.0, f64::max)
}

fn floats(d: &Data) -> &[f32] {
    match d {
        Data::F32(v) => v,
        _ => &[],
    }
}

/// The reference values the output is compared with, at `indices` of it:
/// f64 dot products for matmuls (the interpreter would take minutes), the
/// reference interpreter for everything else.
fn reference(w: &Workload, inputs: &[Data], indices: &[usize]) -> Result<Vec<f64>> {
    if w.id == "conv2d_bias_relu" {
        return Ok(indices
            .iter()
            .map(|&i| conv_bias_relu_at(inputs, i))
            .collect());
    }
    if let Some(p) = w.product {
        // bf16 operands' values widened to f32, which holds them exactly.
        let widened = |d: &Data| -> Vec<f32> {
            match d {
                Data::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
                _ => floats(d).to_vec(),
            }
        };
        let (a, b) = (widened(&inputs[0]), widened(&inputs[1]));
        let (a, b) = (a.as_slice(), b.as_slice());
        return Ok(indices
            .iter()
            .map(|&i| {
                let (r, c) = (i / p.n, i % p.n);
                let dot: f64 = (0..p.k)
                    .map(|l| f64::from(p.a(a, r, l)) * f64::from(p.b(b, l, c)))
                    .sum();
                match inputs.get(2) {
                    Some(bias) => (dot + f64::from(floats(bias)[c])).max(0.0),
                    None => dot,
                }
            })
            .collect());
    }
    let tensors: Vec<Tensor> = inputs
        .iter()
        .zip(&w.specs)
        .map(|(d, ty)| {
            let shape = ty.shape.clone();
            match d {
                Data::BF16(v) => Tensor::from_vec(v.clone(), shape),
                _ => Tensor::from_vec(floats(d).to_vec(), shape),
            }?
            .to(Device::Reference)
        })
        .collect::<Result<_>>()?;
    let out = kiln_support::data(&(w.build)(&tensors)?.remove(0))?;
    Ok(indices.iter().map(|&i| out.get(i).to_f64()).collect())
}

/// Element `i` of `conv2d_bias_relu` (x [64,3,32,32], w [32,3,3,3], b
/// [32], stride 1, padding 1) by the definition, in f64.
fn conv_bias_relu_at(inputs: &[Data], i: usize) -> f64 {
    let (x, w, b) = (floats(&inputs[0]), floats(&inputs[1]), floats(&inputs[2]));
    let (n, o, r, c) = (i / (32 * 1024), i / 1024 % 32, i / 32 % 32, i % 32);
    let mut acc = f64::from(b[o]);
    for ch in 0..3 {
        for kh in 0..3 {
            for kw in 0..3 {
                let (y, xx) = ((r + kh) as isize - 1, (c + kw) as isize - 1);
                if (0..32).contains(&y) && (0..32).contains(&xx) {
                    let xv = x[((n * 3 + ch) * 32 + y as usize) * 32 + xx as usize];
                    let wv = w[((o * 3 + ch) * 3 + kh) * 3 + kw];
                    acc += f64::from(xv) * f64::from(wv);
                }
            }
        }
    }
    acc.max(0.0)
}

/// The device `backend` runs on (on a GPU, GPU 0), and how its matmuls
/// compute.
fn target(backend: Backend) -> (Device, BackendOptions) {
    let (device, precision) = match backend {
        Backend::Cpu => (Device::Cpu, Precision::default()),
        Backend::Cuda => (Device::Cuda(0), Precision::Tf32),
        Backend::CudaF32 => (Device::Cuda(0), Precision::F32),
    };
    let options = BackendOptions {
        precision,
        ..BackendOptions::default()
    };
    (device, options)
}

/// How to compile for `backend`, fused or not.
fn options(backend: Backend, fusion: bool) -> CompileOptions {
    let (device, backend_options) = target(backend);
    CompileOptions {
        device,
        optimizer: Options {
            fusion,
            ..Options::default()
        },
        backend: backend_options,
    }
}

/// A workload compiled for `backend`.
fn compiled(w: &Workload, fusion: bool, backend: Backend) -> Result<CompiledGraph> {
    kiln::compile_with(w.id, &w.specs, options(backend, fusion), |t| (w.build)(t))
}

/// One timed call: everything on the CPU; on a GPU the device's work on
/// the inputs already there, whose own time it returns.
fn timed(
    g: &mut CompiledGraph,
    inputs: &[DataRef<'_>],
    outputs: &mut [Data],
) -> Result<Option<f64>> {
    match g.device_time()? {
        Some(seconds) => Ok(Some(seconds)),
        None => g.run_into(inputs, outputs).map(|()| None),
    }
}

fn report(w: &Workload, quick: bool, backend: Backend) -> Result<()> {
    eprintln!("{} {}", w.id, w.shape);
    let inputs = w.inputs()?;
    let refs: Vec<DataRef> = inputs.iter().map(DataRef::from).collect();
    let mut checked: Option<Vec<f64>> = None;
    let mut runs = Vec::new();
    for (variant, fusion) in [("fused", true), ("unfused", false)] {
        let mut g = compiled(w, fusion, backend)?;
        let mut outputs = g.output_buffers()?;
        g.run_into(&refs, &mut outputs)?;
        let got = &outputs[0];
        // Every element, except a sample of 4096 for matmuls and convolutions.
        let indices: Vec<usize> = if w.product.is_some() || w.id == "conv2d_bias_relu" {
            (0..4096).map(|i| (i * 7919) % got.len()).collect()
        } else {
            (0..got.len()).collect()
        };
        if checked.is_none() {
            checked = Some(reference(w, &inputs, &indices)?);
        }
        let want = checked.as_deref().unwrap_or_default();
        // Every dtype's values are f32s exactly, but f64's and i64's, which
        // no workload outputs.
        let sample: Vec<f32> = indices
            .iter()
            .map(|&i| got.get(i).to_f64() as f32)
            .collect();
        let err = max_rel_err(&sample, want);
        runs.push((variant, g, outputs, err));
    }
    let times = time(quick, runs.len(), |v| {
        let (_, g, outputs, _) = &mut runs[v];
        timed(g, &refs, outputs)
    })?;
    for ((variant, g, _, err), timing) in runs.iter().zip(times) {
        println!(
            "{{\"workload\":\"{}\",\"shape\":\"{}\",\"variant\":\"{variant}\",\"backend\":\"{}\",{},\"kernels\":{},\"bytes\":{},\"flops\":{},\"max_rel_err\":{err:.2e}}}",
            w.id,
            w.shape,
            backend.name(),
            timing.fields(),
            g.launches(),
            w.bytes,
            w.flops
        );
    }
    Ok(())
}

/// `--serve`, for scripts that time kiln in short windows taking turns with
/// other frameworks or other builds (`benches/matmul_pairs.py`,
/// `benches/model_pairs.py`): each line of stdin,
/// `WORKLOAD<tab>SHAPE<tab>SECONDS`, times the CPU's fused graph of that
/// workload (compiled at its first request, on the same inputs throughout;
/// for workload `onnx`, the model at path SHAPE on its `_x.npy` input) as
/// `time` does, within about SECONDS, and answers with a line
/// `{"workload":..,"shape":..,"median_s":..}`. Results are not checked
/// here: the report's own runs check every workload.
fn serve() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let all = workloads::all();
    let mut ready: HashMap<(String, String), Served> = HashMap::new();
    for line in std::io::stdin().lines() {
        let line = line?;
        let [id, shape, seconds] = line.split('\t').collect::<Vec<_>>()[..] else {
            return Err(format!("want WORKLOAD<tab>SHAPE<tab>SECONDS, got {line:?}").into());
        };
        let seconds: f64 = seconds.parse()?;
        let served = match ready.entry((id.to_string(), shape.to_string())) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let (graph, inputs) = match id {
                    "onnx" => models::served(Path::new(shape))?,
                    _ => {
                        let w = all
                            .iter()
                            .find(|w| w.id == id && w.shape == shape)
                            .ok_or_else(|| format!("no workload {id} at {shape}"))?;
                        (compiled(w, true, Backend::Cpu)?, w.inputs()?)
                    }
                };
                e.insert(Served {
                    outputs: graph.output_buffers()?,
                    inputs,
                    graph,
                })
            }
        };
        let Served {
            graph: g,
            inputs,
            outputs,
        } = served;
        let refs: Vec<DataRef> = inputs.iter().map(DataRef::from).collect();
        let budget = Duration::from_secs_f64(seconds);
        let timing = time_within(budget, 1, 1, |_| timed(g, &refs, outputs))?;
        let (median, _) = timing[0].host;
        println!("{{\"workload\":\"{id}\",\"shape\":\"{shape}\",\"median_s\":{median:.6e}}}");
        std::io::stdout().flush()?;
    }
    Ok(())
}

/// A workload of `--serve`, compiled, with its inputs and outputs.
struct Served {
    graph: CompiledGraph,
    inputs: Vec<Data>,
    outputs: Vec<Data>,
}

/// Cold compiles of the 3-layer MLP: the kernel cache is emptied before each.
fn compile_mlp3(quick: bool) -> Result<()> {
    eprintln!("compile_mlp3");
    let mlp = workloads::Mlp3::new()?;
    let (spec, forward) = (&mlp.spec, |x: &[Tensor]| mlp.forward(x));
    let mut kernels = 0;
    let timing = time(quick, 1, |_| {
        kiln_runtime::cpu::clear_kernel_cache();
        let g = kiln::compile("mlp3", std::slice::from_ref(spec), forward)?;
        kernels = g.optimized().schedule.kernels();
        Ok(None)
    })?
    .remove(0);
    let x = Tensor::randn(spec.shape.clone(), 7)?;
    let got = kiln::compile("mlp3", std::slice::from_ref(spec), forward)?.call(&[&x])?[0]
        .to_vec::<f32>()?;
    let want: Vec<f64> = forward(&[x.to(Device::Reference)?])?[0]
        .to_vec::<f32>()?
        .into_iter()
        .map(f64::from)
        .collect();
    println!(
        "{{\"workload\":\"compile_mlp3\",\"shape\":\"64x784-256-256-10\",\"variant\":\"cold\",\"backend\":\"cpu\",{},\"kernels\":{kernels},\"bytes\":0,\"flops\":0,\"max_rel_err\":{:.2e}}}",
        timing.fields(),
        max_rel_err(&got, &want)
    );
    Ok(())
}

/// GPU 0's copy bandwidth: a 1 GiB device-to-device copy, bytes read plus
/// written per second.
#[cfg(feature = "cuda")]
fn device_copy(quick: bool, backend: Backend) -> Result<()> {
    let device = kiln_runtime::cuda::gpu(0)?;
    let bytes = 1usize << 30;
    let mut copy = device.copier(bytes)?;
    let timing = time(quick, 1, |_| Ok(Some(copy.run()?)))?.remove(0);
    println!(
        "{{\"workload\":\"device_copy\",\"shape\":\"1GiB\",\"variant\":\"{}\",\"backend\":\"{}\",{},\"kernels\":0,\"bytes\":{},\"flops\":0,\"max_rel_err\":0}}",
        device.name(),
        backend.name(),
        timing.fields(),
        2 * bytes
    );
    Ok(())
}

fn main() -> Result<()> {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_report: {e}");
            std::process::exit(2);
        }
    };
    if args.serve {
        if let Err(e) = serve() {
            eprintln!("bench_report --serve: {e}");
            std::process::exit(2);
        }
        return Ok(());
    }
    if !args.models.is_empty() {
        for path in &args.models {
            models::model(path, args.quick, args.backend)?;
        }
        return Ok(());
    }
    let wanted = |id: &str| args.workloads.is_empty() || args.workloads.iter().any(|w| w == id);
    #[cfg(feature = "cuda")]
    if args.backend != Backend::Cpu {
        device_copy(args.quick, args.backend)?;
    }
    let mut all = workloads::all();
    if args.backend != Backend::Cpu {
        all.extend(workloads::gpu_only());
    } else {
        // Which GEMM core the matmuls run on (`KILN_CPU_ISA` forces one).
        eprintln!("cpu GEMM path: {}", kiln_runtime::cpu::gemm_path()?);
    }
    let shaped = |w: &Workload| args.shapes.is_empty() || args.shapes.contains(&w.shape);
    for w in all.iter().filter(|w| wanted(w.id) && shaped(w)) {
        report(w, args.quick, args.backend)?;
    }
    if wanted("compile_mlp3") && args.backend == Backend::Cpu {
        compile_mlp3(args.quick)?;
    }
    for id in ["train_sgd", "train_adam", "train_cnn", "train_lm"] {
        if wanted(id) {
            train::train(id, args.quick, args.backend)?;
        }
    }
    // 172 GFLOP a step, sized for a GPU's tensor cores: on the CPU only
    // when asked for by name.
    if wanted("train_mixed") && (args.backend != Backend::Cpu || !args.workloads.is_empty()) {
        train::train("train_mixed", args.quick, args.backend)?;
    }
    if wanted("train_fed") {
        train::fed(args.quick, args.backend)?;
    }
    for id in ["eager_add_relu", "eager_chain10"] {
        // On a GPU relu(a + b) also at a size where the device's work
        // dominates, to compare with the compiled graph's.
        let sizes: &[usize] = match (id, args.backend) {
            ("eager_add_relu", Backend::Cuda | Backend::CudaF32) => &[256, 4096],
            _ => &[256],
        };
        for &n in sizes.iter().filter(|_| wanted(id)) {
            eager(id, n, args.quick, args.backend)?;
        }
    }
    if wanted("embedding") && args.backend == Backend::Cpu {
        embedding::embedding(args.quick)?;
    }
    Ok(())
}

/// Eager code: `eager_add_relu` realizes relu(a + b) and `eager_chain10`
/// ten elementwise ops (one fused kernel) from tensors already realized,
/// call after call, as a loop of PyTorch eager code does (variant `eager`),
/// taking turns with the same function compiled by `kiln::compile` and
/// replayed (variant `compiled`), on [`n`, `n`]. On a GPU the tensors live
/// on the device and the compiled variant is `call` on device tensors (one
/// graph launch once replayed). Each call is timed on the host through
/// `kiln::synchronize`, as `cuda_anchor.py` times PyTorch's. Checked: the
/// eager result against the interpreter's.
fn eager(id: &'static str, n: usize, quick: bool, backend: Backend) -> Result<()> {
    eprintln!("{id} {n}x{n}");
    let (device, _) = target(backend);
    let a = Tensor::randn([n, n], 1)?.to(device)?;
    let b = Tensor::randn([n, n], 2)?.to(device)?;
    a.realize()?;
    b.realize()?;
    let f = |a: &Tensor, b: &Tensor| -> Result<Tensor> {
        if id == "eager_add_relu" {
            return (a + b)?.relu();
        }
        let x = ((((a + b)? * 0.5f32)?.relu()? - b)? * a)?;
        (((((x + 1.0f32)?.abs()? + b)? * 0.25f32)? - a)?).relu()
    };
    let spec = [a.ty().clone(), b.ty().clone()];
    let mut compiled = kiln::compile_with(id, &spec, options(backend, true), |t| {
        Ok(vec![f(&t[0], &t[1])?])
    })?;
    let data = [Data::F32(a.to_vec()?), Data::F32(b.to_vec()?)];
    let refs: Vec<DataRef> = data.iter().map(DataRef::from).collect();
    let mut out = compiled.output_buffers()?;
    let got = f(&a, &b)?.to_vec::<f32>()?;
    let reference = [a.to(Device::Reference)?, b.to(Device::Reference)?];
    let want: Vec<f64> = f(&reference[0], &reference[1])?
        .to_vec::<f32>()?
        .into_iter()
        .map(f64::from)
        .collect();
    let err = max_rel_err(&got, &want);
    let timings = time(quick, 2, |v| {
        match (v, backend) {
            (0, _) => f(&a, &b)?.realize()?,
            (_, Backend::Cpu) => compiled.run_into(&refs, &mut out)?,
            _ => drop(compiled.call(&[&a, &b])?),
        }
        kiln::synchronize(device)?;
        Ok(None)
    })?;
    for (variant, timing) in ["eager", "compiled"].iter().zip(timings) {
        println!(
            "{{\"workload\":\"{id}\",\"shape\":\"{n}x{n}\",\"variant\":\"{variant}\",\"backend\":\"{}\",{},\"kernels\":1,\"bytes\":{},\"flops\":0,\"max_rel_err\":{err:.2e}}}",
            backend.name(),
            timing.fields(),
            3 * n * n * 4,
        );
    }
    Ok(())
}
