//! NVRTC: CUDA C to a CUBIN for one architecture (`sm_90`), so the module
//! loads with no PTX JIT and no PTX-version mismatch with the driver.
//!
//! The one module of the CUDA backend's compiler with `unsafe`: NVRTC is a
//! C library, called through cudarc's bindings.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::nvrtc::{result, sys};

use super::cubin_cache;
use crate::Error;

/// Whether libnvrtc can be loaded (it is looked up on the library path, as
/// `libnvrtc.so.13`). cudarc panics on a missing library instead of
/// returning an error, so every entry point checks this first.
pub fn available() -> bool {
    // SAFETY: only tries to dlopen the library; no NVRTC function is called.
    unsafe { sys::is_culib_present() }
}

/// Compiles `source` for `arch` (`sm_90`, `sm_80`, ...) and returns the CUBIN.
/// A compile error carries NVRTC's log.
pub fn compile(source: &str, arch: &str) -> Result<Vec<u8>, Error> {
    if !available() {
        return Err(crate::cuda(
            "nvrtc",
            "libnvrtc.so.13 is not on the library path (LD_LIBRARY_PATH): CUDA kernels cannot be compiled",
        ));
    }
    let fail =
        |what: &str, e: result::NvrtcError| crate::cuda(format!("nvrtc {what}"), format!("{e:?}"));
    let text = CString::new(source)
        .map_err(|_| crate::cuda("nvrtc", "generated CUDA C contains a NUL byte"))?;
    let program = result::create_program(&text, None).map_err(|e| fail("create", e))?;
    let options = options(arch);
    // SAFETY: `program` was created above and is destroyed only at the end;
    // the buffers passed to NVRTC have the sizes NVRTC reported.
    unsafe {
        let compiled = result::compile_program(program, &options);
        let outcome = match compiled {
            Ok(()) => cubin(program).map_err(|e| fail("get CUBIN", e)),
            Err(e) => {
                let log = result::get_program_log(program)
                    .map(|l| {
                        let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                        String::from_utf8_lossy(&bytes)
                            .trim_end_matches('\0')
                            .to_string()
                    })
                    .unwrap_or_default();
                Err(crate::cuda(
                    format!("nvrtc compile for {arch}"),
                    format!("{e:?}:\n{log}"),
                ))
            }
        };
        result::destroy_program(program).map_err(|e| fail("destroy", e))?;
        outcome
    }
}

/// NVRTC's options for `arch`: IEEE arithmetic as the interpreter computes
/// it, no a*b+c contracted to FMA.
fn options(arch: &str) -> [String; 2] {
    [format!("--gpu-architecture={arch}"), "--fmad=false".into()]
}

/// The version of the NVRTC loaded, if it is.
fn version() -> Option<(i32, i32)> {
    if !available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); both are valid out-pointers.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor).result().ok()? };
    Some((major, minor))
}

/// The key `compile_all_in` keeps `source`'s CUBIN for `arch` under: of
/// the source, the architecture, NVRTC's options and its version (`None`
/// without NVRTC).
pub fn cache_key(source: &str, arch: &str) -> Option<[u8; 32]> {
    version().map(|nvrtc| cubin_cache::key(source, arch, &options(arch), nvrtc))
}

/// The most NVRTC compiles at once: each holds a compiler's memory.
const COMPILE_THREADS: usize = 16;

/// Compiles each of `sources` for `arch`, or reads its CUBIN kept on disk
/// by an earlier compile (`cubin_cache`, in its folder). The results are
/// in the order of `sources`.
pub fn compile_all(sources: &[&str], arch: &str) -> Vec<Result<Vec<u8>, Error>> {
    compile_all_in(sources, arch, cubin_cache::folder().as_deref())
}

/// `compile_all` with the CUBINs kept in `cache`, or none kept where it is
/// `None`: those kept are read, the others compiled and kept.
pub fn compile_all_in(
    sources: &[&str],
    arch: &str,
    cache: Option<&Path>,
) -> Vec<Result<Vec<u8>, Error>> {
    // Without NVRTC nothing is read either: its version is part of the key.
    let Some((cache, nvrtc)) = cache.zip(version()) else {
        return compile_each(sources, arch);
    };
    let options = options(arch);
    let keys: Vec<[u8; 32]> = (sources.iter())
        .map(|s| cubin_cache::key(s, arch, &options, nvrtc))
        .collect();
    let mut results: Vec<Option<Result<Vec<u8>, Error>>> = (keys.iter())
        .map(|k| cubin_cache::read(cache, k).map(Ok))
        .collect();
    let missing: Vec<usize> = (0..sources.len())
        .filter(|&i| results[i].is_none())
        .collect();
    let compiled = compile_each(
        &missing.iter().map(|&i| sources[i]).collect::<Vec<_>>(),
        arch,
    );
    for (i, result) in missing.into_iter().zip(compiled) {
        if let Ok(cubin) = &result {
            cubin_cache::write(cache, &keys[i], cubin);
        }
        results[i] = Some(result);
    }
    // Every index was read or compiled above.
    (results.into_iter())
        .map(|r| {
            r.unwrap_or_else(|| Err(crate::cuda("nvrtc", "a kernel neither read nor compiled")))
        })
        .collect()
}

/// Compiles each of `sources` for `arch`, on as many threads as the
/// machine runs at once, at most `COMPILE_THREADS` (NVRTC compiles programs
/// concurrently), so that a graph's kernels compile side by side rather
/// than one after another (`benches/RESULTS-cuda.md`). The results are in
/// the order of `sources`.
fn compile_each(sources: &[&str], arch: &str) -> Vec<Result<Vec<u8>, Error>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(COMPILE_THREADS)
        .min(sources.len());
    if threads <= 1 {
        return sources.iter().map(|s| compile(s, arch)).collect();
    }
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<Result<Vec<u8>, Error>>> = sources.iter().map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(source) = sources.get(i) else {
                            return done;
                        };
                        done.push((i, compile(source, arch)));
                    }
                })
            })
            .collect();
        for worker in workers {
            let done = worker
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            for (i, result) in done {
                results[i] = Some(result);
            }
        }
    });
    // Every index was taken by a worker that returned.
    results.into_iter().flatten().collect()
}

/// The CUBIN of a compiled program.
///
/// # Safety
/// `program` must be a live, successfully compiled NVRTC program.
unsafe fn cubin(program: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: the caller's promise; `size` is a valid out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(program, &mut size).result()? };
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` holds the `size` bytes NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(program, bytes.as_mut_ptr().cast()).result()? };
    Ok(bytes)
}
