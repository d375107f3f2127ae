//! The CNN of `examples/train_cnn.rs`, for the benchmark that times its
//! training step and the test that checks it learns.

use kiln::nn::{BatchNorm2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d, Relu, Sequential};
use kiln::{Pool2d, Result};

/// 28x28 digits -> a 5x5 convolution to 16 channels, batch norm, ReLU, 2x2
/// max pooling -> the same to 32 channels -> dropout of a quarter -> a
/// linear layer to 10 classes; seeded as the example seeds it.
pub fn network() -> Result<Sequential> {
    let pool = MaxPool2d(Pool2d::new([2, 2]));
    Ok(Sequential::new(vec![
        Box::new(Conv2d::new(1, 16, [5, 5], 0)?),
        Box::new(BatchNorm2d::new(16)?),
        Box::new(Relu),
        Box::new(pool),
        Box::new(Conv2d::new(16, 32, [5, 5], 1)?),
        Box::new(BatchNorm2d::new(32)?),
        Box::new(Relu),
        Box::new(pool),
        Box::new(Flatten),
        Box::new(Dropout::new(0.25, 3)?),
        Box::new(Linear::new(32 * 4 * 4, 10, 2)?),
    ]))
}
