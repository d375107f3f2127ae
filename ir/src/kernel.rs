//! The kernel IR: what fusion produces and what a backend lowers.
//!
//! A `Kernel` is one launch. It reads its inputs (whole buffers, typed) through
//! index maps (`View`), computes one output buffer, and is one of three kinds:
//!
//! - elementwise: the body is evaluated at every index of the output;
//! - reduction: a prologue block is evaluated at every index of the reduced
//!   space, combined along the reduced axes, and the body (the epilogue) reads
//!   the combined value as `acc`. The output is either the reduced shape (the
//!   reduced axes kept as size 1, or any reshape of it with the same
//!   elements, element `i` reading combined value `i`) or the whole reduced
//!   space, in which case `acc` is broadcast back along the reduced axes: the
//!   sum+broadcast pattern of softmax and `x - mean(x)`, computed row by row
//!   while the row is in cache;
//! - matmul: a GEMM core over two operands, with the body applied to every
//!   output element as an epilogue that reads the product as `acc` (the
//!   output may reshape the product, element `i` reading product `i`). An
//!   operand is an input read through a strided view, or through a view of
//!   finer axes that its own merge (a convolution's windows as the im2col
//!   matrix), or computed by a block of its own (its prologue) from the
//!   kernel's inputs, once per element, before the product: the cast and
//!   normalization of the images that feed a first layer.
//!
//! A kernel whose epilogue runs over its output (every kind but a
//! reduction broadcast back over its space) may write side outputs besides its
//! output: values of its body stored at every output index as the output is
//! (of its dtype and element count), each a buffer of its own. An
//! optimizer's update writes the new parameter and its moments this way,
//! in the epilogue of the product that computes the gradient. A graph node
//! `Op::SideOutput(k)` reading the kernel's node stands for side output `k`.
//!
//! Bodies are small expression DAGs (`Block`) in which every value is
//! computed from earlier ones, each rounded to its dtype exactly as the
//! graph-level op would be, so a fused kernel computes the same numbers as
//! the ops it replaces. A kernel is plain hashable data: with its input and
//! output types inside it, its hash keys the backends' kernel caches.

use smallvec::SmallVec;

use crate::Error;
use crate::attention::Attention;
use crate::elementwise::{BinaryOp, ReduceOp, UnaryOp, infer_matmul, infer_where};
use crate::types::{DType, Scalar, Shape, TensorType};
use crate::view::View;

/// One kernel launch: typed inputs, the output, the kind, and the body.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// The buffers the kernel reads, as the node's operands in order.
    pub inputs: Vec<TensorType>,
    /// The buffer it writes.
    pub out: TensorType,
    /// Elementwise, reduction or matmul.
    pub kind: KernelKind,
    /// The value at each output index: the whole computation of an
    /// elementwise kernel, the epilogue of the others.
    pub body: Block,
    /// More buffers written at every output index, in order.
    pub side: Vec<SideOutput>,
}

/// A value of a kernel's body, stored in a buffer of its own at every index
/// of the kernel's output.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SideOutput {
    /// The buffer's type: the output's dtype and element count.
    pub ty: TensorType,
    /// The position of the stored value in the body.
    pub value: u32,
}

/// What a kernel iterates over before its body.
// Kernels are built once per graph and live boxed in `Op::Kernel`, so the
// inline operand views cost nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// The body at every output index.
    Elementwise,
    /// `prologue` over `shape`, combined by `op` along `axes`.
    Reduce {
        /// How values combine.
        op: ReduceOp,
        /// The reduced axes of `shape`, sorted.
        axes: SmallVec<[usize; 4]>,
        /// The space the prologue runs over.
        shape: Shape,
        /// The value combined at each index of `shape`.
        prologue: Block,
    },
    /// `prologue` over `shape` (the updates) added into zeros at the
    /// position its value `index` picks along `axis` (`Op::ScatterAdd`):
    /// output `[.., p, ..]` sums the prologue at every `[.., j, ..]` whose
    /// index picks `p`, in the order of `j`. The body is `acc` alone.
    Scatter {
        /// The axis summed into.
        axis: usize,
        /// The space the prologue runs over.
        shape: Shape,
        /// The update at each index of `shape`: its last value.
        prologue: Block,
        /// The value of `prologue` that indexes `axis`.
        index: u32,
    },
    /// `Op::Attention` over kernel inputs read through unmasked views:
    /// the queries, keys, values and the bias where there is one, in that
    /// order. The body is `acc` alone, the result stored as it is.
    Attention {
        /// What it computes besides its products.
        op: Attention,
        /// Each operand: the kernel input it reads, and how.
        operands: SmallVec<[(u32, View); 4]>,
    },
    /// `a [.., m, k] @ b [.., k, n]`, f32.
    MatMul {
        /// The left operand.
        a: Operand,
        /// The right operand.
        b: Operand,
    },
}

