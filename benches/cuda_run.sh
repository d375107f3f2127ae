#!/usr/bin/env bash
# The CUDA backend's GPU acceptance in one sitting: every op and fusion kind
# against the interpreter on GPU 0 (tests/cpu.rs and tests/cpu_products.rs,
# on tensors that live on the device), the device tests and the
# device-resident values' traffic (tests/cuda_resident.rs), then the index
# ops and their gradients (tests/index.rs, tests/scatter.rs), joins and
# random numbers (tests/join.rs, tests/random.rs: Threefry in CUDA C
# against the interpreter's bits), then
# `bench_report --backend cuda` and PyTorch on the same workloads.
#
#   benches/cuda_run.sh DIR [OUT]
#
# DIR holds binaries built with `--features cuda` (a GPU machine needs no Rust
# toolchain): `cpu`, `cpu_products`, `cuda_device`, `cuda_resident`, `index`,
# `scatter`, `join` and `random` (from `cargo test --release --features cuda
# --no-run`) and
# `bench_report`. Logs and JSON lines go to OUT.
set -uo pipefail
bin=$1
out=${2:-target/cuda-run}
mkdir -p "$out"
# libnvrtc, libcublas and libcublasLt from PyTorch's CUDA 13 wheels.
lib=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))')
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
status=0
KILN_TEST_DEVICE=cuda:0 "$bin/cpu" 2>&1 | tee "$out/tests-cpu.log" || status=1
KILN_TEST_DEVICE=cuda:0 "$bin/cpu_products" 2>&1 | tee "$out/tests-cpu_products.log" || status=1
"$bin/cuda_device" --nocapture 2>&1 | tee "$out/tests-cuda_device.log" || status=1
"$bin/cuda_resident" --nocapture 2>&1 | tee "$out/tests-cuda_resident.log" || status=1
# A hang (argmax's, before af60286) must not cost the benchmarks below.
KILN_TEST_DEVICE=cuda:0 timeout 600 "$bin/index" 2>&1 | tee "$out/tests-index.log" || status=1
KILN_TEST_DEVICE=cuda:0 timeout 300 "$bin/scatter" 2>&1 | tee "$out/tests-scatter.log" || status=1
KILN_TEST_DEVICE=cuda:0 timeout 120 "$bin/join" 2>&1 | tee "$out/tests-join.log" || status=1
KILN_TEST_DEVICE=cuda:0 timeout 120 "$bin/random" 2>&1 | tee "$out/tests-random.log" || status=1
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    "$bin/bench_report" --backend cuda >"$out/kiln.jsonl" || status=1
    "$bin/bench_report" --backend cuda-f32 --workload matmul --workload matmul_bias_relu \
        >"$out/kiln-f32.jsonl" || status=1
    PYTHONUNBUFFERED=1 python3 benches/cuda_anchor.py >"$out/torch.jsonl" || status=1
fi
exit $status
