//! The CUDA C that kiln generates, checked without a GPU: snapshots for the
//! mission's patterns (relu(a+b) with 16-byte vectors, relu(x@w+b) as one
//! cuBLASLt call with its bias+ReLU epilogue, an epilogue cuBLASLt cannot
//! express as a kernel after the GEMM, normalized bytes as a matmul operand's
//! prologue, softmax as one kernel running its two row reductions in turn,
//! sums by rows and by columns), and with
//! feature `cuda`, every kernel of those patterns and of random graphs
//! compiled by NVRTC to a CUBIN for sm_90 and sm_80.

// Helpers serve both the snapshot tests and, with feature `cuda`, NVRTC's.
#![allow(dead_code)]

use kiln::{Autocast, DType, Options, Result, Tensor};
use kiln_ir::kernel::{Kernel, KernelKind};
use kiln_ir::{Graph, Op};
use kiln_runtime::cuda::codegen;
use kiln_runtime::cuda::gemm;
use kiln_runtime::matmul::Epilogue;
use kiln_runtime::rows::row_groups;

/// The mission's patterns, by name.
fn pattern(name: &str) -> Result<Vec<Tensor>> {
    let randn = |dims: &[usize], seed| Tensor::randn(dims, seed);
    Ok(match name {
        "relu_add" => vec![(&randn(&[64, 64], 0)? + &randn(&[64, 64], 1)?)?.relu()?],
        "relu_add_bf16" => {
            let half = |seed| -> Result<Tensor> {
                let t = randn(&[64, 65], seed)?.cast(DType::BF16)?;
                t.realize()?;
                Ok(t)
            };
            vec![(&half(0)? + &half(1)?)?.relu()?]
        }
        "matmul_bias_relu" => {
            let (x, w, b) = (
                randn(&[64, 784], 0)?,
                randn(&[784, 256], 1)?,
                randn(&[256], 2)?,
            );
            vec![(x.matmul(&w)? + &b)?.relu()?]
        }
        "matmul_bias_scale_tanh" => {
            let (x, w, b) = (
                randn(&[64, 784], 0)?,
                randn(&[256, 784], 1)?,
                randn(&[256], 2)?,
            );
            vec![((x.matmul(&w.t()?)? + &b)? * 0.5f32)?.tanh()?]
        }
        "normalized_matmul" => {
            let bytes: Vec<u8> = (0..8 * 784).map(|i| (i % 256) as u8).collect();
            let x = Tensor::from_vec(bytes, [8, 784])?;
            let pixels =
                ((x.cast(DType::F32)? * (1.0f32 / 255.0))? - 0.1307f32)? * (1.0f32 / 0.3081);
            vec![pixels?.matmul(&randn(&[784, 16], 1)?)?]
        }
        // bf16 in and out, computed in f32: a scale and a row max.
        "bf16_scale" => {
            let x = randn(&[64, 33], 0)?
                .cast(DType::BF16)?
                .to_vec::<kiln::bf16>()?;
            let x = Tensor::from_vec(x, [64, 33])?;
            vec![(&x * Tensor::scalar(kiln::bf16::from_f32(0.5)))?.max(&[1], true)?]
        }
        // bf16 products: one kernel, cuBLASLt rounding a bare product to
        // bf16 as it stores it; with a bias and ReLU, a kernel after it.
        "bf16_matmul" | "bf16_matmul_bias_relu" => {
            let half = |dims: &[usize], seed| -> Result<Tensor> {
                let t = randn(dims, seed)?.cast(DType::BF16)?;
                t.realize()?;
                Ok(t)
            };
            let y = half(&[64, 784], 0)?.matmul(&half(&[784, 256], 1)?)?;
            match name {
                "bf16_matmul" => vec![y],
                _ => vec![(y + half(&[256], 2)?)?.relu()?],
            }
        }
        "softmax" => vec![randn(&[4096, 1000], 0)?.softmax(-1)?],
        "log_softmax" => vec![randn(&[4096, 10], 0)?.log_softmax(-1)?],
        // Integer maxes by rows: argmax's index reduction (i32), and i64's.
        "argmax" => {
            let x = randn(&[3, 50], 0)?;
            vec![x.argmax(1, false)?, x.cast(DType::I64)?.max(&[1], false)?]
        }
        "sums" => {
            let x = randn(&[4096, 1000], 0)?;
            vec![x.sum(&[1], false)?, x.sum(&[0], false)?, x.sum_all()?]
        }
        // A training step of an MLP 32-16-4: side outputs in products' and
        // sums' epilogues (the parameters and their optimizer state).
        "sgd_step" | "adamw_step" => {
            use kiln::optim::{AdamW, Optimizer, Sgd};
            let sgd = Sgd {
                momentum: 0.9,
                ..Sgd::new(0.1)
            };
            let adamw = AdamW::new(1e-3);
            let optimizer: &dyn Optimizer = if name == "sgd_step" { &sgd } else { &adamw };
            let params = [
                randn(&[32, 16], 1)?,
                randn(&[16], 2)?,
                randn(&[16, 4], 3)?,
                randn(&[4], 4)?,
            ];
            let x = randn(&[8, 32], 5)?;
            let labels = Tensor::from_vec((0..8).map(|i| i % 4).collect::<Vec<i32>>(), [8])?;
            let hidden = (x.matmul(&params[0])? + &params[1])?.relu()?;
            let loss = (hidden.matmul(&params[2])? + &params[3])?.cross_entropy(&labels)?;
            let refs: Vec<&Tensor> = params.iter().collect();
            let grads = kiln::grad(&loss, &refs)?;
            let state = optimizer.state(&refs)?;
            let (new, state) = optimizer.update(&params, &grads, &state)?;
            std::iter::once(loss).chain(new).chain(state).collect()
        }
        // Token and position embeddings summed: two gathers in one kernel.
        "embedding" => {
            let ids = Tensor::from_vec(vec![3i64, -1, 70, 5], [4])?;
            let positions = Tensor::from_vec(vec![0i32, 1, 2, 3], [4])?;
            let tokens = randn(&[71, 24], 0)?.index_select(0, &ids)?;
            vec![(tokens + randn(&[8, 24], 1)?.index_select(0, &positions)?)?]
        }
        // Dropout: Threefry of each element's position, in the kernel.
        // A hidden value read by two products (one transposed) and an
        // elementwise op: each product rounds it in its operand's prologue
        // under mixed precision (`cuda` sets bf16 autocast by the name).
        "autocast_shared" => {
            let (x, w, v) = (
                randn(&[64, 96], 0)?,
                randn(&[96, 40], 1)?,
                randn(&[40, 24], 2)?,
            );
            let h = x.matmul(&w)?.relu()?;
            let g = randn(&[64, 16], 3)?;
            vec![h.matmul(&v)?, h.t()?.matmul(&g)?, h.mul(&h)?]
        }
        // A hidden value only the next product reads: stored as bf16 by the
        // kernel after the GEMM that computes it, read where it lies.
        "autocast_chain" => {
            let (x, w, v) = (
                randn(&[64, 96], 0)?,
                randn(&[96, 40], 1)?,
                randn(&[40, 24], 2)?,
            );
            vec![x.matmul(&w)?.relu()?.matmul(&v)?]
        }
        "dropout" => vec![randn(&[64, 33], 0)?.dropout(0.25, &Tensor::scalar(7i32))?],
        // The table's gradient: each row added where its id points.
        "embedding_grad" => {
            let table = randn(&[71, 24], 0)?;
            let ids = Tensor::from_vec(vec![3i64, -1, 70, 3], [4])?;
            let loss = (table.index_select(0, &ids)? * randn(&[4, 24], 1)?)?.sum_all()?;
            kiln::grad(&loss, &[&table])?
        }
        other => panic!("no pattern {other}"),
    })
}

