//! The storage contract (`Backend::alloc`, `store`, `holds` and `stats`,
//! `Executable::run_stored`) on the backends that keep values in host
//! memory, the CPU and the interpreter: a value is handed to them without
//! a copy, a run writes only storage that no one else holds (a donated
//! value in place, an output into its own buffer), and they count nothing
//! as moved. Through the API: compiled calls and steps leave their values
//! on their device, and reading a step's state shares it until the step
//! writes it. A host feed hands out each batch put once, copied.

use std::sync::Arc;

use kiln::{
    BackendOptions, CompileOptions, DType, Data, Device, Options, Result, Tensor, TensorType,
};
use kiln_ir::pass::{self, Optimized};
use kiln_runtime::{Arg, Backend, MemoryStats, Reference, Storage, cpu::Cpu};

/// The host backends, by name.
fn host_backends() -> [(&'static str, Box<dyn Backend>); 2] {
    [("cpu", Box::new(Cpu)), ("reference", Box::new(Reference))]
}

fn host(storage: &Storage) -> &Arc<Data> {
    storage
        .as_host()
        .expect("a host backend keeps values on the host")
}

fn floats(storage: &Storage) -> Vec<f32> {
    match host(storage).as_ref() {
        Data::F32(v) => v.clone(),
        other => panic!("not f32: {other:?}"),
    }
}

/// `y = x * 2 + s` over [5, 3] (awkward for four lanes), optimized, with
/// `y` written over `s` where `donate`.
fn scaled_sum(donate: bool) -> Result<Optimized> {
    let x = Tensor::from_vec(vec![0.0f32; 15], [5, 3])?;
    let s = Tensor::from_vec(vec![0.0f32; 15], [5, 3])?;
    let y = ((&x * 2.0f32)? + &s)?;
    let graph = kiln::capture("scaled_sum", &[&y]);
    let optimized = pass::optimize(&graph, Options::default(), &mut |_, _| {})?;
    if !donate {
        return Ok(optimized);
    }
    let (optimized, notes) = pass::donate(&optimized, &[(1, 0)])?;
    assert_eq!(notes, ["output 0 is written over input 1"]);
    Ok(optimized)
}

fn ramp(from: f32) -> Vec<f32> {
    (0..15).map(|i| from + i as f32).collect()
}

#[test]
fn host_backends_keep_values_without_a_copy() -> Result<()> {
    let ty = TensorType::new(DType::F32, [5, 3]);
    for (name, backend) in host_backends() {
        let data = Arc::new(Data::F32(ramp(1.0)));
        let stored = backend.store(&ty, data.clone())?;
        assert!(Arc::ptr_eq(host(&stored), &data), "{name}: store copied");
        assert!(backend.holds(&stored), "{name}");
        let made = backend.alloc("relu", &ty)?;
        assert_eq!(floats(&made), vec![0.0; 15], "{name}");
        assert_eq!(backend.stats()?, MemoryStats::default(), "{name}");
    }
    Ok(())
}

#[test]
fn a_run_on_storage_writes_only_what_no_one_else_holds() -> Result<()> {
    let x = Data::F32(ramp(0.0));
    // x * 2 + s for s = ramp(from): 3i + from.
    let want = |from: f32| -> Vec<f32> { (0..15).map(|i| 3.0 * i as f32 + from).collect() };
    for (name, backend) in host_backends() {
        let mut exec = backend.compile(scaled_sum(true)?, BackendOptions::default())?;
        // Shared with a caller: the run writes a copy of its own.
        let mut state = [Storage::Host(Arc::new(Data::F32(ramp(10.0))))];
        let caller = state[0].clone();
        exec.run_stored(&mut state, &[Arg::Host((&x).into())], &mut [])?;
        assert_eq!(floats(&caller), ramp(10.0), "{name}: the caller's value");
        assert_eq!(floats(&state[0]), want(10.0), "{name}");
        assert!(!Arc::ptr_eq(host(&state[0]), host(&caller)), "{name}");
        // Held by the run alone: written in place.
        let before = host(&state[0]).clone();
        drop(caller);
        let place = Arc::as_ptr(&before);
        drop(before);
        exec.run_stored(&mut state, &[Arg::Host((&x).into())], &mut [])?;
        assert_eq!(Arc::as_ptr(host(&state[0])), place, "{name}: not in place");
        let twice: Vec<f32> = (0..15).map(|i| 5.0 * i as f32 + 10.0).collect();
        assert_eq!(floats(&state[0]), twice, "{name}");

        // An output a caller still holds is replaced, not written.
        let mut exec = backend.compile(scaled_sum(false)?, BackendOptions::default())?;
        let ty = TensorType::new(DType::F32, [5, 3]);
        let mut outputs = [backend.alloc("scaled_sum", &ty)?];
        let kept = outputs[0].clone();
        let s = Storage::Host(Arc::new(Data::F32(ramp(1.0))));
        let args = [Arg::Host((&x).into()), Arg::Stored(&s)];
        exec.run_stored(&mut [], &args, &mut outputs)?;
        assert_eq!(floats(&kept), vec![0.0; 15], "{name}: the held output");
        assert_eq!(floats(&outputs[0]), want(1.0), "{name}");
        // And reused where no one does.
        drop(kept);
        let place = Arc::as_ptr(host(&outputs[0]));
        exec.run_stored(&mut [], &args, &mut outputs)?;
        assert_eq!(
            Arc::as_ptr(host(&outputs[0])),
            place,
            "{name}: a new output"
        );
    }
    Ok(())
}

#[test]
fn calls_leave_their_outputs_on_the_graphs_device() -> Result<()> {
    let x = Tensor::randn([7, 5], 3)?;
    let spec = [x.ty().clone()];
    let mut results = Vec::new();
    for device in [Device::Cpu, Device::Reference] {
        let mut g = kiln::compile_with("soft", &spec, CompileOptions::on(device), |t| {
            Ok(vec![t[0].softmax(-1)?])
        })?;
        let out = g.call(&[&x])?.remove(0);
        assert_eq!(out.device(), device);
        assert!(out.is_realized());
        // It feeds further ops on that device.
        let next = (&out * 2.0f32)?;
        assert_eq!(next.device(), device);
        results.push(next.to_vec::<f32>()?);
    }
    for (i, (c, r)) in results[0].iter().zip(&results[1]).enumerate() {
        assert!((c - r).abs() <= 1e-6, "[{i}]: cpu {c}, interpreter {r}");
    }
    Ok(())
}

#[test]
fn a_steps_state_is_shared_until_the_step_writes_it() -> Result<()> {
    for device in [Device::Cpu, Device::Reference] {
        let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3])?;
        let spec = [TensorType::new(DType::F32, [3])];
        let mut step =
            kiln::compile_step_with("add", &[&w], &spec, CompileOptions::on(device), |s, a| {
                let next = (&s[0] + &a[0])?;
                Ok((vec![next.sum_all()?], vec![next]))
            })?;
        let one = Data::F32(vec![1.0; 3]);
        let loss = step.run(&[&one])?.remove(0);
        assert_eq!(loss.device(), device);
        assert_eq!(loss.to_scalar::<f32>()?, 9.0);
        let read = step.state()?.remove(0);
        assert_eq!(read.device(), device);
        step.run(&[&one])?;
        // The tensors read out keep their values as the step goes on.
        assert_eq!(read.to_vec::<f32>()?, vec![2.0, 3.0, 4.0], "{device:?}");
        assert_eq!(loss.to_scalar::<f32>()?, 9.0, "{device:?}");
        assert_eq!(w.to_vec::<f32>()?, vec![1.0, 2.0, 3.0], "{device:?}");
        assert_eq!(step.state()?[0].to_vec::<f32>()?, vec![3.0, 4.0, 5.0]);
        // On tensors, as on host data.
        let ones = Tensor::from_slice(&[1.0f32; 3], [3])?.to(device)?;
        assert_eq!(step.call(&[&ones])?[0].to_scalar::<f32>()?, 15.0);
        let wrong = Tensor::from_slice(&[1.0f32; 2], [2])?;
        assert!(step.call(&[&wrong]).is_err(), "a batch of another type");
    }
    Ok(())
}

