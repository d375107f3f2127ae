//! `kiln::onnx`: ONNX models in, as kiln graphs, and kiln functions out,
//! as ONNX models.
//!
//! `Model::load` reads a `.onnx` file; `Model::compile` traces its graph
//! into kiln ops (through `kiln::compile_with`) with the initializers as
//! constants and the graph inputs as the compiled graph's inputs. Each ONNX
//! node becomes kiln's existing graph ops and composites (`ops`); a node
//! kiln cannot express, an attribute it does not read, or a data type it
//! does not hold is an `OnnxError::Unsupported` naming the node, the op and
//! what is missing, never a panic and never a silently different answer.
//!
//! ONNX's INT64 and DOUBLE are kiln's i64 and f64: graph inputs and
//! outputs of those types are real tensors fed and returned at run time
//! (an embedding's token ids, ArgMax's indices). Shapes, axes and pads must
//! be known while tracing, as kiln compiles for static shapes: they come
//! from initializers, `Constant` nodes, `Shape` of a static shape, the
//! shape computations `fold` folds, or graph inputs the caller binds to
//! values (`Feed::Constant`). A shape computed at run time is refused.
//!
//! The protobuf is decoded by a small reader of the wire format (`wire`)
//! and of the messages kiln reads (`proto`), not by generated code: no
//! `protoc`, no build script and no dependency (so no cargo feature is
//! needed and `cargo test --workspace` covers it), a reader that skips
//! every field kiln does not use, and errors that name the file, the byte
//! offset and the message where a truncated or corrupt file breaks, which
//! prost's `DecodeError` cannot. The field numbers are those of onnx.proto
//! of onnx 1.22.0; the conformance run (`tests/onnx_node.rs`) decodes every
//! model and tensor of that release's backend tests.
//!
//! `export` goes the other way: it traces a function as `kiln::compile`
//! does and writes its graph as an ONNX model of opset `OPSET`, by a small
//! writer of the same messages (`write`); `export` says how kiln's ops map.

mod export;
mod graph;
mod ops;
mod proto;
mod tensor;
mod wire;
mod write;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;
use std::sync::Mutex;

use kiln_ir::{DType, TensorType};

use crate::{CompileOptions, CompiledGraph, Device, Error, Result, Tensor};

pub use export::{OPSET, export, export_file, export_graph};
pub use tensor::Array;

/// What can be wrong with an ONNX file, or be missing in kiln to run it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OnnxError {
    /// The file could not be read.
    #[error("{file}: {message}")]
    Io {
        /// The file.
        file: String,
        /// The system's message.
        message: String,
    },
    /// The file is not a valid protobuf of the expected message.
    #[error("{file}: byte {offset}: {message}")]
    Decode {
        /// The file.
        file: String,
        /// Where the broken record starts.
        offset: usize,
        /// What is wrong, naming the message.
        message: String,
    },
    /// A tensor whose type or storage kiln cannot read.
    #[error("{file}: tensor '{name}' is unsupported: {what}")]
    Tensor {
        /// The file.
        file: String,
        /// The tensor's name.
        name: String,
        /// What kiln lacks.
        what: String,
    },
    /// A graph whose inputs, outputs or structure kiln cannot run.
    #[error("{file}: unsupported: {what}")]
    Graph {
        /// The file.
        file: String,
        /// What kiln lacks.
        what: String,
    },
    /// A node kiln cannot express: its op, an attribute, an input's type.
    #[error("{file}: node {node} ({op}): unsupported: {what}")]
    Unsupported {
        /// The file.
        file: String,
        /// The node's name, or its index and first output.
        node: String,
        /// The op type.
        op: String,
        /// What kiln lacks.
        what: String,
    },
    /// A node that breaks ONNX's rules (a missing input, a bad attribute),
    /// or the kiln error its ops raised.
    #[error("{file}: node {node} ({op}): {message}")]
    Node {
        /// The file.
        file: String,
        /// The node's name, or its index and first output.
        node: String,
        /// The op type.
        op: String,
        /// What is wrong.
        message: String,
    },
    /// A graph output kiln computed with another type or shape than the
    /// model declares: a mistake in kiln's mapping of some op.
    #[error("{file}: {message}")]
    Output {
        /// The file.
        file: String,
        /// What differs.
        message: String,
    },
    /// Feeds that do not fit the graph's inputs.
    #[error("{file}: {message}")]
    Feed {
        /// The file.
        file: String,
        /// What does not fit.
        message: String,
    },
    /// A kiln node that `export` cannot write as ONNX.
    #[error("export of graph '{graph}': node {node} ({op}): {what}")]
    Export {
        /// The kiln graph's name.
        graph: String,
        /// The node, by its index in the graph.
        node: String,
        /// The kiln op.
        op: String,
        /// Why it has no ONNX form.
        what: String,
    },
}

