//! `bench_report --onnx FILE`: a whole ONNX model (`benches/models.py`
//! writes resnet18 and mobilenet_v2 with their input and onnxruntime's
//! output beside each file, `STEM_x.npy` and `STEM_out.npy`), compiled for
//! `backend`, fused and unfused taking turns, timed call by call on its
//! input, checked against onnxruntime's output; `compile_s` is the fused
//! graph's first compile.

use std::path::Path;
use std::time::Instant;

use kiln::data::npy::NpyArray;
use kiln::onnx::{Feed, Model};
use kiln::{CompiledGraph, Data, DataRef, Result, Tensor};

use super::{Backend, max_rel_err, options, time};

/// The array the model at `path` keeps beside it as `STEM_{suffix}.npy`.
fn beside(path: &Path, suffix: &str) -> Result<Tensor> {
    let a = NpyArray::open(format!(
        "{}_{suffix}.npy",
        path.with_extension("").display()
    ))?;
    let rows = a.header().shape.first().copied().unwrap_or(1);
    a.rows(0, rows)
}

/// The model at `path` compiled fused for the CPU, with its input: what
/// `--serve` times for workload `onnx` (its shape the path).
pub(crate) fn served(path: &Path) -> Result<(CompiledGraph, Vec<Data>)> {
    let x = beside(path, "x")?;
    let graph = Model::load(path)?
        .compile_with(&[Feed::Input(x.ty().clone())], options(Backend::Cpu, true))?;
    Ok((graph, vec![Data::F32(x.to_vec()?)]))
}

pub(crate) fn model(path: &Path, quick: bool, backend: Backend) -> Result<()> {
    let stem = path.with_extension("");
    let name = stem
        .file_name()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    eprintln!("{name}");
    let (x, want) = (beside(path, "x")?, beside(path, "out")?);
    let dims = x.dims().to_vec();
    let feeds = [Feed::Input(x.ty().clone())];
    let (x, want) = (Data::F32(x.to_vec()?), Data::F32(want.to_vec()?));
    let model = Model::load(path)?;
    let mut runs = Vec::new();
    for (variant, fusion) in [("fused", true), ("unfused", false)] {
        let start = Instant::now();
        let mut g = model.compile_with(&feeds, options(backend, fusion))?;
        let compile_s = start.elapsed().as_secs_f64();
        let mut out = g.output_buffers()?;
        g.run_into(&[DataRef::from(&x)], &mut out)?;
        let got = match &out[0] {
            Data::F32(v) => v.clone(),
            _ => Vec::new(),
        };
        let reference: Vec<f64> = match &want {
            Data::F32(v) => v.iter().map(|&w| f64::from(w)).collect(),
            _ => Vec::new(),
        };
        runs.push((variant, g, out, compile_s, max_rel_err(&got, &reference)));
    }
    let refs = [DataRef::from(&x)];
    let timings = time(quick, runs.len(), |v| {
        let (_, g, out, ..) = &mut runs[v];
        g.run_into(&refs, out).map(|()| None)
    })?;
    let shape: Vec<String> = dims.iter().map(usize::to_string).collect();
    for ((variant, g, _, compile_s, err), timing) in runs.iter().zip(timings) {
        println!(
            "{{\"workload\":\"{name}\",\"shape\":\"{}\",\"variant\":\"{variant}\",\"backend\":\"{}\",{},\"compile_s\":{compile_s:.3},\"kernels\":{},\"bytes\":0,\"flops\":0,\"max_rel_err\":{err:.2e}}}",
            shape.join("x"),
            backend.name(),
            timing.fields(),
            g.launches(),
        );
    }
    Ok(())
}