/// Where a host buffer's values are.
fn address(storage: &Storage) -> *const f32 {
    match host(storage).as_ref() {
        Data::F32(v) => v.as_ptr(),
        other => panic!("not f32: {other:?}"),
    }
}

#[test]
fn a_host_buffer_no_value_holds_serves_the_next_value_of_its_type() -> Result<()> {
    // 64 KiB: a buffer the pool keeps; no other test here makes one.
    let ty = TensorType::new(DType::F32, [128, 128]);
    let given = Storage::Host(Arc::new(Data::F32(vec![1.5; 128 * 128])));
    let place = address(&given);
    kiln_runtime::storage::recycle(given);
    let reused = Cpu.alloc("relu", &ty)?;
    assert_eq!(address(&reused), place, "the pooled buffer");
    // One still shared is not given back.
    let shared = Storage::Host(Arc::new(Data::F32(vec![2.5; 128 * 128])));
    let holder = shared.clone();
    kiln_runtime::storage::recycle(shared);
    let fresh = Cpu.alloc("relu", &ty)?;
    assert_ne!(address(&fresh), address(&holder));
    assert_eq!(floats(&holder), vec![2.5; 128 * 128]);
    // Nor one of another type.
    kiln_runtime::storage::recycle(reused);
    let other = Cpu.alloc("relu", &TensorType::new(DType::F32, [127, 128]))?;
    assert_ne!(address(&other), place);
    Ok(())
}

#[test]
fn a_host_feed_checks_its_values_and_hands_out_each_put_once_as_a_copy() -> Result<()> {
    for (name, backend) in host_backends() {
        let mut feed = backend.feed()?;
        assert!(feed.take().is_err(), "{name}: a take with nothing put");
        let ty = [TensorType::new(DType::F32, [2])];
        let values = Data::F32(vec![1.5, -2.0]);
        let three = Data::F32(vec![0.0; 3]);
        let wrong = feed
            .put(&ty, &[(&three).into()])
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            wrong.as_deref(),
            Some("feed: value 0 must be f32[2], got 3 values of f32"),
            "{name}"
        );
        assert!(feed.put(&ty, &[]).is_err(), "{name}: no value for a type");
        feed.put(&ty, &[(&values).into()])?;
        assert!(
            feed.put(&ty, &[(&values).into()]).is_err(),
            "{name}: a second put before a take"
        );
        let taken = feed.take()?;
        assert_eq!(floats(&taken[0]), [1.5, -2.0], "{name}");
        assert!(feed.take().is_err(), "{name}: a put is taken once");
        // The feed copied: the values put may go, or change, after `put`.
        drop(values);
        assert_eq!(floats(&taken[0]), [1.5, -2.0], "{name}");
    }
    Ok(())
}
