#!/usr/bin/env python3
"""jax.jit, PyTorch eager and torch.compile on bench_report's `train_cnn`
step: one Adam step (1e-3) of the CNN of examples/train_cnn.rs (5x5
convolutions to 16 and 32 channels, each with batch norm by the batch's
statistics whose running statistics move by 0.1 (the variance unbiased),
ReLU and 2x2 max pooling, dropout of a quarter with a new mask each step,
a linear layer to 10 classes; weights normal times sqrt(2 / fan-in),
biases and shifts zero, scales one), u8 images normalized inside the step,
softmax cross-entropy on int labels, batch 100, on the CPU with 2 threads.
jax.jit donates its buffers and carries its dropout key as state; PyTorch
runs `nn.Sequential` with `optimizer.step()` inside the compiled function,
as train_anchor.py does. JSON lines in train_anchor.py's form.

  python3 -m venv /tmp/jax && /tmp/jax/bin/pip install jax numpy torch
  /tmp/jax/bin/python benches/cnn_anchor.py [--steps N] [--frameworks jax,torch]

Run it right after `bench_report --workload train_cnn`, in the same sitting.
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--frameworks", default="jax,torch")
args = ap.parse_args()
B, SHAPE = 100, "100x1x28x28-c16bn-c32bn-d-10"
rng = np.random.default_rng(0)


def he(shape, fan_in):
    return (rng.standard_normal(shape) * np.sqrt(2 / fan_in)).astype(np.float32)


W = {"c1": he((16, 1, 5, 5), 25), "c2": he((32, 16, 5, 5), 400), "fc": he((512, 10), 512)}
X = rng.integers(0, 256, (B, 28, 28)).astype(np.uint8)
Y = rng.integers(0, 10, (B,)).astype(np.int32)


def report(framework, times, compile_s, loss):
    median = statistics.median(times)
    print(json.dumps({
        "framework": framework,
        "workload": "train_cnn",
        "shape": SHAPE,
        "device": "cpu",
        "median_s": median,
        "spread_s": statistics.median(abs(t - median) for t in times),
        "compile_s": compile_s,
        "loss": loss,
    }), flush=True)


def run_jax():
    import jax
    import jax.numpy as jnp

    def conv(w, c):
        return (jnp.asarray(w), jnp.zeros((c,), jnp.float32), jnp.ones((c,), jnp.float32), jnp.zeros((c,), jnp.float32))

    params = [conv(W["c1"], 16), conv(W["c2"], 32), (jnp.asarray(W["fc"]), jnp.zeros((10,), jnp.float32))]
    # Running mean and variance of each batch norm, and the dropout's key.
    buffers = ([(jnp.zeros((c,), jnp.float32), jnp.ones((c,), jnp.float32)) for c in (16, 32)], jax.random.key(3))
    x, y = jnp.asarray(X), jnp.asarray(Y)

    def layer(h, running, w, b, gamma, beta):
        c = jax.lax.conv_general_dilated(h, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        c = c + b[None, :, None, None]
        mean, var = jnp.mean(c, (0, 2, 3)), jnp.var(c, (0, 2, 3))
        n = c.size // c.shape[1]
        stats = jax.lax.stop_gradient((mean, var * n / (n - 1)))
        running = tuple(0.9 * r + 0.1 * s for r, s in zip(running, stats))
        c = (c - mean[None, :, None, None]) / jnp.sqrt(var[None, :, None, None] + 1e-5)
        c = jax.nn.relu(c * gamma[None, :, None, None] + beta[None, :, None, None])
        return jax.lax.reduce_window(c, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"), running

    def loss_fn(params, buffers, x, y):
        stats, key = buffers
        h = ((x.astype(jnp.float32) / 255.0 - 0.1307) / 0.3081).reshape(B, 1, 28, 28)
        h, r1 = layer(h, stats[0], *params[0])
        h, r2 = layer(h, stats[1], *params[1])
        key, draw = jax.random.split(key)
        h = h.reshape(B, 512)
        h = jnp.where(jax.random.bernoulli(draw, 0.75, h.shape), h / 0.75, 0.0)
        w, b = params[2]
        logits = h @ w + b
        loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), y[:, None], 1))
        return loss, ([r1, r2], key)

    def adam(params, buffers, st, x, y, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        m, v, t = st
        (loss, buffers), g = jax.value_and_grad(loss_fn, has_aux=True)(params, buffers, x, y)
        t = t + 1
        m = jax.tree.map(lambda mi, gi: b1 * mi + (1 - b1) * gi, m, g)
        v = jax.tree.map(lambda vi, gi: b2 * vi + (1 - b2) * gi * gi, v, g)
        upd = lambda p, mi, vi: p - lr * (mi / (1 - b1**t)) / (jnp.sqrt(vi / (1 - b2**t)) + eps)
        return jax.tree.map(upd, params, m, v), buffers, (m, v, t), loss

    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    state = (zeros(), zeros(), jnp.zeros((), jnp.float32))
    step = jax.jit(adam, donate_argnums=(0, 1, 2))
    p = jax.tree.map(jnp.copy, params)
    t0 = time.perf_counter()
    p, buffers, state, loss = step(p, buffers, state, x, y)
    loss.block_until_ready()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        p, buffers, state, loss = step(p, buffers, state, x, y)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    report("jax.jit", times, compile_s, float(loss))


def run_torch():
    import torch
    from torch import nn

    torch.set_num_threads(2)
    x, y = torch.from_numpy(X), torch.from_numpy(Y).long()

    def network():
        net = nn.Sequential(
            nn.Conv2d(1, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Dropout(0.25), nn.Linear(512, 10),
        )
        with torch.no_grad():
            for i, w in [(0, W["c1"]), (4, W["c2"])]:
                net[i].weight.copy_(torch.from_numpy(w))
                net[i].bias.zero_()
            net[10].weight.copy_(torch.from_numpy(W["fc"]).T)
            net[10].bias.zero_()
        return net.train()

    for mode in ["eager", "compile"]:
        torch.manual_seed(3)
        net = network()
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            h = ((x.float() / 255.0 - 0.1307) / 0.3081).reshape(B, 1, 28, 28)
            loss = nn.functional.cross_entropy(net(h), y)
            loss.backward()
            opt.step()
            return loss

        f = torch.compile(step) if mode == "compile" else step
        t0 = time.perf_counter()
        loss = f()
        compile_s = time.perf_counter() - t0
        for _ in range(3):
            f()
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss = f()
            times.append(time.perf_counter() - t0)
        report("torch " + mode, times, compile_s, float(loss))


for fw in args.frameworks.split(","):
    try:
        {"jax": run_jax, "torch": run_torch}[fw]()
    except ImportError as e:
        print(json.dumps({"framework": fw, "skipped": str(e)}), flush=True)
