//! The runs of a fused graph compiled for one GPU (`Executable`): on
//! storage (`run_stored`: values that live on the device read where they
//! are, host inputs copied in, every launch enqueued and nothing waited
//! for), on host data (`run_donated`: copied in and out), or timed
//! (`launch_all`). Batches copied in while the runs before them compute
//! come through a `Feeder`, as storage.

use kiln_ir::pass::Optimized;
use kiln_ir::{Data, DataRef, TensorType};

use super::executable::{Executable, launch_count};
use super::memory::{Buffer, Resident, fill, host_bytes};
use crate::backend::Place;
use crate::storage::{Arg, Storage};
use crate::{Error, check, check_data_run, check_run};

impl crate::Executable for Executable {
    fn optimized(&self) -> &Optimized {
        &self.optimized
    }

    fn launches(&self) -> usize {
        launch_count(&self.steps)
    }

    fn output_types(&self) -> &[TensorType] {
        &self.outputs
    }

    /// Copies the inputs (donated or not) to the device, runs every launch
    /// on the device's stream, and copies the outputs back, each donated
    /// one into its input.
    fn run_donated(
        &mut self,
        donated: &mut [&mut Data],
        inputs: &[DataRef<'_>],
        outputs: &mut [&mut Data],
    ) -> Result<(), Error> {
        check_data_run(&self.optimized, &self.outputs, donated, inputs, outputs)?;
        let given: Vec<DataRef<'_>> = (self.places.inputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => DataRef::from(&*donated[j]),
                Place::Own(m) => inputs[m],
            })
            .collect();
        self.upload(&given)?;
        self.enqueue_host()?;
        self.download(donated, outputs)
    }

    /// Runs every launch on the device's storage, waiting for nothing:
    /// host inputs are copied in (into buffers that go back to the pool,
    /// in the stream's order, after the run), device values are read where
    /// they are, and each output is written into device memory of its own
    /// (`outputs[m]`, replaced by new memory where another holder shares
    /// it) or over its donated input (`donated[j]`, copied on the device
    /// first where another holder shares it).
    fn run_stored(
        &mut self,
        donated: &mut [Storage],
        inputs: &[Arg<'_>],
        outputs: &mut [Storage],
    ) -> Result<(), Error> {
        let name = &self.optimized.graph.name;
        let size = |s: &Storage| (s.dtype(), s.len());
        let given = inputs.iter().map(|a| (a.dtype(), a.len()));
        let (donated_sizes, output_sizes) = (donated.iter().map(size), outputs.iter().map(size));
        check_run(
            &self.optimized,
            &self.outputs,
            donated_sizes,
            given,
            output_sizes,
        )?;
        self.gpu.bind()?;
        for (j, storage) in donated.iter_mut().enumerate() {
            let ty = &self.optimized.graph.inputs[self.optimized.schedule.donated[j].0 as usize];
            self.own(storage, ty, name, true)?;
        }
        let own_outputs: Vec<&TensorType> = (self.places.outputs.iter())
            .zip(&self.outputs)
            .filter(|(p, _)| matches!(p, Place::Own(_)))
            .map(|(_, t)| t)
            .collect();
        for (storage, ty) in outputs.iter_mut().zip(own_outputs) {
            self.own(storage, ty, name, false)?;
        }
        // Host inputs, and values of another device, copied in.
        let mut copied: Vec<Buffer> = Vec::new();
        for arg in inputs {
            copied.extend(self.copied_in(arg, name)?);
        }
        let mut copied = copied.iter();
        let mut given: Vec<&Buffer> = Vec::with_capacity(inputs.len());
        for arg in inputs {
            given.push(match arg {
                Arg::Stored(Storage::Cuda(v)) if v.ordinal() == self.gpu.ordinal => &v.buffer,
                _ => copied.next().ok_or_else(|| {
                    crate::launch("a run on the GPU", "an input lost on its way in")
                })?,
            });
        }
        let donated: Vec<&Buffer> = donated.iter().map(resident).collect::<Result<_, _>>()?;
        let own: Vec<&Buffer> = outputs.iter().map(resident).collect::<Result<_, _>>()?;
        let input_at: Vec<&Buffer> = (self.places.inputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => donated[j],
                Place::Own(m) => given[m],
            })
            .collect();
        let output_at: Vec<&Buffer> = (self.places.outputs.iter())
            .map(|place| match *place {
                Place::Donated(j) => donated[j],
                Place::Own(m) => own[m],
            })
            .collect();
        self.enqueue(&input_at, &output_at, true)
    }

    fn device_time(&mut self) -> Result<Option<f64>, Error> {
        self.launch_all().map(Some)
    }
}

/// The device buffers of runs on host data: one per graph input, one per
/// graph output (empty for a donated output, which is written into its
/// input's buffer).
pub(super) struct HostBuffers {
    inputs: Vec<Buffer>,
    outputs: Vec<Buffer>,
}

/// Where a run on host data leaves the output at `place`: in its donated
/// input, or in an output of its own.
fn output<'a>(
    place: Place,
    donated: &'a mut [&mut Data],
    outputs: &'a mut [&mut Data],
) -> &'a mut Data {
    match place {
        Place::Donated(j) => &mut *donated[j],
        Place::Own(m) => &mut *outputs[m],
    }
}

/// The device buffer of storage made this GPU's own (`Executable::own`).
fn resident(storage: &Storage) -> Result<&Buffer, Error> {
    match storage {
        Storage::Cuda(v) => Ok(&v.buffer),
        Storage::Host(_) => Err(crate::launch(
            "a run on the GPU",
            "a host value among device outputs",
        )),
    }
}

