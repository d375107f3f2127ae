//! `Tensor`: a cheap handle to a node of a lazy graph, and realization.
//!
//! Building a tensor records an op and its operands; nothing is computed.
//! `realize`, `to_vec` and `to_scalar` capture the graph that leads to the
//! requested tensors, evaluate it on a device, and store the results in their
//! nodes, in the device's storage: host memory on the CPU, the GPU's memory
//! on a GPU, where they stay until they are read. A realized node forgets
//! its history, so the intermediate nodes and buffers that only it referred
//! to are freed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use kiln_ir::pass::{Optimized, Options};
use kiln_ir::{DType, Data, Element, Graph, NodeId, Op, Scalar, Shape, TensorType, try_capacity};
use smallvec::SmallVec;

use kiln_runtime::{Arg, Storage};

use crate::backend::{backend, store, with_realized};
use crate::rng::SplitMix64;
use crate::{Device, Error, Result};

/// An n-dimensional array whose value is computed lazily.
///
/// Cloning is cheap: clones share the node, and realizing one realizes all.
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

struct Inner {
    ty: TensorType,
    device: Device,
    state: Mutex<State>,
    /// Its number, for `read_from` sets: unique in the process.
    id: u64,
    /// For a float value computed and then realized (or moved by `to`): the
    /// numbers of the tensors a gradient of it would have reached (through
    /// float values, not through `detach`), those tensors' own such sets
    /// included, sorted; so that `grad` can tell a gradient cut by a read
    /// from a tensor the loss does not depend on.
    read_from: OnceLock<Arc<[u64]>>,
}

/// The next tensor's number.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

enum State {
    /// Not computed yet: `op` applied to `src`.
    Lazy { op: Op, src: SmallVec<[Tensor; 2]> },
    /// Computed, or given as data, where its device keeps it.
    Ready(Storage),
    /// Input `index` of a graph being traced by `kiln::compile`: a value
    /// that each call of the compiled graph supplies.
    Placeholder(usize),
}

impl Drop for Inner {
    /// Frees a long chain of nodes iteratively: the default recursive drop of
    /// a chain built in a loop would overflow the stack. A host buffer this
    /// node was the last to hold goes back to the runtime's pool, for the
    /// next value of its type.
    fn drop(&mut self) {
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let State::Ready(_) = state {
            // The node is going: nothing reads the state left in its place.
            if let State::Ready(storage) = std::mem::replace(state, State::Placeholder(0)) {
                kiln_runtime::storage::recycle(storage);
            }
        }
        let mut pending = take_operands(&mut self.state);
        while let Some(tensor) = pending.pop() {
            // Only the last handle to a node may take its operands; the node
            // then drops here with none left, so nothing recurses.
            if let Ok(mut inner) = Arc::try_unwrap(tensor.0) {
                pending.extend(take_operands(&mut inner.state));
            }
        }
    }
}

fn take_operands(state: &mut Mutex<State>) -> SmallVec<[Tensor; 2]> {
    match state
        .get_mut()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
    {
        State::Lazy { src, .. } => std::mem::take(src),
        State::Ready(_) | State::Placeholder(_) => SmallVec::new(),
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({}, {:?}, realized: {})",
            self.0.ty,
            self.0.device,
            self.is_realized()
        )
    }
}

impl Tensor {
    fn new(ty: TensorType, state: State) -> Tensor {
        Tensor::on(ty, state, Device::default())
    }

    fn on(ty: TensorType, state: State, device: Device) -> Tensor {
        Tensor(Arc::new(Inner {
            ty,
            device,
            state: Mutex::new(state),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            read_from: OnceLock::new(),
        }))
    }

    /// A placeholder for input `index` of a graph traced by `kiln::compile`.
    pub(crate) fn placeholder(ty: TensorType, index: usize) -> Tensor {
        Tensor::new(ty, State::Placeholder(index))
    }

    /// The same value on `device`: computed where it is now (if it is not
    /// yet), then handed over. Host devices share the buffer; a GPU's value
    /// is copied out, and a value is copied in to a GPU once, where it then
    /// stays: ops on it run there and read it there.
    pub fn to(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        backend(device)?;
        let storage = store(device, &self.0.ty, self.storage()?)?;
        let moved = Tensor::on(self.0.ty.clone(), State::Ready(storage), device);
        let _ = moved.0.read_from.set(reached(&[self]));
        Ok(moved)
    }

