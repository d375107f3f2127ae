//! `nn::save` and `nn::load`: safetensors files of every dtype and shape
//! round-trip bit for bit, a saved model loads into another, names the
//! format cannot hold are refused, files written by hand per the format
//! load, and every kind of corruption is an `Err` naming the file and the
//! byte offset.

use std::path::PathBuf;

use kiln::nn::{self, Mlp, Module};
use kiln::{DType, Error, Result, Tensor};

/// A fresh directory for one test's files.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-checkpoint-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("the temp dir is writable");
    d
}

fn message<T>(r: Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

/// Every element's bits, whatever the dtype.
fn bits(t: &Tensor) -> Result<Vec<u64>> {
    Ok(match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()?
            .iter()
            .map(|x| x.to_bits().into())
            .collect(),
        DType::F64 => t.to_vec::<f64>()?.iter().map(|x| x.to_bits()).collect(),
        DType::I32 => t.to_vec::<i32>()?.iter().map(|&x| x as u64).collect(),
        DType::I64 => t.to_vec::<i64>()?.iter().map(|&x| x as u64).collect(),
        DType::U8 => t.to_vec::<u8>()?.iter().map(|&x| u64::from(x)).collect(),
        DType::Bool => t.to_vec::<bool>()?.iter().map(|&x| u64::from(x)).collect(),
        DType::BF16 => (t.to_vec::<kiln::bf16>()?.iter())
            .map(|x| x.to_bits().into())
            .collect(),
        DType::F16 => (t.to_vec::<kiln::f16>()?.iter())
            .map(|x| x.to_bits().into())
            .collect(),
    })
}

#[test]
fn every_dtype_and_shape_round_trips_bit_for_bit() -> Result<()> {
    let path = dir("roundtrip").join("params.safetensors");
    let specials = [
        f32::NAN,
        -0.0,
        f32::INFINITY,
        f32::MIN_POSITIVE / 2.0,
        -1.5,
        3.0,
    ];
    let tensors = [
        ("f32", Tensor::from_vec(specials.to_vec(), [2, 3])?),
        (
            "i32",
            Tensor::from_vec(vec![i32::MIN, -1, 0, i32::MAX], [4])?,
        ),
        (
            "u8",
            Tensor::from_vec((0..8).map(|i| i * 36).collect::<Vec<u8>>(), [2, 2, 2])?,
        ),
        ("bool", Tensor::from_vec(vec![true, false, true], [3])?),
        // Beyond f32's precision and i32's range.
        (
            "f64",
            Tensor::from_vec(vec![0.1f64, 1e300, f64::NAN, -0.0, 1.0 + 1e-15], [5])?,
        ),
        (
            "i64",
            Tensor::from_vec(vec![i64::MIN, -1, 1 << 40, i64::MAX], [2, 2])?,
        ),
        // Their NaN, infinities, subnormals and signed zeros.
        (
            "bf16",
            Tensor::from_vec(specials.map(kiln::bf16::from_f32).to_vec(), [3, 2])?,
        ),
        (
            "f16",
            Tensor::from_vec(
                [f32::NAN, -0.0, f32::INFINITY, 6.0e-8, -65504.0, 3.0]
                    .map(kiln::f16::from_f32)
                    .to_vec(),
                [6],
            )?,
        ),
        ("scalar", Tensor::from_vec(vec![2.5f32], [])?),
        ("empty", Tensor::from_vec(Vec::<f32>::new(), [0, 3])?),
        // Lazy: computed by `save`.
        ("lazy", (Tensor::arange(0, 5).cast(DType::F32)? * 0.5f32)?),
        ("z.last", Tensor::from_vec(vec![7i32], [1, 1])?),
    ];
    let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    nn::save(&path, &named)?;
    let loaded = nn::load(&path)?;
    assert_eq!(loaded.len(), tensors.len());
    for (name, t) in &tensors {
        let (_, back) = loaded
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} is in the file"));
        assert_eq!(back.dtype(), t.dtype(), "{name}");
        assert_eq!(back.dims(), t.dims(), "{name}");
        assert_eq!(bits(back)?, bits(t)?, "{name}");
    }
    Ok(())
}

#[test]
fn a_saved_mlp_loads_into_another() -> Result<()> {
    let path = dir("mlp").join("mlp.safetensors");
    let trained = Mlp::new(&[784, 32, 10], 0)?;
    nn::save(&path, &trained.parameters())?;
    let mut fresh = Mlp::new(&[784, 32, 10], 1)?;
    nn::set_parameters(fresh.parameters_mut(), nn::load(&path)?)?;
    let x = Tensor::rand([5, 784], 2)?;
    assert_eq!(
        fresh.forward(&x)?.to_vec::<f32>()?,
        trained.forward(&x)?.to_vec::<f32>()?
    );
    Ok(())
}

