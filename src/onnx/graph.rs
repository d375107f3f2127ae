//! Tracing an ONNX graph into kiln tensors: the values by name, each node's
//! inputs and attributes as `Node` hands them to the op mappings, and the
//! checks of the graph's inputs and outputs against what kiln holds.

use std::cell::RefCell;
use std::collections::HashMap;

use kiln_ir::{DType, TensorType};

use super::proto::{AttributeProto, Dim, GraphProto, ModelProto, NodeProto, ValueInfo, ValueType};
use super::tensor::{self, Array, dtype_name, kiln_dtype, onnx_code};
use super::{Dimension, Feed, OnnxError, ops};
use crate::{Error, Result, Tensor};

/// A value of the graph: a kiln tensor, or a constant known while tracing.
#[derive(Clone)]
pub(super) enum Value {
    Tensor(Tensor),
    /// A constant of the model: an initializer, a `Constant`, a static
    /// shape, or what `fold` computed from those.
    Known(Array),
    /// A graph input bound by `Feed::Constant`, or values moved out of
    /// one. It may be reshaped, sliced, gathered and read as a shape, axes
    /// or indices, but never computed on while tracing: computing on an
    /// input is kiln's work, done on the constant as a tensor.
    Bound(Array),
}

impl Value {
    /// The dimensions.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Value::Tensor(t) => t.dims().to_vec(),
            Value::Known(a) | Value::Bound(a) => a.dims.clone(),
        }
    }

    /// The array, for a value known while tracing.
    pub fn array(&self) -> Option<&Array> {
        match self {
            Value::Tensor(_) => None,
            Value::Known(a) | Value::Bound(a) => Some(a),
        }
    }
}

/// The graph inputs that are not initializers.
pub(super) fn real_inputs(graph: &GraphProto) -> impl Iterator<Item = &ValueInfo> {
    graph
        .inputs
        .iter()
        .filter(|v| !graph.initializers.iter().any(|t| t.name == v.name))
}

/// The ONNX name of a value's type, for errors and `InputInfo`.
pub(super) fn type_name(ty: &ValueType) -> String {
    match ty {
        ValueType::Tensor { elem_type, .. } => dtype_name(*elem_type).to_string(),
        ValueType::Other(what) => what.to_string(),
        ValueType::Missing => "no type".to_string(),
    }
}

/// An input as the model declares it, for errors: `'x': FLOAT [batch, 3]`.
fn declared(v: &ValueInfo) -> String {
    let dims = match dimensions(&v.ty) {
        Some(dims) => {
            let dims: Vec<String> = (dims.iter())
                .map(|d| match d {
                    Dimension::Fixed(n) => n.to_string(),
                    Dimension::Named(name) if name.is_empty() => "?".to_string(),
                    Dimension::Named(name) => name.clone(),
                })
                .collect();
            format!(" [{}]", dims.join(", "))
        }
        None => String::new(),
    };
    format!("'{}': {}{dims}", v.name, type_name(&v.ty))
}

/// The kiln element type of a value type, where it is a tensor of one.
pub(super) fn element(ty: &ValueType) -> Option<DType> {
    match ty {
        ValueType::Tensor { elem_type, .. } => kiln_dtype(*elem_type),
        ValueType::Other(_) | ValueType::Missing => None,
    }
}

/// The dimensions a value type declares, sizes and names.
pub(super) fn dimensions(ty: &ValueType) -> Option<Vec<Dimension>> {
    let ValueType::Tensor {
        dims: Some(dims), ..
    } = ty
    else {
        return None;
    };
    let dimension = |d: &Dim| match d {
        Dim::Value(v) => usize::try_from(*v).ok().map(Dimension::Fixed),
        Dim::Symbolic(name) => Some(Dimension::Named(name.clone())),
    };
    dims.iter().map(dimension).collect()
}

