//! The loop plans of kernels (`kiln_runtime::loops`), made for kiln's CPU
//! code and for CUDA C from the same kernels: flat maps, softmax's rows
//! with the exponentials read back, short rows four at a time, sums down
//! columns, a concatenation's padded reads, a scatter-add and a matmul's
//! epilogue over the product's rows. A change to either backend's loop
//! decisions shows up here as a reviewable diff.

use kiln::{Options, Result, Tensor};
use kiln_ir::Op;
use kiln_ir::kernel::{Kernel, KernelKind};
use kiln_runtime::loops::{Target, plan};

/// The loop plans of every kernel of `outputs`, optimized, for the CPU and
/// for CUDA (a matmul's epilogue for the CPU alone: CUDA's comes from its
/// matmul plan, `tests/matmul_plans.rs`).
fn plans(name: &str, outputs: &[&Tensor]) -> Result<String> {
    let optimized = kiln::optimize(name, outputs, Options::default())?;
    let mut text = String::new();
    for launch in &optimized.schedule.launches {
        let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
            continue;
        };
        let kernel: &Kernel = kernel;
        let matmul = matches!(kernel.kind, KernelKind::MatMul { .. });
        for (target, on) in [(Target::CPU, "cpu"), (Target::CUDA, "cuda")] {
            if !(matmul && target == Target::CUDA) {
                text += &format!("// {} on {on}\n{}", launch.node, plan(kernel, target));
            }
        }
    }
    Ok(text)
}

#[test]
fn a_contiguous_map_is_one_flat_loop() -> Result<()> {
    let (a, b) = (Tensor::randn([37, 11], 0)?, Tensor::randn([37, 11], 1)?);
    insta::assert_snapshot!(plans("relu_add", &[&(&a + &b)?.relu()?])?);
    Ok(())
}

#[test]
fn softmax_reads_its_exponentials_back_on_the_cpu() -> Result<()> {
    let x = Tensor::randn([64, 100], 0)?;
    insta::assert_snapshot!(plans("softmax", &[&x.softmax(-1)?])?);
    Ok(())
}

#[test]
fn short_rows_run_four_at_a_time_on_the_cpu() -> Result<()> {
    let x = Tensor::randn([64, 10], 0)?;
    insta::assert_snapshot!(plans("log_softmax", &[&x.log_softmax(-1)?])?);
    Ok(())
}

#[test]
fn sums_down_columns_run_side_by_side() -> Result<()> {
    // f32 accumulates four rows a vector on the CPU; i32 walks each
    // column there; CUDA gives a thread to each output either way.
    let x = Tensor::randn([300, 24], 0)?;
    let n = Tensor::from_vec((0..300 * 24).collect::<Vec<i32>>(), [300, 24])?;
    let mean = (x.sum(&[0], false)? * (1.0f32 / 300.0))?;
    insta::assert_snapshot!(plans("columns", &[&mean, &n.sum(&[0], false)?])?);
    Ok(())
}

#[test]
fn a_concatenation_reads_its_parts_padded() -> Result<()> {
    let parts = [Tensor::randn([2, 3, 5], 0)?, Tensor::randn([2, 4, 5], 1)?];
    let joined = Tensor::cat(&[&parts[0], &parts[1]], 1)?;
    insta::assert_snapshot!(plans("cat", &[&joined.relu()?])?);
    Ok(())
}

#[test]
fn an_embedding_gradient_is_a_scatter_add() -> Result<()> {
    let table = Tensor::randn([50, 8], 0)?;
    let ids = Tensor::from_vec(vec![3i64, 7, 3, 49, 0, 12], [6])?;
    let loss = table.index_select(0, &ids)?.square()?.sum_all()?;
    let grad = kiln::grad(&loss, &[&table])?.remove(0);
    insta::assert_snapshot!(plans("embedding", &[&grad])?);
    Ok(())
}

#[test]
fn a_convolutions_epilogue_runs_over_the_products_rows() -> Result<()> {
    let x = Tensor::randn([2, 3, 6, 5], 0)?;
    let w = Tensor::randn([4, 3, 3, 3], 1)?;
    let b = Tensor::randn([4], 2)?;
    let y = x.conv2d(&w, Some(&b), [1, 1], [(1, 1), (1, 1)], [1, 1], 1)?;
    insta::assert_snapshot!(plans("conv", &[&(y.tanh()? + &y)?])?);
    Ok(())
}

#[test]
fn values_the_same_over_a_call_or_a_row_are_computed_once() -> Result<()> {
    // A scalar's power is the same all over the call (as an optimizer's
    // bias correction); a bias per column steps along the rows.
    let x = Tensor::randn([6, 33], 0)?;
    let (b, s) = (Tensor::randn([33], 1)?, Tensor::from_vec(vec![0.9f32], [])?);
    let t = Tensor::from_vec(vec![3.0f32], [])?;
    let update = ((&x + &b)? * &s.pow(&t)?)?;
    // A row of a table picked once per row.
    let table = Tensor::randn([50, 8], 2)?;
    let ids = Tensor::from_vec(vec![3i64, 7, 3, 49], [4])?;
    let rows = table.index_select(0, &ids)?.relu()?;
    insta::assert_snapshot!(plans("once", &[&update, &rows])?);
    Ok(())
}

#[test]
fn rows_of_several_axes_without_lanes_run_by_runs() -> Result<()> {
    // i32 has no f32 lanes to reduce in, and the transposed view keeps the
    // two reduced axes apart.
    let n = Tensor::from_vec((0..5 * 4 * 6).collect::<Vec<i32>>(), [5, 4, 6])?;
    let sums = n.permute(&[0, 2, 1])?.sum(&[1, 2], false)?;
    insta::assert_snapshot!(plans("runs", &[&sums])?);
    Ok(())
}
