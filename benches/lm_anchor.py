#!/usr/bin/env python3
"""jax.jit on bench_report's `train_lm` step: one Adam step (1e-3) of the
transformer of examples/train_lm.rs (token and position embeddings of
width 64, two blocks of four-head causal self-attention and a GELU MLP
after layer norms, a final layer norm, the token embedding as the output
layer; 57 characters; GELU in its tanh form, jax's default and kiln's) on 32
windows of 64 ids, cross-entropy at every
position, buffers donated, on the CPU. One JSON line in train_anchor.py's
form.

  python3 -m venv /tmp/jax && /tmp/jax/bin/pip install jax numpy
  /tmp/jax/bin/python benches/lm_anchor.py [--steps N]

Run it right after `bench_report --workload train_lm`, in the same sitting.
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
B, T, D, H, L, V = 32, 64, 64, 4, 2, 57


def main():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    f32 = lambda a: jnp.asarray(np.asarray(a, np.float32))

    def dense(i, o):
        return (f32(rng.standard_normal((i, o)) / np.sqrt(i)), f32(np.zeros(o)))

    ln = lambda: (f32(np.ones(D)), f32(np.zeros(D)))
    params = {
        "tokens": f32(rng.standard_normal((V, D)) * 0.02),
        "positions": f32(rng.standard_normal((T, D)) * 0.02),
        "blocks": [
            {"ln1": ln(), "qkv": dense(D, 3 * D), "proj": dense(D, D), "ln2": ln(),
             "up": dense(D, 4 * D), "down": dense(4 * D, D)}
            for _ in range(L)
        ],
        "ln": ln(),
    }
    ids = (np.arange(B * (T + 1)) * 7919 % V).astype(np.int32).reshape(B, T + 1)
    x, y = jnp.asarray(ids[:, :T]), jnp.asarray(ids[:, 1:])
    causal = jnp.tril(jnp.ones((T, T), bool))

    def norm(h, wb):
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return (h - mu) / jnp.sqrt(var + 1e-5) * wb[0] + wb[1]

    def loss_fn(p, x, y):
        h = p["tokens"][x] + p["positions"][:T]
        for blk in p["blocks"]:
            qkv = norm(h, blk["ln1"]) @ blk["qkv"][0] + blk["qkv"][1]
            q, k, v = [a.reshape(B, T, H, D // H).transpose(0, 2, 1, 3) for a in jnp.split(qkv, 3, -1)]
            s = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // H), -jnp.inf)
            a = (jax.nn.softmax(s, -1) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
            h = h + a @ blk["proj"][0] + blk["proj"][1]
            u = jax.nn.gelu(norm(h, blk["ln2"]) @ blk["up"][0] + blk["up"][1])
            h = h + u @ blk["down"][0] + blk["down"][1]
        logits = norm(h, p["ln"]) @ p["tokens"].T
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(logp, y[..., None], -1))

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
        "workload": "train_lm",
        "shape": "32x64-2x4x64",
        "device": "cpu",
        "median_s": median,
        "spread_s": statistics.median(abs(t - median) for t in times),
        "compile_s": compile_s,
        "loss": float(loss),
    }), flush=True)


if __name__ == "__main__":
    main()
