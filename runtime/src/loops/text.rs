//! Loop kernels as text, for snapshots and reading.

use super::hoist::Version;
use super::{By, LoopKernel, Loops, Vectors};
use crate::nest::{Access, Axis, Nest};

impl std::fmt::Display for LoopKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let buffer = |b: usize| match b == self.inputs {
            true => "out".to_string(),
            false => format!("in{b}"),
        };
        let nest = |f: &mut std::fmt::Formatter<'_>, what: &str, n: &Nest| {
            writeln!(f, "  {what}: {} rows of {:?}", n.rows, n.inner)?;
            n.accesses
                .iter()
                .try_for_each(|a| writeln!(f, "    {}", access(a, &buffer(a.buffer))))
        };
        let lanes = |on: bool| if on { "in lanes" } else { "one at a time" };
        match &self.kind {
            Loops::Map(m) => {
                let of = if m.acc { "epilogue over" } else { "map over" };
                let steps = match m.vectors {
                    Vectors::Four => "four elements a step",
                    Vectors::Scalar => "one element a step",
                    Vectors::PerVersion => "each version in lanes or not",
                };
                let flat = if m.flat { ", one flat loop" } else { "" };
                writeln!(f, "{of} {}, {steps}{flat}", m.space)?;
                nest(f, "loops", &m.nest)?;
                if !m.invariant.is_empty() {
                    writeln!(f, "  once per call: values {:?}", indices(&m.invariant))?;
                }
                // The flat loop's one stretch computes once per range a
                // thread is given; a row's, once per row (the call's values
                // aside).
                let per = if m.flat { "range" } else { "row" };
                for s in &m.stretches {
                    let span = s.span.as_ref().map_or("all".into(), |r| format!("{r:?}"));
                    let own: Vec<usize> = indices(&s.hoisted)
                        .into_iter()
                        .filter(|&i| !m.invariant.get(i).copied().unwrap_or(false))
                        .collect();
                    let clear = match s.reads.iter().any(|a| a.row_fill.is_some()) {
                        true => ", reads unpadded (the fill where a row is padding)",
                        false => "",
                    };
                    writeln!(f, "  stretch {span}{clear}: once per {per} {own:?}")?;
                    version(f, &s.version, 2)?;
                }
                Ok(())
            }
            Loops::Reduce(r) => {
                let axes: Vec<usize> = r.reduction.reduced.iter().map(|a| a.0).collect();
                let output = if r.broadcast { "broadcast" } else { "reduced" };
                writeln!(
                    f,
                    "reduce {:?} along axes {axes:?}: {} rows of {}, output {output}",
                    r.op,
                    r.reduction.rows(),
                    r.reduction.row_len()
                )?;
                // Four rows at once and columns run a row a lane; a row
                // alone, in lanes along it or not.
                let alone = match r.by {
                    By::Rows => "",
                    By::FourRows => ", rows left alone",
                    By::Columns => ", outputs",
                };
                write!(
                    f,
                    "  by {:?}{alone}: prologue {}, epilogue {}",
                    r.by,
                    lanes(r.lanes || r.by == By::Columns),
                    lanes(r.epilogue_lanes)
                )?;
                match r.reused {
                    Some(v) => writeln!(f, ", value {v} read back from out")?,
                    None => writeln!(f)?,
                }
                nest(f, "prologue", &r.pro)?;
                nest(f, "epilogue", &r.epi)?;
                let o = &r.once;
                if !o.prologue.is_empty() {
                    let (p, e) = (indices(&o.prologue), indices(&o.epilogue));
                    writeln!(f, "  once per row: prologue {p:?}, epilogue {e:?}")?;
                }
                if let Some(runs) = &o.runs {
                    writeln!(f, "  by runs, once per run {:?}", indices(&runs.hoisted))?;
                }
                if r.by == By::FourRows {
                    let (p, e) = (indices(&o.four.prologue), indices(&o.four.epilogue));
                    writeln!(f, "  once per four rows: prologue {p:?}, epilogue {e:?}")?;
                }
                Ok(())
            }
            Loops::Scatter(s) => {
                writeln!(
                    f,
                    "scatter-add: {} outer rows of {} picks into {}",
                    s.outer, s.picks, s.len
                )?;
                nest(f, "updates", &s.nest)?;
                if !s.hoisted.is_empty() {
                    let lanes = if s.lanes { ", in lanes" } else { "" };
                    writeln!(f, "  once per pick {:?}{lanes}", indices(&s.hoisted))?;
                }
                Ok(())
            }
        }
    }
}

/// The positions of a set's members.
fn indices(set: &[bool]) -> Vec<usize> {
    (0..set.len()).filter(|&i| set[i]).collect()
}

/// A stretch's versions as text, indented by `depth`.
fn version(f: &mut std::fmt::Formatter<'_>, v: &Version, depth: usize) -> std::fmt::Result {
    let pad = "  ".repeat(depth);
    match v {
        Version::Loop { reads, lanes, .. } => {
            let lanes = if *lanes { "in lanes" } else { "one at a time" };
            writeln!(f, "{pad}loop over reads {reads:?}, {lanes}")
        }
        Version::Branch { cond, taken, other } => {
            writeln!(f, "{pad}if value {cond}:")?;
            version(f, taken, depth + 1)?;
            writeln!(f, "{pad}else:")?;
            version(f, other, depth + 1)
        }
    }
}

/// An access as text: its buffer and offset, the strides over the rows and
/// along the row, and its fill where padded.
fn access(a: &Access, buffer: &str) -> String {
    let strides = |axes: &[Axis]| -> Vec<i64> { axes.iter().map(|x| x.stride).collect() };
    let fill = a
        .fill
        .map(|c| format!(", padded with {c}"))
        .unwrap_or_default();
    format!(
        "{buffer} at {:+}: rows {:?}, along {:?}{fill}",
        a.offset,
        strides(&a.outer),
        strides(&a.inner)
    )
}
