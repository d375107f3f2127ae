#!/usr/bin/env python3
"""PyTorch eager and torch.compile on bench_report's `train_mixed` step:
one Adam step (1e-3) of an MLP 4096-4096-4096-10 (ReLU, softmax
cross-entropy on int labels) on a batch of 1024 normal rows, in f32 and
under `torch.autocast(bfloat16)` (bf16 products, f32 master weights and
optimizer state), on GPU 0 with the batch already on the device, each step
synchronized before its time is read (`--device cpu` for a dry run). The
weights are drawn as bench_report's are, normal times sqrt(2 / fan-in);
PyTorch's f32 matmuls are IEEE unless `--tf32`, kiln's `--backend cuda`
ones TF32. JSON lines in train_anchor.py's form, the variant in the
framework's name.

  python3 benches/mixed_anchor.py [--steps N] [--device cuda|cpu] [--tf32]

Run it right after `bench_report --backend cuda --workload train_mixed`, in
the same sitting.
"""
import argparse
import json
import statistics
import time

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
ap.add_argument("--tf32", action="store_true")
a = ap.parse_args()

ROWS, SIZES, SHAPE = 1024, [4096, 4096, 4096, 10], "1024x4096-4096-4096-10"
rng = np.random.default_rng(0)
W = [(rng.standard_normal((i, o)) * np.sqrt(2 / i)).astype(np.float32) for i, o in zip(SIZES, SIZES[1:])]
X = rng.standard_normal((ROWS, SIZES[0])).astype(np.float32)
Y = (np.arange(ROWS) * 31 % 10).astype(np.int64)


def main():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    x, y = torch.from_numpy(X).to(dev), torch.from_numpy(Y).to(dev)

    def make():
        ps = []
        for w in W:
            ps += [torch.tensor(w, device=dev, requires_grad=True), torch.zeros(w.shape[1], device=dev, requires_grad=True)]
        return ps

    def loss_fn(ps):
        h = x
        for i in range(0, len(ps), 2):
            h = h @ ps[i] + ps[i + 1]
            if i + 2 < len(ps):
                h = torch.relu(h)
        return torch.nn.functional.cross_entropy(h, y)

    for precision in ["f32", "bf16"]:
        for mode in ["eager", "compile"]:
            ps = make()
            opt = torch.optim.Adam(ps, lr=1e-3)

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(a.device, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    loss = loss_fn(ps)
                loss.backward()
                opt.step()
                return loss

            f = torch.compile(step) if mode == "compile" else step
            t0 = time.perf_counter()
            loss = f()
            sync()
            compile_s = time.perf_counter() - t0
            for _ in range(3):
                f()
            sync()
            times = []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                loss = f()
                sync()
                times.append(time.perf_counter() - t0)
            print(json.dumps({
                "framework": f"torch {mode} {precision}",
                "workload": "train_mixed",
                "shape": SHAPE,
                "device": a.device,
                "median_s": statistics.median(times),
                "compile_s": compile_s,
                "loss": float(loss.detach()),
            }), flush=True)


main()
