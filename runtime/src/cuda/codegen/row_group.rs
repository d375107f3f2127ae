//! A row group (`rows::row_groups`: softmax's max, then its sum of
//! exponentials) as one kernel whose block runs each reduction's row in
//! turn, so the row is read from memory once and the group launches once.

use std::ops::Range;

use kiln_ir::Op;
use kiln_ir::kernel::{Kernel, KernelKind};
use kiln_ir::pass::Optimized;
use kiln_ir::schedule::Location;

use super::reduce::{reduce_into, reduction_rows};
use super::writer::{Writer, storage};
use super::{ENTRY, Grid, Program};
use crate::Error;

/// The kernel of the row group `launches` of `optimized`'s schedule
/// (`rows::row_groups`), or `None` where it is one launch or its reductions
/// do not all run a block to each of the same rows.
pub fn row_group_of(
    optimized: &Optimized,
    launches: Range<usize>,
) -> Result<Option<Program>, Error> {
    let (graph, schedule) = (&optimized.graph, &optimized.schedule);
    let mut members = Vec::new();
    let mut rows = None;
    for i in launches.clone() {
        let launch = &schedule.launches[i];
        let Op::Kernel(kernel) = &graph.node(launch.node).op else {
            return Ok(None);
        };
        // `rows::row_groups` keeps kernels with side outputs alone; row
        // functions have no side buffers.
        let Some(r) = reduction_rows(kernel).filter(|_| kernel.side.is_empty()) else {
            return Ok(None);
        };
        if *rows.get_or_insert(r) != r {
            return Ok(None);
        }
        // Inputs an earlier member writes.
        let written: Vec<bool> = launch
            .inputs
            .iter()
            .map(|loc| {
                schedule.launches[launches.start..i]
                    .iter()
                    .any(|m| *loc == Location::Slot(m.output))
            })
            .collect();
        members.push((kernel.as_ref(), written));
    }
    if members.len() < 2 {
        return Ok(None);
    }
    row_group(&members).map(Some)
}

/// One kernel for a row group (`rows::row_groups`): reductions by rows over
/// the same `rows`, each a device function called for every row in turn, a
/// block to a row, so that softmax's max and sum read a row once from
/// memory and launch once. `members` are the kernels with, for each of
/// their inputs, whether an earlier member writes it. The kernel's
/// parameters are each member's inputs, then its output, member by member.
fn row_group(members: &[(&Kernel, Vec<bool>)]) -> Result<Program, Error> {
    let mut w = Writer::new();
    let mut rows_and_threads = None;
    let mut params = Vec::new();
    let mut calls = Vec::new();
    for (m, (kernel, written)) in members.iter().enumerate() {
        if !matches!(kernel.kind, KernelKind::Reduce { .. }) {
            return Err(crate::codegen(
                "CUDA C of a row group",
                format!("row group member {m} is not a reduction"),
            ));
        }
        let name = format!("kiln_row{m}");
        let grid = reduce_into(&mut w, kernel, Some((&name, written)))?;
        let Grid::Rows { rows, threads } = grid else {
            return Err(crate::codegen(
                "CUDA C of a row group",
                format!("row group member {m} is not by rows"),
            ));
        };
        let (group_rows, group_threads) = *rows_and_threads.get_or_insert((rows, threads));
        if rows != group_rows {
            return Err(crate::codegen(
                "CUDA C of a row group",
                format!("row group member {m} has {rows} rows, not {group_rows}"),
            ));
        }
        rows_and_threads = Some((rows, threads.max(group_threads)));
        let mut args = vec!["o".to_string()];
        for (i, t) in kernel.inputs.iter().enumerate() {
            params.push(format!("const {}* m{m}_in{i}", storage(t.dtype)));
            args.push(format!("m{m}_in{i}"));
        }
        params.push(format!("{}* m{m}_out", storage(kernel.out.dtype)));
        args.push(format!("m{m}_out"));
        calls.push(format!("{name}({});", args.join(", ")));
    }
    let Some((rows, threads)) = rows_and_threads else {
        return Err(crate::codegen(
            "CUDA C of a row group",
            "an empty row group",
        ));
    };
    w.line(
        0,
        &format!(
            "extern \"C\" __global__ void {ENTRY}({}) {{",
            params.join(", ")
        ),
    );
    w.line(
        1,
        &format!("for (long long o = blockIdx.x; o < {rows}; o += gridDim.x) {{"),
    );
    for call in &calls {
        w.line(2, call);
    }
    w.line(1, "}");
    w.line(0, "}");
    Ok(w.finish(Grid::Rows { rows, threads }))
}
