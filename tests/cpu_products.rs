//! Products, fusion kinds and compiled graphs on a backend against the
//! reference interpreter (the rest of `tests/cpu.rs`, with the same
//! device, inputs and bounds): matmuls plain, transposed and batched, of
//! f32 and of bf16 values, every fusion kind and side outputs,
//! transcendentals within their bounds, long rows of exponentials, replays.

mod agree;

use agree::{EXACT, SIZES, Tol, check, compare, device, exp_rtol, input, product_tol, sum_tol};
use kiln::{CompileOptions, DType, Data, Device, Result, Tensor};
use kiln_support::data;

/// The `(m, k, n)` of the f32 and bf16 products: one element, tiles'
/// edges, long and short sums, and (the last) large enough for the
/// AVX-512 kernels where the machine has them.
const PRODUCTS: [(usize, usize, usize); 6] = [
    (1, 1, 1),
    (3, 7, 5),
    (50, 3, 1027),
    (7, 1027, 3),
    (64, 784, 256),
    (520, 517, 509),
];

/// `x @ w` and `relu(x @ w + bias)` against the interpreter.
fn product_and_bias_relu(what: &str, [x, w, bias]: [&Tensor; 3], tol: Tol) -> Result<()> {
    let (x, w) = (x.clone(), w.clone());
    check(
        &format!("matmul {what}"),
        &[x.clone(), w.clone()],
        tol,
        |t| t[0].matmul(&t[1]),
    )?;
    check(
        &format!("relu(x@w+b) {what}"),
        &[x, w, bias.clone()],
        tol,
        |t| (t[0].matmul(&t[1])? + &t[2])?.relu(),
    )
}

