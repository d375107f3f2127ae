//! Products of operands packed once, on every path the CPU has, against a
//! plain product in f64: a few rows streamed (every tile, stretches, the
//! rows past the first four, threads), more by the cores' loop nest over
//! the panels (depth blocks, ragged panels), every epilogue; and what
//! `PackedB::new` and `sgemm_packed` refuse.

use super::super::{Axis, Bias, Fused, Matrix, Table, sgemm_packed};
use super::PackedB;
use crate::{Error, Isa};

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 97) as f32 / 13.0 - 3.0)
        .collect()
}

fn strided(data: &[f32], rows: (usize, isize), cols: (usize, isize)) -> Matrix<'_> {
    Matrix {
        data,
        offset: 0,
        rows: Axis::Strided {
            len: rows.0,
            stride: rows.1,
        },
        cols: Axis::Strided {
            len: cols.0,
            stride: cols.1,
        },
    }
}

#[test]
fn packed_products_agree_with_a_plain_product() {
    for isa in [Isa::Avx512, Isa::Avx2] {
        if !isa.available() {
            eprintln!("skipped: this CPU has no {}", isa.name());
            continue;
        }
        for &(m, k, n) in &[
            (1, 256, 1024),
            (1, 3, 9),
            (1, 70, 130),
            (2, 33, 70),
            (3, 600, 17),
            (4, 1, 33),
            (5, 129, 200),
            (7, 1100, 40),
            (8, 256, 1000),
            (9, 64, 16),
            (13, 600, 130),
            (64, 128, 1024),
            // Rows shared between threads, B in too few panels to share.
            (200, 600, 40),
        ] {
            check(isa, m, k, n);
        }
    }
}