const PATTERNS: [&str; 19] = [
    "relu_add",
    "relu_add_bf16",
    "bf16_scale",
    "matmul_bias_relu",
    "bf16_matmul",
    "bf16_matmul_bias_relu",
    "matmul_bias_scale_tanh",
    "normalized_matmul",
    "softmax",
    "log_softmax",
    "argmax",
    "sums",
    "sgd_step",
    "adamw_step",
    "autocast_shared",
    "autocast_chain",
    "embedding",
    "embedding_grad",
    "dropout",
];

/// The kernels of a fused graph, in launch order.
fn kernels(graph: &Graph, optimized: &kiln::Optimized) -> Vec<Kernel> {
    optimized
        .schedule
        .launches
        .iter()
        .filter_map(|l| match &graph.node(l.node).op {
            Op::Kernel(k) => Some((**k).clone()),
            _ => None,
        })
        .collect()
}

/// Every kernel as printed CUDA C and launch plans, and the CUDA sources,
/// row groups as the runtime runs them (one kernel each).
fn generate(optimized: &kiln::Optimized) -> Result<(String, Vec<String>)> {
    let kernels = kernels(&optimized.graph, optimized);
    let (mut text, mut sources) = (String::new(), Vec::new());
    for group in row_groups(&optimized.graph, &optimized.schedule) {
        let (first, last) = (group.start, group.end - 1);
        if let Some(program) =
            codegen::row_group_of(optimized, group.clone()).map_err(kiln::Error::from)?
        {
            text += &format!(
                "// @k{first}..@k{last} row group: {:?}\n{}",
                program.grid, program.code
            );
            sources.push(program.code);
            continue;
        }
        for k in group {
            let (t, mut s) = generate_one(k, &kernels[k])?;
            text += &t;
            sources.append(&mut s);
        }
    }
    Ok((text, sources))
}