impl OnnxError {
    /// Whether the error says kiln lacks something (an op, an attribute,
    /// a dtype, an ONNX form of its own op), as opposed to a broken file
    /// or a mistake.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            OnnxError::Tensor { .. }
                | OnnxError::Graph { .. }
                | OnnxError::Unsupported { .. }
                | OnnxError::Export { .. }
        )
    }
}

/// How one graph input is given to `Model::compile`.
#[derive(Clone, Debug)]
pub enum Feed {
    /// An input of the compiled graph, of this type, given at each call.
    Input(TensorType),
    /// A value fixed now: how a shape, axes or pads passed as an input
    /// reach kiln, which must know them while compiling.
    Constant(Array),
}

/// A graph input as the model declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct InputInfo {
    /// The input's name.
    pub name: String,
    /// The ONNX name of its element type (`FLOAT`, `INT64`, ...), or what
    /// else it is (`a sequence`).
    pub dtype: String,
    /// Whether it is a tensor (not a sequence, map or optional).
    pub tensor: bool,
    /// The kiln element type, where kiln has the input's.
    pub element: Option<DType>,
    /// The kiln type, where the element type is kiln's and every
    /// dimension is fixed.
    pub ty: Option<TensorType>,
    /// Its dimensions, where the model declares them: a size, or the name
    /// of a dimension fixed only when the model runs (`batch`, from an
    /// export with dynamic axes; empty where it has no name).
    pub dims: Option<Vec<Dimension>>,
}

/// A dimension of a graph input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dimension {
    /// A fixed size.
    Fixed(usize),
    /// A size the model leaves open, by its name (empty where it has none).
    Named(String),
}

impl InputInfo {
    /// The kiln type of the input with each named dimension given the size
    /// `sizes` names for it (`[("batch", 32)]`): what to feed a model
    /// exported with dynamic axes. `None` where the element type is not
    /// kiln's, the model declares no dimensions, or a named one (or one
    /// with no name) is not in `sizes`.
    pub fn fixed(&self, sizes: &[(&str, usize)]) -> Option<TensorType> {
        let dims = (self.dims.as_ref()?.iter())
            .map(|d| match d {
                Dimension::Fixed(n) => Some(*n),
                Dimension::Named(name) => sizes.iter().find(|(s, _)| s == name).map(|&(_, n)| n),
            })
            .collect::<Option<Vec<usize>>>()?;
        Some(TensorType::new(self.element?, dims))
    }
}

/// An ONNX model, decoded.
pub struct Model {
    proto: proto::ModelProto,
    file: String,
    /// The graph's inputs as `inputs` gives them, read once.
    declared: Vec<InputInfo>,
    /// The graphs `call` compiled, by the types of their inputs and the
    /// device.
    compiled: Mutex<HashMap<(Vec<TensorType>, Device), CompiledGraph>>,
}

