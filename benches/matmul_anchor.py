#!/usr/bin/env python3
"""numpy (OpenBLAS), jax.jit and PyTorch on the matmul workloads of
README.md, every shape and layout bench_report has (the training-step
products `AtB` and `ABt` included, which ../shared/anchors/bench_anchors.py
lacks), on that script's inputs and threads: three warm-up calls, then calls
for a second, printed as JSON lines in bench_report's form (median and
median absolute deviation), `variant` naming the framework; and
`matmul_bf16` on jax and PyTorch (numpy has no bf16).

  ../shared/anchors/.venv/bin/python benches/matmul_anchor.py [--frameworks numpy,jax,torch]

Run it right after bench_report, in the same sitting.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "shared", "anchors"))
import bench_anchors as ba  # noqa: E402  (sets the thread environment first)
import numpy as np  # noqa: E402

# (M, K, N, layout) as in support/src/workloads.rs.
SHAPES = [(256, 256, 256, ""), (1024, 1024, 1024, ""), (2048, 2048, 2048, ""), (64, 784, 256, ""),
          (4096, 784, 256, ""), (250, 784, 256, ""), (784, 250, 256, "AtB"), (250, 256, 784, "ABt"),
          (1, 512, 1000, "ABt"), (1, 1280, 1000, "ABt"),
          (8, 256, 1024, "ABt")]


def stored(m, k, n, layout):
    """The inputs' shapes as stored."""
    a = (k, m) if layout == "AtB" else (m, k)
    b = (n, k) if layout == "ABt" else (k, n)
    return a, b


def operands(x, w, layout):
    return (x.T if layout == "AtB" else x), (w.T if layout == "ABt" else w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frameworks", default="numpy,jax")
    ap.add_argument("--budget", type=float, default=1.0)
    args = ap.parse_args()
    for name in args.frameworks.split(","):
        if name == "numpy":
            wrap, put, sync, label = (lambda f: f), (lambda x: x), (lambda r: r), "numpy"
        elif name == "jax":
            import jax
            wrap, put, label = jax.jit, jax.device_put, "jax.jit"
            sync = lambda r: r.block_until_ready()  # noqa: E731
        elif name == "torch":
            import torch
            wrap, put, sync, label = (lambda f: f), torch.from_numpy, (lambda r: r), "torch"
        else:
            sys.exit(f"unknown framework {name}")
        for (m, k, n, layout) in SHAPES:
            a, b = stored(m, k, n, layout)
            x, w, bias = ba.gen_inputs([a, b, (n,)], ba.SEED)
            xa, wb = operands(x.astype(np.float64), w.astype(np.float64), layout)
            ref = xa @ wb
            plain = wrap(lambda x, w, layout=layout: operands(x, w, layout)[0] @ operands(x, w, layout)[1])
            fused = wrap(lambda x, w, b, layout=layout:
                         relu(name)(operands(x, w, layout)[0] @ operands(x, w, layout)[1] + b))
            shape = f"{m}x{k}x{n}" + (f" {layout}" if layout else "")
            for workload, f, ins, want in [("matmul", plain, [x, w], ref),
                                           ("matmul_bias_relu", fused, [x, w, bias], np.maximum(ref + bias, 0))]:
                dx = [put(v) for v in ins]
                got = np.asarray(sync(f(*dx)), dtype=np.float64)
                err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
                times = timed(lambda: sync(f(*dx)), args.budget)
                med = statistics.median(times)
                mad = statistics.median(abs(t - med) for t in times)
                print(json.dumps(dict(workload=workload, shape=shape, variant=label, backend="cpu",
                                      median_s=med, spread_s=mad, flops=2 * m * k * n, max_rel_err=err)),
                      flush=True)
        if name != "numpy":
            bf16_products(name, wrap, put, sync, label, args.budget)


def bf16_products(name, wrap, put, sync, label, budget):
    """`matmul_bf16`: x @ w on bf16 operands (jax's or PyTorch's CPU bf16
    matmul; numpy has no bf16), at the shapes of bench_report's rows, the
    operands the same normal values rounded to bf16."""
    if name == "jax":
        import jax.numpy as jnp
        to_bf16 = lambda a: put(jnp.asarray(a, dtype=jnp.bfloat16))  # noqa: E731
        to_f64 = lambda t: np.asarray(t, dtype=np.float64)  # noqa: E731
    else:
        import torch
        to_bf16 = lambda a: torch.from_numpy(a).to(torch.bfloat16)  # noqa: E731
        to_f64 = lambda t: t.double().numpy()  # noqa: E731
    for (m, k, n, layout) in SHAPES:
        if layout:
            continue
        x, w = ba.gen_inputs([(m, k), (k, n)], ba.SEED)
        dx = [to_bf16(x), to_bf16(w)]
        want = to_f64(dx[0]) @ to_f64(dx[1])
        f = wrap(lambda x, w: x @ w)
        got = to_f64(sync(f(*dx)))
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        times = timed(lambda: sync(f(*dx)), budget)
        med = statistics.median(times)
        mad = statistics.median(abs(t - med) for t in times)
        print(json.dumps(dict(workload="matmul_bf16", shape=f"{m}x{k}x{n}", variant=label, backend="cpu",
                              median_s=med, spread_s=mad, flops=2 * m * k * n, max_rel_err=err)),
              flush=True)


def timed(call, budget):
    for _ in range(3):
        call()
    times = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < budget and len(times) < 2000):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def relu(name):
    """The framework's ReLU."""
    if name == "jax":
        import jax
        return jax.nn.relu
    if name == "torch":
        import torch
        return torch.relu
    return lambda v: np.maximum(v, 0)


if __name__ == "__main__":
    main()
