//! Products of a few rows of `a` (at most `FEW`: a classifier at batch 1,
//! an LSTM's recurrent step at batch 8) in one pass over `b`. The cores
//! and the `gemm` crate pack `b` first, a second pass over its memory that
//! for a few rows of `a` costs as much as the product
//! (`benches/RESULTS-cpu.md`).
//!
//! Where `b`'s columns lie contiguous (a weight stored `[n, k]` and read
//! transposed), each output is a dot product, computed in tiles of up to 4
//! rows by up to 4 columns: every vector of a column is loaded once for
//! all the tile's rows, and the tile's sums (one accumulator each) are
//! enough independent chains to keep the FMA units busy. One row takes a
//! column at a time in 4 accumulators: read as one stream, its columns
//! took less time than 8 at once (`benches/RESULTS-cpu.md`). Where `b`'s rows
//! lie contiguous, for one row of `a`, groups of columns are summed down
//! the depth in vector lanes (`rows`). Threads take stretches of columns.
//!
//! `unsafe` here is the reads through the caller's strides and pointers.

#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use super::lanes;
use super::lanes::{Lanes, Load};
use super::{Element, Operand, RawFused};
use crate::Isa;

/// Rows of `a` at most (here and in `packed`'s streamed products).
pub(super) const FEW: usize = 8;

/// Columns per task are a multiple of this, of every tile's width.
const COLUMNS: usize = 12;

/// Columns per task at most: a multiple of `COLUMNS`.
const STRETCH: usize = 132;

/// Products of one row of `a` and fewer multiply-adds stay with the
/// `gemm` crate, as do products of more rows whose `b` holds fewer than
/// `FEW_ROWS_WORK` elements: the crate has a one-row path of its own, and
/// packs a small `b` cheaply for several rows, where each of these dot
/// products pays a sum across lanes (`benches/RESULTS-cpu.md`).
const ONE_ROW_WORK: usize = 1 << 20;

/// See `ONE_ROW_WORK`.
const FEW_ROWS_WORK: usize = 1 << 15;

/// Whether `gemv` takes a product of `m` rows of `a` and `n` columns of
/// `b` over `k`: at most `FEW` rows, at least `ONE_ROW_WORK` or
/// `FEW_ROWS_WORK` elements of `b`, read without tables, `b`'s columns
/// contiguous, or for one row its rows (`rows`, measured for one row
/// only).
pub(super) fn takes<T>((m, n, k): (usize, usize, usize), a: Operand<T>, b: Operand<T>) -> bool {
    let work = match m {
        1 => ONE_ROW_WORK,
        _ => FEW_ROWS_WORK,
    };
    (1..=FEW).contains(&m)
        && n.saturating_mul(k) >= work
        && !a.tabled()
        && !b.tabled()
        && (b.rows == 1 || (m == 1 && b.cols == 1))
}

/// `c = epilogue(a b)` (row-major, its first `m * n` values) for `a` of
/// `m` rows and `k` columns and `b` of `k` rows and `n` columns, as
/// `takes` takes them (`m` from 1 to `FEW`, `b` contiguous along an axis),
/// in `isa`'s lanes, on the team's threads where `threads > 1`.
///
/// # Safety
/// `isa` is available; `a(i, l)` and `b(l, j)` for `i < m`, `l < k`,
/// `j < n` lie inside live buffers, and a bias of `epilogue` holds a value
/// for every row or every column it is added along.
pub(super) unsafe fn gemv<T: Load>(
    isa: Isa,
    (m, n, k): (usize, usize, usize),
    (a, b): (Operand<T>, Operand<T>),
    c: &mut [f32],
    threads: usize,
    epilogue: RawFused,
) {
    if n == 0 {
        return;
    }
    assert!(
        (1..=FEW).contains(&m) && c.len() >= m * n,
        "gemv: {m} rows, {n} columns"
    );
    let columns: Columns<T> = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Amx | Isa::Avx512 => columns_avx512::<T>,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => columns_avx2::<T>,
        _ => unreachable!("gemm sends only kiln's paths here"),
    };
    // SAFETY: a's elements lie inside a live buffer (the contract of this
    // function).
    let x = unsafe { rows_of(a, m, k) };
    let out = super::driver::C(c.as_mut_ptr());
    // Four even stretches of columns per thread, at most `STRETCH`
    // columns each, rather than fixed ones that leave one thread a
    // stretch more than the other; each stretch's outputs sit on the
    // stack, as a `Vec` per task took longer on two threads
    // (`benches/RESULTS-cpu.md`).
    let len = (n.div_ceil(4 * threads.max(1)).next_multiple_of(COLUMNS)).min(STRETCH);
    let stretch = |t: usize| {
        let j0 = t * len;
        let len = len.min(n - j0);
        let mut y = [0.0f32; FEW * STRETCH];
        let y = &mut y[..m * len];
        // SAFETY: columns j0..j0 + len of b, each of k rows, contiguous
        // along an axis (`takes`), and `columns` on an available ISA (the
        // contract of this function).
        unsafe { columns(&x, (m, k), b, j0, y) };
        for (i, row) in y.chunks_exact(len).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                // SAFETY: row i and column j0 + j are inside the bias where
                // it is added along them, and element (i, j0 + j) inside c,
                // which no other task writes.
                unsafe { *out.at(i * n + j0 + j) = epilogue.apply(v, i, j0 + j) };
            }
        }
    };
    let tasks = n.div_ceil(len);
    if threads > 1 {
        crate::team::for_each(tasks, &stretch);
    } else {
        (0..tasks).for_each(stretch);
    }
}

