//! Every GEMM path of the CPU backend that this machine runs (kiln's AVX-512
//! core, its AVX2+FMA core, the `gemm` crate) against the reference
//! interpreter: products large enough for kiln's cores (and some too narrow
//! for them), of awkward shapes (1 along each axis, ragged tiles and depth
//! blocks), operands read transposed, batched and broadcast, and fused
//! epilogues.
//!
//! bf16 products run on each path too: by the AMX core on `amx`, widened
//! to f32 as kiln's f32 cores pack them on the others (or before the
//! `gemm` crate's).
//!
//! `products` runs on the path this process takes (the fastest, unless
//! `KILN_CPU_ISA` names one); `every_other_path` runs `products` again in a
//! child process of this test binary for each other path the CPU has,
//! forced by `KILN_CPU_ISA`, and says which it skips and why.

use std::process::Command;

use kiln::{DType, Device, Result, Tensor};

/// Compares element by element within `|a - b| <= max(1e-6 max(|a|, |b|),
/// 4 k eps 16)`: f32 sums of `k` products of normal values, each below 16
/// but for a few in a million.
fn check(what: &str, inputs: &[Tensor], k: usize, f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let run = |device: Device| -> Result<Vec<f32>> {
        let on: Vec<Tensor> = inputs.iter().map(|t| t.to(device)).collect::<Result<_>>()?;
        f(&on)?.to_vec::<f32>()
    };
    let (cpu, reference) = match (run(Device::Cpu), run(Device::Reference)) {
        (Ok(cpu), Ok(reference)) => (cpu, reference),
        (cpu, reference) => panic!(
            "{what}: cpu {:?}, reference {:?}",
            cpu.err(),
            reference.err()
        ),
    };
    assert_eq!(cpu.len(), reference.len(), "{what}: lengths");
    let atol = 4.0 * k as f64 * f64::from(f32::EPSILON) * 16.0;
    for (i, (&a, &b)) in cpu.iter().zip(&reference).enumerate() {
        let (a, b) = (f64::from(a), f64::from(b));
        assert!(
            (a - b).abs() <= (1e-6 * a.abs().max(b.abs())).max(atol),
            "{what}: element {i}: cpu {a:e}, reference {b:e}"
        );
    }
}

fn randn(dims: &[usize], seed: u64) -> Result<Tensor> {
    Tensor::randn(dims, seed)
}

