#!/usr/bin/env python3
"""jax.jit, PyTorch eager and torch.compile on bench_report's `train_lm`
step: one Adam step (1e-3) of the transformer of examples/train_lm.rs
(token and position embeddings of width 64, two blocks of four-head causal
self-attention and a GELU MLP after layer norms, a final layer norm, the
token embedding as the output layer; 57 characters; GELU in its tanh form,
jax's default and kiln's) on 32 windows of 64 ids, cross-entropy at every
position, on the CPU with 2 threads. jax.jit donates its buffers; PyTorch
runs `optimizer.step()` inside the compiled function, as train_anchor.py
does; both write attention as kiln does (the scores, a causal mask,
softmax, the mix). JSON lines in train_anchor.py's form.

  python3 -m venv /tmp/jax && /tmp/jax/bin/pip install jax numpy torch
  /tmp/jax/bin/python benches/lm_anchor.py [--steps N] [--frameworks jax,torch]

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
ap.add_argument("--frameworks", default="jax,torch")
args = ap.parse_args()
B, T, D, H, L, V = 32, 64, 64, 4, 2, 57
rng = np.random.default_rng(0)


def dense(i, o):
    return ((rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32), np.zeros(o, np.float32))


def ln():
    return (np.ones(D, np.float32), np.zeros(D, np.float32))


P = {
    "tokens": (rng.standard_normal((V, D)) * 0.02).astype(np.float32),
    "positions": (rng.standard_normal((T, D)) * 0.02).astype(np.float32),
    "blocks": [
        {"ln1": ln(), "qkv": dense(D, 3 * D), "proj": dense(D, D), "ln2": ln(),
         "up": dense(D, 4 * D), "down": dense(4 * D, D)}
        for _ in range(L)
    ],
    "ln": ln(),
}
IDS = (np.arange(B * (T + 1)) * 7919 % V).astype(np.int32).reshape(B, T + 1)


def report(framework, times, compile_s, loss):
    median = statistics.median(times)
    print(json.dumps({
        "framework": framework,
        "workload": "train_lm",
        "shape": "32x64-2x4x64",
        "device": "cpu",
        "median_s": median,
        "spread_s": statistics.median(abs(t - median) for t in times),
        "compile_s": compile_s,
        "loss": loss,
    }), flush=True)


def forward(p, x, y, ops):
    """The loss, written once for both frameworks: `ops` gives the few
    functions whose names differ."""
    mean, sqrt, softmax, gelu, log_softmax, pick, causal = ops

    def norm(h, wb):
        mu = mean(h)
        var = mean((h - mu) ** 2)
        return (h - mu) / sqrt(var + 1e-5) * wb[0] + wb[1]

    h = p["tokens"][x] + p["positions"][:T]
    for blk in p["blocks"]:
        qkv = norm(h, blk["ln1"]) @ blk["qkv"][0] + blk["qkv"][1]
        q, k, v = [qkv[..., i * D:(i + 1) * D].reshape(B, T, H, D // H).swapaxes(1, 2) for i in range(3)]
        s = causal(q @ k.swapaxes(-1, -2) / np.sqrt(D // H))
        a = (softmax(s) @ v).swapaxes(1, 2).reshape(B, T, D)
        h = h + a @ blk["proj"][0] + blk["proj"][1]
        u = gelu(norm(h, blk["ln2"]) @ blk["up"][0] + blk["up"][1])
        h = h + u @ blk["down"][0] + blk["down"][1]
    logits = norm(h, p["ln"]) @ p["tokens"].T
    return -pick(log_softmax(logits), y).mean()


def run_jax():
    import jax
    import jax.numpy as jnp

    params = jax.tree.map(jnp.asarray, P)
    x, y = jnp.asarray(IDS[:, :T]), jnp.asarray(IDS[:, 1:])
    mask = jnp.tril(jnp.ones((T, T), bool))
    ops = (
        lambda h: h.mean(-1, keepdims=True), jnp.sqrt,
        lambda s: jax.nn.softmax(s, -1), jax.nn.gelu,
        lambda l: jax.nn.log_softmax(l, -1),
        lambda logp, y: jnp.take_along_axis(logp, y[..., None], -1),
        lambda s: jnp.where(mask, s, -jnp.inf),
    )
    def loss_fn(p, x, y):
        return forward(p, x, y, ops)

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
    report("jax.jit", times, compile_s, float(loss))


def run_torch():
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    x, y = torch.from_numpy(IDS[:, :T]).long(), torch.from_numpy(IDS[:, 1:]).long()
    mask = torch.tril(torch.ones((T, T), dtype=torch.bool))
    ops = (
        lambda h: h.mean(-1, keepdim=True), torch.sqrt,
        lambda s: torch.softmax(s, -1), lambda u: F.gelu(u, approximate="tanh"),
        lambda l: torch.log_softmax(l, -1),
        lambda logp, y: torch.gather(logp, -1, y[..., None]),
        lambda s: s.masked_fill(~mask, float("-inf")),
    )
    for mode in ["eager", "compile"]:
        leaves = []

        def tensor(a):
            t = torch.tensor(a, requires_grad=True)
            leaves.append(t)
            return t

        params = {
            "tokens": tensor(P["tokens"]), "positions": tensor(P["positions"]),
            "ln": tuple(tensor(a) for a in P["ln"]),
            "blocks": [{k: tuple(tensor(a) for a in wb) for k, wb in blk.items()} for blk in P["blocks"]],
        }
        opt = torch.optim.Adam(leaves, lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = forward(params, x, y, ops)
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
        report("torch " + mode, times, compile_s, loss.item())


for fw in args.frameworks.split(","):
    try:
        {"jax": run_jax, "torch": run_torch}[fw]()
    except ImportError as e:
        print(json.dumps({"framework": fw, "skipped": str(e)}), flush=True)
