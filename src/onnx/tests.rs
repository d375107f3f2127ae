//! Unit tests of the ONNX frontend on models written here byte by byte:
//! the error paths (a corrupt or truncated file, an unknown op, an
//! unread attribute, INT64 data) and a few graphs against the interpreter.

use kiln_ir::{DType, Data, TensorType};

use super::{Dimension, Feed, Model, OnnxError};
use crate::{CompileOptions, Device, Error, Result, Tensor};

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field.
fn field(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(number) << 3 | 2, &mut out);
    varint(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

/// A varint field.
fn int(number: u32, v: i64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(number) << 3, &mut out);
    varint(v as u64, &mut out);
    out
}

fn string(number: u32, s: &str) -> Vec<u8> {
    field(number, s.as_bytes())
}

/// A `ValueInfoProto` of a tensor of `elem_type` and `dims`.
fn value_info(name: &str, elem_type: i64, dims: &[i64]) -> Vec<u8> {
    let shape: Vec<u8> = dims.iter().flat_map(|&d| field(1, &int(1, d))).collect();
    let tensor = [int(1, elem_type), field(2, &shape)].concat();
    [string(1, name), field(2, &field(1, &tensor))].concat()
}

/// A `NodeProto`.
fn node(op: &str, inputs: &[&str], outputs: &[&str], attributes: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    inputs.iter().for_each(|i| out.extend(string(1, i)));
    outputs.iter().for_each(|o| out.extend(string(2, o)));
    out.extend(string(4, op));
    attributes.iter().for_each(|a| out.extend(field(5, a)));
    out
}

/// An INT attribute.
fn attr_int(name: &str, v: i64) -> Vec<u8> {
    [string(1, name), int(3, v), int(20, 2)].concat()
}

/// An INT64 initializer.
fn initializer_i64(name: &str, values: &[i64]) -> Vec<u8> {
    let mut packed = Vec::new();
    values.iter().for_each(|&v| varint(v as u64, &mut packed));
    [
        int(1, values.len() as i64),
        int(2, 7),
        field(7, &packed),
        string(8, name),
    ]
    .concat()
}

/// A model of opset 17 with these parts of its graph.
fn model(nodes: &[Vec<u8>], inits: &[Vec<u8>], inputs: &[Vec<u8>], outputs: &[Vec<u8>]) -> Vec<u8> {
    let mut graph = Vec::new();
    nodes.iter().for_each(|n| graph.extend(field(1, n)));
    graph.extend(string(2, "g"));
    inits.iter().for_each(|t| graph.extend(field(5, t)));
    inputs.iter().for_each(|v| graph.extend(field(11, v)));
    outputs.iter().for_each(|v| graph.extend(field(12, v)));
    let opset = [string(1, ""), int(2, 17)].concat();
    [int(1, 8), field(7, &graph), field(8, &opset)].concat()
}

/// A model computing `y = relu(x)` of f32[2, 3].
fn relu_model() -> Vec<u8> {
    model(
        &[node("Relu", &["x"], &["y"], &[])],
        &[],
        &[value_info("x", 1, &[2, 3])],
        &[value_info("y", 1, &[2, 3])],
    )
}

fn onnx_error(result: Result<impl Sized>) -> OnnxError {
    match result {
        Err(Error::Onnx(e)) => e,
        Err(other) => panic!("expected an ONNX error, got {other}"),
        Ok(_) => panic!("expected an error"),
    }
}

fn f32_input(dims: &[usize]) -> Feed {
    Feed::Input(TensorType::new(DType::F32, dims))
}

/// Runs the model on `x` on the CPU and on the interpreter; both must agree.
fn run(bytes: &[u8], feeds: &[Feed], x: &Tensor) -> Result<Vec<f32>> {
    let model = Model::from_bytes(bytes, "test.onnx")?;
    let mut results = Vec::new();
    for device in [Device::Cpu, Device::Reference] {
        let mut compiled = model.compile_with(feeds, CompileOptions::on(device))?;
        results.push(compiled.call(&[x])?[0].to_vec::<f32>()?);
    }
    assert_eq!(results[0], results[1], "the CPU and the interpreter differ");
    Ok(results.remove(0))
}

