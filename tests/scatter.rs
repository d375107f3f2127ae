//! The gradients of gathers and `scatter_add`, against direct loops on
//! every path a graph can take (`paths`): repeated picks add up in order,
//! indices from the end count, and what falls outside the axis is dropped.

mod paths;

use kiln::{DType, Result, Tensor, TensorType};
use paths::{check, close, every_path, values};

#[test]
fn a_gather_sends_each_gradient_to_the_element_it_picked() -> Result<()> {
    let x = Tensor::randn([7, 5], 21)?;
    // Repeated picks add up; -7 is 0, 7 and -8 pick nothing.
    let idx = [
        0i32, 3, -1, 6, 7, 3, 3, -7, 2, -8, 6, 0, 1, 1, 4, 5, 3, 0, -2, 2,
    ];
    let w = Tensor::randn([4, 5], 22)?;
    let ws = values(&w)?;
    let mut want = vec![0.0f64; 35];
    for (k, &i) in idx.iter().enumerate() {
        let row = if i < 0 { i + 7 } else { i };
        if (0..7).contains(&row) {
            want[row as usize * 5 + k % 5] += ws[k];
        }
    }
    let inputs = [x, Tensor::from_vec(idx.to_vec(), [4, 5])?, w];
    let dx = |t: &[Tensor]| -> Result<Tensor> {
        let loss = (t[0].gather(0, &t[1])? * &t[2])?.sum_all()?;
        Ok(kiln::grad(&loss, &[&t[0]])?.remove(0))
    };
    for (path, got) in every_path(&inputs, dx)? {
        for (i, (g, w)) in values(&got)?.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6,
                "dx, {path}: element {i}: got {g}, want {w}"
            );
        }
    }
    Ok(())
}

/// `src` [n, m] added into `out` [len, m] (or, `along_rows`, [n, m] into
/// [n, len]) at `idx`'s positions, in f64.
fn scatter_rows(
    out: &mut [f64],
    src: &[f64],
    idx: &[i64],
    shape: (usize, usize),
    len: usize,
    along_rows: bool,
) {
    let (n, m) = shape;
    for r in 0..n {
        for c in 0..m {
            let k = r * m + c;
            let i = if idx[k] < 0 {
                idx[k] + len as i64
            } else {
                idx[k]
            };
            if (0..len as i64).contains(&i) {
                let at = if along_rows {
                    r * len + i as usize
                } else {
                    i as usize * m + c
                };
                out[at] += src[k];
            }
        }
    }
}

#[test]
fn an_embedding_gradient_adds_each_row_where_its_id_points() -> Result<()> {
    // 67 columns: vectors of four and a tail; ids repeated, from the end,
    // and outside the table.
    let table = Tensor::randn([1000, 67], 31)?;
    let ids: Vec<i64> = (0..45)
        .map(|t| (t * 389) % 2003 - 1001)
        .chain([5, 5, -995])
        .collect();
    let w = Tensor::randn([48, 67], 32)?;
    let expanded: Vec<i64> = ids.iter().flat_map(|&i| [i; 67]).collect();
    let mut want = vec![0.0; 1000 * 67];
    scatter_rows(&mut want, &values(&w)?, &expanded, (48, 67), 1000, false);
    let inputs = [table, Tensor::from_vec(ids, [48])?, w];
    let dx = |t: &[Tensor]| -> Result<Tensor> {
        let loss = (t[0].index_select(0, &t[1])? * &t[2])?.sum_all()?;
        Ok(kiln::grad(&loss, &[&t[0]])?.remove(0))
    };
    for (path, got) in every_path(&inputs, dx)? {
        for (i, (g, w)) in values(&got)?.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "dx, {path}: element {i}: got {g}, want {w}"
            );
        }
    }
    Ok(())
}

#[test]
fn scatter_add_sums_repeats_in_order_and_drops_what_falls_outside() -> Result<()> {
    // Along the last axis (one element per pick) and along the first
    // (rows), with i32 and i64 indices.
    let base = Tensor::randn([9, 13], 41)?;
    let src = Tensor::randn([9, 13], 42)?;
    let idx: Vec<i64> = (0..9 * 13).map(|k| (k * 7) % 31 - 15).collect();
    for axis in [1, 0] {
        let len = if axis == 1 { 13 } else { 9 };
        let mut want = values(&base)?;
        scatter_rows(&mut want, &values(&src)?, &idx, (9, 13), len, axis == 1);
        let narrow: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
        for indices in [
            Tensor::from_vec(idx.clone(), [9, 13])?,
            Tensor::from_vec(narrow, [9, 13])?,
        ] {
            close(
                &format!("scatter_add along {axis} by {:?}", indices.dtype()),
                &[base.clone(), indices, src.clone()],
                |t| t[0].scatter_add(axis, &t[1], &t[2]),
                1e-6,
            )?;
            let got =
                values(&base.scatter_add(axis, &Tensor::from_vec(idx.clone(), [9, 13])?, &src)?)?;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5,
                    "along {axis}: element {i}: got {g}, want {w}"
                );
            }
        }
    }
    let message = base.scatter_add(
        0,
        &Tensor::zeros([9, 12], DType::I32)?,
        &Tensor::zeros([9, 12], DType::F32)?,
    );
    assert_eq!(
        message.map(|_| ()).expect_err("an error").to_string(),
        "scatter_add: shapes [9, 13] and [9, 12] differ"
    );
    Ok(())
}

