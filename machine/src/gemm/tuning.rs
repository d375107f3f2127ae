//! What kiln's GEMM paths are tuned to, in one table: each core's cache
//! blocking and the size from which it takes a product, and the limits
//! that send a product to the `gemm` crate. Every value is a measurement's
//! outcome; the measurements are in `benches/RESULTS-cpu.md`.

/// One core's tuning.
pub(super) struct Tuning {
    /// Products of at least this many multiply-adds run on the core, on
    /// one thread; below, the `gemm` crate took less time.
    pub work: usize,
    /// Depth of a block at most: every tile of C is read and written once
    /// per depth block, so deeper blocks cost less traffic in C.
    pub kc: usize,
    /// Rows of C per task at most: the packed A block (`MC x KC`) and a
    /// group of B panels (`KC x NR * NC_PANELS`) share the L2.
    pub mc: usize,
    /// Panels of B walked by every panel of A before the next group.
    pub nc_panels: usize,
    /// Farthest apart (in elements) the rows of B may be to be read in
    /// place: rows further apart map onto few cache sets.
    pub in_place_rows: usize,
}

/// The AVX-512 core (12 x 32 tiles):
/// - `work`: below 2^23, packing into panels cost more than the wider FMAs
///   saved against the `gemm` crate's 256-bit kernels;
/// - `kc`: 512 measured faster than 256 (1024³, 2048³, 4096x784x256);
/// - `mc`, `nc_panels`: the packed A block (192 KiB) and a group of B
///   panels (512 KiB) share Cascade Lake's 1 MiB L2;
/// - `in_place_rows`: read in place, rows 8 KiB apart made 96x2048x2048
///   take longer than packed.
#[cfg(target_arch = "x86_64")]
pub(super) const AVX512: Tuning = Tuning {
    work: 1 << 23,
    kc: 512,
    mc: 8 * super::avx512::MR,
    nc_panels: 8,
    in_place_rows: 512,
};

/// The AVX2 core (6 x 16 tiles):
/// - `work`: on one core it is level with the `gemm` crate or ahead from
///   about 2^22, and behind below;
/// - `kc`: 256 took longer at 1024³ and 2048³, 768 the same as 512;
/// - `mc`: 96 x 512 elements, 192 KiB of Zen 3's 512 KiB L2 beside a group
///   of B's panels (256 KiB); 48 and 144 rows measured the same;
/// - `nc_panels`: 4 and 16 measured the same; 1 (a panel of B in L1 over
///   all rows of A, A from L2) slower;
/// - `in_place_rows`: B packed always (read in place, 64x784x256 took
///   longer); the micro-kernel's loop relies on it (rows of B `NR` apart).
#[cfg(target_arch = "x86_64")]
pub(super) const AVX2: Tuning = Tuning {
    work: 1 << 22,
    kc: 512,
    mc: 16 * super::avx2::MR,
    nc_panels: 8,
    in_place_rows: 0,
};

/// On two threads or more, products of at least this many multiply-adds
/// and not too narrow (`SHARED_DIM`) run on kiln's cores, whatever
/// their own `work`: there kiln's cores run on every thread, and the `gemm`
/// crate on one (`CRATE_SHARED_WORK`), and both of kiln's cores took less
/// time than the crate; below it the crate was as fast or faster.
#[cfg(target_arch = "x86_64")]
pub(super) const SHARED_WORK: usize = 1 << 20;

/// Products with fewer rows or a shallower depth than this, or fewer
/// columns than `SHARED_COLUMNS`, stay with the crate, which reads A in
/// place and took less time on them than kiln's cores (16x4096x16,
/// 512x10x256). 16 and 64 rows of a convolution's 1x1 filter, 64 and 16
/// deep, took less time on kiln's core, where the crate's rayon threads
/// also vie with the team's for the cores (`benches/RESULTS-cpu.md`).
#[cfg(target_arch = "x86_64")]
pub(super) const SHARED_DIM: usize = 16;

/// See `SHARED_DIM`.
#[cfg(target_arch = "x86_64")]
pub(super) const SHARED_COLUMNS: usize = 32;

/// Products of at most this many columns stay with the crate: most of each
/// tile's FMAs would be wasted (`super::narrow`).
#[cfg(target_arch = "x86_64")]
pub(super) const NARROW: usize = 8;

/// Products of more than this many multiply-adds that the `gemm` crate
/// runs go on rayon's threads, which sleep between calls and take tens of
/// microseconds to wake; the others on the caller's alone. Below this size
/// a second thread saved the crate nothing or cost it time; above, narrow
/// products gain.
pub(super) const CRATE_SHARED_WORK: usize = 1 << 21;
