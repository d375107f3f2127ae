#!/usr/bin/env python3
"""kiln's matmuls beside numpy's (OpenBLAS) in pairs: for each shape, numpy's
plain product and `bench_report --quick` on each GEMM path take turns in
windows of under a second, round after round, so that a slow phase of a
shared machine (another tenant on the host) falls on a pair rather than on
one side of a whole sitting. Prints, per workload and shape, numpy's and
each path's medians over the rounds and the per-round ratios numpy / kiln.

  ../shared/anchors/.venv/bin/python benches/matmul_pairs.py \\
      target/release/examples/bench_report [--rounds 7] [--paths avx512,avx2]

Build bench_report first (`cargo build --release --example bench_report`).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import matmul_anchor as anchor  # noqa: E402  (sets the anchors' thread environment first)
import numpy as np  # noqa: E402


def numpy_time(m, k, n, layout, budget):
    """Median seconds of numpy's plain product on the anchors' inputs."""
    a, b = anchor.stored(m, k, n, layout)
    x, w = anchor.ba.gen_inputs([a, b], anchor.ba.SEED)
    x, w = anchor.operands(x, w, layout)
    return statistics.median(anchor.timed(lambda: x @ w, budget))


def kiln_time(binary, workload, shape, path):
    """Median seconds of bench_report's fused variant on GEMM path `path`."""
    out = subprocess.run([binary, "--quick", "--workload", workload, "--shape", shape],
                         env={**os.environ, "KILN_CPU_ISA": path}, capture_output=True, text=True,
                         check=True).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return next(x["median_s"] for x in lines if x["variant"] == "fused")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_report")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--paths", default="avx512,avx2")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds of numpy's calls per window")
    args = ap.parse_args()
    paths = args.paths.split(",")
    times = {}
    for r in range(args.rounds):
        for (m, k, n, layout) in anchor.SHAPES:
            shape = f"{m}x{k}x{n}" + (f" {layout}" if layout else "")
            for workload in ("matmul", "matmul_bias_relu"):
                sides = ["numpy"] + paths
                # Every other round the other way round, so that neither side
                # always follows the other.
                for side in sides if r % 2 == 0 else sides[::-1]:
                    t = (numpy_time(m, k, n, layout, args.budget) if side == "numpy"
                         else kiln_time(args.bench_report, workload, shape, side))
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