impl Model {
    /// Reads and decodes a `.onnx` file, and the payloads of its tensors
    /// stored outside it (ONNX's external data, what `torch.onnx.export`
    /// writes by default: files beside the model, named relative to its
    /// folder).
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        let path = path.as_ref();
        let bytes = read(path)?;
        let mut model = Model::from_bytes(&bytes, &path.display().to_string())?;
        let folder = path.parent().unwrap_or(Path::new(""));
        tensor::read_external(&mut model.proto.graph, folder, &model.file)?;
        Ok(model)
    }

    /// Decodes a model from its bytes; `file` names it in errors. A tensor
    /// stored outside the model (external data) is an `Err` when used:
    /// `load` reads it from beside the model's file.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<Model> {
        let proto = proto::model(bytes).map_err(|e| decode_error(file, e))?;
        let declared = graph::real_inputs(&proto.graph)
            .map(|v| InputInfo {
                name: v.name.clone(),
                dtype: graph::type_name(&v.ty),
                tensor: matches!(v.ty, proto::ValueType::Tensor { .. }),
                element: graph::element(&v.ty),
                ty: graph::static_type(&v.ty),
                dims: graph::dimensions(&v.ty),
            })
            .collect();
        Ok(Model {
            proto,
            file: file.to_string(),
            declared,
            compiled: Mutex::new(HashMap::new()),
        })
    }

    /// The graph's inputs, in order, without the initializers that old
    /// models also list as inputs.
    pub fn inputs(&self) -> Vec<InputInfo> {
        self.declared.clone()
    }

    /// The op types the graph's nodes use, each once, in order of first use.
    pub fn op_types(&self) -> Vec<String> {
        let mut ops: Vec<String> = Vec::new();
        for node in &self.proto.graph.nodes {
            if !ops.contains(&node.op_type) {
                ops.push(node.op_type.clone());
            }
        }
        ops
    }

    /// The names of the graph's outputs, in order.
    pub fn output_names(&self) -> Vec<String> {
        let outputs = &self.proto.graph.outputs;
        outputs.iter().map(|v| v.name.clone()).collect()
    }

    /// Runs the model on `inputs`, one per graph input (`inputs`), on their
    /// device, compiling it for their types on first use and reusing that
    /// graph for inputs of the same types after: one `Model` serves every
    /// batch size of an export with dynamic axes. An input whose dtype, rank
    /// or a fixed dimension is not the model's, or a named dimension given
    /// two sizes, is an `Err` naming the input and the dimension. Calls take
    /// turns (compiling and running under one lock), and every set of types
    /// met keeps its compiled graph for the model's life.
    pub fn call(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let declared = &self.declared;
        let mismatch = |message: String| -> crate::Error {
            OnnxError::Feed {
                file: self.file.clone(),
                message,
            }
            .into()
        };
        if inputs.len() != declared.len() {
            return Err(mismatch(format!(
                "{} inputs for {} graph inputs",
                inputs.len(),
                declared.len()
            )));
        }
        let mut named: Vec<(&str, usize)> = Vec::new();
        for (info, t) in declared.iter().zip(inputs) {
            let given = || format!("input '{}' given {}", info.name, t.ty());
            if info.element != Some(t.dtype()) {
                return Err(mismatch(format!("{}, declared {}", given(), info.dtype)));
            }
            let Some(dims) = &info.dims else { continue };
            if dims.len() != t.rank() {
                return Err(mismatch(format!(
                    "{}, declared of rank {}",
                    given(),
                    dims.len()
                )));
            }
            for (axis, (d, &n)) in dims.iter().zip(t.dims()).enumerate() {
                match d {
                    Dimension::Fixed(size) if *size != n => {
                        return Err(mismatch(format!("{}: dimension {axis} is {size}", given())));
                    }
                    Dimension::Named(name) if !name.is_empty() => {
                        match named.iter().find(|(m, _)| m == name) {
                            Some(&(_, size)) if size != n => {
                                return Err(mismatch(format!(
                                    "{}: dimension {axis} is '{name}', {size} elsewhere",
                                    given()
                                )));
                            }
                            Some(_) => {}
                            None => named.push((name, n)),
                        }
                    }
                    _ => {}
                }
            }
        }
        let device = inputs.first().map_or(Device::Cpu, |t| t.device());
        let key = (
            inputs.iter().map(|t| t.ty().clone()).collect::<Vec<_>>(),
            device,
        );
        // A poisoned lock held compiled graphs only: they are whole.
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        let graph = match compiled.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let feeds: Vec<Feed> = e.key().0.iter().cloned().map(Feed::Input).collect();
                e.insert(self.compile_with(&feeds, CompileOptions::on(device))?)
            }
        };
        graph.call(inputs)
    }

    /// Compiles the graph for the CPU with fusion on; `feeds` gives every
    /// input (see `inputs`), and the compiled graph takes those fed as
    /// `Feed::Input`, in order.
    pub fn compile(&self, feeds: &[Feed]) -> Result<CompiledGraph> {
        self.compile_with(feeds, CompileOptions::default())
    }

    /// `compile` where and how `options` says.
    pub fn compile_with(&self, feeds: &[Feed], options: CompileOptions) -> Result<CompiledGraph> {
        let specs: Vec<TensorType> = feeds
            .iter()
            .filter_map(|f| match f {
                Feed::Input(ty) => Some(ty.clone()),
                Feed::Constant(_) => None,
            })
            .collect();
        let name = match self.proto.graph.name.as_str() {
            "" => "onnx",
            name => name,
        };
        crate::compile_with(name, &specs, options, |placeholders| {
            graph::trace(&self.proto, &self.file, feeds, placeholders)
        })
    }
}

/// Reads a `.pb` file of one `TensorProto`, as ONNX's tests store their
/// inputs and expected outputs.
pub fn read_array(path: impl AsRef<Path>) -> Result<Array> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let bytes = read(path)?;
    let proto = proto::tensor_at(&bytes, 0).map_err(|e| decode_error(&file, e))?;
    Ok(tensor::array(&proto, &file)?)
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        OnnxError::Io {
            file: path.display().to_string(),
            message: e.to_string(),
        }
        .into()
    })
}

fn decode_error(file: &str, e: wire::DecodeError) -> Error {
    OnnxError::Decode {
        file: file.to_string(),
        offset: e.offset,
        message: e.message,
    }
    .into()
}

#[cfg(test)]
mod tests;
