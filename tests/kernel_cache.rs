//! The kernel cache, alone in its test binary so that no other test compiles
//! kernels while the compile counter is read.

use kiln::{Result, Tensor};

#[test]
fn a_second_realize_of_the_same_shapes_compiles_nothing() -> Result<()> {
    let run = |seed| -> Result<Vec<f32>> {
        let x = Tensor::randn([33, 17], seed)?;
        let w = Tensor::randn([17, 9], seed + 1)?;
        ((x.matmul(&w)? + 0.25f32)?.tanh()? - 1.5f32)?.to_vec()
    };
    let start = kiln_runtime::cpu::compiled_kernels();
    run(0)?;
    let first = kiln_runtime::cpu::compiled_kernels();
    assert!(first > start, "the first realize compiles its kernels");
    run(100)?;
    assert_eq!(kiln_runtime::cpu::compiled_kernels(), first);
    Ok(())
}
