//! kiln graphs out, as ONNX models: `export` traces a function as
//! `kiln::compile` does and writes what it recorded as a `ModelProto`,
//! the call's inputs as graph inputs, the tensors it captured (weights) as
//! initializers, one ONNX node (two for `ne` and `unfold`) per kiln node.
//!
//! The graph exported is the one traced, before the optimizer: every
//! graph op (`Op::layer` is `Graph`) but `uniform` has an ONNX op of the
//! same meaning, so the mapping is one to one and an ONNX runtime optimizes
//! it its own way. (ONNX's random ops take no key, so `uniform`, and a
//! graph with dropout in training mode, is an `OnnxError::Export`.) Reading the file back with `Model` gives kiln the same graph, up to
//! what ONNX spells otherwise: `ne` as `Not(Equal)`, `unfold` as a
//! `Gather` of the windows' positions and a `Transpose`, a slice of several
//! axes as one slice per axis, a no-op (a detach, an empty reduction) as
//! `Identity`, a captured rank-0 tensor as a constant. The optimizer's fused
//! layer (`view`, `kernel`, `side_output`) says how kiln's backends run a
//! graph, not what it computes, and has no ONNX op: exporting it is an
//! `OnnxError::Export` naming the node.
//!
//! Two meanings ONNX leaves to the runtime are kiln's in the file: a float
//! cast to an integer out of its range (kiln saturates) and `Max`/`Min`
//! of a NaN (kiln propagates it). Every dtype kiln's ops accept is one the
//! ONNX op's type constraints allow.

use std::path::Path;
use std::sync::Arc;

use kiln_ir::{BinaryOp, DType, Data, Graph, Op, ReduceOp, Scalar, TensorType, TrigOp, UnaryOp};

use super::OnnxError;
use super::proto::{
    AttributeProto, Dim, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfo, ValueType,
};
use super::tensor::{code, onnx_code};
use super::write::{self, kind};
use crate::tensor::{Source, capture_with_data};
use crate::{Result, Tensor};

/// The version of the default ONNX opset exported models import: 18, the
/// first in which every reduction takes its axes as an input.
pub const OPSET: i64 = 18;

/// The ONNX IR version that goes with `OPSET` (onnx 1.13).
const IR_VERSION: i64 = 8;

