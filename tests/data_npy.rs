//! `.npy` files: every supported dtype round-trips through the writer and
//! the memory-mapped reader, and every kind of corruption is an `Err` that
//! names the file and what is wrong, never a panic; a few thousand mutated
//! headers go through the parser to prove it.

use std::path::{Path, PathBuf};

use kiln::data::DataError;
use kiln::data::npy::{NpyArray, NpyDType, NpyHeader, write_npy};
use kiln::{DType, Result};
use proptest::prelude::*;

/// A fresh directory for one test's files.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-npy-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("the temp dir is writable");
    d
}

/// A valid file: shape [3, 2] of f32 0..6.
fn valid(path: &Path) -> Vec<u8> {
    let data: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    write_npy(path, NpyDType::F32, &[3, 2], &data).expect("written");
    std::fs::read(path).expect("read back")
}

#[test]
fn every_dtype_round_trips() -> Result<()> {
    let d = dir("roundtrip");
    let cases: [(NpyDType, Vec<u8>, DType); 7] = [
        (
            NpyDType::F32,
            [1.5f32, -2.0, 0.25, 8.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            DType::F32,
        ),
        (
            NpyDType::F64,
            [1.5f64, -2.0, 0.25, 8.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            DType::F32,
        ),
        (
            NpyDType::I32,
            [1i32, -2, 3, 4]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            DType::I32,
        ),
        (
            NpyDType::I64,
            [1i64, -2, 3, 4]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            DType::I32,
        ),
        (
            NpyDType::F16,
            [1.5f32, -2.0, 0.25, 8.0]
                .iter()
                .flat_map(|&v| kiln::f16::from_f32(v).to_le_bytes())
                .collect(),
            DType::F16,
        ),
        (NpyDType::U8, vec![1, 2, 3, 250], DType::U8),
        (NpyDType::Bool, vec![1, 0, 0, 1], DType::Bool),
    ];
    for (dtype, bytes, kiln_dtype) in cases {
        let path = d.join(format!("{}.npy", dtype.descr().replace(['<', '|'], "")));
        write_npy(&path, dtype, &[2, 2], &bytes)?;
        let array = NpyArray::open(&path)?;
        assert_eq!(array.header().shape, [2, 2]);
        assert_eq!(array.header().dtype, dtype);
        assert_eq!(
            array.header().data_offset % 64,
            0,
            "data is 64-byte aligned"
        );
        let rows = array.rows(1, 2)?;
        assert_eq!(rows.dims(), [1, 2]);
        assert_eq!(rows.dtype(), kiln_dtype);
        match kiln_dtype {
            DType::F32 => assert_eq!(rows.to_vec::<f32>()?, [0.25, 8.0]),
            DType::I32 => assert_eq!(rows.to_vec::<i32>()?, [3, 4]),
            DType::U8 => assert_eq!(rows.to_vec::<u8>()?, [3, 250]),
            DType::Bool => assert_eq!(rows.to_vec::<bool>()?, [false, true]),
            DType::F16 => assert_eq!(
                rows.to_vec::<kiln::f16>()?,
                [0.25f32, 8.0].map(kiln::f16::from_f32)
            ),
            // `.npy` files of 64-bit elements are read narrowed to 32 bits,
            // and numpy has no bf16.
            DType::I64 | DType::F64 | DType::BF16 => {
                panic!("{kiln_dtype} read from {dtype:?}")
            }
        }
    }
    // Rank 0 and an empty first axis are valid arrays too.
    write_npy(
        &d.join("scalar.npy"),
        NpyDType::F32,
        &[],
        &2.5f32.to_le_bytes(),
    )?;
    assert_eq!(
        NpyArray::open(d.join("scalar.npy"))?.header().shape,
        Vec::<usize>::new()
    );
    write_npy(&d.join("empty.npy"), NpyDType::U8, &[0, 28, 28], &[])?;
    assert_eq!(
        NpyArray::open(d.join("empty.npy"))?.header().shape,
        [0, 28, 28]
    );
    Ok(())
}

/// The error `bytes` give as the contents of `path`.
fn error_of(path: &Path, bytes: &[u8]) -> String {
    std::fs::write(path, bytes).expect("written");
    match NpyArray::open(path) {
        Ok(_) => panic!("{} was accepted", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn corrupt_files_are_errors_naming_the_file_and_the_problem() {
    let d = dir("corrupt");
    let path = d.join("x.npy");
    let good = valid(&path);
    let shown = path.display().to_string();
    let header_end = 128;

    let mut bad_magic = good.clone();
    bad_magic[1] = b'X';
    assert_eq!(
        error_of(&path, &bad_magic),
        format!("{shown}: at byte 0: not a .npy file: bad magic")
    );

    assert_eq!(
        error_of(&path, &good[..9]),
        format!("{shown}: at byte 8: truncated header length")
    );
    assert_eq!(
        error_of(&path, &good[..5]),
        format!("{shown}: at byte 0: not a .npy file: bad magic")
    );

    let mut long_header = good.clone();
    long_header[8] = 0xff;
    long_header[9] = 0x7f;
    assert_eq!(
        error_of(&path, &long_header),
        format!(
            "{shown}: at byte 8: header of 32767 bytes runs past the end of the file (152 bytes)"
        )
    );

    assert_eq!(
        error_of(&path, &good[..good.len() - 4]),
        format!(
            "{shown}: at byte {header_end}: shape [3, 2] of <f4 needs 24 data bytes, the file holds 20"
        )
    );
    let mut extra = good.clone();
    extra.push(0);
    assert_eq!(
        error_of(&path, &extra),
        format!(
            "{shown}: at byte {header_end}: shape [3, 2] of <f4 needs 24 data bytes, the file holds 25"
        )
    );

    let swap = |from: &str, to: &str| -> Vec<u8> {
        let mut b = good.clone();
        let at = good
            .windows(from.len())
            .position(|w| w == from.as_bytes())
            .expect("the header has it");
        b[at..at + from.len()].copy_from_slice(to.as_bytes());
        b
    };
    assert_eq!(
        error_of(&path, &swap("<f4", ">f4")),
        format!("{shown}: at byte 10: unsupported dtype '>f4'")
    );
    assert_eq!(
        error_of(&path, &swap("<f4", "<c8")),
        format!("{shown}: at byte 10: unsupported dtype '<c8'")
    );
    assert_eq!(
        error_of(&path, &swap("False", "True ")),
        format!("{shown}: at byte 10: Fortran-order arrays are not supported")
    );
    assert_eq!(
        error_of(&path, &swap("(3, 2)", "(3, 9)")),
        format!(
            "{shown}: at byte {header_end}: shape [3, 9] of <f4 needs 108 data bytes, the file holds 24"
        )
    );
    let mut version = good.clone();
    version[6] = 9;
    assert_eq!(
        error_of(&path, &version),
        format!("{shown}: at byte 6: unsupported .npy version 9.0")
    );

    let missing = d.join("missing.npy");
    match NpyArray::open(&missing) {
        Err(DataError::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("a missing file gave {:?}", other.err()),
    }
}

/// The valid file the fuzz test mutates.
static GOOD: std::sync::LazyLock<Vec<u8>> =
    std::sync::LazyLock::new(|| valid(&dir("fuzz").join("x.npy")));

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// Any mutation of a valid file's header (bytes overwritten, the file cut
    /// short) parses to a header or an `Err`, never a panic; an accepted
    /// header always describes exactly the bytes that follow it.
    #[test]
    fn mutated_headers_never_panic(
        edits in prop::collection::vec((0usize..80, any::<u8>()), 1..6),
        cut in 0usize..100,
    ) {
        let good = &*GOOD;
        let mut bytes = good.clone();
        for (at, value) in edits {
            if at < bytes.len() {
                bytes[at] = value;
            }
        }
        bytes.truncate(bytes.len().min(good.len() + 8).saturating_sub(cut % 3 * cut / 2));
        if let Ok(header) = NpyHeader::parse(Path::new("fuzz.npy"), &bytes) {
            let numel: usize = header.shape.iter().product();
            prop_assert_eq!(bytes.len() - header.data_offset, numel * header.dtype.size());
        }
    }
}
