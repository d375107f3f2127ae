//! The attention driver: an attention kernel's operands as batches of
//! matrices over their buffers' values, and `kiln_machine::attention` into
//! the output (its body is the result alone, `Kernel::check`).

use kiln_ir::kernel::KernelKind;
use kiln_machine::attention::{self, Attention, Heads};

use super::CompiledKernel;
use super::launch::{Buffer, views};
use super::matmul::Strided;
use crate::{Error, Role};

impl CompiledKernel {
    /// Runs an attention kernel over its launch's buffers, checked by
    /// `bind`.
    pub(super) fn run_attention(&self, inputs: &[&Buffer], out: &mut Buffer) -> Result<(), Error> {
        let kernel = &self.kernel;
        let label = || crate::label(kernel);
        let KernelKind::Attention { op, operands } = &kernel.kind else {
            return Err(crate::launch(label(), "not an attention"));
        };
        let mut read = [0; 4].map(|_| (Role::Scratch, Buffer::empty()));
        for ((input, _), to) in operands.iter().zip(&mut read) {
            let buffer = inputs
                .get(*input as usize)
                .ok_or_else(|| crate::launch(label(), format!("no input {input}, an operand")))?;
            *to = (Role::Input(*input as usize), buffer.alias());
        }
        let (values, result) = views::<f32, 4>(kernel, &read, out)?;
        let tables = (operands.iter())
            .map(|(_, view)| Strided::new(view, &view.shape).map(|s| s.offsets()))
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(|problem| crate::launch(label(), problem))?;
        let heads: Vec<Heads<'_>> = (operands.iter().zip(values).zip(&tables))
            .map(|(((_, view), data), batches)| {
                let r = view.shape.rank();
                Heads {
                    data,
                    batches,
                    rows: view.strides[r - 2] as isize,
                    cols: view.strides[r - 1] as isize,
                }
            })
            .collect();
        let [q, k, v] = [0, 1, 2].map(|i| &operands[i].1.shape);
        let r = q.rank();
        let dims = |shape: &kiln_ir::Shape, a: usize| shape.dims()[a];
        let att = Attention {
            q: heads[0],
            k: heads[1],
            v: heads[2],
            bias: heads.get(3).copied(),
            dims: [
                tables[0].len(),
                dims(q, r - 2),
                dims(k, r - 2),
                dims(q, r - 1),
                dims(v, r - 1),
            ],
            scale: op.scale.map_or(1.0, |s| s.factor()),
            hidden: if op.guarded { 0.0 } else { f32::NAN },
        };
        let n = kernel.out.shape.numel().min(result.len());
        let isa = crate::cpu_isa()?;
        attention::attention(isa, &att, &mut result[..n]).map_err(|error| Error::Machine {
            kernel: label(),
            error,
        })
    }
}
