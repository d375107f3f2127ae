//! `bench_report`'s `embedding` row.

use kiln::{DType, Data, DataRef, Result, Tensor, TensorType};

use crate::{floats, max_rel_err, time};

/// A GPT-2-sized embedding lookup: 128 i64 token ids (some counted from the
/// end) into a [50257, 768] f32 table, both inputs of a compiled graph
/// (variant `fused`); and its gradient with respect to the table for a
/// given [128, 768] gradient of the rows (variant `backward`: the table's
/// gradient zeroed and each row added where its id points). Checked: every
/// row against the table's, the gradient's sum against the rows'.
pub(crate) fn embedding(quick: bool) -> Result<()> {
    eprintln!("embedding");
    let (vocab, width, tokens) = (50257usize, 768usize, 128usize);
    let table = Tensor::randn([vocab, width], 3)?;
    let ids: Vec<i64> = (0..tokens as i64)
        .map(|t| (t * 7919) % 50257 - 100)
        .collect();
    let spec = [table.ty().clone(), TensorType::new(DType::I64, [tokens])];
    let mut compiled = kiln::compile("embedding", &spec, |t| {
        Ok(vec![t[0].index_select(0, &t[1])?])
    })?;
    let data = [Data::F32(table.to_vec()?), Data::I64(ids.clone())];
    let refs: Vec<DataRef> = data.iter().map(DataRef::from).collect();
    let mut out = compiled.output_buffers()?;
    compiled.run_into(&refs, &mut out)?;
    let rows = floats(&data[0]);
    let want: Vec<f64> = ids
        .iter()
        .flat_map(|&i| {
            let r = i.rem_euclid(vocab as i64) as usize;
            rows[r * width..(r + 1) * width]
                .iter()
                .map(|&x| f64::from(x))
        })
        .collect();
    let err = max_rel_err(floats(&out[0]), &want);
    let spec = [
        spec[0].clone(),
        spec[1].clone(),
        TensorType::new(DType::F32, [tokens, width]),
    ];
    let mut backward = kiln::compile("embedding_backward", &spec, |t| {
        let loss = (t[0].index_select(0, &t[1])? * &t[2])?.sum_all()?;
        kiln::grad(&loss, &[&t[0]])
    })?;
    let dy = Tensor::randn([tokens, width], 4)?.to_vec::<f32>()?;
    let sum: f64 = dy.iter().map(|&x| f64::from(x)).sum();
    let data = [data[0].clone(), data[1].clone(), Data::F32(dy)];
    let grad_refs: Vec<DataRef> = data.iter().map(DataRef::from).collect();
    let mut grad = backward.output_buffers()?;
    backward.run_into(&grad_refs, &mut grad)?;
    let got: f64 = floats(&grad[0]).iter().map(|&x| f64::from(x)).sum();
    let grad_err = (got - sum).abs() / sum.abs().max(1.0);
    // Apart: the backward's writes would push the rows out of cache.
    let forward = time(quick, 1, |_| {
        compiled.run_into(&refs, &mut out).map(|()| None)
    })?;
    let back = time(quick, 1, |_| {
        backward.run_into(&grad_refs, &mut grad).map(|()| None)
    })?;
    let rows = 2 * tokens * width * 4;
    for (variant, timing, bytes, err) in [
        ("fused", &forward[0], rows, err),
        ("backward", &back[0], rows + vocab * width * 4, grad_err),
    ] {
        println!(
            "{{\"workload\":\"embedding\",\"shape\":\"{vocab}x{width}[{tokens}]\",\"variant\":\"{variant}\",\"backend\":\"cpu\",{},\"kernels\":1,\"bytes\":{bytes},\"flops\":0,\"max_rel_err\":{err:.2e}}}",
            timing.fields(),
        );
    }
    Ok(())
}
