//! kiln's GEMMs: `C = A B` in f32, A and B read through any strides or
//! tables of offsets (so transposed operands and a convolution's windows
//! need no copy), C row-major, and the path that computes it; and `C = A B`
//! for bf16 A and B, summed in f32 (on AMX, or widened to f32 as the f32
//! cores pack them).
//!
//! - `sgemm`, `sgemm_packed`, `bf16_gemm`: the safe entries, which check
//!   every offset the product reads and writes against its slices;
//! - `packed`: a right operand packed once for many products (`PackedB`, a
//!   compiled graph's weight), a few rows streamed over its panels;
//! - `gemv`: products of a few rows in one pass over a `b` not packed;
//! - `lanes`: the vectors of f32 lanes `gemv` and `packed` are written in;
//! - `driver`: the loop nest of kiln's own cores (cache blocking, packing,
//!   threads, a bias and ReLU applied in registers, any other epilogue
//!   handed each block of rows as it finishes), generic over a
//!   micro-kernel;
//! - `panel`: packed panels of B and A (bf16 widened to f32 as they are
//!   packed, or a bf16 A's contiguous rows widened row by row), and rows
//!   of A read where they lie;
//! - `avx512`, `avx2`: the micro-kernels, 12 x 32 in zmm and 6 x 16 in ymm
//!   registers;
//! - `amx`: the bf16 core, 32 x 32 in four AMX tiles;
//! - `tuning`: each core's blocking and the sizes at which it takes a
//!   product, in one table.
//!
//! The path (`Isa`): for bf16 products, the AMX core where the CPU has
//! AMX-BF16 (`amx`); for f32 ones, kiln's AVX-512 core where the CPU has
//! AVX-512, else its
//! AVX2+FMA core where it has those, else (and for products too small for
//! packing to pay) the `gemm` crate, which dispatches on the CPU itself.
//! Off AMX, bf16 products take the f32 path, their operands widened as the
//! cores pack them, or before the `gemm` crate's.
//!
//! `unsafe` here is the cores' loads and stores through the operands'
//! offsets, made safe by `sgemm`'s checks.

#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::relu_then_cap;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod driver;
mod gemv;
mod lanes;
mod packed;
#[cfg(target_arch = "x86_64")]
mod panel;
mod safe;
#[cfg(target_arch = "x86_64")]
mod share;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
mod tuning;

pub use packed::PackedB;
pub use safe::{Axis, Bias, Fused, Matrix, Product, Table, bf16_gemm, sgemm, sgemm_packed};

/// The threads a product of `work` multiply-adds runs on: one per 64³,
/// up to the team's (`team::threads`). The second thread pays from about
/// that size, as at 100³ and at the training step's 250x256x10
/// (`benches/RESULTS-cpu.md`).
pub fn threads_for(work: usize) -> usize {
    (work / (64 * 64 * 64)).clamp(1, crate::team::threads())
}

/// Whether this CPU runs kiln's bf16 core (AMX-BF16, and Linux lets the
/// process use the tiles).
pub fn bf16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

use std::collections::TryReserveError;

use crate::{Error, Isa};
#[cfg(not(target_arch = "x86_64"))]
use tuning::CRATE_SHARED_WORK;
#[cfg(target_arch = "x86_64")]
use tuning::{AVX2, AVX512, CRATE_SHARED_WORK, NARROW, SHARED_COLUMNS, SHARED_DIM, SHARED_WORK};

/// An operand: element `(i, j)` at `ptr + i * rows + j * cols`, or where
/// a table is given, at `ptr + row_table[i] + j * cols` and so on: the rows
/// and columns of a view whose axes merge into them without one stride
/// (the windows of a convolution, each row a kernel position of a channel,
/// each column an output position), read where they lie.
#[derive(Clone, Copy)]
pub(crate) struct Operand<T = f32> {
    pub ptr: *const T,
    pub rows: isize,
    pub cols: isize,
    /// Null, or the offset of each row.
    pub row_table: *const isize,
    /// Null, or the offset of each column.
    pub col_table: *const isize,
}

