//! 2-D convolution and pooling over NCHW tensors (f32 or f64; max pooling
//! over every number type), as composites of the graph's movement and elementwise ops (and its
//! matmul), so that the optimizer fuses them and `kiln::grad`
//! differentiates them like any other composite.
//!
//! Every form reads the input through sliding windows: the input padded on
//! its two spatial axes and sliced with the stride, one slice per kernel
//! position `(kh, kw)` (a view, never a copy of the window). Pooling
//! combines the slices elementwise (max, or sum times one over the count).
//! A convolution is either
//!
//! - a multiply-and-sum: one elementwise chain over the output of
//!   `w[o, c, kh, kw] * window[c, kh, kw]` for every input channel and
//!   kernel position, bias and whatever follows (relu) in the same
//!   kernel; for one output channel per group and small `channels x
//!   kernel` (a depthwise convolution), where it is one pass over memory; or
//! - im2col and the GEMM: per image and group, the weights times the
//!   matrix whose rows are the windows, a view of the padded input
//!   (`Tensor::unfold`) that the GEMM packs where it lies, the bias and
//!   whatever follows in the product's epilogue.
//!
//! Where the windows step by one, the padded input is stored once before
//! they read it (strided windows read the input in place, `padded`), but
//! for a depthwise window whose sum the CPU's machine kernel takes
//! (`kiln_runtime::cpu::sums_taps`), which pads each plane itself. A
//! padded view cannot be reshaped (`fold-views` keeps it a node of its own and
//! `fuse` copies it), so a reshape adding an axis of one makes it a buffer:
//! each window then reads it without a mask, which the CPU backend does
//! four lanes at a time, where a masked read is a scalar load and a select.
//! (Nothing in the IR asks for a buffer by name; this is the one way.)

use kiln_ir::{DType, ReduceOp, Scalar};

use crate::{Error, Result, Tensor};

mod transpose;

/// A convolution with one output channel per group (depthwise, or a single
/// filter) and at most this many products per output (`channels per group
/// x kernel positions`) is one elementwise chain; every other is im2col and
/// the GEMM. The chain reads every window once per output channel and holds
/// every term in one kernel, where the GEMM reads each window once for all
/// the output channels of its group. The chain took less time than the
/// GEMM for one filter over 3 channels and for depthwise over 32 channels,
/// and more for one filter over 16 channels (144 terms) and for 4 or 32
/// filters (`benches/RESULTS-cpu.md`).
const DIRECT_TERMS: usize = 64;

/// Above this many elements a pooling window is taken along the width,
/// then along the height (see `pool`).
const SEPARATE_POOL: usize = 25;

/// The window of a pooling op (or a convolution's, inside `conv2d`) over
/// the two spatial axes of NCHW data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2d {
    /// The window's height and width.
    pub kernel: [usize; 2],
    /// Steps between windows along height and width.
    pub stride: [usize; 2],
    /// `(before, after)` padding of height and width; the padding never
    /// wins a max and, unless asked, never counts in an average.
    pub padding: [(usize, usize); 2],
    /// Steps between the window's elements along height and width.
    pub dilation: [usize; 2],
    /// Round the output size up (a last, partial window) instead of down.
    pub ceil_mode: bool,
}

impl Pool2d {
    /// A window of `kernel` stepping by its own size, no padding, no dilation.
    pub fn new(kernel: [usize; 2]) -> Pool2d {
        Pool2d {
            kernel,
            stride: kernel,
            padding: [(0, 0); 2],
            dilation: [1, 1],
            ceil_mode: false,
        }
    }
}

/// One spatial axis of a sliding window: where its windows start and how
/// many there are.
#[derive(Clone, Copy, Debug)]
struct Axis {
    kernel: usize,
    stride: usize,
    dilation: usize,
    /// Padding before and after, as asked.
    pad: (usize, usize),
    /// Padding after the asked padding that only a ceil-mode last window reaches.
    extra: usize,
    /// The number of windows.
    out: usize,
}