/// A matmul operand, of shape `[.., rows, cols]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// Kernel input `input` read through an unmasked view, so transposed and
    /// broadcast operands need no copy.
    Read {
        /// The kernel input it reads.
        input: u32,
        /// How: the operand's shape with any strides.
        view: View,
    },
    /// Kernel input `input` read through an unmasked view whose elements, in
    /// row-major order, are the operand of `shape`: each axis of `shape` is
    /// a run of the view's axes (`View::runs`). One strided view cannot
    /// present such an operand, the windows of a convolution
    /// (`[N, C, kh, kw, oh, ow]` as `[N, C * kh * kw, oh * ow]`), but it is
    /// read where it lies all the same.
    Merged {
        /// The kernel input it reads.
        input: u32,
        /// How, over a finer shape than the operand's.
        view: View,
        /// The operand's shape.
        shape: Shape,
    },
    /// `block` evaluated at every index of `shape` (f32), before the product.
    Computed {
        /// The operand's shape.
        shape: Shape,
        /// Its value at each index.
        block: Block,
    },
}

impl Operand {
    /// The operand's shape.
    pub fn shape(&self) -> &Shape {
        match self {
            Operand::Read { view, .. } => &view.shape,
            Operand::Merged { shape, .. } | Operand::Computed { shape, .. } => shape,
        }
    }
}

/// A small expression DAG; its last value is the block's result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Block {
    /// The values, each computed from earlier ones.
    pub values: Vec<Value>,
}

/// One value of a block and its element type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Value {
    /// How it is computed.
    pub expr: Expr,
    /// Its element type.
    pub dtype: DType,
}

/// An expression in a kernel body; operands are positions of earlier values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    /// Kernel input `input` read through `view` at the current index.
    Load {
        /// Which input.
        input: u32,
        /// The index map; its shape is the block's space.
        view: View,
    },
    /// Kernel input `input` read at a position known only at run time
    /// (`Op::Gather`): through `view` at the current index, plus `stride`
    /// elements times the i32 or i64 value `index`, counted from the end of
    /// an axis of `len` when negative. `view` steps along every axis of the
    /// input but the gathered one, which it holds at 0. An index outside
    /// `-len..len` reads `gather_fill` instead, so no index reads outside
    /// the input.
    Gather {
        /// Which input.
        input: u32,
        /// The index map of the other axes; its shape is the block's space.
        view: View,
        /// The value that indexes the gathered axis.
        index: u32,
        /// Elements between neighbours along the gathered axis.
        stride: usize,
        /// The gathered axis's length.
        len: usize,
    },
    /// A constant.
    Const(Scalar),
    /// The reduced value or the matrix product at the current index.
    Acc,
    /// An elementwise op of one operand.
    Unary(UnaryOp, u32),
    /// An elementwise op of two operands.
    Binary(BinaryOp, u32, u32),
    /// `cond ? a : b`.
    Where(u32, u32, u32),
    /// Conversion to the value's dtype.
    Cast(u32),
}

impl Expr {
    /// The positions of the values this one reads.
    pub fn operands(&self) -> SmallVec<[u32; 3]> {
        match *self {
            Expr::Load { .. } | Expr::Const(_) | Expr::Acc => SmallVec::new(),
            Expr::Unary(_, x) | Expr::Cast(x) | Expr::Gather { index: x, .. } => {
                SmallVec::from_slice(&[x])
            }
            Expr::Binary(_, x, y) => SmallVec::from_slice(&[x, y]),
            Expr::Where(c, x, y) => SmallVec::from_slice(&[c, x, y]),
        }
    }

