//! The seeded generator behind `Tensor::rand` and `Tensor::randn`.
//!
//! kiln carries its own SplitMix64 rather than a crate's generator so that a
//! seed names the same numbers in every kiln version: tests, benchmarks and
//! examples stay reproducible across dependency upgrades.

/// SplitMix64: 64 bits of state, full period, passes BigCrush as a stream.
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, 1) with 24 random bits: every value is an exact f32 below 1.
    pub(crate) fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Standard normal by the Box-Muller transform.
    pub(crate) fn next_normal(&mut self) -> f64 {
        // 1 - u lies in (0, 1], so the log is finite.
        let radius = (-2.0 * (1.0 - self.next_f64()).ln()).sqrt();
        radius * (std::f64::consts::TAU * self.next_f64()).cos()
    }
}
