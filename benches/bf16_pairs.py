#!/usr/bin/env python3
"""kiln's bf16 products beside its f32 products of the same shapes, in
pairs: for each shape the f32 graph (`matmul`) and the bf16 one
(`matmul_bf16`) take turns in short windows, round after round, in one
`bench_report --serve` process, so that a slow phase of a shared machine
falls on a pair rather than on one side of a sitting. Issue 39's CPU
target is a bf16 product never slower than the f32 one. Prints, per shape,
each dtype's median over the rounds and the per-round ratios bf16 / f32,
with their median and quartiles.

  python3 benches/bf16_pairs.py target/release/examples/bench_report \\
      [--rounds 15] [--window 0.3] [--shapes 256x256x256,64x784x256]

Build bench_report first (`cargo build --release --example bench_report`).
Needs no package beyond Python's own.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve import Kiln  # noqa: E402

SHAPES = "256x256x256,1024x1024x1024,64x784x256,250x784x256"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--window", type=float, default=0.3, help="seconds per window")
    parser.add_argument("--shapes", default=SHAPES)
    args = parser.parse_args()
    if args.rounds < 2:
        sys.exit("--rounds must be at least 2, for the ratios' quartiles")
    kiln = Kiln(args.binary)
    shapes = args.shapes.split(",")
    times = {(s, w): [] for s in shapes for w in ("matmul", "matmul_bf16")}
    for r in range(args.rounds):
        for shape in shapes:
            # Which goes first alternates, so that neither always follows
            # the other's cache state.
            order = ("matmul", "matmul_bf16") if r % 2 == 0 else ("matmul_bf16", "matmul")
            for workload in order:
                times[(shape, workload)].append(kiln.median_s(workload, shape, args.window))
    kiln.close()
    for shape in shapes:
        f32, bf16 = times[(shape, "matmul")], times[(shape, "matmul_bf16")]
        ratios = sorted(b / f for b, f in zip(bf16, f32))
        q1, med, q3 = statistics.quantiles(ratios, n=4)
        print(json.dumps({
            "shape": shape,
            "f32_median_ms": round(statistics.median(f32) * 1e3, 4),
            "bf16_median_ms": round(statistics.median(bf16) * 1e3, 4),
            "ratio_median": round(med, 3),
            "ratio_quartiles": [round(q1, 3), round(q3, 3)],
            "ratios": [round(x, 3) for x in ratios],
        }))


if __name__ == "__main__":
    main()