#[test]
fn products() -> Result<()> {
    let path = kiln_runtime::cpu::gemm_path()?;
    eprintln!("GEMM path: {path}");
    // (m, k, n): each at least 2^23 multiply-adds, so that kiln's cores take
    // it (45x333x97 has 2^20 and at least 32 along each axis, which they
    // take on two threads or more; 2900x2900x1 is too narrow for them and
    // runs on the `gemm` crate, as 1000x1000x12 does where A is packed;
    // products of 1 to 8 rows, 1x2900x2900 and 7x1031x1163, go to kiln's
    // few-row path); 1 along each axis; tiles and panels ragged; several
    // depth blocks.
    for (m, k, n) in [
        (1, 2900, 2900),
        (2900, 2900, 1),
        (2050, 1, 4100),
        (517, 131, 129),
        (7, 1031, 1163),
        (97, 1100, 101),
        (250, 784, 256),
        (45, 333, 97),
        (1000, 1000, 12),
    ] {
        let (a, b, bias) = (randn(&[m, k], 1)?, randn(&[k, n], 2)?, randn(&[n], 3)?);
        let shape = format!("{m}x{k}x{n} on {path}");
        check(&format!("a@b {shape}"), &[a.clone(), b.clone()], k, |t| {
            t[0].matmul(&t[1])
        });
        check(
            &format!("relu(a@b+bias) {shape}"),
            &[a.clone(), b.clone(), bias.clone()],
            k,
            |t| (t[0].matmul(&t[1])? + &t[2])?.relu(),
        );
        // A bias per row (a convolution's) and ReLU6 as ONNX's Clip
        // imports it.
        check(
            &format!("relu6(a@b+bias per row) {shape}"),
            &[a.clone(), b.clone(), randn(&[m, 1], 4)?],
            k,
            |t| {
                let y = (t[0].matmul(&t[1])? + &t[2])?;
                y.maximum(&Tensor::scalar(0.0f32))?
                    .minimum(&Tensor::scalar(6.0f32))
            },
        );
        // ReLU6 without a bias (a convolution whose bias folded away).
        check(
            &format!("relu6(a@b) {shape}"),
            &[a.clone(), b.clone()],
            k,
            |t| {
                t[0].matmul(&t[1])?
                    .maximum(&Tensor::scalar(0.0f32))?
                    .minimum(&Tensor::scalar(6.0f32))
            },
        );
        // The same product from operands stored transposed: Aᵀ·B (a weight
        // gradient), A·Bᵀ (an input gradient), and both.
        let (at, bt) = (contiguous(&a.t()?)?, contiguous(&b.t()?)?);
        check(
            &format!("at.T@b {shape}"),
            &[at.clone(), b.clone()],
            k,
            |t| t[0].t()?.matmul(&t[1]),
        );
        check(
            &format!("relu(a@bt.T+bias) {shape}"),
            &[a.clone(), bt.clone(), bias],
            k,
            |t| (t[0].matmul(&t[1].t()?)? + &t[2])?.relu(),
        );
        check(&format!("at.T@bt.T {shape}"), &[at, bt], k, |t| {
            t[0].t()?.matmul(&t[1].t()?)
        });
    }
    // Batches, each product large enough for kiln's cores: both operands
    // batched, B broadcast over A's batches, and A read transposed.
    let (a, b) = (randn(&[3, 150, 200], 4)?, randn(&[3, 200, 301], 5)?);
    check(
        &format!("batched a@b on {path}"),
        &[a.clone(), b],
        200,
        |t| t[0].matmul(&t[1]),
    );
    let (w, bias) = (randn(&[200, 301], 6)?, randn(&[301], 7)?);
    check(
        &format!("batched relu(a@w+bias) on {path}"),
        &[a, w, bias],
        200,
        |t| (t[0].matmul(&t[1])? + &t[2])?.relu(),
    );
    let (at, b) = (randn(&[2, 200, 150], 8)?, randn(&[2, 200, 300], 9)?);
    check(
        &format!("batched at.T@b on {path}"),
        &[at.clone(), b.clone()],
        200,
        |t| t[0].transpose(-1, -2)?.matmul(&t[1]),
    );
    // The epilogue over a reshape of the product (a convolution's NCHW
    // output, each row of the product split in two axes), its bias one per
    // row, and over a reshape that splits the rows instead.
    let bias = randn(&[150, 1, 1], 10)?;
    check(
        &format!("relu(reshape(at.T@b)+bias) on {path}"),
        &[at.clone(), b.clone(), bias],
        200,
        |t| {
            (t[0]
                .transpose(-1, -2)?
                .matmul(&t[1])?
                .reshape([2, 150, 20, 15])?
                + &t[2])?
                .relu()
        },
    );
    let bias = randn(&[10, 1, 1], 11)?;
    check(
        &format!("relu(reshape(at.T@b)+bias) by rows on {path}"),
        &[at, b, bias],
        200,
        |t| {
            (t[0]
                .transpose(-1, -2)?
                .matmul(&t[1])?
                .reshape([2, 10, 15, 300])?
                + &t[2])?
                .relu()
        },
    );
    // Operands whose axes merge without one stride, read where they lie
    // (`Operand::Merged`): B's rows, B's columns, A's rows; then many
    // small products, which run side by side.
    let (a, x) = (randn(&[3, 70, 24], 12)?, randn(&[3, 4, 37, 6], 13)?);
    check(&format!("a@merged rows on {path}"), &[a, x], 24, |t| {
        let rows = t[1].permute(&[0, 3, 1, 2])?.reshape([3, 24, 37])?;
        t[0].matmul(&rows)
    });
    let (a, x) = (randn(&[2, 31, 41], 14)?, randn(&[2, 41, 9, 35], 15)?);
    check(&format!("a@merged columns on {path}"), &[a, x], 41, |t| {
        let cols = t[1].permute(&[0, 1, 3, 2])?.reshape([2, 41, 315])?;
        t[0].matmul(&cols)
    });
    let (x, b) = (randn(&[5, 67, 3, 40], 16)?, randn(&[120, 33], 17)?);
    check(&format!("merged rows@b on {path}"), &[x, b], 120, |t| {
        t[0].permute(&[1, 0, 2, 3])?
            .reshape([67, 5, 120])?
            .reshape([335, 120])?
            .matmul(&t[1])
    });
    let (a, b, bias) = (
        randn(&[8, 9], 18)?,
        randn(&[64, 9, 30], 19)?,
        randn(&[8, 1], 20)?,
    );
    check(
        &format!("many small relu(a@b+bias) on {path}"),
        &[a, b, bias],
        9,
        |t| (t[0].matmul(&t[1])? + &t[2])?.relu(),
    );
    captured_weights(path)?;
    bf16_products(path)?;
    Ok(())
}

