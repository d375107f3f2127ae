//! The product reduction on the CPU, fused and unfused, against the
//! reference interpreter: f32, f64, i32, i64 and u8; rank 0, odd sizes,
//! empty axes, one axis or several, and the shapes that take the CPU's
//! special paths (vector lanes with ragged tails, rows read in segments,
//! four short rows a lane, a leading axis accumulated in place, a long
//! reduction split in two kernels); alone and with the product broadcast
//! back over its operand in the same kernel. Then `Tensor::prod`'s
//! `keepdim`, axes and errors.
//!
//! Integer products wrap and must agree exactly. Float products round at
//! every step on the CPU, in its order, and once from f64 in the
//! interpreter: each of `n` multiplications moves the result by at most
//! half an ulp, so they agree within `n * EPSILON` relatively.

use kiln::{DType, Data, Device, Result, Tensor};
use kiln_ir::pass::{Options, optimize};
use kiln_ir::{BinaryOp, DataRef, Graph, Op, ReduceOp, Scalar, TensorType, interp};
use kiln_runtime::{Backend, BackendOptions, cpu::Cpu};
use kiln_support::gradcheck::Rng;
use smallvec::SmallVec;

/// Seeded values of `dtype` whose products stay finite: floats near 1
/// (`1 + u/20`; in small tensors a few zeros and -0, which in a large one
/// would make every product 0), integers that wrap.
fn values(dtype: DType, n: usize, seed: u64) -> Data {
    let mut rng = Rng(seed);
    let zeros = n <= 200;
    Data::from_fn(dtype, n, |i| match dtype {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => match (i * 7 + seed as usize) % 31 {
            0 if zeros => Scalar::F64(0.0),
            1 if zeros => Scalar::F64(-0.0),
            _ => Scalar::F64(1.0 + f64::from(rng.uniform(-1.0, 1.0)) / 20.0),
        },
        DType::I32 => Scalar::I64(rng.below(2001) as i64 - 1000),
        DType::I64 => Scalar::I64((rng.next_u64() >> 30) as i64 - (1 << 33)),
        DType::U8 | DType::Bool => Scalar::I64(rng.below(256) as i64),
    })
    .expect("test data fits in memory")
}

/// The product of `x` over `axes` as a graph: alone, and divided into (or,
/// for integers, multiplied with) `x` broadcast back, so that the fuser
/// makes a reduction with a broadcast epilogue of it.
fn graph(ty: &TensorType, axes: &[usize]) -> Graph {
    let mut g = Graph::new("prod");
    let x = g.input(ty.clone());
    let op = Op::Reduce {
        op: ReduceOp::Prod,
        axes: SmallVec::from_slice(axes),
    };
    let p = g.push(op, &[x]).expect("a product of a number type");
    let back = g
        .push(Op::Expand(ty.shape.clone()), &[p])
        .expect("broadcasts back");
    let combine = match ty.dtype.is_float() {
        true => BinaryOp::Div,
        false => BinaryOp::Mul,
    };
    let y = g
        .push(Op::Binary(combine), &[x, back])
        .expect("same shapes");
    g.outputs = vec![p, y];
    g
}

/// `graph` on the CPU, fused or not, and on the interpreter.
fn run(graph: &Graph, x: &Data, fusion: bool) -> (Vec<Data>, Vec<Data>) {
    let want = interp::eval(graph, &[x]).expect("the interpreter runs it");
    let optimized = optimize(
        graph,
        Options {
            fusion,
            ..Options::default()
        },
        &mut |_, _| {},
    )
    .expect("optimizes");
    let mut exec = Cpu
        .compile(optimized, BackendOptions::default())
        .unwrap_or_else(|e| panic!("{e}\n{graph}"));
    let mut have = exec.output_buffers().expect("buffers");
    exec.run_into(&[DataRef::from(x)], &mut have).expect("runs");
    (want, have)
}

/// Whether `a` (the CPU) agrees with `b` (the interpreter) for products of
/// `n` factors: exactly for integers, NaN with NaN, zeros with their sign,
/// floats within `n * EPSILON` of the type.
fn agree(a: &Data, b: &Data, n: usize) -> Option<usize> {
    let eps = match a.dtype() {
        DType::F32 => f64::from(f32::EPSILON),
        DType::F64 => f64::EPSILON,
        _ => 0.0,
    };
    let rtol = (n + 1) as f64 * eps;
    (0..a.len().max(b.len())).find(|&i| {
        if i >= a.len() || i >= b.len() {
            return true;
        }
        let (x, y) = (a.get(i).to_f64(), b.get(i).to_f64());
        let same = (x.is_nan() && y.is_nan())
            || x.to_bits() == y.to_bits()
            || (x != 0.0 && (x - y).abs() <= rtol * x.abs().max(y.abs()));
        !same
    })
}

