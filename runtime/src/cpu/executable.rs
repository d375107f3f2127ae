//! A fused graph compiled for the CPU: its kernels in schedule order, run
//! over an arena sized by the memory plan, row group by row group.

use std::fmt::Write as _;
use std::io::Write as _;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_ir::pass::Optimized;
use kiln_ir::{Data, DataRef, Op, TensorType};

use super::cache::compile;
use super::jit::{self, Buffer, CompiledKernel, Computed, PackedOperand};
use crate::BackendOptions;
use crate::backend::{Place, Places};
use crate::bind::{Bindings, Bound};
use crate::{Error, check_data_run};

/// A fused graph compiled for the CPU: its kernels, and an arena sized by
/// the memory plan, reused by every run.
pub(crate) struct Executable {
    optimized: Optimized,
    kernels: Vec<Arc<CompiledKernel>>,
    /// Runs of launches that go row block by row block (`rows::row_groups`).
    groups: Vec<Range<usize>>,
    arena: Vec<Vec<u64>>,
    outputs: Vec<TensorType>,
    places: Places,
    /// Which buffer each launch reads and writes.
    bindings: Bindings,
    /// For each launch, where its computed operands go.
    shares: Vec<[Share; 2]>,
    /// The buffers of computed operands kept from one launch to another.
    kept: Vec<Vec<u64>>,
    /// For each launch, its right operand packed from a constant input
    /// (`constant`), shared by the launches that read the same matrix of
    /// it (an LSTM's steps, its recurrent weight).
    packed: Vec<Option<Arc<PackedOperand>>>,
    /// The time each group took over the runs, where asked for.
    profile: Option<Profile>,
}

/// The runs of an executable and the time each launch group took over them
/// (`BackendOptions::dump_profile`), printed when the executable is dropped.
struct Profile {
    runs: u64,
    groups: Vec<Duration>,
    /// Each launch as the profile names it.
    labels: Vec<String>,
}

/// Where a launch's computed operand goes (`jit::Computed`), a kept one by
/// its index in `Executable::kept`.
#[derive(Clone, Copy)]
enum Share {
    Scratch,
    Keep(usize),
    Kept(usize),
}

impl Executable {
    /// Compiles every kernel of `optimized` (or takes it from the cache);
    /// `options.dump_code` prints the Cranelift IR of each kernel compiled,
    /// `options.dump_profile` times its launches.
    pub(crate) fn new(optimized: Optimized, options: BackendOptions) -> Result<Executable, Error> {
        let mut kernels = Vec::with_capacity(optimized.schedule.launches.len());
        let mut labels = Vec::new();
        let number = options.dump_profile.then(|| optimized.graph.numbering());
        for (k, launch) in optimized.schedule.launches.iter().enumerate() {
            let Op::Kernel(kernel) = &optimized.graph.node(launch.node).op else {
                return Err(crate::launch(
                    optimized.graph.name.as_str(),
                    format!("launch {k} is not a kernel"),
                ));
            };
            kernels.push(compile(kernel, &format!("@k{k}"), options.dump_code)?);
            if let Some(number) = &number {
                let at = number[launch.node.index()];
                labels.push(format!("@k{k} %{at} {}", crate::label(kernel)));
            }
        }
        // Graph outputs are written straight into the caller's buffers: a
        // slot that only they use needs no memory here, unless a kernel
        // works in it.
        let bindings = Bindings::new(&optimized);
        let mut used = bindings.used.clone();
        for s in optimized.schedule.launches.iter().filter_map(|l| l.scratch) {
            used[s] = true;
        }
        let arena = (optimized.schedule.slots.iter())
            .zip(&used)
            .enumerate()
            .map(|(s, (&bytes, &used))| {
                let words = if used { bytes.div_ceil(8) } else { 0 };
                kiln_ir::try_vec(words, 0u64).map_err(|e| {
                    let what = format_args!("intermediate buffer {s}");
                    e.in_op(optimized.graph.name.as_str(), what).into()
                })
            })
            .collect::<Result<_, Error>>()?;
        let mut kept = Vec::new();
        let shares = shared_operands(&optimized, &kernels, &mut kept)?;
        let outputs = optimized.graph.output_types();
        let groups = crate::rows::row_groups(&optimized.graph, &optimized.schedule);
        let profile = options.dump_profile.then(|| Profile {
            runs: 0,
            groups: vec![Duration::ZERO; groups.len()],
            labels,
        });
        Ok(Executable {
            packed: vec![None; kernels.len()],
            profile,
            places: Places::new(&optimized),
            bindings,
            shares,
            kept,
            optimized,
            kernels,
            groups,
            arena,
            outputs,
        })
    }
}

impl crate::Executable for Executable {
    fn optimized(&self) -> &Optimized {
        &self.optimized
    }

