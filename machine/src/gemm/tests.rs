//! kiln's GEMM cores on their own, each the CPU has, against a plain
//! product in f64: tile edges, depth blocks, strides, threads, the bias and
//! ReLU applied in registers, and the rows handed to `finish`; and how
//! `KILN_CPU_ISA` is read.

use std::ffi::OsStr;

use super::*;
use crate::Error;
use crate::isa::choose;

/// Products of awkward shapes and strides (a transposed, b broadcast
/// along k) against a plain triple loop in f64, on every core this CPU
/// runs; the cores the CPU lacks are skipped with a line saying so.
#[test]
fn cores_agree_with_a_plain_product() {
    for isa in [Isa::Avx512, Isa::Avx2] {
        if !isa.available() {
            eprintln!("skipped: this CPU has no {}", isa.name());
            continue;
        }
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 7, 5),
            (13, 300, 33),
            (12, 256, 32),
            (6, 64, 16),
            (50, 513, 1027),
            (200, 64, 17),
            (300, 1100, 70),
            // B read in place over several depth blocks, with and without a
            // ragged packed panel; row blocks ending in short tiles.
            (64, 1100, 96),
            (90, 600, 50),
            (8, 70, 40),
            (97, 33, 1),
            // Rows of A 4 KiB apart or nearly, packed (on the AVX-512 core),
            // the last tile one or seven rows high; depth blocks of 512 and
            // of 342, not a multiple of 4.
            (13, 1024, 33),
            (19, 1026, 33),
            // The AVX2 core's full-tile loop on five rows (the sixth row of
            // A standing in), and on fewer than four steps.
            (11, 70, 33),
            (17, 9, 16),
            (6, 3, 16),
            (7, 1, 20),
            (1, 600, 300),
            // More rows than MC but fewer than B's columns, A packed: shared
            // by panels.
            (100, 1024, 230),
            // Shared by panels, each thread's in two runs (`RUN_BYTES`) over
            // three depth blocks, the last panel ragged.
            (20, 1100, 1500),
            (5, 0, 7),
        ] {
            check(isa, m, k, n);
        }
    }
}

/// `c = a b` on `isa`'s core itself, whatever the product's size.
///
/// # Safety
/// As `driver::sgemm`; `isa` is one of kiln's cores.
#[allow(clippy::too_many_arguments)]
unsafe fn core(
    isa: Isa,
    (m, n, k): (usize, usize, usize),
    a: Operand,
    b: Operand,
    c: &mut [f32],
    threads: usize,
    epilogue: RawFused,
    finish: &(dyn Fn(usize, usize) + Sync),
) {
    // SAFETY: the contract of this function.
    unsafe {
        driver::on_core(
            isa,
            (m, n, k),
            a,
            driver::Right::Lies(b),
            c,
            threads,
            epilogue,
            finish,
        )
    }
}