fn check(dtype: DType, dims: &[usize], axes: &[usize], seed: u64) {
    let ty = TensorType::new(dtype, dims);
    let g = graph(&ty, axes);
    let x = values(dtype, ty.shape.numel(), seed);
    // The broadcast quotient's error adds one rounding to the product's.
    let n: usize = axes.iter().map(|&a| dims[a]).product::<usize>() + 1;
    for fusion in [true, false] {
        let (want, have) = run(&g, &x, fusion);
        for (k, (w, h)) in want.iter().zip(&have).enumerate() {
            if let Some(i) = agree(h, w, n) {
                panic!(
                    "{dtype:?} {dims:?} axes {axes:?} fusion {fusion}: output {k} element {i}: \
                     cpu {:?}, interpreter {:?}",
                    h.get(i),
                    w.get(i)
                );
            }
        }
    }
}

/// Every subset of the axes of `rank`, the empty one included.
fn subsets(rank: usize) -> Vec<Vec<usize>> {
    (0..1usize << rank)
        .map(|m| (0..rank).filter(|a| m >> a & 1 == 1).collect())
        .collect()
}

#[test]
fn products_over_awkward_shapes_agree_with_the_interpreter() {
    let shapes: [&[usize]; 12] = [
        &[],
        &[1],
        &[7],
        &[50],
        &[1027],
        &[3, 0],
        &[0, 3],
        &[4, 3],
        &[7, 5],
        &[5, 17],
        &[2, 7, 3],
        &[3, 1, 6],
    ];
    for (s, dims) in shapes.iter().enumerate() {
        for dtype in [DType::F32, DType::F64, DType::I32, DType::I64, DType::U8] {
            for axes in subsets(dims.len()) {
                check(dtype, dims, &axes, s as u64);
            }
        }
    }
}

#[test]
fn products_take_the_cpus_special_paths() {
    // Rows read in segments (from 8192), a leading axis accumulated in
    // place four rows a vector, short rows four a lane, and reductions
    // with few outputs split in two kernels (from 2^18 elements).
    let cases: [(&[usize], &[usize]); 7] = [
        (&[2, 9001], &[1]),
        (&[300, 37], &[0]),
        (&[64, 5], &[1]),
        (&[33, 3, 7], &[0, 1]),
        (&[4, 65536], &[1]),
        (&[65536, 5], &[0]),
        (&[512, 520], &[0, 1]),
    ];
    for (k, (dims, axes)) in cases.into_iter().enumerate() {
        check(DType::F32, dims, axes, 100 + k as u64);
    }
    check(DType::I32, &[65536, 5], &[0], 7);
    check(DType::I64, &[4, 65536], &[1], 8);
}

#[test]
fn float_products_propagate_nan_and_infinities() {
    let v = [
        1.5,
        f32::NAN,
        2.0,
        f32::INFINITY,
        -3.0,
        0.5,
        f32::INFINITY,
        0.0,
        -2.0,
        f32::NEG_INFINITY,
        2.0,
        4.0,
    ];
    for fusion in [true, false] {
        let g = graph(&TensorType::new(DType::F32, [3, 4]), &[1]);
        let (want, have) = run(&g, &Data::F32(v.to_vec()), fusion);
        assert_eq!(agree(&have[0], &want[0], 4), None, "{want:?} {have:?}");
        let Data::F32(p) = &have[0] else {
            panic!("f32 products")
        };
        assert!(p[0].is_nan() && p[1].is_nan(), "{p:?}");
        assert_eq!(p[2], f32::INFINITY, "{p:?}");
    }
}

#[test]
fn tensor_prod_keeps_or_drops_axes_and_refuses_bool() -> Result<()> {
    let x = Tensor::from_vec((1..=24).map(|i| i as f32 / 8.0).collect(), [2, 3, 4])?;
    for device in [Device::Cpu, Device::Reference] {
        let x = x.to(device)?;
        let kept = x.prod(&[-1, 0], true)?;
        assert_eq!(kept.dims(), &[1, 3, 1]);
        let dropped = x.prod(&[-1, 0], false)?;
        assert_eq!(dropped.dims(), &[3]);
        let rows: Vec<f32> = dropped.to_vec()?;
        let want: Vec<f32> = (0..3)
            .map(|j| {
                let f = |i: usize, k: usize| (i * 12 + j * 4 + k + 1) as f64 / 8.0;
                (0..2)
                    .flat_map(|i| (0..4).map(move |k| (i, k)))
                    .map(|(i, k)| f(i, k))
                    .product::<f64>() as f32
            })
            .collect();
        for (a, b) in rows.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{rows:?} against {want:?}");
        }
        let all = Tensor::from_vec(vec![3i64, -5, 7], [3])?.to(device)?;
        assert_eq!(all.prod(&[0], false)?.to_vec::<i64>()?, [-105]);
        let empty = Tensor::from_vec(Vec::<i32>::new(), [2, 0])?.to(device)?;
        assert_eq!(empty.prod(&[1], false)?.to_vec::<i32>()?, [1, 1]);
    }
    let flags = Tensor::from_vec(vec![true, false], [2])?;
    let e = flags.prod(&[0], false).expect_err("bool has no product");
    assert!(e.to_string().contains("prod"), "{e}");
    let e = x.prod(&[1, -2], false).expect_err("a repeated axis");
    assert!(e.to_string().contains("prod"), "{e}");
    Ok(())
}
