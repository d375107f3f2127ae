//! The output size of a pooling window along one axis, for the pooling
//! tests' references (`tests/conv.rs`, `tests/pool_grad.rs`).

/// Output size along one axis, with ceil mode's rule that a last window
/// starts inside the input or its leading padding.
pub fn pool_len(
    len: usize,
    k: usize,
    s: usize,
    (p0, p1): (usize, usize),
    d: usize,
    ceil: bool,
) -> usize {
    let span = d * (k - 1) + 1;
    let room = len + p0 + p1 - span;
    let mut out = if ceil {
        room.div_ceil(s) + 1
    } else {
        room / s + 1
    };
    if ceil && (out - 1) * s >= len + p0 {
        out -= 1;
    }
    out
}