    /// The node's state. A panic while the lock was held cannot leave the
    /// state half-written (every write is one assignment), so a poisoned lock
    /// is still safe to read.
    fn state(&self) -> MutexGuard<'_, State> {
        self.0
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records `op` applied to `src`, typing it: a mistake in the operands is
    /// an `Err` naming the op and the shapes.
    pub(crate) fn lazy(op: Op, src: &[&Tensor]) -> Result<Tensor> {
        let args: SmallVec<[&TensorType; 3]> = src.iter().map(|t| &t.0.ty).collect();
        let ty = op.infer(&args, &[])?;
        let device = src
            .iter()
            .map(|t| t.device())
            .find(|&d| d != Device::default())
            .unwrap_or_default();
        let src = src.iter().map(|&t| t.clone()).collect();
        Ok(Tensor::on(ty, State::Lazy { op, src }, device))
    }

    // ----- Constructors. -----

    /// A tensor holding `data` in row-major order under `shape`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        let ty = Tensor::filled_by("from_vec", T::DTYPE, data.len(), shape.into())?;
        Ok(Tensor::ready(ty, T::into_data(data)))
    }

    /// The type of `len` values of `dtype` under `shape`, or the `Err` of
    /// `op` where they do not fill it or it is too large.
    fn filled_by(op: &'static str, dtype: DType, len: usize, shape: Shape) -> Result<TensorType> {
        let ty = TensorType::new(dtype, shape).checked(op)?;
        if len != ty.shape.numel() {
            return Err(Error::DataLength {
                op,
                len,
                shape: ty.shape,
            });
        }
        Ok(ty)
    }

    /// A tensor of data already computed, whose length matches `ty`.
    fn ready(ty: TensorType, data: Data) -> Tensor {
        Tensor::new(ty, State::Ready(Storage::Host(Arc::new(data))))
    }

    /// A tensor holding a copy of `data` in row-major order under `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        let ty = Tensor::filled_by("from_slice", T::DTYPE, data.len(), shape.into())?;
        let mut copy = try_capacity(data.len()).map_err(|e| e.in_op("from_slice", &ty))?;
        copy.extend_from_slice(data);
        Ok(Tensor::ready(ty, T::into_data(copy)))
    }

    /// A rank-0 tensor of `value`. Lazy: it is a constant in the graph.
    pub fn scalar(value: impl Into<Scalar>) -> Tensor {
        let value = value.into();
        let ty = TensorType::new(value.dtype(), Shape::scalar());
        Tensor::new(
            ty,
            State::Lazy {
                op: Op::Const(value),
                src: SmallVec::new(),
            },
        )
    }

    /// A tensor of `shape` filled with `value`. Lazy and allocation-free: a
    /// constant broadcast to the shape, so it costs nothing until a kernel
    /// reads it. A shape too large to address is an `Err`.
    pub fn full(shape: impl Into<Shape>, value: impl Into<Scalar>) -> Result<Tensor> {
        Tensor::scalar(value).expand(shape)
    }

    /// A tensor of `shape` filled with zeros of `dtype`.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Tensor::full(shape, Scalar::I32(0).cast(dtype))
    }

    /// A tensor of `shape` filled with ones of `dtype`.
    pub fn ones(shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        Tensor::full(shape, Scalar::I32(1).cast(dtype))
    }

    /// The integers `start, start+1, .., end-1` as i32 (empty when `end <= start`).
    pub fn arange(start: i32, end: i32) -> Tensor {
        let values: Vec<i32> = (start..end).collect();
        Tensor::ready(
            TensorType::new(DType::I32, [values.len()]),
            Data::I32(values),
        )
    }

    /// f32 values drawn uniformly from [0, 1), reproducibly from `seed`.
    pub fn rand(shape: impl Into<Shape>, seed: u64) -> Result<Tensor> {
        Tensor::random("rand", shape.into(), seed, SplitMix64::next_f32)
    }

    /// f32 values drawn from the standard normal distribution, reproducibly from `seed`.
    pub fn randn(shape: impl Into<Shape>, seed: u64) -> Result<Tensor> {
        Tensor::random("randn", shape.into(), seed, |rng| rng.next_normal() as f32)
    }

    fn random(
        op: &'static str,
        shape: Shape,
        seed: u64,
        mut draw: impl FnMut(&mut SplitMix64) -> f32,
    ) -> Result<Tensor> {
        let ty = TensorType::new(DType::F32, shape).checked(op)?;
        let n = ty.shape.numel();
        let mut values = try_capacity(n).map_err(|e| e.in_op(op, &ty))?;
        let mut rng = SplitMix64::new(seed);
        values.extend((0..n).map(|_| draw(&mut rng)));
        Ok(Tensor::ready(ty, Data::F32(values)))
    }

    // ----- Properties. -----

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.0.ty.shape
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.0.ty.shape.dims()
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.ty.shape.rank()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.0.ty.shape.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.ty.dtype
    }

    /// The type: element type and shape.
    pub fn ty(&self) -> &TensorType {
        &self.0.ty
    }

    /// The device that realizes the tensor.
    pub fn device(&self) -> Device {
        self.0.device
    }

    /// Whether the value has been computed (or was given as data).
    pub fn is_realized(&self) -> bool {
        matches!(*self.state(), State::Ready(_))
    }

    // ----- Realization. -----

    /// Computes the tensor's value, if it has not been computed yet.
    pub fn realize(&self) -> Result<()> {
        realize(&[self])
    }

    /// The elements in row-major order. `T` must be the tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let data = self.data("to_vec", T::DTYPE)?;
        // `data` checked the dtype, so the slice is there.
        Ok(T::slice(&data).map(<[T]>::to_vec).unwrap_or_default())
    }

    /// The single element of a tensor that has exactly one.
    pub fn to_scalar<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::NotScalar {
                shape: self.shape().clone(),
            });
        }
        let data = self.data("to_scalar", T::DTYPE)?;
        Ok(T::from_scalar(data.get(0)).unwrap_or_default())
    }

    /// A tensor of computed data of type `ty`.
    pub(crate) fn from_data(ty: TensorType, data: Data) -> Tensor {
        Tensor::ready(ty, data)
    }

    /// A tensor of a value of type `ty` that `device` computed and keeps.
    pub(crate) fn from_storage(ty: TensorType, storage: Storage, device: Device) -> Tensor {
        Tensor::on(ty, State::Ready(storage), device)
    }

    /// The realized data on the host, whatever its dtype.
    pub(crate) fn data_of_any_dtype(&self) -> Result<Arc<Data>> {
        self.data("call", self.dtype())
    }

    /// The realized data on the host (copied out of a GPU), checked to be
    /// of `dtype`.
    fn data(&self, op: &'static str, dtype: DType) -> Result<Arc<Data>> {
        if self.dtype() != dtype {
            return Err(Error::ReadDType {
                op,
                actual: self.dtype(),
                requested: dtype,
            });
        }
        Ok(self.storage()?.to_host()?)
    }

    /// The realized value, where its device keeps it.
    pub(crate) fn storage(&self) -> Result<Storage> {
        self.realize()?;
        match &*self.state() {
            State::Ready(storage) => Ok(storage.clone()),
            State::Placeholder(index) => Err(Error::Placeholder { index: *index }),
            State::Lazy { op, .. } => Err(Error::Ir(kiln_ir::Error::Verify {
                message: format!("{} was not computed by realize", op.name()),
                dump: String::new(),
            })),
        }
    }
}