/// Kernel `k` as printed CUDA C and launch plans, and its CUDA sources.
fn generate_one(k: usize, kernel: &Kernel) -> Result<(String, Vec<String>)> {
    let (mut text, mut sources) = (String::new(), Vec::new());
    if let KernelKind::MatMul { .. } = kernel.kind {
        let matmul = gemm::matmul(kernel, true).map_err(kiln::Error::from)?;
        for (i, p) in matmul.prologues.iter().enumerate() {
            text += &format!("// @k{k} operand prologue {i}: {:?}\n{}", p.grid, p.code);
            sources.push(p.code.clone());
        }
        text += &format!("// @k{k} gemm: {:?}\n", matmul.gemm);
        match (&matmul.plan.epilogue, &matmul.epilogue) {
            (Epilogue::Kernel { acc: Some(acc) }, Some(program)) => {
                text += &format!(
                    "// @k{k} epilogue, product at scratch byte {acc}: {:?}\n{}",
                    program.grid, program.code
                );
                sources.push(program.code.clone());
            }
            (other, _) => text += &format!("// @k{k} epilogue: {other:?}\n"),
        }
    } else {
        let program = codegen::kernel(kernel).map_err(kiln::Error::from)?;
        text += &format!("// @k{k}: {:?}\n{}", program.grid, program.code);
        sources.push(program.code);
    }
    Ok((text, sources))
}

/// Pattern `name` optimized as the CUDA backend has it optimized (in bf16
/// mixed precision where the name starts with `autocast`), and generated.
fn cuda(name: &str) -> Result<(String, Vec<String>)> {
    let outputs = pattern(name)?;
    let refs: Vec<&Tensor> = outputs.iter().collect();
    let options = Options {
        autocast: name.starts_with("autocast").then_some(Autocast::BF16),
        ..Options::default()
    };
    let optimized = kiln::optimize(name, &refs, options)?;
    generate(&optimized)
}

#[test]
fn bf16_values_load_as_floats_and_store_rounded() -> Result<()> {
    insta::assert_snapshot!(cuda("bf16_scale")?.0);
    Ok(())
}

#[test]
fn relu_add_moves_float4_vectors() -> Result<()> {
    insta::assert_snapshot!(cuda("relu_add")?.0);
    Ok(())
}

#[test]
fn bf16_values_move_four_at_a_time() -> Result<()> {
    insta::assert_snapshot!(cuda("relu_add_bf16")?.0);
    Ok(())
}

#[test]
fn embeddings_read_the_rows_their_ids_pick() -> Result<()> {
    insta::assert_snapshot!(cuda("embedding")?.0);
    Ok(())
}

#[test]
fn an_embedding_gradient_is_a_thread_per_column() -> Result<()> {
    insta::assert_snapshot!(cuda("embedding_grad")?.0);
    Ok(())
}

