//! The data loader against a plain memcpy of the same bytes: epochs of
//! batches from a 1 GiB `.npy` (262,144 rows of 4 KiB), and
//! `copy_from_slice` of the mapped file in 1 MiB pieces, in one run so that
//! their ratio is what counts. Sequential batches are views of the file
//! (`sequential`), so they are also measured gathered into buffers as any
//! batch of a dataset that cannot be viewed is (`sequential_copied`);
//! shuffled batches are always gathered. The file is written once into
//! `target/kiln-cache`.
//!
//! Then an MLP's epoch (`kiln_support::mlp_epoch`): the compiled MLP fed by the loader, against
//! the same compiled graph over the same batches already in memory.

// criterion_group! defines a public function that cannot carry a doc comment.
#![allow(missing_docs)]

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kiln::data::npy::{NpyArray, NpyDType, write_npy};
use kiln::data::{ArrayDataset, DataError, DataLoader, Dataset, LoaderOptions, Mapped};
use kiln::{Data, DataRef, TensorType};
use kiln_support::mlp_epoch;

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

/// A dataset whose rows are always read into buffers.
struct Copied(ArrayDataset);

impl Dataset for Copied {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn fields(&self) -> Vec<TensorType> {
        self.0.fields()
    }

    fn read(&self, index: usize, field: usize, out: &mut [u8]) -> Result<(), DataError> {
        self.0.read(index, field, out)
    }

    fn mapped(&self, _: usize, _: Range<usize>) -> Option<Mapped> {
        None
    }
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
    for (id, shuffle, viewed) in [
        ("sequential", None, true),
        ("sequential_copied", None, false),
        ("shuffled", Some(1), true),
    ] {
        let array = ArrayDataset::npy(&path).expect("the file maps");
        let dataset: Arc<dyn Dataset> = if viewed {
            Arc::new(array)
        } else {
            Arc::new(Copied(array))
        };
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

/// Epoch pairs timed for the epoch comparison.
const PAIRS: usize = 15;

/// An MLP's epoch fed by the loader against the same compiled graph
/// over the same batches held in memory. The two run in alternating pairs,
/// each pair in alternating order, and the ratio is taken per pair: on a
/// shared machine whose speed drifts, timing one variant for seconds and
/// then the other would compare the drift. Prints the medians and the
/// quartiles of the per-pair ratio.
fn mlp_epoch(_: &mut Criterion) {
    let (images, labels) = mlp_epoch::dataset(&PathBuf::from("target/kiln-cache/mlp_epoch"))
        .expect("the dataset is written");
    let layers = mlp_epoch::layers().expect("the layers build");
    let mut graph = mlp_epoch::compiled(&layers, true).expect("the graph compiles");
    let mut logits = graph.output_buffers().expect("output buffers");
    let mut loader = mlp_epoch::loader(&images, &labels).expect("the dataset maps");
    let held: Vec<Data> = loader
        .epoch(0)
        .map(|b| b.map(|b| b.fields[0].data().to_data()))
        .collect::<Result<_, _>>()
        .expect("the epoch reads");
    let mut in_memory = || {
        let t = Instant::now();
        for batch in &held {
            graph
                .run_into(&[DataRef::from(batch)], &mut logits)
                .expect("the graph runs");
        }
        t.elapsed().as_secs_f64()
    };
    let mut graph = mlp_epoch::compiled(&layers, true).expect("the graph compiles");
    let mut logits = graph.output_buffers().expect("output buffers");
    let mut from_loader = || {
        let t = Instant::now();
        let mut epoch = loader.epoch(0);
        while let Some(batch) = epoch.next() {
            let batch = batch.expect("the batch reads");
            graph
                .run_into(&[batch.fields[0].data()], &mut logits)
                .expect("the graph runs");
            epoch.recycle(batch);
        }
        t.elapsed().as_secs_f64()
    };
    // Warm-up: caches, page tables, the worker threads.
    in_memory();
    from_loader();
    let (mut memory, mut loaded, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for pair in 0..PAIRS {
        let (m, l) = if pair % 2 == 0 {
            let m = in_memory();
            (m, from_loader())
        } else {
            let l = from_loader();
            (in_memory(), l)
        };
        memory.push(m);
        loaded.push(l);
        ratios.push(l / m);
    }
    for v in [&mut memory, &mut loaded, &mut ratios] {
        v.sort_by(f64::total_cmp);
    }
    let q = |v: &[f64], f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
    println!(
        "data/mlp_epoch: in memory {:.1} ms, loader {:.1} ms (medians of {PAIRS}); loader / in memory per pair: median {:.3}, quartiles {:.3}..{:.3}",
        q(&memory, 0.5) * 1e3,
        q(&loaded, 0.5) * 1e3,
        q(&ratios, 0.5),
        q(&ratios, 0.25),
        q(&ratios, 0.75),
    );
}

criterion_group!(benches, bench, mlp_epoch);
criterion_main!(benches);