#[test]
fn save_refuses_names_the_format_cannot_hold() -> Result<()> {
    let path = dir("names").join("bad.safetensors");
    let t = Tensor::scalar(1.0f32);
    assert_eq!(
        message(nn::save(&path, &[("a", &t), ("b", &t), ("a", &t)])),
        format!("{}: tensor 'a' is given twice", path.display())
    );
    assert_eq!(
        message(nn::save(&path, &[("__metadata__", &t)])),
        format!(
            "{}: '__metadata__' is the format's own key, not a tensor name",
            path.display()
        )
    );
    let missing = dir("names").join("no/such/dir/x.safetensors");
    let err = nn::save(&missing, &[("a", &t)])
        .map(|_| ())
        .expect_err("no such directory");
    assert!(
        matches!(&err, Error::Data(kiln::data::DataError::Io { path, .. }) if path == &missing),
        "{err}"
    );
    Ok(())
}

/// A safetensors file: the header's length, the header, the data.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

#[test]
fn a_file_written_by_hand_loads() -> Result<()> {
    // As another writer may lay it out: f64 and i64 (loaded as they are),
    // metadata, a name order unlike the byte order.
    let mut data: Vec<u8> = [1.5f64, -2.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    data.extend([-3i64, 1 << 40].iter().flat_map(|v| v.to_le_bytes()));
    let header = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[2],"data_offsets":[16,32]},"a":{"dtype":"F64","shape":[1,2],"data_offsets":[0,16]}}"#;
    let path = dir("by-hand").join("x.safetensors");
    std::fs::write(&path, file(header, &data)).expect("written");
    let loaded = nn::load(&path)?;
    let names: Vec<&str> = loaded.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b"], "in byte order");
    assert_eq!(loaded[0].1.dtype(), DType::F64);
    assert_eq!(loaded[0].1.dims(), [1, 2]);
    assert_eq!(loaded[0].1.to_vec::<f64>()?, [1.5, -2.25]);
    assert_eq!(loaded[1].1.to_vec::<i64>()?, [-3, 1 << 40]);
    Ok(())
}

#[test]
fn corrupt_files_name_the_file_and_the_offset() -> Result<()> {
    let d = dir("corrupt");
    let good = file(
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        &[0, 0, 128, 63, 0, 0, 0, 64],
    );
    let data_start = good.len() - 8;
    let mut not_utf8 = good.clone();
    not_utf8[8 + 3] = 0xff;
    let mut appended = good.clone();
    appended.push(0);
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (
            "empty",
            vec![],
            "at byte 0: truncated: 0 bytes, fewer than the header's 8-byte length".into(),
        ),
        (
            "short",
            vec![1, 2, 3],
            "at byte 0: truncated: 3 bytes, fewer than the header's 8-byte length".into(),
        ),
        (
            "header past the end",
            good[..20].to_vec(),
            format!(
                "at byte 0: the header's length, {}, runs past the end of the file (20 bytes)",
                data_start - 8
            ),
        ),
        (
            "header too large",
            u64::MAX.to_le_bytes().to_vec(),
            format!(
                "at byte 0: the header's length, {}, is past the format's limit of 100 MB",
                u64::MAX
            ),
        ),
        (
            "not utf-8",
            not_utf8,
            "at byte 11: the header is not UTF-8".into(),
        ),
        (
            "not json",
            file(r#"{"w": [1, }"#, &[]),
            "at byte 18: the header is not valid: expected value at line 1 column 11".into(),
        ),
        (
            "bad offsets",
            file(
                r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                &[0; 12],
            ),
            "at byte 8: the header is not valid: invalid offset for tensor `w`".into(),
        ),
        (
            "size disagrees with shape",
            file(
                r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
            "at byte 8: the header is not valid: invalid shape, data type, or offset for tensor"
                .into(),
        ),
        (
            "truncated data",
            good[..good.len() - 1].to_vec(),
            format!(
                "at byte {data_start}: the tensors the header lists do not fill the 7 bytes after it exactly: the file is truncated or has bytes appended"
            ),
        ),
        (
            "appended data",
            appended,
            format!(
                "at byte {data_start}: the tensors the header lists do not fill the 9 bytes after it exactly: the file is truncated or has bytes appended"
            ),
        ),
        (
            "bool of 2",
            file(
                r#"{"m":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}}"#,
                &[1, 0, 2, 1],
            ),
            // 8 + the 55-byte header + element 2.
            "at byte 65: tensor 'm': a bool holds a byte other than 0 or 1".into(),
        ),
        (
            "i16",
            file(
                r#"{"h":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}}"#,
                &[0; 4],
            ),
            "at byte 62: tensor 'h' is I16; kiln reads f32, f64, bf16, f16, i32, i64, u8 and bool"
                .into(),
        ),
    ];
    for (what, bytes, expected) in cases {
        let path = d.join(format!("{}.safetensors", what.replace(' ', "-")));
        std::fs::write(&path, &bytes).expect("written");
        let got = message(nn::load(&path));
        assert_eq!(got, format!("{}: {expected}", path.display()), "{what}");
    }
    Ok(())
}