/// Computes every tensor in `tensors` that is not computed yet, in one graph
/// per device, so that work they share is done once.
pub fn realize(tensors: &[&Tensor]) -> Result<()> {
    let pending: Vec<&Tensor> = tensors
        .iter()
        .copied()
        .filter(|t| !t.is_realized())
        .collect();
    let mut devices: Vec<Device> = Vec::new();
    for t in &pending {
        if !devices.contains(&t.device()) {
            devices.push(t.device());
        }
    }
    for device in devices {
        let group: Vec<&Tensor> = pending
            .iter()
            .copied()
            .filter(|t| t.device() == device)
            .collect();
        if !group.is_empty() {
            realize_on(device, &group)?;
        }
    }
    Ok(())
}

fn realize_on(device: Device, pending: &[&Tensor]) -> Result<()> {
    // A constant is stored as it is, with nothing compiled: a value given
    // to a compiled step as `Tensor::scalar(..)`, call after call, would
    // otherwise compile a kernel for each new value.
    let backend = backend(device)?;
    let mut computed = Vec::with_capacity(pending.len());
    for &t in pending {
        let constant = match &*t.state() {
            State::Lazy {
                op: Op::Const(v), ..
            } => Some(*v),
            _ => None,
        };
        match constant {
            Some(v) => {
                let data =
                    Data::from_fn(v.dtype(), 1, |_| v).map_err(|e| e.in_op("const", &t.0.ty))?;
                let storage = backend.store(&t.0.ty, Arc::new(data))?;
                *t.state() = State::Ready(storage);
                let _ = t.0.read_from.set(reached(&[]));
            }
            None => computed.push(t),
        }
    }
    if computed.is_empty() {
        return Ok(());
    }
    let pending = computed.as_slice();
    let (graph, sources, nodes) = capture_nodes("realize", pending);
    let inputs: Vec<Storage> = sources
        .into_iter()
        .map(|s| match s {
            Source::Data(storage) => Ok(storage),
            Source::Placeholder(index) => Err(Error::Placeholder { index }),
        })
        .collect::<Result<_>>()?;
    let args: Vec<Arg> = inputs.iter().map(Arg::Stored).collect();
    // The results' memory first, so that a result too large for it is an
    // `Err` naming its op before anything is compiled.
    let mut outputs = pending
        .iter()
        .map(|t| {
            let op = match &*t.state() {
                State::Lazy { op, .. } => op.name(),
                State::Ready(_) | State::Placeholder(_) => "realize",
            };
            Ok(backend.alloc(op, &t.0.ty)?)
        })
        .collect::<Result<Vec<Storage>>>()?;
    with_realized(&graph, device, |exec| {
        Ok(exec.run_stored(&mut [], &args, &mut outputs)?)
    })?;
    for (k, (tensor, storage)) in pending.iter().zip(outputs).enumerate() {
        *tensor.state() = State::Ready(storage);
        let inputs = gradient_inputs(&graph, graph.outputs[k]);
        let read: Vec<&Tensor> = inputs.iter().map(|&i| &nodes[i]).collect();
        let _ = tensor.0.read_from.set(reached(&read));
    }
    Ok(())
}

