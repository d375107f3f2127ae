//! The MNIST digits shipped in `data/digits/`: the files load through the
//! data module as the README describes them (5,000 u8 images of 28x28, i32
//! labels, 500 of each class, interleaved so that the last 1,000 hold 100 of
//! each).

use std::path::Path;

use kiln::data::{ArrayDataset, Dataset};
use kiln::{DType, Result, TensorType};

fn digits() -> Result<(ArrayDataset, ArrayDataset)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits");
    Ok((
        ArrayDataset::npy(dir.join("images.npy"))?,
        ArrayDataset::npy(dir.join("labels.npy"))?,
    ))
}

#[test]
fn the_files_hold_5000_digits_of_28x28() -> Result<()> {
    let (images, labels) = digits()?;
    assert_eq!(images.len(), 5000);
    assert_eq!(labels.len(), 5000);
    assert_eq!(images.fields(), [TensorType::new(DType::U8, [28, 28])]);
    assert_eq!(labels.fields(), [TensorType::new(DType::I32, [])]);
    let pixels: Vec<u8> = images.get(3)?[0].to_vec()?;
    assert!(pixels.contains(&255), "a digit has full ink");
    assert!(
        pixels.iter().filter(|&&p| p == 0).count() > 784 / 2,
        "and mostly background"
    );
    Ok(())
}

#[test]
fn the_classes_are_balanced_and_interleaved() -> Result<()> {
    let (_, labels) = digits()?;
    let mut all = [0usize; 10];
    let mut last_thousand = [0usize; 10];
    for i in 0..labels.len() {
        let label: i32 = labels.get(i)?[0].to_scalar()?;
        assert_eq!(label, (i % 10) as i32, "item {i}");
        all[label as usize] += 1;
        if i >= 4000 {
            last_thousand[label as usize] += 1;
        }
    }
    assert_eq!(all, [500; 10]);
    assert_eq!(last_thousand, [100; 10]);
    Ok(())
}

#[test]
fn a_subset_is_a_split_of_the_items() -> Result<()> {
    use kiln::data::Subset;
    use std::sync::Arc;
    let (images, labels) = digits()?;
    let (images, labels): (Arc<dyn Dataset>, Arc<dyn Dataset>) =
        (Arc::new(images), Arc::new(labels));
    let test = Subset::new(labels.clone(), 4000..5000)?;
    assert_eq!(test.len(), 1000);
    assert_eq!(test.get(7)?[0].to_scalar::<i32>()?, 7);
    let train_images = Subset::new(images.clone(), 0..4000)?;
    assert_eq!(
        train_images.get(3999)?[0].to_vec::<u8>()?,
        images.get(3999)?[0].to_vec::<u8>()?
    );
    // Rows read in place through the subset are those of the whole.
    let mapped = Subset::new(images.clone(), 10..20)?.mapped(0, 2..4);
    let whole = images.mapped(0, 12..14);
    assert!(whole.is_some(), "npy rows are read in place");
    assert_eq!(
        mapped.map(|m| m.data().to_data()),
        whole.map(|m| m.data().to_data())
    );
    let err = Subset::new(labels, 4000..5001).err().map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("subset: items 4000..5001 of a dataset of 5000 items")
    );
    assert!(test.get(1000).is_err());
    Ok(())
}