impl<T> Operand<T> {
    /// Element `(i, j)` at `ptr + i * rows + j * cols`.
    pub(crate) fn strided(ptr: *const T, rows: isize, cols: isize) -> Operand<T> {
        Operand {
            ptr,
            rows,
            cols,
            row_table: std::ptr::null(),
            col_table: std::ptr::null(),
        }
    }

    /// Whether a table gives its rows' or columns' offsets.
    pub(crate) fn tabled(&self) -> bool {
        !self.row_table.is_null() || !self.col_table.is_null()
    }

    /// The offset of row `i`.
    ///
    /// # Safety
    /// `i` is a row of the operand.
    #[inline(always)]
    pub(crate) unsafe fn row(&self, i: usize) -> isize {
        match self.row_table.is_null() {
            true => i as isize * self.rows,
            // SAFETY: the table holds an offset for every row.
            false => unsafe { *self.row_table.add(i) },
        }
    }

    /// The offset of column `j`.
    ///
    /// # Safety
    /// `j` is a column of the operand.
    #[inline(always)]
    pub(crate) unsafe fn col(&self, j: usize) -> isize {
        match self.col_table.is_null() {
            true => j as isize * self.cols,
            // SAFETY: the table holds an offset for every column.
            false => unsafe { *self.col_table.add(j) },
        }
    }
}

/// The elements kiln's cores multiply: f32, and bf16 as its bits (`u16`),
/// which they widen to the f32 of the same value as they pack it.
pub(crate) trait Element: Copy + Send + Sync + 'static {
    /// Its value as an f32.
    fn to_f32(self) -> f32;
    /// The f32 values of four adjacent elements from `p`.
    ///
    /// # Safety
    /// The four lie inside a live buffer.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load4(p: *const Self) -> std::arch::x86_64::__m128;
    /// The operand where its elements are f32 already, which cores may read
    /// where they lie.
    fn as_f32(x: Operand<Self>) -> Option<Operand>;
}

impl Element for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load4(p: *const f32) -> std::arch::x86_64::__m128 {
        // SAFETY: the four lie inside a live buffer (the caller's contract);
        // x86-64 has SSE.
        unsafe { std::arch::x86_64::_mm_loadu_ps(p) }
    }

    fn as_f32(x: Operand) -> Option<Operand> {
        Some(x)
    }
}

impl Element for u16 {
    /// bf16 is the top half of the f32 of the same value.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }

    /// Each 16 bits moved into the top half of a 32-bit lane.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load4(p: *const u16) -> std::arch::x86_64::__m128 {
        use std::arch::x86_64::{
            _mm_castsi128_ps, _mm_loadl_epi64, _mm_setzero_si128, _mm_unpacklo_epi16,
        };
        // SAFETY: the four (64 bits) lie inside a live buffer (the caller's
        // contract); x86-64 has SSE2.
        unsafe {
            let bits = _mm_loadl_epi64(p.cast());
            _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), bits))
        }
    }

    fn as_f32(_: Operand<u16>) -> Option<Operand> {
        None
    }
}

// SAFETY: an operand is only read, while the caller of `gemm` keeps its
// buffer alive (the contract of `gemm`).
unsafe impl<T: Sync> Sync for Operand<T> {}
unsafe impl<T: Sync> Send for Operand<T> {}

/// `Fused` as the cores take it, its bias by address: what they apply to
/// each element of the product in registers as they store it: `c + bias[j]` (or
/// `bias[i]` where `rows`) where `bias` is not null, then ReLU where
/// `relu`, then the lesser of that and `cap` where there is one, in the
/// order and with the rounding of the generated epilogue, so that both give
/// the same values (a NaN's payload aside).
#[derive(Clone, Copy)]
pub(crate) struct RawFused {
    /// Null, or the first of one value per column of the product (per row
    /// where `rows`).
    pub bias: *const f32,
    /// Whether the bias holds a value per row (a convolution's, per output
    /// channel), not per column (a linear layer's).
    pub rows: bool,
    /// Whether ReLU follows.
    pub relu: bool,
    /// The value the result is capped at (finite, not zero: a NaN stays,
    /// and the sign of a zero never matters), if any.
    pub cap: Option<f32>,
}