/// The kiln type of a value type, where its element type is kiln's and
/// every dimension is fixed.
pub(super) fn static_type(ty: &ValueType) -> Option<TensorType> {
    let ValueType::Tensor {
        elem_type,
        dims: Some(dims),
    } = ty
    else {
        return None;
    };
    let dims = dims
        .iter()
        .map(|d| match d {
            Dim::Value(v) => usize::try_from(*v).ok(),
            Dim::Symbolic(_) => None,
        })
        .collect::<Option<Vec<usize>>>()?;
    Some(TensorType::new(kiln_dtype(*elem_type)?, dims))
}

/// The version of the default ONNX opset the model imports.
fn onnx_opset(model: &ModelProto, file: &str) -> Result<i64> {
    model
        .opsets
        .iter()
        .find(|(domain, _)| domain.is_empty() || domain == "ai.onnx")
        .map(|&(_, v)| v)
        .ok_or_else(|| {
            OnnxError::Graph {
                file: file.to_string(),
                what: "the model imports no version of the default ONNX opset".into(),
            }
            .into()
        })
}

/// Traces the graph on `placeholders` (one per `Feed::Input`, in order)
/// and returns its outputs as kiln tensors.
pub(super) fn trace(
    model: &ModelProto,
    file: &str,
    feeds: &[Feed],
    placeholders: &[Tensor],
) -> Result<Vec<Tensor>> {
    let graph = &model.graph;
    let graph_error = |what: String| -> Error {
        OnnxError::Graph {
            file: file.to_string(),
            what,
        }
        .into()
    };
    let feed_error = |message: String| -> Error {
        OnnxError::Feed {
            file: file.to_string(),
            message,
        }
        .into()
    };
    let opset = onnx_opset(model, file)?;
    if graph.sparse_initializers > 0 {
        return Err(graph_error("sparse initializers".into()));
    }
    for info in &graph.outputs {
        match &info.ty {
            ValueType::Tensor { elem_type, .. } if kiln_dtype(*elem_type).is_none() => {
                return Err(graph_error(format!(
                    "output '{}' is {}, which kiln cannot return",
                    info.name,
                    dtype_name(*elem_type)
                )));
            }
            ValueType::Other(what) => {
                return Err(graph_error(format!("output '{}' is {what}", info.name)));
            }
            _ => {}
        }
    }
    let mut values: HashMap<&str, Value> = HashMap::new();
    for t in &graph.initializers {
        values.insert(&t.name, Value::Known(tensor::array(t, file)?));
    }
    let inputs: Vec<&ValueInfo> = real_inputs(graph).collect();
    if feeds.len() != inputs.len() {
        let declared: Vec<String> = inputs.iter().map(|v| declared(v)).collect();
        let named = inputs
            .iter()
            .flat_map(|v| dimensions(&v.ty).unwrap_or_default());
        let hint = match named.into_iter().any(|d| matches!(d, Dimension::Named(_))) {
            true => {
                "; a named dimension is fixed only when the model runs: InputInfo::fixed gives it a size"
            }
            false => "",
        };
        return Err(feed_error(format!(
            "{} feeds for {} graph inputs ({}){hint}",
            feeds.len(),
            inputs.len(),
            declared.join(", ")
        )));
    }
    let mut placeholders = placeholders.iter();
    for (info, feed) in inputs.iter().zip(feeds) {
        let ValueType::Tensor { elem_type, .. } = info.ty else {
            return Err(graph_error(format!(
                "input '{}' is {}, not a tensor",
                info.name,
                type_name(&info.ty)
            )));
        };
        let value = match feed {
            Feed::Input(ty) => {
                if kiln_dtype(elem_type) != Some(ty.dtype) {
                    return Err(match kiln_dtype(elem_type) {
                        None => graph_error(format!(
                            "input '{}' is {}, which kiln cannot take at run time",
                            info.name,
                            dtype_name(elem_type)
                        )),
                        Some(_) => feed_error(format!(
                            "input '{}' is {}, fed as {}",
                            info.name,
                            dtype_name(elem_type),
                            ty.dtype
                        )),
                    });
                }
                let placeholder = placeholders
                    .next()
                    .ok_or_else(|| feed_error("fewer placeholders than inputs".into()))?;
                Value::Tensor(placeholder.clone())
            }
            Feed::Constant(array) => {
                if array.onnx_dtype() != elem_type {
                    return Err(feed_error(format!(
                        "input '{}' is {}, fed {}",
                        info.name,
                        dtype_name(elem_type),
                        array.dtype_name()
                    )));
                }
                Value::Bound(array.clone())
            }
        };
        if let Some(declared) = declared_dims(&info.ty)
            && !dims_fit(&declared, &value.dims())
        {
            return Err(feed_error(format!(
                "input '{}' has dimensions {declared:?}, fed {:?}",
                info.name,
                value.dims()
            )));
        }
        values.insert(&info.name, value);
    }
    for (index, proto) in graph.nodes.iter().enumerate() {
        let node = Node::new(proto, index, opset, file, &values)?;
        let outputs = ops::convert(&node)
            .and_then(|outputs| node.check_attributes().map(|()| outputs))
            .map_err(|e| node.wrap(e))?;
        for (k, name) in proto.outputs.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            let value = outputs
                .get(k)
                .cloned()
                .ok_or_else(|| node.unsupported(format!("output {k} ('{name}')")))?;
            values.insert(name, value);
        }
    }
    graph
        .outputs
        .iter()
        .map(|info| output(info, &values, file))
        .collect()
}