/// Traces `f` on placeholders of `specs`, as `kiln::compile` does, and
/// returns the ONNX model (the bytes of a `.onnx` file) of what it
/// computes: graph inputs `input_0`, `input_1`, ... of `specs`, in order;
/// outputs `output_0`, ... of the returned tensors; the realized tensors
/// `f` captures (weights) as initializers `param_0`, ... holding the
/// values they have now (a lazy one is exported as the ops computing it).
/// The shapes are static, as kiln compiles them: a model exported for a
/// batch of 1 takes batches of 1.
///
/// ```
/// use kiln::{DType, Tensor, TensorType};
/// use kiln::onnx::{Feed, Model};
/// # fn main() -> kiln::Result<()> {
/// let w = Tensor::randn([3, 2], 0)?;
/// let spec = TensorType::new(DType::F32, [4, 3]);
/// let bytes = kiln::onnx::export("layer", &[spec.clone()], |x| Ok(vec![x[0].matmul(&w)?.relu()?]))?;
/// // Any ONNX runtime reads it; so does kiln.
/// let model = Model::from_bytes(&bytes, "layer.onnx")?;
/// let mut layer = model.compile(&[Feed::Input(spec)])?;
/// let y = layer.call(&[&Tensor::randn([4, 3], 1)?])?;
/// assert_eq!(y[0].dims(), [4, 2]);
/// # Ok(())
/// # }
/// ```
pub fn export(
    name: &str,
    specs: &[TensorType],
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<u8>> {
    let placeholders: Vec<Tensor> = specs
        .iter()
        .enumerate()
        .map(|(i, ty)| Ok(Tensor::placeholder(ty.clone().checked("export")?, i)))
        .collect::<Result<_>>()?;
    let outputs = f(&placeholders)?;
    let refs: Vec<&Tensor> = outputs.iter().collect();
    let (graph, sources) = capture_with_data(name, &refs);
    // Captured values in host memory (copied out of a GPU).
    let captured: Vec<Arc<Data>> = (sources.iter())
        .filter_map(|s| match s {
            Source::Data(storage) => Some(storage.to_host()),
            Source::Placeholder(_) => None,
        })
        .collect::<std::result::Result<_, _>>()?;
    let mut captured = captured.iter();
    let inputs = sources
        .iter()
        .filter_map(|s| match s {
            Source::Placeholder(i) => Some(Bound::Input(*i)),
            Source::Data(_) => captured.next().map(|d| Bound::Data(d.as_ref())),
        })
        .collect();
    encode(&graph, specs, inputs)
}

/// `export`, writing the model to `path`.
pub fn export_file(
    path: impl AsRef<Path>,
    name: &str,
    specs: &[TensorType],
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<()> {
    let bytes = export(name, specs, f)?;
    let path = path.as_ref();
    std::fs::write(path, bytes).map_err(|e| {
        OnnxError::Io {
            file: path.display().to_string(),
            message: e.to_string(),
        }
        .into()
    })
}

/// The ONNX model of a graph of graph ops (one that `kiln::capture`
/// returns, or one built with `kiln_ir`): every graph input is an ONNX
/// graph input, `input_{index}`; the outputs are `output_0`, ....
pub fn export_graph(graph: &Graph) -> Result<Vec<u8>> {
    let inputs = (0..graph.inputs.len()).map(Bound::Input).collect();
    encode(graph, &graph.inputs, inputs)
}

/// What one input of the kiln graph becomes.
enum Bound<'a> {
    /// Graph input `input_{i}`, of the declared input `i`.
    Input(usize),
    /// An initializer holding the data.
    Data(&'a Data),
}

/// The model of `graph`, whose input `k` is `bound[k]` (one per declared
/// input of the graph), declaring the ONNX graph inputs `declared`.
fn encode(graph: &Graph, declared: &[TensorType], bound: Vec<Bound>) -> Result<Vec<u8>> {
    // A graph built by hand may break the arena's rules; one that does is
    // an `Err` here, not a panic below.
    kiln_ir::verify(graph)?;
    let mut b = Builder {
        graph: &graph.name,
        names: Vec::with_capacity(graph.nodes.len()),
        proto: GraphProto {
            // onnx's checker requires a graph to have a name.
            name: match graph.name.as_str() {
                "" => "kiln".to_string(),
                name => name.to_string(),
            },
            ..GraphProto::default()
        },
    };
    for (i, ty) in declared.iter().enumerate() {
        b.proto.inputs.push(value_info(format!("input_{i}"), ty));
    }
    // An output gets its producer's value under its own name, unless that
    // value is an input or another output already: then an `Identity`.
    let mut output_of = vec![None; graph.nodes.len()];
    for (k, id) in graph.outputs.iter().enumerate() {
        let node = graph.node(*id);
        if output_of[id.index()].is_none() && !matches!(node.op, Op::Input { .. }) {
            output_of[id.index()] = Some(k);
        }
    }
    let mut params = 0;
    for (id, node) in graph.nodes.iter().enumerate() {
        let name = match (&node.op, output_of[id]) {
            // `verify` checked that the index is a declared input's.
            (Op::Input { index }, _) => match bound[*index as usize] {
                Bound::Input(i) => format!("input_{i}"),
                Bound::Data(data) => {
                    let name = format!("param_{params}");
                    params += 1;
                    b.proto
                        .initializers
                        .push(tensor(&name, node.ty.shape.dims(), data));
                    name
                }
            },
            (_, Some(k)) => format!("output_{k}"),
            (op, None) => format!("{}_{id}", op.name()),
        };
        b.names.push(name);
        b.convert(graph, id)?;
    }
    for (k, id) in graph.outputs.iter().enumerate() {
        let out = format!("output_{k}");
        if b.names[id.index()] != out {
            b.push("Identity", vec![b.names[id.index()].clone()], out.clone());
        }
        b.proto.outputs.push(value_info(out, &graph.node(*id).ty));
    }
    let model = ModelProto {
        opsets: vec![(String::new(), OPSET)],
        graph: b.proto,
        functions: 0,
    };
    Ok(write::model(&model, IR_VERSION))
}

/// The ONNX graph being built, and the value name of each kiln node.
struct Builder<'a> {
    graph: &'a str,
    names: Vec<String>,
    proto: GraphProto,
}

impl Builder<'_> {
    fn error(&self, id: usize, op: &str, what: &str) -> crate::Error {
        OnnxError::Export {
            graph: self.graph.to_string(),
            node: format!("#{id}"),
            op: op.to_string(),
            what: what.to_string(),
        }
        .into()
    }

    /// Appends node `op` from `inputs` to `output`, and returns it for its
    /// attributes.
    fn push(&mut self, op: &str, inputs: Vec<String>, output: String) -> &mut NodeProto {
        self.proto.nodes.push(NodeProto {
            op_type: op.to_string(),
            inputs,
            outputs: vec![output],
            ..NodeProto::default()
        });
        let last = self.proto.nodes.len() - 1;
        &mut self.proto.nodes[last]
    }

    /// An INT64 initializer of `values`, named `name`.
    fn ints(&mut self, name: String, values: impl IntoIterator<Item = usize>) -> String {
        let raw: Vec<u8> = values
            .into_iter()
            .flat_map(|v| (v as i64).to_le_bytes())
            .collect();
        self.proto.initializers.push(TensorProto {
            name: name.clone(),
            dims: vec![(raw.len() / 8) as i64],
            data_type: code::INT64,
            raw_data: Some(raw),
            ..TensorProto::default()
        });
        name
    }

    /// The ONNX nodes of kiln node `id`, whose value name is already set.
    fn convert(&mut self, graph: &Graph, id: usize) -> Result<()> {
        let node = &graph.nodes[id];
        let args: Vec<String> = (node.inputs.iter())
            .map(|i| self.names[i.index()].clone())
            .collect();
        let out = self.names[id].clone();
        match &node.op {
            Op::Input { .. } => {}
            Op::Const(s) => {
                let value = tensor("", &[], &scalar_data(*s));
                self.push("Constant", args, out)
                    .attributes
                    .push(tensor_attr("value", value));
            }
            Op::Unary(u) => {
                self.push(unary(*u), args, out);
            }
            // ONNX's random ops take no key: their draws are the runtime's.
            Op::Binary(BinaryOp::Uniform) => {
                return Err(self.error(
                    id,
                    "uniform",
                    "keyed random numbers have no ONNX op; export without dropout (eval mode)",
                ));
            }
            Op::Binary(BinaryOp::Ne) => {
                let eq = format!("{out}_eq");
                self.push("Equal", args, eq.clone());
                self.push("Not", vec![eq], out);
            }
            Op::Binary(op) => {
                let node = self.push(binary(*op), args, out);
                if *op == BinaryOp::Rem {
                    // C's remainder, the dividend's sign (floats require it).
                    node.attributes.push(int_attr("fmod", 1));
                }
            }
            Op::Where => {
                self.push("Where", args, out);
            }
            // The same rule: equal shapes off the axis, negative indices
            // from the end. (ONNX leaves an index outside the axis an
            // error where kiln reads the gather's fill.)
            Op::Gather { axis } => {
                self.push("GatherElements", args, out)
                    .attributes
                    .push(int_attr("axis", *axis as i64));
            }
            // Added into zeros of the output's shape.
            Op::ScatterAdd { axis, .. } => {
                let shape = self.ints(format!("{out}_shape"), node.ty.shape.dims().iter().copied());
                let zero = Scalar::I32(0).cast(node.ty.dtype);
                let zeros = format!("{out}_zeros");
                self.push("ConstantOfShape", vec![shape], zeros.clone())
                    .attributes
                    .push(tensor_attr("value", tensor("", &[1], &scalar_data(zero))));
                let inputs = vec![zeros, args[1].clone(), args[0].clone()];
                let scatter = self.push("ScatterElements", inputs, out);
                scatter.attributes.push(int_attr("axis", *axis as i64));
                scatter.attributes.push(AttributeProto {
                    name: "reduction".to_string(),
                    kind: kind::STRING,
                    s: b"add".to_vec(),
                    ..AttributeProto::default()
                });
            }
            Op::Cast(to) => {
                let to = onnx_code(*to);
                self.push("Cast", args, out)
                    .attributes
                    .push(int_attr("to", to));
            }
            Op::Reshape(shape) => {
                let dims = shape.dims();
                let shape = self.ints(format!("{out}_shape"), dims.iter().copied());
                let node = self.push("Reshape", vec![args[0].clone(), shape], out);
                // Without `allowzero` ONNX reads a 0 as "copy the input's size".
                if dims.contains(&0) {
                    node.attributes.push(int_attr("allowzero", 1));
                }
            }
            Op::Permute(perm) if perm.iter().enumerate().all(|(i, &p)| i == p) => {
                self.push("Identity", args, out);
            }
            Op::Permute(perm) => {
                let perm = perm.iter().map(|&p| p as i64).collect();
                self.push("Transpose", args, out)
                    .attributes
                    .push(ints_attr("perm", perm));
            }
            Op::Expand(shape) => {
                let shape = self.ints(format!("{out}_shape"), shape.dims().iter().copied());
                self.push("Expand", vec![args[0].clone(), shape], out);
            }
            Op::Slice(ranges) => {
                let dims = graph.node(node.inputs[0]).ty.shape.dims();
                // Only the axes the slice narrows.
                let sliced: Vec<usize> = (0..ranges.len())
                    .filter(|&a| {
                        let r = ranges[a];
                        (r.start, r.end, r.step) != (0, dims[a], 1)
                    })
                    .collect();
                if sliced.is_empty() {
                    self.push("Identity", args, out);
                    return Ok(());
                }
                let starts = self.ints(
                    format!("{out}_starts"),
                    sliced.iter().map(|&a| ranges[a].start),
                );
                let ends = self.ints(format!("{out}_ends"), sliced.iter().map(|&a| ranges[a].end));
                let axes = self.ints(format!("{out}_axes"), sliced.iter().copied());
                let steps = self.ints(
                    format!("{out}_steps"),
                    sliced.iter().map(|&a| ranges[a].step),
                );
                self.push(
                    "Slice",
                    vec![args[0].clone(), starts, ends, axes, steps],
                    out,
                );
            }
            Op::Unfold { axis, size, step } => {
                // ONNX has no windows op: a `Gather` along the axis by the
                // `[windows, size]` matrix of positions `i * step + j`, then
                // the window axis moved last.
                let (axis, size, step) = (*axis, *size, *step);
                let windows = node.ty.shape.dims()[axis];
                let positions = (0..windows).flat_map(|i| (0..size).map(move |j| i * step + j));
                let indices = self.ints(format!("{out}_positions"), positions);
                if let Some(init) = self.proto.initializers.last_mut() {
                    init.dims = vec![windows as i64, size as i64];
                }
                let gathered = format!("{out}_gathered");
                self.push("Gather", vec![args[0].clone(), indices], gathered.clone())
                    .attributes
                    .push(int_attr("axis", axis as i64));
                let rank = node.ty.shape.rank();
                let perm = (0..rank)
                    .filter(|&p| p != axis + 1)
                    .chain([axis + 1])
                    .map(|p| p as i64)
                    .collect();
                self.push("Transpose", vec![gathered], out)
                    .attributes
                    .push(ints_attr("perm", perm));
            }
            Op::Pad { pads, value } => {
                let list = pads.iter().map(|p| p.0).chain(pads.iter().map(|p| p.1));
                let pads = self.ints(format!("{out}_pads"), list);
                let name = format!("{out}_value");
                self.proto
                    .initializers
                    .push(tensor(&name, &[], &scalar_data(*value)));
                self.push("Pad", vec![args[0].clone(), pads, name], out);
            }
            Op::Reduce { axes, .. } if axes.is_empty() => {
                self.push("Identity", args, out);
            }
            // The one reduction ONNX types narrower than kiln: no UINT8 product.
            Op::Reduce {
                op: ReduceOp::Prod, ..
            } if node.ty.dtype == DType::U8 => {
                return Err(self.error(
                    id,
                    node.op.name(),
                    "ONNX's ReduceProd takes no UINT8: cast to i32, multiply, cast back",
                ));
            }
            Op::Reduce { op, axes } => {
                let axes = self.ints(format!("{out}_axes"), axes.iter().copied());
                let op = match op {
                    ReduceOp::Sum => "ReduceSum",
                    ReduceOp::Max => "ReduceMax",
                    ReduceOp::Prod => "ReduceProd",
                };
                // `keepdims` is 1 by default, as kiln keeps reduced axes.
                self.push(op, vec![args[0].clone(), axes], out);
            }
            Op::MatMul => {
                self.push("MatMul", args, out);
            }
            Op::Attention(_) | Op::View(_) | Op::Kernel(_) | Op::SideOutput(_) => {
                return Err(self.error(
                    id,
                    node.op.name(),
                    "an optimized graph's op has no ONNX op; export the graph before the optimizer",
                ));
            }
        }
        Ok(())
    }
}

