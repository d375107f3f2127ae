//! cuBLASLt matmuls in TF32, or of bf16 operands summed in f32, with its
//! bias and bias+ReLU epilogues, each described once per compiled graph and
//! its algorithm chosen for the alignment of the pointers it really gets.
//!
//! cudarc's `Matmul::matmul` builds the descriptors and asks the heuristic
//! anew at every call, leaves the heuristic's alignment preferences at their
//! default of 256 bytes (so an operand at an offset, `x[:, 1:]`, may get a
//! kernel that assumes an alignment it lacks: `CUBLAS_STATUS_NOT_SUPPORTED`
//! or worse), and unwraps its workspace allocation. This module does the
//! same calls through cudarc's `result` layer without those three faults.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result::{self, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use kiln_ir::DType;

use super::gemm::ColumnMajor;
use crate::Error;
use crate::matmul::Epilogue;

fn fail(what: &str, e: CublasError) -> Error {
    crate::cuda(format!("cuBLASLt {what}"), format!("{e:?}"))
}

/// A cuBLASLt handle and the workspace its products use (one at a time, in
/// the order of the compute stream, where they all run).
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
}

// SAFETY: a cuBLASLt handle may be used from any thread (cuBLASLt keeps no
// thread-local state in it); every product runs on the compute stream
// (enqueued there, or captured and replayed there), so uses of the one
// workspace are ordered.
unsafe impl Send for Lt {}
// SAFETY: as above; the handle is only read after creation.
unsafe impl Sync for Lt {}

