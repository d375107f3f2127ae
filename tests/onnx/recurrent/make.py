#!/usr/bin/env python3
"""Writes the recurrent models of tests/onnx_recurrent.rs and onnxruntime's
outputs for them: an LSTM, a GRU (linear_before_reset) and an RNN, each
bidirectional over 5 steps of a batch of 3 whose sequence_lens are 5, 3
and 1, random weights as initializers. onnxruntime (MIT licence, from
PyPI) is the reference.

  python3 -m venv /tmp/ort && /tmp/ort/bin/pip install onnxruntime onnx numpy
  /tmp/ort/bin/python tests/onnx/recurrent/make.py
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6

rng = np.random.default_rng(0)
for op, gates in [("LSTM", 4), ("GRU", 3), ("RNN", 1)]:
    x = rng.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    w = (rng.standard_normal((2, gates * HIDDEN, INPUT)) * 0.5).astype(np.float32)
    r = (rng.standard_normal((2, gates * HIDDEN, HIDDEN)) * 0.5).astype(np.float32)
    b = (rng.standard_normal((2, 2 * gates * HIDDEN)) * 0.5).astype(np.float32)
    lens = np.array([5, 3, 1], dtype=np.int32)
    initializers = [numpy_helper.from_array(a, n) for a, n in [(w, "W"), (r, "R"), (b, "B"), (lens, "L")]]
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    node = helper.make_node(op, ["X", "W", "R", "B", "L"], outputs, hidden_size=HIDDEN,
                            direction="bidirectional", **extra)
    graph = helper.make_graph(
        [node], op.lower(), [helper.make_tensor_value_info("X", TensorProto.FLOAT, [SEQ, BATCH, INPUT])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.save(model, os.path.join(HERE, f"{op.lower()}.onnx"))
    results = ort.InferenceSession(model.SerializeToString()).run(None, {"X": x})
    np.save(os.path.join(HERE, f"{op.lower()}_X.npy"), x)
    for name, value in zip(outputs, results):
        np.save(os.path.join(HERE, f"{op.lower()}_{name}.npy"), value)