impl Executable {
    /// The device buffers of runs on host data, made at the first.
    fn host_buffers(&mut self) -> Result<&mut HostBuffers, Error> {
        if self.host.is_none() {
            let bytes = |t: &TensorType| t.shape.numel() * t.dtype.size();
            let inputs = (self.optimized.graph.inputs.iter())
                .map(|t| self.gpu.alloc(bytes(t)))
                .collect::<Result<_, Error>>()?;
            // A donated output is written into its input's buffer.
            let outputs = (self.places.outputs.iter().zip(&self.outputs))
                .map(|(place, t)| match place {
                    Place::Own(_) => self.gpu.alloc(bytes(t)),
                    Place::Donated(_) => self.gpu.alloc(0),
                })
                .collect::<Result<_, Error>>()?;
            self.host = Some(HostBuffers { inputs, outputs });
        }
        self.host
            .as_mut()
            .ok_or_else(|| crate::cuda("a run on the GPU", "no host run buffers"))
    }

    /// The buffers of runs on host data, by graph input and by graph
    /// output (a donated output's is its input's).
    fn host_run(&self) -> Result<(Vec<&Buffer>, Vec<&Buffer>), Error> {
        let host = (self.host.as_ref()).ok_or_else(|| {
            crate::launch("a run on the GPU", "a run on host data before any input")
        })?;
        let inputs: Vec<&Buffer> = host.inputs.iter().collect();
        let donated = &self.optimized.schedule.donated;
        let outputs: Vec<&Buffer> = (self.places.outputs.iter().zip(&host.outputs))
            .map(|(place, own)| match *place {
                Place::Donated(j) => &host.inputs[donated[j].0 as usize],
                Place::Own(_) => own,
            })
            .collect();
        Ok((inputs, outputs))
    }

    /// Enqueues every launch on the buffers of runs on host data.
    fn enqueue_host(&self) -> Result<(), Error> {
        let (inputs, outputs) = self.host_run()?;
        self.enqueue(&inputs, &outputs, false)
    }

    /// Makes `storage` device memory of this GPU for a value of `ty` that
    /// no one else holds: new memory where it is not, holding a copy of
    /// the value where `keep` asks for it (a donated input).
    fn own(
        &self,
        storage: &mut Storage,
        ty: &TensorType,
        op: &str,
        keep: bool,
    ) -> Result<(), Error> {
        let mine = match storage {
            Storage::Cuda(v) => {
                v.ordinal() == self.gpu.ordinal && std::sync::Arc::get_mut(v).is_some()
            }
            Storage::Host(_) => false,
        };
        if mine {
            return Ok(());
        }
        let value = match (&*storage, keep) {
            (Storage::Cuda(v), true) if v.ordinal() == self.gpu.ordinal => v.duplicate(op)?,
            (_, true) => Resident::upload(&self.gpu, storage.to_host()?.as_ref().into(), ty, op)?,
            (_, false) => Resident::alloc(&self.gpu, op, ty)?,
        };
        *storage = Storage::Cuda(std::sync::Arc::new(value));
        Ok(())
    }

    /// A device buffer holding an argument that is not on this GPU (host
    /// data, or a value of another device copied out), or `None` where it
    /// is.
    fn copied_in(&self, arg: &Arg<'_>, op: &str) -> Result<Option<Buffer>, Error> {
        match arg {
            Arg::Stored(Storage::Cuda(v)) if v.ordinal() == self.gpu.ordinal => Ok(None),
            Arg::Stored(s) => self.gpu.upload(s.to_host()?.as_ref().into(), op).map(Some),
            Arg::Host(d) => self.gpu.upload(*d, op).map(Some),
        }
    }

    /// Copies `inputs` (every graph input, donated or not) into the
    /// device buffers of runs on host data.
    pub fn upload(&mut self, inputs: &[DataRef<'_>]) -> Result<(), Error> {
        let graph = &self.optimized.graph;
        let given = inputs.iter().map(|d| (d.dtype(), d.len()));
        check(&graph.name, "input", &graph.inputs, given)?;
        self.gpu.bind()?;
        for (buffer, data) in self.host_buffers()?.inputs.iter_mut().zip(inputs) {
            buffer.write(&host_bytes(*data))?;
        }
        Ok(())
    }

    /// Runs every launch on the inputs last uploaded, waits for the device,
    /// and returns the device's time from the first launch's start to the
    /// last one's end, in seconds: the work alone, as a benchmark times it.
    pub fn launch_all(&self) -> Result<f64, Error> {
        self.gpu.timed(|| self.enqueue_host())
    }

    /// Copies the outputs of the last run on host data into `donated`
    /// (those written over an input) and `outputs` (the others), of the
    /// output types (checked by the caller).
    fn download(&self, donated: &mut [&mut Data], outputs: &mut [&mut Data]) -> Result<(), Error> {
        self.gpu.bind()?;
        let name = &self.optimized.graph.name;
        let (_, buffers) = self.host_run()?;
        let mut read = Vec::with_capacity(buffers.len());
        for (&place, buffer) in self.places.outputs.iter().zip(buffers) {
            let data = output(place, donated, outputs);
            read.push(buffer.read(data.len() * data.dtype().size(), name)?);
        }
        // The bytes are the run's once the stream has run everything before
        // the copies, and only where it ran without failing.
        self.gpu.wait(name)?;
        for (&place, bytes) in self.places.outputs.iter().zip(read) {
            fill(output(place, donated, outputs), &bytes);
        }
        Ok(())
    }
}