#[test]
fn matmuls_plain_transposed_batched() -> Result<()> {
    for (m, k, n) in PRODUCTS {
        let (a, b, bias) = (
            input(&[m, k], 31, false)?,
            input(&[k, n], 32, false)?,
            input(&[n], 33, false)?,
        );
        let tol = product_tol(k, 16.0);
        product_and_bias_relu(&format!("{m}x{k}x{n}"), [&a, &b, &bias], tol)?;
        // A bias per row (a convolution's, per channel) and ReLU6 as ONNX's
        // Clip imports it, and a cap alone: both in the GEMM's registers.
        let per_row = input(&[m, 1], 34, false)?;
        check(
            &format!("relu6(x@w+b per row) {m}x{k}x{n}"),
            &[a.clone(), b.clone(), per_row],
            tol,
            |t| {
                let y = (t[0].matmul(&t[1])? + &t[2])?;
                y.maximum(&Tensor::scalar(0.0f32))?
                    .minimum(&Tensor::scalar(6.0f32))
            },
        )?;
        check(
            &format!("min(x@w+b, 2.5) {m}x{k}x{n}"),
            &[a.clone(), b.clone(), input(&[n], 35, false)?],
            tol,
            |t| (t[0].matmul(&t[1])? + &t[2])?.minimum(&Tensor::scalar(2.5f32)),
        )?;
        let bt = b.t()?.to_vec::<f32>()?;
        let bt = Tensor::from_vec(bt, [n, k])?;
        check(
            &format!("x@w.T {m}x{k}x{n}"),
            &[a.clone(), bt.clone()],
            tol,
            |t| t[0].matmul(&t[1].t()?),
        )?;
        // Operands computed inside the matmul's kernel: normalized bytes on
        // the left, a scaled transposed weight on the right.
        let pixels: Vec<u8> = (0..m * k).map(|i| (i * 37 % 256) as u8).collect();
        let pixels = Tensor::from_vec(pixels, [m, k])?;
        check(
            &format!("normalize(u8)@w {m}x{k}x{n}"),
            &[pixels, b.clone()],
            tol,
            |t| {
                let x = ((t[0].cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? / 0.3081f32;
                x?.matmul(&t[1])
            },
        )?;
        // The first layer's weight gradient: the normalized bytes
        // transposed, as the training step computes them.
        let pixels: Vec<u8> = (0..m * k).map(|i| (i * 53 % 256) as u8).collect();
        let pixels = Tensor::from_vec(pixels, [m, k])?;
        let g = input(&[m, n], 40, false)?;
        check(
            &format!("normalize(u8).T@g {k}x{m}x{n}"),
            &[pixels, g.clone()],
            product_tol(m, 16.0),
            |t| {
                let x = ((t[0].cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? / 0.3081f32;
                x?.t()?.matmul(&t[1])
            },
        )?;
        // The same on the right (`g @ normalize(u8).T`), and batched.
        let pixels: Vec<u8> = (0..2 * n * k).map(|i| (i * 29 % 256) as u8).collect();
        let pixels = Tensor::from_vec(pixels, [2, n, k])?;
        let normalize = |x: &Tensor| -> Result<Tensor> {
            ((x.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? / 0.3081f32
        };
        check(
            &format!("a@normalize(u8).T {m}x{k}x{n}"),
            &[a.clone(), pixels.clone()],
            tol,
            |t| t[0].matmul(&normalize(&t[1].slice(0, 0, 1, 1)?.reshape([n, k])?)?.t()?),
        )?;
        let g3 = input(&[2, m, n], 42, false)?;
        check(
            &format!("normalize(u8).T@g batched 2x{k}x{n}x{m}"),
            &[pixels, g3],
            product_tol(n, 16.0),
            |t| {
                normalize(&t[0])?
                    .permute(&[0, 2, 1])?
                    .matmul(&t[1].permute(&[0, 2, 1])?)
            },
        )?;
        // One operand computed for two products, as is and transposed (the
        // second launch reads what the first computed), and for both sides
        // of one product.
        let pixels: Vec<u8> = (0..m * k).map(|i| (i * 41 % 256) as u8).collect();
        let pixels = Tensor::from_vec(pixels, [m, k])?;
        check(
            &format!("x.T@(x@w), x normalized u8 {m}x{k}x{n}"),
            &[pixels.clone(), b.clone()],
            product_tol(k * m, 64.0),
            |t| {
                let x = normalize(&t[0])?;
                x.t()?.matmul(&x.matmul(&t[1])?)
            },
        )?;
        check(
            &format!("x@x.T, x normalized u8 {m}x{k}"),
            &[pixels],
            product_tol(k, 16.0),
            |t| {
                let x = normalize(&t[0])?;
                x.matmul(&x.t()?)
            },
        )?;
        // ReLU's backward pass in the product's epilogue: the gradient
        // where the layer's output was positive, else 0.
        let h = input(&[m, k], 41, true)?;
        check(
            &format!("where(h>0, g@w.T, 0) {m}x{n}x{k}"),
            &[g, b.clone(), h],
            product_tol(n, 16.0),
            |t| {
                let zero = Tensor::scalar(0.0f32);
                let dh = t[0].matmul(&t[1].t()?)?;
                t[2].gt(&zero)?.where_cond(&dh, &zero)
            },
        )?;
        check(
            &format!("x@(w.T*0.5).T {m}x{k}x{n}"),
            &[a.clone(), bt],
            tol,
            |t| t[0].matmul(&(&t[1] * 0.5f32)?.t()?),
        )?;
    }
    let (a, b) = (
        input(&[2, 3, 7, 5], 34, false)?,
        input(&[2, 3, 5, 4], 35, false)?,
    );
    check("batched matmul", &[a, b], product_tol(5, 16.0), |t| {
        t[0].matmul(&t[1])?.exp()
    })?;
    // One weight broadcast over the batch: one product of the batch's rows
    // (`batch-rows`), its bias and ReLU in the epilogue.
    let (x, w, bias) = (
        input(&[3, 41, 67], 40, false)?,
        input(&[67, 130], 41, false)?,
        input(&[130], 42, false)?,
    );
    check(
        "relu(x@w + b), the weight broadcast 3x41x67x130",
        &[x, w, bias],
        product_tol(67, 16.0),
        |t| t[0].matmul(&t[1])?.add(&t[2])?.relu(),
    )?;
    // Each product large enough for the AVX-512 kernels, whose blocks of
    // rows take the epilogue as they finish.
    let (a, b) = (
        input(&[2, 200, 256], 38, false)?,
        input(&[2, 256, 200], 39, false)?,
    );
    check(
        "batched relu(x@w * 0.5 - 1) 2x200x256x200",
        &[a, b],
        product_tol(256, 16.0),
        |t| ((t[0].matmul(&t[1])? * 0.5f32)? - 1.0f32)?.relu(),
    )?;
    let (v, w) = (input(&[7], 36, false)?, input(&[7, 3], 37, false)?);
    check("vector @ matrix", &[v, w], product_tol(7, 16.0), |t| {
        t[0].matmul(&t[1])
    })
}

/// Products of bf16 values: multiplied exactly (the AMX core, cuBLASLt on
/// a GPU, or widened to f32 as kiln's cores pack them), summed in f32 and
/// rounded once to bf16, as the interpreter rounds its f64 sums: one bf16
/// unit apart at most, past the f32 sum's own error.
#[test]
fn bf16_products_plain_transposed_batched_at_offsets() -> Result<()> {
    let half = |dims: &[usize], seed| -> Result<Tensor> {
        let t = input(dims, seed, false)?.cast(DType::BF16)?;
        t.realize()?;
        Ok(t)
    };
    for (m, k, n) in PRODUCTS {
        let tol = Tol {
            rtol: 2f64.powi(-7),
            ..sum_tol(k, 16.0)
        };
        let (a, b) = (half(&[m, k], 41)?, half(&[k, n], 42)?);
        check(
            &format!("bf16 matmul {m}x{k}x{n}"),
            &[a.clone(), b],
            tol,
            |t| t[0].matmul(&t[1]),
        )?;
        check(
            &format!("bf16 x@w.T {m}x{k}x{n}"),
            &[a, half(&[n, k], 43)?],
            tol,
            |t| t[0].matmul(&t[1].t()?),
        )?;
        // Operands at odd element offsets, rows of odd lengths: pointers
        // two bytes apart from any wider alignment.
        check(
            &format!("bf16 x[:, 1:]@w[1:] {m}x{k}x{n}"),
            &[half(&[m, k + 1], 44)?, half(&[k + 1, n], 45)?],
            tol,
            |t| {
                t[0].slice(1, 1, k + 1, 1)?
                    .matmul(&t[1].slice(0, 1, k + 1, 1)?)
            },
        )?;
    }
    let tol = Tol {
        rtol: 2f64.powi(-7),
        ..sum_tol(256, 16.0)
    };
    check(
        "bf16 batched matmul, the weight broadcast",
        &[half(&[3, 40, 256], 46)?, half(&[256, 72], 47)?],
        tol,
        |t| t[0].matmul(&t[1]),
    )?;
    check(
        "bf16 batched matmul 2x3",
        &[half(&[2, 3, 40, 256], 48)?, half(&[2, 3, 256, 72], 49)?],
        tol,
        |t| t[0].matmul(&t[1]),
    )
}

/// Products of small integers held in bf16 sum exactly in f32 and in the
/// interpreter's f64, so that every path rounds the same sums: a bare
/// product (rounded as the GEMM stores it, on a GPU) and one with a bias
/// and ReLU (rounded, added, rounded again by the kernel after it) agree
/// bit for bit.
#[test]
fn bf16_products_of_small_integers_are_exact() -> Result<()> {
    // Values in -2..=2: at most 64 products of 4, 256, an integer bf16
    // holds; the bias then makes sums bf16 rounds, the same on every path.
    let ints = |dims: &[usize], seed: u64| -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let values: Vec<kiln::bf16> = (0..n as u64)
            .map(|i| {
                let x = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed) >> 59;
                kiln::bf16::from_f32((x % 5) as f32 - 2.0)
            })
            .collect();
        Tensor::from_vec(values, dims)
    };
    for (m, k, n) in [(1, 1, 1), (37, 64, 129), (128, 64, 256)] {
        let (a, b, bias) = (ints(&[m, k], 1)?, ints(&[k, n], 2)?, ints(&[n], 3)?);
        product_and_bias_relu(
            &format!("bf16 integers {m}x{k}x{n}"),
            [&a, &b, &bias],
            EXACT,
        )?;
    }
    check(
        "bf16 integers batched 3x40x64x72",
        &[ints(&[3, 40, 64], 4)?, ints(&[3, 64, 72], 5)?],
        EXACT,
        |t| t[0].matmul(&t[1]),
    )
}

#[test]
fn fusion_kinds_agree() -> Result<()> {
    let soft = Tol {
        rtol: 2e-6,
        atol: 1e-7,
    };
    let log_soft = Tol {
        rtol: 2e-6,
        atol: 2e-6,
    };
    for n in SIZES {
        let x = input(&[5, n], 41, false)?;
        check(
            &format!("softmax [5,{n}]"),
            std::slice::from_ref(&x),
            soft,
            |t| t[0].softmax(-1),
        )?;
        check(
            &format!("log_softmax [5,{n}]"),
            std::slice::from_ref(&x),
            log_soft,
            |t| t[0].log_softmax(-1),
        )?;
        check(
            &format!("softmax axis 0 [5,{n}]"),
            std::slice::from_ref(&x),
            soft,
            |t| t[0].softmax(0),
        )?;
        check(
            &format!("x - mean [5,{n}]"),
            std::slice::from_ref(&x),
            sum_tol(n, 8.0),
            |t| &t[0] - &t[0].mean(&[1], true)?,
        )?;
        check(
            &format!("sum(x*x) [5,{n}]"),
            std::slice::from_ref(&x),
            sum_tol(5 * n, 16.0),
            |t| (&t[0] * &t[0])?.sum_all(),
        )?;
        let (w, b) = (input(&[n], 42, false)?, input(&[n], 43, false)?);
        check(
            &format!("layer_norm [5,{n}]"),
            &[x.clone(), w, b],
            Tol {
                rtol: 1e-4,
                atol: 1e-4,
            },
            |t| t[0].layer_norm(&t[1], &t[2], 1e-5),
        )?;
        check(
            &format!("gelu [5,{n}]"),
            &[x],
            Tol {
                rtol: 2e-6,
                atol: 1e-7,
            },
            |t| t[0].gelu(),
        )?;
    }
    // Short rows run four at a time, in blocks of rows shared by two threads.
    let x = input(&[4096, 10], 45, false)?;
    check(
        "log_softmax [4096,10]",
        std::slice::from_ref(&x),
        log_soft,
        |t| t[0].log_softmax(-1),
    )?;
    let x = input(&[4096, 1000], 44, false)?;
    check("softmax [4096,1000]", std::slice::from_ref(&x), soft, |t| {
        t[0].softmax(-1)
    })?;
    check(
        "ew_chain [4096,1000]",
        &[x.clone(), x.clone(), x],
        EXACT,
        |t| ((&t[0] * &t[1])? + &t[2])?.relu()? * 0.5f32,
    )
}

#[test]
fn side_outputs_of_products_and_sums_agree() -> Result<()> {
    use kiln::TensorType;
    // A momentum update fused into the kernel computing its gradient: the
    // epilogue of a column sum (a bias's gradient), of a row sum and of a
    // product with A transposed (a weight's), each storing the momentum
    // beside the new parameter. Awkward sizes: vector tails, one row,
    // thread splits.
    for (rows, cols, k) in [
        (1, 1, 1),
        (3, 7, 5),
        (50, 13, 9),
        (1027, 5, 3),
        (37, 1027, 6),
    ] {
        let dims: [&[usize]; 8] = [
            &[rows, cols],
            &[cols],
            &[cols],
            &[rows, k],
            &[k, cols],
            &[k, cols],
            &[rows],
            &[rows],
        ];
        let inputs: Vec<Tensor> = dims
            .iter()
            .enumerate()
            .map(|(i, d)| input(d, 60 + i as u64, false))
            .collect::<Result<_>>()?;
        let specs: Vec<TensorType> = inputs.iter().map(|t| t.ty().clone()).collect();
        let update = |t: &[Tensor]| -> Result<Vec<Tensor>> {
            let momentum = |m: &Tensor, g: &Tensor| (m * 0.9f32)? + g;
            let bias_m = momentum(&t[1], &t[0].sum(&[0], false)?)?;
            let bias = (&t[2] - &(&bias_m * 0.1f32)?)?;
            let weight_m = momentum(&t[4], &t[3].t()?.matmul(&t[0])?)?;
            let weight = (&t[5] - &(&weight_m * 0.1f32)?)?;
            let row_m = momentum(&t[6], &t[0].sum(&[1], false)?)?;
            let row = (&t[7] - &(&row_m * 0.1f32)?)?;
            Ok(vec![bias_m, bias, weight_m, weight, row_m, row])
        };
        let compile =
            |device| kiln::compile_with("update", &specs, CompileOptions::on(device), update);
        let mut tested = compile(device())?;
        // On a GPU the product's epilogue, which cuBLASLt has no form for,
        // is a kernel of its own after the GEMM.
        let launches = if device() == Device::Cpu { 3 } else { 4 };
        assert_eq!(
            tested.launches(),
            launches,
            "[{rows},{cols}] x {k}: two sums and a product"
        );
        let data: Vec<Data> = inputs.iter().map(data).collect::<Result<_>>()?;
        let refs: Vec<&Data> = data.iter().collect();
        let got = tested.run(&refs)?;
        let want = compile(Device::Reference)?.run(&refs)?;
        let tols = [
            sum_tol(rows, 8.0),
            sum_tol(rows, 8.0),
            product_tol(rows, 16.0),
            product_tol(rows, 16.0),
            sum_tol(cols, 8.0),
            sum_tol(cols, 8.0),
        ];
        for (i, ((a, b), tol)) in got.iter().zip(&want).zip(tols).enumerate() {
            compare(&format!("[{rows},{cols}] x {k}: output {i}"), a, b, tol);
        }
    }
    Ok(())
}

#[test]
fn transcendentals_stay_within_their_bounds() -> Result<()> {
    // Every 97th f32 bit pattern of each sign: the whole range, subnormals included.
    let mut values: Vec<f32> = (0..u32::MAX / 97)
        .map(|k| f32::from_bits(k.wrapping_mul(97)))
        .filter(|v| v.is_finite())
        .collect();
    // The special values, where a polynomial's bit tricks go wrong first.
    values.extend([
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
    ]);
    let x = Tensor::from_slice(&values, [values.len()])?.to(device())?;
    type F = fn(&Tensor) -> Result<Tensor>;
    type Exact = fn(f64) -> f64;
    let cases: [(&str, F, Exact, f64); 4] = [
        ("exp", Tensor::exp, f64::exp, exp_rtol()),
        ("log", Tensor::log, f64::ln, 2e-7),
        ("tanh", Tensor::tanh, f64::tanh, 5e-7),
        (
            "sigmoid",
            Tensor::sigmoid,
            |v| 1.0 / (1.0 + (-v).exp()),
            5e-7,
        ),
    ];
    for (name, f, exact, bound) in cases {
        let got = f(&x)?.to_vec::<f32>()?;
        let mut worst = (0.0f64, 0.0f32);
        for (&v, &g) in values.iter().zip(&got) {
            let want = exact(f64::from(v));
            let w32 = want as f32;
            // Where the true value is not a normal f32 the bound is absolute.
            let err = if w32.is_nan() {
                if g.is_nan() { 0.0 } else { f64::INFINITY }
            } else if w32.is_infinite() || g.is_infinite() {
                if g == w32 { 0.0 } else { f64::INFINITY }
            } else if want.abs() < f64::from(f32::MIN_POSITIVE) {
                ((f64::from(g) - want).abs() / f64::from(f32::MIN_POSITIVE)) * 1e-7
            } else {
                (f64::from(g) - want).abs() / want.abs()
            };
            if err > worst.0 {
                worst = (err, v);
            }
        }
        eprintln!(
            "{name}: worst relative error {:e} at {:e}",
            worst.0, worst.1
        );
        assert!(
            worst.0 <= bound,
            "{name}: relative error {:e} at x = {:e} exceeds {bound:e}",
            worst.0,
            worst.1
        );
    }
    Ok(())
}

/// Sums of exponentials over long rows (on AVX2 machines a call of 256-bit
/// code, over the output row or chunks of 1024 on the stack) with ragged
/// ends, and rows that leave exp's fast range: -inf, values spread over
/// +-200, a NaN, nothing but -inf, +inf.
#[test]
fn sums_of_exponentials_over_long_rows_agree() -> Result<()> {
    let soft = Tol {
        rtol: 2e-6,
        atol: 1e-7,
    };
    let log_soft = Tol {
        rtol: 2e-6,
        atol: 2e-6,
    };
    for n in [32, 33, 1000, 2500] {
        let mut v = Tensor::randn([7, n], 46)?.to_vec::<f32>()?;
        for (j, x) in v.iter_mut().enumerate() {
            let (row, k) = (j / n, j % n);
            match row {
                1 if k % 5 == 0 => *x = f32::NEG_INFINITY,
                2 => *x = (k * 7919 % 401) as f32 - 200.0,
                3 if k == n / 2 => *x = f32::NAN,
                4 => *x = f32::NEG_INFINITY,
                5 if k == n - 1 => *x = f32::INFINITY,
                _ => {}
            }
        }
        let x = Tensor::from_vec(v, [7, n])?;
        let one = std::slice::from_ref(&x);
        check(&format!("softmax [7,{n}]"), one, soft, |t| t[0].softmax(-1))?;
        check(&format!("log_softmax [7,{n}]"), one, log_soft, |t| {
            t[0].log_softmax(-1)
        })?;
        check(&format!("sum(exp(x)) [7,{n}]"), one, soft, |t| {
            t[0].exp()?.sum(&[1], false)
        })?;
    }
    Ok(())
}

/// Long rows scaled by their own max (on AVX2 machines the max and the
/// product by calls of 256-bit code, the product reading the input row):
/// exact, with ragged ends and the NaN, infinities and zeros `input` puts
/// in.
#[test]
fn long_rows_scaled_by_their_max_agree_exactly() -> Result<()> {
    for n in [32, 33, 50, 1027] {
        let x = input(&[5, n], 47, true)?;
        check(
            &format!("x * max(x) [5,{n}]"),
            std::slice::from_ref(&x),
            EXACT,
            |t| t[0].mul(&t[0].max(&[1], true)?),
        )?;
    }
    Ok(())
}

#[test]
fn compiled_graphs_replay_and_reject_wrong_inputs() -> Result<()> {
    let w = Tensor::randn([16, 4], 1)?;
    let spec = kiln::TensorType::new(DType::F32, [8, 16]);
    let mut g = kiln::compile("layer", &[spec], |x| {
        Ok(vec![(x[0].matmul(&w)?.relu()? + 1.0f32)?])
    })?;
    for seed in 0..3 {
        let x = Tensor::randn([8, 16], seed)?;
        let got = g.call(&[&x])?;
        let want = (x.to(Device::Reference)?.matmul(&w)?.relu()? + 1.0f32)?;
        compare(
            "compiled call",
            &data(&got[0])?,
            &data(&want)?,
            sum_tol(16, 16.0),
        );
    }
    let wrong = Tensor::randn([8, 15], 0)?;
    let err = g.call(&[&wrong]).err().map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("layer: input 0 must be f32[8,16], got 120 values of f32")
    );
    let err = g.call(&[]).err().map(|e| e.to_string());
    assert_eq!(err.as_deref(), Some("layer: expected 1 arguments, got 0"));
    Ok(())
}

#[test]
fn an_empty_matmul_of_a_padded_operand_is_empty() -> Result<()> {
    // A padded view of an empty tensor has an offset before its buffer.
    let (a, b) = (
        Tensor::from_vec(Vec::<f32>::new(), [2, 0, 7])?,
        input(&[4, 10, 1], 51, false)?,
    );
    check("empty padded matmul", &[a, b], EXACT, |t| {
        t[0].pad(&[(2, 0), (0, 0), (2, 1)], f32::NEG_INFINITY)?
            .matmul(&t[1])
    })?;
    let (x, w) = (input(&[3, 0], 52, false)?, input(&[0, 2], 53, false)?);
    check("matmul over an empty axis", &[x, w], EXACT, |t| {
        t[0].matmul(&t[1])
    })
}

#[test]
fn an_lstms_steps_agree() -> Result<()> {
    use kiln::TensorType;
    // An LSTM's recurrence, its gates' sigmoids and tanhs: every step's `h`
    // and the last `c` against the interpreter, on a batch of 3 and 13
    // units (vector tails) over 5 steps.
    let (steps, batch, units) = (5, 3, 13);
    let inputs: Vec<Tensor> = [
        vec![steps, batch, 4 * units],
        vec![units, 4 * units],
        vec![batch, units],
        vec![batch, units],
    ]
    .iter()
    .enumerate()
    .map(|(i, d)| input(d, 80 + i as u64, false))
    .collect::<Result<_>>()?;
    let specs: Vec<TensorType> = inputs.iter().map(|t| t.ty().clone()).collect();
    let lstm = |t: &[Tensor]| -> Result<Vec<Tensor>> {
        let (mut h, mut c) = (t[2].clone(), t[3].clone());
        let mut outputs = Vec::new();
        for s in 0..steps {
            let x = t[0].slice(0, s, s + 1, 1)?.reshape([batch, 4 * units])?;
            let gates = (x + &h.matmul(&t[1])?)?;
            let gate = |g: usize| gates.slice(1, g * units, (g + 1) * units, 1);
            c = ((gate(0)?.sigmoid()? * &c)? + &(gate(1)?.sigmoid()? * gate(2)?.tanh()?)?)?;
            h = (gate(3)?.sigmoid()? * c.tanh()?)?;
            outputs.push(h.clone());
        }
        outputs.push(c);
        Ok(outputs)
    };
    let compile = |device| kiln::compile_with("lstm", &specs, CompileOptions::on(device), lstm);
    let mut tested = compile(device())?;
    let data: Vec<Data> = inputs.iter().map(data).collect::<Result<_>>()?;
    let refs: Vec<&Data> = data.iter().collect();
    let got = tested.run(&refs)?;
    let want = compile(Device::Reference)?.run(&refs)?;
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        compare(&format!("lstm output {i}"), a, b, sum_tol(units, 64.0));
    }
    Ok(())
}
