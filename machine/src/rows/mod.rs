//! The 256-bit row functions that generated code calls where the CPU has
//! AVX2 and FMA (Cranelift emits 128-bit vectors only): e^(x - shift) over
//! a row with its sum and SiLU over a row (`exp`), a row's max, its sum
//! and a row scaled by a number (`ops`), and a row rounded to bf16
//! (`bf16`). Generated code calls them by address (`kiln_exp_sum`,
//! `kiln_silu_row`, `kiln_max_row`, `kiln_sum_row`, `kiln_scale_row`,
//! `kiln_bf16_row`); the safe forms here take slices, and refuse a CPU
//! without AVX2 and FMA.
//!
//! `unsafe` here is the calls of the row functions on the slices' rows.

#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
mod bf16;
#[cfg(target_arch = "x86_64")]
mod exp;
#[cfg(target_arch = "x86_64")]
mod ops;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests;

#[cfg(target_arch = "x86_64")]
pub use bf16::kiln_bf16_row;
#[cfg(target_arch = "x86_64")]
pub use exp::{kiln_exp_sum, kiln_silu_row};
#[cfg(target_arch = "x86_64")]
pub use ops::{kiln_max_row, kiln_scale_row, kiln_sum_row};

use crate::{Error, Isa};

/// Whether this CPU runs the row functions.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `Ok` where the CPU runs the row functions.
fn check() -> Result<(), Error> {
    match available() {
        true => Ok(()),
        false => Err(Error::MissingIsa { isa: Isa::Avx2 }),
    }
}

/// `Ok` where a destination row of `dst` elements matches its source row
/// of `src`.
fn same_length(src: usize, dst: usize) -> Result<(), Error> {
    match dst == src {
        true => Ok(()),
        false => Err(Error::Short {
            what: "destination row",
            len: dst,
            needs: src,
        }),
    }
}

/// A row's length as the row functions take it.
fn len(row: &[f32]) -> i64 {
    row.len() as i64
}

/// `dst[j] = e^(src[j] - shift)` where there is a `dst` (of `src`'s
/// length), and the sum of those values, as generated code's softmax
/// computes them.
#[cfg(target_arch = "x86_64")]
pub fn exp_sum(src: &[f32], shift: f32, dst: Option<&mut [f32]>) -> Result<f32, Error> {
    check()?;
    let dst = match dst {
        Some(dst) => {
            same_length(src.len(), dst.len())?;
            dst.as_mut_ptr()
        }
        None => std::ptr::null_mut(),
    };
    // SAFETY: the CPU has AVX2 and FMA; `src` and `dst` hold the row's
    // elements, and `dst` is borrowed apart from `src`.
    Ok(unsafe { kiln_exp_sum(src.as_ptr(), shift, dst, len(src), std::ptr::null()) })
}

/// `exp_sum` over `row`, storing into it.
#[cfg(target_arch = "x86_64")]
pub fn exp_sum_in_place(row: &mut [f32], shift: f32) -> Result<f32, Error> {
    check()?;
    let p = row.as_mut_ptr();
    // SAFETY: the CPU has AVX2 and FMA; `row` is this call's to read and
    // write.
    Ok(unsafe { kiln_exp_sum(p, shift, p, len(row), std::ptr::null()) })
}

/// `dst[j] = x * sigmoid(x)` for `x = src[j]` (`dst` of `src`'s length),
/// as generated code computes it.
#[cfg(target_arch = "x86_64")]
pub fn silu_into(src: &[f32], dst: &mut [f32]) -> Result<(), Error> {
    check()?;
    same_length(src.len(), dst.len())?;
    // SAFETY: the CPU has AVX2 and FMA; `src` and `dst` hold the row's
    // elements, and `dst` is borrowed apart from `src`.
    unsafe { kiln_silu_row(src.as_ptr(), dst.as_mut_ptr(), len(src)) };
    Ok(())
}

/// The IEEE maximum of `row` (-inf for no elements): NaN where the row has
/// one, +0 above -0.
#[cfg(target_arch = "x86_64")]
pub fn max(row: &[f32]) -> Result<f32, Error> {
    check()?;
    // SAFETY: the CPU has AVX2 and FMA; `row` holds the elements read.
    Ok(unsafe { kiln_max_row(row.as_ptr(), len(row)) })
}

/// The sum of `row` (+0 for no elements), its additions reassociated.
#[cfg(target_arch = "x86_64")]
pub fn sum(row: &[f32]) -> Result<f32, Error> {
    check()?;
    // SAFETY: the CPU has AVX2 and FMA; `row` holds the elements read.
    Ok(unsafe { kiln_sum_row(row.as_ptr(), len(row)) })
}

/// `dst[j] = src[j] * c` (`dst` of `src`'s length), each product one f32
/// operation.
#[cfg(target_arch = "x86_64")]
pub fn scale_into(src: &[f32], c: f32, dst: &mut [f32]) -> Result<(), Error> {
    check()?;
    same_length(src.len(), dst.len())?;
    // SAFETY: the CPU has AVX2 and FMA; `src` and `dst` hold the row's
    // elements, and `dst` is borrowed apart from `src`.
    unsafe { kiln_scale_row(src.as_ptr(), c, dst.as_mut_ptr(), len(src)) };
    Ok(())
}

/// `row[j] *= c`, each product one f32 operation.
#[cfg(target_arch = "x86_64")]
pub fn scale(row: &mut [f32], c: f32) -> Result<(), Error> {
    check()?;
    let p = row.as_mut_ptr();
    // SAFETY: the CPU has AVX2 and FMA; `row` is this call's to read and
    // write.
    unsafe { kiln_scale_row(p, c, p, len(row)) };
    Ok(())
}

/// `dst[j]` = the bits of the bf16 nearest `src[j]` (`dst` of `src`'s
/// length): ties to even, overflow to infinity, NaN a quiet NaN.
#[cfg(target_arch = "x86_64")]
pub fn round_bf16(src: &[f32], dst: &mut [u16]) -> Result<(), Error> {
    check()?;
    same_length(src.len(), dst.len())?;
    // SAFETY: the CPU has AVX2 and FMA; `src` and `dst` hold the row's
    // elements, and `dst` is borrowed apart from `src`.
    unsafe { kiln_bf16_row(src.as_ptr(), dst.as_mut_ptr(), len(src)) };
    Ok(())
}
