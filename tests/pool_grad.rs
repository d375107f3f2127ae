//! `max_pool2d`'s gradient: each window's gradient goes to the one element
//! the window picks, PyTorch's (its first maximum in row-major order, its
//! last NaN where it holds one), on every path, with ties everywhere (as
//! ReLU's zeros make them) and NaN in some windows. The reference is the
//! definition written as a loop.

mod pools;

use kiln::{Device, Pool2d, Result, Tensor, compile, realize};
use kiln_support::gradcheck::Rng;

/// The pooled values and the gradient of `sum(pool(x) * w)` with respect to
/// `x`, by PyTorch's rule: a window scans its elements in row-major order
/// and keeps one that is larger than the kept value or NaN.
fn reference(dims: [usize; 4], x: &[f32], p: &Pool2d, w: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let [n, c, h, wd] = dims;
    let out_h = pools::pool_len(
        h,
        p.kernel[0],
        p.stride[0],
        p.padding[0],
        p.dilation[0],
        p.ceil_mode,
    );
    let out_w = pools::pool_len(
        wd,
        p.kernel[1],
        p.stride[1],
        p.padding[1],
        p.dilation[1],
        p.ceil_mode,
    );
    let (mut y, mut dx) = (Vec::new(), vec![0.0f32; x.len()]);
    for plane in 0..n * c {
        for oy in 0..out_h {
            for ox in 0..out_w {
                let mut kept: Option<(f32, usize)> = None;
                for ky in 0..p.kernel[0] {
                    for kx in 0..p.kernel[1] {
                        let iy = (oy * p.stride[0] + ky * p.dilation[0]) as isize
                            - p.padding[0].0 as isize;
                        let ix = (ox * p.stride[1] + kx * p.dilation[1]) as isize
                            - p.padding[1].0 as isize;
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                            continue;
                        }
                        let at = (plane * h + iy as usize) * wd + ix as usize;
                        let v = x[at];
                        if kept.is_none_or(|(m, _)| v > m || v.is_nan()) {
                            kept = Some((v, at));
                        }
                    }
                }
                let (v, at) = kept.expect("every window holds an input element");
                dx[at] += w[y.len()];
                y.push(v);
            }
        }
    }
    (y, dx)
}

/// The pooled values and the gradient as kiln computes them: realized on
/// `device`, and compiled for the CPU when `device` is `None`.
fn kiln_pool(
    device: Option<Device>,
    dims: [usize; 4],
    x: &[f32],
    p: &Pool2d,
    w: &[f32],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let f = |x: &Tensor, w: &Tensor| -> Result<[Tensor; 2]> {
        let y = x.max_pool2d(p)?;
        let loss = y.mul(&w.reshape(y.dims())?)?.sum_all()?;
        let dx = kiln::grad(&loss, &[x])?.remove(0);
        Ok([y, dx])
    };
    let (xt, wt) = (
        Tensor::from_slice(x, dims)?,
        Tensor::from_slice(w, [w.len()])?,
    );
    let [y, dx] = match device {
        Some(device) => {
            let [y, dx] = f(&xt.to(device)?, &wt.to(device)?)?;
            realize(&[&y, &dx])?;
            [y, dx]
        }
        None => {
            let specs = [xt.ty().clone(), wt.ty().clone()];
            let mut g = compile("pool_grad", &specs, |t| Ok(f(&t[0], &t[1])?.to_vec()))?;
            let mut out = g.call(&[&xt, &wt])?;
            let dx = out.remove(1);
            [out.remove(0), dx]
        }
    };
    Ok((y.to_vec()?, dx.to_vec()?))
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x == y || (x.is_nan() && y.is_nan()))
}

fn case(dims: [usize; 4], x: &[f32], p: &Pool2d, seed: u64) -> Result<()> {
    let outputs = {
        let probe = Tensor::zeros(dims, kiln::DType::F32)?.max_pool2d(p)?;
        probe.numel()
    };
    // Small integers: every sum of them is exact, in any order.
    let w = Rng(seed).fill(outputs, |r| r.uniform(-3.0, 3.0).round());
    let (want_y, want_dx) = reference(dims, x, p, &w);
    for device in [Some(Device::Cpu), Some(Device::Reference), None] {
        let (y, dx) = kiln_pool(device, dims, x, p, &w)?;
        assert!(
            same(&y, &want_y),
            "{p:?} on {device:?}: values\n{y:?}\nwant {want_y:?}"
        );
        assert!(
            same(&dx, &want_dx),
            "{p:?} on {device:?}: gradient\n{dx:?}\nwant {want_dx:?}"
        );
    }
    Ok(())
}

#[test]
fn a_window_of_ties_sends_its_gradient_to_its_first_element() -> Result<()> {
    // A 3x3 window of zeros: all of it to the first, none shared.
    let x = Tensor::zeros([1, 1, 3, 3], kiln::DType::F32)?;
    let loss = x.max_pool2d(&Pool2d::new([3, 3]))?.sum_all()?;
    let dx = kiln::grad(&loss, &[&x])?.remove(0).to_vec::<f32>()?;
    assert_eq!(dx, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    Ok(())
}

#[test]
fn each_window_sends_its_gradient_to_the_element_it_picks() -> Result<()> {
    let dims = [2, 3, 9, 11];
    let len: usize = dims.iter().product();
    // Four levels: ties in nearly every window.
    let x = Rng(7).fill(len, |r| r.uniform(-1.5, 2.5).round());
    let windows = [
        Pool2d {
            stride: [2, 2],
            padding: [(1, 1), (1, 1)],
            ..Pool2d::new([3, 3])
        },
        Pool2d::new([2, 2]),
        // Past the size pooled at once: along the width, then the height.
        Pool2d {
            stride: [1, 1],
            ..Pool2d::new([6, 6])
        },
        Pool2d {
            stride: [2, 3],
            padding: [(0, 1), (1, 0)],
            dilation: [2, 1],
            ceil_mode: true,
            ..Pool2d::new([2, 3])
        },
    ];
    for (k, p) in windows.iter().enumerate() {
        case(dims, &x, p, k as u64)?;
    }
    // NaN in some windows: the window's value, and its gradient's place.
    let mut with_nan = x.clone();
    for at in [0, 5, 6, 40, 41, 300, len - 1] {
        with_nan[at] = f32::NAN;
    }
    for (k, p) in windows.iter().enumerate() {
        case(dims, &with_nan, p, 10 + k as u64)?;
    }
    Ok(())
}
