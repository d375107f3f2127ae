//! The ONNX messages kiln reads, decoded from the wire format: the fields of
//! `onnx.proto` (onnx 1.22.0) that loading a model needs, by their field
//! numbers there. Fields kiln does not read are skipped, as protobuf
//! requires of a parser; fields whose presence would change the meaning
//! (external data, segments, sub-graphs) are recorded so that using them is
//! a clear refusal rather than a silent misreading.

use super::wire::{Decoded, Field, Reader};

/// `ModelProto`.
#[derive(Debug, Default)]
pub(super) struct ModelProto {
    /// `(domain, version)` of each `opset_import` (field 8).
    pub opsets: Vec<(String, i64)>,
    /// `graph` (field 7).
    pub graph: GraphProto,
    /// How many `functions` (field 25) the model defines.
    pub functions: usize,
}

/// `GraphProto`.
#[derive(Debug, Default)]
pub(super) struct GraphProto {
    pub name: String,
    pub nodes: Vec<NodeProto>,
    pub initializers: Vec<TensorProto>,
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    /// How many `sparse_initializer`s (field 15) there are.
    pub sparse_initializers: usize,
}

/// `NodeProto`.
#[derive(Debug, Default)]
pub(super) struct NodeProto {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    /// Input value names; an empty name is an omitted optional input.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: Vec<AttributeProto>,
}

/// `AttributeProto`: one of its value fields is meant, as `kind` says.
#[derive(Debug, Default)]
pub(super) struct AttributeProto {
    pub name: String,
    /// `AttributeType`: 1 FLOAT, 2 INT, 3 STRING, 4 TENSOR, 5 GRAPH,
    /// 6 FLOATS, 7 INTS, 8 STRINGS, 9 TENSORS, 10 GRAPHS, 11 SPARSE_TENSOR,
    /// 12 SPARSE_TENSORS, 13 TYPE_PROTO, 14 TYPE_PROTOS.
    pub kind: i64,
    /// `ref_attr_name`: set only inside function bodies.
    pub ref_attr_name: String,
    pub f: f32,
    pub i: i64,
    pub s: Vec<u8>,
    pub t: Option<TensorProto>,
    pub floats: Vec<f32>,
    pub ints: Vec<i64>,
    pub strings: Vec<Vec<u8>>,
}

/// `TensorProto`, with its payload still in the field it came in.
#[derive(Debug, Default)]
pub(super) struct TensorProto {
    pub name: String,
    pub dims: Vec<i64>,
    /// `DataType` (see `tensor::dtype_name`).
    pub data_type: i64,
    pub float_data: Vec<f32>,
    pub int32_data: Vec<i64>,
    pub int64_data: Vec<i64>,
    pub double_data: Vec<f64>,
    pub raw_data: Option<Vec<u8>>,
    /// `data_location` is EXTERNAL, or `external_data` is given.
    pub external: bool,
    /// `external_data`: where the payload is (`location`, a file beside
    /// the model; `offset` and `length` in it), as key and value.
    pub external_data: Vec<(String, String)>,
    /// A `segment` is given: the tensor is one piece of a larger one.
    pub segment: bool,
    /// Where the message starts in its file, for errors.
    pub offset: usize,
}

/// `ValueInfoProto`: a graph input's or output's name and type.
#[derive(Debug, Default)]
pub(super) struct ValueInfo {
    pub name: String,
    pub ty: ValueType,
}

/// `TypeProto`, as far as kiln can use it.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) enum ValueType {
    /// A tensor of `elem_type` with the given dimensions, if any are given.
    Tensor {
        elem_type: i64,
        dims: Option<Vec<Dim>>,
    },
    /// A sequence, map, optional or sparse tensor, by name.
    Other(&'static str),
    /// No type given.
    #[default]
    Missing,
}

/// `TensorShapeProto.Dimension`.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Dim {
    /// `dim_value`.
    Value(i64),
    /// `dim_param`, or neither: a size fixed only when the model runs.
    Symbolic(String),
}

/// Decodes a `ModelProto`.
pub(super) fn model(bytes: &[u8]) -> Decoded<ModelProto> {
    const M: &str = "ModelProto";
    let mut model = ModelProto::default();
    let mut r = Reader::new(bytes, 0, M);
    while let Some(f) = r.next_field()? {
        match f.number {
            7 => model.graph = graph(&f, M)?,
            8 => {
                const O: &str = "OperatorSetIdProto";
                let mut o = Reader::nested(&f, M, O)?;
                let (mut domain, mut version) = (String::new(), 0);
                while let Some(g) = o.next_field()? {
                    match g.number {
                        1 => domain = g.string(O)?,
                        2 => version = g.int(O)?,
                        _ => {}
                    }
                }
                model.opsets.push((domain, version));
            }
            25 => model.functions += 1,
            _ => {}
        }
    }
    Ok(model)
}

fn graph(field: &Field, outer: &'static str) -> Decoded<GraphProto> {
    const M: &str = "GraphProto";
    let mut graph = GraphProto::default();
    let mut r = Reader::nested(field, outer, M)?;
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => graph.nodes.push(node(&f)?),
            2 => graph.name = f.string(M)?,
            5 => graph.initializers.push(tensor_field(&f, M)?),
            11 => graph.inputs.push(value_info(&f)?),
            12 => graph.outputs.push(value_info(&f)?),
            15 => graph.sparse_initializers += 1,
            _ => {}
        }
    }
    Ok(graph)
}

