//! `kiln::compile_step`: a compiled function that carries state from call
//! to call, such as a training step's parameters and optimizer state.
//!
//! The step is traced once as `f(state, args) -> (outputs, new_state)` and
//! compiled like any graph; the state lives in the compiled step, in its
//! device's storage (host memory on the CPU, the GPU's memory on a GPU).
//! Each call writes each new state tensor into the buffer of the one it
//! replaces, as JAX's donated buffers, where the compiled graph allows it
//! (`kiln_ir::pass::donate`: no kernel reads the old value after it is
//! overwritten; every backend writes in place). A state tensor that cannot
//! be written in place keeps a second buffer, written by the step, and the
//! two trade places after each call (a swap of pointers). Either way a
//! call copies no state and allocates no state, and the state never leaves
//! the step unless it is read out: on a GPU a step copies its host
//! arguments in and nothing out, and the host waits only where an output
//! is read. Tensors the caller holds are never written: the step's state
//! starts as the caller's values, `state` hands the current values out and
//! `set_state` takes a tensor's value in, all shared, and a value that a
//! tensor still shares is copied before the step first writes it, so a
//! `Tensor` still held for an old parameter keeps its value.

use kiln_ir::{DataRef, TensorType};
use smallvec::SmallVec;

use kiln_runtime::{Arg, Storage};

use crate::backend::store;
use crate::compile::compile_donating;
use crate::{CompileOptions, CompiledGraph, Error, Result, Tensor};

/// A compiled step and the state it carries.
pub struct CompiledStep {
    graph: CompiledGraph,
    /// Where each state tensor's current value is.
    places: Vec<Place>,
    /// The state written in place, in the order the graph takes it.
    held: Vec<Storage>,
    /// The rest of the state, in order.
    swapped: Vec<Storage>,
    state_types: Vec<TensorType>,
    /// The step's outputs, then the buffers the swapped state's next value
    /// is written to.
    outputs: Vec<Storage>,
}

/// Where a state tensor lives.
#[derive(Clone, Copy)]
enum Place {
    /// `held[j]`, overwritten by the step.
    Held(usize),
    /// `swapped[m]`, traded with its next value after each step.
    Swapped(usize),
}