/// The ONNX op of a kiln unary op.
fn unary(op: UnaryOp) -> &'static str {
    match op {
        UnaryOp::Neg => "Neg",
        UnaryOp::Exp => "Exp",
        UnaryOp::Log => "Log",
        UnaryOp::Sqrt => "Sqrt",
        UnaryOp::Recip => "Reciprocal",
        UnaryOp::Relu => "Relu",
        UnaryOp::Sigmoid => "Sigmoid",
        UnaryOp::Tanh => "Tanh",
        UnaryOp::Trig(t) => trig(t),
        UnaryOp::Abs => "Abs",
        // Only gradients see a detach; the value passes unchanged.
        UnaryOp::Detach => "Identity",
    }
}

/// The ONNX op of a trigonometric or hyperbolic function.
fn trig(op: TrigOp) -> &'static str {
    match op {
        TrigOp::Sin => "Sin",
        TrigOp::Cos => "Cos",
        TrigOp::Tan => "Tan",
        TrigOp::Asin => "Asin",
        TrigOp::Acos => "Acos",
        TrigOp::Atan => "Atan",
        TrigOp::Sinh => "Sinh",
        TrigOp::Cosh => "Cosh",
        TrigOp::Asinh => "Asinh",
        TrigOp::Acosh => "Acosh",
        TrigOp::Atanh => "Atanh",
    }
}