    fn output_types(&self) -> &[TensorType] {
        &self.outputs
    }

    /// With outputs reused, a run allocates no tensor memory. A donated
    /// buffer is both the input a kernel reads and the output it writes:
    /// `pass::donate` guarantees each element is read before it is
    /// overwritten and never after.
    ///
    /// The launches run on the caller, which takes part in each kernel's
    /// parallel loop (`team`).
    fn run_donated(
        &mut self,
        donated: &mut [&mut Data],
        inputs: &[DataRef<'_>],
        outputs: &mut [&mut Data],
    ) -> Result<(), Error> {
        check_data_run(&self.optimized, &self.outputs, donated, inputs, outputs)?;
        self.launch(donated, inputs, outputs)
    }

    /// Packs the right operand of every product that reads `value` as it
    /// is for each batch, once for the launches that read the same matrix.
    fn constant(&mut self, input: usize, value: &Arc<Data>) -> Result<(), Error> {
        let mut done: Vec<(_, Option<Arc<PackedOperand>>)> = Vec::new();
        for (l, (binding, kernel)) in self.bindings.launches.iter().zip(&self.kernels).enumerate() {
            let reads = binding.args.iter().enumerate();
            let Some(key) = reads
                .filter(|&(_, &arg)| arg == Bound::Input(input as u32))
                .find_map(|(k, _)| kernel.constant_b(k))
            else {
                continue;
            };
            self.packed[l] = match done.iter().find(|(k, _)| *k == key) {
                Some((_, packed)) => packed.clone(),
                None => {
                    let packed = kernel.pack_b(value)?.map(Arc::new);
                    done.push((key, packed.clone()));
                    packed
                }
            };
        }
        Ok(())
    }
}

impl Executable {
    /// Every launch of the schedule over the arena and the run's buffers,
    /// checked by `check_run`.
    fn launch(
        &mut self,
        donated: &mut [&mut Data],
        inputs: &[DataRef<'_>],
        outputs: &mut [&mut Data],
    ) -> Result<(), Error> {
        let schedule = &self.optimized.schedule;
        // Every buffer of the run, by graph input and graph output.
        let given: Vec<Buffer> = donated.iter_mut().map(|d| Buffer::output(d)).collect();
        let input_at: Vec<Buffer> = (self.places.inputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => given[j].alias(),
                Place::Own(m) => Buffer::input(inputs[m]),
            })
            .collect();
        let own: Vec<Buffer> = outputs.iter_mut().map(|d| Buffer::output(d)).collect();
        let output_at: Vec<Buffer> = (self.places.outputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => given[j].alias(),
                Place::Own(m) => own[m].alias(),
            })
            .collect();
        if let Some(profile) = &mut self.profile {
            profile.runs += 1;
        }
        for (g, group) in self.groups.iter().enumerate() {
            let started = self.profile.as_ref().map(|_| Instant::now());
            let mut bound = Vec::with_capacity(group.len());
            for ((((launch, binding), kernel), shares), packed) in schedule.launches[group.clone()]
                .iter()
                .zip(&self.bindings.launches[group.clone()])
                .zip(&self.kernels[group.clone()])
                .zip(&self.shares[group.clone()])
                .zip(&self.packed[group.clone()])
            {
                let arena = &mut self.arena;
                let args: Vec<Buffer> = (binding.args.iter())
                    .map(|&b| buffer(b, &input_at, &output_at, arena))
                    .collect();
                let mut out = buffer(binding.out, &input_at, &output_at, arena);
                let mut side: Vec<Buffer> = (binding.side.iter())
                    .map(|&b| buffer(b, &input_at, &output_at, arena))
                    .collect();
                let mut scratch = match launch.scratch {
                    Some(s) => Buffer::slot(&mut arena[s]),
                    None => Buffer::empty(),
                };
                let refs: Vec<&Buffer> = args.iter().collect();
                if group.len() == 1 {
                    let computed = shares.map(|share| match share {
                        Share::Scratch => Computed::Scratch,
                        Share::Keep(k) => Computed::Keep(Buffer::slot(&mut self.kept[k])),
                        Share::Kept(k) => Computed::Kept(Buffer::slot(&mut self.kept[k])),
                    });
                    let operands = (&computed, packed.as_deref());
                    kernel.run_computed(&refs, &mut out, &mut side, &mut scratch, operands)?;
                } else {
                    bound.push(kernel.bind(&refs, &mut out, &mut side, &mut scratch)?);
                }
            }
            jit::run_rows(&bound)?;
            if let (Some(profile), Some(started)) = (&mut self.profile, started) {
                profile.groups[g] += started.elapsed();
            }
        }
        // Outputs that are inputs, or that repeat an earlier output, are
        // copies.
        let places = &self.places;
        for &(k, from) in &self.bindings.copies {
            let value = match from {
                Bound::Input(i) => match places.inputs[i as usize] {
                    Place::Own(m) => inputs[m].to_data(),
                    Place::Donated(j) => donated[j].clone(),
                },
                Bound::Output(first) => match places.outputs[first] {
                    Place::Own(m) => outputs[m].clone(),
                    Place::Donated(j) => donated[j].clone(),
                },
                Bound::Slot(s) => {
                    return Err(crate::launch(
                        self.optimized.graph.name.as_str(),
                        format!("output {k} copied from slot {s}"),
                    ));
                }
            };
            match places.outputs[k] {
                Place::Own(m) => *outputs[m] = value,
                Place::Donated(j) => *donated[j] = value,
            }
        }
        Ok(())
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        if let Some(profile) = &self.profile
            && profile.runs > 0
        {
            // Not `eprint!`, which panics where stderr is closed: a panic in
            // a drop while unwinding would abort.
            let text = profile.print(&self.optimized.graph.name, &self.groups);
            let _ = std::io::stderr().lock().write_all(text.as_bytes());
        }
    }
}

