//! Elementwise kernels: a grid-stride loop over the output. Where the loop
//! plan says `Vectors::Four` (an f32 or 16-bit float output) every step
//! computes four elements: reads of a contiguous f32 or 16-bit float buffer
//! at the output's own index are 16-byte `float4` or 8-byte `uint2` loads,
//! the result is one such store, and a scalar loop does the tail. Other
//! reads compute their index from the output coordinates. A matmul's
//! prologues and epilogue kernel are elementwise kernels too.

use std::collections::BTreeSet;

use kiln_ir::kernel::{Block, Expr, SideOutput};
use kiln_ir::{DType, TensorType};

use super::writer::{Element, Writer};
use super::{Grid, Program};
use crate::Error;
use crate::loops::{Target, Vectors};
use crate::nest::placed_axes;

/// An elementwise kernel computing `body` over `out`, and storing the
/// `side` values of the body with it (parameters `side0`, ... after `out`,
/// of `out`'s dtype); with `acc`, it also reads the product of a matmul as
/// `acc[i]`.
pub(crate) fn elementwise(
    inputs: &[TensorType],
    acc: Option<()>,
    body: &Block,
    out: &TensorType,
    side: &[SideOutput],
) -> Result<Program, Error> {
    let n = out.shape.numel();
    let mut w = Writer::new();
    w.signature(inputs, acc.is_some(), out.dtype, side.len());
    let dims = placed_axes(&out.shape, 0..out.shape.rank());
    let strided = body.values.iter().any(|v| match &v.expr {
        Expr::Load { view, .. } => !view.is_contiguous(),
        Expr::Gather { .. } => true,
        _ => false,
    });
    let vector = Target::CUDA.map_vectors(out) == Vectors::Four;
    let step = "(long long)gridDim.x * blockDim.x";
    let first = "(long long)blockIdx.x * blockDim.x + threadIdx.x";
    let scalar_from = if vector {
        // Four elements per step: contiguous reads as vectors, one vector store.
        w.line(1, &format!("const long long vectors = {};", n / 4));
        w.line(
            1,
            &format!("for (long long q = {first}; q < vectors; q += {step}) {{"),
        );
        let contiguous: BTreeSet<u32> = body
            .values
            .iter()
            .filter_map(|v| match &v.expr {
                Expr::Load { input, view }
                    if view.is_contiguous() && in_vectors(inputs[*input as usize].dtype) =>
                {
                    Some(*input)
                }
                _ => None,
            })
            .collect();
        for input in &contiguous {
            let v = vector_type(inputs[*input as usize].dtype);
            w.line(
                2,
                &format!("const {v} l{input} = reinterpret_cast<const {v}*>(in{input})[q];"),
            );
        }
        if acc.is_some() {
            w.line(
                2,
                "const float4 a4 = reinterpret_cast<const float4*>(acc)[q];",
            );
        }
        let mut results = Vec::new();
        for lane in ['x', 'y', 'z', 'w'] {
            let (suffix, index, coords) =
                (format!("_{lane}"), format!("i_{lane}"), format!("c{lane}_"));
            let offset = "xyzw".find(lane).unwrap_or(0);
            w.line(2, &format!("const long long {index} = 4 * q + {offset};"));
            if strided {
                w.coords(2, &coords, &index, &dims);
            }
            let acc_lane = format!("a4.{lane}");
            let element = Element {
                suffix: &suffix,
                index: &index,
                coords: &coords,
                lane: Some(lane),
                acc: acc.map(|_| acc_lane.as_str()),
            };
            results.push(w.block(2, body, inputs, &element)?);
        }
        let store = vector_store(&mut w, out.dtype, "out", &results);
        w.line(2, &store);
        for (k, s) in side.iter().enumerate() {
            let lanes: Vec<String> = "xyzw"
                .chars()
                .map(|l| format!("v{}_{l}", s.value))
                .collect();
            let store = vector_store(&mut w, out.dtype, &format!("side{k}"), &lanes);
            w.line(2, &store);
        }
        w.line(1, "}");
        format!("vectors * 4 + {first}")
    } else {
        first.to_string()
    };
    w.line(
        1,
        &format!("for (long long i = {scalar_from}; i < {n}; i += {step}) {{"),
    );
    if strided {
        w.coords(2, "c", "i", &dims);
    }
    let element = Element {
        suffix: "",
        index: "i",
        coords: "c",
        lane: None,
        acc: acc.map(|_| "acc[i]"),
    };
    let result = w.block(2, body, inputs, &element)?;
    let result = w.stored(out.dtype, &result);
    w.line(2, &format!("out[i] = {result};"));
    for (k, s) in side.iter().enumerate() {
        let value = w.stored(out.dtype, &format!("v{}", s.value));
        w.line(2, &format!("side{k}[i] = {value};"));
    }
    w.line(1, "}");
    w.line(0, "}");
    let steps = if vector { n / 4 } else { n };
    Ok(w.finish(Grid::Flat {
        steps: steps.max(1),
    }))
}

/// Whether a step of four elements reads a contiguous buffer of `dtype` as
/// one vector: f32 as a `float4`, 16-bit floats as a `uint2`.
pub(super) fn in_vectors(dtype: DType) -> bool {
    dtype == DType::F32 || dtype.is_half()
}

/// The vector of four elements of `dtype` (`in_vectors`).
fn vector_type(dtype: DType) -> &'static str {
    if dtype == DType::F32 {
        "float4"
    } else {
        "uint2"
    }
}

/// Element `lane` (`x`, `y`, `z`, `w`) of vector `l{input}` of four
/// `dtype` elements, as memory holds it: 16-bit floats are two to a 32-bit
/// word, the first in its low half.
pub(super) fn vector_lane(input: u32, dtype: DType, lane: char) -> String {
    if dtype == DType::F32 {
        return format!("l{input}.{lane}");
    }
    match lane {
        'x' => format!("(unsigned short)l{input}.x"),
        'y' => format!("(unsigned short)(l{input}.x >> 16)"),
        'z' => format!("(unsigned short)l{input}.y"),
        _ => format!("(unsigned short)(l{input}.y >> 16)"),
    }
}

/// The statement storing `values` (four registers) into `buffer` of
/// `dtype` as one vector at step `q`.
fn vector_store(w: &mut Writer, dtype: DType, buffer: &str, values: &[String]) -> String {
    if dtype == DType::F32 {
        return format!(
            "reinterpret_cast<float4*>({buffer})[q] = make_float4({});",
            values.join(", ")
        );
    }
    let halves: Vec<String> = values.iter().map(|v| w.stored(dtype, v)).collect();
    let word = |lo: &str, hi: &str| format!("(unsigned int){lo} | ((unsigned int){hi} << 16)");
    format!(
        "reinterpret_cast<uint2*>({buffer})[q] = make_uint2({}, {});",
        word(&halves[0], &halves[1]),
        word(&halves[2], &halves[3])
    )
}