/// Products whose right operand is a weight the compiled graph captures,
/// which the CPU packs once (`Executable::constant`), against the same
/// graph compiled for the interpreter: a few rows streamed over the
/// panels (one row across threads, rows past the first four), more through
/// the cores' loop nest over them (several depth blocks, rows shared by
/// threads); the weight read transposed, as stored, by two products at
/// once, and broadcast over a batch; bias, ReLU and ReLU6 applied.
fn captured_weights(path: &str) -> Result<()> {
    for (m, k, n) in [
        (1, 2900, 700),
        (3, 70, 33),
        (5, 1031, 163),
        (8, 300, 130),
        (13, 600, 100),
        (300, 64, 48),
    ] {
        let wt = randn(&[n, k], 21)?;
        let w = contiguous(&wt.t()?)?;
        let bias = randn(&[n], 22)?;
        let spec = kiln::TensorType::new(DType::F32, [2, m, k].as_slice());
        let graph = |device: Device| {
            let options = kiln::CompileOptions::on(device);
            kiln::compile_with("captured", std::slice::from_ref(&spec), options, |t| {
                let x = t[0].slice(0, 0, 1, 1)?.reshape([m, k])?;
                Ok(vec![
                    (x.matmul(&wt.t()?)? + &bias)?.relu()?,
                    x.matmul(&w)?,
                    x.matmul(&wt.t()?)?.clamp(0.0, 6.0)?,
                    t[0].matmul(&w)?,
                ])
            })
        };
        let x = randn(&[2, m, k], 23)?.to_vec::<f32>()?;
        let x = kiln::Data::F32(x);
        let (cpu, reference) = (
            graph(Device::Cpu)?.run(&[&x])?,
            graph(Device::Reference)?.run(&[&x])?,
        );
        let atol = 4.0 * k as f64 * f64::from(f32::EPSILON) * 16.0;
        for (o, (cpu, reference)) in cpu.iter().zip(&reference).enumerate() {
            let what = format!("captured {m}x{k}x{n} output {o} on {path}");
            let (kiln::Data::F32(cpu), kiln::Data::F32(reference)) = (cpu, reference) else {
                panic!("{what}: not f32");
            };
            assert_eq!(cpu.len(), reference.len(), "{what}: lengths");
            for (i, (&a, &b)) in cpu.iter().zip(reference).enumerate() {
                let (a, b) = (f64::from(a), f64::from(b));
                assert!(
                    (a - b).abs() <= (1e-6 * a.abs().max(b.abs())).max(atol),
                    "{what}: element {i}: cpu {a:e}, reference {b:e}"
                );
            }
        }
    }
    Ok(())
}