impl Axis {
    /// The windows of `len` input elements, or the reason there are none.
    fn new(
        len: usize,
        kernel: usize,
        stride: usize,
        pad: (usize, usize),
        dilation: usize,
        ceil_mode: bool,
    ) -> std::result::Result<Axis, String> {
        if kernel == 0 || stride == 0 || dilation == 0 {
            return Err(format!(
                "kernel {kernel}, stride {stride} and dilation {dilation} must be at least 1"
            ));
        }
        let padded = len + pad.0 + pad.1;
        let span = dilation * (kernel - 1) + 1;
        if span > padded {
            return Err(format!(
                "a kernel of {kernel} (dilation {dilation}) spans {span} elements, more than the {padded} of the padded input"
            ));
        }
        let mut out = match ceil_mode {
            true => (padded - span).div_ceil(stride) + 1,
            false => (padded - span) / stride + 1,
        };
        // A last window must start inside the input or its leading padding
        // (PyTorch's and ONNX's rule for ceil mode).
        if ceil_mode && (out - 1) * stride >= len + pad.0 {
            out -= 1;
        }
        let extra = ((out - 1) * stride + span).saturating_sub(padded);
        Ok(Axis {
            kernel,
            stride,
            dilation,
            pad,
            extra,
            out,
        })
    }

    /// Input positions (counted from the start of the padded input) that
    /// window `o` reads at kernel position `k`.
    fn position(&self, o: usize, k: usize) -> usize {
        o * self.stride + k * self.dilation
    }
}

fn window_error(op: &'static str, message: String) -> Error {
    Error::Window { op, message }
}

/// `x` with `(before, after)` elements cut from the ends of `axis`, which
/// is longer than both together.
fn crop(x: &Tensor, axis: usize, (before, after): (usize, usize)) -> Result<Tensor> {
    if before == 0 && after == 0 {
        return Ok(x.clone());
    }
    x.slice(axis as isize, before, x.dims()[axis] - after, 1)
}

/// What is wrong with `bias` where it is not `dtype` `[o]`.
fn bias_misfit(bias: Option<&Tensor>, dtype: DType, o: usize) -> Option<String> {
    let b = bias.filter(|b| b.dims() != [o] || b.dtype() != dtype)?;
    Some(format!(
        "the bias must be {dtype} [{o}], got {} {}",
        b.dtype(),
        b.shape()
    ))
}

/// The two spatial axes of `x` (NCHW) under `window`, checked.
fn spatial(op: &'static str, x: &Tensor, window: &Pool2d) -> Result<[Axis; 2]> {
    let Pool2d {
        kernel,
        stride,
        padding,
        dilation,
        ceil_mode,
    } = *window;
    let dims = x.dims();
    let axis = |a: usize| {
        Axis::new(
            dims[2 + a],
            kernel[a],
            stride[a],
            padding[a],
            dilation[a],
            ceil_mode,
        )
        .map_err(|m| {
            let name = ["height", "width"][a];
            window_error(op, format!("input {}: {name}: {m}", x.shape()))
        })
    };
    Ok([axis(0)?, axis(1)?])
}

/// Convolutions and averages compute in f32 or f64.
fn check_float(op: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 => Ok(()),
        _ => Err(kiln_ir::Error::DType {
            op,
            dtype,
            expected: "f32 or f64",
        }
        .into()),
    }
}

/// A convolution's 4-axis input and weight, of one type, f32 or f64.
fn check_float_pair(op: &'static str, x: &Tensor, weight: &Tensor) -> Result<()> {
    check_4d(op, x)?;
    check_4d(op, weight)?;
    check_float(op, x.dtype())?;
    if weight.dtype() != x.dtype() {
        return Err(kiln_ir::Error::DTypeMismatch {
            op,
            lhs: x.dtype(),
            rhs: weight.dtype(),
        }
        .into());
    }
    Ok(())
}

/// Checks that `t` is NCHW-like data of rank 4.
fn check_4d(op: &'static str, t: &Tensor) -> Result<()> {
    match t.rank() {
        4 => Ok(()),
        _ => Err(Error::Rank {
            op,
            shape: t.shape().clone(),
            rank: 4,
        }),
    }
}

/// `x` padded with `fill` on its spatial axes (the ceil-mode extra
/// included), as its windows read it: stored once (see the module doc), with
/// a trailing axis of one that the windows drop again, where they step by
/// one and `store`; else in place, through the padding's masks. Strided
/// windows read less than their input, and storing it cost more than the
/// scalar reads at the edges of each row that masks leave (the rest of a
/// row reads in vectors): `benches/RESULTS-cpu.md`.
fn padded(x: &Tensor, axes: &[Axis; 2], fill: Scalar, store: bool) -> Result<Tensor> {
    let [h, w] = axes;
    let pads = [
        (0, 0),
        (0, 0),
        (h.pad.0, h.pad.1 + h.extra),
        (w.pad.0, w.pad.1 + w.extra),
    ];
    let p = x.pad(&pads, fill)?;
    if h.stride > 1 || w.stride > 1 || !store {
        return Ok(p);
    }
    let mut d = p.dims().to_vec();
    // A padded view cannot take this reshape, so `fold-views` keeps the
    // padding a node of its own, read through by the windows' views, and
    // `fuse` stores it. A window that dropped the axis without slicing
    // would be the padded view itself again, read with its mask.
    d.push(1);
    p.reshape(d)
}

