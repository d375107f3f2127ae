//! Every user mistake is an `Err` whose message names the op and the shapes
//! or types involved, returned when the op is recorded, never a panic.

use kiln::{DType, Result, Tensor};

fn message(result: Result<Tensor>) -> String {
    match result {
        Ok(t) => panic!("expected an error, got {t:?}"),
        Err(e) => e.to_string(),
    }
}

fn ones(shape: &[usize]) -> Tensor {
    Tensor::ones(shape, DType::F32).expect("a small shape is valid")
}

#[test]
fn shapes_that_do_not_broadcast() {
    assert_eq!(
        message(&ones(&[2, 3]) + &ones(&[4, 3])),
        "add: shapes [2, 3] and [4, 3] do not broadcast"
    );
    assert_eq!(
        message(ones(&[3]).mul(&ones(&[2]))),
        "mul: shapes [3] and [2] do not broadcast"
    );
    assert_eq!(
        message(ones(&[2, 3]).lt(&ones(&[3, 2, 2]))),
        "lt: shapes [2, 3] and [3, 2, 2] do not broadcast"
    );
    let cond = ones(&[2]).gt(&Tensor::scalar(0.0f32)).unwrap();
    assert_eq!(
        message(cond.where_cond(&ones(&[3]), &ones(&[3]))),
        "where: shapes [2] and [3] do not broadcast"
    );
}

#[test]
fn bad_axes() {
    let x = ones(&[2, 3]);
    assert_eq!(
        message(x.sum(&[2], false)),
        "sum: axis 2 is out of range for rank 2"
    );
    assert_eq!(
        message(x.max(&[-3], true)),
        "max: axis -3 is out of range for rank 2"
    );
    assert_eq!(
        message(x.mean(&[0, 5], false)),
        "sum: axis 5 is out of range for rank 2"
    );
    assert_eq!(
        message(x.sum(&[1, -1], false)),
        "sum: axis 1 is named twice"
    );
    assert_eq!(
        message(x.transpose(0, 2)),
        "transpose: axis 2 is out of range for rank 2"
    );
    assert_eq!(
        message(x.softmax(2)),
        "max: axis 2 is out of range for rank 2"
    );
    assert_eq!(
        message(x.slice(-3, 0, 1, 1)),
        "slice: axis -3 is out of range for rank 2"
    );
    assert_eq!(
        message(x.unsqueeze(4)),
        "unsqueeze: axis 4 is out of range for rank 3"
    );
    assert_eq!(
        message(ones(&[2, 0]).max(&[1], false)),
        "max: cannot reduce axis 1 of shape [2, 0]: it is empty"
    );
}

#[test]
fn matmul_dimensions() {
    assert_eq!(
        message(ones(&[2, 3]).matmul(&ones(&[4, 5]))),
        "matmul: shapes [2, 3] and [4, 5] do not fit (need [.., m, k] @ [.., k, n])"
    );
    assert_eq!(
        message(ones(&[2, 2, 3]).matmul(&ones(&[3, 3, 4]))),
        "matmul: shapes [2, 2, 3] and [3, 3, 4] do not fit (need [.., m, k] @ [.., k, n])"
    );
    assert_eq!(
        message(ones(&[3]).matmul(&ones(&[4]))),
        "matmul: shapes [3] and [4] do not fit (need [.., m, k] @ [.., k, n])"
    );
    assert_eq!(
        message(Tensor::scalar(1.0f32).matmul(&ones(&[1, 1]))),
        "matmul: shapes [] and [1, 1] do not fit (need [.., m, k] @ [.., k, n])"
    );
    let bytes = Tensor::ones([2, 2], DType::U8).unwrap();
    assert_eq!(
        message(bytes.matmul(&bytes)),
        "matmul: expected f32, f64, bf16, f16, i32 or i64, got u8"
    );
    let wide = Tensor::ones([2, 2], DType::F64).unwrap();
    assert_eq!(
        message(wide.matmul(&ones(&[2, 2]))),
        "matmul: dtypes f64 and f32 differ (cast one of them first)"
    );
}

#[test]
fn dtypes() {
    let f = ones(&[2]);
    let i = Tensor::ones([2], DType::I32).unwrap();
    assert_eq!(
        message(&f + &i),
        "add: dtypes f32 and i32 differ (cast one of them first)"
    );
    assert_eq!(
        message(&i + 1.5f32),
        "add: dtypes i32 and f32 differ (cast one of them first)"
    );
    assert_eq!(message(i.exp()), "exp: expected a float type, got i32");
    assert_eq!(message(i.div(&i)), "div: expected a float type, got i32");
    assert_eq!(
        message(Tensor::ones([2], DType::U8).unwrap().neg()),
        "neg: expected a signed number type, got u8"
    );
    assert_eq!(
        message(Tensor::ones([2], DType::U8).unwrap().sum(&[0], false)),
        "sum: expected a signed number type, got u8"
    );
    assert_eq!(
        message(i.mean(&[0], false)),
        "mean: expected a float type, got i32"
    );
    assert_eq!(
        message(f.where_cond(&f, &f)),
        "where: expected bool, got f32"
    );
    assert_eq!(
        message(f.pad(&[(1, 1)], 0i32)),
        "pad: dtypes f32 and i32 differ (cast one of them first)"
    );
    assert_eq!(
        message(f.to_vec::<i32>().map(|_| f.clone())),
        "to_vec: the tensor holds f32, not i32"
    );
}