impl RawFused {
    /// The product as it is.
    pub(crate) const NONE: RawFused = RawFused {
        bias: std::ptr::null(),
        rows: false,
        relu: false,
        cap: None,
    };

    /// Whether it leaves the product as it is.
    pub(crate) fn is_none(self) -> bool {
        self.bias.is_null() && !self.relu && self.cap.is_none()
    }

    /// The same epilogue for the tile of rows from `i` and columns from `j`
    /// on.
    pub(crate) fn at(self, i: usize, j: usize) -> RawFused {
        match self.bias.is_null() {
            true => self,
            false => RawFused {
                bias: self.bias.wrapping_add(if self.rows { i } else { j }),
                ..self
            },
        }
    }

    /// The bias of row `i` where it holds one per row: for every column.
    ///
    /// # Safety
    /// Where there is such a bias, `i` is one of its rows.
    #[inline(always)]
    pub(crate) unsafe fn row_bias(self, i: usize) -> Option<f32> {
        // SAFETY: the caller's row `i` is inside the bias.
        (self.rows && !self.bias.is_null()).then(|| unsafe { *self.bias.add(i) })
    }

    /// Element `x` at row `i` and column `j` (of those this epilogue starts
    /// at).
    ///
    /// # Safety
    /// Where there is a bias, `i` is one of its rows (`rows`) or `j` one of
    /// its columns.
    #[inline(always)]
    pub(crate) unsafe fn apply(self, x: f32, i: usize, j: usize) -> f32 {
        // SAFETY: the caller's row or column is inside the bias.
        let x = if self.bias.is_null() {
            x
        } else {
            x + unsafe { *self.bias.add(if self.rows { i } else { j }) }
        };
        // As generated code's ReLU: NaN stays, anything not above zero is +0.
        let x = if self.relu && x <= 0.0 { 0.0 } else { x };
        match self.cap {
            Some(cap) if x > cap => cap,
            _ => x,
        }
    }
}

// SAFETY: the bias is only read, while the caller of `gemm` keeps its
// buffer alive (the contract of `gemm`).
unsafe impl Sync for RawFused {}
unsafe impl Send for RawFused {}

/// Whether a product of `n` columns is too narrow for a core of `MR x NR`
/// tiles, which then leaves it to the `gemm` crate: at most `NARROW`
/// columns (most of each tile's FMAs wasted), or at most half a panel with
/// A packed (stored transposed, or its rows crowding the cache's sets, the
/// case measured), which then costs as much as the product: the crate took
/// less time on such products than either core. With A in place the
/// AVX-512 core, the faster there, keeps them (`benches/RESULTS-cpu.md`).
#[cfg(target_arch = "x86_64")]
fn narrow<const MR: usize, const NR: usize, T: Element>(a: Operand<T>, n: usize) -> bool {
    let in_place = T::as_f32(a).is_some_and(driver::reads_a_in_place::<MR, NR>);
    n <= NARROW || (n <= NR / 2 && !in_place)
}

