//! The row functions against plain loops: every length through the
//! unrolled parts, the single vectors and the tails, with guards either
//! side of each row.

use super::ops::maximum;
use super::*;

/// Rows of negatives with zeros and NaNs placed in every lane, the
/// unrolled part, the single vectors and the overlapping last one.
#[test]
fn max_is_the_interpreters_max() {
    if !available() {
        eprintln!("skipped: this CPU lacks AVX2 or FMA");
        return;
    }
    for n in [0, 1, 5, 8, 9, 31, 32, 33, 47, 64, 100, 1000, 1027] {
        let base: Vec<f32> = (0..n).map(|i| -1.0 - (i % 13) as f32).collect();
        let mut rows = vec![base.clone()];
        for at in (0..n).step_by(3) {
            for marks in [
                &[(at, f32::NAN)][..],
                &[(at, 0.0), (n - 1 - at, -0.0)],
                &[(at, -0.0), (n - 1 - at, 0.0)],
                &[(at, -0.0)],
                &[(at, f32::INFINITY)],
                &[(at, 5.0), (n - 1 - at, f32::NEG_INFINITY)],
            ] {
                let mut row = base.clone();
                for &(i, x) in marks {
                    row[i] = x;
                }
                rows.push(row);
            }
        }
        rows.push(vec![f32::NEG_INFINITY; n]);
        for row in rows {
            let want = row.iter().fold(f32::NEG_INFINITY, |m, &x| maximum(m, x));
            let got = max(&row).unwrap();
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "length {n}: {got:e} for {want:e} in {row:?}"
            );
        }
    }
}

/// Against a sum in f64; a NaN or an infinity in any place comes through.
#[test]
fn sum_sums_every_element_and_no_other() {
    if !available() {
        eprintln!("skipped: this CPU lacks AVX2 or FMA");
        return;
    }
    for n in [0, 1, 5, 7, 8, 9, 31, 32, 33, 47, 64, 100, 1000, 1027] {
        // NaN guards either side, which a read past the row would catch.
        let mut buf = vec![f32::NAN; n + 16];
        for (i, x) in buf[8..8 + n].iter_mut().enumerate() {
            *x = (i % 17) as f32 * 0.37 - 2.0;
        }
        let row = &buf[8..8 + n];
        let want: f64 = row.iter().map(|&x| f64::from(x)).sum();
        let got = sum(row).unwrap();
        let tolerance = 1e-6 * row.iter().map(|x| f64::from(x.abs())).sum::<f64>();
        assert!(
            (f64::from(got) - want).abs() <= tolerance,
            "length {n}: {got} for {want}"
        );
        for at in (0..n).step_by(5) {
            for (mark, want) in [(f32::NAN, f32::NAN), (f32::INFINITY, f32::INFINITY)] {
                let mut marked = row.to_vec();
                marked[at] = mark;
                let got = sum(&marked).unwrap();
                assert!(
                    got == want || (got.is_nan() && want.is_nan()),
                    "length {n}, {mark} at {at}: {got}"
                );
            }
        }
    }
}

#[test]
fn scale_scales_every_element_and_no_other() {
    if !available() {
        eprintln!("skipped: this CPU lacks AVX2 or FMA");
        return;
    }
    for n in [0, 1, 7, 8, 9, 31, 32, 33, 1000, 1027] {
        let src: Vec<f32> = (0..n).map(|i| (i % 17) as f32 * 0.37 - 2.0).collect();
        let c = 1.0 / 3.0f32;
        // Apart, with guards either side.
        let mut dst = vec![7.0f32; n + 2];
        scale_into(&src, c, &mut dst[1..=n]).unwrap();
        assert_eq!((dst[0], dst[n + 1]), (7.0, 7.0), "length {n}: guards");
        for (j, (&x, &y)) in src.iter().zip(&dst[1..=n]).enumerate() {
            assert_eq!(y.to_bits(), (x * c).to_bits(), "length {n}, element {j}");
        }
        // In place.
        let mut row = src.clone();
        scale(&mut row, c).unwrap();
        assert_eq!(row, dst[1..=n], "length {n}: in place");
    }
}