/// The ONNX op of a kiln binary op other than `ne` (`Equal` then `Not`).
fn binary(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "Add",
        BinaryOp::Sub => "Sub",
        BinaryOp::Mul => "Mul",
        BinaryOp::Div => "Div",
        BinaryOp::Max => "Max",
        BinaryOp::Min => "Min",
        BinaryOp::Pow => "Pow",
        BinaryOp::Rem => "Mod",
        BinaryOp::Lt => "Less",
        BinaryOp::Le => "LessOrEqual",
        BinaryOp::Gt => "Greater",
        BinaryOp::Ge => "GreaterOrEqual",
        BinaryOp::Eq | BinaryOp::Ne => "Equal",
        // `convert` refuses it before asking.
        BinaryOp::Uniform => "",
    }
}

/// One element of `s`'s dtype.
fn scalar_data(s: Scalar) -> Data {
    match s {
        Scalar::F32(v) => Data::F32(vec![v]),
        Scalar::I32(v) => Data::I32(vec![v]),
        Scalar::I64(v) => Data::I64(vec![v]),
        Scalar::F64(v) => Data::F64(vec![v]),
        Scalar::U8(v) => Data::U8(vec![v]),
        Scalar::Bool(v) => Data::Bool(vec![v]),
        Scalar::BF16(v) => Data::BF16(vec![v]),
        Scalar::F16(v) => Data::F16(vec![v]),
    }
}