/// The first `m` rows of `a`, `k` elements each, one after the other:
/// the few rows a product of a few rows reads at every column.
///
/// # Safety
/// Elements `(i, l)` of `a` for `i < m`, `l < k` lie inside a live buffer.
pub(super) unsafe fn rows_of<T: Element>(a: Operand<T>, m: usize, k: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(m * k);
    for i in 0..m {
        // SAFETY: element (i, l) of a (the contract of this function).
        x.extend((0..k).map(|l| unsafe { *a.ptr.offset(a.row(i) + a.col(l)) }.to_f32()));
    }
    x
}

/// Columns `j0..j0 + y.len() / m` of `x b` into `y` (row-major), for `x`
/// of `m` rows of `k` (row-major), in `L`'s lanes.
///
/// # Safety
/// `L`'s instructions run on this CPU; elements (l, j) of b for `l < k`
/// and those columns lie inside a live buffer, and b's columns are
/// contiguous, or its rows for one row of `x` (`takes`).
#[inline(always)]
unsafe fn columns<L: Lanes, T: Load>(
    x: &[f32],
    (m, k): (usize, usize),
    b: Operand<T>,
    j0: usize,
    y: &mut [f32],
) {
    if b.rows == 1 {
        let first = b.ptr.wrapping_offset(j0 as isize * b.cols);
        // SAFETY: the columns' elements, each column's k adjacent, lie
        // inside b; `L` runs here.
        unsafe { tiles::<L, T>(x, (m, k), (first, b.cols), y) };
    } else {
        debug_assert_eq!(m, 1, "rows of b are read for one row of x");
        let first = b.ptr.wrapping_add(j0);
        // SAFETY: row l of b at columns j0.., `y.len()` of them adjacent,
        // for l < k; `L` runs here.
        unsafe { rows::<L, T>(&x[..k], (first, b.rows), y) };
    }
}

/// `columns` in 16 lanes.
///
/// # Safety
/// The CPU has AVX-512, and `columns`' contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn columns_avx512<T: Load>(
    x: &[f32],
    mk: (usize, usize),
    b: Operand<T>,
    j0: usize,
    y: &mut [f32],
) {
    // SAFETY: the contract of this function.
    unsafe { columns::<lanes::Avx512, T>(x, mk, b, j0, y) }
}

/// `columns` in 8 lanes.
///
/// # Safety
/// The CPU has AVX2 and FMA, and `columns`' contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn columns_avx2<T: Load>(
    x: &[f32],
    mk: (usize, usize),
    b: Operand<T>,
    j0: usize,
    y: &mut [f32],
) {
    // SAFETY: the contract of this function.
    unsafe { columns::<lanes::Avx2, T>(x, mk, b, j0, y) }
}

/// `columns` on one ISA.
type Columns<T> = unsafe fn(&[f32], (usize, usize), Operand<T>, usize, &mut [f32]);