impl Profile {
    /// Each group's time per run and share, the longest first, its launches
    /// named as `KILN_DUMP=code` names their kernels (`@k3`) and by their
    /// nodes in the graph the executable runs (the last `KILN_DUMP=all`
    /// prints), with their kind and output (`crate::label`).
    fn print(&self, graph: &str, groups: &[Range<usize>]) -> String {
        let total: Duration = self.groups.iter().sum();
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / self.runs as f64;
        let mut out = format!(
            "// kiln: profile @{graph}: {} runs, {:.3} ms of launches per run\n",
            self.runs,
            ms(total)
        );
        let mut order: Vec<usize> = (0..groups.len()).collect();
        order.sort_by_key(|&g| std::cmp::Reverse(self.groups[g]));
        for g in order {
            let share = 100.0 * self.groups[g].as_secs_f64() / total.as_secs_f64().max(1e-12);
            let _ = writeln!(
                out,
                "//   {share:5.1}% {:9.3} ms  {}",
                ms(self.groups[g]),
                self.labels[groups[g].clone()].join(", ")
            );
        }
        out
    }
}

/// The buffer `bound` names in a run: the caller's input or output, or a
/// slot of the arena.
fn buffer(
    bound: Bound,
    input_at: &[Buffer],
    output_at: &[Buffer],
    arena: &mut [Vec<u64>],
) -> Buffer {
    match bound {
        Bound::Input(i) => input_at[i as usize].alias(),
        Bound::Output(k) => output_at[k].alias(),
        Bound::Slot(s) => Buffer::slot(&mut arena[s]),
    }
}

/// Where each launch's computed operands go, with the buffers kept for
/// them pushed onto `kept`: one the same as an earlier
/// launch's (`CompiledKernel::computed`: the same block over the same
/// values, written in the same shape) is not computed again but read from a
/// buffer the earlier launch computed it into and the executable keeps.
/// The training step's normalized images, the first layer's operand and,
/// transposed, its weight gradient's, are computed once. The values read
/// stay as they are in between: a graph value is written once, and
/// `pass::donate` writes over an input only where nothing reads it after.
/// A matmul launch always runs alone (`rows::row_groups` groups only
/// reductions), through `run_computed`. A launch that keeps or reads a
/// kept operand still has its scratch for it; the kept buffers are
/// outside the arena's plan.
fn shared_operands(
    optimized: &Optimized,
    kernels: &[Arc<CompiledKernel>],
    kept: &mut Vec<Vec<u64>>,
) -> Result<Vec<[Share; 2]>, Error> {
    let mut shares = vec![[Share::Scratch; 2]; kernels.len()];
    let mut first = Vec::new();
    for (l, (launch, kernel)) in optimized.schedule.launches.iter().zip(kernels).enumerate() {
        let nodes = &optimized.graph.node(launch.node).inputs;
        for (side, key) in kernel.computed(nodes).into_iter().enumerate() {
            let Some(key) = key else { continue };
            let Some(i) = first.iter().position(|(k, _)| *k == key) else {
                first.push((key, (l, side)));
                continue;
            };
            let (at, at_side) = first[i].1;
            let k = match shares[at][at_side] {
                Share::Keep(k) => k,
                _ => {
                    let words = first[i].0.1.numel().div_ceil(2);
                    let name = optimized.graph.name.as_str();
                    kept.push(
                        kiln_ir::try_vec(words, 0u64)
                            .map_err(|e| Error::from(e.in_op(name, "a kept operand")))?,
                    );
                    shares[at][at_side] = Share::Keep(kept.len() - 1);
                    kept.len() - 1
                }
            };
            shares[l][side] = Share::Kept(k);
        }
    }
    Ok(shares)
}

