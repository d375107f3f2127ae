//! The printed form of a graph: deterministic text for snapshots and humans.
//!
//! Values are numbered `%0, %1, ...`: the inputs first, in declaration order,
//! then every other node in arena (topological) order. Every line carries its
//! dtype and shape. Nothing depends on pointers, timings or hash order.
//!
//! ```text
//! graph @relu_add(%0: f32[4,4], %1: f32[4,4]) -> f32[4,4] {
//!   %2 = add %0, %1 : f32[4,4]
//!   %3 = relu %2 : f32[4,4]
//!   return %3
//! }
//! ```

use std::fmt::{self, Write};

use crate::graph::{Graph, NodeId};
use crate::kernel::{Block, Expr, Kernel, KernelKind, Operand};
use crate::op::Op;
use crate::types::{Shape, TensorType};

impl Graph {
    /// The printed number of every node, indexed by arena position: inputs
    /// first, by declared index, then the other nodes in arena order, each
    /// kernel followed by the values of its blocks.
    pub fn numbering(&self) -> Vec<usize> {
        let mut next = self.inputs.len();
        self.nodes
            .iter()
            .map(|node| match &node.op {
                Op::Input { index } => *index as usize,
                op => {
                    let n = next;
                    next += 1 + block_values(op);
                    n
                }
            })
            .collect()
    }
}

/// How many numbered values the blocks of a kernel hold.
fn block_values(op: &Op) -> usize {
    match op {
        Op::Kernel(k) => {
            let prologue = match &k.kind {
                KernelKind::Reduce { prologue, .. } | KernelKind::Scatter { prologue, .. } => {
                    prologue.values.len()
                }
                KernelKind::MatMul { a, b } => [a, b]
                    .iter()
                    .map(|o| match o {
                        Operand::Computed { block, .. } => block.values.len(),
                        Operand::Read { .. } | Operand::Merged { .. } => 0,
                    })
                    .sum(),
                KernelKind::Elementwise | KernelKind::Attention { .. } => 0,
            };
            prologue + k.body.values.len()
        }
        _ => 0,
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let number = self.numbering();
        // An operand outside the arena prints as `%?`: the printer serves the
        // verifier, so it must show broken graphs too.
        let name = |id: &NodeId| match number.get(id.index()) {
            Some(n) => format!("%{n}"),
            None => format!("%?{}", id.0),
        };
        let mut inputs: Vec<(u32, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, node)| match node.op {
                Op::Input { index } => Some((index, i)),
                _ => None,
            })
            .collect();
        inputs.sort();
        write!(f, "graph @{}(", self.name)?;
        for (k, &(_, i)) in inputs.iter().enumerate() {
            let sep = if k > 0 { ", " } else { "" };
            write!(f, "{sep}%{}: {}", number[i], self.nodes[i].ty)?;
        }
        f.write_str(") -> ")?;
        let types: Vec<String> = self
            .outputs
            .iter()
            .map(|id| {
                self.nodes
                    .get(id.index())
                    .map_or("?".to_string(), |n| n.ty.to_string())
            })
            .collect();
        if types.len() == 1 {
            f.write_str(&types[0])?;
        } else {
            write!(f, "({})", types.join(", "))?;
        }
        f.write_str(" {\n")?;
        let mut kernels = 0;
        for (i, node) in self.nodes.iter().enumerate() {
            let operands: Vec<String> = node.inputs.iter().map(name).collect();
            let mut line = format!("  %{} = {}", number[i], node.op.name());
            if !operands.is_empty() {
                write!(line, " {}", operands.join(", "))?;
            }
            match &node.op {
                Op::Input { .. } => continue,
                Op::Const(v) => write!(line, " {v}")?,
                Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_) | Op::MatMul => {}
                Op::Reshape(s) | Op::Expand(s) => write!(line, " {}", compact(s.dims()))?,
                Op::Permute(p) => write!(line, " {}", compact(p))?,
                Op::Slice(ranges) => {
                    let parts: Vec<String> = ranges
                        .iter()
                        .map(|r| match r.step {
                            1 => format!("{}:{}", r.start, r.end),
                            s => format!("{}:{}:{s}", r.start, r.end),
                        })
                        .collect();
                    write!(line, " [{}]", parts.join(","))?;
                }
                Op::Unfold { axis, size, step } => {
                    write!(line, " axis {axis} size {size} step {step}")?
                }
                Op::Pad { pads, value } => {
                    let parts: Vec<String> = pads.iter().map(|(b, a)| format!("{b}:{a}")).collect();
                    write!(line, " [{}] {value}", parts.join(","))?;
                }
                Op::Reduce { axes, .. } => write!(line, " axes {}", compact(axes))?,
                Op::Gather { axis } => write!(line, " axis {axis}")?,
                Op::ScatterAdd { axis, len } => write!(line, " axis {axis} len {len}")?,
                Op::Attention(a) => write!(line, "{a}")?,
                Op::View(view) => write!(line, " {view}")?,
                Op::SideOutput(k) => write!(line, " {k}")?,
                Op::Kernel(k) => {
                    let line = format!("  %{} = kernel @k{kernels}", number[i]);
                    kernels += 1;
                    let operands: Vec<String> = node.inputs.iter().map(name).collect();
                    print_kernel(f, line, k, &operands, number[i] + 1)?;
                    continue;
                }
            }
            writeln!(f, "{line} : {}", node.ty)?;
        }
        let outputs: Vec<String> = self.outputs.iter().map(name).collect();
        writeln!(f, "  return {}", outputs.join(", "))?;
        f.write_str("}\n")
    }
}

