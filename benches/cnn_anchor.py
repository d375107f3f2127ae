#!/usr/bin/env python3
"""jax.jit on bench_report's `train_cnn` step: one Adam step (1e-3) of the
CNN of examples/train_cnn.rs without its dropout (5x5 convolutions to 16
and 32 channels, each with batch norm by the batch's statistics, ReLU and
2x2 max pooling, a linear layer to 10 classes; weights normal times
sqrt(2 / fan-in), biases and shifts zero, scales one), u8
images normalized inside the step, softmax cross-entropy on int labels,
batch 100, buffers donated, on the CPU. One JSON line in
train_anchor.py's form.

  python3 -m venv /tmp/jax && /tmp/jax/bin/pip install jax numpy
  /tmp/jax/bin/python benches/cnn_anchor.py [--steps N]

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
args = ap.parse_args()
B, SHAPE = 100, "100x1x28x28-c16bn-c32bn-10"


def main():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)

    def he(shape, fan_in):
        return jnp.asarray((rng.standard_normal(shape) * np.sqrt(2 / fan_in)).astype(np.float32))

    def conv(w, c):
        return (w, jnp.zeros((c,), jnp.float32), jnp.ones((c,), jnp.float32), jnp.zeros((c,), jnp.float32))

    params = [
        conv(he((16, 1, 5, 5), 25), 16),
        conv(he((32, 16, 5, 5), 400), 32),
        (he((512, 10), 512), jnp.zeros((10,), jnp.float32)),
    ]
    x = jnp.asarray(rng.integers(0, 256, (B, 28, 28)).astype(np.uint8))
    y = jnp.asarray(rng.integers(0, 10, (B,)).astype(np.int32))

    def layer(h, w, b, gamma, beta):
        c = jax.lax.conv_general_dilated(h, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        c = c + b[None, :, None, None]
        mean, var = jnp.mean(c, (0, 2, 3), keepdims=True), jnp.var(c, (0, 2, 3), keepdims=True)
        c = (c - mean) / jnp.sqrt(var + 1e-5) * gamma[None, :, None, None] + beta[None, :, None, None]
        c = jax.nn.relu(c)
        return jax.lax.reduce_window(c, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def loss_fn(params, x, y):
        h = ((x.astype(jnp.float32) / 255.0 - 0.1307) / 0.3081).reshape(B, 1, 28, 28)
        h = layer(layer(h, *params[0]), *params[1])
        w, b = params[2]
        logits = h.reshape(B, 512) @ w + b
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), y[:, None], 1))

    def adam(params, st, x, y, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        m, v, t = st
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        t = t + 1
        m = jax.tree.map(lambda mi, gi: b1 * mi + (1 - b1) * gi, m, g)
        v = jax.tree.map(lambda vi, gi: b2 * vi + (1 - b2) * gi * gi, v, g)
        upd = lambda p, mi, vi: p - lr * (mi / (1 - b1**t)) / (jnp.sqrt(vi / (1 - b2**t)) + eps)
        return jax.tree.map(upd, params, m, v), (m, v, t), loss

    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    state = (zeros(), zeros(), jnp.zeros((), jnp.float32))
    step = jax.jit(adam, donate_argnums=(0, 1))
    p = jax.tree.map(jnp.copy, params)
    t0 = time.perf_counter()
    p, state, loss = step(p, state, x, y)
    loss.block_until_ready()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        p, state, loss = step(p, state, x, y)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    print(json.dumps({
        "framework": "jax.jit",
        "workload": "train_cnn",
        "shape": SHAPE,
        "device": "cpu",
        "median_s": median,
        "spread_s": statistics.median(abs(t - median) for t in times),
        "compile_s": compile_s,
        "loss": float(loss),
    }), flush=True)


if __name__ == "__main__":
    main()