/// The input nodes of `graph` that a gradient of `output` would reach:
/// through float values only (a comparison's or a cast from an integer's
/// result carries none), and not through `detach`.
pub(crate) fn gradient_inputs(graph: &Graph, output: NodeId) -> Vec<usize> {
    let mut seen = vec![false; graph.nodes.len()];
    let mut pending = vec![output];
    let mut inputs = Vec::new();
    while let Some(id) = pending.pop() {
        let node = graph.node(id);
        if std::mem::replace(&mut seen[id.index()], true) || !node.ty.dtype.is_float() {
            continue;
        }
        match node.op {
            Op::Input { .. } => inputs.push(id.index()),
            Op::Unary(kiln_ir::UnaryOp::Detach) => {}
            _ => pending.extend(node.inputs.iter().copied()),
        }
    }
    inputs
}

/// The numbers of `tensors` and of everything their gradients would have
/// reached before they were read, sorted, once each.
fn reached(tensors: &[&Tensor]) -> Arc<[u64]> {
    let mut ids: Vec<u64> = Vec::new();
    for t in tensors {
        ids.push(t.0.id);
        ids.extend(t.0.read_from.get().iter().flat_map(|r| r.iter()));
    }
    ids.sort_unstable();
    ids.dedup();
    ids.into()
}

/// The numbers of the tensors whose gradients the values read among
/// `tensors` have cut: everything those values were computed from.
pub(crate) fn cut_by_reads(tensors: &[&Tensor]) -> std::collections::HashSet<u64> {
    (tensors.iter())
        .flat_map(|t| {
            t.0.read_from
                .get()
                .into_iter()
                .flat_map(|r| r.iter().copied())
        })
        .collect()
}