/// A kernel as a nested block: the header with its kind and operands, then
/// its blocks, values numbered from `first`.
///
/// ```text
/// %5 = kernel @k1 sum axes [1] init 0.0 over f32[4,10] (%0, %4) : f32[4,10] {
///   %6 = load %0 strides [10,1] : f32[4,10]
///   reduce %6
///   %7 = div %6, acc : f32[4,10]
///   yield %7
/// }
/// ```
fn print_kernel(
    f: &mut fmt::Formatter<'_>,
    mut line: String,
    k: &Kernel,
    operands: &[String],
    first: usize,
) -> fmt::Result {
    let args = operands.join(", ");
    let mut next = first;
    match &k.kind {
        KernelKind::Elementwise => {
            writeln!(f, "{line} elementwise ({args}) : {} {{", k.out)?;
        }
        KernelKind::Reduce {
            op,
            axes,
            shape,
            prologue,
        } => {
            let space = TensorType::new(prologue.dtype().unwrap_or(k.out.dtype), shape.clone());
            let init = op.init(space.dtype);
            let axes = compact(axes);
            write!(
                line,
                " {} axes {axes} init {init} over {space} ({args})",
                op.name()
            )?;
            writeln!(f, "{line} : {} {{", k.out)?;
            let result = print_block(f, prologue, shape, operands, next)?;
            writeln!(f, "    reduce %{result}")?;
            next += prologue.values.len();
        }
        KernelKind::Scatter {
            axis,
            shape,
            prologue,
            index,
        } => {
            let space = TensorType::new(prologue.dtype().unwrap_or(k.out.dtype), shape.clone());
            writeln!(
                f,
                "{line} scatter_add axis {axis} over {space} ({args}) : {} {{",
                k.out
            )?;
            let result = print_block(f, prologue, shape, operands, next)?;
            writeln!(f, "    add %{result} at %{}", next + *index as usize)?;
            next += prologue.values.len();
        }
        KernelKind::Attention {
            op,
            operands: reads,
        } => {
            writeln!(f, "{line} attention{op} ({args}) : {} {{", k.out)?;
            for (name, (input, view)) in ["q", "k", "v", "bias"].iter().zip(reads) {
                let source = operands.get(*input as usize).map_or("%?", |s| s);
                let shape = compact(view.shape.dims());
                writeln!(f, "    {name} = {source} {shape} {view}")?;
            }
        }
        KernelKind::MatMul { a, b } => {
            writeln!(f, "{line} matmul ({args}) : {} {{", k.out)?;
            for (side, operand) in [("a", a), ("b", b)] {
                let shape = compact(operand.shape().dims());
                match operand {
                    Operand::Read { input, view } => {
                        let source = operands.get(*input as usize).map_or("%?", |s| s);
                        writeln!(f, "    {side} = {source} {shape} {view}")?;
                    }
                    Operand::Merged { input, view, .. } => {
                        let source = operands.get(*input as usize).map_or("%?", |s| s);
                        let fine = compact(view.shape.dims());
                        writeln!(f, "    {side} = {source} {shape} merging {fine} {view}")?;
                    }
                    Operand::Computed {
                        shape: space,
                        block,
                    } => {
                        let result = print_block(f, block, space, operands, next)?;
                        writeln!(f, "    {side} = %{result} {shape}")?;
                        next += block.values.len();
                    }
                }
            }
        }
    }
    let result = print_block(f, &k.body, &k.out.shape, operands, next)?;
    writeln!(f, "    yield %{result}")?;
    for side in &k.side {
        writeln!(f, "    side %{} : {}", next + side.value as usize, side.ty)?;
    }
    f.write_str("  }\n")
}

/// The values of a block, numbered from `first`; returns the result's number.
fn print_block(
    f: &mut fmt::Formatter<'_>,
    block: &Block,
    space: &Shape,
    operands: &[String],
    first: usize,
) -> Result<usize, fmt::Error> {
    let value = |x: &u32| format!("%{}", first + *x as usize);
    for (i, v) in block.values.iter().enumerate() {
        let rhs = match &v.expr {
            Expr::Load { input, view } => {
                let source = operands.get(*input as usize).map_or("%?", |s| s);
                format!("load {source} {view}")
            }
            Expr::Gather {
                input,
                view,
                index,
                stride,
                len,
            } => {
                let source = operands.get(*input as usize).map_or("%?", |s| s);
                format!(
                    "gather {source} {view} + {} x {stride} of {len}",
                    value(index)
                )
            }
            Expr::Const(c) => format!("const {c}"),
            Expr::Acc => "acc".to_string(),
            Expr::Unary(op, x) => format!("{} {}", op.name(), value(x)),
            Expr::Binary(op, x, y) => format!("{} {}, {}", op.name(), value(x), value(y)),
            Expr::Where(c, x, y) => format!("where {}, {}, {}", value(c), value(x), value(y)),
            Expr::Cast(x) => format!("cast {}", value(x)),
        };
        writeln!(
            f,
            "    %{} = {rhs} : {}",
            first + i,
            TensorType::new(v.dtype, space.clone())
        )?;
    }
    Ok(first + block.values.len().saturating_sub(1))
}

/// `[1,0]`: a list of numbers with no spaces, like the shapes in types.
fn compact(values: &[usize]) -> String {
    let parts: Vec<String> = values.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(","))
}
