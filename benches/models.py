#!/usr/bin/env python3
"""Full-size models against onnxruntime: torchvision's resnet18 and
mobilenet_v2 architectures at 1x3x224x224 and 8x3x224x224 (batch norms
folded into the convolutions' weights and biases, as `torch.onnx.export`
writes them from an eval-mode model), and two blocks of a GPT-2-sized
decoder (width 768, 12 heads, causal self-attention under an additive
-inf mask, as `nn.Transformer.generate_square_subsequent_mask` makes it)
on 128 and 512 embedded tokens; random weights, written with onnx's
helper API, so no PyTorch is needed. Writes each model, its input and
onnxruntime's output to DIR, times onnxruntime (two intra-op threads, as
kiln's team; calls for a few seconds after three warm-ups) and prints JSON
lines in bench_report's form. Then time kiln on the same files, in the same
sitting:

  /tmp/ort/bin/python benches/models.py target/models    # MODELS=decoder-t512,... for some
  cargo run --release --example bench_report -- --onnx target/models/resnet18-b1.onnx ...

(`python3 -m venv /tmp/ort && /tmp/ort/bin/pip install onnxruntime onnx numpy`.)
"""
import json
import os
import statistics
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "onnx", "models"))
from make import Graph  # noqa: E402


def relu6(g, x):
    return g.op("Clip", [x, g.const(np.float32(0.0)), g.const(np.float32(6.0))])


def head(g, x, channels):
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    return g.op("Gemm", [x, g.weight(1000, channels), g.const(np.zeros(1000, np.float32))], transB=1)


def resnet18(g):
    x = g.op("Relu", [g.conv("x", 3, 64, 7, stride=2)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for block in range(2):
            s = stride if block == 0 else 1
            y = g.op("Relu", [g.conv(x, cin, cout, 3, stride=s)])
            y = g.conv(y, cout, cout, 3)
            short = g.conv(x, cin, cout, 1, stride=s, pad=0) if (s != 1 or cin != cout) else x
            x = g.op("Relu", [g.op("Add", [y, short])])
            cin = cout
    return head(g, x, 512)


def mobilenet_v2(g):
    x = relu6(g, g.conv("x", 3, 32, 3, stride=2))
    cin = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = relu6(g, g.conv(x, cin, hidden, 1, pad=0)) if t != 1 else x
            y = relu6(g, g.conv(y, hidden, hidden, 3, stride=stride, group=hidden))
            y = g.conv(y, hidden, c, 1, pad=0)
            x = g.op("Add", [x, y]) if stride == 1 and cin == c else y
            cin = c
    x = relu6(g, g.conv(x, cin, 1280, 1, pad=0))
    return head(g, x, 1280)


def decoder(g, tokens, layers=2, d=768, heads=12):
    """`layers` pre-norm blocks of causal self-attention and a GELU MLP on
    input `x` [1, tokens, d], then a final layer norm."""
    mask = g.const(np.triu(np.full((tokens, tokens), -np.inf, np.float32), 1))
    x = "x"
    for _ in range(layers):
        x = g.op("Add", [x, g.attention(g.layer_norm(x, d), tokens, d, heads, mask=mask)])
        x = g.op("Add", [x, g.linear(g.gelu(g.linear(g.layer_norm(x, d), d, 4 * d)), 4 * d, d)])
    return g.layer_norm(x, d)


def timed(f, seconds=3.0):
    for _ in range(3):
        f()
    times, start = [], time.perf_counter()
    while len(times) < 7 or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    return median, statistics.median(abs(t - median) for t in times)


def main(folder):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    models = [(f"{name}-b{batch}", build, [batch, 3, 224, 224])
              for name, build in [("resnet18", resnet18), ("mobilenet_v2", mobilenet_v2)]
              for batch in [1, 8]]
    models += [(f"decoder-t{t}", lambda g, t=t: decoder(g, t), [1, t, 768]) for t in [128, 512]]
    only = os.environ.get("MODELS")
    for name, build, shape in models:
        if only and name not in only.split(","):
            continue
        g = Graph()
        out = build(g)
        model = g.model(name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], out)
        stem = os.path.join(folder, name)
        onnx.save(model, stem + ".onnx")
        x = rng.standard_normal(shape).astype(np.float32)
        session = ort.InferenceSession(stem + ".onnx", options, providers=["CPUExecutionProvider"])
        (y,) = session.run(None, {"x": x})
        np.save(stem + "_x.npy", x)
        np.save(stem + "_out.npy", y)
        median, spread = timed(lambda: session.run(None, {"x": x}))
        print(json.dumps({
            "workload": name, "shape": "x".join(map(str, shape)),
            "variant": f"onnxruntime {ort.__version__}", "backend": "cpu",
            "median_s": median, "spread_s": spread,
        }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/models")
