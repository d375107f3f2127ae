#!/usr/bin/env python3
"""Whole ONNX models timed by several contestants taking turns: builds of
kiln (each a `bench_report --serve` process, the model compiled once) and,
with `--ort`, onnxruntime on two threads, in short windows, round after
round, so that a slow phase of a shared machine falls on every contestant
rather than on one side of a sitting. For two builds of kiln it measures a
change; with `--ort`, issue 37's kiln against onnxruntime. Prints, per
model, each contestant's median over the rounds and the per-round ratios
of each to the first contestant, with their median and quartiles.

  python3 benches/model_pairs.py --kiln before=/tmp/bench_report_old \\
      --kiln after=target/release/examples/bench_report [--ort] \\
      [--rounds 12] [--window 0.5] target/torch-models/mobilenet_v2-b1.onnx ..

Each model needs its input beside it as `STEM_x.npy`
(`benches/torch_models.py` writes both). Build bench_report first; `--ort`
needs numpy and onnxruntime (`benches/torch_models.py`'s environment).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve import Kiln  # noqa: E402


class Ort:
    """onnxruntime on two threads, one session per model."""

    def __init__(self):
        import numpy
        import onnxruntime
        self.np, self.ort, self.sessions = numpy, onnxruntime, {}

    def median_s(self, workload, model, window):
        """As `serve.Kiln`'s, for workload `onnx`, the only one here."""
        assert workload == "onnx"
        if model not in self.sessions:
            options = self.ort.SessionOptions()
            options.intra_op_num_threads = 2
            options.inter_op_num_threads = 1
            session = self.ort.InferenceSession(model, options,
                                                providers=["CPUExecutionProvider"])
            x = self.np.load(os.path.splitext(model)[0] + "_x.npy")
            feed = {session.get_inputs()[0].name: x}
            session.run(None, feed)
            self.sessions[model] = (session, feed)
        session, feed = self.sessions[model]
        times, end = [], time.perf_counter() + window
        while not times or time.perf_counter() < end:
            start = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def close(self):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--kiln", action="append", default=[], metavar="NAME=BINARY")
    parser.add_argument("--ort", action="store_true")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--window", type=float, default=0.5, help="seconds per window")
    args = parser.parse_args()
    if args.rounds < 2:
        sys.exit("--rounds must be at least 2, for the ratios' quartiles")
    contestants = []
    for spec in args.kiln:
        name, _, binary = spec.partition("=")
        if not binary:
            sys.exit(f"--kiln wants NAME=BINARY, got {spec!r}")
        contestants.append((name, Kiln(binary)))
    if args.ort:
        contestants.append(("onnxruntime", Ort()))
    if len(contestants) < 2:
        sys.exit("two contestants at least: --kiln twice, or --kiln and --ort")
    times = {(m, name): [] for m in args.models for name, _ in contestants}
    for r in range(args.rounds):
        for model in args.models:
            # The order rotates, so that no contestant always follows another.
            k = r % len(contestants)
            for name, c in contestants[k:] + contestants[:k]:
                times[(model, name)].append(c.median_s("onnx", model, args.window))
    for _, c in contestants:
        c.close()
    first = contestants[0][0]
    for model in args.models:
        row = {"model": model}
        for name, _ in contestants:
            row[f"{name}_median_ms"] = round(statistics.median(times[(model, name)]) * 1e3, 3)
        for name, _ in contestants[1:]:
            ratios = sorted(b / a for a, b in zip(times[(model, first)], times[(model, name)]))
            q1, med, q3 = statistics.quantiles(ratios, n=4)
            row[f"{name}/{first}"] = round(med, 3)
            row[f"{name}/{first}_quartiles"] = [round(q1, 3), round(q3, 3)]
        print(json.dumps(row))


if __name__ == "__main__":
    main()