fn node(field: &Field) -> Decoded<NodeProto> {
    const M: &str = "NodeProto";
    let mut node = NodeProto::default();
    let mut r = Reader::nested(field, "GraphProto", M)?;
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => node.inputs.push(f.string(M)?),
            2 => node.outputs.push(f.string(M)?),
            3 => node.name = f.string(M)?,
            4 => node.op_type = f.string(M)?,
            5 => node.attributes.push(attribute(&f)?),
            7 => node.domain = f.string(M)?,
            _ => {}
        }
    }
    Ok(node)
}

fn attribute(field: &Field) -> Decoded<AttributeProto> {
    const M: &str = "AttributeProto";
    let mut a = AttributeProto::default();
    let mut r = Reader::nested(field, "NodeProto", M)?;
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => a.name = f.string(M)?,
            2 => a.f = f.float(M)?,
            3 => a.i = f.int(M)?,
            4 => a.s = f.bytes(M)?.to_vec(),
            5 => a.t = Some(tensor_field(&f, M)?),
            7 => f.push_floats(M, &mut a.floats)?,
            8 => f.push_ints(M, &mut a.ints)?,
            9 => a.strings.push(f.bytes(M)?.to_vec()),
            20 => a.kind = f.int(M)?,
            21 => a.ref_attr_name = f.string(M)?,
            _ => {}
        }
    }
    Ok(a)
}

fn value_info(field: &Field) -> Decoded<ValueInfo> {
    const M: &str = "ValueInfoProto";
    let mut info = ValueInfo::default();
    let mut r = Reader::nested(field, "GraphProto", M)?;
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => info.name = f.string(M)?,
            2 => info.ty = type_proto(&f)?,
            _ => {}
        }
    }
    Ok(info)
}

fn type_proto(field: &Field) -> Decoded<ValueType> {
    const M: &str = "TypeProto";
    let mut ty = ValueType::Missing;
    let mut r = Reader::nested(field, "ValueInfoProto", M)?;
    while let Some(f) = r.next_field()? {
        ty = match f.number {
            1 => tensor_type(&f)?,
            4 => ValueType::Other("a sequence"),
            5 => ValueType::Other("a map"),
            8 => ValueType::Other("a sparse tensor"),
            9 => ValueType::Other("an optional"),
            _ => continue,
        };
    }
    Ok(ty)
}

fn tensor_type(field: &Field) -> Decoded<ValueType> {
    const M: &str = "TypeProto.Tensor";
    let (mut elem_type, mut dims) = (0, None);
    let mut r = Reader::nested(field, "TypeProto", M)?;
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => elem_type = f.int(M)?,
            2 => {
                const S: &str = "TensorShapeProto";
                let mut list = Vec::new();
                let mut s = Reader::nested(&f, M, S)?;
                while let Some(d) = s.next_field()? {
                    if d.number == 1 {
                        list.push(dimension(&d)?);
                    }
                }
                dims = Some(list);
            }
            _ => {}
        }
    }
    Ok(ValueType::Tensor { elem_type, dims })
}

fn dimension(field: &Field) -> Decoded<Dim> {
    const M: &str = "TensorShapeProto.Dimension";
    let mut dim = Dim::Symbolic(String::new());
    let mut r = Reader::nested(field, "TensorShapeProto", M)?;
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => dim = Dim::Value(f.int(M)?),
            2 => dim = Dim::Symbolic(f.string(M)?),
            _ => {}
        }
    }
    Ok(dim)
}

/// A `StringStringEntryProto`: its key and value.
fn entry(field: &Field) -> Decoded<(String, String)> {
    const M: &str = "StringStringEntryProto";
    let mut r = Reader::new(field.bytes(M)?, field.offset, M);
    let mut entry = (String::new(), String::new());
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => entry.0 = f.string(M)?,
            2 => entry.1 = f.string(M)?,
            _ => {}
        }
    }
    Ok(entry)
}

fn tensor_field(field: &Field, outer: &'static str) -> Decoded<TensorProto> {
    let bytes = field.bytes(outer)?;
    tensor_at(bytes, field.offset)
}

/// Decodes a `TensorProto` held by `bytes`, which start at absolute `base`
/// (0 for a `.pb` file of one tensor).
pub(super) fn tensor_at(bytes: &[u8], base: usize) -> Decoded<TensorProto> {
    const M: &str = "TensorProto";
    let mut t = TensorProto {
        offset: base,
        ..TensorProto::default()
    };
    let mut r = Reader::new(bytes, base, M);
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => f.push_ints(M, &mut t.dims)?,
            2 => t.data_type = f.int(M)?,
            3 => t.segment = true,
            4 => f.push_floats(M, &mut t.float_data)?,
            5 => f.push_ints(M, &mut t.int32_data)?,
            7 => f.push_ints(M, &mut t.int64_data)?,
            8 => t.name = f.string(M)?,
            9 => t.raw_data = Some(f.bytes(M)?.to_vec()),
            10 => f.push_doubles(M, &mut t.double_data)?,
            13 => {
                t.external = true;
                t.external_data.push(entry(&f)?);
            }
            14 => t.external |= f.int(M)? == 1,
            _ => {}
        }
    }
    Ok(t)
}
