//! A training run saved half-way (its parameters and optimizer state by
//! name, in one safetensors file) and resumed in a new process ends where
//! the run that never stopped ends, bit for bit.

use std::path::{Path, PathBuf};

use kiln::nn::{self, Mlp, Module};
use kiln::optim::{AdamW, Optimizer};
use kiln::{CompiledStep, DType, Error, Result, Tensor, TensorType};

/// Steps in each half of the run.
const HALF: usize = 6;

const SIZES: [usize; 3] = [8, 16, 3];

/// The batch of step `k`: the same in every process.
fn batch(k: usize) -> Result<[Tensor; 2]> {
    let labels: Vec<i32> = (0..16).map(|i| ((i * 7 + k) % 3) as i32).collect();
    Ok([
        Tensor::randn([16, 8], 1000 + k as u64)?,
        Tensor::from_vec(labels, [16])?,
    ])
}

/// The parameters' names, then the optimizer state's.
fn names(adam: &AdamW) -> Result<Vec<String>> {
    let mlp = Mlp::new(&SIZES, 0)?;
    let params: Vec<String> = mlp.parameters().into_iter().map(|(n, _)| n).collect();
    let refs: Vec<&str> = params.iter().map(String::as_str).collect();
    Ok(params
        .iter()
        .cloned()
        .chain(adam.state_names(&refs))
        .collect())
}

/// A compiled AdamW step of the MLP whose state starts as `state`.
fn step_of(adam: &AdamW, state: &[Tensor]) -> Result<CompiledStep> {
    let n = Mlp::new(&SIZES, 0)?.parameters().len();
    let refs: Vec<&Tensor> = state.iter().collect();
    let specs = [
        TensorType::new(DType::F32, [16, 8]),
        TensorType::new(DType::I32, [16]),
    ];
    kiln::compile_step("train", &refs, &specs, |s, b| {
        let mlp = Mlp::new(&SIZES, 0)?.with_parameters(&s[..n])?;
        let loss = mlp.forward(&b[0])?.cross_entropy(&b[1])?;
        let params: Vec<&Tensor> = s[..n].iter().collect();
        let grads = kiln::grad(&loss, &params)?;
        let (p, o) = adam.update(&s[..n], &grads, &s[n..])?;
        Ok((vec![loss], p.into_iter().chain(o).collect()))
    })
}

fn train(step: &mut CompiledStep, steps: std::ops::Range<usize>) -> Result<()> {
    for k in steps {
        let [x, labels] = batch(k)?;
        step.call(&[&x, &labels])?;
    }
    Ok(())
}

fn save(path: &Path, adam: &AdamW, step: &CompiledStep) -> Result<()> {
    let (names, state) = (names(adam)?, step.state()?);
    let named: Vec<(&str, &Tensor)> = names.iter().map(String::as_str).zip(&state).collect();
    nn::save(path, &named)
}

/// The tensors of the file at `path` in the order of `names`.
fn load(path: &Path, names: &[String]) -> Result<Vec<Tensor>> {
    let mut loaded = nn::load(path)?;
    names
        .iter()
        .map(|name| {
            let at = loaded.iter().position(|(n, _)| n == name);
            at.map(|i| loaded.swap_remove(i).1)
                .ok_or_else(|| Error::Parameter {
                    name: name.clone(),
                    message: "not in the checkpoint".to_string(),
                })
        })
        .collect()
}

fn bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_vec::<f32>()?.into_iter().map(f32::to_bits).collect())
}

#[test]
fn a_run_resumed_in_a_new_process_ends_where_an_unbroken_run_ends() -> Result<()> {
    let adam = AdamW::new(1e-2);
    let mlp = Mlp::new(&SIZES, 3)?;
    let params: Vec<&Tensor> = mlp.parameters().into_iter().map(|(_, p)| p).collect();
    let mut initial: Vec<Tensor> = params.iter().map(|&p| p.clone()).collect();
    initial.extend(adam.state(&params)?);
    let mut unbroken = step_of(&adam, &initial)?;
    train(&mut unbroken, 0..2 * HALF)?;
    let want = unbroken.state()?;
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::Parameter {
        name: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let mut first = step_of(&adam, &initial)?;
    train(&mut first, 0..HALF)?;
    save(&dir.join("half.safetensors"), &adam, &first)?;
    drop(first);
    // The second half in a process of its own.
    let child = std::process::Command::new(std::env::current_exe().expect("a test binary"))
        .args(["--ignored", "--exact", "second_half_from_the_checkpoint"])
        .env("KILN_RESUME_DIR", &dir)
        .output()
        .expect("the test binary runs");
    assert!(
        child.status.success(),
        "{}",
        String::from_utf8_lossy(&child.stdout)
    );
    let names = names(&adam)?;
    let got = load(&dir.join("end.safetensors"), &names)?;
    // Each moment beside its parameter, of its shape; second moments are
    // squares' averages, never negative.
    for (name, t) in names.iter().zip(&got) {
        if let Some((moment, param)) = name.split_once('.')
            && moment.starts_with("exp_avg")
        {
            let p = names
                .iter()
                .position(|n| n == param)
                .expect("a parameter of that name");
            assert_eq!(t.dims(), got[p].dims(), "{name}");
            if moment == "exp_avg_sq" {
                assert!(t.to_vec::<f32>()?.iter().all(|&v| v >= 0.0), "{name}");
            }
        }
    }
    assert_eq!(names.len(), want.len());
    for ((name, g), w) in names.iter().zip(&got).zip(&want) {
        assert_eq!(g.ty(), w.ty(), "{name}");
        assert!(
            bits(g)? == bits(w)?,
            "{name} differs from the unbroken run's"
        );
    }
    // The step count went on from where it stopped.
    assert_eq!(
        got[names.iter().position(|n| n == "step").unwrap_or(0)].to_scalar::<f32>()?,
        (2 * HALF) as f32
    );
    Ok(())
}

#[test]
#[ignore = "the second half of a_run_resumed_in_a_new_process..., run in a process of its own"]
fn second_half_from_the_checkpoint() -> Result<()> {
    let dir = PathBuf::from(std::env::var("KILN_RESUME_DIR").expect("set by the first half"));
    let adam = AdamW::new(1e-2);
    let state = load(&dir.join("half.safetensors"), &names(&adam)?)?;
    let mut step = step_of(&adam, &state)?;
    train(&mut step, HALF..2 * HALF)?;
    save(&dir.join("end.safetensors"), &adam, &step)
}
