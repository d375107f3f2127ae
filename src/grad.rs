//! `kiln::grad` and `kiln::value_and_grad`: gradients of a loss as lazy
//! tensors.
//!
//! The graph behind the loss is captured (as `realize` would), the IR's
//! reverse-mode transform (`kiln_ir::grad`) appends the nodes of the
//! backward pass to it, and those nodes are recorded again as lazy tensors
//! whose operands are the tensors the forward nodes came from. So the
//! gradients share the user's forward tensors: realizing the loss and its
//! gradients together, or returning them from a `kiln::compile`d function,
//! computes the forward pass once, in the same fused kernels as the
//! backward pass. Nothing is computed by `grad` itself, so it works on the
//! placeholders of a function being traced by `kiln::compile`, and a
//! compiled function's gradients are traced once, like everything else.

use crate::tensor::{capture_nodes, cut_by_reads, gradient_inputs};
use crate::{Error, Result, Tensor};

/// The gradients of `loss` (a float tensor of one element) with respect to
/// each tensor of `wrt`, in order, each of its tensor's shape: lazy tensors,
/// to compute with further or to realize.
///
/// A tensor of `wrt` that `loss` does not depend on gets zeros, as in JAX.
/// A tensor that holds data, given or already computed, is a constant to
/// `grad`: a realized tensor has forgotten the ops that made it, so no
/// gradient could flow through it to what it was computed from. Where a
/// tensor of `wrt` went into such a value on the way to the loss (the loss
/// read with `to_scalar`, an activation logged with `to_vec`), its
/// gradient would miss those paths, and `grad` is an `Err` saying so.
/// Differentiate before reading, or read the loss and the gradients
/// together (`kiln::realize`, or `value_and_grad`). (The outputs of a
/// compiled graph's `call` or of a step are data too, and a gradient never
/// flows back through them.)
///
/// A loss or a `wrt` tensor of an integer or bool type is an `Err` naming
/// the op that made it (integer values have no gradient, even where they
/// would be continuous), and so is a loss of more than one element.
///
/// ```
/// use kiln::Tensor;
/// # fn main() -> kiln::Result<()> {
/// let w = Tensor::from_vec(vec![1.0f32, -2.0], [2])?;
/// let loss = w.square()?.sum_all()?;
/// let g = kiln::grad(&loss, &[&w])?; // nothing computed yet
/// assert_eq!(g[0].to_vec::<f32>()?, [2.0, -4.0]);
/// # Ok(())
/// # }
/// ```
pub fn grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
    let mut outputs = vec![loss];
    outputs.extend_from_slice(wrt);
    let (mut graph, _, mut tensors) = capture_nodes("grad", &outputs);
    let (loss_id, wrt_ids) = (graph.outputs[0], graph.outputs[1..].to_vec());
    // The values the loss's gradient reaches; one among them that was
    // read cuts the paths of what went into it.
    let reached = gradient_inputs(&graph, loss_id);
    let cut = cut_by_reads(&reached.iter().map(|&i| &tensors[i]).collect::<Vec<_>>());
    if let Some(index) = wrt.iter().position(|t| cut.contains(&t.id())) {
        return Err(Error::GradThroughRead {
            index,
            ty: wrt[index].ty().clone(),
        });
    }
    let grads = kiln_ir::grad(&mut graph, loss_id, &wrt_ids)?;
    for node in &graph.nodes[tensors.len()..] {
        let src: Vec<&Tensor> = node.inputs.iter().map(|x| &tensors[x.index()]).collect();
        let tensor = Tensor::lazy(node.op.clone(), &src)?;
        tensors.push(tensor);
    }
    Ok(grads.iter().map(|g| tensors[g.index()].clone()).collect())
}

/// The loss with its gradients (as `grad` gives them): the values a training
/// step returns together, so that one graph computes the forward pass once
/// for both.
pub fn value_and_grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
    Ok((loss.clone(), grad(loss, wrt)?))
}