/// The dimensions a value type declares, `None` for a symbolic one.
fn declared_dims(ty: &ValueType) -> Option<Vec<Option<usize>>> {
    match ty {
        ValueType::Tensor { dims: Some(d), .. } => Some(
            d.iter()
                .map(|d| match d {
                    Dim::Value(v) => usize::try_from(*v).ok(),
                    Dim::Symbolic(_) => None,
                })
                .collect(),
        ),
        _ => None,
    }
}

fn dims_fit(declared: &[Option<usize>], dims: &[usize]) -> bool {
    declared.len() == dims.len()
        && declared
            .iter()
            .zip(dims)
            .all(|(d, &n)| d.is_none_or(|d| d == n))
}

/// A graph output as a kiln tensor, checked against its declared type.
fn output(info: &ValueInfo, values: &HashMap<&str, Value>, file: &str) -> Result<Tensor> {
    let output_error = |message: String| -> Error {
        OnnxError::Output {
            file: file.to_string(),
            message,
        }
        .into()
    };
    let value = values
        .get(info.name.as_str())
        .ok_or_else(|| output_error(format!("output '{}' is computed by no node", info.name)))?;
    let tensor = match value {
        Value::Tensor(t) => t.clone(),
        Value::Known(a) | Value::Bound(a) => a.to_tensor(),
    };
    if let ValueType::Tensor { elem_type, .. } = info.ty
        && elem_type != onnx_code(tensor.dtype())
    {
        return Err(output_error(format!(
            "output '{}' is declared {}, computed as {}",
            info.name,
            dtype_name(elem_type),
            tensor.dtype()
        )));
    }
    if let Some(declared) = declared_dims(&info.ty)
        && !dims_fit(&declared, tensor.dims())
    {
        return Err(output_error(format!(
            "output '{}' is declared {declared:?}, computed as {}",
            info.name,
            tensor.shape()
        )));
    }
    Ok(tensor)
}

/// One node, as the op mappings see it: its inputs, its attributes (each
/// one read is marked, so that one no mapping reads is refused), and the
/// errors that name it.
pub(super) struct Node<'a> {
    pub proto: &'a NodeProto,
    /// The default opset's version.
    pub opset: i64,
    label: String,
    file: &'a str,
    inputs: Vec<Option<Value>>,
    read: RefCell<Vec<bool>>,
}