#[test]
fn dropout_draws_threefry_in_its_kernel() -> Result<()> {
    insta::assert_snapshot!(cuda("dropout")?.0);
    Ok(())
}

#[test]
fn matmul_bias_relu_is_one_cublaslt_call() -> Result<()> {
    insta::assert_snapshot!(cuda("matmul_bias_relu")?.0);
    Ok(())
}

#[test]
fn a_bf16_product_is_stored_rounded_by_cublaslt() -> Result<()> {
    insta::assert_snapshot!(cuda("bf16_matmul")?.0 + &cuda("bf16_matmul_bias_relu")?.0);
    Ok(())
}

#[test]
fn other_epilogues_are_a_kernel_after_the_gemm() -> Result<()> {
    insta::assert_snapshot!(cuda("matmul_bias_scale_tanh")?.0);
    Ok(())
}

#[test]
fn normalized_bytes_are_a_matmul_operand_prologue() -> Result<()> {
    insta::assert_snapshot!(cuda("normalized_matmul")?.0);
    Ok(())
}

#[test]
fn an_update_stores_the_parameter_and_its_moments_beside_the_output() -> Result<()> {
    let (text, _) = cuda("adamw_step")?;
    // The first layer's weight: its gradient's product, then an epilogue
    // kernel writing the new weight and both moments.
    assert!(text.contains("float* __restrict__ side1"), "{text}");
    assert!(text.contains("side1[i] = "), "{text}");
    Ok(())
}

#[test]
fn mixed_precision_rounds_a_shared_operand_in_each_products_prologue() -> Result<()> {
    insta::assert_snapshot!(cuda("autocast_shared")?.0);
    Ok(())
}

#[test]
fn mixed_precision_stores_a_value_only_a_product_reads_as_bf16() -> Result<()> {
    insta::assert_snapshot!(cuda("autocast_chain")?.0);
    Ok(())
}

#[test]
fn softmax_is_one_row_group_kernel() -> Result<()> {
    insta::assert_snapshot!(cuda("softmax")?.0);
    Ok(())
}

/// A warp shuffle names every lane (`0xffffffff`), so every lane must reach
/// it: it stands alone, its value then combined. An integer max written
/// `acc > shfl(..) ? acc : shfl(..)` shuffled a second time on one side of
/// the `?:` only, and argmax hung on an H100.
#[test]
fn every_lane_reaches_each_shuffle() -> Result<()> {
    for name in PATTERNS {
        let (text, _) = cuda(name)?;
        for line in text.lines().filter(|l| l.contains("__shfl")) {
            assert_eq!(line.matches("__shfl").count(), 1, "{name}: {line}");
            let statement = line.split(';').find(|s| s.contains("__shfl")).unwrap();
            assert!(statement.contains(" down = "), "{name}: {line}");
        }
    }
    Ok(())
}

#[test]
fn sums_run_by_rows_or_by_columns() -> Result<()> {
    insta::assert_snapshot!(cuda("sums")?.0);
    Ok(())
}

/// `x[:, 1:] @ w` reads `x` in place from element 1, so its pointer is only
/// 4-byte aligned: the runtime tells cuBLASLt's heuristic the alignment of
/// each real pointer (`blaslt::alignment`), never the default 256 bytes.
#[test]
fn an_operand_at_an_offset_is_planned_in_place_at_that_offset() -> Result<()> {
    let x = Tensor::randn([64, 129], 0)?.slice(1, 1, 129, 1)?;
    let y = (x.matmul(&Tensor::randn([128, 32], 1)?)? + &Tensor::randn([32], 2)?)?.relu()?;
    let optimized = kiln::optimize("offset", &[&y], Options::default())?;
    let kernels = kernels(&optimized.graph, &optimized);
    let matmul = gemm::matmul(&kernels[0], true).map_err(kiln::Error::from)?;
    assert!(matmul.prologues.is_empty(), "{matmul:?}");
    assert_eq!((matmul.gemm.a.offset, matmul.gemm.a.row_stride), (1, 129));
    // Column-major, kiln's right operand is BLAS's A: C' (32 x 64) = w' x'.
    let cm = matmul.gemm.column_major();
    assert_eq!(
        (cm.m, cm.n, cm.k, cm.lda, cm.ldb, cm.ldc),
        (32, 64, 128, 32, 129, 32)
    );
    assert!(!cm.transa && !cm.transb);
    Ok(())
}