#[test]
fn a_relu_model_runs_on_the_cpu_and_the_interpreter() -> Result<()> {
    let x = Tensor::from_vec(vec![-1.0f32, 2.0, -3.0, 4.0, 0.5, -0.0], [2, 3])?;
    let y = run(&relu_model(), &[f32_input(&[2, 3])], &x)?;
    assert_eq!(y, [0.0, 2.0, 0.0, 4.0, 0.5, 0.0]);
    Ok(())
}

#[test]
fn a_truncated_model_names_the_file_and_the_offset() {
    let bytes = relu_model();
    let cut = &bytes[..bytes.len() - 5];
    match onnx_error(Model::from_bytes(cut, "cut.onnx")) {
        OnnxError::Decode {
            file,
            offset,
            message,
        } => {
            assert_eq!(file, "cut.onnx");
            assert!(offset <= cut.len(), "offset {offset} within the file");
            assert!(message.contains("truncated"), "{message}");
        }
        other => panic!("expected a decode error, got {other}"),
    }
}

#[test]
fn garbage_is_a_decode_error_not_a_panic() {
    for bytes in [
        &[0xffu8; 16][..],
        &[0x0f, 0x01],
        &[0x3a, 0xff, 0xff, 0xff, 0xff, 0x0f],
    ] {
        let e = onnx_error(Model::from_bytes(bytes, "junk.onnx"));
        assert!(matches!(e, OnnxError::Decode { .. }), "{e}");
        assert!(!e.is_unsupported());
    }
}

#[test]
fn a_missing_file_is_an_io_error_naming_it() {
    let e = onnx_error(Model::load("/nonexistent/model.onnx"));
    assert!(e.to_string().contains("/nonexistent/model.onnx"), "{e}");
}

#[test]
fn an_unknown_op_names_the_node_and_the_op() {
    let bytes = model(
        &[node("Frobnicate", &["x"], &["y"], &[])],
        &[],
        &[value_info("x", 1, &[2])],
        &[value_info("y", 1, &[2])],
    );
    let compiled = Model::from_bytes(&bytes, "f.onnx").and_then(|m| m.compile(&[f32_input(&[2])]));
    let e = onnx_error(compiled);
    assert!(e.is_unsupported());
    let text = e.to_string();
    assert!(
        text.contains("Frobnicate") && text.contains("'y'"),
        "{text}"
    );
}

#[test]
fn an_attribute_no_mapping_reads_is_refused() {
    let bytes = model(
        &[node("Relu", &["x"], &["y"], &[attr_int("frob", 1)])],
        &[],
        &[value_info("x", 1, &[2])],
        &[value_info("y", 1, &[2])],
    );
    let compiled = Model::from_bytes(&bytes, "a.onnx").and_then(|m| m.compile(&[f32_input(&[2])]));
    let e = onnx_error(compiled);
    assert!(
        e.is_unsupported() && e.to_string().contains("attribute 'frob'"),
        "{e}"
    );
}

