//! `kiln::compile_step`: a compiled function that carries state from call
//! to call, such as a training step's parameters and optimizer state.
//!
//! The step is traced once as `f(state, args) -> (outputs, new_state)` and
//! compiled like any graph; the state lives in the compiled step. Each call
//! writes each new state tensor into the buffer of the one it replaces, as
//! JAX's donated buffers, where the compiled graph allows it
//! (`kiln_ir::pass::donate`: no kernel reads the old value after it is
//! overwritten; the CPU backend and the interpreter write in place, CUDA
//! does not). A state tensor that cannot be written in place keeps a second
//! buffer, written by the step, and the two trade places after each call (a
//! swap of pointers). Either way a call copies nothing and allocates
//! nothing, and the state never leaves the step unless it is read out.
//! Tensors the caller holds are never written: `compile_step` copies the
//! initial values in, `state` copies the current ones out, and `set_state`
//! copies a tensor in, so a `Tensor` still held for an old parameter keeps
//! its value.

use kiln_ir::pass::Options;
use kiln_ir::{Data, DataRef, TensorType};
use smallvec::SmallVec;

use kiln_runtime::BackendOptions;

use crate::compile::compile_donating;
use crate::{CompiledGraph, Device, Error, Result, Tensor};

/// A compiled step and the state it carries.
pub struct CompiledStep {
    graph: CompiledGraph,
    /// Where each state tensor's current value is.
    places: Vec<Place>,
    /// The state written in place, in the order the graph takes it.
    held: Vec<Data>,
    /// The rest of the state, in order.
    swapped: Vec<Data>,
    state_types: Vec<TensorType>,
    /// The step's outputs, then the buffers the swapped state's next value
    /// is written to.
    outputs: Vec<Data>,
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
/// placeholders of `specs`, and compiles it for the CPU with `options`. `f`
/// returns the step's outputs (a loss, metrics) and the new state, one
/// tensor of the same type for each state tensor, in order.
pub fn compile_step(
    name: &str,
    state: &[&Tensor],
    specs: &[TensorType],
    options: Options,
    f: impl FnOnce(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
) -> Result<CompiledStep> {
    let backend = BackendOptions::default();
    compile_step_on(Device::Cpu, name, state, specs, options, backend, f)
}

/// `compile_step` for `device`, with the backend's own options.
pub fn compile_step_on(
    device: Device,
    name: &str,
    state: &[&Tensor],
    specs: &[TensorType],
    options: Options,
    backend: BackendOptions,
    f: impl FnOnce(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
) -> Result<CompiledStep> {
    let state_types: Vec<TensorType> = state.iter().map(|t| t.ty().clone()).collect();
    let all: Vec<TensorType> = state_types.iter().chain(specs).cloned().collect();
    let mut outputs_count = 0;
    let graph = compile_donating(
        device,
        name,
        &all,
        options,
        backend,
        state.len(),
        |inputs| {
            let (current, args) = inputs.split_at(state.len());
            let (outputs, next) = f(current, args)?;
            check_next(&state_types, &next)?;
            outputs_count = outputs.len();
            Ok(outputs.into_iter().chain(next).collect())
        },
    )?;
    let given = graph.donated_specs();
    let mut places = Vec::with_capacity(state.len());
    let (mut held, mut swapped) = (Vec::new(), Vec::new());
    let mut held_at = vec![None; state.len()];
    for (k, t) in state.iter().enumerate() {
        let data = copy_in(name, t)?;
        places.push(match given[k] {
            Some(j) => {
                held_at[j] = Some(data);
                Place::Held(j)
            }
            None => {
                swapped.push(data);
                Place::Swapped(swapped.len() - 1)
            }
        });
    }
    held.extend(held_at.into_iter().flatten());
    // The step's outputs, then the next value of each swapped state tensor.
    let mut outputs = graph.output_buffers()?;
    let next = outputs.split_off(outputs_count).into_iter().zip(&places);
    outputs.extend(
        next.filter(|(_, p)| matches!(p, Place::Swapped(_)))
            .map(|(d, _)| d),
    );
    Ok(CompiledStep {
        graph,
        places,
        held,
        swapped,
        state_types,
        outputs,
    })
}

/// The value of `t` (realized first), copied into a buffer of the step's own.
fn copy_in(name: &str, t: &Tensor) -> Result<Data> {
    let data = t.data_of_any_dtype()?;
    Ok(data.try_clone().map_err(|e| e.in_op(name, t.ty()))?)
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
    /// Runs one step on `args` (of the compiled types, in order) and
    /// returns its outputs, borrowed until the next call. The state moves
    /// on to the new state.
    pub fn run<'a>(&mut self, args: &[impl Into<DataRef<'a>> + Copy]) -> Result<&[Data]> {
        // Pushed one by one: each argument's borrow shortens to the state's.
        let mut inputs: SmallVec<[DataRef; 8]> = self.swapped.iter().map(DataRef::from).collect();
        for &a in args {
            inputs.push(a.into());
        }
        (self.graph).run_donated(&mut self.held, &inputs, &mut self.outputs)?;
        drop(inputs);
        let outputs = self.outputs.len() - self.swapped.len();
        for (current, next) in self.swapped.iter_mut().zip(&mut self.outputs[outputs..]) {
            std::mem::swap(current, next);
        }
        Ok(&self.outputs[..outputs])
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
    fn current(&self, k: usize) -> &Data {
        match self.places[k] {
            Place::Held(j) => &self.held[j],
            Place::Swapped(m) => &self.swapped[m],
        }
    }

    /// The current state, copied out as tensors.
    pub fn state(&self) -> Result<Vec<Tensor>> {
        let copy = |(k, ty): (usize, &TensorType)| {
            let data = self
                .current(k)
                .try_clone()
                .map_err(|e| e.in_op("state", ty))?;
            Ok(Tensor::from_data(ty.clone(), data))
        };
        self.state_types.iter().enumerate().map(copy).collect()
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
        let data = copy_in("set_state", value)?;
        match self.places[index] {
            Place::Held(j) => self.held[j] = data,
            Place::Swapped(m) => self.swapped[m] = data,
        }
        Ok(())
    }

    /// The compiled graph: its fused kernels and schedule.
    pub fn graph(&self) -> &CompiledGraph {
        &self.graph
    }
}