#[test]
fn a_scatter_add_differentiates_to_the_gather_of_its_gradient() -> Result<()> {
    // d/dsrc sum(scatter_add(base, idx, src) * v) = v at each index, zero
    // where the index falls outside.
    let v = Tensor::randn([6, 4], 51)?;
    let idx = [0i32, 5, -1, 6, 2, -7, 3, 3, 1, 0, -6, 4];
    let vs = values(&v)?;
    let want: Vec<f64> = idx
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let i = if i < 0 { i + 6 } else { i };
            if (0..6).contains(&i) {
                vs[i as usize * 4 + k % 4]
            } else {
                0.0
            }
        })
        .collect();
    let inputs = [
        Tensor::zeros([6, 4], DType::F32)?,
        Tensor::from_vec(idx.to_vec(), [3, 4])?,
        Tensor::randn([3, 4], 52)?,
        v,
    ];
    let dsrc = |t: &[Tensor]| -> Result<Tensor> {
        let loss = (t[0].scatter_add(0, &t[1], &t[2])? * &t[3])?.sum_all()?;
        Ok(kiln::grad(&loss, &[&t[2]])?.remove(0))
    };
    for (path, got) in every_path(&inputs, dsrc)? {
        assert_eq!(values(&got)?, want, "dsrc, {path}");
    }
    Ok(())
}

#[test]
fn a_scatter_add_of_no_picks_leaves_the_tensor_as_it_is() -> Result<()> {
    let base = Tensor::randn([9, 13], 61)?;
    let want = values(&base)?;
    let empty = [
        base,
        Tensor::from_vec(Vec::<i64>::new(), [9, 0])?,
        Tensor::zeros([9, 0], DType::F32)?,
    ];
    check(
        "scatter_add of [9, 0]",
        &empty,
        |t| t[0].scatter_add(1, &t[1], &t[2]),
        DType::F32,
        &[9, 13],
        &want,
    )
}

#[test]
fn a_one_element_gradient_kernel_stores_no_scalar_beside_it() -> Result<()> {
    // The gradient of a one-row table is a one-element scatter kernel, and
    // `t + 1` a one-element value of the inputs alone, which fusion stores
    // beside an earlier one-element kernel where it can: never a scatter's.
    let specs = [
        TensorType::new(DType::F32, [1]),
        TensorType::new(DType::I32, [3]),
        TensorType::new(DType::F32, [3]),
        TensorType::new(DType::F32, Vec::<usize>::new()),
    ];
    let mut graph = kiln::compile("one_row", &specs, |t| {
        let loss = (t[0].index_select(0, &t[1])? * &t[2])?.sum_all()?;
        let dtable = kiln::grad(&loss, &[&t[0]])?.remove(0);
        Ok(vec![dtable, (&t[3] + 1.0f32)?])
    })?;
    let inputs = [
        Tensor::from_vec(vec![0.5f32], [1])?,
        Tensor::from_vec(vec![0i32, -1, 1], [3])?,
        Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [3])?,
        Tensor::scalar(7.0f32),
    ];
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let out = graph.call(&refs)?;
    assert_eq!(
        values(&out[0])?,
        [3.0],
        "0 and -1 pick the row, 1 is outside"
    );
    assert_eq!(values(&out[1])?, [8.0]);
    Ok(())
}

#[test]
fn a_step_whose_new_state_is_a_scatter_writes_it_in_place() -> Result<()> {
    let table = Tensor::randn([7, 3], 71)?;
    let specs = [
        TensorType::new(DType::I32, [4]),
        TensorType::new(DType::F32, [4, 3]),
    ];
    // The old table is read (its sum, an output), then the scatter that
    // computes the new one writes over it.
    let mut step = kiln::compile_step("scatter_state", &[&table], &specs, |s, args| {
        let loss = (s[0].index_select(0, &args[0])? * &args[1])?.sum_all()?;
        Ok((vec![s[0].sum_all()?], kiln::grad(&loss, &[&s[0]])?))
    })?;
    let ids = Tensor::from_vec(vec![6i32, 0, 6, -7], [4])?;
    let w = Tensor::randn([4, 3], 72)?;
    step.call(&[&ids, &w])?;
    assert!(
        step.in_place().iter().all(|&b| b),
        "the scatter writes over the table"
    );
    let ws = values(&w)?;
    let mut want = vec![0.0; 21];
    for (k, row) in [6usize, 0, 6, 0].into_iter().enumerate() {
        for c in 0..3 {
            want[row * 3 + c] += ws[k * 3 + c];
        }
    }
    let got = values(&step.state()?[0])?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-6, "element {i}: got {g}, want {w}");
    }
    Ok(())
}