#[test]
fn movement() {
    let x = ones(&[2, 3]);
    assert_eq!(
        message(x.reshape([4, 2])),
        "reshape: cannot reshape [2, 3] (6 elements) to [4, 2] (8 elements)"
    );
    assert_eq!(
        message(x.permute(&[1, 1])),
        "permute: [1, 1] is not a permutation of the axes of [2, 3]"
    );
    assert_eq!(
        message(x.permute(&[0])),
        "permute: [0] is not a permutation of the axes of [2, 3]"
    );
    assert_eq!(
        message(x.expand([4, 3])),
        "expand: shape [2, 3] does not broadcast to [4, 3]"
    );
    assert_eq!(
        message(x.expand([3])),
        "expand: shape [2, 3] does not broadcast to [3]"
    );
    assert_eq!(
        message(x.slice(1, 2, 5, 1)),
        "slice: range 2..5 step 1 is out of bounds for axis 1 of shape [2, 3]"
    );
    assert_eq!(
        message(x.slice(0, 2, 1, 1)),
        "slice: range 2..1 step 1 is out of bounds for axis 0 of shape [2, 3]"
    );
    assert_eq!(
        message(x.slice(0, 0, 2, 0)),
        "slice: range 0..2 step 0 is out of bounds for axis 0 of shape [2, 3]"
    );
    assert_eq!(
        message(x.pad(&[(1, 1)], 0.0f32)),
        "pad: 1 per-axis entries given for shape [2, 3]"
    );
}

#[test]
fn data_and_reads() {
    assert_eq!(
        message(Tensor::from_vec(vec![1.0f32; 5], [2, 3])),
        "from_vec: 5 values do not fill shape [2, 3] (6 elements)"
    );
    assert_eq!(
        message(Tensor::from_slice(&[1u8, 2], [3])),
        "from_slice: 2 values do not fill shape [3] (3 elements)"
    );
    let x = ones(&[2, 2]);
    let err = x.to_scalar::<f32>().unwrap_err().to_string();
    assert_eq!(err, "to_scalar: shape [2, 2] holds 4 elements, not 1");
    let err = x
        .sum_all()
        .unwrap()
        .to_scalar::<i32>()
        .unwrap_err()
        .to_string();
    assert_eq!(err, "to_scalar: the tensor holds f32, not i32");
}

#[test]
fn composites_check_their_arguments() {
    let logits = ones(&[4, 3]);
    let targets = Tensor::from_vec(vec![0i32, 1, 2, 0], [4]).unwrap();
    assert_eq!(
        message(ones(&[3]).cross_entropy(&targets)),
        "cross_entropy: expected a tensor of rank 2, got shape [3]"
    );
    assert_eq!(
        message(logits.cross_entropy(&ones(&[4]))),
        "cross_entropy: expected i32 class indices, got f32"
    );
    assert_eq!(
        message(logits.cross_entropy(&Tensor::arange(0, 3))),
        "cross_entropy: shapes [4, 3] and [3] differ"
    );
    assert_eq!(
        message(logits.layer_norm(&ones(&[4]), &ones(&[3]), 1e-5)),
        "layer_norm: shapes [4, 3] and [4] differ"
    );
    assert_eq!(
        message(logits.mse_loss(&ones(&[2]))),
        "mse_loss: shapes [4, 3] and [2] differ"
    );
    // Shapes that would broadcast, [4, 1] against [4] to [4, 4], are a
    // mistake too.
    assert_eq!(
        message(ones(&[4, 1]).mse_loss(&ones(&[4]))),
        "mse_loss: shapes [4, 1] and [4] differ"
    );
}

#[test]
fn shapes_too_large_to_address() {
    assert_eq!(
        message(Tensor::zeros([1 << 40, 1 << 40], DType::F32)),
        "expand: the result of shape [1099511627776, 1099511627776] is too large to address"
    );
    assert_eq!(
        message(ones(&[2]).pad(&[(usize::MAX, 0)], 0.0f32)),
        "pad: the result of shape [2] is too large to address"
    );
    assert_eq!(
        message(ones(&[2]).expand([1 << 62, 2])),
        "expand: the result of shape [4611686018427387904, 2] is too large to address"
    );
    let err = Tensor::from_vec(vec![0u8; 4], [1 << 32, 1 << 32]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "from_vec: the result of shape [4294967296, 4294967296] is too large to address"
    );
}

#[test]
fn random_tensors_too_large_to_address() {
    assert_eq!(
        message(Tensor::randn([1 << 62, 4], 0)),
        "randn: the result of shape [4611686018427387904, 4] is too large to address"
    );
    assert_eq!(
        message(Tensor::rand([usize::MAX, 2], 0)),
        "rand: the result of shape [18446744073709551615, 2] is too large to address"
    );
}
