#!/usr/bin/env python3
"""PyTorch on the GPU beside `bench_report --backend cuda`: the same workloads,
the same seeded-normal f32 inputs, timed the same way
(host clock around one call and a device synchronize, and the device's own
time between CUDA events around it; medians over repeated calls after
warm-up), in torch eager and torch.compile, printed as the same
JSON lines.

    python3 benches/cuda_anchor.py [--quick] [WORKLOAD ...]

With workload ids, only those (and the device copy) are timed.

Matmuls run in TF32, as kiln's default `Precision::Tf32`, and again in IEEE
f32 (variants ending in " f32"), as kiln's `Precision::F32`; `matmul_bf16`
on bf16 operands (PyTorch's default: f32 sums, reduced-precision
reductions allowed).
"""

import json
import statistics
import sys
import time

import torch

QUICK = "--quick" in sys.argv
WANTED = [a for a in sys.argv[1:] if not a.startswith("--")]
DEV = "cuda"


def median_and_spread(samples):
    med = statistics.median(samples)
    return med, statistics.median(abs(s - med) for s in samples)


def timed(f, args, budget_s=1.0, min_reps=7, max_reps=500):
    """(median, spread) of f(*args) on the host clock through a synchronize,
    and the same of the device's own time between events around the call."""
    for _ in range(3):
        f(*args)
    torch.cuda.synchronize()
    budget_s = 0.15 if QUICK else budget_s
    host, device = [], []
    start = time.perf_counter()
    while len(host) < min_reps or (time.perf_counter() - start < budget_s and len(host) < max_reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        begin.record()
        f(*args)
        end.record()
        torch.cuda.synchronize()
        host.append(time.perf_counter() - t)
        device.append(begin.elapsed_time(end) / 1e3)
    return median_and_spread(host), median_and_spread(device)


def emit(workload, shape, variant, timing, nbytes=0, flops=0):
    (median, spread), (device, device_spread) = timing
    print(json.dumps({
        "workload": workload, "shape": shape, "variant": variant, "backend": "cuda",
        "median_s": float(f"{median:.6e}"), "spread_s": float(f"{spread:.3e}"),
        "device_s": float(f"{device:.6e}"), "device_spread_s": float(f"{device_spread:.3e}"),
        "bytes": nbytes, "flops": flops,
    }), flush=True)


def inputs(*shapes):
    g = torch.Generator(device=DEV).manual_seed(1000)
    return [torch.randn(s, generator=g, device=DEV, dtype=torch.float32) for s in shapes]


def wanted(workload):
    return not WANTED or workload in WANTED


def both(workload, shape, f, args, nbytes=0, flops=0, suffix=""):
    if not wanted(workload):
        return
    with torch.no_grad():
        emit(workload, shape, "torch" + suffix, timed(f, args), nbytes, flops)
        emit(workload, shape, "torch.compile" + suffix, timed(torch.compile(f), args), nbytes, flops)


def main():
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(0)
    print(f"# {name}, torch {torch.__version__}", file=sys.stderr)
    mib64 = 4096 * 4096 * 4

    src = torch.empty(1 << 28, device=DEV)  # 1 GiB
    dst = torch.empty_like(src)
    emit("device_copy", "1GiB", name, timed(lambda: dst.copy_(src), ()), 2 << 30)
    del src, dst

    both("ew_add_relu", "4096x4096", lambda a, b: torch.relu(a + b), inputs((4096, 4096), (4096, 4096)), 3 * mib64)
    both("ew_chain", "4096x4096", lambda a, b, c: torch.relu(a * b + c) * 0.5,
         inputs((4096, 4096), (4096, 4096), (4096, 4096)), 4 * mib64)
    for tf32, suffix in [(True, ""), (False, " f32")]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for m, k, n in [(256, 256, 256), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
                        (64, 784, 256), (4096, 784, 256)]:
            shape = f"{m}x{k}x{n}"
            x, w, b = inputs((m, k), (k, n), (n,))
            flops = 2 * m * k * n
            both("matmul", shape, lambda x, w: x @ w, (x, w), flops=flops, suffix=suffix)
            both("matmul_bias_relu", shape, lambda x, w, b: torch.relu(x @ w + b), (x, w, b),
                 flops=flops, suffix=suffix)
    torch.backends.cuda.matmul.allow_tf32 = True
    # bf16 operands, summed in f32 and rounded to bf16, as kiln's matmul_bf16.
    for m, k, n in [(256, 256, 256), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
                    (64, 784, 256), (4096, 784, 256), (250, 784, 256)]:
        x, w = (t.bfloat16() for t in inputs((m, k), (k, n)))
        both("matmul_bf16", f"{m}x{k}x{n}", lambda x, w: x @ w, (x, w), flops=2 * m * k * n)
    both("softmax", "4096x1000", lambda x: torch.softmax(x, -1), inputs((4096, 1000)), 2 * 4096 * 1000 * 4)
    both("log_softmax", "4096x10", lambda x: torch.log_softmax(x, -1), inputs((4096, 10)))
    for n in [1024, 4096]:
        both("sum_axis0", f"{n}x{n}", lambda x: x.sum(0), inputs((n, n)), n * n * 4 + n * 4)
        both("sum_all", f"{n}x{n}", lambda x: x.sum(), inputs((n, n)), n * n * 4)
    # bench_report's eager_add_relu and eager_chain10.
    def chain(a, b):
        x = (torch.relu((a + b) * 0.5) - b) * a
        return torch.relu((torch.abs(x + 1.0) + b) * 0.25 - a)
    with torch.no_grad():
        for n in [256, 4096] if wanted("eager_add_relu") else []:
            emit("eager_add_relu", f"{n}x{n}", "torch", timed(lambda a, b: torch.relu(a + b),
                 inputs((n, n), (n, n))), 3 * n * n * 4)
        if wanted("eager_chain10"):
            emit("eager_chain10", "256x256", "torch", timed(chain, inputs((256, 256), (256, 256))),
                 3 * 256 * 256 * 4)
    both("small_add_relu", "256x256", lambda a, b: torch.relu(a + b), inputs((256, 256), (256, 256)),
         3 * 256 * 256 * 4)


if __name__ == "__main__":
    main()