#[cfg(test)]
mod tests {
    use kiln_ir::pass::{Options, optimize};
    use kiln_ir::{BinaryOp, DType, Graph, ReduceOp, Shape, UnaryOp};

    use super::*;
    use crate::Executable as _;

    #[test]
    fn a_constant_right_operand_is_packed_and_another_buffer_read_where_it_lies() {
        // x [3, 20] @ w [20, 40]: w given as a constant, then another w.
        let mut g = Graph::new("g");
        let x = g.input(TensorType::new(DType::F32, Shape::new(&[3, 20])));
        let w = g.input(TensorType::new(DType::F32, Shape::new(&[20, 40])));
        let y = g.push(Op::MatMul, &[x, w]).unwrap();
        g.outputs.push(y);
        let optimized = optimize(&g, Options::default(), &mut |_, _| {}).unwrap();
        let mut exec = Executable::new(optimized, BackendOptions::default()).unwrap();
        let values = |len: usize, seed: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7 + seed) % 11) as f32 - 5.0)
                .collect()
        };
        let (xs, ws, others) = (values(60, 1), values(800, 2), values(800, 3));
        exec.constant(1, &Arc::new(Data::F32(ws.clone()))).unwrap();
        let packs = crate::cpu_isa().unwrap() != kiln_machine::Isa::Generic;
        assert_eq!(exec.packed[0].is_some(), packs, "packed");
        for w in [&ws, &others] {
            let mut out = [Data::zeros(DType::F32, 120).unwrap()];
            let mut outs: Vec<&mut Data> = out.iter_mut().collect();
            let inputs = [DataRef::F32(&xs), DataRef::F32(w)];
            exec.run_donated(&mut [], &inputs, &mut outs).unwrap();
            let Data::F32(got) = &out[0] else {
                panic!("an f32 output")
            };
            for (i, &v) in got.iter().enumerate() {
                let (r, c) = (i / 40, i % 40);
                let want: f32 = (0..20).map(|l| xs[r * 20 + l] * w[l * 40 + c]).sum();
                assert_eq!(v, want, "element {i}");
            }
        }
    }

    #[test]
    fn a_profile_lists_its_groups_longest_first_with_their_shares() {
        let ms = Duration::from_millis;
        let profile = Profile {
            runs: 2,
            groups: vec![ms(2), ms(6)],
            labels: [
                "@k0 %3 sum kernel",
                "@k1 %5 elementwise kernel",
                "@k2 %9 matmul kernel",
            ]
            .map(String::from)
            .to_vec(),
        };
        let text = profile.print("g", &[0..1, 1..3]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "// kiln: profile @g: 2 runs, 4.000 ms of launches per run",
                "//    75.0%     3.000 ms  @k1 %5 elementwise kernel, @k2 %9 matmul kernel",
                "//    25.0%     1.000 ms  @k0 %3 sum kernel",
            ]
        );
    }

    #[test]
    fn a_profiled_executable_times_every_group_of_every_run() {
        // exp(x), kept, and the column sums of exp(x) + x: two launches.
        let mut g = Graph::new("g");
        let x = g.input(TensorType::new(DType::F32, Shape::new(&[64, 300])));
        let e = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
        let r = g.push(Op::Binary(BinaryOp::Add), &[e, x]).unwrap();
        let s = g
            .push(
                Op::Reduce {
                    op: ReduceOp::Sum,
                    axes: [0].into_iter().collect(),
                },
                &[r],
            )
            .unwrap();
        g.outputs.extend([e, s]);
        let optimized = optimize(&g, Options::default(), &mut |_, _| {}).unwrap();
        let options = BackendOptions {
            dump_profile: true,
            ..BackendOptions::default()
        };
        let mut exec = Executable::new(optimized, options).unwrap();
        let input = vec![0.5f32; 64 * 300];
        let mut outputs = [
            Data::zeros(DType::F32, 64 * 300).unwrap(),
            Data::zeros(DType::F32, 300).unwrap(),
        ];
        for _ in 0..3 {
            let mut outs: Vec<&mut Data> = outputs.iter_mut().collect();
            exec.run_donated(&mut [], &[DataRef::F32(&input)], &mut outs)
                .unwrap();
        }
        let profile = exec.profile.as_ref().expect("profiled");
        assert_eq!(profile.runs, 3);
        assert_eq!(profile.labels.len(), exec.optimized.schedule.launches.len());
        assert!(
            profile.groups.iter().all(|d| !d.is_zero()),
            "{:?}",
            profile.groups
        );
        let text = profile.print("g", &exec.groups);
        assert_eq!(text.lines().count(), 1 + exec.groups.len(), "{text}");
    }
}