/// Products of bf16 operands (on the `amx` path by its core, on the others
/// widened to f32 as they are packed) against the interpreter, which sums
/// in f64 and rounds to bf16 once: one bf16 unit apart at most, and f32's
/// rounding of the sums (`check`'s bound). Ragged tiles and depths, a product of one row,
/// B read transposed, batches, operands through merged axes, ReLU over the
/// rounded product, and an f32 product of bf16 values with a bias and ReLU
/// (a kernel's epilogue over each block of rows).
fn bf16_products(path: &str) -> Result<()> {
    // Realized, so that the graph's inputs are bf16.
    let bf16 = |dims: &[usize], seed| {
        let t = randn(dims, seed)?.cast(DType::BF16)?;
        t.realize()?;
        Ok::<_, kiln::Error>(t)
    };
    let check =
        |what: &str, inputs: &[Tensor], k: usize, f: &dyn Fn(&[Tensor]) -> Result<Tensor>| {
            let run = |device: Device| -> Result<Vec<f32>> {
                let on: Vec<Tensor> = inputs.iter().map(|t| t.to(device)).collect::<Result<_>>()?;
                f(&on)?.cast(DType::F32)?.to_vec::<f32>()
            };
            let (cpu, reference) = (run(Device::Cpu), run(Device::Reference));
            let (cpu, reference) = (cpu.expect(what), reference.expect(what));
            let atol = 4.0 * k as f32 * f32::EPSILON * 16.0;
            for (i, (&a, &b)) in cpu.iter().zip(&reference).enumerate() {
                assert!(
                    (a - b).abs() <= (2f32.powi(-7) * a.abs().max(b.abs())).max(atol),
                    "{what} on {path}: element {i}: cpu {a:e}, reference {b:e}"
                );
            }
        };
    for (m, k, n) in [
        (517, 131, 129),
        (7, 1031, 1163),
        (1, 300, 77),
        (64, 784, 256),
    ] {
        let (a, b) = (bf16(&[m, k], 21)?, bf16(&[k, n], 22)?);
        let shape = format!("bf16 {m}x{k}x{n}");
        check(&format!("a@b {shape}"), &[a.clone(), b.clone()], k, &|t| {
            t[0].matmul(&t[1])
        });
        let bt = Tensor::from_vec(b.t()?.to_vec::<kiln::bf16>()?, [n, k])?;
        check(&format!("relu(a@bt.T) {shape}"), &[a, bt], k, &|t| {
            t[0].matmul(&t[1].t()?)?.relu()
        });
    }
    // f32 products of bf16 values, with a bias and ReLU: the epilogue a
    // kernel's over each block of rows the core finishes.
    let (a, b, bias) = (
        bf16(&[300, 200], 27)?,
        bf16(&[200, 70], 28)?,
        randn(&[70], 29)?,
    );
    check("relu(f32(a)@f32(b)+bias) bf16", &[a, b, bias], 200, &|t| {
        let product = t[0].cast(DType::F32)?.matmul(&t[1].cast(DType::F32)?)?;
        (product + &t[2])?.relu()
    });
    let (a, b) = (bf16(&[3, 150, 200], 23)?, bf16(&[200, 301], 24)?);
    check("batched a@b bf16", &[a, b], 200, &|t| t[0].matmul(&t[1]));
    let (a, x) = (bf16(&[3, 70, 24], 25)?, bf16(&[3, 4, 37, 6], 26)?);
    check("a@merged rows bf16", &[a, x], 24, &|t| {
        let rows = t[1].permute(&[0, 3, 1, 2])?.reshape([3, 24, 37])?;
        t[0].matmul(&rows)
    });
    Ok(())
}

/// `t`'s values laid out anew, row-major.
fn contiguous(t: &Tensor) -> Result<Tensor> {
    Tensor::from_vec(t.to_vec::<f32>()?, t.shape().clone())
}

#[test]
fn every_other_path() -> Result<()> {
    let this = kiln_runtime::cpu::gemm_path()?;
    for (path, available) in kiln_runtime::cpu::gemm_paths() {
        if path == this {
            continue;
        }
        if !available {
            eprintln!("skipped: the GEMM path {path} (this CPU lacks it)");
            continue;
        }
        let test = std::env::current_exe().expect("this test's binary");
        let out = Command::new(test)
            .args(["products", "--exact", "--nocapture", "--test-threads=1"])
            .env("KILN_CPU_ISA", path)
            .output()
            .expect("the test binary runs again");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "products on {path}:\n{stdout}\n{stderr}"
        );
        assert!(stderr.contains(&format!("GEMM path: {path}")), "{stderr}");
        eprintln!("products on {path}: ok");
    }
    Ok(())
}
