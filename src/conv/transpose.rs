//! `Tensor::conv_transpose2d`: the gradient of `conv2d` with respect to
//! its input, as the convolution it transposes, or as one product per
//! group where the stride is the kernel's size.

use kiln_ir::Scalar;

use super::{bias_misfit, check_float_pair, crop, window_error};
use crate::{Result, Tensor};

impl Tensor {
    /// 2-D transposed convolution of NCHW f32 or f64 data with IOHW weights
    /// (`[in_channels, out_channels / groups, kh, kw]`), PyTorch's
    /// `conv_transpose2d` and ONNX's `ConvTranspose`: the gradient of
    /// `conv2d` with respect to its input. Each output axis is `(len - 1) *
    /// stride - before - after + dilation * (k - 1) + output_padding + 1`
    /// long, `output_padding` below `stride` or `dilation`.
    ///
    /// Computed as the convolution it transposes: the input spread out by
    /// the stride (zeros between its elements), padded by the kernel's
    /// reach less `padding`, convolved with the weight flipped and its
    /// channel axes swapped per group; where the stride is the kernel's
    /// size (no dilation, no output padding), as one product per group
    /// (`blocks`).
    // PyTorch's `F.conv_transpose2d` signature, argument for argument.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: [usize; 2],
        padding: [(usize, usize); 2],
        output_padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<Tensor> {
        const OP: &str = "conv_transpose2d";
        check_float_pair(OP, self, weight)?;
        let zero = Scalar::F32(0.0).cast(self.dtype());
        let (x, w) = (self.dims().to_vec(), weight.dims().to_vec());
        let mismatch = |message: String| {
            window_error(
                OP,
                format!(
                    "input {} and weight {}: {message}",
                    self.shape(),
                    weight.shape()
                ),
            )
        };
        if groups == 0 || x[1] != w[0] || w[0] % groups != 0 {
            return Err(mismatch(format!(
                "the weight's {} input channels, in {groups} groups, must be the input's {}",
                w[0], x[1]
            )));
        }
        if let Some(message) = bias_misfit(bias, self.dtype(), groups * w[1]) {
            return Err(mismatch(message));
        }
        let kernel = [w[2], w[3]];
        if x[2] == 0 || x[3] == 0 {
            return Err(mismatch(
                "an empty spatial axis has nothing to spread".to_string(),
            ));
        }
        let mut pads = [(0, 0); 2];
        let mut crops = [(0, 0); 2];
        for a in 0..2 {
            if stride[a] == 0 || dilation[a] == 0 || kernel[a] == 0 {
                return Err(mismatch(
                    "stride, dilation and kernel must be at least 1".to_string(),
                ));
            }
            if output_padding[a] >= stride[a].max(dilation[a]) {
                return Err(mismatch(format!(
                    "output_padding {output_padding:?} must be below the stride or the dilation"
                )));
            }
            // The kernel's reach beyond each edge, less the padding: padded
            // where positive, cropped where the padding is larger.
            let reach = dilation[a] * (kernel[a] - 1);
            let (before, after) = (padding[a].0, padding[a].1);
            let full = (x[2 + a] - 1) * stride[a] + reach + output_padding[a] + 1;
            if before + after >= full {
                return Err(mismatch(format!(
                    "padding {:?} leaves no output of axis {} ({full} long before it)",
                    padding[a],
                    2 + a
                )));
            }
            let after_reach = reach + output_padding[a];
            pads[a] = (
                reach.saturating_sub(before),
                after_reach.saturating_sub(after),
            );
            crops[a] = (
                before.saturating_sub(reach),
                after.saturating_sub(after_reach),
            );
        }
        if stride == kernel && dilation == [1, 1] && output_padding == [0, 0] {
            return blocks(self, weight, bias, groups, padding);
        }
        let (n, c) = (x[0], x[1]);
        // Zeros between the elements: [N, C, H, 1, W, 1] padded to the
        // stride, merged, and the trailing zeros cut.
        let spread = self
            .reshape([n, c, x[2], 1, x[3], 1])?
            .pad(
                &[
                    (0, 0),
                    (0, 0),
                    (0, 0),
                    (0, stride[0] - 1),
                    (0, 0),
                    (0, stride[1] - 1),
                ],
                zero,
            )?
            .reshape([n, c, x[2] * stride[0], x[3] * stride[1]])?
            .slice(2, 0, (x[2] - 1) * stride[0] + 1, 1)?
            .slice(3, 0, (x[3] - 1) * stride[1] + 1, 1)?;
        let padded = spread.pad(&[(0, 0), (0, 0), pads[0], pads[1]], zero)?;
        let cropped = crop(&padded, 2, crops[0])?;
        let cropped = crop(&cropped, 3, crops[1])?;
        // [in, out/g, kh, kw] -> [out, in/g, kh, kw], flipped in space.
        let (ig, og) = (w[0] / groups, w[1]);
        let flip =
            |len: usize| Tensor::from_vec((0..len as i32).rev().collect::<Vec<i32>>(), [len]);
        let swapped = weight
            .reshape([groups, ig, og, w[2], w[3]])?
            .permute(&[0, 2, 1, 3, 4])?
            .reshape([groups * og, ig, w[2], w[3]])?
            .index_select(2, &flip(w[2])?)?
            .index_select(3, &flip(w[3])?)?;
        cropped.conv2d(&swapped, bias, [1, 1], [(0, 0); 2], dilation, groups)
    }
}

/// `conv_transpose2d` with strides as long as the kernel, no dilation and
/// no output padding (a U-Net's 2x2 upsampling): each output element takes
/// one input element through one weight, so each group is one product of
/// its weight, `[out * kh * kw, in]`, with the input's pixels, whose
/// `[kh, kw]` blocks are then laid side by side and cropped by `padding`.
/// The convolution over the input spread by the stride would multiply its
/// zeros too (at stride 2, three products in four) after writing the
/// spread and padded input. Checked by the caller.
fn blocks(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    groups: usize,
    padding: [(usize, usize); 2],
) -> Result<Tensor> {
    let (n, c, h, w) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    let (og, kh, kw) = (weight.dims()[1], weight.dims()[2], weight.dims()[3]);
    let (g, cg) = (groups, c / groups);
    let rows = weight
        .reshape([g, cg, og, kh, kw])?
        .permute(&[0, 2, 3, 4, 1])?
        .reshape([g, og * kh * kw, cg])?;
    let products =
        rows.matmul(&x.reshape([n, g, cg, h * w])?)?
            .reshape([n, g, og, kh * kw * h * w])?;
    // Added before the blocks are laid out, the bias rides in the copy
    // that lays them out; added after, it was a pass of its own.
    let products = match bias {
        Some(b) => products.add(&b.reshape([g, og, 1])?)?,
        None => products,
    };
    let y = products
        .reshape([n, g, og, kh, kw, h, w])?
        .permute(&[0, 1, 2, 5, 3, 6, 4])?
        .reshape([n, g * og, h * kh, w * kw])?;
    crop(&crop(&y, 2, padding[0])?, 3, padding[1])
}
