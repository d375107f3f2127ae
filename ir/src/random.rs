//! kiln's random numbers: Threefry-2x32 with 20 rounds (Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3", 2011; JAX's generator), a
//! counter-based cipher, so that element `i` of a random tensor is a pure
//! function of its key and `i`: the same on every backend, in any order,
//! fused into any kernel, and new for each key without a recompile.
//! `BinaryOp::Uniform` is its one use in graphs.

/// Bits the rotation of each round turns by, cycling: the CPU and CUDA
/// backends generate the same rounds.
pub const ROTATIONS: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];

/// Skein's key-schedule parity constant: the third key word is `PARITY ^
/// k0 ^ k1`.
pub const PARITY: u32 = 0x1BD1_1BDA;

/// Threefry-2x32-20 of `counter` under `key`: Random123's reference
/// function, whose known answers the tests check.
pub fn threefry2x32(key: [u32; 2], counter: [u32; 2]) -> [u32; 2] {
    let ks = [key[0], key[1], PARITY ^ key[0] ^ key[1]];
    let mut x = [
        counter[0].wrapping_add(ks[0]),
        counter[1].wrapping_add(ks[1]),
    ];
    for round in 0..20 {
        x[0] = x[0].wrapping_add(x[1]);
        x[1] = x[1].rotate_left(ROTATIONS[round % 8]) ^ x[0];
        if round % 4 == 3 {
            // The key injected every fourth round, with its count.
            let s = round / 4 + 1;
            x[0] = x[0].wrapping_add(ks[s % 3]);
            x[1] = x[1].wrapping_add(ks[(s + 1) % 3]).wrapping_add(s as u32);
        }
    }
    x
}

/// `uniform(key, counter)`: an f32 in [0, 1) from the top 24 bits of the
/// first word of Threefry-2x32-20 of `(counter, 0)` under `(key, 0)` (the
/// bits of the i32s): every value a multiple of 2^-24, each as likely.
/// Every fourth round adds key word `(s % 3)` to the first word and `((s +
/// 1) % 3) + s` to the second, `s` counting the injections from 1.
pub fn uniform(key: i32, counter: i32) -> f32 {
    let [bits, _] = threefry2x32([key as u32, 0], [counter as u32, 0]);
    (bits >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known answers for Threefry-2x32-20: (counter, key) -> output.
    #[test]
    fn threefry_gives_random123s_known_answers() {
        let known = [
            ([0, 0], [0, 0], [0x6B20_0159, 0x99BA_4EFE]),
            ([u32::MAX; 2], [u32::MAX; 2], [0x1CB9_96FC, 0xBB00_2BE7]),
            (
                [0x243F_6A88, 0x85A3_08D3],
                [0x1319_8A2E, 0x0370_7344],
                [0xC492_3A9C, 0x483D_F7A0],
            ),
        ];
        for (counter, key, want) in known {
            assert_eq!(
                threefry2x32(key, counter),
                want,
                "{counter:x?} under {key:x?}"
            );
        }
    }

    #[test]
    fn uniform_values_lie_in_zero_to_one() {
        let values: Vec<f32> = (0..10_000).map(|i| uniform(42, i)).collect();
        assert!(values.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = values.iter().sum::<f32>() / values.len() as f32;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert_ne!(uniform(1, 0), uniform(2, 0), "keys give different streams");
    }
}