/// `c = a b` by `isa`'s core, for `a` (`m x k`) and `b` (`k x n`) on
/// `threads` threads, where the core takes the product: one large enough
/// for it (its threshold, or `SHARED_WORK`; any size of bf16 operands,
/// which are widened either way) and not too narrow (`narrow`), or with an
/// operand read through tables (which only kiln's cores pack). The core
/// applies `epilogue` and calls `finish` as `gemm` says; the result is
/// whether it took the product.
///
/// # Safety
/// As `gemm`'s.
#[cfg(target_arch = "x86_64")]
unsafe fn by_core<T: Element>(
    isa: Isa,
    (m, n, k): (usize, usize, usize),
    (a, b): (Operand<T>, Operand<T>),
    c: &mut [f32],
    threads: usize,
    (epilogue, finish): (RawFused, &(dyn Fn(usize, usize) + Sync)),
) -> bool {
    let work = m.saturating_mul(n).saturating_mul(k);
    let wide = m.min(k) >= SHARED_DIM && n >= SHARED_COLUMNS;
    let shared = threads > 1 && work >= SHARED_WORK && wide;
    let any_size = T::as_f32(a).is_none();
    let takes = |threshold: usize, narrow: bool| {
        a.tabled() || b.tabled() || ((any_size || work >= threshold || shared) && !narrow)
    };
    let takes = match isa {
        Isa::Amx | Isa::Avx512 => takes(
            AVX512.work,
            narrow::<{ avx512::MR }, { avx512::NR }, T>(a, n),
        ),
        Isa::Avx2 => takes(AVX2.work, narrow::<{ avx2::MR }, { avx2::NR }, T>(a, n)),
        Isa::Generic => false,
    };
    if takes {
        let b = driver::Right::Lies(b);
        // SAFETY: the contract of this function, on one of kiln's cores.
        unsafe { driver::on_core(isa, (m, n, k), a, b, c, threads, epilogue, finish) };
    }
    takes
}

/// `c = a b` for `a: m x k`, `b: k x n`, `c` row-major `m x n`, on
/// `threads` threads. On kiln's paths: 1 to 8 rows of `a`, where `b` is
/// contiguous along an axis, in one pass over `b` (`gemv`); else by
/// `isa`'s core where it takes the product (`by_core`). Those apply
/// `epilogue` as they store the product and call `finish(r0, r1)` on each
/// block of rows as it is done (the result is then true). Else by the
/// `gemm` crate (a tabled operand gathered into a plain matrix first, an
/// error where that cannot be allocated), which does neither.
///
/// # Safety
/// `isa` must be available, `a(i, l)` for `i < m, l < k` and `b(l, j)` for
/// `l < k, j < n` must lie inside live buffers (when `k > 0`), `c` must
/// hold `m * n` elements, and a bias of `epilogue` `n` live ones (`m`
/// where it holds one per row).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    c: &mut [f32],
    threads: usize,
    epilogue: RawFused,
    finish: &(dyn Fn(usize, usize) + Sync),
) -> Result<bool, Error> {
    if !matches!(isa, Isa::Generic) && gemv::takes((m, n, k), a, b) {
        // SAFETY: the contract of this function, for the few rows
        // `takes` takes.
        unsafe { gemv::gemv(isa, (m, n, k), (a, b), c, threads, epilogue) };
        finish(0, m);
        return Ok(true);
    }
    // SAFETY: the contract of this function.
    #[cfg(target_arch = "x86_64")]
    if unsafe { by_core(isa, (m, n, k), (a, b), c, threads, (epilogue, finish)) } {
        return Ok(true);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (epilogue, finish);
    let work = m.saturating_mul(n).saturating_mul(k);
    let too_large = |_| Error::TooLarge { m, k, n };
    // SAFETY (both): the operands' elements lie inside live buffers (the
    // contract of this function).
    let (a_plain, a) = unsafe { untabled(a, m, k) }.map_err(too_large)?;
    let (b_plain, b) = unsafe { untabled(b, k, n) }.map_err(too_large)?;
    // SAFETY: the operands' elements (gathered ones in the vectors, alive
    // to the end of the call) and c's `m * n` lie inside live buffers.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.ptr,
            a.cols,
            a.rows,
            b.ptr,
            b.cols,
            b.rows,
            0.0,
            1.0,
            false,
            false,
            false,
            if threads > 1 && work > CRATE_SHARED_WORK {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            },
        );
    }
    drop((a_plain, b_plain));
    Ok(false)
}

