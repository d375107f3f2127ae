//! Scatter-add kernels: a thread per column of the output (an outer row
//! and an inner position), which zeroes its column along the summed axis,
//! then adds the updates of its column pick by pick, in order: no two
//! threads write one element, and every run sums in the same order.

use kiln_ir::Shape;
use kiln_ir::kernel::{Block, Kernel};

use super::reduce::flat_index;
use super::writer::{Element, Writer, position};
use super::{Grid, Program};
use crate::Error;
use crate::nest::placed_axes;

/// `prologue` over `shape` added along `axis` at the positions its value
/// `index` picks.
pub(super) fn scatter(
    kernel: &Kernel,
    axis: usize,
    shape: &Shape,
    prologue: &Block,
    index: u32,
) -> Result<Program, Error> {
    let dims = shape.dims();
    let (picks, len) = (dims[axis], kernel.out.shape.dims()[axis]);
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    let columns = outer * inner;
    let mut w = Writer::new();
    w.signature(&kernel.inputs, false, kernel.out.dtype, 0);
    w.line(
        1,
        &format!(
            "for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < {columns}; t += (long long)gridDim.x * blockDim.x) {{"
        ),
    );
    // (With no inner elements there are no columns and the loop never runs.)
    let width = inner.max(1);
    w.line(2, &format!("const long long o = t / {width};"));
    w.line(2, &format!("const long long w = t % {width};"));
    w.coords(2, "c", "o", &placed_axes(shape, 0..axis));
    w.coords(2, "c", "w", &placed_axes(shape, axis + 1..dims.len()));
    let column = format!("o * {} + w", len * inner);
    w.line(
        2,
        &format!("for (long long p = 0; p < {len}; p++) out[{column} + p * {inner}] = 0;"),
    );
    w.line(2, &format!("for (long long j = 0; j < {picks}; j++) {{"));
    if picks != 1 {
        w.line(3, &format!("const long long c{axis} = j;"));
    }
    let flat = flat_index(shape, "c");
    let element = Element {
        suffix: "",
        index: &flat,
        coords: "c",
        lane: None,
        acc: None,
    };
    let update = w.block(3, prologue, &kernel.inputs, &element)?;
    // One outside the axis adds nowhere.
    let at = position(&format!("v{index}"), len);
    w.line(3, &format!("const long long p = {at};"));
    w.line(
        3,
        &format!("if (p >= 0 && p < {len}) out[{column} + p * {inner}] += {update};"),
    );
    w.line(2, "}");
    w.line(1, "}");
    w.line(0, "}");
    Ok(w.finish(Grid::Flat {
        steps: columns.max(1),
    }))
}