/// The windows of the padded input `xp` (`[N, C, H, W]`, or with a
/// trailing axis of one, `padded`), one `[N, C, out_h, out_w]` view per
/// kernel position, row-major over `(kh, kw)`.
fn windows(xp: &Tensor, [h, w]: &[Axis; 2]) -> Result<Vec<Tensor>> {
    let d = xp.dims();
    let mut out = Vec::with_capacity(h.kernel * w.kernel);
    for kh in 0..h.kernel {
        let rows = xp.slice(
            2,
            h.position(0, kh),
            h.position(h.out - 1, kh) + 1,
            h.stride,
        )?;
        for kw in 0..w.kernel {
            let win = rows.slice(
                3,
                w.position(0, kw),
                w.position(w.out - 1, kw) + 1,
                w.stride,
            )?;
            out.push(win.reshape([d[0], d[1], h.out, w.out])?);
        }
    }
    Ok(out)
}

impl Tensor {
    /// 2-D convolution of NCHW f32 or f64 data with OIHW weights of its dtype
    /// (`[out_channels, in_channels / groups, kh, kw]`), PyTorch's and ONNX's
    /// `Conv`: `stride` and `dilation` along height and width, `padding` as
    /// zeros `(before, after)` each, input and output channels split into
    /// `groups` (`groups == in_channels` is a depthwise convolution), and an
    /// optional `bias` of `[out_channels]`. The result is
    /// `[N, out_channels, out_h, out_w]`.
    // PyTorch's `F.conv2d` signature, argument for argument.
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: [usize; 2],
        padding: [(usize, usize); 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<Tensor> {
        const OP: &str = "conv2d";
        check_float_pair(OP, self, weight)?;
        let dtype = self.dtype();
        let (x, w) = (self.dims(), weight.dims());
        let (c, o, cg) = (x[1], w[0], w[1]);
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
        if groups == 0 || c % groups != 0 || o % groups != 0 {
            return Err(mismatch(format!(
                "{groups} groups do not divide {c} input and {o} output channels"
            )));
        }
        if c / groups != cg {
            return Err(mismatch(format!(
                "{c} input channels in {groups} groups are {} per group, the weight takes {cg}",
                c / groups
            )));
        }
        if let Some(message) = bias_misfit(bias, dtype, o) {
            return Err(mismatch(message));
        }
        let window = Pool2d {
            kernel: [w[2], w[3]],
            stride,
            padding,
            dilation,
            ceil_mode: false,
        };
        let axes = spatial(OP, self, &window)?;
        let og = o / groups;
        if og > 1 || cg * w[2] * w[3] > DIRECT_TERMS {
            return im2col_gemm(self, weight, bias, groups, &axes);
        }
        // The CPU's machine kernel pads a depthwise window's planes itself
        // (f32, and planes of more than one row and column, which are
        // views of strides it takes).
        let taps = cg == 1
            && dtype == DType::F32
            && axes.iter().all(|a| a.out > 1)
            && kiln_runtime::cpu::sums_taps(w[2] * w[3]);
        let xp = padded(self, &axes, Scalar::I32(0).cast(dtype), !taps)?;
        let wins = windows(&xp, &axes)?;
        let y = multiply_and_sum(&wins, weight, groups)?;
        match bias {
            Some(b) => y.add(&b.reshape([1, o, 1, 1])?),
            None => Ok(y),
        }
    }

    /// Max pooling of NCHW numbers (not bool) over `window`: `[N, C,
    /// out_h, out_w]`. Padding reads as the dtype's least value (-inf for
    /// floats), so it never wins; NaN propagates. Each window picks one
    /// element, as PyTorch's pooling does (its first maximum in row-major
    /// order, of two zeros the first, its last NaN where it holds one), and
    /// its gradient goes to that element alone. (A window whose elements are
    /// all -inf and that starts in the padding picks the padding, where
    /// PyTorch picks its first element: that gradient is lost.)
    pub fn max_pool2d(&self, window: &Pool2d) -> Result<Tensor> {
        const OP: &str = "max_pool2d";
        if self.dtype() == DType::Bool {
            return Err(kiln_ir::Error::DType {
                op: OP,
                dtype: DType::Bool,
                expected: "a number type",
            }
            .into());
        }
        // The type's least value: where a max starts.
        let least = ReduceOp::Max.init(self.dtype());
        check_4d(OP, self)?;
        let axes = pool_axes(OP, self, window)?;
        pool(&padded(self, &axes, least, true)?, &axes, later_if_larger)
    }

    /// Average pooling of NCHW f32 or f64 data over `window`: `[N, C, out_h,
    /// out_w]`. Each window's sum is divided by the number of input elements
    /// it covers, or with `count_include_pad` by the number it covers in the
    /// input and its asked padding (a ceil-mode window's overhang never counts).
    pub fn avg_pool2d(&self, window: &Pool2d, count_include_pad: bool) -> Result<Tensor> {
        const OP: &str = "avg_pool2d";
        check_4d(OP, self)?;
        let dtype = self.dtype();
        check_float(OP, dtype)?;
        let axes = pool_axes(OP, self, window)?;
        let zero = Scalar::F32(0.0).cast(dtype);
        let sum = pool(&padded(self, &axes, zero, true)?, &axes, Tensor::add)?;
        let dims = self.dims();
        // The counts depend on the shapes alone: computed here, one per output position.
        let counts = |a: &Axis, len: usize| -> Vec<usize> {
            let (lo, hi) = match count_include_pad {
                true => (0, len + a.pad.0 + a.pad.1),
                false => (a.pad.0, a.pad.0 + len),
            };
            (0..a.out)
                .map(|o| {
                    (0..a.kernel)
                        .filter(|&k| (lo..hi).contains(&a.position(o, k)))
                        .count()
                })
                .collect()
        };
        let (ch, cw) = (counts(&axes[0], dims[2]), counts(&axes[1], dims[3]));
        // In f64, rounded to the input's type: for f32 the same as dividing
        // in f32, since a quotient correctly rounded to f64's 53 bits (at
        // least 2 x 24 + 2) rounds to the f32 a correctly rounded f32
        // division gives (the counts are far below 2^24).
        let scale: Vec<f64> = ch
            .iter()
            .flat_map(|&a| cw.iter().map(move |&b| 1.0 / (a * b) as f64))
            .collect();
        if scale.iter().all(|&s| s == scale[0]) {
            return sum.mul(&Tensor::scalar(Scalar::F64(scale[0]).cast(dtype)));
        }
        let dims = [1, 1, axes[0].out, axes[1].out];
        let scale = match dtype {
            DType::F64 => Tensor::from_vec(scale, dims)?,
            _ => Tensor::from_vec(scale.iter().map(|&s| s as f32).collect::<Vec<_>>(), dims)?,
        };
        sum.mul(&scale)
    }
}

fn pool_axes(op: &'static str, x: &Tensor, p: &Pool2d) -> Result<[Axis; 2]> {
    for a in 0..2 {
        // Padding as wide as the window would make windows of padding alone.
        if p.padding[a].0 >= p.kernel[a].max(1) || p.padding[a].1 >= p.kernel[a].max(1) {
            return Err(window_error(
                op,
                format!(
                    "input {}: padding {:?} must be smaller than the kernel {:?}",
                    x.shape(),
                    p.padding,
                    p.kernel
                ),
            ));
        }
    }
    spatial(op, x, p)
}

/// The convolution as one elementwise chain: the sum over input channels
/// `c` of a group and kernel positions `k` of `w[o, c, k] * window_k[c]`,
/// broadcast over the output. With one group every output channel reads
/// every input channel; with one output channel per group (depthwise),
/// output channel `o` reads input channels `o * cg + c`, a strided slice.
fn multiply_and_sum(wins: &[Tensor], weight: &Tensor, groups: usize) -> Result<Tensor> {
    let w = weight.dims();
    let (o, cg, k) = (w[0], w[1], wins.len());
    let flat = weight.reshape([o, cg * k])?;
    let mut terms = Vec::with_capacity(cg * k);
    for c in 0..cg {
        for (j, win) in wins.iter().enumerate() {
            // [N, 1, oh, ow] broadcast over output channels, or [N, groups, oh, ow].
            let x = match groups {
                1 => win.slice(1, c, c + 1, 1)?,
                _ => win.slice(1, c, win.dims()[1], cg)?,
            };
            let col = c * k + j;
            terms.push(x.mul(&flat.slice(1, col, col + 1, 1)?.reshape([1, o, 1, 1])?)?);
        }
    }
    tree(terms, Tensor::add)
}

/// `terms` combined pairwise by `f`, a tree of depth log2(n) rather than
/// a chain of n: the operations of one output element do not wait on each
/// other, so a vector unit runs them side by side, and a window of
/// thousands of elements is no deeper a graph than one of ten.
fn tree(mut terms: Vec<Tensor>, f: impl Fn(&Tensor, &Tensor) -> Result<Tensor>) -> Result<Tensor> {
    while terms.len() > 1 {
        let mut next = Vec::with_capacity(terms.len().div_ceil(2));
        let mut it = terms.into_iter();
        while let Some(a) = it.next() {
            next.push(match it.next() {
                Some(b) => f(&a, &b)?,
                None => a,
            });
        }
        terms = next;
    }
    // Every window has at least one element (checked when it was made), so
    // there is a term.
    terms
        .pop()
        .ok_or_else(|| window_error("conv2d", "a window with no elements".to_string()))
}

/// `b` where it is larger than `a` or NaN, else `a`: with `a` the pick of
/// a window's earlier elements and `b` of its later ones, the window's
/// first maximum or its last NaN, whatever tree combines them in order. As
/// `where`s, the gradient goes to the picked element alone, where
/// `maximum`'s would be shared at ties (ReLU's zeros tie) by the shape of
/// the tree. `where(b > a, b, a)` is one `maxps` on x86.
fn later_if_larger(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let larger = b.gt(a)?.where_cond(b, a)?;
    match b.dtype().is_float() {
        true => b.ne(b)?.where_cond(b, &larger),
        false => Ok(larger),
    }
}

/// Pooling by `f` over the windows of `xp`: at once for a small window; for
/// a large one along the width first, the rows' results stored, then along
/// the height, `kh + kw` operations an output instead of `kh * kw`.
fn pool(
    xp: &Tensor,
    [h, w]: &[Axis; 2],
    f: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + Copy,
) -> Result<Tensor> {
    if h.kernel * w.kernel <= SEPARATE_POOL {
        return tree(windows(xp, &[*h, *w])?, f);
    }
    let d = xp.dims();
    let rows = Axis {
        kernel: 1,
        stride: 1,
        dilation: 1,
        pad: (0, 0),
        extra: 0,
        out: d[2],
    };
    let across = tree(windows(xp, &[rows, *w])?, f)?;
    let cols = Axis { out: w.out, ..rows };
    tree(windows(&across.unsqueeze(-1)?, &[*h, cols])?, f)
}

/// The convolution as im2col and the GEMM, per image and group: the
/// weights as `[out/groups, cg * kh * kw]` times the matrix whose row `(c,
/// kh, kw)` is channel `c`'s window at kernel position `(kh, kw)` over the
/// output positions. That matrix is one view of the padded input (windows
/// along height and width, `Tensor::unfold`), which the GEMM packs where
/// the padded input lies, never stored as a matrix; the product lands in
/// NCHW order, so the bias (and whatever elementwise op follows) is its
/// epilogue.
fn im2col_gemm(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    groups: usize,
    [h, w]: &[Axis; 2],
) -> Result<Tensor> {
    let wd = weight.dims();
    let (o, cg, kh, kw) = (wd[0], wd[1], wd[2], wd[3]);
    let n = x.dims()[0];
    let xp = x.pad(
        &[(0, 0), (0, 0), (h.pad.0, h.pad.1), (w.pad.0, w.pad.1)],
        Scalar::I32(0).cast(x.dtype()),
    )?;
    let span = |a: &Axis| a.dilation * (a.kernel - 1) + 1;
    // [N, C, out_h, out_w, kh, kw]: element (i, j, a, b) reads padded
    // input row i * stride + a * dilation, column j * stride + b * dilation.
    let windows = xp
        .unfold(2, span(h), h.stride)?
        .unfold(3, span(w), w.stride)?
        .slice(4, 0, span(h), h.dilation)?
        .slice(5, 0, span(w), w.dilation)?;
    let rows = cg * kh * kw;
    let col = windows
        .permute(&[0, 1, 4, 5, 2, 3])?
        .reshape([n, groups, rows, h.out * w.out])?;
    let y = weight.reshape([groups, o / groups, rows])?.matmul(&col)?;
    let y = match bias {
        Some(b) => y.add(&b.reshape([1, groups, o / groups, 1])?)?,
        None => y,
    };
    y.reshape([n, o, h.out, w.out])
}