/// Traces `f` on the state (placeholders of `state`'s types) and
/// placeholders of `specs`, and compiles it for the CPU with fusion on.
/// `f` returns the step's outputs (a loss, metrics) and the new state, one
/// tensor of the same type for each state tensor, in order.
pub fn compile_step(
    name: &str,
    state: &[&Tensor],
    specs: &[TensorType],
    f: impl FnOnce(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
) -> Result<CompiledStep> {
    compile_step_with(name, state, specs, CompileOptions::default(), f)
}

/// `compile_step` where and how `options` says.
pub fn compile_step_with(
    name: &str,
    state: &[&Tensor],
    specs: &[TensorType],
    options: CompileOptions,
    f: impl FnOnce(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
) -> Result<CompiledStep> {
    let state_types: Vec<TensorType> = state.iter().map(|t| t.ty().clone()).collect();
    let all: Vec<TensorType> = state_types.iter().chain(specs).cloned().collect();
    let device = options.device;
    let graph = compile_donating(name, &all, options, state.len(), |inputs| {
        let (current, args) = inputs.split_at(state.len());
        let (outputs, next) = f(current, args)?;
        check_next(&state_types, &next)?;
        Ok(outputs.into_iter().chain(next).collect())
    })?;
    let given = graph.donated_specs();
    let mut places = Vec::with_capacity(state.len());
    let (mut held, mut swapped) = (Vec::new(), Vec::new());
    let mut held_at = vec![None; state.len()];
    for (k, t) in state.iter().enumerate() {
        let value = store(device, t.ty(), t.storage()?)?;
        places.push(match given[k] {
            Some(j) => {
                held_at[j] = Some(value);
                Place::Held(j)
            }
            None => {
                swapped.push(value);
                Place::Swapped(swapped.len() - 1)
            }
        });
    }
    held.extend(held_at.into_iter().flatten());
    // The step's outputs, then the next value of each swapped state tensor:
    // the outputs not written over the state they replace.
    let outputs = graph.output_storage()?;
    Ok(CompiledStep {
        graph,
        places,
        held,
        swapped,
        state_types,
        outputs,
    })
}

/// The new state must match the old, tensor for tensor.
fn check_next(types: &[TensorType], next: &[Tensor]) -> Result<()> {
    if next.len() != types.len() {
        return Err(Error::StepState {
            index: next.len().min(types.len()),
            expected: format!("{} state tensors", types.len()),
            got: format!("{} new ones", next.len()),
        });
    }
    for (index, (ty, t)) in types.iter().zip(next).enumerate() {
        if t.ty() != ty {
            return Err(Error::StepState {
                index,
                expected: ty.to_string(),
                got: t.ty().to_string(),
            });
        }
    }
    Ok(())
}

impl CompiledStep {
    /// Runs one step on `args` (host data of the compiled types, in
    /// order: `&Data`, or a loader's batch) and returns its outputs as
    /// tensors on the step's device (on a GPU, read when they are read).
    /// The state moves on to the new state.
    pub fn run<'a>(&mut self, args: &[impl Into<DataRef<'a>> + Copy]) -> Result<Vec<Tensor>> {
        self.step(args.iter().map(|&a| Arg::Host(a.into())))
    }

    /// `run` on tensors, realized first: on a GPU, a batch already there
    /// (`to(Device::Cuda(n))`) is read where it is, and the step copies
    /// nothing in.
    pub fn call(&mut self, args: &[&Tensor]) -> Result<Vec<Tensor>> {
        let stored: Vec<Storage> = args.iter().map(|t| t.storage()).collect::<Result<_>>()?;
        self.step(stored.iter().map(Arg::Stored))
    }

    /// One step on the arguments `args`, after the swapped state.
    fn step<'a>(&mut self, args: impl Iterator<Item = Arg<'a>>) -> Result<Vec<Tensor>> {
        // Pushed one by one: each argument's borrow shortens to the state's.
        let mut inputs: SmallVec<[Arg; 8]> = self.swapped.iter().map(Arg::Stored).collect();
        for a in args {
            inputs.push(a);
        }
        (self.graph).run_stored(&mut self.held, &inputs, &mut self.outputs)?;
        drop(inputs);
        let outputs = self.outputs.len() - self.swapped.len();
        for (current, next) in self.swapped.iter_mut().zip(&mut self.outputs[outputs..]) {
            std::mem::swap(current, next);
        }
        let types = self.graph.optimized().graph.output_types();
        let device = self.graph.device();
        Ok((self.outputs[..outputs].iter().zip(types))
            .map(|(storage, ty)| Tensor::from_storage(ty, storage.clone(), device))
            .collect())
    }

    /// Per state tensor: whether each step writes its new value over the
    /// old one (else into a second buffer, the two trading places).
    pub fn in_place(&self) -> Vec<bool> {
        self.places
            .iter()
            .map(|p| matches!(p, Place::Held(_)))
            .collect()
    }

    /// The current value of state tensor `k`.
    fn current(&self, k: usize) -> &Storage {
        match self.places[k] {
            Place::Held(j) => &self.held[j],
            Place::Swapped(m) => &self.swapped[m],
        }
    }

    /// The current state, as tensors on the step's device. Nothing is
    /// copied until it must be: reading a tensor copies it out of a GPU,
    /// and the step's next write to a value a tensor still shares goes to
    /// a copy of its own.
    pub fn state(&self) -> Result<Vec<Tensor>> {
        let device = self.graph.device();
        let tensor = |(k, ty): (usize, &TensorType)| {
            Tensor::from_storage(ty.clone(), self.current(k).clone(), device)
        };
        Ok(self.state_types.iter().enumerate().map(tensor).collect())
    }

    /// Replaces state tensor `index` with the value of `value` (realized
    /// first), which must be of the same type.
    pub fn set_state(&mut self, index: usize, value: &Tensor) -> Result<()> {
        let ty = self
            .state_types
            .get(index)
            .ok_or_else(|| Error::StepState {
                index,
                expected: format!("one of {} state tensors", self.state_types.len()),
                got: format!("index {index}"),
            })?;
        if value.ty() != ty {
            return Err(Error::StepState {
                index,
                expected: ty.to_string(),
                got: value.ty().to_string(),
            });
        }
        let value = store(self.graph.device(), ty, value.storage()?)?;
        match self.places[index] {
            Place::Held(j) => self.held[j] = value,
            Place::Swapped(m) => self.swapped[m] = value,
        }
        Ok(())
    }

    /// The compiled graph: its fused kernels and schedule.
    pub fn graph(&self) -> &CompiledGraph {
        &self.graph
    }
}
