//! kiln-machine: the machine kernels of kiln's CPU backend, behind a safe,
//! slice-based API.
//!
//! - `attention`: `softmax(q kᵀ · scale + bias) v` a block of queries at a
//!   time, without its score matrix;
//! - `gemm`: kiln's f32 GEMM, `C = A B` with A and B read through any
//!   strides or tables of offsets, a bias, ReLU and cap applied as it
//!   stores (the AVX-512 and AVX2 cores, or the `gemm` crate), and bf16
//!   products, on AMX or widened to f32 as the f32 cores pack them;
//! - `isa`: the path a process takes (`KILN_CPU_ISA`);
//! - `rows`: the 256-bit row functions that generated code calls (e^x with
//!   its sum, max, sum and scale over a row), and their safe forms;
//! - `taps`: a sum of weighted taps of an input plane at every output
//!   position (a depthwise convolution), in 256-bit vectors;
//! - `team`: the threads that run parallel loops.
//!
//! Every safe function here checks what it is handed (operand offsets
//! against their slices, lengths against dimensions) and returns an
//! `Error` rather than read or write out of bounds. The row functions
//! generated code calls by address are `unsafe extern "C"` fns, each with
//! its contract. `unsafe` is confined to this crate's modules that run
//! machine kernels (`gemm`'s cores, drivers and panels, `rows`' and
//! `taps`' vector loops, `team`'s closure handed to workers by address),
//! each block with its reason.

pub mod attention;
pub mod gemm;
pub mod isa;
pub mod rows;
pub mod taps;
pub mod team;

pub use isa::{ISA_VARIABLE, Isa, isa};

/// What a machine kernel refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `KILN_CPU_ISA` names no path.
    #[error("{ISA_VARIABLE}={value:?} names no GEMM path (one of {})", isa::names(Isa::ALL.into_iter()))]
    UnknownIsa {
        /// The variable's value.
        value: String,
    },
    /// A path this CPU lacks: named by `KILN_CPU_ISA`, or asked for by a
    /// caller.
    #[error(
        "the {isa} path: this CPU lacks it (it runs {})",
        isa::names(Isa::ALL.into_iter().filter(|isa| isa.available()))
    )]
    MissingIsa {
        /// The path it names.
        isa: Isa,
    },
    /// A GEMM operand whose elements do not all lie inside its slice.
    #[error(
        "gemm: operand {operand} ({rows} x {cols}) reads elements {first}..={last} of a slice of {len}"
    )]
    Operand {
        /// `a` or `b`.
        operand: &'static str,
        /// Its rows.
        rows: usize,
        /// Its columns.
        cols: usize,
        /// The first element it reads.
        first: i128,
        /// The last element it reads.
        last: i128,
        /// The slice's length.
        len: usize,
    },
    /// A product too large to pack: its operands padded to whole AMX tiles,
    /// or gathered or widened into plain f32 matrices, hold more than this
    /// machine can address or allocate.
    #[error("gemm: a product of [{m}, {k}] @ [{k}, {n}] is too large to pack")]
    TooLarge {
        /// A's rows.
        m: usize,
        /// The shared dimension.
        k: usize,
        /// B's columns.
        n: usize,
    },
    /// A right operand packed for one path, multiplied on another.
    #[error("gemm: a right operand packed for the {packed} path, multiplied on the {isa} path")]
    PackedFor {
        /// The path it was packed for.
        packed: Isa,
        /// The path asked for.
        isa: Isa,
    },
    /// A right operand too large to pack once for many products: its
    /// panels hold more than this machine can address or allocate.
    #[error("gemm: a right operand of [{k}, {n}] is too large to pack")]
    PackTooLarge {
        /// Its rows.
        k: usize,
        /// Its columns.
        n: usize,
    },
    /// Operands whose inner dimensions differ.
    #[error("gemm: a product of [{m}, {k}] @ [{k_b}, {n}]")]
    Inner {
        /// A's rows.
        m: usize,
        /// A's columns.
        k: usize,
        /// B's rows.
        k_b: usize,
        /// B's columns.
        n: usize,
    },
    /// A sum of a count of taps that `taps::taps` has no code for.
    #[error("taps: {count} taps (it sums {supported:?})")]
    TapCount {
        /// The taps.
        count: usize,
        /// The counts it sums.
        supported: [usize; 3],
    },
    /// Taps whose window over the outputs no memory holds: a stride of 0,
    /// or a staging whose size overflows.
    #[error(
        "taps: {outputs:?} outputs {stride:?} apart, by taps {span:?} apart: no staging holds that"
    )]
    TapWindow {
        /// The output plane's rows and columns.
        outputs: [usize; 2],
        /// Input rows and columns between neighbouring outputs.
        stride: [usize; 2],
        /// Rows and columns between the first tap and the furthest
        /// (`None`: more than a `usize` counts).
        span: [Option<usize>; 2],
    },
    /// A plane whose input or weights lie outside their slice.
    #[error("taps: plane {plane} reads {count} {what} from {first}, in a slice of {len}")]
    TapPlane {
        /// Which plane.
        plane: usize,
        /// `input values` or `weights`.
        what: &'static str,
        /// The first it reads.
        first: usize,
        /// How many it reads from there.
        count: u128,
        /// The slice's length.
        len: usize,
    },
    /// A slice of another length than what it is to hold (for the GEMM's
    /// product and bias, shorter).
    #[error("the {what} holds {len} values, {needs} wanted")]
    Short {
        /// `product`, `bias`, or `destination row`.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The length needed.
        needs: usize,
    },
}