fn check(isa: Isa, m: usize, k: usize, n: usize) {
    let (a, b) = (values(m * k, 1), values(k * n, 2));
    // b stored transposed ([n, k], a weight read as ONNX's Gemm reads it),
    // row-major, or through a table of its rows' offsets (reversed).
    let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
    let reversed: Vec<f32> = (0..k * n).map(|i| b[(k - 1 - i / n) * n + i % n]).collect();
    let table = Table::new((0..k).map(|l| ((k - 1 - l) * n) as isize).collect());
    let layouts = [
        strided(&bt, (k, 1), (n, k as isize)),
        strided(&b, (k, n as isize), (n, 1)),
        Matrix {
            data: &reversed,
            offset: 0,
            rows: Axis::Table(&table),
            cols: Axis::Strided { len: n, stride: 1 },
        },
    ];
    let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
    let a_reversed: Vec<f32> = (0..m * k).map(|i| a[i / k * k + (k - 1 - i % k)]).collect();
    let a_table = Table::new((0..k).map(|l| (k - 1 - l) as isize).collect());
    let per_column = values(n, 3);
    let per_row = values(m, 4);
    let cases: [(Option<Bias<'_>>, bool, Option<f32>); 4] = [
        (None, false, None),
        (Some(Bias::Columns(&per_column)), true, None),
        (Some(Bias::Rows(&per_row)), false, Some(1.5)),
        (None, true, Some(1.5)),
    ];
    for (layout, b_matrix) in layouts.iter().enumerate() {
        let packed = PackedB::new(isa, *b_matrix)
            .expect("in bounds")
            .expect("kiln's cores pack");
        assert_eq!((packed.rows(), packed.cols(), packed.isa()), (k, n, isa));
        let (bias, relu, cap) = cases[layout % cases.len()];
        let mut c = vec![f32::NAN; m * n];
        let finished = std::sync::Mutex::new(Vec::new());
        let finish = |r0, r1| finished.lock().expect("unpoisoned").push((r0, r1));
        let fused = Fused { bias, relu, cap };
        // a row-major, stored transposed ([k, m]), or its columns through a
        // table of their offsets (reversed).
        let a_matrix = match layout {
            0 => strided(&a, (m, k as isize), (k, 1)),
            1 => strided(&at, (m, 1), (k, m as isize)),
            _ => Matrix {
                data: &a_reversed,
                offset: 0,
                rows: Axis::Strided {
                    len: m,
                    stride: k as isize,
                },
                cols: Axis::Table(&a_table),
            },
        };
        sgemm_packed(isa, a_matrix, &packed, fused, &mut c, &finish).expect("a valid product");
        let what = format!("{} {m}x{k}x{n} layout {layout}", isa.name());
        let mut finished = finished.into_inner().expect("unpoisoned");
        finished.sort_unstable();
        let mut next = 0;
        for (r0, r1) in finished {
            assert_eq!(r0, next, "{what}: rows finished");
            next = r1;
        }
        assert_eq!(next, m, "{what}: rows finished");
        for i in 0..m {
            for j in 0..n {
                let terms = (0..k).map(|l| f64::from(a[i * k + l]) * f64::from(b[l * n + j]));
                let scale: f64 = terms.clone().map(f64::abs).sum::<f64>() + 3.0;
                let mut want: f64 = terms.sum();
                want += match bias {
                    None => 0.0,
                    Some(Bias::Columns(v)) => f64::from(v[j]),
                    Some(Bias::Rows(v)) => f64::from(v[i]),
                };
                if relu {
                    want = want.max(0.0);
                }
                if let Some(cap) = cap {
                    want = want.min(f64::from(cap));
                }
                let got = f64::from(c[i * n + j]);
                assert!(
                    (got - want).abs() <= 1e-6 * scale,
                    "{what} at ({i},{j}): {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn packing_leaves_narrow_operands_and_the_crates_path_alone_and_checks_bounds() {
    let b = values(40 * 8, 1);
    let narrow = strided(&b, (40, 8), (8, 1));
    let wide = strided(&b, (8, 40), (40, 1));
    assert!(matches!(PackedB::new(Isa::Generic, wide), Ok(None)));
    assert!(matches!(PackedB::new(Isa::Avx2, narrow), Ok(None)));
    let past = strided(&b, (9, 40), (40, 1));
    assert!(matches!(
        PackedB::new(Isa::Avx2, past),
        Err(Error::Operand { operand: "b", .. })
    ));
}

#[test]
fn packed_products_refuse_what_does_not_fit() {
    let isa = Isa::Avx2;
    if !isa.available() {
        eprintln!("skipped: this CPU has no {}", isa.name());
        return;
    }
    let (a, b) = (values(3 * 20, 1), values(20 * 40, 2));
    let packed = PackedB::new(isa, strided(&b, (20, 40), (40, 1)))
        .expect("in bounds")
        .expect("packed");
    let a_matrix = strided(&a, (3, 20), (20, 1));
    let none = &|_: usize, _: usize| {};
    let mut c = vec![0.0; 3 * 40];
    let short_bias = [0.0f32; 39];
    let fused = Fused {
        bias: Some(Bias::Columns(&short_bias)),
        ..Fused::default()
    };
    let cases: [(Matrix<'_>, Fused<'_>, usize); 4] = [
        // a of 19 columns against b's 20 rows.
        (strided(&a, (3, 19), (19, 1)), Fused::default(), 120),
        // a reaching past its slice.
        (strided(&a, (4, 20), (20, 1)), Fused::default(), 160),
        (a_matrix, fused, 120),
        (a_matrix, Fused::default(), 119),
    ];
    for (i, (a, fused, len)) in cases.into_iter().enumerate() {
        let result = sgemm_packed(isa, a, &packed, fused, &mut c[..len.min(120)], none);
        let expected = match i {
            0 => matches!(result, Err(Error::Inner { k: 19, k_b: 20, .. })),
            1 => matches!(result, Err(Error::Operand { operand: "a", .. })),
            2 => matches!(result, Err(Error::Short { what: "bias", .. })),
            _ => matches!(
                result,
                Err(Error::Short {
                    what: "product",
                    ..
                })
            ),
        };
        assert!(expected, "case {i}: {result:?}");
    }
    if Isa::Avx512.available() {
        let result = sgemm_packed(
            Isa::Avx512,
            a_matrix,
            &packed,
            Fused::default(),
            &mut c,
            none,
        );
        assert!(matches!(
            result,
            Err(Error::PackedFor {
                packed: Isa::Avx2,
                isa: Isa::Avx512
            })
        ));
    }
}
