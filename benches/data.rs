//! The data loader against a plain memcpy of the same bytes: epochs of
//! batches from a 1 GiB `.npy` (262,144 rows of 4 KiB), sequential and
//! shuffled, and `copy_from_slice` of the mapped file in 1 MiB pieces, in
//! one run so that their ratio is what counts. The file is written once into
//! `target/kiln-cache`.

// criterion_group! defines a public function that cannot carry a doc comment.
#![allow(missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kiln::data::npy::{NpyArray, NpyDType, write_npy};
use kiln::data::{ArrayDataset, DataLoader, LoaderOptions};

const ROWS: usize = 262_144;
const ROW: usize = 4096;
const BATCH: usize = 256;

fn file() -> PathBuf {
    let dir = PathBuf::from("target/kiln-cache/bench");
    let path = dir.join("gib.npy");
    if NpyArray::open(&path).is_err() {
        std::fs::create_dir_all(&dir).expect("the cache folder is writable");
        let data: Vec<u8> = (0..ROWS * ROW).map(|i| (i % 251) as u8).collect();
        write_npy(&path, NpyDType::U8, &[ROWS, ROW], &data).expect("the file is written");
    }
    path
}

fn bench(c: &mut Criterion) {
    let path = file();
    let mut group = c.benchmark_group("data/cpu");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .throughput(Throughput::Bytes((ROWS * ROW) as u64));
    let array = NpyArray::open(&path).expect("the file maps");
    let mut sink = vec![0u8; BATCH * ROW];
    group.bench_function("memcpy", |b| {
        b.iter(|| {
            for piece in array.bytes().chunks(BATCH * ROW) {
                sink[..piece.len()].copy_from_slice(piece);
            }
            sink[0]
        })
    });
    for (id, shuffle) in [("sequential", None), ("shuffled", Some(1))] {
        let dataset = Arc::new(ArrayDataset::npy(&path).expect("the file maps"));
        let options = LoaderOptions {
            batch_size: BATCH,
            shuffle,
            workers: 2,
            prefetch: 4,
            ..LoaderOptions::default()
        };
        let mut loader = DataLoader::new(dataset, options).expect("valid options");
        let mut epoch = 0;
        group.bench_function(id, |b| {
            b.iter(|| {
                epoch += 1;
                loader
                    .epoch(epoch)
                    .map(|batch| batch.map(|b| b.items.len()))
                    .sum::<Result<usize, _>>()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