/// A tensor of `data` under `dims`, its elements little-endian in
/// `raw_data`, bools one byte each.
fn tensor(name: &str, dims: &[usize], data: &Data) -> TensorProto {
    let raw: Vec<u8> = match data {
        Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::U8(v) => v.clone(),
        Data::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
        Data::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    TensorProto {
        name: name.to_string(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: onnx_code(data.dtype()),
        raw_data: Some(raw),
        ..TensorProto::default()
    }
}

/// A graph input's or output's name and static type.
fn value_info(name: String, ty: &TensorType) -> ValueInfo {
    ValueInfo {
        name,
        ty: ValueType::Tensor {
            elem_type: onnx_code(ty.dtype),
            dims: Some(
                ty.shape
                    .dims()
                    .iter()
                    .map(|&d| Dim::Value(d as i64))
                    .collect(),
            ),
        },
    }
}

fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.to_string(),
        kind: kind::INT,
        i,
        ..AttributeProto::default()
    }
}

fn ints_attr(name: &str, ints: Vec<i64>) -> AttributeProto {
    AttributeProto {
        name: name.to_string(),
        kind: kind::INTS,
        ints,
        ..AttributeProto::default()
    }
}

fn tensor_attr(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        name: name.to_string(),
        kind: kind::TENSOR,
        t: Some(t),
        ..AttributeProto::default()
    }
}
