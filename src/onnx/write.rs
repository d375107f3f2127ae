//! The protobuf wire format, written: the ONNX messages of `proto` encoded
//! field by field, the inverse of `wire` and `proto`. Only what the
//! exporter puts in a message is written: a tensor's payload goes in
//! `raw_data` (little-endian, as onnx.proto asks) or, where the tensor
//! names `external_data`, in the file that names, an attribute holds
//! an int, a list of ints or a tensor. Field numbers are those of
//! onnx.proto of onnx 1.22.0, as in `proto`.

use super::proto::{
    AttributeProto, Dim, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfo, ValueType,
};

/// `AttributeProto.AttributeType` numbers of what the exporter writes.
pub(super) mod kind {
    pub const INT: i64 = 2;
    pub const STRING: i64 = 3;
    pub const TENSOR: i64 = 4;
    pub const INTS: i64 = 7;
}

/// Wire type 0: a varint.
const VARINT: u32 = 0;
/// Wire type 2: a length-delimited payload.
const BYTES: u32 = 2;

/// A message being written, one field after another.
#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn tag(&mut self, number: u32, wire: u32) {
        self.varint(u64::from(number << 3 | wire));
    }

    /// An int32, int64 or enum field: negative values as their
    /// two's-complement 64 bits, ten bytes, as protobuf encodes them.
    fn int(&mut self, number: u32, v: i64) {
        self.tag(number, VARINT);
        self.varint(v as u64);
    }

    fn bytes(&mut self, number: u32, b: &[u8]) {
        self.tag(number, BYTES);
        self.varint(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    fn string(&mut self, number: u32, s: &str) {
        self.bytes(number, s.as_bytes());
    }

    /// A repeated integer field, packed (what protobuf writes by default).
    fn packed_ints(&mut self, number: u32, values: &[i64]) {
        let mut packed = Writer::default();
        values.iter().for_each(|&v| packed.varint(v as u64));
        self.bytes(number, &packed.buf);
    }

    /// A sub-message, written by `body`. Its length comes first on the
    /// wire, so it is written apart and copied in.
    fn message(&mut self, number: u32, body: impl FnOnce(&mut Writer)) {
        let mut inner = Writer::default();
        body(&mut inner);
        self.bytes(number, &inner.buf);
    }
}

/// Encodes a `ModelProto` of `ir_version` produced by kiln.
pub(super) fn model(model: &ModelProto, ir_version: i64) -> Vec<u8> {
    let mut w = Writer::default();
    w.int(1, ir_version);
    w.string(2, "kiln");
    w.string(3, env!("CARGO_PKG_VERSION"));
    w.message(7, |w| graph(w, &model.graph));
    for (domain, version) in &model.opsets {
        w.message(8, |w| {
            w.string(1, domain);
            w.int(2, *version);
        });
    }
    w.buf
}

fn graph(w: &mut Writer, graph: &GraphProto) {
    for n in &graph.nodes {
        w.message(1, |w| node(w, n));
    }
    w.string(2, &graph.name);
    for t in &graph.initializers {
        w.message(5, |w| tensor(w, t));
    }
    for v in &graph.inputs {
        w.message(11, |w| value_info(w, v));
    }
    for v in &graph.outputs {
        w.message(12, |w| value_info(w, v));
    }
}

fn node(w: &mut Writer, node: &NodeProto) {
    node.inputs.iter().for_each(|i| w.string(1, i));
    node.outputs.iter().for_each(|o| w.string(2, o));
    if !node.name.is_empty() {
        w.string(3, &node.name);
    }
    w.string(4, &node.op_type);
    for a in &node.attributes {
        w.message(5, |w| attribute(w, a));
    }
    if !node.domain.is_empty() {
        w.string(7, &node.domain);
    }
}

/// An attribute: its name, the value field its kind names, and the kind.
fn attribute(w: &mut Writer, a: &AttributeProto) {
    w.string(1, &a.name);
    match a.kind {
        kind::INT => w.int(3, a.i),
        kind::STRING => w.bytes(4, &a.s),
        kind::INTS => w.packed_ints(8, &a.ints),
        // The exporter writes no other kind.
        _ => {
            if let Some(t) = &a.t {
                w.message(5, |w| tensor(w, t));
            }
        }
    }
    w.int(20, a.kind);
}

fn tensor(w: &mut Writer, t: &TensorProto) {
    w.packed_ints(1, &t.dims);
    w.int(2, t.data_type);
    w.string(8, &t.name);
    if t.external_data.is_empty() {
        w.bytes(9, t.raw_data.as_deref().unwrap_or_default());
        return;
    }
    for (key, value) in &t.external_data {
        w.message(13, |w| {
            w.string(1, key);
            w.string(2, value);
        });
    }
    // `data_location`: EXTERNAL.
    w.int(14, 1);
}

fn value_info(w: &mut Writer, v: &ValueInfo) {
    w.string(1, &v.name);
    if let ValueType::Tensor { elem_type, dims } = &v.ty {
        w.message(2, |w| {
            w.message(1, |w| {
                w.int(1, *elem_type);
                if let Some(dims) = dims {
                    w.message(2, |w| {
                        for d in dims {
                            w.message(1, |w| match d {
                                Dim::Value(v) => w.int(1, *v),
                                Dim::Symbolic(name) => w.string(2, name),
                            });
                        }
                    });
                }
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto;
    use super::*;

    #[test]
    fn negative_ints_take_ten_bytes_and_read_back() {
        let t = TensorProto {
            name: "t".into(),
            dims: vec![0, 3],
            data_type: 7,
            raw_data: Some(Vec::new()),
            ..TensorProto::default()
        };
        let a = AttributeProto {
            name: "a".into(),
            kind: kind::INTS,
            ints: vec![-1, 0, i64::MAX, i64::MIN],
            ..AttributeProto::default()
        };
        let mut graph = GraphProto {
            name: "g".into(),
            ..GraphProto::default()
        };
        graph.initializers.push(t);
        graph.nodes.push(NodeProto {
            op_type: "Transpose".into(),
            inputs: vec!["t".into(), String::new()],
            outputs: vec!["y".into()],
            attributes: vec![a],
            ..NodeProto::default()
        });
        graph.outputs.push(ValueInfo {
            name: "y".into(),
            ty: ValueType::Tensor {
                elem_type: 7,
                dims: Some(vec![Dim::Value(3), Dim::Symbolic("n".into())]),
            },
        });
        let bytes = model(
            &ModelProto {
                opsets: vec![(String::new(), 18)],
                graph,
                functions: 0,
            },
            8,
        );
        let back = proto::model(&bytes).expect("decodes");
        assert_eq!(back.opsets, [(String::new(), 18)]);
        let g = &back.graph;
        assert_eq!(g.name, "g");
        assert_eq!(g.initializers[0].dims, [0, 3]);
        assert_eq!(g.initializers[0].raw_data.as_deref(), Some(&[][..]));
        let n = &g.nodes[0];
        assert_eq!(n.inputs, ["t", ""]);
        assert_eq!(n.attributes[0].ints, [-1, 0, i64::MAX, i64::MIN]);
        assert_eq!(n.attributes[0].kind, kind::INTS);
        assert_eq!(
            g.outputs[0].ty,
            ValueType::Tensor {
                elem_type: 7,
                dims: Some(vec![Dim::Value(3), Dim::Symbolic("n".into())]),
            }
        );
    }
}
