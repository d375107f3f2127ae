//! Devices: where a tensor's graph is evaluated.

/// The machine that realizes a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The reference interpreter of kiln-ir: slow, exact (f64 accumulation),
    /// and the oracle every other backend is tested against.
    #[default]
    Reference,
}
