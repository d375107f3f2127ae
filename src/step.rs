//! `kiln::compile_step`: a compiled function that carries state from call
//! to call, such as a training step's parameters and optimizer state.
//!
//! The step is traced once as `f(state, args) -> (outputs, new_state)` and
//! compiled like any graph; the state lives in the compiled step. Each call
//! reads the state's buffers and writes the new state into a second set,
//! then the two sets trade places (a swap of pointers): a call copies
//! nothing and allocates nothing, and the state never leaves the step
//! unless it is read out. Tensors the caller holds are never written:
//! `compile_step` copies the initial values in, `state` copies the current
//! ones out, and `set_state` copies a tensor in.

use kiln_ir::pass::Options;
use kiln_ir::{Data, DataRef, TensorType};
use smallvec::SmallVec;

use crate::{CompiledGraph, Error, Result, Tensor};

/// A compiled step and the state it carries.
pub struct CompiledStep {
    graph: CompiledGraph,
    /// The current state, one buffer per state tensor.
    state: Vec<Data>,
    state_types: Vec<TensorType>,
    /// The step's outputs, then the buffers the next state is written to.
    outputs: Vec<Data>,
}

/// Traces `f` on the state (placeholders of `state`'s types) and
/// placeholders of `specs`, and compiles it with `options`. `f` returns the
/// step's outputs (a loss, metrics) and the new state, one tensor of the
/// same type for each state tensor, in order.
pub fn compile_step(
    name: &str,
    state: &[&Tensor],
    specs: &[TensorType],
    options: Options,
    f: impl FnOnce(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
) -> Result<CompiledStep> {
    let state_types: Vec<TensorType> = state.iter().map(|t| t.ty().clone()).collect();
    let all: Vec<TensorType> = state_types.iter().chain(specs).cloned().collect();
    let mut outputs_count = 0;
    let graph = crate::compile_with(name, &all, options, |inputs| {
        let (current, args) = inputs.split_at(state.len());
        let (outputs, next) = f(current, args)?;
        check_next(&state_types, &next)?;
        outputs_count = outputs.len();
        Ok(outputs.into_iter().chain(next).collect())
    })?;
    let state = state
        .iter()
        .map(|t| copy_in(name, t))
        .collect::<Result<_>>()?;
    let outputs = graph.output_buffers()?;
    debug_assert_eq!(outputs.len(), outputs_count + state_types.len());
    Ok(CompiledStep {
        graph,
        state,
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
        let mut inputs: SmallVec<[DataRef; 8]> = self.state.iter().map(DataRef::from).collect();
        for &a in args {
            inputs.push(a.into());
        }
        self.graph.run_into(&inputs, &mut self.outputs)?;
        drop(inputs);
        let outputs = self.outputs.len() - self.state.len();
        for (current, next) in self.state.iter_mut().zip(&mut self.outputs[outputs..]) {
            std::mem::swap(current, next);
        }
        Ok(&self.outputs[..outputs])
    }

    /// The current state, copied out as tensors.
    pub fn state(&self) -> Result<Vec<Tensor>> {
        let copy = |(d, ty): (&Data, &TensorType)| {
            let data = d.try_clone().map_err(|e| e.in_op("state", ty))?;
            Ok(Tensor::from_data(ty.clone(), data))
        };
        self.state.iter().zip(&self.state_types).map(copy).collect()
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
        self.state[index] = copy_in("set_state", value)?;
        Ok(())
    }

    /// The compiled graph: its fused kernels and schedule.
    pub fn graph(&self) -> &CompiledGraph {
        &self.graph
    }
}