#[test]
fn exp_sum_sums_what_it_stores_from_its_shifted_source() {
    if !available() {
        eprintln!("skipped: this CPU lacks AVX2 or FMA");
        return;
    }
    for len in [0, 1, 7, 8, 9, 31, 32, 33, 1000, 1027] {
        let src: Vec<f32> = (0..len).map(|i| (i % 23) as f32 / 4.0 - 1.5).collect();
        let shift = 1.5f32;
        let mut dst = vec![f32::NAN; len];
        let total = exp_sum(&src, shift, Some(&mut dst)).unwrap();
        // The same exponentials as in place from the shifted row.
        let mut want: Vec<f32> = src.iter().map(|&x| x - shift).collect();
        let in_place = exp_sum_in_place(&mut want, 0.0).unwrap();
        assert_eq!(total.to_bits(), in_place.to_bits(), "length {len}");
        let same = dst
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "length {len}: exponentials differ");
        // Without a destination, the sum alone.
        let alone = exp_sum(&src, shift, None).unwrap();
        assert_eq!(total.to_bits(), alone.to_bits(), "length {len}");
        let exact: f64 = dst.iter().map(|&e| f64::from(e)).sum();
        let err = (f64::from(total) - exact).abs();
        assert!(
            err <= 1e-6 * exact.max(1.0),
            "length {len}: {total} for {exact}"
        );
    }
}

/// Against the `half` crate's rounding, for NaN's payload (whose bits the
/// crate also keeps, quieted): every length through the pairs of vectors
/// and the tail, each edge value in every lane, with guards either side.
#[test]
fn bf16_rounds_every_element_as_half_does() {
    if !available() {
        eprintln!("skipped: this CPU lacks AVX2 or FMA");
        return;
    }
    let edges = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001), // a signalling NaN
        f32::from_bits(0xffc1_2345),
        f32::MAX,                    // rounds up to infinity
        f32::from_bits(0x7f7f_7fff), // the largest that stays finite
        f32::from_bits(0x3f80_8000), // a tie, down to even
        f32::from_bits(0x3f81_8000), // a tie, up to even
        f32::from_bits(0x3f80_8001),
        f32::from_bits(0x0000_0001), // subnormals
        f32::from_bits(0x8040_8000),
        1.0 / 3.0,
    ];
    for n in [0, 1, 7, 15, 16, 17, 31, 32, 33, 100, 1027] {
        let base: Vec<f32> = (0..n).map(|i| (i % 29) as f32 * 0.731 - 9.0).collect();
        for (e, &edge) in edges.iter().enumerate() {
            let mut src = base.clone();
            for x in src.iter_mut().skip(e % 3).step_by(3) {
                *x = edge;
            }
            let mut dst = vec![0xdeadu16; n + 2];
            round_bf16(&src, &mut dst[1..=n]).unwrap();
            assert_eq!((dst[0], dst[n + 1]), (0xdead, 0xdead), "length {n}: guards");
            for (j, (&x, &got)) in src.iter().zip(&dst[1..=n]).enumerate() {
                let want = half::bf16::from_f32(x).to_bits();
                assert_eq!(
                    got,
                    want,
                    "length {n}, element {j}: {x:e} ({:#x})",
                    x.to_bits()
                );
            }
        }
    }
}

#[test]
fn rows_of_another_length_are_refused() {
    if !available() {
        eprintln!("skipped: this CPU lacks AVX2 or FMA");
        return;
    }
    let src = [1.0f32; 9];
    let mut dst = [0.0f32; 8];
    let short = Error::Short {
        what: "destination row",
        len: 8,
        needs: 9,
    };
    assert_eq!(exp_sum(&src, 0.0, Some(&mut dst)), Err(short.clone()));
    assert_eq!(scale_into(&src, 2.0, &mut dst), Err(short.clone()));
    assert_eq!(silu_into(&src, &mut dst), Err(short.clone()));
    assert_eq!(dst, [0.0; 8], "nothing written");
    let mut bits = [0u16; 8];
    assert_eq!(round_bf16(&src, &mut bits), Err(short));
    assert_eq!(bits, [0; 8], "nothing written");
}
