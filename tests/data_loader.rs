//! The data loader: order is a pure function of (seed, epoch) whatever the
//! number of workers, epochs resume exactly, shards are disjoint and cover
//! the dataset, corrupt items fail or are skipped as asked, a panicking
//! dataset is an `Err`, dropping a loader mid-epoch ends its threads,
//! `.npy` files zip into (features, labels) batches with their values, and
//! an epoch's batches come as tensors on a device in order, each error in
//! its batch's place, and the next epoch's first batches are read while
//! one ends and taken up by it, the first of them through the feed the
//! loader keeps.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kiln::data::npy::{NpyDType, write_npy};
use kiln::data::{
    ArrayDataset, Batch, DataError, DataLoader, Dataset, Field, LoaderOptions, OnError, Zip,
};
use kiln::{DType, Data, DataRef, Device, TensorType};

/// Item `i` is the i32 `i`; items listed in `bad` cannot be read; reading
/// item `panic_at` panics; each read sleeps `delay`; `reads` counts them.
struct Counting {
    len: usize,
    bad: Vec<usize>,
    panic_at: Option<usize>,
    delay: Duration,
    reads: Arc<AtomicUsize>,
}

impl Counting {
    fn new(len: usize) -> Counting {
        Counting {
            len,
            bad: Vec::new(),
            panic_at: None,
            delay: Duration::ZERO,
            reads: Arc::default(),
        }
    }
}

impl Dataset for Counting {
    fn len(&self) -> usize {
        self.len
    }

    fn fields(&self) -> Vec<TensorType> {
        vec![TensorType::new(DType::I32, [])]
    }

    fn read(&self, index: usize, _: usize, out: &mut [u8]) -> Result<(), DataError> {
        std::thread::sleep(self.delay);
        self.reads.fetch_add(1, Ordering::SeqCst);
        assert!(
            self.panic_at != Some(index),
            "transform failed on item {index}"
        );
        if self.bad.contains(&index) {
            return Err(DataError::Item {
                path: PathBuf::from("counting.bin"),
                index,
                message: "corrupt".into(),
            });
        }
        out.copy_from_slice(&(index as i32).to_le_bytes());
        Ok(())
    }
}

fn loader(dataset: Counting, options: LoaderOptions) -> DataLoader {
    DataLoader::new(Arc::new(dataset), options).expect("valid options")
}

/// The items of every batch of an epoch, checking each batch's data.
fn epoch_items(l: &mut DataLoader, epoch: u64, start: usize) -> Vec<Vec<usize>> {
    l.epoch_from(epoch, start)
        .map(|b| {
            let b: Batch = b.expect("the batch reads");
            let values: Vec<usize> = match b.fields[0].data() {
                DataRef::I32(v) => v.iter().map(|&x| x as usize).collect(),
                other => panic!("unexpected {other:?}"),
            };
            assert_eq!(values, b.items, "batch {} holds its items", b.index);
            b.items
        })
        .collect()
}

fn shuffled(workers: usize) -> LoaderOptions {
    LoaderOptions {
        batch_size: 7,
        shuffle: Some(42),
        workers,
        ..LoaderOptions::default()
    }
}