impl Lt {
    /// A handle with NVIDIA's recommended workspace: 32 MiB on Hopper and
    /// later, 4 MiB before. Too little device memory is an `Err`.
    pub fn new(stream: &Arc<CudaStream>, major: i32) -> Result<Lt, Error> {
        let bytes = if major >= 9 { 32 << 20 } else { 4 << 20 };
        let workspace = stream.alloc_zeros::<u8>(bytes).map_err(|e| {
            crate::cuda(
                format!("allocating cuBLASLt's {bytes}-byte workspace"),
                format!("{e:?}"),
            )
        })?;
        let handle = result::create_handle().map_err(|e| fail("handle", e))?;
        Ok(Lt { handle, workspace })
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once.
        // A failure here has no one to report to.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

/// The largest power of two, up to 256, that divides `address`: the
/// alignment cuBLASLt's heuristic is told a pointer has.
pub fn alignment(address: u64) -> u32 {
    if address == 0 {
        256
    } else {
        (1u64 << address.trailing_zeros().min(8)) as u32
    }
}

/// A described product, with the algorithm chosen for the alignments of the
/// last pointers it ran on.
pub struct Matmul {
    product: ColumnMajor,
    /// Whether its epilogue adds a bias (`bias` of `run`).
    bias: bool,
    /// Whether it stores bf16: a product split along k then has its
    /// partial sums added in f32 (`choose`).
    narrow: bool,
    desc: sys::cublasLtMatmulDesc_t,
    /// The layouts of `A`, `B` and `C` (also `D`, written in place of `C`).
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    /// The alignments of `A`, `B`, `C` the algorithm was chosen for. The
    /// bias is always a whole buffer (`matmul::plan` takes none at an
    /// offset), 256-byte aligned, so it needs no key here.
    chosen: Mutex<Option<([u32; 3], sys::cublasLtMatmulAlgo_t)>>,
}

// SAFETY: the descriptors are plain host objects that cuBLASLt only reads
// during a call; the one piece of state that changes (the bias pointer in
// `desc` and the algorithm) is written under `chosen`'s lock.
unsafe impl Send for Matmul {}
// SAFETY: as above.
unsafe impl Sync for Matmul {}

impl Matmul {
    /// Describes `product` of `operands` (f32, multiplied on TF32 tensor
    /// cores, or bf16, multiplied exactly), summed in f32 and `stored` as
    /// f32 or rounded to bf16, through cuBLASLt's epilogue for `epilogue`:
    /// a bias epilogue as its own, the product (and a kernel's product) as
    /// it is.
    pub fn new(
        product: ColumnMajor,
        epilogue: &Epilogue,
        [operands, stored]: [DType; 2],
    ) -> Result<Matmul, Error> {
        use sys::cudaDataType_t as T;
        let f32 = T::CUDA_R_32F;
        let type_of = |dtype: DType| match dtype {
            DType::F32 => Ok(f32),
            DType::BF16 => Ok(T::CUDA_R_16BF),
            other => Err(crate::codegen(
                "cuBLASLt",
                format!("no product of {other} values"),
            )),
        };
        let (operand, out) = (type_of(operands)?, type_of(stored)?);
        let compute = match operands {
            DType::F32 => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            _ => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        let types = [operand, operand, out];
        let desc =
            result::create_matmul_desc(compute, f32).map_err(|e| fail("matmul descriptor", e))?;
        // From here on `Drop` releases what exists.
        let mut matmul = Matmul {
            product,
            bias: matches!(epilogue, Epilogue::Bias { bias: Some(_), .. }),
            narrow: stored != DType::F32,
            desc,
            layouts: [std::ptr::null_mut(); 3],
            chosen: Mutex::new(None),
        };
        let p = &product;
        let (a_rows, a_cols) = if p.transa { (p.k, p.m) } else { (p.m, p.k) };
        let (b_rows, b_cols) = if p.transb { (p.n, p.k) } else { (p.k, p.n) };
        let count = i32::try_from(p.batches).map_err(|_| {
            crate::launch("cuBLASLt", format!("no batch of {} products", p.batches))
        })?;
        let layouts = [
            (a_rows, a_cols, p.lda),
            (b_rows, b_cols, p.ldb),
            (p.m, p.n, p.ldc),
        ];
        for (i, (rows, cols, ld)) in layouts.into_iter().enumerate() {
            matmul.layouts[i] =
                result::create_matrix_layout(types[i], rows as u64, cols as u64, ld as i64)
                    .map_err(|e| fail("matrix layout", e))?;
            if p.batches > 1 {
                let stride = p.batch_strides[i] as i64;
                use sys::cublasLtMatrixLayoutAttribute_t as A;
                // SAFETY: the layout was just created; each value has the
                // type cuBLASLt documents for its attribute.
                unsafe {
                    set(
                        result::set_matrix_layout_attribute,
                        matmul.layouts[i],
                        A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        &count,
                    )?;
                    set(
                        result::set_matrix_layout_attribute,
                        matmul.layouts[i],
                        A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        &stride,
                    )?;
                }
            }
        }
        use sys::cublasLtMatmulDescAttributes_t as D;
        // The bias is per row of the column-major result (per column of
        // kiln's row-major product). RELU_BIAS has kiln's semantics: NaN
        // stays NaN, infinities pass, and negatives and -0 become +0
        // (`benches/RESULTS-cuda.md`;
        // `relu_after_a_fused_bias_keeps_nan_and_gives_plus_zero` in
        // `tests/cuda_device.rs` checks it on every GPU run).
        let code = match epilogue {
            Epilogue::Product | Epilogue::Kernel { .. } => {
                sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT
            }
            Epilogue::Bias { relu: false, .. } => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::Bias { relu: true, .. } => {
                sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS
            }
        };
        // SAFETY: the descriptor was just created; each value has the type
        // cuBLASLt documents for its attribute.
        unsafe {
            set(
                result::set_matmul_desc_attribute,
                desc,
                D::CUBLASLT_MATMUL_DESC_TRANSA,
                &i32::from(p.transa),
            )?;
            set(
                result::set_matmul_desc_attribute,
                desc,
                D::CUBLASLT_MATMUL_DESC_TRANSB,
                &i32::from(p.transb),
            )?;
            set(
                result::set_matmul_desc_attribute,
                desc,
                D::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &code,
            )?;
            if p.batches > 1 && matmul.bias {
                // One bias for every batch.
                set(
                    result::set_matmul_desc_attribute,
                    desc,
                    D::CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                    &0i64,
                )?;
            }
        }
        Ok(matmul)
    }

    /// Enqueues `C = epilogue(op(A) op(B))` on `stream` (the compute
    /// stream, or the capture stream for a graph the compute stream runs).
    ///
    /// # Safety
    /// `a`, `b`, `c` (and `bias` with an epilogue, `m` elements) must be
    /// device addresses of this context with every element the product
    /// describes inside a live allocation, `c` not overlapping the others.
    pub unsafe fn run(
        &self,
        (lt, stream): (&Lt, &CudaStream),
        [a, b, c]: [u64; 3],
        bias: Option<u64>,
    ) -> Result<(), Error> {
        let mut chosen = self.chosen.lock().unwrap_or_else(|e| e.into_inner());
        use sys::cublasLtMatmulDescAttributes_t as D;
        if self.bias {
            let bias =
                bias.ok_or_else(|| crate::launch("cuBLASLt", "a bias epilogue with no bias"))?;
            // SAFETY: the descriptor is live; the attribute takes a device pointer.
            unsafe {
                set(
                    result::set_matmul_desc_attribute,
                    self.desc,
                    D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias,
                )?
            };
        }
        let aligned = [alignment(a), alignment(b), alignment(c)];
        let algo = match *chosen {
            Some((was, algo)) if was == aligned => algo,
            _ => {
                let algo = self.choose(lt, aligned)?;
                *chosen = Some((aligned, algo));
                algo
            }
        };
        let (one, zero) = (1.0f32, 0.0f32);
        let (workspace, _record) = lt.workspace.device_ptr(stream);
        // SAFETY: the caller's promise for the pointers; the descriptors are
        // live, the algorithm was chosen for these layouts and alignments,
        // and the workspace is `lt`'s, of the size passed.
        unsafe {
            result::matmul(
                lt.handle,
                self.desc,
                (&one as *const f32).cast(),
                (&zero as *const f32).cast(),
                a as *const _,
                self.layouts[0],
                b as *const _,
                self.layouts[1],
                c as *const _,
                self.layouts[2],
                c as *mut _,
                self.layouts[2],
                &algo,
                workspace as *mut _,
                lt.workspace.len(),
                stream.cu_stream() as _,
            )
        }
        .map_err(|e| fail("matmul", e))
    }

    /// The heuristic's fastest algorithm for pointers of these alignments.
    fn choose(&self, lt: &Lt, aligned: [u32; 3]) -> Result<sys::cublasLtMatmulAlgo_t, Error> {
        let pref = Pref(result::create_matmul_pref().map_err(|e| fail("preference", e))?);
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let workspace = lt.workspace.len() as u64;
        // SAFETY: the preference was just created; each value has the type
        // cuBLASLt documents for its attribute (u64 bytes, u32 alignments,
        // a u32 mask of reduction schemes).
        unsafe {
            set(
                result::set_matmul_pref_attribute,
                pref.0,
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &workspace,
            )?;
            set(
                result::set_matmul_pref_attribute,
                pref.0,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                &aligned[0],
            )?;
            set(
                result::set_matmul_pref_attribute,
                pref.0,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                &aligned[1],
            )?;
            set(
                result::set_matmul_pref_attribute,
                pref.0,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                &aligned[2],
            )?;
            set(
                result::set_matmul_pref_attribute,
                pref.0,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                &aligned[2],
            )?;
            if self.narrow {
                // Split-k partial sums in f32 or not at all: added in the
                // output's bf16 they lose more than the one rounding of
                // the f32 sum that kiln's types promise (a case is in
                // `benches/RESULTS-cuda.md`). PyTorch's
                // `allow_bf16_reduced_precision_reduction` allows it.
                let scheme =
                    sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
                set(
                    result::set_matmul_pref_attribute,
                    pref.0,
                    P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                    &scheme,
                )?;
            }
        }
        let [a, b, c] = self.layouts;
        // SAFETY: every handle is live.
        unsafe { result::get_matmul_algo_heuristic(lt.handle, self.desc, a, b, c, c, pref.0) }
            .map(|h| h.algo)
            .map_err(|e| {
                fail(
                    &format!(
                        "no algorithm for {:?} (bias {}) at alignments {aligned:?}",
                        self.product, self.bias
                    ),
                    e,
                )
            })
    }
}

impl Drop for Matmul {
    fn drop(&mut self) {
        // SAFETY: each handle was created by `new` (or is null, never
        // created) and is destroyed once; failures have no one to report to.
        unsafe {
            for layout in self.layouts {
                if !layout.is_null() {
                    let _ = result::destroy_matrix_layout(layout);
                }
            }
            let _ = result::destroy_matmul_desc(self.desc);
        }
    }
}

/// A heuristic preference, destroyed when dropped.
struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `choose`, destroyed once.
        let _ = unsafe { result::destroy_matmul_pref(self.0) };
    }
}

/// A `result::set_*_attribute` of cuBLASLt: descriptor, layout or preference.
type Setter<H, A> = unsafe fn(H, A, *const c_void, usize) -> Result<(), CublasError>;

/// Sets `attribute` of `handle` to `value` through `setter`.
///
/// # Safety
/// `handle` must be live and `T` the attribute's documented type.
unsafe fn set<H, A: std::fmt::Debug + Copy, T>(
    setter: Setter<H, A>,
    handle: H,
    attribute: A,
    value: &T,
) -> Result<(), Error> {
    // SAFETY: the caller's promise; `value` is valid for its size.
    unsafe {
        setter(
            handle,
            attribute,
            (value as *const T).cast(),
            size_of::<T>(),
        )
    }
    .map_err(|e| fail(&format!("{attribute:?}"), e))
}

#[cfg(test)]
mod tests {
    use super::alignment;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0), 256);
        assert_eq!(alignment(0x7f00_0000_0000), 256);
        assert_eq!(alignment(0x7f00_0000_0104), 4);
        assert_eq!(alignment(0x7f00_0000_0110), 16);
        assert_eq!(alignment(0x7f00_0000_0180), 128);
    }
}
