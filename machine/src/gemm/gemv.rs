//! Products of one row of `a` (`1 x k`: a classifier's at batch 1) in one
//! pass over `b`. The cores and the `gemm` crate pack `b` first, a second
//! pass over its memory that for one row of `a` costs as much as the
//! product (`benches/RESULTS-cpu.md`). Where `b`'s columns lie contiguous
//! (a weight stored `[n, k]` and read transposed) each output is a dot
//! product; where its rows do, each row of `b`, scaled by its element of
//! `a`, is added into the outputs. Threads take stretches of the outputs.
//!
//! The dot products run in the path's vector registers; the rows' sums
//! are plain multiplies and adds, which the compiler puts in lanes.
//!
//! `unsafe` here is the reads through the caller's strides and pointers.

#![allow(unsafe_code)]

use super::{Operand, RawFused};
use crate::Isa;

/// Outputs per task on more than one thread.
const STRETCH: usize = 128;

/// One-row products of fewer multiply-adds stay with the `gemm` crate:
/// there `b` stays in the cache between calls, the crate's packing costs
/// little, and the crate was as fast or faster; from here the pass, on
/// every thread, took less time (`benches/RESULTS-cpu.md`).
const WORK: usize = 1 << 20;

/// Whether `gemv` takes a product of `m` rows of `a` and `n` columns of
/// `b` over `k`: one row, at least `WORK` multiply-adds, read without
/// tables, `b` contiguous along its rows or its columns.
pub(super) fn takes((m, n, k): (usize, usize, usize), a: Operand, b: Operand) -> bool {
    m == 1
        && n.saturating_mul(k) >= WORK
        && !a.tabled()
        && !b.tabled()
        && (b.rows == 1 || b.cols == 1)
}

/// `c = epilogue(a b)` for `a` of one row and `k` columns and `b` of `k`
/// rows and `c.len()` columns, with `b` contiguous along an axis, in
/// `isa`'s lanes, on the team's threads where `threads > 1`.
///
/// # Safety
/// `isa` is available; `a(0, l)` and `b(l, j)` for `l < k`, `j < c.len()`
/// lie inside live buffers, and a bias of `epilogue` holds `c.len()` values
/// (one, where it holds one per row).
pub(super) unsafe fn gemv(
    isa: Isa,
    k: usize,
    (a, b): (Operand, Operand),
    c: &mut [f32],
    threads: usize,
    epilogue: RawFused,
) {
    let dot: unsafe fn(&[f32], &[f32]) -> f32 = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Amx | Isa::Avx512 => dot_avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => dot_avx2,
        _ => dot_any,
    };
    // SAFETY: element (0, l) of a (the contract of this function).
    let x: Vec<f32> = (0..k)
        .map(|l| unsafe { *a.ptr.offset(l as isize * a.cols) })
        .collect();
    let stretch = |j0: usize, out: &mut [f32]| {
        // SAFETY: columns j0.. of b, `out.len()` of them, each of k rows,
        // and `dot` on an available ISA (the contract of this function).
        unsafe { columns(&x, b, j0, out, dot) };
        for (j, y) in out.iter_mut().enumerate() {
            // SAFETY: column j0 + j is inside the bias, or row 0 is.
            *y = unsafe { epilogue.apply(*y, 0, j0 + j) };
        }
    };
    if threads > 1 {
        crate::team::for_each_chunk(c, STRETCH, &|i, out| stretch(i * STRETCH, out));
    } else {
        stretch(0, c);
    }
}

/// Columns `j0..j0 + out.len()` of `x b` into `out`, each dot product by
/// `dot`.
///
/// # Safety
/// Elements (l, j) of b for `l < x.len()` and those columns lie inside a
/// live buffer, and b's rows or columns are contiguous (`takes`); `dot`
/// runs on this CPU.
#[inline(always)]
unsafe fn columns(
    x: &[f32],
    b: Operand,
    j0: usize,
    out: &mut [f32],
    dot: unsafe fn(&[f32], &[f32]) -> f32,
) {
    let k = x.len();
    if b.rows == 1 {
        for (q, y) in out.iter_mut().enumerate() {
            let first = b.ptr.wrapping_offset((j0 + q) as isize * b.cols);
            // SAFETY: column j0 + q of b, its k elements adjacent; `dot`
            // runs on this CPU.
            *y = unsafe { dot(x, std::slice::from_raw_parts(first, k)) };
        }
        return;
    }
    out.fill(0.0);
    for (l, &xl) in x.iter().enumerate() {
        let first = b.ptr.wrapping_offset(l as isize * b.rows + j0 as isize);
        // SAFETY: row l of b at columns j0.., `out.len()` of them adjacent.
        let row = unsafe { std::slice::from_raw_parts(first, out.len()) };
        for (y, &v) in out.iter_mut().zip(row) {
            *y += xl * v;
        }
    }
}

/// `x · y` in f32, in order.
///
/// # Safety
/// None: `unsafe` only to share the type of the vector kernels.
unsafe fn dot_any(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

/// `x · y` (of one length) in four AVX-512 accumulators of 16 lanes.
///
/// # Safety
/// The CPU has AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(x: &[f32], y: &[f32]) -> f32 {
    use std::arch::x86_64::{
        _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_reduce_add_ps, _mm512_setzero_ps,
    };
    let k = x.len().min(y.len());
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut s = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (every load): elements i..i + 16 of both, below k.
    while i + 64 <= k {
        for (u, s) in s.iter_mut().enumerate() {
            let at = i + 16 * u;
            *s = unsafe {
                _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(at)), _mm512_loadu_ps(yp.add(at)), *s)
            };
        }
        i += 64;
    }
    while i + 16 <= k {
        s[0] = unsafe {
            _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(yp.add(i)), s[0])
        };
        i += 16;
    }
    let sum = _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]));
    let tail: f32 = x[i..k].iter().zip(&y[i..k]).map(|(a, b)| a * b).sum();
    _mm512_reduce_add_ps(sum) + tail
}

