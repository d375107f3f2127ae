#!/usr/bin/env python3
"""PyTorch's `F.scaled_dot_product_attention` (its CPU flash kernel) and
jax.jit's `jax.nn.dot_product_attention` on bench_report's `attention`
rows (queries, keys and values [b, 12, l, 64]: causal at 1x512 and 8x128,
unmasked at 1x197), on ../shared/anchors/bench_anchors.py's inputs and
threads: three warm-up calls, then calls for a second, printed as JSON
lines in bench_report's form (median and median absolute deviation),
`variant` naming the framework, `max_rel_err` against numpy in f64.

  /path/to/venv/bin/python benches/attention_anchor.py [--frameworks torch,jax]

Run it right after bench_report, in the same sitting.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "shared", "anchors"))
import bench_anchors as ba  # noqa: E402  (sets the thread environment first)
import numpy as np  # noqa: E402
from matmul_anchor import timed  # noqa: E402

# (batch, sequence, causal) as in support/src/workloads.rs.
ROWS = [(1, 512, True), (8, 128, True), (1, 197, False)]


def reference(q, k, v, causal):
    """The definition in f64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        n = scores.shape[-1]
        scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return (scores / scores.sum(-1, keepdims=True)) @ v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frameworks", default="torch,jax")
    ap.add_argument("--budget", type=float, default=1.0)
    args = ap.parse_args()
    for name in args.frameworks.split(","):
        if name == "torch":
            import torch
            import torch.nn.functional as F
            put, sync, label = torch.from_numpy, (lambda r: r), "torch"

            def attend(causal):
                return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        elif name == "jax":
            import jax
            put, label = jax.device_put, "jax.jit"
            sync = lambda r: r.block_until_ready()  # noqa: E731

            def attend(causal):
                # jax's layout is [batch, sequence, heads, head size].
                def f(q, k, v):
                    t = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
                    return t(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=causal))
                return jax.jit(f)
        else:
            sys.exit(f"unknown framework {name}")
        for (b, l, causal) in ROWS:
            dims = (b, 12, l, 64)
            q, k, v = ba.gen_inputs([dims, dims, dims], ba.SEED)
            want = reference(q, k, v, causal)
            f = attend(causal)
            dq = [put(x) for x in (q, k, v)]
            got = np.asarray(sync(f(*dq)), dtype=np.float64)
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            times = timed(lambda: sync(f(*dq)), args.budget)
            med = statistics.median(times)
            mad = statistics.median(abs(t - med) for t in times)
            shape = f"{b}x12x{l}x64" + (" causal" if causal else "")
            print(json.dumps(dict(workload="attention", shape=shape, variant=label, backend="cpu",
                                  median_s=med, spread_s=mad, flops=4 * b * 12 * l * l * 64,
                                  max_rel_err=err)), flush=True)


if __name__ == "__main__":
    main()
