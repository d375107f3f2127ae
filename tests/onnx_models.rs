//! Small models of the architectures people export (a ResNet, a
//! MobileNet with squeeze-excitation, a ViT, a GPT-style decoder, a U-Net;
//! `tests/onnx/models/make.py` wrote them and onnxruntime's outputs),
//! compiled on the CPU, fused and unfused, and on the interpreter: each
//! within 1e-4 of the largest output of onnxruntime's.

use std::path::PathBuf;

use kiln::data::npy::NpyArray;
use kiln::onnx::{Feed, Model};
use kiln::{CompileOptions, DType, Device, Options, Result, Tensor};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/models")
}

/// The array of `name.npy`, as a tensor.
fn array(name: &str) -> Result<Tensor> {
    let a = NpyArray::open(dir().join(format!("{name}.npy")))?;
    let count = a.header().shape.first().copied().unwrap_or(1);
    a.rows(0, count)
}

fn check(name: &str, input: &str) -> Result<()> {
    let model = Model::load(dir().join(format!("{name}.onnx")))?;
    let x = array(&format!("{name}_{input}"))?;
    // `.npy` int64 reads as i32, as datasets take it; the decoder's ids
    // are INT64.
    let x = match input {
        "ids" => x.cast(DType::I64)?,
        _ => x,
    };
    let want = array(&format!("{name}_out"))?.to_vec::<f32>()?;
    let scale = want.iter().fold(0.0f32, |m, w| m.max(w.abs()));
    let paths = [
        (Device::Cpu, true),
        (Device::Cpu, false),
        (Device::Reference, true),
    ];
    for (device, fusion) in paths {
        let options = CompileOptions {
            device,
            optimizer: Options {
                fusion,
                ..Options::default()
            },
            ..CompileOptions::default()
        };
        let feeds = [Feed::Input(x.ty().clone())];
        let got = model.compile_with(&feeds, options)?.call(&[&x])?;
        assert_eq!(got.len(), 1, "{name}");
        let got = got[0].to_vec::<f32>()?;
        assert_eq!(got.len(), want.len(), "{name}: outputs");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * scale,
                "{name} on {device:?}, fusion {fusion}: element {i}: got {g}, want {w} (largest {scale})"
            );
        }
    }
    Ok(())
}

#[test]
fn a_resnet_matches_onnxruntime() -> Result<()> {
    check("resnet", "x")
}

#[test]
fn a_mobilenet_with_squeeze_excitation_matches_onnxruntime() -> Result<()> {
    check("mobilenet", "x")
}

#[test]
fn a_vision_transformer_matches_onnxruntime() -> Result<()> {
    check("vit", "x")
}

#[test]
fn a_gpt_style_decoder_matches_onnxruntime() -> Result<()> {
    check("decoder", "ids")
}

#[test]
fn a_unet_with_transposed_convolutions_and_resizes_matches_onnxruntime() -> Result<()> {
    check("unet", "x")
}