/// `gemm` for bf16 operands (their bits), without an epilogue: each
/// product exact and their sums in f32, as `gemm` sums the operands widened
/// to f32. A product of a few rows that `gemv` takes streams B, widened as
/// it is loaded; else `isa`'s core widens them as it packs them, on every
/// thread, where it takes the product (`by_core`, at any size: the
/// operands are widened either way); else both are widened into f32
/// matrices first (an error where they cannot be allocated), which `gemm`
/// multiplies. The result is `gemm`'s.
///
/// # Safety
/// As `gemm`'s.
pub(crate) unsafe fn gemm_bf16(
    isa: Isa,
    (m, n, k): (usize, usize, usize),
    (a, b): (Operand<u16>, Operand<u16>),
    c: &mut [f32],
    threads: usize,
    finish: &(dyn Fn(usize, usize) + Sync),
) -> Result<bool, Error> {
    // A few rows stream B where it lies, widened as it is loaded, as f32's
    // do: packed, all of it would be widened first.
    if !matches!(isa, Isa::Generic) && gemv::takes((m, n, k), a, b) {
        // SAFETY: the contract of this function, for the few rows
        // `takes` takes.
        unsafe { gemv::gemv(isa, (m, n, k), (a, b), c, threads, RawFused::NONE) };
        finish(0, m);
        return Ok(true);
    }
    // SAFETY: the contract of this function.
    #[cfg(target_arch = "x86_64")]
    if unsafe { by_core(isa, (m, n, k), (a, b), c, threads, (RawFused::NONE, finish)) } {
        return Ok(true);
    }
    let too_large = |_| Error::TooLarge { m, k, n };
    // SAFETY (both): the operands' elements lie inside live buffers (the
    // contract of this function).
    let (a_wide, a) = unsafe { gathered(a, m, k) }.map_err(too_large)?;
    let (b_wide, b) = unsafe { gathered(b, k, n) }.map_err(too_large)?;
    // SAFETY: the contract of this function, for the widened operands,
    // alive in the vectors to the end of the call.
    let done = unsafe { gemm(isa, m, n, k, a, b, c, threads, RawFused::NONE, finish) };
    drop((a_wide, b_wide));
    done
}

/// `x` (`rows x cols`) as a plain strided operand: itself, or its elements
/// gathered row-major into the returned vector, which it then reads.
///
/// # Safety
/// Every element of `x` lies inside a live buffer.
unsafe fn untabled(
    x: Operand,
    rows: usize,
    cols: usize,
) -> Result<(Vec<f32>, Operand), TryReserveError> {
    match x.tabled() {
        false => Ok((Vec::new(), x)),
        // SAFETY: the contract of this function.
        true => unsafe { gathered(x, rows, cols) },
    }
}

/// The elements of `x` (`rows x cols`) as f32, gathered row-major into the
/// returned vector, and the operand that reads them there; an error where
/// the vector cannot be allocated.
///
/// # Safety
/// Every element of `x` lies inside a live buffer.
unsafe fn gathered<T: Element>(
    x: Operand<T>,
    rows: usize,
    cols: usize,
) -> Result<(Vec<f32>, Operand), TryReserveError> {
    let mut plain = Vec::new();
    plain.try_reserve_exact(rows.saturating_mul(cols))?;
    for i in 0..rows {
        // SAFETY: row i of x is inside its buffer.
        let row = x.ptr.wrapping_offset(unsafe { x.row(i) });
        if x.cols == 1 && x.col_table.is_null() && cols > 0 {
            // SAFETY: the row's `cols` adjacent elements, inside its buffer.
            let row = unsafe { std::slice::from_raw_parts(row, cols) };
            plain.extend(row.iter().map(|v| v.to_f32()));
            continue;
        }
        for j in 0..cols {
            // SAFETY: element (i, j) of x, inside its buffer.
            plain.push(unsafe { *row.wrapping_offset(x.col(j)) }.to_f32());
        }
    }
    let operand = Operand::strided(plain.as_ptr(), cols as isize, 1);
    Ok((plain, operand))
}
