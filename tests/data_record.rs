//! Record files: variable-length records round-trip, and a corrupt index
//! (pointing past the end, out of order, truncated) is an `Err` naming the
//! file and the offset.

use std::path::PathBuf;

use kiln::data::DataError;
use kiln::data::record::{RecordFile, write_records};

fn path(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-record-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("the temp dir is writable");
    d.join(name)
}

#[test]
fn records_round_trip() -> Result<(), DataError> {
    let p = path("ok.rec");
    let records: [&[u8]; 4] = [b"alpha", b"", b"a longer third record", b"z"];
    write_records(&p, records)?;
    let file = RecordFile::open(&p)?;
    assert_eq!(file.len(), 4);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(file.get(i)?, *r);
    }
    assert_eq!(
        file.get(4).err().map(|e| e.to_string()),
        Some(format!(
            "{}: item 4: no such record: the file holds 4",
            p.display()
        ))
    );
    write_records(&path("empty.rec"), [])?;
    assert!(RecordFile::open(path("empty.rec"))?.is_empty());
    Ok(())
}

#[test]
fn a_corrupt_index_is_an_error_with_the_offset() -> Result<(), DataError> {
    let p = path("bad.rec");
    write_records(&p, [b"abc".as_slice(), b"defg"])?;
    let good = std::fs::read(&p).expect("read back");
    let shown = p.display().to_string();
    let open_with = |bytes: &[u8]| {
        std::fs::write(&p, bytes).expect("written");
        RecordFile::open(&p).err().map(|e| e.to_string())
    };
    // Record 1 ending at 99, past the 7-byte payload.
    let mut past = good.clone();
    past[32..40].copy_from_slice(&99u64.to_le_bytes());
    assert_eq!(
        open_with(&past),
        Some(format!(
            "{shown}: at byte 32: record offset 99 is outside 0..=7 or before the previous one (3)"
        ))
    );
    let mut backwards = good.clone();
    backwards[24..32].copy_from_slice(&5u64.to_le_bytes());
    backwards[32..40].copy_from_slice(&4u64.to_le_bytes());
    assert_eq!(
        open_with(&backwards),
        Some(format!(
            "{shown}: at byte 32: record offset 4 is outside 0..=7 or before the previous one (5)"
        ))
    );
    let mut huge = good.clone();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(open_with(&huge).is_some_and(|e| e.starts_with(&format!("{shown}: at byte 8: "))));
    assert_eq!(
        open_with(&good[..good.len() - 1]),
        Some(format!(
            "{shown}: at byte 32: record offset 7 is outside 0..=6 or before the previous one (3)"
        ))
    );
    assert_eq!(
        open_with(b"KILNREC"),
        Some(format!("{shown}: at byte 0: not a record file: bad magic"))
    );
    Ok(())
}