/// A product started by `finish`, on a thread whose packed buffers the
/// outer product is using, runs, and neither product's result changes:
/// outer products shared by panels (100x1024x230) and by rows
/// (300x1100x70), on two threads.
#[test]
fn a_product_started_by_finish_leaves_both_exact() {
    let values = |len: usize, seed: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed) % 97) as f32 / 13.0 - 3.0)
            .collect()
    };
    for isa in [Isa::Avx512, Isa::Avx2] {
        if !isa.available() {
            eprintln!("skipped: this CPU has no {}", isa.name());
            continue;
        }
        let (x, y) = (values(40 * 300, 1), values(300 * 50, 2));
        let inner = |c: &mut [f32]| {
            let (x, y) = (
                Operand::strided(x.as_ptr(), 300, 1),
                Operand::strided(y.as_ptr(), 50, 1),
            );
            // SAFETY: `isa` is available; the operands index inside `x` and
            // `y`, `c` holds 40 x 50.
            unsafe { core(isa, (40, 50, 300), x, y, c, 2, RawFused::NONE, &|_, _| {}) };
        };
        let mut alone = vec![0.0; 40 * 50];
        inner(&mut alone);
        for (m, k, n) in [(100, 1024, 230), (300, 1100, 70)] {
            let (a, b) = (values(m * k, 3), values(k * n, 4));
            let outer = |c: &mut [f32], finish: &(dyn Fn(usize, usize) + Sync)| {
                let (a, b) = (
                    Operand::strided(a.as_ptr(), k as isize, 1),
                    Operand::strided(b.as_ptr(), n as isize, 1),
                );
                // SAFETY: as above, for `a`, `b` and `c` (`m x n`).
                unsafe { core(isa, (m, n, k), a, b, c, 2, RawFused::NONE, finish) };
            };
            let mut want = vec![0.0; m * n];
            outer(&mut want, &|_, _| {});
            let nested = std::sync::Mutex::new(Vec::new());
            let mut got = vec![0.0; m * n];
            outer(&mut got, &|_, _| {
                let mut c = vec![f32::NAN; 40 * 50];
                inner(&mut c);
                nested.lock().expect("unpoisoned").push(c);
            });
            let what = format!("{} {m}x{k}x{n}", isa.name());
            assert!(got == want, "{what}: the outer product changed");
            let nested = nested.into_inner().expect("unpoisoned");
            assert!(!nested.is_empty(), "{what}: finish ran no product");
            assert!(
                nested.iter().all(|c| *c == alone),
                "{what}: a nested product changed"
            );
        }
    }
}

