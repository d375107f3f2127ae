//! Loop kernels: how a kernel's loops run, decided once from the kernel and
//! the target's facts, for the CPU (Cranelift) and CUDA (C) renderers to
//! follow. A plan states the loop nests (`crate::nest`), a reduction's
//! strategy (a row at a time, four short rows at once, or neighbouring
//! outputs side by side), which parts run in lanes, which prologue value a
//! broadcast epilogue reads back instead of computing again, and, on a
//! target that hoists, which values are computed once per row or per call
//! and the versions of a row's loop (`hoist`). Like `crate::matmul`'s
//! plans, loop kernels print as text, and `tests/loop_kernels.rs`
//! snapshots them for both targets.
//!
//! Left to the renderers: instructions, registers and launch shapes (the
//! CPU's calls of 256-bit row functions where a row's block matches one,
//! CUDA's threads per block).

pub(crate) mod hoist;
pub(crate) mod lanes;
mod reduce;
mod text;

pub(crate) use reduce::{By, Reduce, Runs};

use kiln_ir::elementwise::infer_matmul;
use kiln_ir::kernel::{Block, Expr, Kernel, KernelKind, Operand};
use kiln_ir::view::View;
use kiln_ir::{DType, Shape, TensorType};

use crate::nest::{Access, Axis, Nest, loads, nest};
use hoist::{Place, Stretch, Version, hoisted, invariant, unpadded_middle, versions};
use lanes::vectorizable_hoisted;

/// What a backend's loops can do, for the decisions a plan makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// Lanes need an instruction for every op of a block (the CPU's f32x4
    /// and i32x4, `lanes::lane_op`); else a lane is a scalar statement, and
    /// any f32 block runs four elements a step between 16-byte loads and
    /// stores (CUDA's `float4`).
    pub vector_ops: bool,
    /// A row of a reduction is combined by a block of threads (a GPU), when
    /// its reduced axes are innermost; else by one thread, in vector lanes
    /// where its block has them (the CPU).
    pub threads_per_row: bool,
    /// A broadcast epilogue reads a value equal to the prologue's result
    /// (softmax's `exp(x - max)`) back from the output row, where the
    /// prologue pass stored it while the row is in cache, instead of
    /// computing it again (the CPU). CUDA computes it again: storing it is
    /// not measured on a GPU yet.
    pub reuse: bool,
    /// Values constant along a row are computed once before its loop, and
    /// a row's loop is versioned on conditions computed so (`hoist`): the
    /// CPU, where Cranelift leaves a value in the loop that uses it. CUDA
    /// leaves that to NVRTC.
    pub hoists: bool,
}

impl Target {
    /// kiln's CPU code.
    pub const CPU: Target = Target {
        vector_ops: true,
        threads_per_row: false,
        reuse: true,
        hoists: true,
    };

    /// CUDA C.
    pub const CUDA: Target = Target {
        vector_ops: false,
        threads_per_row: true,
        reuse: false,
        hoists: false,
    };

    /// How an elementwise kernel storing `out` steps: where lanes need no
    /// instruction per op, four f32 or 16-bit float elements a step; where
    /// they do, each stretch of a row as its block allows.
    pub(crate) fn map_vectors(self, out: &TensorType) -> Vectors {
        let four = out.dtype == DType::F32 || out.dtype.is_half();
        match self.vector_ops {
            true => Vectors::PerVersion,
            false if four && out.shape.numel() >= 4 => Vectors::Four,
            false => Vectors::Scalar,
        }
    }
}

/// A kernel's loops.
pub struct LoopKernel {
    /// The kernel's inputs: buffer `inputs` is the output.
    pub(crate) inputs: usize,
    /// What runs in them.
    pub(crate) kind: Loops,
}

/// The loops of each kind of kernel.
pub(crate) enum Loops {
    /// An elementwise kernel, or a matmul's epilogue over the product.
    Map(Map),
    /// A reduction.
    Reduce(Reduce),
    /// A scatter-add.
    Scatter(Scatter),
}

/// The loops of an elementwise kernel or a matmul's epilogue.
pub(crate) struct Map {
    /// The space it runs over: the output's shape, or for an epilogue over a
    /// reshape of the product (a convolution's `[N, O, H, W]` from `[N, O,
    /// H * W]`) the product's, so that its rows are the product's and follow
    /// the GEMM's row blocks.
    pub(crate) space: Shape,
    /// The body, its reads reshaped to `space`.
    pub(crate) body: Block,
    /// The reads, then the output, over `space`: one flat loop where they
    /// merge to one axis; a matmul's epilogue a row of the last axis each.
    pub(crate) nest: Nest,
    /// A matmul's epilogue, reading the product at the output's elements:
    /// from the output in place, or from where it lies apart.
    pub(crate) acc: bool,
    /// How it steps: `Target::map_vectors`, the rule CUDA's maps (a
    /// matmul's prologues and epilogue among them) step by.
    pub(crate) vectors: Vectors,
    /// One flat loop over the elements (`nest` merged to one axis): the
    /// range a thread is given is elements, not rows.
    pub(crate) flat: bool,
    /// The values the same all over the kernel, computed once per call
    /// (`hoist::invariant`; empty: none).
    pub(crate) invariant: Vec<bool>,
    /// The stretches of a row (of the flat loop: one, over the range a
    /// thread is given); empty on a target that does not hoist.
    pub(crate) stretches: Vec<Stretch>,
}

