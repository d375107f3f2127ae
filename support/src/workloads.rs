//! The workloads of benches/README.md, shared by the criterion benches
//! (`benches/fusion.rs`, `benches/compile.rs`) and `examples/bench_report`:
//! what each computes, its inputs (seeded normal values, f32 but for the
//! 16-bit workloads), and how its throughput is counted.

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
    /// For `matmul` and `matmul_bias_relu`: the product's dims and how its
    /// operands are stored, which the f64 reference reads them by.
    pub product: Option<Product>,
}

/// The dims of a product `A · B` (`A: [m, k]`, `B: [k, n]`) and how its
/// operands are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Product {
    /// Rows of A and of the product.
    pub m: usize,
    /// The depth.
    pub k: usize,
    /// Columns of B and of the product.
    pub n: usize,
    /// How A and B are stored.
    pub layout: Layout,
}

/// How a product's operands are stored: the three products of a training
/// step's linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `A: [m, k]`, `B: [k, n]`: the forward `x · w`.
    AB,
    /// A's input holds `[k, m]`: the weight gradient `xᵀ · dy`.
    AtB,
    /// B's input holds `[n, k]`: the input gradient `dy · wᵀ`.
    ABt,
}

impl Product {
    /// Element `(i, l)` of A from A's input values.
    pub fn a(&self, a: &[f32], i: usize, l: usize) -> f32 {
        match self.layout {
            Layout::AtB => a[l * self.m + i],
            Layout::AB | Layout::ABt => a[i * self.k + l],
        }
    }

    /// Element `(l, j)` of B from B's input values.
    pub fn b(&self, b: &[f32], l: usize, j: usize) -> f32 {
        match self.layout {
            Layout::ABt => b[j * self.k + l],
            Layout::AB | Layout::AtB => b[l * self.n + j],
        }
    }
}

impl Workload {
    /// Seeded normal inputs, one per spec, rounded to its dtype.
    pub fn inputs(&self) -> Result<Vec<Data>> {
        self.specs
            .iter()
            .enumerate()
            .map(|(i, ty)| {
                let normal = Tensor::randn(ty.shape.clone(), 1000 + i as u64)?;
                crate::data(&normal.cast(ty.dtype)?)
            })
            .collect()
    }
}

/// A depthwise 3x3 convolution of `t[0]` by `t[1]` with bias `t[2]`,
/// padding 1 and `stride`, then ReLU.
fn depthwise(t: &[Tensor], stride: usize) -> Result<Vec<Tensor>> {
    let channels = t[0].dims()[1];
    let y = t[0].conv2d(
        &t[1],
        Some(&t[2]),
        [stride; 2],
        [(1, 1); 2],
        [1, 1],
        channels,
    )?;
    Ok(vec![y.relu()?])
}