/// `y = x b` for one row `x` and `y.len()` columns of b whose rows are
/// contiguous, the first row at the pointer, each the stride after the one
/// before: the columns in groups of 8 vectors (8 sums, enough FMAs in
/// flight, and two cache lines of each bf16 row in 8 lanes), each summed down the
/// depth, then of one vector (the last ending at the last column, over
/// columns of the group before, which it sums the same way). Fewer columns
/// than a vector are summed one by one. (In plain code, as the compiler
/// vectorized it for SSE2, a bf16 row of 1280x1000 took longer than an f32
/// one, and groups of 4 vectors in two chains took longer than these:
/// `benches/RESULTS-cpu.md`.)
///
/// # Safety
/// `L`'s instructions run on this CPU; the first `y.len()` elements of
/// each of `x.len()` rows lie inside a live buffer.
#[inline(always)]
unsafe fn rows<L: Lanes, T: Load>(x: &[f32], b: (*const T, isize), y: &mut [f32]) {
    let len = y.len();
    if len < L::LANES {
        y.fill(0.0);
        for (l, &xl) in x.iter().enumerate() {
            let row = b.0.wrapping_offset(l as isize * b.1);
            for (j, out) in y.iter_mut().enumerate() {
                // SAFETY: element j of row l (the contract of this function).
                *out += xl * unsafe { *row.add(j) }.to_f32();
            }
        }
        return;
    }
    let mut j = 0;
    while j + 8 * L::LANES <= len {
        // SAFETY: columns j..j + 8 LANES, below len; `L` runs here.
        unsafe { row_sums::<L, T, 8>(x, b, j, y) };
        j += 8 * L::LANES;
    }
    while j < len {
        // SAFETY: columns up to len, from at least 0 (LANES <= len).
        unsafe { row_sums::<L, T, 1>(x, b, j.min(len - L::LANES), y) };
        j += L::LANES;
    }
}

/// `s += x * row`, for `C` vectors of a row of b from `row`.
///
/// # Safety
/// `L`'s instructions run on this CPU; `C * LANES` elements from `row` lie
/// inside a live buffer.
#[inline(always)]
unsafe fn row_step<L: Lanes, T: Load, const C: usize>(s: &mut [L::V; C], x: f32, row: *const T) {
    // SAFETY: the contract of this function.
    let a = unsafe { L::splat(x) };
    for (c, s) in s.iter_mut().enumerate() {
        // SAFETY: vector c of the row (the contract of this function).
        *s = unsafe { L::fma(a, T::lanes::<L>(row.add(c * L::LANES)), *s) };
    }
}

/// Columns `j..j + C * LANES` of `rows`' product into `y`.
///
/// # Safety
/// `rows`' contract, and those columns lie below `y.len()`.
#[inline(always)]
unsafe fn row_sums<L: Lanes, T: Load, const C: usize>(
    x: &[f32],
    (first, stride): (*const T, isize),
    j: usize,
    y: &mut [f32],
) {
    debug_assert!(j + C * L::LANES <= y.len());
    let b = first.wrapping_add(j);
    // SAFETY: `L` runs here.
    let mut s = [unsafe { L::zero() }; C];
    for (l, &x) in x.iter().enumerate() {
        // SAFETY: `L` runs here, row l of b at these columns (the contract
        // of this function).
        unsafe { row_step::<L, T, C>(&mut s, x, b.wrapping_offset(l as isize * stride)) };
    }
    for (c, &s) in s.iter().enumerate() {
        // SAFETY: columns below y.len(); `L` runs here.
        unsafe { L::store(y.as_mut_ptr().add(j + c * L::LANES), s) };
    }
}

/// Every dot product of `x`'s `m` rows of `k` with `y.len() / m` columns
/// of `k` adjacent elements, the first at the pointer, each the stride
/// after the one before, into `y` (row-major), in `L`'s lanes, over blocks
/// of `BLOCK` columns: in each, the rows in groups of 4 (the last group 1
/// to 4), each group's columns in tiles of 4 columns for two rows and 3 for
/// three or four (at least 8 sums each, so 8 FMAs are in flight, and no
/// more than AVX2's 16 registers hold), one column for one row and for the
/// last columns, in 4 accumulators each. The second group of rows reads
/// the block's columns from the cache.
///
/// # Safety
/// `L`'s instructions run on this CPU; the columns lie inside a live
/// buffer.
#[inline(always)]
unsafe fn tiles<L: Lanes, T: Load>(
    x: &[f32],
    (m, k): (usize, usize),
    (first, stride): (*const T, isize),
    y: &mut [f32],
) {
    let len = y.len() / m;
    for j0 in (0..len).step_by(BLOCK) {
        let end = (j0 + BLOCK).min(len);
        for i in (0..m).step_by(4) {
            let rows = (m - i).min(4);
            // One row: a column at a time, read as one stream, in 4
            // accumulators (as many sums in flight as the tiles have).
            let wide = match rows {
                1 => 1,
                2 => 4,
                _ => 3,
            };
            let mut j = j0;
            while j < end {
                let cols = if end - j >= wide { wide } else { 1 };
                let at = Tile {
                    x: &x[i * k..],
                    k,
                    b: first.wrapping_offset(j as isize * stride),
                    stride,
                };
                // SAFETY: columns j..j + cols, inside b (the contract of
                // this function); `L` runs here.
                let out = &mut y[i * len + j..];
                unsafe {
                    match (rows, cols) {
                        (2, 4) => at.dots::<L, 2, 4, 1>(out, len),
                        (3, 3) => at.dots::<L, 3, 3, 1>(out, len),
                        (4, 3) => at.dots::<L, 4, 3, 1>(out, len),
                        (1, _) => at.dots::<L, 1, 1, 4>(out, len),
                        (2, _) => at.dots::<L, 2, 1, 4>(out, len),
                        (3, _) => at.dots::<L, 3, 1, 4>(out, len),
                        _ => at.dots::<L, 4, 1, 4>(out, len),
                    }
                }
                j += cols;
            }
        }
    }
}

