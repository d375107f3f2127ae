//! The taps driver: a kernel's sum of taps by `kiln_machine::taps` into the
//! output (with ReLU and a cap, where they are all the rest of its body), a
//! chunk of planes per task, and the generated rest of its body over each
//! chunk's rows as soon as they are written, while they are in cache
//! (`cpu::taps`).

#![allow(unsafe_code)]

use std::sync::Mutex;

use kiln_machine::taps::{self, Taps};
use kiln_machine::team;

use super::compile::{CompiledKernel, Taps as Planned};
use super::launch::{Bound, Buffer, PARALLEL_ELEMENTS, run_rows, views};
use crate::{Error, Role};

impl CompiledKernel {
    /// Runs a kernel whose sum of taps the machine kernel computes, over
    /// its launch's buffers, checked by `bind`.
    pub(super) fn run_taps(
        &self,
        Planned { plan, epilogue }: &Planned,
        bound: &Bound<'_>,
        inputs: &[&Buffer],
        out: &mut Buffer,
    ) -> Result<(), Error> {
        let kernel = &self.kernel;
        let label = || crate::label(kernel);
        let read = |i: u32| -> Result<(Role, Buffer), Error> {
            let buffer = inputs
                .get(i as usize)
                .ok_or_else(|| crate::launch(label(), format!("no input {i}, read by its taps")))?;
            Ok((Role::Input(i as usize), buffer.alias()))
        };
        let read = [read(plan.x)?, read(plan.w)?];
        let ([input, weights], result) = views::<f32, 2>(kernel, &read, out)?;
        let [oh, ow] = plan.out_dims;
        let plane = oh * ow;
        let planes = plan.planes.len();
        let Some(result) = result.get_mut(..planes * plane) else {
            return Err(crate::launch(label(), "an output smaller than its planes"));
        };
        let t = Taps {
            input,
            weights,
            in_dims: plan.in_dims,
            out_dims: plan.out_dims,
            stride: plan.stride,
            taps: &plan.taps,
            fill: plan.fill,
            activation: plan.activation,
        };
        let isa = crate::cpu_isa()?;
        // The epilogue follows each chunk's planes where its rows are the
        // planes' rows, else runs after them all.
        let by_rows = *epilogue && self.range.rows == planes * oh && self.range.row_len == ow;
        let work = (planes * plane).saturating_mul(plan.taps.len());
        let tasks = match work < PARALLEL_ELEMENTS {
            true => 1,
            false => (2 * team::threads()).min(planes),
        };
        // Whole groups of 8 planes per task, as small planes go 8 at a time.
        let per_task = planes.div_ceil(tasks.max(1)).next_multiple_of(8);
        let failure = Mutex::new(None);
        team::for_each_chunk(result, per_task * plane, &|chunk, out| {
            let first = chunk * per_task;
            let count = out.len() / plane.max(1);
            let done = taps::taps(isa, &t, &plan.planes[first..first + count], out);
            match done {
                // SAFETY: rows `first * oh..(first + count) * oh` are these
                // planes' rows, inside the launch's `0..planes * oh`, finished
                // and touched by no other task.
                Ok(()) if by_rows => unsafe { bound.call(first * oh, (first + count) * oh, 0) },
                Ok(()) => {}
                Err(error) => {
                    *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
                }
            }
        });
        if let Some(error) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(Error::Machine {
                kernel: label(),
                error,
            });
        }
        if *epilogue && !by_rows {
            run_rows(std::slice::from_ref(bound))?;
        }
        Ok(())
    }
}