fn f32s(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

const MIB64: u64 = 4096 * 4096 * 4;

/// The `(m, k, n)` of the f32 and bf16 products `x · w`.
const PRODUCTS: [(usize, usize, usize); 5] = [
    (256, 256, 256),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (64, 784, 256),
    (4096, 784, 256),
];

/// The forward product of the first layer of the training step of the MLP
/// 784-256-256-10 at batch 250.
const TRAINING_FORWARD: (usize, usize, usize) = (250, 784, 256);

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
            product: None,
        },
        Workload {
            id: "ew_chain",
            shape: "4096x4096".into(),
            specs: vec![f32s(&[4096, 4096]); 3],
            build: |t| Ok(vec![(((&t[0] * &t[1])? + &t[2])?.relu()? * 0.5f32)?]),
            bytes: 4 * MIB64,
            flops: 0,
            product: None,
        },
    ];
    for (m, k, n) in PRODUCTS {
        w.extend(matmuls(m, k, n, Layout::AB));
    }
    // The first layer of the training step of the MLP 784-256-256-10 at
    // batch 250: forward `x · w`, the weight gradient `xᵀ · dy`, the input
    // gradient `dy · wᵀ`.
    let (m, k, n) = TRAINING_FORWARD;
    w.extend(matmuls(m, k, n, Layout::AB));
    w.extend(matmuls(784, 250, 256, Layout::AtB));
    w.extend(matmuls(250, 256, 784, Layout::ABt));
    // A classifier at batch 1 (resnet18's, mobilenet_v2's): one row against
    // a weight stored [n, k], as ONNX's Gemm reads it transposed.
    for (k, n) in [(512, 1000), (1280, 1000)] {
        w.extend(matmuls(1, k, n, Layout::ABt));
    }
    // An LSTM's recurrent step at batch 8 (256 wide): the state against
    // the four gates' weight, stored [1024, 256] as ONNX's LSTM holds it.
    w.extend(matmuls(8, 256, 1024, Layout::ABt));
    // The same products with the weight captured by the compiled graph, as
    // a model's is: packed once when it is compiled.
    w.extend([
        linear::<1024>(1, 256),
        linear::<1024>(8, 256),
        linear::<1000>(1, 512),
        linear::<1000>(1, 1280),
    ]);
    w.push(Workload {
        id: "softmax",
        shape: "4096x1000".into(),
        specs: vec![f32s(&[4096, 1000])],
        build: |t| Ok(vec![t[0].softmax(-1)?]),
        bytes: 2 * 4096 * 1000 * 4,
        flops: 0,
        product: None,
    });
    // Attention heads [batch, heads, sequence, 64]: a GPT-2-sized decoder's
    // causal self-attention at 512 tokens and at batch 8 of 128, and a
    // ViT-B's over 197 patches. Flops: both products over every score,
    // the causal ones' hidden half included.
    for (b, l, causal) in [(1, 512, true), (8, 128, true), (1, 197, false)] {
        let dims = [b, 12, l, 64];
        w.push(Workload {
            id: "attention",
            shape: format!("{b}x12x{l}x64{}", if causal { " causal" } else { "" }),
            specs: vec![f32s(&dims), f32s(&dims), f32s(&dims)],
            build: match causal {
                true => |t| {
                    Ok(vec![t[0].scaled_dot_product_attention(
                        &t[1], &t[2], None, true, None,
                    )?])
                },
                false => |t| {
                    Ok(vec![t[0].scaled_dot_product_attention(
                        &t[1], &t[2], None, false, None,
                    )?])
                },
            },
            bytes: 0,
            flops: (4 * b * 12 * l * l * 64) as u64,
            product: None,
        });
    }
    w.push(Workload {
        id: "log_softmax",
        shape: "4096x10".into(),
        specs: vec![f32s(&[4096, 10])],
        build: |t| Ok(vec![t[0].log_softmax(-1)?]),
        bytes: 0,
        flops: 0,
        product: None,
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
            product: None,
        });
        w.push(Workload {
            id: "sum_all",
            shape: format!("{n}x{n}"),
            specs: vec![f32s(&[n, n])],
            build: |t| Ok(vec![t[0].sum_all()?]),
            bytes: input,
            flops: 0,
            product: None,
        });
    }
    w.push(Workload {
        id: "conv2d_bias_relu",
        shape: "64x3x32x32-32x3x3".into(),
        specs: vec![f32s(&[64, 3, 32, 32]), f32s(&[32, 3, 3, 3]), f32s(&[32])],
        build: |t| {
            let y = t[0].conv2d(&t[1], Some(&t[2]), [1, 1], [(1, 1); 2], [1, 1], 1)?;
            Ok(vec![y.relu()?])
        },
        bytes: 0,
        flops: 2 * 64 * 32 * 32 * 32 * 27,
        product: None,
    });
    // MobileNetV2's depthwise convolutions: 3x3, padding 1, one filter per
    // channel, the bias and ReLU after; stride 2 over 96 channels of
    // 112x112, stride 1 over 144 channels of 56x56.
    for (c, hw, stride) in [(96usize, 112usize, 2usize), (144, 56, 1)] {
        let out = hw / stride;
        w.push(Workload {
            id: "depthwise_conv2d",
            shape: format!("1x{c}x{hw}x{hw}-s{stride}"),
            specs: vec![f32s(&[1, c, hw, hw]), f32s(&[c, 1, 3, 3]), f32s(&[c])],
            build: if stride == 2 {
                |t| depthwise(t, 2)
            } else {
                |t| depthwise(t, 1)
            },
            bytes: ((c * hw * hw + c * out * out) * 4) as u64,
            flops: (2 * c * out * out * 9) as u64,
            product: None,
        });
    }
    // Four branches of 32 channels joined along the channels, as an
    // Inception or DenseNet block's concatenation.
    let part = f32s(&[1, 32, 56, 56]);
    w.push(Workload {
        id: "concat",
        shape: "4x1x32x56x56".into(),
        specs: vec![part.clone(), part.clone(), part.clone(), part],
        build: |t| Ok(vec![Tensor::cat(&[&t[0], &t[1], &t[2], &t[3]], 1)?]),
        bytes: 2 * 4 * 32 * 56 * 56 * 4,
        flops: 0,
        product: None,
    });
    // ResNet's first pooling: 3x3, stride 2, padding 1, each window's first
    // maximum (the element a gradient goes to).
    w.push(Workload {
        id: "max_pool2d",
        shape: "1x64x112x112".into(),
        specs: vec![f32s(&[1, 64, 112, 112])],
        build: |t| {
            let window = kiln::Pool2d {
                stride: [2, 2],
                padding: [(1, 1); 2],
                ..kiln::Pool2d::new([3, 3])
            };
            Ok(vec![t[0].max_pool2d(&window)?])
        },
        bytes: (64 * 112 * 112 + 64 * 56 * 56) * 4,
        flops: 0,
        product: None,
    });
    // bf16 products, summed in f32 and rounded once, at the f32 rows'
    // shapes (the training step's forward among them): by the AMX core
    // where the CPU has it, else widened.
    for (m, k, n) in PRODUCTS.into_iter().chain([TRAINING_FORWARD]) {
        w.push(matmul_bf16(m, k, n));
    }
    // 16-bit floats: elementwise work on bf16 (loaded into f32 lanes and
    // rounded as stored), and the cast that makes them from f32.
    let bf16s = TensorType::new(DType::BF16, [4096, 4096]);
    w.push(Workload {
        id: "ew_add_relu_bf16",
        shape: "4096x4096".into(),
        specs: vec![bf16s.clone(), bf16s],
        build: |t| Ok(vec![(&t[0] + &t[1])?.relu()?]),
        bytes: 3 * MIB64 / 2,
        flops: 0,
        product: None,
    });
    w.push(Workload {
        id: "cast_bf16",
        shape: "4096x4096".into(),
        specs: vec![f32s(&[4096, 4096])],
        build: |t| Ok(vec![t[0].cast(DType::BF16)?]),
        bytes: MIB64 + MIB64 / 2,
        flops: 0,
        product: None,
    });
    w.push(Workload {
        id: "small_add_relu",
        shape: "256x256".into(),
        specs: vec![f32s(&[256, 256]), f32s(&[256, 256])],
        build: |t| Ok(vec![(&t[0] + &t[1])?.relu()?]),
        bytes: 3 * 256 * 256 * 4,
        flops: 0,
        product: None,
    });
    w
}

