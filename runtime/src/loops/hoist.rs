//! What a row computes once instead of per element, and the versions of a
//! row's loop, for a target that hoists (`Target::hoists`: the CPU, where
//! Cranelift leaves a value in the loop that uses it).
//!
//! - `hoisted`: the values of a block constant along the inner loop,
//!   computed once per row (or once per call, or once for four rows);
//! - `Version`: a stretch of a row as one loop, or as a branch on a
//!   condition computed once per row, to a version of each side that reads
//!   only what its picks need (a concatenation's parts);
//! - `unpadded_middle`: where a row of padded reads is valid for all of
//!   them, for its middle stretch (`super::stretches`).

use std::ops::Range;

use kiln_ir::Scalar;
use kiln_ir::kernel::{Block, Expr};

use super::lanes::vectorizable_hoisted;
use super::live;
use crate::nest::Access;

/// The values of `block` computed once for the rows its reads are placed
/// at, before the inner loop: loads whose access `keep` says is constant
/// there, a gather of `one_row` at a position itself computed once, the
/// accumulator where it is `known`, every op of those and of constants,
/// and the values `given` (computed before). None where the inner loop has
/// no elements (`inner == 0`): a view of an empty space may point anywhere,
/// and the verifier bounds only the reads it makes.
pub(crate) fn hoisted(
    block: &Block,
    accesses: &[Access],
    (inner, one_row): (usize, bool),
    (known, given): (bool, &[bool]),
    keep: impl Fn(&Access) -> bool,
) -> Vec<bool> {
    let mut hoisted: Vec<bool> = Vec::with_capacity(block.values.len());
    if inner == 0 {
        hoisted.resize(block.values.len(), false);
        return hoisted;
    }
    let mut k = 0;
    for (i, v) in block.values.iter().enumerate() {
        let read = v.expr.read().is_some();
        k += usize::from(read);
        let h = given.get(i).copied().unwrap_or(false)
            || match &v.expr {
                Expr::Load { .. } => keep(&accesses[k - 1]),
                Expr::Gather { index, .. } => {
                    one_row && hoisted[*index as usize] && keep(&accesses[k - 1])
                }
                // Constants are immediates where they are used.
                Expr::Const(_) => false,
                Expr::Acc => known,
                expr => expr.operands().iter().all(|&x| {
                    hoisted[x as usize] || matches!(block.values[x as usize].expr, Expr::Const(_))
                }),
            };
        hoisted.push(h);
    }
    hoisted
}

/// The values of an elementwise block that are the same all over its
/// kernel (loads that step along no axis, and every op of those), computed
/// once per call before the row loop: an optimizer's bias correction, a
/// `pow` of the step count, was computed for every row of the update, 2 x
/// 784 calls of `powf` in the training step's first layer. Empty where
/// there are none or the kernel has no elements (`elements`).
pub(crate) fn invariant(block: &Block, accesses: &[Access], elements: bool) -> Vec<bool> {
    if !elements || !accesses.iter().any(fixed) {
        return Vec::new();
    }
    hoisted(block, accesses, (1, true), (false, &[]), fixed)
}

/// An access whose every element is the same one.
fn fixed(a: &Access) -> bool {
    a.fill.is_none() && a.outer.iter().chain(&a.inner).all(|axis| axis.stride == 0)
}

/// A stretch of a row, or of the whole flat loop: its span (`None`: all of
/// it), its reads, the values computed once for it, and its loop.
pub(crate) struct Stretch {
    pub(crate) span: Option<Range<usize>>,
    pub(crate) reads: Vec<Access>,
    pub(crate) hoisted: Vec<bool>,
    pub(crate) version: Version,
}

/// The loop of a stretch: one loop over a block, or a branch on a
/// condition computed once for the stretch.
pub(crate) enum Version {
    /// One loop over `block`, whose reads are `reads` (positions in the
    /// stretch's reads, in the order of its loads; `accesses` are those),
    /// in lanes where `lanes`.
    Loop {
        block: Block,
        reads: Vec<usize>,
        accesses: Vec<Access>,
        lanes: bool,
    },
    /// A branch on value `cond` (hoisted) to the version where it holds and
    /// the one where it does not.
    Branch {
        cond: u32,
        taken: Box<Version>,
        other: Box<Version>,
    },
}

/// Branches a stretch of a row may take on its conditions, in all: enough
/// for a concatenation of 65 parts (an LSTM's 64 steps stacked), 65 loops;
/// past it the rest select element by element, every part read for every
/// element (`benches/RESULTS-cpu.md`).
const UNSWITCHED: usize = 64;