/// Batch axes that step as one stride are read in place, with that stride;
/// batch axes swapped by a permute do not, and the operand is copied into
/// scratch by a prologue first.
#[test]
fn batch_axes_are_one_stride_or_a_copy() -> Result<()> {
    let w = Tensor::randn([2, 3, 5, 6], 1)?;
    let plan_of = |x: Tensor| -> Result<gemm::MatMul> {
        let y = x.matmul(&w)?;
        let optimized = kiln::optimize("batch", &[&y], Options::default())?;
        let kernels = kernels(&optimized.graph, &optimized);
        gemm::matmul(&kernels[0], true).map_err(kiln::Error::from)
    };
    let in_place = plan_of(Tensor::randn([2, 3, 4, 5], 0)?)?;
    assert!(in_place.prologues.is_empty(), "{in_place:?}");
    assert_eq!(in_place.gemm.batches, 6);
    assert_eq!(
        (in_place.gemm.a.batch_stride, in_place.gemm.b.batch_stride),
        (20, 30)
    );
    let swapped = plan_of(Tensor::randn([3, 2, 4, 5], 0)?.permute(&[1, 0, 2, 3])?)?;
    assert_eq!(swapped.prologues.len(), 1, "{swapped:?}");
    assert_eq!(swapped.gemm.a.batch_stride, 20);
    assert_eq!(
        swapped.gemm.a.source,
        gemm::OperandSource::Scratch(0),
        "{swapped:?}"
    );
    Ok(())
}

#[cfg(feature = "cuda")]
mod nvrtc {
    use std::collections::BTreeSet;

    use kiln_ir::pass::{Options, optimize};
    use kiln_runtime::cuda::nvrtc;
    use kiln_support::random_graph::{Mode, random_graph};

    /// Every generated kernel of the patterns, of 200 random graphs and of
    /// the i64 and f64 graphs compiles to a CUBIN for Hopper and for Ampere. Without libnvrtc the
    /// test says why and passes, unless `KILN_REQUIRE_NVRTC` is set (CI sets it).
    #[test]
    fn every_generated_kernel_compiles_for_sm90_and_sm80() -> kiln::Result<()> {
        if !nvrtc::available() {
            assert!(
                std::env::var_os("KILN_REQUIRE_NVRTC").is_none(),
                "KILN_REQUIRE_NVRTC is set but libnvrtc.so.13 is not on LD_LIBRARY_PATH"
            );
            eprintln!("skipped: libnvrtc.so.13 is not on LD_LIBRARY_PATH");
            return Ok(());
        }
        let mut sources = BTreeSet::new();
        for name in super::PATTERNS {
            sources.extend(super::cuda(name)?.1);
        }
        let graphs = (0..200u64)
            .map(|seed| random_graph(seed, 6, Mode::All))
            .chain(wide_graphs()?);
        for graph in graphs {
            for fusion in [true, false] {
                let optimized = optimize(
                    &graph,
                    Options {
                        fusion,
                        ..Options::default()
                    },
                    &mut |_, _| {},
                )
                .map_err(kiln::Error::from)?;
                sources.extend(super::generate(&optimized)?.1);
            }
        }
        // (Every kernel indexes in `long long`, and f32's pow goes through
        // double: the buffers' types say what a kernel computes in.)
        for buffer in [
            "const long long* __restrict__",
            "const double* __restrict__",
        ] {
            assert!(
                sources.iter().any(|s| s.contains(buffer)),
                "no kernel reads a {buffer} buffer"
            );
        }
        // Remainders (of floats by `fmodf`, of integers by a guarded `%`) and
        // products (of floats as they are, of integers widened and wrapped).
        for form in [
            "fmodf(",
            " == -1 ? 0 : ",
            "acc = acc * ",
            "acc = (int)(unsigned int)((long long)acc * ",
        ] {
            let found = sources.iter().any(|s| s.contains(form));
            assert!(found, "no kernel computes as `{form}`");
        }
        let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
        let mut failures = Vec::new();
        for arch in ["sm_90", "sm_80"] {
            // (No CUBIN kept on disk: every kernel is compiled here.)
            let compiled = nvrtc::compile_all_in(&sources, arch, None);
            for (code, compiled) in sources.iter().zip(compiled) {
                match compiled {
                    Ok(cubin) if cubin.starts_with(b"\x7fELF") => {}
                    Ok(_) => failures.push(format!("{arch}: not an ELF CUBIN\n{code}")),
                    Err(e) => failures.push(format!("{e}\n{code}")),
                }
            }
        }
        eprintln!("{} kernels compiled for sm_90 and sm_80", sources.len());
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        Ok(())
    }