/// `matmul`, `matmul_bias_relu` and `matmul_bf16` at 4096³: a GPU's size,
/// a minute of CPU time.
pub fn gpu_only() -> Vec<Workload> {
    let mut w: Vec<Workload> = matmuls(4096, 4096, 4096, Layout::AB).into();
    w.push(matmul_bf16(4096, 4096, 4096));
    w
}

/// `matmul_bf16`: the product of bf16 operands, rounded to bf16.
fn matmul_bf16(m: usize, k: usize, n: usize) -> Workload {
    let bf16 = |dims: &[usize]| TensorType::new(DType::BF16, dims);
    Workload {
        id: "matmul_bf16",
        shape: format!("{m}x{k}x{n}"),
        specs: vec![bf16(&[m, k]), bf16(&[k, n])],
        build: |t| Ok(vec![t[0].matmul(&t[1])?]),
        bytes: 0,
        flops: 2 * (m * k * n) as u64,
        product: Some(Product {
            m,
            k,
            n,
            layout: Layout::AB,
        }),
    }
}

/// `matmul` and `matmul_bias_relu` at one `MxKxN`, its operands stored as
/// `layout` says (the shape then ends in ` AtB` or ` ABt`).
fn matmuls(m: usize, k: usize, n: usize, layout: Layout) -> [Workload; 2] {
    let product = Some(Product { m, k, n, layout });
    let (shape, a, b) = match layout {
        Layout::AB => (format!("{m}x{k}x{n}"), [m, k], [k, n]),
        Layout::AtB => (format!("{m}x{k}x{n} AtB"), [k, m], [k, n]),
        Layout::ABt => (format!("{m}x{k}x{n} ABt"), [m, k], [n, k]),
    };
    let flops = 2 * (m * k * n) as u64;
    [
        Workload {
            id: "matmul",
            shape: shape.clone(),
            specs: vec![f32s(&a), f32s(&b)],
            build: match layout {
                Layout::AB => |t| Ok(vec![t[0].matmul(&t[1])?]),
                Layout::AtB => |t| Ok(vec![t[0].t()?.matmul(&t[1])?]),
                Layout::ABt => |t| Ok(vec![t[0].matmul(&t[1].t()?)?]),
            },
            bytes: 0,
            flops,
            product,
        },
        Workload {
            id: "matmul_bias_relu",
            shape,
            specs: vec![f32s(&a), f32s(&b), f32s(&[n])],
            build: match layout {
                Layout::AB => |t| Ok(vec![(t[0].matmul(&t[1])? + &t[2])?.relu()?]),
                Layout::AtB => |t| Ok(vec![(t[0].t()?.matmul(&t[1])? + &t[2])?.relu()?]),
                Layout::ABt => |t| Ok(vec![(t[0].matmul(&t[1].t()?)? + &t[2])?.relu()?]),
            },
            bytes: 0,
            flops,
            product,
        },
    ]
}

/// `linear`: `x · wᵀ` for `x: [m, k]` and a weight `w: [N, k]` that the
/// graph captures, seeded, as a model's weights are.
fn linear<const N: usize>(m: usize, k: usize) -> Workload {
    fn times_weight<const N: usize>(t: &[Tensor]) -> Result<Vec<Tensor>> {
        let k = t[0].dims()[1];
        let w = Tensor::randn([N, k].as_slice(), 31)?.to(t[0].device())?;
        Ok(vec![t[0].matmul(&w.t()?)?])
    }
    Workload {
        id: "linear",
        shape: format!("{m}x{k}x{N}"),
        specs: vec![f32s(&[m, k])],
        build: times_weight::<N>,
        bytes: 0,
        flops: 2 * (m * k * N) as u64,
        product: None,
    }
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