/// The versions of a stretch of `block`: where a `where` picks by a
/// condition computed once, a branch on it to a version of each side that
/// reads only what its picks need, the outermost such `where` first, at
/// most `UNSWITCHED` branches in all (a concatenation of `k` parts takes
/// `k - 1`). Each loop runs in lanes where the stretch allows (`vector`)
/// and its block has them.
pub(crate) fn versions(block: &Block, stretch: &Place, vector: bool) -> Version {
    let mut budget = UNSWITCHED;
    unswitched(
        stretch,
        vector,
        (block.clone(), (0..stretch.reads.len()).collect()),
        &mut budget,
    )
}

/// Where a stretch's versions run: its reads, the output, its hoisted
/// values and the values the kernel stores as side outputs.
pub(crate) struct Place<'a> {
    pub(crate) reads: &'a [Access],
    pub(crate) out: &'a Access,
    pub(crate) hoisted: &'a [bool],
    pub(crate) side: &'a [u32],
}

/// `versions` of a block whose reads are the stretch's at `picked`.
fn unswitched(
    at: &Place,
    vector: bool,
    (block, picked): (Block, Vec<usize>),
    budget: &mut usize,
) -> Version {
    let live = live(&block, at.side.iter().copied());
    let pick = (0..block.values.len())
        .rev()
        .find_map(|i| match block.values[i].expr {
            Expr::Where(c, ..) if live[i] && !at.hoisted[i] && at.hoisted[c as usize] => Some(c),
            _ => None,
        });
    let Some(cond) = pick.filter(|_| *budget > 0) else {
        let accesses: Vec<Access> = picked.iter().map(|&k| at.reads[k].clone()).collect();
        let lanes = vector && vectorizable_hoisted(&block, &accesses, at.out, at.hoisted);
        return Version::Loop {
            block,
            reads: picked,
            accesses,
            lanes,
        };
    };
    *budget -= 1;
    let taken = picking(&block, &picked, (cond, true), at.side);
    let taken = Box::new(unswitched(at, vector, taken, budget));
    let other = picking(&block, &picked, (cond, false), at.side);
    let other = Box::new(unswitched(at, vector, other, budget));
    Version::Branch { cond, taken, other }
}

/// The version of `block` (its reads at positions `picked`) where
/// condition `c` is `taken`: every `where` on it is the operand it picks,
/// and the loads no longer needed are gone (a load is an instruction
/// Cranelift keeps even when its value is unused), with their reads.
fn picking(
    block: &Block,
    picked: &[usize],
    (c, taken): (u32, bool),
    side: &[u32],
) -> (Block, Vec<usize>) {
    let mut block = block.clone();
    for v in block.values.iter_mut() {
        if let Expr::Where(cond, x, y) = v.expr
            && cond == c
        {
            // A cast to its own dtype is the value itself.
            v.expr = Expr::Cast(if taken { x } else { y });
        }
    }
    let kept = constant_dead_reads(&mut block, side);
    let picked = picked
        .iter()
        .zip(kept)
        .filter(|(_, kept)| *kept)
        .map(|(&k, _)| k);
    (block, picked.collect())
}

/// Makes the reads (loads and gathers) that neither `block`'s result nor a
/// side output (the values `side`) needs constants: a load is an
/// instruction Cranelift keeps even when its value is unused. Whether each
/// read, in order, is kept.
pub(crate) fn constant_dead_reads(block: &mut Block, side: &[u32]) -> Vec<bool> {
    let live = live(block, side.iter().copied());
    let mut kept = Vec::new();
    for (v, live) in block.values.iter_mut().zip(live) {
        if v.expr.read().is_some() {
            kept.push(live);
            if !live {
                v.expr = Expr::Const(Scalar::I32(0).cast(v.dtype));
            }
        }
    }
    kept
}

/// For a row loop with padded reads, each padded along its one inner axis
/// at most: the part `lo..hi` of the row where every padded read is inside
/// its valid range along that axis, and the reads as unpadded there (a pad
/// or a window stored before a convolution, whose rows are the padding, a
/// run of the input, the padding); `None` without padded reads, or where no
/// part of the row is valid for all of them.
pub(crate) fn unpadded_middle(reads: &[Access]) -> Option<(usize, usize, Vec<Access>)> {
    let padded: Vec<&Access> = reads.iter().filter(|a| a.fill.is_some()).collect();
    if padded.is_empty() || padded.iter().any(|a| a.inner.len() != 1) {
        return None;
    }
    let lo = padded.iter().map(|a| a.inner[0].lo).max()?;
    let hi = padded.iter().map(|a| a.inner[0].hi).min()?;
    (lo < hi).then(|| {
        let clear = reads
            .iter()
            .map(|a| Access {
                fill: None,
                row_fill: a.fill,
                ..a.clone()
            })
            .collect();
        (lo, hi, clear)
    })
}