/// `x · y` (of one length) in four AVX2 accumulators of 8 lanes.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(x: &[f32], y: &[f32]) -> f32 {
    use std::arch::x86_64::{
        _mm_add_ps, _mm_cvtss_f32, _mm_movehl_ps, _mm_shuffle_ps, _mm256_add_ps,
        _mm256_castps256_ps128, _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps,
        _mm256_setzero_ps,
    };
    let k = x.len().min(y.len());
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut s = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (every load): elements i..i + 8 of both, below k.
    while i + 32 <= k {
        for (u, s) in s.iter_mut().enumerate() {
            let at = i + 8 * u;
            *s = unsafe {
                _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(at)), _mm256_loadu_ps(yp.add(at)), *s)
            };
        }
        i += 32;
    }
    while i + 8 <= k {
        s[0] = unsafe {
            _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)), s[0])
        };
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
    let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    let v = _mm_add_ps(v, _mm_shuffle_ps::<1>(v, v));
    let tail: f32 = x[i..k].iter().zip(&y[i..k]).map(|(a, b)| a * b).sum();
    _mm_cvtss_f32(v) + tail
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::super::{Operand, RawFused, gemm};
    use super::{WORK, gemv, takes};
    use crate::Isa;

    /// One-row products on each of kiln's paths the CPU has (through
    /// `gemm` where it takes them, else directly), against sums in f64: `b`
    /// row-major and stored transposed, `a` read with a stride,
    /// depths of 0 to 1000, one thread and the team, each epilogue; `finish`
    /// hears of the one row.
    #[test]
    fn one_row_products_agree_with_sums_in_f64() {
        let value = |i: usize, seed: usize| ((i * 7919 + seed) % 97) as f32 / 13.0 - 3.0;
        let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|i| i.available())
            .collect();
        if isas.is_empty() {
            eprintln!("skipped: this CPU runs none of kiln's cores");
        }
        let bias: Vec<f32> = (0..1000).map(|j| value(j, 5)).collect();
        let epilogues = [
            RawFused::NONE,
            RawFused {
                bias: bias.as_ptr(),
                rows: false,
                relu: true,
                cap: Some(6.0),
            },
            RawFused {
                bias: bias.as_ptr(),
                rows: true,
                relu: false,
                cap: None,
            },
        ];
        let shapes = [
            (0, 5),
            (1, 1),
            (3, 7),
            (33, 257),
            (1000, 1000),
            (1100, 1000),
        ];
        for (isa, (k, n)) in isas.iter().flat_map(|&i| shapes.map(|s| (i, s))) {
            // a: column 1 of a [k, 2] matrix; b: [k, n], or [n, k] read
            // transposed.
            let a: Vec<f32> = (0..2 * k).map(|i| value(i, 1)).collect();
            let b: Vec<f32> = (0..k * n).map(|i| value(i, 2)).collect();
            for transposed in [false, true] {
                let b_at = |l: usize, j: usize| match transposed {
                    false => b[l * n + j],
                    true => b[j * k + l],
                };
                let b_op = match transposed {
                    false => Operand::strided(b.as_ptr(), n as isize, 1),
                    true => Operand::strided(b.as_ptr(), 1, k as isize),
                };
                let a_op = Operand::strided(a.as_ptr().wrapping_add(1), 0, 2);
                for (e, &epilogue) in epilogues.iter().enumerate() {
                    for threads in [1, 2] {
                        let mut c = vec![f32::NAN; n];
                        let rows = Mutex::new(Vec::new());
                        let finish = |r0, r1| rows.lock().expect("unpoisoned").push((r0, r1));
                        let what = format!(
                            "{} {k}x{n} transposed {transposed} epilogue {e}",
                            isa.name()
                        );
                        let taken = takes((1, n, k), a_op, b_op);
                        assert_eq!(taken, k * n >= WORK, "{what}");
                        // SAFETY: isa is available; a(0, l) = a[1 + 2l] and
                        // b's elements lie inside `a` and `b`, `c` holds n,
                        // the bias 1000 values.
                        unsafe {
                            if taken {
                                let c = &mut c;
                                let applied =
                                    gemm(isa, 1, n, k, a_op, b_op, c, threads, epilogue, &finish);
                                assert!(applied, "{what}");
                            } else {
                                gemv(isa, k, (a_op, b_op), &mut c, threads, epilogue);
                                finish(0, 1);
                            }
                        }
                        assert_eq!(*rows.lock().expect("unpoisoned"), [(0, 1)], "{what}");
                        for (j, &got) in c.iter().enumerate() {
                            let terms = (0..k).map(|l| f64::from(a[1 + 2 * l] * b_at(l, j)));
                            let size: f64 = terms.clone().map(f64::abs).sum();
                            // SAFETY: column j and row 0 are inside the bias.
                            let want = unsafe { epilogue.apply(terms.sum::<f64>() as f32, 0, j) };
                            let tol = 2.0 * k as f64 * f64::from(f32::EPSILON) * (size + 6.0);
                            assert!(
                                (f64::from(got) - f64::from(want)).abs() <= tol,
                                "{what}: column {j}: got {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