/// The loops of a scatter-add: per outer row of the output, its picks in
/// order, each a row of updates along the inner axes.
pub(crate) struct Scatter {
    /// The updates, and the index at value `index`.
    pub(crate) prologue: Block,
    pub(crate) index: u32,
    /// The prologue's reads: a row per (outer row, pick), the inner axes
    /// along it.
    pub(crate) nest: Nest,
    /// Outer rows, picks per outer row, and output positions per outer row.
    pub(crate) outer: usize,
    pub(crate) picks: usize,
    pub(crate) len: usize,
    /// The output's buffer.
    pub(crate) out: usize,
    /// The values computed once per pick (`hoist::hoisted`; empty on a
    /// target that does not hoist).
    pub(crate) hoisted: Vec<bool>,
    /// A pick's updates added in lanes: an f32 output, one position for
    /// the row (its index hoisted), a block with lanes.
    pub(crate) lanes: bool,
}

/// How a map steps through its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Vectors {
    /// Four elements a step: contiguous reads of f32 and 16-bit floats and
    /// the store as 16- or 8-byte vectors, scalar code between them.
    Four,
    /// One element a step.
    Scalar,
    /// Each version of a stretch in lanes where it says
    /// (`hoist::Version::Loop`).
    PerVersion,
}

/// The loops of `kernel` on `target`.
pub fn plan(kernel: &Kernel, target: Target) -> LoopKernel {
    let kind = match &kernel.kind {
        KernelKind::Elementwise | KernelKind::MatMul { .. } | KernelKind::Attention { .. } => {
            Loops::Map(map(kernel, target))
        }
        KernelKind::Reduce {
            op,
            axes,
            shape,
            prologue,
        } => Loops::Reduce(reduce::reduce(kernel, target, (*op, axes, shape, prologue))),
        KernelKind::Scatter {
            axis,
            shape,
            prologue,
            index,
        } => Loops::Scatter(scatter(kernel, target, (*axis, shape, prologue, *index))),
    };
    LoopKernel {
        inputs: kernel.inputs.len(),
        kind,
    }
}

/// An elementwise kernel, or a matmul's epilogue over the product.
fn map(kernel: &Kernel, target: Target) -> Map {
    let out_buffer = kernel.inputs.len();
    let (space, body) =
        product_rows(kernel).unwrap_or_else(|| (kernel.out.shape.clone(), kernel.body.clone()));
    let identity: Vec<usize> = (0..space.rank()).collect();
    let out_view = View::contiguous(&space);
    let mut views = loads(&body);
    views.push((out_buffer, &out_view));
    // A matmul's product (an attention's result, a machine kernel's sum of
    // taps, `cpu::taps`) is already in the output, or a product apart
    // where the output cannot hold it, and its epilogue reads it at the
    // output's elements, a row of the output's last axis per unit, so that
    // it can follow the machine kernel's rows.
    let acc = matches!(
        kernel.kind,
        KernelKind::MatMul { .. } | KernelKind::Attention { .. }
    ) || body.values.iter().any(|v| v.expr == Expr::Acc);
    let split = acc.then(|| space.rank().saturating_sub(1));
    let nest = nest(&space, &identity, split, &views);
    let flat = nest.rows == 1 && nest.inner.len() == 1;
    let (invariant, stretches) = match target.hoists {
        true => stretches(&body, &nest, flat, &side_values(kernel)),
        false => (Vec::new(), Vec::new()),
    };
    Map {
        vectors: target.map_vectors(&kernel.out),
        space,
        body,
        nest,
        acc,
        flat,
        invariant,
        stretches,
    }
}

/// The values of a kernel's body that it stores as side outputs.
fn side_values(kernel: &Kernel) -> Vec<u32> {
    kernel.side.iter().map(|s| s.value).collect()
}

