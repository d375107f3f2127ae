//! CUBINs kept on disk from process to process: a kernel compiled once by
//! NVRTC is read back by every later process that generates the same CUDA
//! C for the same architecture with the same NVRTC, instead of compiled
//! again (NVRTC's time is per kernel: `benches/RESULTS-cuda.md`).
//!
//! A file per kernel, named by the SHA-256 of what determines its CUBIN
//! (the source, the architecture, NVRTC's options and version). It holds a
//! header (`MAGIC`, that name's digest, the CUBIN's length and its
//! SHA-256) and the CUBIN. A file that is short, of another format, another
//! key or whose CUBIN does not hash to its digest is not used: the kernel
//! is compiled and the file written again. Files are written under a
//! temporary name and renamed into place, so that processes sharing the
//! folder never read one half written (a process killed between the two
//! leaves its temporary file behind). The cache only saves time: a folder
//! that cannot be made or written leaves every kernel compiled as without
//! it. Nothing is ever removed from it; deleting the folder empties it.
//!
//! The digests catch damage, not forgery: like any compiler's cache, the
//! folder is trusted as the CUBINs in it are loaded and run.
//!
//! The folder is `$KILN_CACHE_DIR/cuda`, else `$XDG_CACHE_HOME/kiln/cuda`,
//! else `$HOME/.cache/kiln/cuda`; without any of them, or with
//! `KILN_CACHE_DIR` set but empty, the cache is off.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

/// The first bytes of every file: the format and its version.
const MAGIC: &[u8; 8] = b"kilncub1";

/// Header: `MAGIC`, the key's digest, the CUBIN's length (u64, little
/// endian) and its digest.
const HEADER: usize = 8 + 32 + 8 + 32;

/// The folder of the cache, if it is on (read from the environment once
/// per call: tests and users may point it elsewhere).
pub fn folder() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let base = match std::env::var_os("KILN_CACHE_DIR") {
        Some(dir) if dir.is_empty() => return None,
        Some(dir) => PathBuf::from(dir),
        None => match (var("XDG_CACHE_HOME"), var("HOME")) {
            (Some(xdg), _) => PathBuf::from(xdg).join("kiln"),
            (None, Some(home)) => PathBuf::from(home).join(".cache").join("kiln"),
            (None, None) => return None,
        },
    };
    Some(base.join("cuda"))
}

/// The digest naming a kernel's file: of everything its CUBIN depends on,
/// each part with its length before it, so that no two sets of parts run
/// together into the same bytes.
pub fn key(source: &str, arch: &str, options: &[String], nvrtc: (i32, i32)) -> [u8; 32] {
    let mut hash = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    part(MAGIC);
    part(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    part(arch.as_bytes());
    for option in options {
        part(option.as_bytes());
    }
    part(source.as_bytes());
    hash.finalize().into()
}

/// The file of `key` in `folder`.
pub fn file(folder: &Path, key: &[u8; 32]) -> PathBuf {
    let name: String = key.iter().map(|b| format!("{b:02x}")).collect();
    folder.join(format!("{name}.cubin"))
}

/// The CUBIN kept for `key`, if a whole and sound one is.
pub fn read(folder: &Path, key: &[u8; 32]) -> Option<Vec<u8>> {
    let bytes = std::fs::read(file(folder, key)).ok()?;
    let (header, cubin) = bytes.split_at_checked(HEADER)?;
    let (magic, rest) = header.split_at(8);
    let (stored_key, rest) = rest.split_at(32);
    let (len, digest) = rest.split_at(8);
    let len = u64::from_le_bytes(len.try_into().ok()?);
    let sound = magic == MAGIC
        && stored_key == key
        && len == cubin.len() as u64
        && Sha256::digest(cubin).as_slice() == digest;
    sound.then(|| cubin.to_vec())
}

/// Keeps `cubin` for `key`; a failure leaves the cache as it was (but
/// for a temporary file it could not remove).
pub fn write(folder: &Path, key: &[u8; 32], cubin: &[u8]) {
    // Written by no other thread or process: the process's id and a count.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let target = file(folder, key);
    let temporary = target.with_extension(format!(
        "{}.{}.tmp",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let mut bytes = Vec::with_capacity(HEADER + cubin.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(key);
    bytes.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&Sha256::digest(cubin));
    bytes.extend_from_slice(cubin);
    // (`create_new`: a name some other process took is left to it.)
    let created = std::fs::create_dir_all(folder).and_then(|()| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)
    });
    let Ok(mut temporary_file) = created else {
        return;
    };
    let written = temporary_file
        .write_all(&bytes)
        .and_then(|()| std::fs::rename(&temporary, &target));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("kiln-cubin-cache-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_kept_cubin_reads_back_and_a_damaged_file_reads_as_none() {
        let dir = folder("damaged");
        let options = ["--fmad=false".to_string()];
        let k = key("kernel source", "sm_90", &options, (13, 0));
        assert_eq!(read(&dir, &k), None, "nothing kept yet");
        let cubin: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        write(&dir, &k, &cubin);
        assert_eq!(read(&dir, &k).as_deref(), Some(cubin.as_slice()));
        let path = file(&dir, &k);
        let whole = std::fs::read(&path).expect("the file just written");
        // Cut short anywhere, a byte of the header or of the CUBIN changed,
        // or another key's file under this key's name: none is used.
        let mut damaged = vec![
            whole[..HEADER - 1].to_vec(),
            whole[..whole.len() - 1].to_vec(),
        ];
        for at in [0, 8, 40, 48, HEADER, whole.len() - 1] {
            let mut bytes = whole.clone();
            bytes[at] ^= 1;
            damaged.push(bytes);
        }
        for bytes in damaged {
            std::fs::write(&path, &bytes).expect("the test's folder");
            assert_eq!(read(&dir, &k), None, "{} bytes read as sound", bytes.len());
        }
        let other = key("another source", "sm_90", &options, (13, 0));
        write(&dir, &other, &cubin);
        std::fs::rename(file(&dir, &other), &path).expect("the test's folder");
        assert_eq!(read(&dir, &k), None, "another key's file");
        // Written again, it is sound again; no temporary file is left.
        write(&dir, &k, &cubin);
        assert_eq!(read(&dir, &k).as_deref(), Some(cubin.as_slice()));
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("the test's folder")
            .map(|e| e.expect("an entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_part_of_the_key_changes_it() {
        let options = ["--fmad=false".to_string()];
        let k = key("source", "sm_90", &options, (13, 0));
        let others = [
            key("source ", "sm_90", &options, (13, 0)),
            key("source", "sm_80", &options, (13, 0)),
            key("source", "sm_90", &[], (13, 0)),
            key("source", "sm_90", &options, (13, 1)),
            // The parts' bounds count: "sm_9" + "0source" is not "sm_90" + "source".
            key("0source", "sm_9", &options, (13, 0)),
        ];
        for other in others {
            assert_ne!(k, other);
        }
        assert_eq!(k, key("source", "sm_90", &options, (13, 0)));
    }

    #[test]
    fn a_folder_that_cannot_be_made_keeps_nothing() {
        let dir = folder("blocked");
        std::fs::write(&dir, b"a file where the folder would be").expect("the temporary folder");
        let k = key("source", "sm_90", &[], (13, 0));
        write(&dir.join("cuda"), &k, b"cubin");
        assert_eq!(read(&dir.join("cuda"), &k), None);
        let _ = std::fs::remove_file(&dir);
    }
}
