//! Machine code made and called: the one part of the CPU backend with
//! `unsafe`. It owns the JIT code memory, turns it into function pointers
//! (the one transmute, in `compile`), hands raw buffer pointers to
//! generated code and calls it, and hands the GEMM of `kiln_machine` its
//! buffers as slices.
//!
//! Every call is made safe by checks first: buffer lengths against the
//! types the kernel was compiled for, row ranges against the kernel's own
//! range. The generated code reads and writes only through the kernel's
//! index maps, which the verifier has proved stay inside buffers of those
//! types, and writes only the rows it is given.
//!
//! - `compile`: a kernel lowered and compiled into a function pointer;
//! - `launch`: buffers checked and tabled, and the code called over row
//!   ranges, across threads, row group by row group;
//! - `matmul`: a matmul's operands, the GEMM call, and its epilogue over the
//!   product's rows;
//! - `attention`: an attention's operands and its machine kernel's call;
//! - `taps`: a depthwise convolution's sum by its machine kernel, a chunk
//!   of planes per task, each followed by the rest of the kernel's body.

mod attention;
mod compile;
mod launch;
mod matmul;
mod taps;

pub(crate) use compile::CompiledKernel;
pub(crate) use launch::{Buffer, run_rows};
pub(crate) use matmul::{Computed, PackedOperand};

/// The kernel of the first launch of `g`, optimized, compiled.
#[cfg(test)]
fn first_kernel(g: &kiln_ir::Graph) -> CompiledKernel {
    use kiln_ir::Op;
    use kiln_ir::pass::{Options, optimize};
    let optimized = optimize(g, Options::default(), &mut |_, _| {}).unwrap();
    let launch = &optimized.schedule.launches[0];
    let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
        panic!("the launch is a kernel")
    };
    CompiledKernel::new(kernel, None).unwrap()
}