    /// The positions of the values this one reads, to rewrite (as
    /// `operands` lists them).
    pub fn operands_mut(&mut self) -> SmallVec<[&mut u32; 3]> {
        match self {
            Expr::Load { .. } | Expr::Const(_) | Expr::Acc => SmallVec::new(),
            Expr::Unary(_, x) | Expr::Cast(x) | Expr::Gather { index: x, .. } => {
                SmallVec::from_iter([x])
            }
            Expr::Binary(_, x, y) => SmallVec::from_iter([x, y]),
            Expr::Where(c, x, y) => SmallVec::from_iter([c, x, y]),
        }
    }

    /// The input and index map of a read (a load or a gather).
    pub fn read(&self) -> Option<(u32, &View)> {
        match self {
            Expr::Load { input, view } | Expr::Gather { input, view, .. } => Some((*input, view)),
            _ => None,
        }
    }

    /// The input and index map of a read, to rewrite.
    pub fn read_mut(&mut self) -> Option<(&mut u32, &mut View)> {
        match self {
            Expr::Load { input, view } | Expr::Gather { input, view, .. } => Some((input, view)),
            _ => None,
        }
    }
}

/// What a gather reads for an index outside its axis: NaN from floats, as a
/// bad label makes a loss NaN, and zero (false) from the other dtypes.
pub fn gather_fill(dtype: DType) -> Scalar {
    if dtype.is_float() {
        Scalar::F64(f64::NAN).cast(dtype)
    } else {
        Scalar::I32(0).cast(dtype)
    }
}

/// The element an index `i` of a gathered axis of `len` picks: `i`, or
/// `i + len` when negative; `None` outside `-len..len`.
pub fn gather_position(i: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let at = if i < 0 { i + len } else { i };
    (0..len).contains(&at).then_some(at as usize)
}

impl Block {
    /// Appends a value and returns its position.
    pub fn push(&mut self, expr: Expr, dtype: DType) -> u32 {
        self.values.push(Value { expr, dtype });
        (self.values.len() - 1) as u32
    }

    /// The dtype of the result.
    pub fn dtype(&self) -> Option<DType> {
        self.values.last().map(|v| v.dtype)
    }

    /// Checks that every value is well typed over `space`, that every load
    /// stays inside its input, and that `acc` appears only where the kernel
    /// has one (`acc` is its dtype).
    fn check(
        &self,
        space: &Shape,
        inputs: &[TensorType],
        acc: Option<DType>,
    ) -> Result<(), String> {
        let scalar = |dtype| TensorType::new(dtype, Shape::scalar());
        for (i, value) in self.values.iter().enumerate() {
            let operands = value.expr.operands();
            if let Some(bad) = operands.iter().find(|&&x| x as usize >= i) {
                return Err(format!(
                    "value {i} reads value {bad}, which does not come before it"
                ));
            }
            let args: SmallVec<[TensorType; 3]> = operands
                .iter()
                .map(|&x| scalar(self.values[x as usize].dtype))
                .collect();
            let args: SmallVec<[&TensorType; 3]> = args.iter().collect();
            let dtype = match &value.expr {
                Expr::Load { input, view } => {
                    let ty = inputs.get(*input as usize).ok_or_else(|| {
                        format!("value {i} loads input {input}, which is not declared")
                    })?;
                    view.check(ty, space)
                        .map_err(|e| format!("value {i}: {e}"))?;
                    ty.dtype
                }
                Expr::Gather {
                    input,
                    view,
                    index,
                    stride,
                    len,
                } => {
                    let ty = inputs.get(*input as usize).ok_or_else(|| {
                        format!("value {i} gathers from input {input}, which is not declared")
                    })?;
                    view.check(ty, space)
                        .map_err(|e| format!("value {i}: {e}"))?;
                    if *len == 0 {
                        return Err(format!("value {i} gathers along an empty axis"));
                    }
                    if !matches!(args[0].dtype, DType::I32 | DType::I64) {
                        return Err(format!(
                            "value {i} gathers at value {index}, a {} and not an index",
                            args[0].dtype
                        ));
                    }
                    // The last element along the gathered axis stays inside too.
                    let last = (*len as i128 - 1) * *stride as i128;
                    if let Some((_, hi)) = view.bounds()
                        && hi + last >= ty.shape.numel() as i128
                    {
                        return Err(format!(
                            "value {i} gathers {len} x {stride} past {view}, outside {ty}"
                        ));
                    }
                    ty.dtype
                }
                Expr::Const(v) => v.dtype(),
                Expr::Acc => {
                    acc.ok_or_else(|| format!("value {i} reads acc, which this block has not"))?
                }
                Expr::Unary(op, _) => dtype_of(op.infer(args[0]))?,
                Expr::Binary(op, _, _) => dtype_of(op.infer(args[0], args[1]))?,
                Expr::Where(..) => dtype_of(infer_where(args[0], args[1], args[2]))?,
                Expr::Cast(_) => value.dtype,
            };
            if dtype != value.dtype {
                return Err(format!(
                    "value {i} is stored as {} but computes {dtype}",
                    value.dtype
                ));
            }
        }
        if self.values.is_empty() {
            return Err("a block is empty".to_string());
        }
        Ok(())
    }
}