impl<'a> Node<'a> {
    fn new(
        proto: &'a NodeProto,
        index: usize,
        opset: i64,
        file: &'a str,
        values: &HashMap<&str, Value>,
    ) -> Result<Node<'a>> {
        let label = match (proto.name.as_str(), proto.outputs.first()) {
            ("", Some(out)) => format!("#{index} (-> '{out}')"),
            ("", None) => format!("#{index}"),
            (name, _) => format!("'{name}'"),
        };
        let mut node = Node {
            proto,
            opset,
            label,
            file,
            inputs: Vec::new(),
            read: RefCell::new(vec![false; proto.attributes.len()]),
        };
        for name in &proto.inputs {
            let value = match name.as_str() {
                "" => None,
                name => Some(values.get(name).cloned().ok_or_else(|| {
                    node.invalid(format!("input '{name}' is computed by no earlier node"))
                })?),
            };
            node.inputs.push(value);
        }
        Ok(node)
    }

    /// The op type.
    pub fn op(&self) -> &str {
        &self.proto.op_type
    }

    /// The error saying that kiln lacks `what` for this node.
    pub fn unsupported(&self, what: impl Into<String>) -> Error {
        OnnxError::Unsupported {
            file: self.file.to_string(),
            node: self.label.clone(),
            op: self.proto.op_type.clone(),
            what: what.into(),
        }
        .into()
    }

    /// The error saying that this node breaks ONNX's rules.
    pub fn invalid(&self, message: impl Into<String>) -> Error {
        OnnxError::Node {
            file: self.file.to_string(),
            node: self.label.clone(),
            op: self.proto.op_type.clone(),
            message: message.into(),
        }
        .into()
    }

    /// An error raised while converting the node, naming it: a dtype one
    /// of kiln's ops does not take is something kiln lacks; any other kiln
    /// error means the node's operands do not fit.
    fn wrap(&self, e: Error) -> Error {
        match e {
            Error::Onnx(_) => e,
            Error::Ir(kiln_ir::Error::DType { .. }) => self.unsupported(e.to_string()),
            other => self.invalid(other.to_string()),
        }
    }

    /// How many inputs the node lists, omitted optional ones included.
    pub fn input_count(&self) -> usize {
        self.inputs.len()
    }

    /// Whether optional input `i` is given.
    pub fn has(&self, i: usize) -> bool {
        matches!(self.inputs.get(i), Some(Some(_)))
    }

    /// Input `i`, which must be given.
    pub fn value(&self, i: usize) -> Result<&Value> {
        match self.inputs.get(i) {
            Some(Some(v)) => Ok(v),
            _ => Err(self.invalid(format!("input {i} is missing"))),
        }
    }

    /// Input `i` as a kiln tensor.
    pub fn tensor(&self, i: usize) -> Result<Tensor> {
        Ok(self.to_tensor(self.value(i)?))
    }

    /// A value as a kiln tensor.
    pub fn to_tensor(&self, value: &Value) -> Tensor {
        match value {
            Value::Tensor(t) => t.clone(),
            Value::Known(a) | Value::Bound(a) => a.to_tensor(),
        }
    }

    /// Optional input `i` as a kiln tensor.
    pub fn opt_tensor(&self, i: usize) -> Result<Option<Tensor>> {
        match self.has(i) {
            true => self.tensor(i).map(Some),
            false => Ok(None),
        }
    }

    /// Input `i` as integers known while tracing (a shape, axes, pads).
    pub fn ints(&self, i: usize) -> Result<Vec<i64>> {
        match self.value(i)? {
            Value::Known(a) | Value::Bound(a) => a.ints().ok_or_else(|| {
                self.invalid(format!("input {i} is {}, not integers", a.dtype_name()))
            }),
            Value::Tensor(_) => Err(self.unsupported(format!(
                "input {i} is computed at run time, and kiln needs its values when compiling"
            ))),
        }
    }

    /// Optional input `i` as known integers.
    pub fn opt_ints(&self, i: usize) -> Result<Option<Vec<i64>>> {
        match self.has(i) {
            true => self.ints(i).map(Some),
            false => Ok(None),
        }
    }

    /// Input `i` as one known integer.
    pub fn int(&self, i: usize) -> Result<i64> {
        match self.ints(i)?.as_slice() {
            [v] => Ok(*v),
            other => Err(self.invalid(format!("input {i} holds {} values, not 1", other.len()))),
        }
    }

    /// Input `i`'s value, if it is known while tracing.
    pub fn known(&self, i: usize) -> Option<&Array> {
        self.inputs.get(i)?.as_ref()?.array()
    }

    /// Input `i`'s shape.
    pub fn dims(&self, i: usize) -> Result<Vec<usize>> {
        Ok(self.value(i)?.dims())
    }

    /// The attribute `name`, marked as read.
    pub fn attr(&self, name: &str) -> Option<&'a AttributeProto> {
        let position = self.proto.attributes.iter().position(|a| a.name == name)?;
        self.read.borrow_mut()[position] = true;
        Some(&self.proto.attributes[position])
    }

    fn attr_of(&self, name: &str, kind: i64, what: &str) -> Result<Option<&'a AttributeProto>> {
        match self.attr(name) {
            Some(a) if !a.ref_attr_name.is_empty() => Err(self.unsupported(format!(
                "attribute '{name}' refers to a function's attribute"
            ))),
            Some(a) if a.kind != kind => {
                Err(self.invalid(format!("attribute '{name}' is not {what}")))
            }
            other => Ok(other),
        }
    }

    /// An INT attribute, or `default`.
    pub fn attr_int(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.attr_of(name, 2, "an int")?.map_or(default, |a| a.i))
    }

    /// A FLOAT attribute, or `default`.
    pub fn attr_float(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self.attr_of(name, 1, "a float")?.map_or(default, |a| a.f))
    }

    /// An INTS attribute, if given.
    pub fn attr_ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self
            .attr_of(name, 7, "a list of ints")?
            .map(|a| a.ints.clone()))
    }

    /// A FLOATS attribute, if given.
    pub fn attr_floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        Ok(self
            .attr_of(name, 6, "a list of floats")?
            .map(|a| a.floats.clone()))
    }

    /// A STRINGS attribute, if given.
    pub fn attr_strings(&self, name: &str) -> Result<Option<Vec<String>>> {
        let Some(a) = self.attr_of(name, 8, "a list of strings")? else {
            return Ok(None);
        };
        let strings = a.strings.iter().map(|s| String::from_utf8(s.clone()).ok());
        let strings: Option<Vec<String>> = strings.collect();
        strings
            .map(Some)
            .ok_or_else(|| self.invalid(format!("attribute '{name}' is not UTF-8")))
    }

    /// A STRING attribute, or `default`.
    pub fn attr_string(&self, name: &str, default: &str) -> Result<String> {
        match self.attr_of(name, 3, "a string")? {
            Some(a) => String::from_utf8(a.s.clone())
                .map_err(|_| self.invalid(format!("attribute '{name}' is not UTF-8"))),
            None => Ok(default.to_string()),
        }
    }

    /// A TENSOR attribute, if given.
    pub fn attr_tensor(&self, name: &str) -> Result<Option<Array>> {
        match self.attr_of(name, 4, "a tensor")? {
            Some(a) => {
                let t = a
                    .t
                    .as_ref()
                    .ok_or_else(|| self.invalid(format!("attribute '{name}' holds no tensor")))?;
                Ok(Some(tensor::array(t, self.file)?))
            }
            None => Ok(None),
        }
    }

    /// Refuses the node if it has an attribute no mapping read: kiln would
    /// otherwise compute something other than what the attribute asks.
    fn check_attributes(&self) -> Result<()> {
        let read = self.read.borrow();
        match self
            .proto
            .attributes
            .iter()
            .zip(read.iter())
            .find(|(_, r)| !**r)
        {
            Some((a, _)) => Err(self.unsupported(format!("attribute '{}'", a.name))),
            None => Ok(()),
        }
    }
}

/// A known array of i64 values under `dims`.
pub(super) fn known_i64(dims: Vec<usize>, values: Vec<i64>) -> Value {
    Value::Known(Array::i64(dims, values))
}