impl Tensor {
    /// Its number in `read_from` sets.
    pub(crate) fn id(&self) -> u64 {
        self.0.id
    }
}

/// Runs kiln's optimizer on the graph behind `outputs` (as `capture` names
/// it): the fused kernels and their schedule, which `Optimized::schedule`
/// counts and sizes.
pub fn optimize(name: &str, outputs: &[&Tensor], options: Options) -> Result<Optimized> {
    Ok(kiln_ir::pass::optimize(
        &capture(name, outputs),
        options,
        &mut |_, _| {},
    )?)
}

/// Every stage of the optimizer on the graph behind `outputs`, printed as
/// `KILN_DUMP=all` shows it: the captured graph, the graph after each pass
/// with the pass's notes, and the schedule with its memory plan.
pub fn explain(name: &str, outputs: &[&Tensor], options: Options) -> Result<String> {
    let graph = capture(name, outputs);
    let mut text = format!("// kiln: graph\n{graph}");
    kiln_ir::pass::optimize(&graph, options, &mut |stage, print| {
        text.push_str(&format!("\n// kiln: {stage}\n{}", print()));
    })?;
    Ok(text)
}

/// The graph that computes `outputs`, named `name`, without computing
/// anything: what `KILN_DUMP=graph` prints and what snapshot tests record.
/// Tensors that hold data (given or already computed) are its inputs, in the
/// order a depth-first walk from the outputs first meets them.
pub fn capture(name: &str, outputs: &[&Tensor]) -> Graph {
    capture_with_data(name, outputs).0
}

/// Where the value of a captured graph input comes from.
#[derive(Clone)]
pub(crate) enum Source {
    /// The value the tensor holds, where its device keeps it.
    Data(Storage),
    /// Placeholder input `index` of a graph being traced by `kiln::compile`.
    Placeholder(usize),
}

/// `capture`, also returning where each graph input's value comes from.
pub(crate) fn capture_with_data(name: &str, outputs: &[&Tensor]) -> (Graph, Vec<Source>) {
    let (graph, inputs, _) = capture_nodes(name, outputs);
    (graph, inputs)
}

/// `capture_with_data`, also returning the tensor behind every node, by
/// arena index: how `grad` builds the nodes it appends as tensors whose
/// operands are the user's own.
pub(crate) fn capture_nodes(name: &str, outputs: &[&Tensor]) -> (Graph, Vec<Source>, Vec<Tensor>) {
    let mut graph = Graph::new(name);
    let mut inputs = Vec::new();
    let mut nodes = Vec::new();
    let mut ids: HashMap<*const Inner, NodeId> = HashMap::new();
    // Iterative post-order walk: deep graphs (a long chain built in a loop)
    // must not overflow the stack.
    let mut stack: Vec<(Tensor, bool)> =
        outputs.iter().rev().map(|&t| (t.clone(), false)).collect();
    while let Some((tensor, operands_done)) = stack.pop() {
        let key = Arc::as_ptr(&tensor.0);
        if ids.contains_key(&key) {
            continue;
        }
        let id = match &*tensor.state() {
            State::Ready(data) => {
                inputs.push(Source::Data(data.clone()));
                graph.input(tensor.0.ty.clone())
            }
            State::Placeholder(index) => {
                inputs.push(Source::Placeholder(*index));
                graph.input(tensor.0.ty.clone())
            }
            State::Lazy { src, .. } if !operands_done => {
                stack.push((tensor.clone(), true));
                stack.extend(src.iter().rev().map(|t| (t.clone(), false)));
                continue;
            }
            State::Lazy { op, src } => {
                let operands: SmallVec<[NodeId; 2]> =
                    src.iter().map(|t| ids[&Arc::as_ptr(&t.0)]).collect();
                graph.push_typed(op.clone(), operands, tensor.0.ty.clone())
            }
        };
        ids.insert(key, id);
        nodes.push(tensor);
    }
    graph.outputs = outputs.iter().map(|t| ids[&Arc::as_ptr(&t.0)]).collect();
    (graph, inputs, nodes)
}