/// The dtype a typing rule gives, or its error as the verifier reports it.
fn dtype_of(ty: Result<TensorType, Error>) -> Result<DType, String> {
    ty.map(|t| t.dtype).map_err(|e| e.to_string())
}

impl Kernel {
    /// The bytes of working memory a run needs besides its output: room for
    /// the computed operands of a matmul, then for its f32 product where
    /// the output cannot hold it (`holds_product`).
    pub fn scratch_bytes(&self) -> usize {
        match &self.kind {
            KernelKind::MatMul { a, b } => {
                let product = match self.holds_product() {
                    true => 0,
                    false => self.out.shape.numel() * DType::F32.size(),
                };
                [a, b]
                    .iter()
                    .filter(|o| matches!(o, Operand::Computed { .. }))
                    .map(|o| o.shape().numel() * DType::F32.size())
                    .sum::<usize>()
                    + product
            }
            KernelKind::Elementwise
            | KernelKind::Reduce { .. }
            | KernelKind::Scatter { .. }
            | KernelKind::Attention { .. } => 0,
        }
    }

    /// Whether the output can hold a matmul's f32 product until the
    /// epilogue overwrites it element by element: an output of elements of
    /// f32's size (a wider one would overwrite products not yet read, a
    /// narrower one, a bf16 product's rounding, not hold them). Else a
    /// backend that keeps the product in its output, as the CPU does, keeps
    /// it in scratch instead.
    pub fn holds_product(&self) -> bool {
        self.out.dtype.size() == DType::F32.size()
    }

    /// Checks the kernel against the types of its operands and returns its
    /// output type. A failure is a compiler bug, reported with what is wrong.
    pub(crate) fn check(&self, args: &[&TensorType]) -> Result<TensorType, Error> {
        self.check_parts(args).map_err(|message| Error::Malformed {
            op: "kernel",
            message,
        })?;
        Ok(self.out.clone())
    }

    /// The type of kernel input `input` read through `view` as an operand
    /// of `op` (a matmul's, an attention's): a declared input, an unmasked
    /// view inside it.
    fn operand_read(&self, op: &str, input: u32, view: &View) -> Result<TensorType, String> {
        let ty = (self.inputs.get(input as usize))
            .ok_or_else(|| format!("{op} reads input {input}, which is not declared"))?;
        if view.mask.is_some() {
            return Err(format!("{op} reads input {input} through padding"));
        }
        view.check(ty, &view.shape)?;
        Ok(TensorType::new(ty.dtype, view.shape.clone()))
    }

