#!/usr/bin/env python3
"""onnxruntime on bench_report's `embedding` workload: a Gather of 128
int64 ids (the same ids, some counted from the end) from a [50257, 768]
f32 table, both graph inputs, two intra-op threads as kiln's team. Three
warm-up calls, then calls for a second; one JSON line in bench_report's
form (median and median absolute deviation).

  python3 -m venv /tmp/ort && /tmp/ort/bin/pip install onnxruntime onnx numpy
  /tmp/ort/bin/python benches/ort_anchor.py

Run it right after `bench_report --workload embedding`, in the same sitting.
"""
import json
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

VOCAB, WIDTH, TOKENS = 50257, 768, 128


def model():
    table = helper.make_tensor_value_info("table", TensorProto.FLOAT, [VOCAB, WIDTH])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [TOKENS])
    rows = helper.make_tensor_value_info("rows", TensorProto.FLOAT, [TOKENS, WIDTH])
    node = helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)
    graph = helper.make_graph([node], "embedding", [table, ids], [rows])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main():
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        model().SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    table = np.random.default_rng(3).standard_normal((VOCAB, WIDTH), dtype=np.float32)
    ids = np.array([(t * 7919) % 50257 - 100 for t in range(TOKENS)], dtype=np.int64)
    feeds = {"table": table, "ids": ids}
    (rows,) = session.run(None, feeds)
    assert np.array_equal(rows, table[ids]), "onnxruntime's rows differ from numpy's"
    for _ in range(3):
        session.run(None, feeds)
    samples = []
    start = time.perf_counter()
    while time.perf_counter() - start < 1.0 or len(samples) < 7:
        t = time.perf_counter()
        session.run(None, feeds)
        samples.append(time.perf_counter() - t)
    median = statistics.median(samples)
    spread = statistics.median(abs(s - median) for s in samples)
    print(json.dumps({
        "workload": "embedding",
        "shape": f"{VOCAB}x{WIDTH}[{TOKENS}]",
        "variant": f"onnxruntime {ort.__version__}",
        "backend": "cpu",
        "median_s": median,
        "spread_s": spread,
    }))


if __name__ == "__main__":
    main()
