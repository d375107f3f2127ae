//! ONNX's LSTM, GRU (`linear_before_reset`) and RNN, bidirectional over a
//! batch whose `sequence_lens` are 5, 3 and 1, against onnxruntime's
//! outputs (`tests/onnx/recurrent/make.py` wrote the models and them), on
//! the CPU and the interpreter: the state held and the output zero past
//! each element's length, the reverse direction starting at its own last
//! step.

use std::path::PathBuf;

use kiln::data::npy::NpyArray;
use kiln::onnx::{Feed, Model};
use kiln::{CompileOptions, Device, Result, Tensor};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/recurrent")
}

/// The array of `name.npy`, as a tensor.
fn array(name: &str) -> Result<Tensor> {
    let a = NpyArray::open(dir().join(format!("{name}.npy")))?;
    let count = a.header().shape.first().copied().unwrap_or(1);
    a.rows(0, count)
}

#[test]
fn recurrent_layers_match_onnxruntime_with_sequence_lengths() -> Result<()> {
    for (op, outputs) in [
        ("lstm", &["Y", "Y_h", "Y_c"][..]),
        ("gru", &["Y", "Y_h"]),
        ("rnn", &["Y", "Y_h"]),
    ] {
        let model = Model::load(dir().join(format!("{op}.onnx")))?;
        let x = array(&format!("{op}_X"))?;
        for device in [Device::Cpu, Device::Reference] {
            let feeds = [Feed::Input(x.ty().clone())];
            let got = model
                .compile_with(&feeds, CompileOptions::on(device))?
                .call(&[&x])?;
            assert_eq!(got.len(), outputs.len(), "{op}");
            for (g, name) in got.iter().zip(outputs) {
                let want = array(&format!("{op}_{name}"))?;
                assert_eq!(g.dims(), want.dims(), "{op} {name}");
                for (i, (a, b)) in g
                    .to_vec::<f32>()?
                    .iter()
                    .zip(want.to_vec::<f32>()?)
                    .enumerate()
                {
                    assert!(
                        (a - b).abs() <= 1e-5,
                        "{op} {name} on {device:?}: element {i}: got {a}, want {b}"
                    );
                }
            }
        }
    }
    Ok(())
}