    fn check_parts(&self, args: &[&TensorType]) -> Result<(), String> {
        let declared: Vec<&TensorType> = self.inputs.iter().collect();
        if declared != args {
            return Err(format!(
                "declared inputs ({}) differ from operands ({})",
                join(&declared),
                join(args)
            ));
        }
        let acc = match &self.kind {
            KernelKind::Elementwise => None,
            KernelKind::Reduce {
                op,
                axes,
                shape,
                prologue,
            } => {
                prologue.check(shape, &self.inputs, None)?;
                let dtype = prologue.dtype().unwrap_or(DType::F32);
                let reduced = op
                    .infer(axes, &TensorType::new(dtype, shape.clone()))
                    .and_then(|t| t.checked(op.name()))
                    .map_err(|e| e.to_string())?;
                if self.out.shape != *shape && self.out.shape.numel() != reduced.shape.numel() {
                    return Err(format!(
                        "output {} is neither the space {shape} nor the reduced {} reshaped",
                        self.out.shape, reduced.shape
                    ));
                }
                Some(dtype)
            }
            KernelKind::Scatter {
                axis,
                shape,
                prologue,
                index,
            } => {
                prologue.check(shape, &self.inputs, None)?;
                let index_type = prologue.values.get(*index as usize).map(|v| v.dtype);
                if !matches!(index_type, Some(DType::I32 | DType::I64)) {
                    return Err(format!("a scatter indexes by value {index}, not an index"));
                }
                let (from, to) = (shape.dims(), self.out.shape.dims());
                let fits = *axis < from.len()
                    && from.len() == to.len()
                    && (0..from.len()).all(|a| a == *axis || from[a] == to[a]);
                if !fits {
                    return Err(format!(
                        "a scatter from {shape} along axis {axis} cannot write {}",
                        self.out.shape
                    ));
                }
                if self.body.values.len() != 1 || !self.side.is_empty() {
                    return Err("a scatter's body is acc alone".to_string());
                }
                Some(prologue.dtype().unwrap_or(DType::F32))
            }
            KernelKind::Attention { op, operands } => {
                let types = (operands.iter())
                    .map(|(input, view)| self.operand_read("attention", *input, view))
                    .collect::<Result<Vec<_>, String>>()?;
                let types: Vec<&TensorType> = types.iter().collect();
                if types.len() != op.arity() {
                    return Err(format!("an attention of {} operands", types.len()));
                }
                let result = op.infer(&types).map_err(|e| e.to_string())?;
                if result.shape != self.out.shape {
                    return Err(format!("an attention of {result} writes {}", self.out));
                }
                if self.body.values.len() != 1 || !self.side.is_empty() {
                    return Err("an attention's body is acc alone".to_string());
                }
                Some(DType::F32)
            }
            KernelKind::MatMul { a, b } => {
                let types: Vec<TensorType> = [a, b]
                    .iter()
                    .map(|operand| match operand {
                        Operand::Read { input, view } => self.operand_read("matmul", *input, view),
                        Operand::Merged { input, view, shape } => {
                            let ty = self.operand_read("matmul", *input, view)?;
                            if View::runs(&view.shape, shape).is_none() {
                                return Err(format!(
                                    "a matmul operand {shape} does not merge the axes of its view {}",
                                    view.shape
                                ));
                            }
                            Ok(TensorType::new(ty.dtype, shape.clone()))
                        }
                        Operand::Computed { shape, block } => {
                            block.check(shape, &self.inputs, None)?;
                            let dtype = block.dtype().unwrap_or(DType::F32);
                            Ok(TensorType::new(dtype, shape.clone()))
                        }
                    })
                    .collect::<Result<_, String>>()?;
                let product = infer_matmul(&types[0], &types[1])
                    .and_then(|t| t.checked("matmul"))
                    .map_err(|e| e.to_string())?;
                if product.shape.numel() != self.out.shape.numel() {
                    return Err(format!(
                        "matmul gives {} but the output is {}",
                        product.shape, self.out.shape
                    ));
                }
                // Where the product lands (the output, or apart from it) is
                // the backend's: its plan refuses an output that cannot hold
                // the product where it would put it there.
                Some(DType::F32)
            }
        };
        self.body.check(&self.out.shape, &self.inputs, acc)?;
        if self.body.dtype() != Some(self.out.dtype) {
            return Err(format!("the body does not yield {}", self.out.dtype));
        }
        if let KernelKind::Reduce { shape, .. } = &self.kind
            && !self.side.is_empty()
            && self.out.shape == *shape
        {
            return Err("a reduction broadcast back over its space has side outputs".to_string());
        }
        for (k, side) in self.side.iter().enumerate() {
            let dtype = self.body.values.get(side.value as usize).map(|v| v.dtype);
            if dtype != Some(self.out.dtype)
                || side.ty.dtype != self.out.dtype
                || side.ty.shape.numel() != self.out.shape.numel()
            {
                return Err(format!(
                    "side output {k} ({}, value {}) is not a value of the output's dtype and size {}",
                    side.ty, side.value, self.out
                ));
            }
        }
        Ok(())
    }
}

fn join(types: &[&TensorType]) -> String {
    let parts: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    parts.join(", ")
}