#[test]
fn the_order_does_not_depend_on_workers_and_changes_each_epoch() {
    let runs: Vec<Vec<Vec<usize>>> = [0, 1, 4]
        .iter()
        .map(|&w| epoch_items(&mut loader(Counting::new(100), shuffled(w)), 3, 0))
        .collect();
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
    let mut all: Vec<usize> = runs[0].concat();
    all.sort();
    assert_eq!(
        all,
        (0..100).collect::<Vec<_>>(),
        "an epoch is a permutation"
    );
    assert_eq!(
        runs[0].len(),
        15,
        "100 items in batches of 7, the last one short"
    );
    let mut l = loader(Counting::new(100), shuffled(2));
    assert_ne!(
        epoch_items(&mut l, 3, 0),
        epoch_items(&mut l, 4, 0),
        "a fresh order each epoch"
    );
    let unshuffled = epoch_items(
        &mut loader(
            Counting::new(10),
            LoaderOptions {
                batch_size: 4,
                ..LoaderOptions::default()
            },
        ),
        0,
        0,
    );
    assert_eq!(unshuffled, [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    let dropped = LoaderOptions {
        batch_size: 4,
        drop_last: true,
        ..LoaderOptions::default()
    };
    assert_eq!(
        epoch_items(&mut loader(Counting::new(10), dropped), 0, 0).len(),
        2
    );
}

#[test]
fn an_epoch_resumes_exactly_where_it_stopped() {
    let mut l = loader(Counting::new(100), shuffled(3));
    let whole = epoch_items(&mut l, 5, 0);
    // Abandon an epoch after two batches, with more in flight, then resume another.
    let mut partial = l.epoch(5);
    assert!(partial.next().is_some() && partial.next().is_some());
    drop(partial);
    assert_eq!(epoch_items(&mut l, 5, 6), whole[6..].to_vec());
    assert!(epoch_items(&mut l, 5, 99).is_empty());
}

#[test]
fn the_next_epoch_is_read_while_one_ends_and_taken_up_by_it() {
    let fresh = |e| epoch_items(&mut loader(Counting::new(100), shuffled(2)), e, 0);
    // Epochs in a row take up what was read ahead for them: their batches
    // are what a fresh loader gives.
    let mut l = loader(Counting::new(100), shuffled(2));
    for e in 0..3 {
        assert_eq!(epoch_items(&mut l, e, 0), fresh(e), "epoch {e}");
    }
    // A guess not taken up is dropped: another epoch, one resumed, and
    // the same epoch again from its start.
    assert_eq!(epoch_items(&mut l, 7, 0), fresh(7));
    assert_eq!(epoch_items(&mut l, 8, 3), fresh(8)[3..].to_vec());
    assert_eq!(epoch_items(&mut l, 8, 0), fresh(8));
    // After epoch 0 the workers read on, before epoch 1 is asked for: at
    // least its first batch of 7.
    let counting = Counting::new(100);
    let reads = counting.reads.clone();
    let mut l = loader(counting, shuffled(2));
    epoch_items(&mut l, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while reads.load(Ordering::SeqCst) < 107 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(reads.load(Ordering::SeqCst) >= 107, "epoch 1 is read ahead");
    // Epoch 1 reads only what was not read ahead: 200 reads for two
    // epochs, then the 4 batches (the prefetch) of epoch 2 read ahead,
    // 228 once the workers are done; reading epoch 1's first batches again
    // would make it 256.
    epoch_items(&mut l, 1, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while reads.load(Ordering::SeqCst) < 228 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(reads.load(Ordering::SeqCst), 228);
}

#[test]
fn shards_are_disjoint_and_cover_the_dataset() {
    let world = 3;
    let mut seen: Vec<usize> = (0..world)
        .flat_map(|rank| {
            let options = LoaderOptions {
                shard: (rank, world),
                ..shuffled(1)
            };
            epoch_items(&mut loader(Counting::new(50), options), 1, 0).concat()
        })
        .collect();
    seen.sort();
    assert_eq!(seen, (0..50).collect::<Vec<_>>());
    let bad = LoaderOptions {
        shard: (3, 3),
        ..LoaderOptions::default()
    };
    assert!(DataLoader::new(Arc::new(Counting::new(5)), bad).is_err());
}

#[test]
fn corrupt_items_fail_their_batch_or_are_skipped() {
    let mut data = Counting::new(20);
    data.bad = vec![5, 13];
    let options = LoaderOptions {
        batch_size: 4,
        workers: 2,
        ..LoaderOptions::default()
    };
    let mut l = loader(data, options);
    let results: Vec<_> = l.epoch(0).collect();
    assert_eq!(
        results[1].as_ref().err().map(|e| e.to_string()).as_deref(),
        Some("counting.bin: item 5: corrupt")
    );
    assert!(results[0].is_ok() && results[2].is_ok());
    let mut data = Counting::new(20);
    data.bad = vec![5, 13];
    let mut l = loader(
        data,
        LoaderOptions {
            on_error: OnError::Skip,
            ..options
        },
    );
    let batches: Vec<Batch> = l
        .epoch(0)
        .map(|b| b.expect("skipping never fails"))
        .collect();
    assert_eq!(batches.iter().map(|b| b.skipped).sum::<usize>(), 2);
    assert_eq!(batches[1].items, [4, 6, 7]);
}

#[test]
fn batches_on_a_device_hold_each_batch_in_order_errors_in_their_place() -> kiln::Result<()> {
    for device in [Device::Cpu, Device::Reference] {
        // 23 items in batches of 5: the last holds 3; item 5 fails batch 1,
        // item 13 is left out of batch 2 where skipping.
        for on_error in [OnError::Fail, OnError::Skip] {
            let mut data = Counting::new(23);
            data.bad = vec![5, 13];
            let options = LoaderOptions {
                batch_size: 5,
                shuffle: Some(3),
                on_error,
                ..LoaderOptions::default()
            };
            let mut l = loader(data, options);
            let want: Vec<Result<Vec<i32>, String>> = (l.epoch(0))
                .map(|b| match b {
                    Ok(b) => Ok(b.items.iter().map(|&i| i as i32).collect()),
                    Err(e) => Err(e.to_string()),
                })
                .collect();
            let got: Vec<Result<Vec<i32>, String>> = (l.epoch(0).to_device(device)?)
                .map(|b| match b {
                    Ok(t) => {
                        assert_eq!((t.len(), t[0].device()), (1, device));
                        t[0].to_vec::<i32>().map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                })
                .collect();
            assert_eq!(got, want, "{device:?}, {on_error:?}");
            assert_eq!(
                want.iter().filter(|b| b.is_err()).count(),
                match on_error {
                    OnError::Fail => 2,
                    OnError::Skip => 0,
                }
            );
        }
    }
    Ok(())
}

/// The items of each batch of `epoch` moved to `device`, or where the
/// loop breaks after `stop` batches, its first `stop`.
fn fed_items(l: &mut DataLoader, epoch: u64, device: Device, stop: usize) -> Vec<Vec<i32>> {
    let fed = l.epoch(epoch).to_device(device).expect("a feed");
    (fed.take(stop))
        .map(|b| {
            b.and_then(|t| t[0].to_vec::<i32>())
                .expect("the batch reads")
        })
        .collect()
}

#[test]
fn a_kept_feed_hands_each_epoch_its_own_batches() {
    let as_i32 = |batches: Vec<Vec<usize>>| -> Vec<Vec<i32>> {
        (batches.into_iter())
            .map(|b| b.into_iter().map(|i| i as i32).collect())
            .collect()
    };
    let fresh = |e| {
        as_i32(epoch_items(
            &mut loader(Counting::new(40), shuffled(2)),
            e,
            0,
        ))
    };
    let mut l = loader(Counting::new(40), shuffled(2));
    let all = usize::MAX;
    // Epochs in a row: each takes up the first batch its predecessor put
    // into the feed.
    for e in 0..3 {
        assert_eq!(
            fed_items(&mut l, e, Device::Cpu, all),
            fresh(e),
            "epoch {e}"
        );
    }
    // The first batch put for the next epoch is dropped where another
    // epoch runs (5 after 2, 7 after 6), where the next runs on the host
    // (6 after 5) or on another device (8 after 7); a loop that stops early
    // (9) puts nothing ahead.
    assert_eq!(fed_items(&mut l, 5, Device::Cpu, all), fresh(5));
    assert_eq!(as_i32(epoch_items(&mut l, 6, 0)), fresh(6));
    assert_eq!(fed_items(&mut l, 7, Device::Cpu, all), fresh(7));
    assert_eq!(fed_items(&mut l, 8, Device::Reference, all), fresh(8));
    assert_eq!(fed_items(&mut l, 9, Device::Cpu, 2), fresh(9)[..2].to_vec());
    assert_eq!(fed_items(&mut l, 10, Device::Cpu, all), fresh(10));
    // Epoch 12 resumed at batch 1 (after 11), and epoch 14 from its start
    // after a batch read on the host (after 13): neither takes up the batch
    // put for it.
    assert_eq!(fed_items(&mut l, 11, Device::Cpu, all), fresh(11));
    let resumed: Vec<Vec<usize>> = l
        .epoch_from(12, 1)
        .map(|b| b.expect("reads").items)
        .collect();
    assert_eq!(as_i32(resumed), fresh(12)[1..].to_vec());
    assert_eq!(fed_items(&mut l, 13, Device::Cpu, all), fresh(13));
    let mut epoch = l.epoch(14);
    let first = epoch.next().expect("a batch").expect("reads").items;
    let rest: Vec<Vec<i32>> = (epoch.to_device(Device::Cpu).expect("a feed"))
        .map(|b| b.and_then(|t| t[0].to_vec::<i32>()).expect("reads"))
        .collect();
    assert_eq!(as_i32(vec![first]), fresh(14)[..1].to_vec());
    assert_eq!(rest, fresh(14)[1..].to_vec());
}

#[test]
fn the_next_epochs_first_batch_is_read_before_an_epoch_ends() {
    // One worker, 30 ms a read: epoch 0's two batches, then epoch 1's
    // first, read ahead. An epoch on a device hands out its last batch
    // once the next epoch's first is read and put into the feed: 12 reads
    // by then, where a worker only reading ahead would still be at the
    // first items of it.
    let mut data = Counting::new(8);
    data.delay = Duration::from_millis(30);
    let reads = data.reads.clone();
    let options = LoaderOptions {
        batch_size: 4,
        workers: 1,
        ..LoaderOptions::default()
    };
    let mut l = loader(data, options);
    let mut seen = Vec::new();
    for (k, batch) in l
        .epoch(0)
        .to_device(Device::Cpu)
        .expect("a feed")
        .enumerate()
    {
        batch.expect("the batch reads");
        seen.push((k, reads.load(Ordering::SeqCst)));
    }
    let last = seen.last().copied();
    assert!(last.is_some_and(|(k, r)| k == 1 && r >= 12), "{seen:?}");
    assert_eq!(
        fed_items(&mut l, 1, Device::Cpu, usize::MAX),
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    );
}

#[test]
fn a_panic_while_reading_is_an_error_not_a_hang() {
    let mut data = Counting::new(20);
    data.panic_at = Some(9);
    let mut l = loader(
        data,
        LoaderOptions {
            batch_size: 4,
            ..LoaderOptions::default()
        },
    );
    let results: Vec<_> = l.epoch(0).collect();
    let err = results[2].as_ref().err().map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("data loader: batch 2: a worker panicked: transform failed on item 9")
    );
    assert_eq!(results.len(), 5, "the other batches still arrive");
}

#[test]
fn dropping_a_loader_mid_epoch_ends_its_threads_promptly() {
    let mut data = Counting::new(1000);
    data.delay = Duration::from_millis(2);
    let mut l = loader(
        data,
        LoaderOptions {
            batch_size: 10,
            workers: 4,
            prefetch: 8,
            ..LoaderOptions::default()
        },
    );
    let first = l.epoch(0).next();
    assert!(matches!(first, Some(Ok(_))));
    let start = Instant::now();
    drop(l);
    // Each worker finishes at most its current batch: 10 reads of 2 ms.
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "drop took {:?}",
        start.elapsed()
    );
}

#[test]
fn npy_features_and_labels_zip_into_batches() -> Result<(), DataError> {
    let d = std::env::temp_dir().join(format!("kiln-loader-{}", std::process::id()));
    std::fs::create_dir_all(&d).map_err(|e| DataError::Mismatch {
        message: e.to_string(),
    })?;
    let images: Vec<u8> = (0..6 * 4).map(|i| i as u8).collect();
    let labels: Vec<u8> = (0..6i64).flat_map(|i| (i * 10).to_le_bytes()).collect();
    write_npy(&d.join("x.npy"), NpyDType::U8, &[6, 2, 2], &images)?;
    write_npy(&d.join("y.npy"), NpyDType::I64, &[6], &labels)?;
    let zip = Zip::new(vec![
        Box::new(ArrayDataset::npy(d.join("x.npy"))?),
        Box::new(ArrayDataset::npy(d.join("y.npy"))?),
    ])?;
    assert_eq!(
        zip.fields(),
        [
            TensorType::new(DType::U8, [2, 2]),
            TensorType::new(DType::I32, [])
        ]
    );
    let item = zip.get(5)?;
    assert_eq!(item[0].to_vec::<u8>().ok(), Some((20..24).collect()));
    assert_eq!(item[0].dims(), [2, 2]);
    assert_eq!(item[1].to_vec::<i32>().ok(), Some(vec![50]));
    assert!(zip.get(6).is_err(), "item 6 of 6");
    let mut l = DataLoader::new(
        Arc::new(zip),
        LoaderOptions {
            batch_size: 4,
            ..LoaderOptions::default()
        },
    )?;
    let batches: Vec<Batch> = l.epoch(0).collect::<Result<_, _>>()?;
    assert_eq!(
        batches[1].fields[0].data().to_data(),
        Data::U8((16..24).collect())
    );
    assert_eq!(
        batches[1].fields[1].data().to_data(),
        Data::I32(vec![40, 50])
    );
    let metrics = l.metrics();
    assert!(
        metrics.samples_per_second > 0.0 && metrics.batch_latency_p95 >= metrics.batch_latency_p50
    );
    write_npy(&d.join("short.npy"), NpyDType::U8, &[5], &[0; 5])?;
    let mismatched = Zip::new(vec![
        Box::new(ArrayDataset::npy(d.join("x.npy"))?),
        Box::new(ArrayDataset::npy(d.join("short.npy"))?),
    ]);
    assert_eq!(
        mismatched.err().map(|e| e.to_string()).as_deref(),
        Some("zip: datasets of 6 and 5 items")
    );
    Ok(())
}

#[test]
fn safetensors_tensors_are_datasets_too() -> Result<(), DataError> {
    use safetensors::tensor::{Dtype, TensorView};
    let path = std::env::temp_dir().join(format!("kiln-loader-{}.safetensors", std::process::id()));
    let features: Vec<u8> = (0..15)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let labels: Vec<u8> = (0..5i64).flat_map(|i| (i - 2).to_le_bytes()).collect();
    let halves = vec![0u8; 10];
    let views = [
        (
            "x",
            TensorView::new(Dtype::F32, vec![5, 3], &features).expect("a valid view"),
        ),
        (
            "y",
            TensorView::new(Dtype::I64, vec![5], &labels).expect("a valid view"),
        ),
        (
            "h",
            TensorView::new(Dtype::BF16, vec![5], &halves).expect("a valid view"),
        ),
    ];
    safetensors::serialize_to_file(views, None, &path).expect("written");
    let zip = Zip::new(vec![
        Box::new(ArrayDataset::safetensors(&path, "x")?),
        Box::new(ArrayDataset::safetensors(&path, "y")?),
    ])?;
    let mut l = DataLoader::new(
        Arc::new(zip),
        LoaderOptions {
            batch_size: 2,
            ..LoaderOptions::default()
        },
    )?;
    let batches: Vec<Batch> = l.epoch(0).collect::<Result<_, _>>()?;
    assert_eq!(
        batches[1].fields[0].data().to_data(),
        Data::F32(vec![3.0, 3.5, 4.0, 4.5, 5.0, 5.5])
    );
    assert_eq!(batches[1].fields[1].data().to_data(), Data::I32(vec![0, 1]));
    let err = |r: Result<ArrayDataset, DataError>| r.err().map(|e| e.to_string());
    let shown = path.display().to_string();
    assert_eq!(
        err(ArrayDataset::safetensors(&path, "h")),
        Some(format!(
            "{shown}: at byte 0: tensor 'h' has unsupported dtype BF16"
        ))
    );
    assert!(
        err(ArrayDataset::safetensors(&path, "z"))
            .is_some_and(|e| e.starts_with(&format!("{shown}: at byte 0: tensor 'z'")))
    );
    std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json").expect("written");
    assert!(
        err(ArrayDataset::safetensors(&path, "x"))
            .is_some_and(|e| e.contains("not a safetensors file"))
    );
    Ok(())
}

#[test]
fn recycled_batch_buffers_are_filled_again() {
    let mut l = loader(
        Counting::new(40),
        LoaderOptions {
            batch_size: 8,
            workers: 1,
            prefetch: 1,
            ..LoaderOptions::default()
        },
    );
    let mut epoch = l.epoch(0);
    let first = epoch.next().expect("a batch").expect("reads");
    drop(epoch);
    let buffer = match first.fields[0].data() {
        DataRef::I32(v) => v.as_ptr(),
        other => panic!("unexpected {other:?}"),
    };
    l.recycle(first);
    // The next epoch's first batch is read into the recycled buffer, with its own values.
    let again = l.epoch(1).next().expect("a batch").expect("reads");
    match again.fields[0].data() {
        DataRef::I32(v) => {
            assert_eq!(v.as_ptr(), buffer, "the recycled buffer is reused");
            assert_eq!(v, (0..8).collect::<Vec<i32>>());
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn unshuffled_batches_are_views_of_the_mapped_file() -> Result<(), Box<dyn std::error::Error>> {
    let d = std::env::temp_dir().join(format!("kiln-loader-views-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    let values: Vec<f32> = (0..10 * 3).map(|i| i as f32 * 0.25).collect();
    let labels: Vec<u8> = (0..10i64).flat_map(|i| (i * 3).to_le_bytes()).collect();
    write_npy(
        &d.join("x.npy"),
        NpyDType::F32,
        &[10, 3],
        bytemuck::cast_slice(&values),
    )?;
    write_npy(&d.join("y.npy"), NpyDType::I64, &[10], &labels)?;
    let zip = || -> Result<Arc<Zip>, DataError> {
        Ok(Arc::new(Zip::new(vec![
            Box::new(ArrayDataset::npy(d.join("x.npy"))?),
            Box::new(ArrayDataset::npy(d.join("y.npy"))?),
        ])?))
    };
    let options = LoaderOptions {
        batch_size: 4,
        ..LoaderOptions::default()
    };
    // A compiled graph reads the mapped rows in place.
    let mut double = kiln::compile("double", &[TensorType::new(DType::F32, [4, 3])], |x| {
        Ok(vec![(&x[0] * 2.0f32)?])
    })?;
    let mut l = DataLoader::new(zip()?, options)?;
    let batches: Vec<Batch> = l.epoch(0).collect::<Result<_, _>>()?;
    assert_eq!(batches.len(), 3);
    for b in &batches {
        let (lo, hi) = (b.items[0], b.items[0] + b.items.len());
        // f32 rows as stored are views; i64 labels are narrowed, so read.
        assert!(matches!(b.fields[0], Field::Mapped(_)), "batch {}", b.index);
        assert!(matches!(b.fields[1], Field::Owned(_)), "batch {}", b.index);
        assert_eq!(b.fields[0].data(), DataRef::F32(&values[lo * 3..hi * 3]));
        let want: Vec<i32> = (lo as i32..hi as i32).map(|i| i * 3).collect();
        assert_eq!(b.fields[1].data(), DataRef::I32(&want));
    }
    let doubled = double.run(&batches[0].inputs()[..1])?;
    let want: Vec<f32> = values[..12].iter().map(|v| v * 2.0).collect();
    assert_eq!(doubled, [Data::F32(want)]);
    assert!(
        double.run(&batches[2].inputs()[..1]).is_err(),
        "a short last batch is not the compiled shape"
    );
    // Shuffled batches are gathered into buffers.
    let mut l = DataLoader::new(
        zip()?,
        LoaderOptions {
            shuffle: Some(3),
            ..options
        },
    )?;
    for b in l.epoch(0) {
        let b = b?;
        assert!(b.fields.iter().all(|f| matches!(f, Field::Owned(_))));
        let want: Vec<f32> = b
            .items
            .iter()
            .flat_map(|&i| values[i * 3..i * 3 + 3].to_vec())
            .collect();
        assert_eq!(b.fields[0].data(), DataRef::F32(&want));
    }
    // A skipped item cannot be left out of a view: such a batch is read.
    let mut l = DataLoader::new(
        Arc::new(Zip::new(vec![
            Box::new(ArrayDataset::npy(d.join("x.npy"))?),
            Box::new(Counting {
                bad: vec![5],
                ..Counting::new(10)
            }),
        ])?),
        LoaderOptions {
            on_error: OnError::Skip,
            ..options
        },
    )?;
    let batches: Vec<Batch> = l.epoch(0).collect::<Result<_, _>>()?;
    assert!(matches!(batches[0].fields[0], Field::Mapped(_)));
    assert!(matches!(batches[1].fields[0], Field::Owned(_)));
    assert_eq!(batches[1].items, [4, 6, 7]);
    let want: Vec<f32> = [4, 6, 7]
        .iter()
        .flat_map(|&i| values[i * 3..i * 3 + 3].to_vec())
        .collect();
    assert_eq!(batches[1].fields[0].data(), DataRef::F32(&want));
    assert_eq!(batches[1].fields[1].data(), DataRef::I32(&[4, 6, 7]));
    Ok(())
}

/// The nice value of the calling thread, from `/proc/thread-self/stat`.
#[cfg(target_os = "linux")]
fn nice() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesized command name; nice is the 19th field.
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(16)?
        .parse()
        .ok()
}

/// Records the nice value of the thread that reads each item.
#[cfg(target_os = "linux")]
struct NiceProbe(std::sync::Mutex<Vec<Option<i64>>>);

#[cfg(target_os = "linux")]
impl Dataset for NiceProbe {
    fn len(&self) -> usize {
        4
    }

    fn fields(&self) -> Vec<TensorType> {
        vec![TensorType::new(DType::U8, [])]
    }

    fn read(&self, _: usize, _: usize, out: &mut [u8]) -> Result<(), DataError> {
        self.0.lock().expect("not poisoned").push(nice());
        out.fill(0);
        Ok(())
    }
}

#[cfg(target_os = "linux")]
#[test]
fn workers_yield_to_compute() -> Result<(), DataError> {
    let probe = Arc::new(NiceProbe(std::sync::Mutex::new(Vec::new())));
    let options = LoaderOptions {
        batch_size: 2,
        workers: 2,
        ..LoaderOptions::default()
    };
    let mut l = DataLoader::new(probe.clone(), options)?;
    assert_eq!(l.epoch(0).count(), 2);
    // The four items, and any of epoch 1 read ahead by then.
    let seen = probe.0.lock().expect("not poisoned").clone();
    assert!(
        seen.len() >= 4 && seen.iter().all(|n| *n == Some(19)),
        "items are read at the lowest priority: {seen:?}"
    );
    assert_ne!(nice(), Some(19), "the consumer keeps its own priority");
    Ok(())
}
