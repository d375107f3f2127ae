#!/usr/bin/env python3
"""kiln's matmuls beside numpy's (OpenBLAS) in pairs: for each shape, numpy's
plain product and kiln's fused graph on each GEMM path take turns in short
windows, round after round, so that a slow phase of a shared machine
(another tenant on the host) falls on a pair rather than on one side of a
whole sitting. kiln runs in one `bench_report --serve` process per path,
compiled once, so a window is calls only. Each window starts after a
pause (`--settle`) longer than OpenBLAS's threads spin after a call (2^28
cycles, about 0.1 s here): without it, a kiln window right after numpy's
ran at one core's speed in 4 of 12 windows (784x250x256 AtB: 0.97-1.02
ms, against 0.47-0.56 in all 12 after a pause), the spinning threads
holding the other core. Prints, per workload and shape, numpy's and each
path's medians over the rounds and the per-round ratios numpy / kiln.

  ../shared/anchors/.venv/bin/python benches/matmul_pairs.py \\
      target/release/examples/bench_report [--rounds 21] [--paths avx512,avx2]

Build bench_report first (`cargo build --release --example bench_report`).
"""
import argparse
import functools
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import matmul_anchor as anchor  # noqa: E402  (sets the anchors' thread environment first)
from serve import Kiln  # noqa: E402


@functools.cache
def operands(m, k, n, layout):
    """The anchors' inputs of a product, made once."""
    a, b = anchor.stored(m, k, n, layout)
    x, w = anchor.ba.gen_inputs([a, b], anchor.ba.SEED)
    return anchor.operands(x, w, layout)


def numpy_time(m, k, n, layout, budget):
    """Median seconds of numpy's plain product on the anchors' inputs."""
    x, w = operands(m, k, n, layout)
    return statistics.median(anchor.timed(lambda: x @ w, budget))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_report")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--paths", default="avx512,avx2")
    ap.add_argument("--budget", type=float, default=0.1, help="seconds of calls per window")
    ap.add_argument("--settle", type=float, default=0.2, help="seconds of pause before each window")
    args = ap.parse_args()
    paths = args.paths.split(",")
    kiln = {path: Kiln(args.bench_report, {"KILN_CPU_ISA": path}) for path in paths}
    times = {}
    for r in range(args.rounds):
        for (m, k, n, layout) in anchor.SHAPES:
            shape = f"{m}x{k}x{n}" + (f" {layout}" if layout else "")
            for workload in ("matmul", "matmul_bias_relu"):
                sides = ["numpy"] + paths
                # Every other round the other way round, so that neither side
                # always follows the other.
                for side in sides if r % 2 == 0 else sides[::-1]:
                    time.sleep(args.settle)
                    t = (numpy_time(m, k, n, layout, args.budget) if side == "numpy"
                         else kiln[side].median_s(workload, shape, args.budget))
                    times.setdefault((workload, shape, side), []).append(t)
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    for (workload, shape, side), ts in times.items():
        if side == "numpy":
            continue
        numpy = times[(workload, shape, "numpy")]
        print(json.dumps(dict(workload=workload, shape=shape, path=side,
                              kiln_ms=[round(t * 1e3, 4) for t in ts],
                              numpy_matmul_ms=[round(t * 1e3, 4) for t in numpy],
                              ratio_per_round=[round(a / b, 3) for a, b in zip(numpy, ts)],
                              median_ratio=round(statistics.median(a / b for a, b in zip(numpy, ts)), 3),
                              ratio_of_medians=round(statistics.median(numpy) / statistics.median(ts), 3))))


if __name__ == "__main__":
    main()
