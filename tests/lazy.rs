//! Laziness: recording ops over [4096, 4096] tensors allocates no
//! tensor-sized memory and computes nothing; realizing does the work.
//!
//! The test counts every heap allocation of its process through a wrapping
//! global allocator, so it lives alone in this binary.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln::{DType, Result, Tensor};

/// Bytes currently allocated, and the high-water mark since the last reset.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator, which
// upholds the GlobalAlloc contract; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's layout is passed through as received.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with this layout in `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The peak number of bytes allocated above the starting level while `f` runs.
fn peak_growth<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = LIVE.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - start)
}

const TENSOR_BYTES: usize = 4096 * 4096 * 4;

#[test]
fn building_a_graph_over_large_tensors_allocates_nothing_tensor_sized() -> Result<()> {
    let (graph, built) = peak_growth(|| -> Result<_> {
        let a = Tensor::zeros([4096, 4096], DType::F32)?;
        let b = Tensor::full([4096, 4096], 0.25f32)?;
        let c = Tensor::ones([4096], DType::F32)?;
        let y = ((&a + &b)?.relu()? * &c)?;
        let z = y.matmul(&b.t()?)?.softmax(-1)?;
        let total = (z.sum_all()? + y.mean_all()?)?;
        Ok((total, y))
    });
    let (total, y) = graph?;
    assert!(
        built < 64 * 1024,
        "recording the graph allocated {built} bytes"
    );
    assert!(
        !total.is_realized() && !y.is_realized(),
        "nothing is computed before realize"
    );

    // Realizing the elementwise part does the work: its buffers appear now.
    let (done, realized) = peak_growth(|| y.realize());
    done?;
    assert!(
        realized >= TENSOR_BYTES,
        "realize allocated only {realized} bytes"
    );
    assert!(y.is_realized() && !total.is_realized());
    assert_eq!(y.sum_all()?.to_scalar::<f32>()?, 0.25 * 4096.0 * 4096.0);
    Ok(())
}
