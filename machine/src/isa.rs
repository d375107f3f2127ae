//! The CPU paths kiln's machine kernels take, and how a process picks one:
//! the fastest the CPU runs, unless the environment variable `KILN_CPU_ISA`
//! names another, so that every path is tested and timed on any machine
//! that has it. It is read once per process; a value that names no path,
//! or a path this CPU lacks, is an error from every call that asks for the
//! path, rather than a quiet fallback that would mislabel a benchmark.

use std::sync::OnceLock;

use crate::Error;

/// The environment variable that forces a path.
pub const ISA_VARIABLE: &str = "KILN_CPU_ISA";

/// A path, from the fastest down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// `Avx512`, and kiln's AMX core for products of bf16 operands
    /// (rather than the operands widened to f32).
    Amx,
    /// kiln's AVX-512 GEMM core, and the 256-bit row functions.
    Avx512,
    /// kiln's AVX2+FMA GEMM core, and the 256-bit row functions.
    Avx2,
    /// The `gemm` crate for every product, and every row in the generated
    /// code.
    Generic,
}

impl Isa {
    /// Every path, from the fastest down.
    pub const ALL: [Isa; 4] = [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Generic];

    /// Its name in `KILN_CPU_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Amx => "amx",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Generic => "generic",
        }
    }

    /// Whether this CPU runs it.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        match self {
            Isa::Amx => crate::gemm::bf16_available(),
            Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            Isa::Generic => true,
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Generic
        }
    }

    /// Whether generated code calls the 256-bit row functions (`rows`) on
    /// this path: on kiln's own paths, where the CPU has AVX2 and FMA.
    pub fn row_calls(self) -> bool {
        self != Isa::Generic && crate::rows::available()
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The path this process takes: the fastest this CPU runs, or the one
/// `KILN_CPU_ISA` names.
pub fn isa() -> Result<Isa, Error> {
    static ISA: OnceLock<Result<Isa, Error>> = OnceLock::new();
    ISA.get_or_init(|| choose(std::env::var_os(ISA_VARIABLE).as_deref()))
        .clone()
}

/// The path for a value of `KILN_CPU_ISA` (unset or empty: the fastest).
pub(crate) fn choose(value: Option<&std::ffi::OsStr>) -> Result<Isa, Error> {
    let fastest = || Isa::ALL.into_iter().find(|isa| isa.available());
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(fastest().unwrap_or(Isa::Generic));
    };
    let isa = Isa::ALL
        .into_iter()
        .find(|isa| value == isa.name())
        .ok_or_else(|| Error::UnknownIsa {
            value: value.to_string_lossy().into_owned(),
        })?;
    if !isa.available() {
        return Err(Error::MissingIsa { isa });
    }
    Ok(isa)
}

/// The names of `isas`, comma-separated.
pub(crate) fn names(isas: impl Iterator<Item = Isa>) -> String {
    isas.map(Isa::name).collect::<Vec<_>>().join(", ")
}
