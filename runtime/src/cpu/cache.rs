//! The CPU backend's kernel cache: every kernel compiled in this process,
//! by its structural identity, so that a kernel with the same body, shapes
//! and dtypes is compiled once whichever graph it appears in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use super::jit::CompiledKernel;
use crate::Error;

/// Every kernel compiled in this process, by its structural identity: a
/// kernel with the same body, shapes and dtypes is never compiled twice.
static CACHE: LazyLock<Mutex<HashMap<kiln_ir::kernel::Kernel, Arc<CompiledKernel>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// How many kernels have been compiled (cache misses) in this process.
static COMPILED: AtomicUsize = AtomicUsize::new(0);

/// The number of kernels compiled so far in this process: a cache hit adds
/// nothing.
pub fn compiled_kernels() -> usize {
    COMPILED.load(Ordering::Relaxed)
}

/// Empties the kernel cache, so that the next compile is cold: for
/// benchmarks of compile latency.
pub fn clear_kernel_cache() {
    CACHE.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

pub(crate) fn compile(
    kernel: &kiln_ir::kernel::Kernel,
    name: &str,
    dump: bool,
) -> Result<Arc<CompiledKernel>, Error> {
    // A poisoned cache only means another thread panicked mid-insert; its map is intact.
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = cache.get(kernel) {
        return Ok(k.clone());
    }
    let mut print = |code: &str| eprintln!("// kiln: code {name}\n{code}");
    let compiled = Arc::new(CompiledKernel::new(
        kernel,
        dump.then_some(&mut print as &mut dyn FnMut(&str)),
    )?);
    COMPILED.fetch_add(1, Ordering::Relaxed);
    cache.insert(kernel.clone(), compiled.clone());
    Ok(compiled)
}
