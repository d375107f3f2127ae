//! f64 values and checks shared by the f64 tests: products by the
//! definition, normal values that are not f32s, closeness to the larger
//! magnitude.

use kiln_support::gradcheck::Rng;

/// `a @ b` for row-major `[m, k]` and `[k, n]` by the definition, in f64.
pub fn naive_matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// Normal f64 values, not exactly f32s.
pub fn normals(n: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    (0..n)
        .map(|_| (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0 + 1e-9)
        .collect()
}

/// Every element of `got` within `rtol` of the larger magnitude of `want`.
pub fn close(what: &str, got: &[f64], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rtol * scale,
            "{what}[{i}]: {g} against {w}"
        );
    }
}