    /// Graphs of every op kiln types for i64 and f64, of products of f32,
    /// i32 and u8, and of casts between every pair of dtypes.
    fn wide_graphs() -> kiln::Result<Vec<kiln_ir::Graph>> {
        use kiln_ir::{BinaryOp, DType, Graph, Op, ReduceOp, TensorType, TrigOp, UnaryOp};
        let dtypes = DType::ALL;
        let mut graphs = Vec::new();
        for wide in [DType::I64, DType::F64] {
            let mut g = Graph::new("wide");
            let x = g.input(TensorType::new(wide, [5, 7]));
            let y = g.input(TensorType::new(wide, [5, 7]));
            let mut outputs = Vec::new();
            let binaries = [
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Max,
                BinaryOp::Min,
                BinaryOp::Pow,
                BinaryOp::Rem,
                BinaryOp::Lt,
                BinaryOp::Eq,
            ];
            for op in binaries {
                // Integers take no div or pow: skipped where typing refuses.
                if let Ok(z) = g.push(Op::Binary(op), &[x, y]) {
                    outputs.push(z);
                }
            }
            let unaries = [
                UnaryOp::Neg,
                UnaryOp::Abs,
                UnaryOp::Relu,
                UnaryOp::Exp,
                UnaryOp::Log,
                UnaryOp::Sqrt,
                UnaryOp::Recip,
                UnaryOp::Sigmoid,
                UnaryOp::Tanh,
            ];
            for op in unaries.into_iter().chain(TrigOp::ALL.map(UnaryOp::Trig)) {
                if let Ok(z) = g.push(Op::Unary(op), &[x]) {
                    outputs.push(z);
                }
            }
            let less = g.push(Op::Binary(BinaryOp::Lt), &[x, y])?;
            outputs.push(g.push(Op::Where, &[less, x, y])?);
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Prod] {
                for axes in [[0], [1]] {
                    let r = g.push(
                        Op::Reduce {
                            op,
                            axes: axes.into_iter().collect(),
                        },
                        &[x],
                    )?;
                    outputs.push(r);
                }
            }
            g.outputs = outputs;
            graphs.push(g);
        }
        // Products of the narrower number types: u8 and i32 wrap through
        // `long long`; and their remainders.
        for dtype in [DType::F32, DType::I32, DType::U8] {
            let mut g = Graph::new("products");
            let x = g.input(TensorType::new(dtype, [5, 7]));
            let rem = g.push(Op::Binary(BinaryOp::Rem), &[x, x])?;
            g.outputs.push(rem);
            for axes in [&[0][..], &[1], &[0, 1]] {
                let op = Op::Reduce {
                    op: ReduceOp::Prod,
                    axes: axes.iter().copied().collect(),
                };
                let p = g.push(op, &[x])?;
                g.outputs.push(p);
            }
            graphs.push(g);
        }
        for &from in &dtypes {
            let mut g = Graph::new("casts");
            let x = g.input(TensorType::new(from, [3, 5]));
            for &to in &dtypes {
                let c = g.push(Op::Cast(to), &[x])?;
                g.outputs.push(c);
            }
            graphs.push(g);
        }
        Ok(graphs)
    }

    /// A compile error is an `Err` carrying NVRTC's log, not a panic.
    #[test]
    fn a_compile_error_is_an_err_with_the_log() {
        if !nvrtc::available() {
            eprintln!("skipped: libnvrtc.so.13 is not on LD_LIBRARY_PATH");
            return;
        }
        let err = nvrtc::compile(
            "extern \"C\" __global__ void k() { undefined_fn(); }",
            "sm_90",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("undefined_fn"), "{err}");
    }

    /// A kernel `x[threadIdx.x] <body>;` for each body.
    fn tiny_kernels(bodies: &[&str]) -> Vec<String> {
        (bodies.iter())
            .map(|body| {
                format!("extern \"C\" __global__ void k(float* x) {{ x[threadIdx.x] {body}; }}")
            })
            .collect()
    }

    /// Kernels compiled together come back in the order given, each the
    /// CUBIN it compiles to alone, a failure its own `Err` among them.
    #[test]
    fn kernels_compiled_together_come_back_in_order() {
        if !nvrtc::available() {
            eprintln!("skipped: libnvrtc.so.13 is not on LD_LIBRARY_PATH");
            return;
        }
        let sources = tiny_kernels(&[
            "+= 1.0f",
            "*= 2.0f",
            "= undefined_fn()",
            "-= 3.0f",
            "= sqrtf(x[0])",
        ]);
        let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
        let together = nvrtc::compile_all_in(&sources, "sm_90", None);
        assert_eq!(together.len(), sources.len());
        for (source, cubin) in sources.iter().zip(together) {
            match (cubin, nvrtc::compile(source, "sm_90")) {
                (Ok(cubin), Ok(alone)) => assert!(cubin == alone, "{source}"),
                (Err(e), Err(_)) => assert!(e.to_string().contains("undefined_fn"), "{e}"),
                (cubin, alone) => panic!(
                    "{source}: together {:?}, alone {:?}",
                    cubin.map(|c| c.len()),
                    alone.map(|c| c.len())
                ),
            }
        }
    }

    /// Kernels compiled with a cache folder are kept there, a file each,
    /// and read back from it: the same CUBINs from a second call, a CUBIN
    /// put in the folder under a kernel's key rather than a compile, and a
    /// damaged file compiled again and replaced. A failed compile keeps
    /// nothing.
    #[test]
    fn compiled_kernels_are_kept_on_disk_and_read_back() {
        use kiln_runtime::cuda::cubin_cache;
        if !nvrtc::available() {
            eprintln!("skipped: libnvrtc.so.13 is not on LD_LIBRARY_PATH");
            return;
        }
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin_cache");
        let _ = std::fs::remove_dir_all(&dir);
        let sources = tiny_kernels(&["+= 1.0f", "*= 2.0f", "= undefined_fn()"]);
        let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
        let files = || std::fs::read_dir(&dir).map_or(0, |d| d.count());
        let first = nvrtc::compile_all_in(&sources, "sm_90", Some(&dir));
        assert!(first[2].is_err(), "undefined_fn compiled");
        assert_eq!(files(), 2, "a file for each kernel compiled");
        let cubins: Vec<Vec<u8>> = first.into_iter().take(2).flatten().collect();
        let again = nvrtc::compile_all_in(&sources[..2], "sm_90", Some(&dir));
        assert!(again.into_iter().flatten().eq(cubins.clone()));
        let key = nvrtc::cache_key(sources[0], "sm_90").expect("NVRTC is loaded");
        cubin_cache::write(&dir, &key, b"kept");
        let read = nvrtc::compile_all_in(&sources[..1], "sm_90", Some(&dir));
        assert!(matches!(&read[..], [Ok(cubin)] if cubin == b"kept"));
        // Cut short: compiled again, and the file whole again.
        let path = cubin_cache::file(&dir, &key);
        let bytes = std::fs::read(&path).expect("the kept file");
        std::fs::write(&path, &bytes[..bytes.len() - 1]).expect("the test's folder");
        let compiled = nvrtc::compile_all_in(&sources[..1], "sm_90", Some(&dir));
        assert!(matches!(&compiled[..], [Ok(cubin)] if *cubin == cubins[0]));
        assert_eq!(cubin_cache::read(&dir, &key).as_ref(), Some(&cubins[0]));
        // The key is the architecture's too.
        let sm80 = nvrtc::compile_all_in(&sources[..1], "sm_80", Some(&dir));
        assert!(matches!(&sm80[..], [Ok(cubin)] if *cubin != cubins[0]));
        assert_eq!(files(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
