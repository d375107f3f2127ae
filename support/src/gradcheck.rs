//! Central finite differences, the check of every gradient: shared by the
//! IR's rule-by-rule tests (`ir/tests/grad.rs`) and the front end's
//! (`tests/grad.rs`), each with its own way of evaluating a function.
//!
//! A test computes `y = f(x1, x2, ..)` and differentiates the loss
//! `sum(y * r)` for a random cotangent `r`, which checks the whole
//! vector-Jacobian product, not just its sum. The differences are taken of
//! `y`, not of the loss, and summed against `r` here in f64: an element of
//! `y` that a perturbation does not touch is computed bit for bit the same
//! both times and cancels exactly, so the only noise is the f32 rounding of
//! the elements that move (about `6e-8 * |y| / h`). Two step sizes combine
//! by Richardson extrapolation, `(4 D(h/2) - D(h)) / 3`, which cancels the
//! `h^2` term, so the steps can be large (`H` times the element's size, at
//! least `H`) and the rounding noise small. Inputs must keep `2H` away from
//! the kinks of the ops they feed (0 for relu, ties of max), except where a
//! test means to sit on one: a central difference at a tie of two sees the
//! mean of the one-sided slopes, which is what the even split gives.

/// The larger step, relative to the element's size (and at least this).
pub const H: f64 = 1e-2;

/// An analytic gradient `a` agrees with the differences `d` when
/// `|a - d| <= RTOL * max(|a|, |d|) + ATOL * scale`, where `scale` is the
/// largest `|r|`-weighted sum of `|y|` one input element moves (at least 1):
/// the size of what the difference subtracts, against which f32 rounding
/// is relative.
pub const RTOL: f64 = 1e-3;

/// See `RTOL`.
pub const ATOL: f64 = 1e-4;

/// A seeded stream of numbers (SplitMix64): the same seed, the same test.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// An f32 uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// An f32 whose magnitude is uniform in `[lo, hi)`, of either sign.
    pub fn signed(&mut self, lo: f32, hi: f32) -> f32 {
        let v = self.uniform(lo, hi);
        if self.below(2) == 0 { v } else { -v }
    }

    /// `n` values drawn by `draw`.
    pub fn fill(&mut self, n: usize, mut draw: impl FnMut(&mut Rng) -> f32) -> Vec<f32> {
        (0..n).map(|_| draw(self)).collect()
    }
}

/// Checks `analytic[k]`, the gradient of `sum(y * r)` with respect to input
/// `wrt[k]` of `inputs`, against central differences of `y = eval(inputs)`.
/// On a mismatch, the `Err` names the input, the element, both values, and
/// how many elements disagree.
pub fn check(
    inputs: &[Vec<f32>],
    wrt: &[usize],
    r: &[f32],
    analytic: &[Vec<f32>],
    mut eval: impl FnMut(&[Vec<f32>]) -> Result<Vec<f32>, String>,
) -> Result<(), String> {
    let mut point = inputs.to_vec();
    let mut failures = Vec::new();
    for (k, &i) in wrt.iter().enumerate() {
        if analytic[k].len() != inputs[i].len() {
            return Err(format!(
                "input {i}: {} gradient values for {} elements",
                analytic[k].len(),
                inputs[i].len()
            ));
        }
        for j in 0..inputs[i].len() {
            let x = inputs[i][j];
            let h = H * (x.abs() as f64).max(1.0);
            let mut scale = 1.0f64;
            let mut slope = |step: f64| -> Result<f64, String> {
                let (up, down) = ((x as f64 + step) as f32, (x as f64 - step) as f32);
                point[i][j] = up;
                let yu = eval(&point)?;
                point[i][j] = down;
                let yd = eval(&point)?;
                point[i][j] = x;
                // A NaN or infinity is the same bits on both sides, so it
                // would read as an output that did not move.
                if let Some(at) = yu.iter().chain(&yd).position(|y| !y.is_finite()) {
                    return Err(format!(
                        "output {} is not finite near input {i} element {j} (x = {x:?}): no difference can check it",
                        at % yu.len().max(1)
                    ));
                }
                let mut moved = 0.0;
                let mut delta = 0.0;
                for ((&u, &d), &w) in yu.iter().zip(&yd).zip(r) {
                    if u.to_bits() != d.to_bits() {
                        delta += (u as f64 - d as f64) * w as f64;
                        moved += (u.abs().max(d.abs()) as f64) * (w.abs() as f64);
                    }
                }
                scale = scale.max(moved);
                // The step actually taken, after rounding to f32.
                Ok(delta / (up as f64 - down as f64))
            };
            let (coarse, fine) = (slope(h)?, slope(h / 2.0)?);
            let d = (4.0 * fine - coarse) / 3.0;
            let a = analytic[k][j] as f64;
            let tolerance = RTOL * a.abs().max(d.abs()) + ATOL * scale;
            let agrees = (a - d).abs() <= tolerance;
            if !agrees {
                failures.push(format!(
                    "input {i} element {j} (x = {x:?}): analytic {a:?}, differences {d:?} (tolerance {tolerance:.3e})"
                ));
            }
        }
    }
    match failures.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "{first}; {} element(s) disagree in all",
            failures.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn an_output_that_is_not_finite_is_an_error_not_a_still_one() {
        // y = [x, NaN]: the NaN is the same bits either side of every step.
        let eval = |p: &[Vec<f32>]| Ok(vec![p[0][0], f32::NAN]);
        let e = check(&[vec![0.5]], &[0], &[1.0, 1.0], &[vec![1.0]], eval).unwrap_err();
        assert!(e.contains("output 1 is not finite"), "{e}");
        let fine = |p: &[Vec<f32>]| Ok(vec![p[0][0], 2.0]);
        check(&[vec![0.5]], &[0], &[1.0, 1.0], &[vec![1.0]], fine).unwrap();
    }
}