/// Columns per block: a multiple of every tile's width.
const BLOCK: usize = 24;

/// Where a tile's dot products read: rows of `x` of `k` each from its
/// start, columns of `b` from `b`, `stride` apart.
struct Tile<'a, T> {
    x: &'a [f32],
    k: usize,
    b: *const T,
    stride: isize,
}

impl<T: Load> Tile<'_, T> {
    /// The first element of column `c`.
    #[inline(always)]
    fn column(&self, c: usize) -> *const T {
        self.b.wrapping_offset(c as isize * self.stride)
    }

    /// The dot products of the first `R` rows with the first `C` columns
    /// into `out` (rows `row` apart), each in
    /// `U` accumulators of `L`'s lanes taking turns along the depth: those
    /// added, then their lanes, then the last elements past a whole vector.
    ///
    /// # Safety
    /// `L`'s instructions run on this CPU; the `C` columns' `k` elements
    /// lie inside a live buffer, and `x` holds `R` rows.
    #[inline(always)]
    unsafe fn dots<L: Lanes, const R: usize, const C: usize, const U: usize>(
        &self,
        out: &mut [f32],
        row: usize,
    ) {
        let (x, k) = (self.x.as_ptr(), self.k);
        debug_assert!(self.x.len() >= R * k);
        // SAFETY: `L` runs here.
        let zero = unsafe { L::zero() };
        let mut s = [[[zero; C]; R]; U];
        let mut l = 0;
        while l + L::LANES * U <= k {
            for (u, s) in s.iter_mut().enumerate() {
                // SAFETY: elements below k; `L` runs here.
                unsafe { self.step::<L, R, C>(s, l + u * L::LANES) };
            }
            l += L::LANES * U;
        }
        while l + L::LANES <= k {
            // SAFETY: as above.
            unsafe { self.step::<L, R, C>(&mut s[0], l) };
            l += L::LANES;
        }
        for r in 0..R {
            for c in 0..C {
                let mut sum = s[0][r][c];
                for s in &s[1..] {
                    // SAFETY: `L` runs here.
                    sum = unsafe { L::add(sum, s[r][c]) };
                }
                // SAFETY: the tail's elements of row r and column c.
                let tail = (l..k)
                    .map(|q| unsafe { *x.add(r * k + q) * (*self.column(c).add(q)).to_f32() });
                // SAFETY: `L` runs here.
                out[r * row + c] = unsafe { L::sum(sum) } + tail.sum::<f32>();
            }
        }
    }

    /// Adds to `s` the products of elements `l..l + LANES` of the first
    /// `R` rows and `C` columns.
    ///
    /// # Safety
    /// `L`'s instructions run on this CPU; those elements lie inside a
    /// live buffer (`l + LANES <= k`).
    #[inline(always)]
    unsafe fn step<L: Lanes, const R: usize, const C: usize>(
        &self,
        s: &mut [[L::V; C]; R],
        l: usize,
    ) {
        let (x, k) = (self.x.as_ptr(), self.k);
        // SAFETY (every intrinsic and load): `L` runs here, and elements
        // l..l + LANES of a column, or of a row of x, lie below k.
        let mut v = [unsafe { L::zero() }; C];
        for (c, v) in v.iter_mut().enumerate() {
            *v = unsafe { T::lanes::<L>(self.column(c).add(l)) };
        }
        for (r, s) in s.iter_mut().enumerate() {
            let a = unsafe { L::load(x.add(r * k + l)) };
            for (s, &v) in s.iter_mut().zip(&v) {
                *s = unsafe { L::fma(a, v, *s) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::super::{Operand, RawFused, gemm};
    use super::{FEW, FEW_ROWS_WORK, ONE_ROW_WORK, gemv, takes};
    use crate::Isa;

    /// Products of 1 to `FEW` rows on each of kiln's paths the CPU has
    /// (through `gemm` where it takes them, else directly), against sums
    /// in f64: `b` row-major and stored transposed, `a`'s rows read with
    /// strides, depths of 0 to 1000 (tails of every vector width), column
    /// counts that end in every tile's tail, one thread and the team, each
    /// epilogue; `finish` hears of the rows.
    #[test]
    fn few_row_products_agree_with_sums_in_f64() {
        let value = |i: usize, seed: usize| ((i * 7919 + seed) % 97) as f32 / 13.0 - 3.0;
        let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .filter(|i| i.available())
            .collect();
        if isas.is_empty() {
            eprintln!("skipped: this CPU runs none of kiln's cores");
        }
        // A value per column of the widest product below.
        let bias: Vec<f32> = (0..1019).map(|j| value(j, 5)).collect();
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
            (1, 0, 5),
            (1, 1, 1),
            (2, 3, 7),
            (1, 33, 257),
            (3, 33, 257),
            (5, 17, 1000),
            (6, 37, 1000),
            (1, 1000, 1000),
            (2, 1100, 1000),
            (4, 1049, 1001),
            (7, 1030, 1019),
            (FEW, 1031, 1003),
        ];
        for (isa, (m, k, n)) in isas.iter().flat_map(|&i| shapes.map(|s| (i, s))) {
            // a: column 1 of an [m, k, 2] array; b: [k, n], or [n, k] read
            // transposed.
            let a: Vec<f32> = (0..2 * m * k).map(|i| value(i, 1)).collect();
            let a_at = |i: usize, l: usize| a[1 + 2 * (i * k + l)];
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
                let a_op = Operand::strided(a.as_ptr().wrapping_add(1), 2 * k as isize, 2);
                for (e, &epilogue) in epilogues.iter().enumerate() {
                    for threads in [1, 2] {
                        let mut c = vec![f32::NAN; m * n];
                        let rows = Mutex::new(Vec::new());
                        let finish = |r0, r1| rows.lock().expect("unpoisoned").push((r0, r1));
                        let what = format!(
                            "{} {m}x{k}x{n} transposed {transposed} epilogue {e}",
                            isa.name()
                        );
                        let taken = takes((m, n, k), a_op, b_op);
                        let work = if m == 1 { ONE_ROW_WORK } else { FEW_ROWS_WORK };
                        assert_eq!(taken, k * n >= work && (transposed || m == 1), "{what}");
                        assert!(!takes((FEW + 1, n, k), a_op, b_op), "{what}");
                        if !taken && !transposed && m > 1 {
                            // Several rows of a row-major `b`: the crate's,
                            // which `tests/gemm_paths.rs` checks.
                            continue;
                        }
                        // SAFETY: isa is available; a(i, l) = a[1 + 2(ik + l)]
                        // and b's elements lie inside `a` and `b`, `c` holds
                        // m * n, the bias a value per column (and per row).
                        unsafe {
                            if taken {
                                let c = &mut c;
                                let applied =
                                    gemm(isa, m, n, k, a_op, b_op, c, threads, epilogue, &finish);
                                assert_eq!(applied, Ok(true), "{what}");
                            } else {
                                gemv(isa, (m, n, k), (a_op, b_op), &mut c, threads, epilogue);
                                finish(0, m);
                            }
                        }
                        assert_eq!(*rows.lock().expect("unpoisoned"), [(0, m)], "{what}");
                        for (at, &got) in c.iter().enumerate() {
                            let (i, j) = (at / n, at % n);
                            let terms = (0..k).map(|l| f64::from(a_at(i, l) * b_at(l, j)));
                            let size: f64 = terms.clone().map(f64::abs).sum();
                            // SAFETY: row i and column j are inside the bias.
                            let want = unsafe { epilogue.apply(terms.sum::<f64>() as f32, i, j) };
                            let tol = 2.0 * k as f64 * f64::from(f32::EPSILON) * (size + 6.0);
                            assert!(
                                (f64::from(got) - f64::from(want)).abs() <= tol,
                                "{what}: ({i}, {j}): got {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