/// `isa`'s core at one shape, with each layout of A and padding of B, and
/// each kind of epilogue.
fn check(isa: Isa, m: usize, k: usize, n: usize) {
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 97) as f32 / 13.0 - 3.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 104_729) % 89) as f32 / 11.0 - 4.0)
        .collect();
    // a row-major or stored transposed ([k, m]); b row-major, its rows `pad`
    // elements apart beyond their length (a slice of wider rows), or stored
    // transposed ([n, k]).
    let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
    let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
    let transposed = Operand::strided(at.as_ptr(), 1, m as isize);
    let row_major = Operand::strided(a.as_ptr(), k as isize, 1);
    // A bias per column (a linear layer's) or per row (a convolution's).
    let per_column: Vec<f32> = (0..n).map(|j| ((j * 31) % 23) as f32 / 5.0 - 2.0).collect();
    let per_row: Vec<f32> = (0..m).map(|i| ((i * 37) % 19) as f32 / 4.0 - 2.0).collect();
    let bias_at = |rows: Option<bool>, i: usize, j: usize| match rows {
        None => 0.0,
        Some(false) => per_column[j],
        Some(true) => per_row[i],
    };
    // A cap, as ReLU6's 6, that many of these products pass.
    let cap = 1.5f32;
    for (threads, pad, a_op, (rows, relu, cap)) in [
        (1, 0, transposed, (None, false, None)),
        (2, 0, transposed, (Some(false), true, None)),
        (2, 3, row_major, (Some(false), false, Some(cap))),
        (1, 0, row_major, (Some(false), true, None)),
        (2, usize::MAX, row_major, (None, true, Some(cap))),
        (2, 0, transposed, (Some(true), true, Some(cap))),
        (1, 3, row_major, (Some(true), false, None)),
    ] {
        let epilogue = RawFused {
            bias: match rows {
                None => std::ptr::null(),
                Some(false) => per_column.as_ptr(),
                Some(true) => per_row.as_ptr(),
            },
            rows: rows == Some(true),
            relu,
            cap,
        };
        let (b_values, b_op);
        if pad == usize::MAX {
            b_op = Operand::strided(bt.as_ptr(), 1, k as isize);
        } else {
            let stride = n + pad;
            b_values = (0..k * stride)
                .map(|i| {
                    if i % stride < n {
                        b[i / stride * n + i % stride]
                    } else {
                        f32::NAN
                    }
                })
                .collect::<Vec<f32>>();
            b_op = Operand::strided(b_values.as_ptr(), stride as isize, 1);
        }
        let mut c = vec![f32::NAN; m * n];
        // `finish` keeps the rows it is handed as they are then, which must
        // be as they end: read through the product's start, as the
        // runtime's epilogue passes read them.
        let start = super::driver::C(c.as_mut_ptr());
        let finished = std::sync::Mutex::new(Vec::new());
        let finish = |r0: usize, r1: usize| {
            // SAFETY: rows r0..r1 of c are done, and no thread writes them
            // again (`finish`'s contract).
            let rows = unsafe { std::slice::from_raw_parts(start.at(r0 * n), (r1 - r0) * n) };
            let rows: Vec<u32> = rows.iter().map(|x| x.to_bits()).collect();
            finished.lock().expect("unpoisoned").push((r0, r1, rows));
        };
        // SAFETY: `isa` is available; both operands index inside their
        // vectors, and c holds m * n elements from its start.
        unsafe {
            core(
                isa,
                (m, n, k),
                a_op,
                b_op,
                std::slice::from_raw_parts_mut(start.0, m * n),
                threads,
                epilogue,
                &finish,
            )
        };
        let what = format!(
            "{} {m}x{k}x{n} threads {threads} pad {pad} bias per row {rows:?} relu {relu} cap {cap:?}",
            isa.name()
        );
        // `finish` saw a partition of the rows, each as it ended.
        let mut finished = finished.into_inner().expect("unpoisoned");
        finished.sort_unstable();
        let mut next = 0;
        for (r0, r1, rows) in finished {
            assert_eq!(r0, next, "{what}: rows finished");
            let now: Vec<u32> = c[r0 * n..r1 * n].iter().map(|x| x.to_bits()).collect();
            assert!(rows == now, "{what}: rows {r0}..{r1} finished early");
            next = r1;
        }
        assert_eq!(next, m, "{what}: rows finished");
        for i in 0..m {
            for j in 0..n {
                let mut want: f64 = (0..k)
                    .map(|l| f64::from(a[i * k + l]) * f64::from(b[l * n + j]))
                    .sum();
                let mut scale: f64 = (0..k)
                    .map(|l| f64::from(a[i * k + l] * b[l * n + j]).abs())
                    .sum();
                if rows.is_some() {
                    want += f64::from(bias_at(rows, i, j));
                    scale += f64::from(bias_at(rows, i, j)).abs();
                }
                if relu {
                    want = want.max(0.0);
                }
                if let Some(cap) = cap {
                    want = want.min(f64::from(cap));
                }
                let got = f64::from(c[i * n + j]);
                assert!(!relu || got >= 0.0, "{what} at ({i},{j}): {got} after relu");
                assert!(
                    cap.is_none_or(|c| got <= f64::from(c)),
                    "{what} at ({i},{j}): {got} over the cap"
                );
                assert!(
                    (got - want).abs() <= 1e-6 * scale.max(1.0),
                    "{what} at ({i},{j}): {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn the_variable_names_a_path_the_cpu_has() {
    let fastest = Isa::ALL.into_iter().find(|isa| isa.available());
    assert_eq!(choose(None), Ok(fastest.unwrap_or(Isa::Generic)));
    assert_eq!(choose(Some(OsStr::new(""))), choose(None));
    assert_eq!(choose(Some(OsStr::new("generic"))), Ok(Isa::Generic));
    for isa in Isa::ALL {
        let chosen = choose(Some(OsStr::new(isa.name())));
        if isa.available() {
            assert_eq!(chosen, Ok(isa));
        } else {
            assert_eq!(chosen, Err(Error::MissingIsa { isa }));
            let message = chosen.expect_err("a path this CPU lacks").to_string();
            assert!(message.contains("this CPU lacks it"), "{message}");
        }
    }
    let message = choose(Some(OsStr::new("avx3"))).expect_err("no such path");
    assert_eq!(
        message.to_string(),
        "KILN_CPU_ISA=\"avx3\" names no GEMM path (one of amx, avx512, avx2, generic)"
    );
}

/// Operands read through tables (`Operand::Merged`), against a plain
/// product, on every path the CPU runs (the `gemm` crate's after gathering
/// them): A's rows in a shuffled order, B's rows and columns those of a
/// convolution's windows over a padded image, `w` columns to a row of
/// output positions, so that panels of B are runs of a row, straddle two
/// rows, or end ragged.
#[test]
fn tabled_operands_agree_with_a_plain_product() {
    for isa in Isa::ALL.into_iter().filter(|isa| isa.available()) {
        for &(m, channels, kernel, h, w) in &[
            (32, 3, 3, 32, 32),
            (7, 2, 3, 5, 9),
            (13, 5, 2, 11, 17),
            (1, 1, 1, 1, 1),
        ] {
            let k = channels * kernel * kernel;
            let (hp, wp) = (h + kernel - 1, w + kernel - 1);
            let n = h * w;
            let image: Vec<f32> = (0..channels * hp * wp)
                .map(|i| ((i * 7919) % 89) as f32 / 11.0 - 4.0)
                .collect();
            let b_at = |l: usize, j: usize| {
                let (c, kh, kw) = (l / (kernel * kernel), l / kernel % kernel, l % kernel);
                (c * hp * wp + kh * wp + kw + j / w * wp + j % w) as isize
            };
            let b_rows: Vec<isize> = (0..k).map(|l| b_at(l, 0)).collect();
            let b_cols: Vec<isize> = (0..n).map(|j| b_at(0, j)).collect();
            // A: row i stored at row `order[i]` of an m x k matrix.
            let a_values: Vec<f32> = (0..m * k)
                .map(|i| ((i * 104_729) % 97) as f32 / 13.0 - 3.0)
                .collect();
            let order: Vec<usize> = (0..m).map(|i| (i * 5 + 3) % m).collect();
            let a_rows: Vec<isize> = order.iter().map(|&r| (r * k) as isize).collect();
            let a_table = Table::new(a_rows);
            let (b_row_table, b_col_table) =
                (Table::new(b_rows.clone()), Table::new(b_cols.clone()));
            let a = Matrix {
                data: &a_values,
                offset: 0,
                rows: Axis::Table(&a_table),
                cols: Axis::Strided { len: k, stride: 1 },
            };
            let b = Matrix {
                data: &image,
                offset: 0,
                rows: Axis::Table(&b_row_table),
                cols: Axis::Table(&b_col_table),
            };
            let product = Product {
                a,
                b,
                fused: Fused::default(),
            };
            for threads in [1, 2] {
                let mut c = vec![f32::NAN; m * n];
                sgemm(isa, product, &mut c, threads, &|_, _| {}).unwrap();
                let what = format!("{} {m}x{k}x{n} threads {threads}", isa.name());
                for i in 0..m {
                    for j in 0..n {
                        let terms = (0..k).map(|l| {
                            let x = f64::from(a_values[order[i] * k + l]);
                            x * f64::from(image[(b_rows[l] + b_cols[j]) as usize])
                        });
                        let (want, scale) =
                            terms.fold((0.0, 0.0), |(s, a), t: f64| (s + t, a + t.abs()));
                        let got = f64::from(c[i * n + j]);
                        assert!(
                            (got - want).abs() <= 1e-6 * f64::max(scale, 1.0),
                            "{what} at ({i},{j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// `sgemm` refuses, before any core runs, every operand that would read
/// outside its slice, a product or bias too short, and operands whose
/// inner dimensions differ; an operand without elements may lie anywhere.
#[test]
fn sgemm_refuses_what_would_reach_outside_its_slices() {
    let values = vec![1.0f32; 12];
    let strided = |offset, (rows, rs), (cols, cs)| Matrix {
        data: &values,
        offset,
        rows: Axis::Strided {
            len: rows,
            stride: rs,
        },
        cols: Axis::Strided {
            len: cols,
            stride: cs,
        },
    };
    let run = |a: Matrix, b: Matrix, c: &mut [f32], bias: Option<Bias>| {
        let fused = Fused {
            bias,
            ..Fused::default()
        };
        sgemm(Isa::Generic, Product { a, b, fused }, c, 1, &|_, _| {})
    };
    let mut c = [0.0f32; 9];
    let a = strided(0, (3, 4), (4, 1));
    let b = strided(0, (4, 3), (3, 1));
    assert_eq!(run(a, b, &mut c, None), Ok(false));
    assert_eq!(c, [4.0; 9]);
    let operand = |operand, (rows, cols), (first, last)| Error::Operand {
        operand,
        rows,
        cols,
        first,
        last,
        len: 12,
    };
    // One past the end, and one before the start through a negative stride.
    let a_past = strided(1, (3, 4), (4, 1));
    assert_eq!(
        run(a_past, b, &mut c, None),
        Err(operand("a", (3, 4), (1, 12)))
    );
    let b_before = strided(2, (4, -1), (3, 1));
    assert_eq!(
        run(a, b_before, &mut c, None),
        Err(operand("b", (4, 3), (-1, 4)))
    );
    // A table with an offset outside the slice.
    let rows = Table::new(vec![0, 4, 9]);
    let a_tabled = Matrix {
        rows: Axis::Table(&rows),
        ..a
    };
    assert_eq!(
        run(a_tabled, b, &mut c, None),
        Err(operand("a", (3, 4), (0, 12)))
    );
    let short = |what, len, needs| Error::Short { what, len, needs };
    assert_eq!(run(a, b, &mut c[..8], None), Err(short("product", 8, 9)));
    let bias = Some(Bias::Rows(&values[..2]));
    assert_eq!(run(a, b, &mut c, bias), Err(short("bias", 2, 3)));
    let b_deep = strided(0, (3, 3), (3, 1));
    let inner = Error::Inner {
        m: 3,
        k: 4,
        k_b: 3,
        n: 3,
    };
    assert_eq!(run(a, b_deep, &mut c, None), Err(inner));
    // No depth: nothing read, whatever the offsets; the product is zeros.
    let (a_empty, b_empty) = (strided(-100, (3, 4), (0, 1)), strided(100, (0, 3), (3, 1)));
    assert_eq!(run(a_empty, b_empty, &mut c, None), Ok(false));
    assert_eq!(c, [0.0; 9]);
    // Dimensions whose product passes usize (2^33 x 2^31), over one value
    // broadcast: no slice holds it.
    let one = [0.0f32];
    let (tall, wide) = (broadcast(&one, 1 << 33, 1), broadcast(&one, 1, 1 << 31));
    let err = run(tall, wide, &mut [], None);
    assert_eq!(err, Err(short("product", 0, usize::MAX)));
    // Reaches past i128 (lengths near 2^64 by strides near 2^63).
    let far = Axis::Strided {
        len: usize::MAX,
        stride: isize::MAX,
    };
    let huge = Matrix {
        data: &one,
        offset: isize::MAX,
        rows: far,
        cols: far,
    };
    let err = run(huge, broadcast(&one, usize::MAX, 1), &mut c, None);
    assert!(
        matches!(err, Err(Error::Operand { operand: "a", .. })),
        "{err:?}"
    );
}

/// bf16 products on every path this CPU runs (kiln's AMX core, its f32
/// cores widening the operands as they pack them, and the widened
/// operands' `sgemm`) against a plain product in f64 of the same bf16
/// values: tiles and panels ragged, odd depths, several depth blocks, a
/// few rows and wide ones, A stored transposed or read through a table, B
/// stored transposed or read through tables (in runs and out of them), on
/// one thread and two; every stored operand has a NaN past each of its
/// runs, which must not reach a sum. `finish` sees every row once where
/// kiln's cores compute the product.
#[test]
fn bf16_products_agree_with_a_plain_product_on_every_path() {
    let bits = |len: usize, seed: usize| -> Vec<u16> {
        (0..len)
            .map(|i| ((((i * 7919 + seed) % 97) as f32 / 13.0 - 3.0).to_bits() >> 16) as u16)
            .collect()
    };
    let value = |b: u16| f64::from(f32::from_bits(u32::from(b) << 16));
    let strided = |len, stride| Axis::Strided { len, stride };
    // `rows x cols` values of `x` (row-major) stored `rows x (cols + 1)`,
    // a NaN after each row.
    let padded = |x: &[u16], rows: usize, cols: usize| -> Vec<u16> {
        (0..rows * (cols + 1))
            .map(|e| match e % (cols + 1) {
                c if c == cols => 0x7fc0,
                c => x[e / (cols + 1) * cols + c],
            })
            .collect()
    };
    for &(m, k, n) in &[
        (1, 1, 1),
        (13, 7, 33),
        (12, 2, 32),
        (50, 513, 70),
        (97, 1100, 129),
        (200, 64, 17),
        (3, 300, 200),
        (130, 260, 5),
        (5, 0, 7),
        // Few rows that stream B (`gemv`): one, and two groups of four.
        (1, 1100, 1000),
        (8, 1030, 41),
    ] {
        let (a, b) = (bits(m * k, 1), bits(k * n, 2));
        let transpose = |x: &[u16], rows: usize, cols: usize| -> Vec<u16> {
            (0..rows * cols)
                .map(|e| x[(e % rows) * cols + e / rows])
                .collect()
        };
        let (a_rows, a_cols) = (padded(&a, m, k), padded(&transpose(&a, m, k), k, m));
        let (b_rows, b_cols) = (padded(&b, k, n), padded(&transpose(&b, k, n), n, k));
        // B's columns 3 apart after every 40th: panels of adjacent
        // offsets and panels across a gap.
        let gap = |j: usize| j + j / 40 * 3;
        let ldg = gap(n) + 1;
        let mut b_gaps = vec![0x7fc0u16; k * ldg];
        for (e, &v) in b.iter().enumerate() {
            b_gaps[e / n * ldg + gap(e % n)] = v;
        }
        // Each element's sum, and the sum of its terms' magnitudes.
        let (want, scale): (Vec<f64>, Vec<f64>) = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                let terms = (0..k).map(|l| value(a[i * k + l]) * value(b[l * n + j]));
                terms.fold((0.0, 0.0), |(s, t), x| (s + x, t + x.abs()))
            })
            .unzip();
        // A's rows and B's columns through tables: in reverse order, and
        // ascending with gaps.
        let a_table = Table::new((0..m).rev().map(|i| (i * (k + 1)) as isize).collect());
        let b_reversed = Table::new((0..n).rev().map(|j| j as isize).collect());
        let b_gapped = Table::new((0..n).map(|j| gap(j) as isize).collect());
        let matrix = |data, (rows, cols)| Matrix {
            data,
            offset: 0,
            rows,
            cols,
        };
        let a_plain = matrix(&a_rows, (strided(m, k as isize + 1), strided(k, 1)));
        let a_transposed = matrix(&a_cols, (strided(m, 1), strided(k, m as isize + 1)));
        let a_tabled = matrix(&a_rows, (Axis::Table(&a_table), strided(k, 1)));
        let b_plain = matrix(&b_rows, (strided(k, n as isize + 1), strided(n, 1)));
        let b_transposed = matrix(&b_cols, (strided(k, 1), strided(n, k as isize + 1)));
        let b_tabled = matrix(
            &b_rows,
            (strided(k, n as isize + 1), Axis::Table(&b_reversed)),
        );
        let b_runs = matrix(&b_gaps, (strided(k, ldg as isize), Axis::Table(&b_gapped)));
        for (what, a_op, b_op, flips) in [
            ("plain", a_plain, b_plain, (false, false)),
            ("a transposed", a_transposed, b_plain, (false, false)),
            ("b transposed", a_plain, b_transposed, (false, false)),
            ("a tabled", a_tabled, b_plain, (true, false)),
            ("b tabled", a_plain, b_tabled, (false, true)),
            ("b tabled in runs", a_plain, b_runs, (false, false)),
        ] {
            let context = format!("{m}x{k}x{n} {what}");
            check_bf16(&context, (a_op, b_op), (m, n), flips, (&want, &scale));
        }
    }
}

/// `bf16_gemm` of `a` and `b` on every path and on one thread and two,
/// against `want` (row-major, each within 1e-6 of its terms' magnitudes
/// `scale`), read with its rows or columns reversed where `flips` says.
fn check_bf16(
    context: &str,
    (a, b): (Matrix<'_, u16>, Matrix<'_, u16>),
    (m, n): (usize, usize),
    (flip_rows, flip_cols): (bool, bool),
    (want, scale): (&[f64], &[f64]),
) {
    let isas = Isa::ALL.into_iter().filter(|isa| isa.available());
    for (isa, threads) in isas.flat_map(|isa| [(isa, 1), (isa, 2)]) {
        let mut c = vec![f32::NAN; m * n];
        let seen = std::sync::Mutex::new(vec![0u8; m]);
        let finish = |r0: usize, r1: usize| {
            let mut seen = seen.lock().expect("unpoisoned");
            seen[r0..r1].iter_mut().for_each(|s| *s += 1);
        };
        let done = bf16_gemm(isa, a, b, &mut c, threads, &finish).expect("a product");
        let context = format!("{context} on {isa}, {threads} threads");
        let seen = seen.into_inner().expect("unpoisoned");
        assert!(
            seen.iter().all(|&s| s == u8::from(done)),
            "{context}: finish"
        );
        // Kiln's cores take every tabled product and every other one not
        // too narrow for them.
        let tabled = matches!(a.rows, Axis::Table(_)) || matches!(b.cols, Axis::Table(_));
        if isa != Isa::Generic && (tabled || n > 16) {
            assert!(done, "{context}: not on kiln's core");
        }
        for i in 0..m {
            let row = if flip_rows { m - 1 - i } else { i };
            for j in 0..n {
                let col = if flip_cols { n - 1 - j } else { j };
                let (got, e) = (f64::from(c[i * n + j]), row * n + col);
                assert!(
                    (got - want[e]).abs() <= 1e-6 * scale[e].max(1.0),
                    "{context} at ({i},{j}): {got} vs {}",
                    want[e]
                );
            }
        }
    }
}

/// A bf16 product whose broadcast depth of 2^62 no packed or widened copy
/// holds is an error on every path.
#[test]
fn a_bf16_product_too_large_to_pack_is_an_error() {
    let one = [0u16];
    let deep = |rows, cols| broadcast(&one, rows, cols);
    for isa in Isa::ALL.into_iter().filter(|isa| isa.available()) {
        let mut c = [0.0f32];
        let err = bf16_gemm(
            isa,
            deep(1, 1 << 62),
            deep(1 << 62, 1),
            &mut c,
            1,
            &|_, _| {},
        );
        let too_large = Error::TooLarge {
            m: 1,
            k: 1 << 62,
            n: 1,
        };
        assert_eq!(err, Err(too_large), "{isa}");
    }
}

/// A `rows x cols` matrix of `one`'s value, broadcast (both strides 0).
fn broadcast<T>(one: &[T; 1], rows: usize, cols: usize) -> Matrix<'_, T> {
    Matrix {
        data: one,
        offset: 0,
        rows: Axis::Strided {
            len: rows,
            stride: 0,
        },
        cols: Axis::Strided {
            len: cols,
            stride: 0,
        },
    }
}
