//! A learning rate and a momentum given to a compiled step at every call,
//! alone in its test binary (as `kernel_cache.rs`) so that no other test compiles
//! kernels while the compile counter is read.

use kiln::{Result, Tensor};

#[test]
fn rates_given_to_a_step_each_call_compile_nothing() -> Result<()> {
    use kiln::optim::{AdamW, Optimizer, Rates, Schedule};
    use kiln::{DType, TensorType};
    let params = [Tensor::randn([9, 4], 1)?, Tensor::randn([4], 2)?];
    let refs: Vec<&Tensor> = params.iter().collect();
    let adamw = AdamW::new(0.0);
    let mut state = params.to_vec();
    state.extend(adamw.state(&refs)?);
    let state: Vec<&Tensor> = state.iter().collect();
    let specs = [
        TensorType::new(DType::F32, [9]),
        TensorType::new(DType::F32, Vec::<usize>::new()),
        TensorType::new(DType::F32, Vec::<usize>::new()),
    ];
    let mut step = kiln::compile_step("scheduled", &state, &specs, |s, args| {
        let (p, opt) = s.split_at(2);
        let loss = (args[0].reshape([1, 9])?.matmul(&p[0])? + &p[1])?
            .square()?
            .sum_all()?;
        let g = kiln::grad(&loss, &[&p[0], &p[1]])?;
        let rates = Rates {
            lr: args[1].clone(),
            momentum: Some(args[2].clone()),
        };
        let (new_p, new_opt) = adamw.update_at(p, &g, opt, &rates)?;
        Ok((vec![loss], new_p.into_iter().chain(new_opt).collect()))
    })?;
    let x = Tensor::randn([9], 3)?;
    let schedule = Schedule::one_cycle(0.1, 20);
    let mut compiled = Vec::new();
    for k in 0..20 {
        let lr = Tensor::scalar(schedule.lr(k)?);
        let momentum = Tensor::scalar(schedule.momentum(k)?.expect("cycled"));
        step.call(&[&x, &lr, &momentum])?;
        compiled.push(kiln_runtime::cpu::compiled_kernels());
    }
    assert!(
        compiled.iter().all(|&c| c == compiled[0]),
        "kernels compiled per step: {compiled:?}"
    );
    Ok(())
}