/// A map's values computed once per call, and the stretches of its rows:
/// the flat loop's one stretch; else a row of padded reads in three
/// stretches, its middle unpadded and in lanes where it can, its ends one
/// element at a time (a read whose row lies in its padding reads the fill
/// there, `Access::row_fill`, as a concatenation's parts do in the rows of
/// the others), each versioned on the conditions it computes once.
fn stretches(body: &Block, nest: &Nest, flat: bool, side: &[u32]) -> (Vec<bool>, Vec<Stretch>) {
    let (reads, out) = nest.accesses.split_at(nest.accesses.len() - 1);
    let out = &out[0];
    if flat {
        let hoisted = hoisted(
            body,
            reads,
            (nest.inner[0], true),
            (false, &[]),
            Access::row_invariant,
        );
        let lanes = vectorizable_hoisted(body, reads, out, &hoisted);
        let version = Version::Loop {
            block: body.clone(),
            reads: (0..reads.len()).collect(),
            accesses: reads.to_vec(),
            lanes,
        };
        let stretch = Stretch {
            span: None,
            reads: reads.to_vec(),
            hoisted,
            version,
        };
        return (Vec::new(), vec![stretch]);
    }
    let inner_len: usize = nest.inner.iter().product();
    let invariant = invariant(body, reads, nest.rows * inner_len > 0);
    let stretch = |reads: &[Access], span: std::ops::Range<usize>, vector: bool| {
        let known = (false, invariant.as_slice());
        let hoisted = hoisted(body, reads, (inner_len, true), known, Access::row_invariant);
        let place = Place {
            reads,
            out,
            hoisted: &hoisted,
            side,
        };
        let version = versions(body, &place, vector);
        Stretch {
            span: Some(span),
            reads: reads.to_vec(),
            hoisted,
            version,
        }
    };
    let stretches = match unpadded_middle(reads) {
        None => vec![stretch(reads, 0..inner_len, true)],
        Some((lo, hi, clear)) => {
            let mut stretches = Vec::new();
            if lo > 0 {
                stretches.push(stretch(reads, 0..lo, false));
            }
            stretches.push(stretch(&clear, lo..hi, true));
            if hi < inner_len {
                stretches.push(stretch(reads, hi..inner_len, false));
            }
            stretches
        }
    };
    (invariant, stretches)
}

/// A scatter-add: its updates' nest, row by row of its outer axes, and
/// what a pick computes once.
fn scatter(
    kernel: &Kernel,
    target: Target,
    (axis, shape, prologue, index): (usize, &Shape, &Block, u32),
) -> Scatter {
    let identity: Vec<usize> = (0..shape.rank()).collect();
    let dims = shape.dims();
    let nest = nest(shape, &identity, Some(axis + 1), &loads(prologue));
    let inner: usize = nest.inner.iter().product();
    let out = kernel.inputs.len();
    let (hoisted, lanes) = if target.hoists {
        let hoisted = hoisted(
            prologue,
            &nest.accesses,
            (inner, true),
            (false, &[]),
            Access::row_invariant,
        );
        // A pick's row of the output, where its position is one per row.
        let contiguous = Access {
            buffer: out,
            offset: 0,
            outer: Vec::new(),
            inner: vec![Axis {
                dim: inner,
                stride: 1,
                lo: 0,
                hi: inner,
            }],
            fill: None,
            row_fill: None,
        };
        let lanes = hoisted[index as usize]
            && kernel.out.dtype == DType::F32
            && vectorizable_hoisted(prologue, &nest.accesses, &contiguous, &hoisted);
        (hoisted, lanes)
    } else {
        (Vec::new(), false)
    };
    Scatter {
        prologue: prologue.clone(),
        index,
        outer: dims[..axis].iter().product(),
        picks: dims[axis],
        len: kernel.out.shape.dims()[axis],
        out,
        nest,
        hoisted,
        lanes,
    }
}

/// For a matmul whose output reshapes the product (a convolution's
/// `[N, O, H, W]` from `[N, groups, O / groups, H * W]`), the product's
/// shape and the epilogue with every read reshaped to it; `None` when the
/// output is the product's shape already or a read does not reshape.
fn product_rows(kernel: &Kernel) -> Option<(Shape, Block)> {
    let KernelKind::MatMul { a, b } = &kernel.kind else {
        return None;
    };
    let operand = |o: &Operand| TensorType::new(DType::F32, o.shape().clone());
    let product = infer_matmul(&operand(a), &operand(b)).ok()?.shape;
    if product == kernel.out.shape || product.numel() != kernel.out.shape.numel() {
        return None;
    }
    let mut body = kernel.body.clone();
    for value in &mut body.values {
        if let Some((_, view)) = value.expr.read_mut() {
            *view = view.reshape(&product)?;
        }
    }
    Some((product, body))
}

/// Which values of `block` its result or a side output (the values
/// `stored`) needs.
pub(crate) fn live(block: &Block, stored: impl IntoIterator<Item = u32>) -> Vec<bool> {
    let mut live = vec![false; block.values.len()];
    if let Some(last) = live.last_mut() {
        *last = true;
    }
    for v in stored {
        live[v as usize] = true;
    }
    for i in (0..block.values.len()).rev() {
        if live[i] {
            for x in block.values[i].expr.operands() {
                live[x as usize] = true;
            }
        }
    }
    live
}
