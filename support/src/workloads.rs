//! The workloads of benches/README.md, shared by the criterion benches
//! (`benches/fusion.rs`, `benches/compile.rs`) and `examples/bench_report`:
//! what each computes, its inputs (seeded normal f32), and how its
//! throughput is counted.

use kiln::{DType, Data, Result, Tensor, TensorType};

/// One workload at one shape.
pub struct Workload {
    /// The id of benches/README.md (`ew_add_relu`, `matmul`, ...).
    pub id: &'static str,
    /// Dims joined by `x` (`4096x4096`, matmuls `MxKxN`).
    pub shape: String,
    /// Input types, in order.
    pub specs: Vec<TensorType>,
    /// The computation.
    pub build: fn(&[Tensor]) -> Result<Vec<Tensor>>,
    /// Bytes counted for GB/s (0 when not reported that way).
    pub bytes: u64,
    /// Flops counted for GFLOP/s (0 when not reported that way).
    pub flops: u64,
}

impl Workload {
    /// Seeded normal inputs, one per spec.
    pub fn inputs(&self) -> Result<Vec<Data>> {
        self.specs
            .iter()
            .enumerate()
            .map(|(i, ty)| {
                Ok(Data::F32(
                    Tensor::randn(ty.shape.clone(), 1000 + i as u64)?.to_vec()?,
                ))
            })
            .collect()
    }
}

fn f32s(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

const MIB64: u64 = 4096 * 4096 * 4;

/// Every workload of benches/README.md except `compile_mlp3`, which times
/// compilation itself.
pub fn all() -> Vec<Workload> {
    let mut w = vec![
        Workload {
            id: "ew_add_relu",
            shape: "4096x4096".into(),
            specs: vec![f32s(&[4096, 4096]), f32s(&[4096, 4096])],
            build: |t| Ok(vec![(&t[0] + &t[1])?.relu()?]),
            bytes: 3 * MIB64,
            flops: 0,
        },
        Workload {
            id: "ew_chain",
            shape: "4096x4096".into(),
            specs: vec![f32s(&[4096, 4096]); 3],
            build: |t| Ok(vec![(((&t[0] * &t[1])? + &t[2])?.relu()? * 0.5f32)?]),
            bytes: 4 * MIB64,
            flops: 0,
        },
    ];
    for (m, k, n) in [
        (256, 256, 256),
        (1024, 1024, 1024),
        (2048, 2048, 2048),
        (64, 784, 256),
        (4096, 784, 256),
    ] {
        w.extend(matmuls(m, k, n));
    }
    w.push(Workload {
        id: "softmax",
        shape: "4096x1000".into(),
        specs: vec![f32s(&[4096, 1000])],
        build: |t| Ok(vec![t[0].softmax(-1)?]),
        bytes: 2 * 4096 * 1000 * 4,
        flops: 0,
    });
    w.push(Workload {
        id: "log_softmax",
        shape: "4096x10".into(),
        specs: vec![f32s(&[4096, 10])],
        build: |t| Ok(vec![t[0].log_softmax(-1)?]),
        bytes: 0,
        flops: 0,
    });
    for n in [1024, 4096] {
        let input = (n * n * 4) as u64;
        w.push(Workload {
            id: "sum_axis0",
            shape: format!("{n}x{n}"),
            specs: vec![f32s(&[n, n])],
            build: |t| Ok(vec![t[0].sum(&[0], false)?]),
            bytes: input + (n * 4) as u64,
            flops: 0,
        });
        w.push(Workload {
            id: "sum_all",
            shape: format!("{n}x{n}"),
            specs: vec![f32s(&[n, n])],
            build: |t| Ok(vec![t[0].sum_all()?]),
            bytes: input,
            flops: 0,
        });
    }
    w.push(Workload {
        id: "small_add_relu",
        shape: "256x256".into(),
        specs: vec![f32s(&[256, 256]), f32s(&[256, 256])],
        build: |t| Ok(vec![(&t[0] + &t[1])?.relu()?]),
        bytes: 3 * 256 * 256 * 4,
        flops: 0,
    });
    w
}

/// `matmul` and `matmul_bias_relu` at 4096³: a GPU's size, a minute of CPU time.
pub fn gpu_only() -> Vec<Workload> {
    matmuls(4096, 4096, 4096).into()
}

/// `matmul` and `matmul_bias_relu` at one `MxKxN`.
fn matmuls(m: usize, k: usize, n: usize) -> [Workload; 2] {
    let flops = 2 * (m * k * n) as u64;
    [
        Workload {
            id: "matmul",
            shape: format!("{m}x{k}x{n}"),
            specs: vec![f32s(&[m, k]), f32s(&[k, n])],
            build: |t| Ok(vec![t[0].matmul(&t[1])?]),
            bytes: 0,
            flops,
        },
        Workload {
            id: "matmul_bias_relu",
            shape: format!("{m}x{k}x{n}"),
            specs: vec![f32s(&[m, k]), f32s(&[k, n]), f32s(&[n])],
            build: |t| Ok(vec![(t[0].matmul(&t[1])? + &t[2])?.relu()?]),
            bytes: 0,
            flops,
        },
    ]
}

/// The 3-layer MLP of `compile_mlp3` (784-256-256-10, batch 64, relu
/// between layers), with seeded weights.
pub struct Mlp3 {
    /// The input's type.
    pub spec: TensorType,
    layers: Vec<(Tensor, Tensor)>,
}

impl Mlp3 {
    /// The network with its weights.
    pub fn new() -> Result<Mlp3> {
        let sizes = [784, 256, 256, 10];
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, p)| {
                Ok((
                    Tensor::randn([p[0], p[1]], 2 * i as u64)?,
                    Tensor::randn([p[1]], 2 * i as u64 + 1)?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Mlp3 {
            spec: f32s(&[64, 784]),
            layers,
        })
    }

    /// The forward pass of `x[0]`.
    pub fn forward(&self, x: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut h = x[0].clone();
        for (i, (w, b)) in self.layers.iter().enumerate() {
            let z = (h.matmul(w)? + b)?;
            h = if i + 1 < self.layers.len() {
                z.relu()?
            } else {
                z
            };
        }
        Ok(vec![h])
    }
}
