#!/usr/bin/env python3
"""Writes the small models of tests/onnx_models.rs, one per architecture
kiln's users export, and onnxruntime's outputs for them. Written with
onnx's helper API (no PyTorch), random weights as initializers, in the
shapes and op sets `torch.onnx.export` emits for such layers:

- `resnet`: a stem (Conv, BatchNormalization, Relu, MaxPool), a residual
  block, a strided block with a 1x1 projection, GlobalAveragePool,
  Flatten, Gemm;
- `mobilenet`: HardSwish, a depthwise Conv (group = channels), Clip as
  ReLU6, squeeze-excitation (GlobalAveragePool, 1x1 Convs, HardSigmoid,
  Mul), an inverted residual Add;
- `vit`: a patch embedding Conv, a position embedding, LayerNormalization,
  multi-head self-attention (MatMul, Reshape, Transpose, Softmax), an MLP
  with GELU written with Erf, ReduceMean over the tokens, a Gemm head;
- `decoder`: a GPT-style block on int64 token ids: Gather embeddings,
  causal attention (an additive mask), LayerNormalization, GELU, a head
  tied to the embedding (MatMul with its Transpose);
- `unet`: Conv, MaxPool, ConvTranspose, Concat with the skip connection,
  Resize (nearest, and linear), Sigmoid.

onnxruntime (MIT licence, from PyPI) is the reference.

  python3 -m venv /tmp/ort && /tmp/ort/bin/pip install onnxruntime onnx numpy
  /tmp/ort/bin/python tests/onnx/models/make.py
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(0)


class Graph:
    """Nodes and initializers, with fresh names."""

    def __init__(self):
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, base):
        self.count += 1
        return f"{base}{self.count}"

    def const(self, value, base="c"):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def weight(self, *shape, scale=None):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        scale = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        return self.const((rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def op(self, op_type, inputs, outputs=1, **attrs):
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names[0] if outputs == 1 else names

    def conv(self, x, cin, cout, k, stride=1, pad=None, group=1, bias=True):
        pad = k // 2 if pad is None else pad
        ins = [x, self.weight(cout, cin // group, k, k)]
        if bias:
            ins.append(self.const((rng.standard_normal(cout) * 0.1).astype(np.float32)))
        return self.op("Conv", ins, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4, group=group)

    def bn(self, x, c):
        scale = (1 + 0.1 * rng.standard_normal(c)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(c)).astype(np.float32)
        mean = (0.1 * rng.standard_normal(c)).astype(np.float32)
        var = (1 + 0.2 * rng.random(c)).astype(np.float32)
        return self.op("BatchNormalization", [x] + [self.const(a) for a in (scale, bias, mean, var)],
                       epsilon=1e-5)

    def layer_norm(self, x, d):
        scale = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(d)).astype(np.float32)
        return self.op("LayerNormalization", [x, self.const(scale), self.const(bias)], axis=-1,
                       epsilon=1e-5)

    def linear(self, x, din, dout):
        y = self.op("MatMul", [x, self.weight(din, dout)])
        return self.op("Add", [y, self.const((0.1 * rng.standard_normal(dout)).astype(np.float32))])

    def gelu(self, x):
        half = self.op("Mul", [x, self.const(np.float32(0.5))])
        erf = self.op("Erf", [self.op("Div", [x, self.const(np.float32(np.sqrt(2.0)))])])
        return self.op("Mul", [half, self.op("Add", [erf, self.const(np.float32(1.0))])])

    def attention(self, x, tokens, d, heads, mask=None):
        hd = d // heads
        split = lambda t: self.op("Transpose", [self.op("Reshape", [t, self.const(np.array([-1, tokens, heads, hd]))])],
                                  perm=[0, 2, 1, 3])
        q, k, v = (split(self.linear(x, d, d)) for _ in range(3))
        kt = self.op("Transpose", [k], perm=[0, 1, 3, 2])
        scores = self.op("Mul", [self.op("MatMul", [q, kt]), self.const(np.float32(1 / np.sqrt(hd)))])
        if mask is not None:
            scores = self.op("Add", [scores, mask])
        att = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])
        merged = self.op("Reshape", [self.op("Transpose", [att], perm=[0, 2, 1, 3]),
                                     self.const(np.array([-1, tokens, d]))])
        return self.linear(merged, d, d)

    def model(self, name, inputs, output, opset=17):
        graph = helper.make_graph(self.nodes, name, inputs,
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
                                  self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        return model

    def save(self, name, inputs, output, feeds, opset=17):
        model = self.model(name, inputs, output, opset)
        onnx.save(model, os.path.join(HERE, f"{name}.onnx"))
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (out,) = session.run(None, feeds)
        for key, value in feeds.items():
            np.save(os.path.join(HERE, f"{name}_{key}.npy"), value)
        np.save(os.path.join(HERE, f"{name}_out.npy"), out)


def image(name, n, c, h, w):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [n, c, h, w])


def resnet():
    g = Graph()
    x = g.op("Relu", [g.bn(g.conv("x", 3, 16, 3), 16)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = g.op("Relu", [g.bn(g.conv(x, 16, 16, 3, bias=False), 16)])
    y = g.bn(g.conv(y, 16, 16, 3, bias=False), 16)
    x = g.op("Relu", [g.op("Add", [x, y])])
    y = g.op("Relu", [g.bn(g.conv(x, 16, 32, 3, stride=2, bias=False), 32)])
    y = g.bn(g.conv(y, 32, 32, 3, bias=False), 32)
    shortcut = g.bn(g.conv(x, 16, 32, 1, stride=2, pad=0, bias=False), 32)
    x = g.op("Relu", [g.op("Add", [y, shortcut])])
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    out = g.op("Gemm", [x, g.weight(10, 32), g.const((0.1 * rng.standard_normal(10)).astype(np.float32))],
               transB=1)
    x_in = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    g.save("resnet", [image("x", 2, 3, 32, 32)], out, {"x": x_in})


def mobilenet():
    g = Graph()
    x = g.op("HardSwish", [g.bn(g.conv("x", 3, 16, 3, stride=2), 16)])
    y = g.bn(g.conv(x, 16, 16, 3, group=16, bias=False), 16)
    y = g.op("Clip", [y, g.const(np.float32(0.0)), g.const(np.float32(6.0))])
    # Squeeze and excitation.
    s = g.op("GlobalAveragePool", [y])
    s = g.op("Relu", [g.conv(s, 16, 4, 1, pad=0)])
    s = g.op("HardSigmoid", [g.conv(s, 4, 16, 1, pad=0)], alpha=1 / 6, beta=0.5)
    y = g.op("Mul", [y, s])
    y = g.bn(g.conv(y, 16, 16, 1, pad=0, bias=False), 16)
    x = g.op("Add", [x, y])
    # An inverted residual that widens, then a strided depthwise step.
    y = g.op("Clip", [g.bn(g.conv(x, 16, 48, 1, pad=0, bias=False), 48), g.const(np.float32(0.0)),
                      g.const(np.float32(6.0))])
    y = g.op("Clip", [g.bn(g.conv(y, 48, 48, 3, stride=2, group=48, bias=False), 48),
                      g.const(np.float32(0.0)), g.const(np.float32(6.0))])
    y = g.bn(g.conv(y, 48, 24, 1, pad=0, bias=False), 24)
    out = g.op("Flatten", [g.op("GlobalAveragePool", [y])])
    x_in = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    g.save("mobilenet", [image("x", 2, 3, 32, 32)], out, {"x": x_in})


def vit():
    g = Graph()
    d, tokens = 32, 16
    p = g.conv("x", 3, d, 8, stride=8, pad=0)
    p = g.op("Transpose", [g.op("Reshape", [p, g.const(np.array([-1, d, tokens]))])], perm=[0, 2, 1])
    x = g.op("Add", [p, g.const((0.1 * rng.standard_normal((1, tokens, d))).astype(np.float32))])
    x = g.op("Add", [x, g.attention(g.layer_norm(x, d), tokens, d, 4)])
    h = g.linear(g.gelu(g.linear(g.layer_norm(x, d), d, 2 * d)), 2 * d, d)
    x = g.op("Add", [x, h])
    x = g.op("ReduceMean", [g.layer_norm(x, d), g.const(np.array([1]))], keepdims=0)
    out = g.op("Gemm", [x, g.weight(10, d), g.const((0.1 * rng.standard_normal(10)).astype(np.float32))],
               transB=1)
    x_in = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    g.save("vit", [image("x", 2, 3, 32, 32)], out, {"x": x_in}, opset=18)


def decoder():
    g = Graph()
    vocab, d, tokens = 50, 32, 12
    table = g.weight(vocab, d, scale=0.5)
    x = g.op("Gather", [table, "ids"])
    x = g.op("Add", [x, g.const((0.1 * rng.standard_normal((tokens, d))).astype(np.float32))])
    causal = np.triu(np.full((tokens, tokens), -1e9, np.float32), 1)
    x = g.op("Add", [x, g.attention(g.layer_norm(x, d), tokens, d, 4, mask=g.const(causal))])
    x = g.op("Add", [x, g.linear(g.gelu(g.linear(g.layer_norm(x, d), d, 4 * d)), 4 * d, d)])
    out = g.op("MatMul", [g.layer_norm(x, d), g.op("Transpose", [table], perm=[1, 0])])
    ids = rng.integers(-vocab, vocab, (2, tokens)).astype(np.int64)
    g.save("decoder", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, tokens])], out,
           {"ids": ids})


def unet():
    g = Graph()
    skip = g.op("Relu", [g.conv("x", 3, 8, 3)])
    x = g.op("MaxPool", [skip], kernel_shape=[2, 2], strides=[2, 2])
    x = g.op("Relu", [g.conv(x, 8, 16, 3)])
    x = g.op("ConvTranspose", [x, g.weight(16, 8, 2, 2), g.const((0.1 * rng.standard_normal(8)).astype(np.float32))],
             kernel_shape=[2, 2], strides=[2, 2])
    x = g.op("Concat", [x, skip], axis=1)
    x = g.op("Relu", [g.conv(x, 16, 8, 3)])
    small = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    roi, scales = g.const(np.zeros(0, np.float32)), g.const(np.array([1, 1, 2, 2], np.float32))
    near = g.op("Resize", [small, roi, scales], mode="nearest")
    lin = g.op("Resize", [small, roi, scales], mode="linear")
    x = g.op("Concat", [x, near, lin], axis=1)
    out = g.op("Sigmoid", [g.conv(x, 24, 2, 1, pad=0)])
    x_in = rng.standard_normal((1, 3, 24, 20)).astype(np.float32)
    g.save("unet", [image("x", 1, 3, 24, 20)], out, {"x": x_in})


if __name__ == "__main__":
    for make in [resnet, mobilenet, vit, decoder, unet]:
        make()
