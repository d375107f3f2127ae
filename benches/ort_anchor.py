#!/usr/bin/env python3
"""onnxruntime on bench_report's `embedding` and `max_pool2d` workloads, two
intra-op threads as kiln's team:

- `embedding`: a Gather of 128 int64 ids (the same ids, some counted from
  the end) from a [50257, 768] f32 table, both graph inputs;
- `max_pool2d`: MaxPool 3x3, stride 2, padding 1 over [1, 64, 112, 112];
- `depthwise_conv2d`: MobileNetV2's depthwise Conv 3x3, padding 1, group =
  channels, bias, then Relu: stride 2 over [1, 96, 112, 112], stride 1 over
  [1, 144, 56, 56] (the weights and bias initializers, as an exported model
  holds them);
- `concat`: Concat of four [1, 32, 56, 56] along the channels.

Three warm-up calls, then calls for a second; one JSON line each in
bench_report's form (median and median absolute deviation).

  python3 -m venv /tmp/ort && /tmp/ort/bin/pip install onnxruntime onnx numpy
  /tmp/ort/bin/python benches/ort_anchor.py

Run it right after `bench_report --workload embedding --workload
max_pool2d --workload depthwise_conv2d --workload concat`, in the same
sitting.
"""
import json
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

VOCAB, WIDTH, TOKENS = 50257, 768, 128


def session(node, inputs, output, nodes=(), initializers=()):
    graph = helper.make_graph(
        [node, *nodes], node.op_type, inputs, [output], initializer=list(initializers)
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def report(workload, shape, run):
    for _ in range(3):
        run()
    samples = []
    start = time.perf_counter()
    while time.perf_counter() - start < 1.0 or len(samples) < 7:
        t = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t)
    median = statistics.median(samples)
    spread = statistics.median(abs(s - median) for s in samples)
    print(json.dumps({
        "workload": workload,
        "shape": shape,
        "variant": f"onnxruntime {ort.__version__}",
        "backend": "cpu",
        "median_s": median,
        "spread_s": spread,
    }))


def embedding():
    s = session(
        helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
        [
            helper.make_tensor_value_info("table", TensorProto.FLOAT, [VOCAB, WIDTH]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [TOKENS]),
        ],
        helper.make_tensor_value_info("rows", TensorProto.FLOAT, [TOKENS, WIDTH]),
    )
    table = np.random.default_rng(3).standard_normal((VOCAB, WIDTH), dtype=np.float32)
    ids = np.array([(t * 7919) % 50257 - 100 for t in range(TOKENS)], dtype=np.int64)
    feeds = {"table": table, "ids": ids}
    (rows,) = s.run(None, feeds)
    assert np.array_equal(rows, table[ids]), "onnxruntime's rows differ from numpy's"
    report("embedding", f"{VOCAB}x{WIDTH}[{TOKENS}]", lambda: s.run(None, feeds))


def max_pool():
    dims = [1, 64, 112, 112]
    s = session(
        helper.make_node(
            "MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 56, 56]),
    )
    feeds = {"x": np.random.default_rng(4).standard_normal(dims, dtype=np.float32)}
    report("max_pool2d", "x".join(map(str, dims)), lambda: s.run(None, feeds))


def depthwise():
    rng = np.random.default_rng(5)
    for c, hw, stride in [(96, 112, 2), (144, 56, 1)]:
        out = hw // stride
        weight = rng.standard_normal((c, 1, 3, 3), dtype=np.float32)
        bias = rng.standard_normal(c, dtype=np.float32)
        s = session(
            helper.make_node(
                "Conv", ["x", "w", "b"], ["z"], kernel_shape=[3, 3], strides=[stride, stride],
                pads=[1, 1, 1, 1], group=c,
            ),
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, out, out]),
            nodes=[helper.make_node("Relu", ["z"], ["y"])],
            initializers=[
                helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.flatten()),
                helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias),
            ],
        )
        feeds = {"x": rng.standard_normal((1, c, hw, hw), dtype=np.float32)}
        report("depthwise_conv2d", f"1x{c}x{hw}x{hw}-s{stride}", lambda: s.run(None, feeds))


def concat():
    dims = [1, 32, 56, 56]
    names = [f"x{i}" for i in range(4)]
    s = session(
        helper.make_node("Concat", names, ["y"], axis=1),
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in names],
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128, 56, 56]),
    )
    rng = np.random.default_rng(6)
    feeds = {n: rng.standard_normal(dims, dtype=np.float32) for n in names}
    report("concat", "4x1x32x56x56", lambda: s.run(None, feeds))


if __name__ == "__main__":
    embedding()
    max_pool()
    depthwise()
    concat()