#[test]
fn a_reshape_takes_its_shape_from_an_int64_initializer() -> Result<()> {
    let bytes = model(
        &[node("Reshape", &["x", "shape"], &["y"], &[])],
        &[initializer_i64("shape", &[3, -1])],
        &[value_info("x", 1, &[2, 3])],
        &[value_info("y", 1, &[3, 2])],
    );
    let x = Tensor::from_vec((0..6).map(|i| i as f32).collect(), [2, 3])?;
    let y = run(&bytes, &[f32_input(&[2, 3])], &x)?;
    assert_eq!(y, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    Ok(())
}

/// An f32 initializer of `dims`, its values in `raw_data`.
fn initializer_f32(name: &str, dims: &[i64], values: &[f32]) -> Vec<u8> {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut t: Vec<u8> = dims.iter().flat_map(|&d| int(1, d)).collect();
    t.extend([int(2, 1), field(9, &raw), string(8, name)].concat());
    t
}

/// Compiles `bytes` for the CPU and the interpreter, calls both on
/// `inputs`, and returns output 0 of each.
fn both(bytes: &[u8], feeds: &[Feed], inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let model = Model::from_bytes(bytes, "test.onnx")?;
    [Device::Cpu, Device::Reference]
        .into_iter()
        .map(|device| {
            let mut compiled = model.compile_with(feeds, CompileOptions::on(device))?;
            Ok(compiled.call(inputs)?.remove(0))
        })
        .collect()
}

#[test]
fn int64_inputs_are_fed_and_computed_on_at_run_time() -> Result<()> {
    let bytes = model(
        &[node("Add", &["x", "x"], &["y"], &[])],
        &[],
        &[value_info("x", 7, &[2])],
        &[value_info("y", 7, &[2])],
    );
    let m = Model::from_bytes(&bytes, "i.onnx")?;
    assert_eq!(m.inputs()[0].ty, Some(TensorType::new(DType::I64, [2])));
    let e = onnx_error(m.compile(&[Feed::Input(TensorType::new(DType::I32, [2]))]));
    assert!(
        !e.is_unsupported() && e.to_string().contains("fed as i32"),
        "{e}"
    );
    // Beyond i32: computed in i32 these would wrap.
    let x = Tensor::from_vec(vec![3_000_000_000i64, -7], [2])?;
    for y in both(
        &bytes,
        &[Feed::Input(TensorType::new(DType::I64, [2]))],
        &[&x],
    )? {
        assert_eq!(y.to_vec::<i64>()?, [6_000_000_000, -14]);
    }
    // Bound as a constant, the same.
    let bound = Feed::Constant(super::Array::i64(vec![2], vec![3_000_000_000, -7]));
    let y = m.compile(&[bound])?.call(&[])?;
    assert_eq!(y[0].to_vec::<i64>()?, [6_000_000_000, -14]);
    Ok(())
}

#[test]
fn an_embedding_gathers_by_int64_ids_fed_at_run_time() -> Result<()> {
    // A [4, 2] table looked up by ids [3]: a negative id counts from the end.
    let table = [0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5];
    let bytes = model(
        &[node("Gather", &["table", "ids"], &["y"], &[])],
        &[initializer_f32("table", &[4, 2], &table)],
        &[value_info("ids", 7, &[3])],
        &[value_info("y", 1, &[3, 2])],
    );
    let ids = Tensor::from_vec(vec![2i64, -1, 0], [3])?;
    let feeds = [Feed::Input(TensorType::new(DType::I64, [3]))];
    for y in both(&bytes, &feeds, &[&ids])? {
        assert_eq!(y.to_vec::<f32>()?, [2.0, 2.5, 3.0, 3.5, 0.0, 0.5]);
    }
    Ok(())
}

#[test]
fn argmax_and_argmin_give_int64() -> Result<()> {
    let bytes = model(
        &[
            node("ArgMax", &["x"], &["hi"], &[attr_int("axis", 1)]),
            node(
                "ArgMin",
                &["x"],
                &["lo"],
                &[attr_int("keepdims", 0), attr_int("select_last_index", 1)],
            ),
        ],
        &[],
        &[value_info("x", 1, &[2, 3])],
        &[value_info("hi", 7, &[2, 1]), value_info("lo", 7, &[3])],
    );
    let x = Tensor::from_vec(vec![1.0f32, 5.0, 5.0, 1.0, 0.0, 7.0], [2, 3])?;
    let m = Model::from_bytes(&bytes, "arg.onnx")?;
    for device in [Device::Cpu, Device::Reference] {
        let y = m
            .compile_with(&[f32_input(&[2, 3])], CompileOptions::on(device))?
            .call(&[&x])?;
        assert_eq!(y[0].to_vec::<i64>()?, [1, 2]);
        // Ties along axis 0 go to the last index.
        assert_eq!(y[1].to_vec::<i64>()?, [1, 1, 0]);
    }
    Ok(())
}

#[test]
fn a_bad_feed_count_is_an_error() {
    let m = Model::from_bytes(&relu_model(), "r.onnx").expect("decodes");
    let e = onnx_error(m.compile(&[]));
    assert!(
        !e.is_unsupported() && e.to_string().contains("0 feeds"),
        "{e}"
    );
}

#[test]
fn a_tensor_of_the_wrong_length_is_a_decode_error() {
    // FLOAT [3] with 4 bytes of raw data.
    let t = [int(1, 3), int(2, 1), field(9, &[0; 4]), string(8, "w")].concat();
    let proto = super::proto::tensor_at(&t, 0).expect("decodes");
    let e = super::tensor::array(&proto, "t.pb").expect_err("4 bytes for 3 floats");
    assert!(matches!(e, OnnxError::Decode { .. }), "{e}");
    assert!(e.to_string().contains("'w'"), "{e}");
}

#[test]
fn float_tensors_read_from_raw_and_typed_fields_alike() {
    let raw: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let typed: Vec<u8> = raw.clone();
    let a = [int(1, 2), int(2, 1), field(9, &raw)].concat();
    let b = [int(1, 2), int(2, 1), field(4, &typed)].concat();
    for bytes in [a, b] {
        let proto = super::proto::tensor_at(&bytes, 0).expect("decodes");
        let array = super::tensor::array(&proto, "t.pb").expect("converts");
        assert_eq!(array.data, Data::F32(vec![1.5, -2.0]));
    }
}

/// An f32 initializer of `dims` whose values are stored outside the model,
/// at `entries` (`location`, `offset`, `length`) of its external data.
fn initializer_external(name: &str, dims: &[i64], entries: &[(&str, &str)]) -> Vec<u8> {
    let mut t: Vec<u8> = dims.iter().flat_map(|&d| int(1, d)).collect();
    t.extend([int(2, 1), string(8, name)].concat());
    for (key, value) in entries {
        t.extend(field(13, &[string(1, key), string(2, value)].concat()));
    }
    t.extend(int(14, 1));
    t
}

/// `y = x + w` of f32[2, 3], `w` stored outside the model as `entries` say.
fn external_model(entries: &[(&str, &str)]) -> Vec<u8> {
    model(
        &[node("Add", &["x", "w"], &["y"], &[])],
        &[initializer_external("w", &[2, 3], entries)],
        &[value_info("x", 1, &[2, 3])],
        &[value_info("y", 1, &[2, 3])],
    )
}

/// A folder of its own for a test's files.
fn folder(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the temporary folder is writable");
    dir
}

#[test]
fn tensors_stored_beside_the_model_are_read_from_there() -> Result<()> {
    let dir = folder("external");
    // Eight bytes of something else first, then w: as torch.onnx.export
    // packs many tensors into one file.
    let w = [1.0f32, -2.0, 3.5, 0.25, 8.0, -0.5];
    let mut data = vec![7u8; 8];
    data.extend(w.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(dir.join("model.onnx.data"), &data).expect("writes");
    let at = [
        ("location", "model.onnx.data"),
        ("offset", "8"),
        ("length", "24"),
    ];
    let path = dir.join("model.onnx");
    std::fs::write(&path, external_model(&at)).expect("writes");
    let model = Model::load(&path)?;
    let x = Tensor::from_vec(vec![1.0f32; 6], [2, 3])?;
    let y = model.compile(&[f32_input(&[2, 3])])?.call(&[&x])?.remove(0);
    assert_eq!(y.to_vec::<f32>()?, [2.0, -1.0, 4.5, 1.25, 9.0, 0.5]);
    // From bytes alone, the data has no folder to come from.
    let err = onnx_error(
        Model::from_bytes(&external_model(&at), "bytes.onnx")?.compile(&[f32_input(&[2, 3])]),
    );
    assert!(err.to_string().contains("Model::load reads it"), "{err}");
    // A location outside the folder, a file too short, a missing file.
    let cases = [
        (
            [("location", "../model.onnx.data")].as_slice(),
            "leaves the model's folder",
        ),
        (
            &[
                ("location", "model.onnx.data"),
                ("offset", "8"),
                ("length", "32"),
            ],
            "needs bytes from 8 to 40 of a 32-byte file",
        ),
        (
            &[("location", "/etc/hostname")],
            "leaves the model's folder",
        ),
        (&[("location", "missing.data")], "missing.data"),
        (&[("offset", "0")], "names no location"),
    ];
    for (entries, want) in cases {
        std::fs::write(&path, external_model(entries)).expect("writes");
        let err = Model::load(&path)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(want), "{entries:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

#[test]
fn inputs_with_named_dimensions_are_fed_at_a_size_given_to_them() -> Result<()> {
    // `x` of FLOAT [batch, 3], as an export with dynamic axes declares it.
    let dims = [field(1, &string(2, "batch")), field(1, &int(1, 3))].concat();
    let tensor = [int(1, 1), field(2, &dims)].concat();
    let x = [string(1, "x"), field(2, &field(1, &tensor))].concat();
    let bytes = model(
        &[node("Relu", &["x"], &["y"], &[])],
        &[],
        &[x],
        &[value_info("y", 1, &[2, 3])],
    );
    let m = Model::from_bytes(&bytes, "dynamic.onnx")?;
    let info = &m.inputs()[0];
    let named = vec![Dimension::Named("batch".into()), Dimension::Fixed(3)];
    assert_eq!((info.ty.as_ref(), info.dims.as_ref()), (None, Some(&named)));
    // The recipe that feeds fixed types only says which input and why.
    let feeds: Vec<Feed> = m
        .inputs()
        .into_iter()
        .filter_map(|i| i.ty)
        .map(Feed::Input)
        .collect();
    let e = onnx_error(m.compile(&feeds)).to_string();
    assert!(
        e.contains("0 feeds for 1 graph inputs ('x': FLOAT [batch, 3])"),
        "{e}"
    );
    assert!(e.contains("InputInfo::fixed"), "{e}");
    // Given a size, it runs.
    let ty = info
        .fixed(&[("batch", 2)])
        .expect("every dimension has a size");
    assert_eq!(ty, TensorType::new(DType::F32, [2, 3]));
    assert_eq!(info.fixed(&[("time", 2)]), None);
    let x = Tensor::from_vec(vec![-1.0f32, 2.0, -3.0, 4.0, 0.5, -0.5], [2, 3])?;
    let y = m.compile(&[Feed::Input(ty)])?.call(&[&x])?.remove(0);
    assert_eq!(y.to_vec::<f32>()?, [0.0, 2.0, 0.0, 4.0, 0.5, 0.0]);
    // With `y` of [batch, 3] too, `call` compiles for each batch size it
    // meets, and checks the rest.
    let y_info = [string(1, "y"), field(2, &field(1, &tensor))].concat();
    let x = [string(1, "x"), field(2, &field(1, &tensor))].concat();
    let bytes = model(&[node("Relu", &["x"], &["y"], &[])], &[], &[x], &[y_info]);
    let m = Model::from_bytes(&bytes, "dynamic.onnx")?;
    for batch in [2usize, 5, 2] {
        let values: Vec<f32> = (0..batch * 3).map(|i| i as f32 - 4.0).collect();
        let want: Vec<f32> = values.iter().map(|v| v.max(0.0)).collect();
        let y = m.call(&[&Tensor::from_vec(values, [batch, 3])?])?.remove(0);
        assert_eq!(y.dims(), [batch, 3]);
        assert_eq!(y.to_vec::<f32>()?, want);
    }
    let wide = Tensor::zeros([2, 4], DType::F32)?;
    let e = m
        .call(&[&wide])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.ends_with("input 'x' given f32[2,4]: dimension 1 is 3"),
        "{e}"
    );
    let ints = Tensor::zeros([2, 3], DType::I32)?;
    let e = m
        .call(&[&ints])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.ends_with("input 'x' given i32[2,3], declared FLOAT"),
        "{e}"
    );
    Ok(())
}
