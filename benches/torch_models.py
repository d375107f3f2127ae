#!/usr/bin/env python3
"""Models as people export them: torchvision's resnet18, mobilenet_v2,
squeezenet1_1, efficientnet_b0 and vit_b_16 (random weights, eval mode),
a two-layer LSTM and a small U-Net, written by `torch.onnx.export` with
its defaults (the dynamo exporter in current PyTorch), at batch 1 and 8.
Writes each model, its input and onnxruntime's output to DIR, times
onnxruntime (two intra-op threads, as kiln's team) and prints JSON lines in
bench_report's form; then time kiln on the same files in the same sitting:

  python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch torchvision onnx onnxscript onnxruntime
  /tmp/torch/bin/python benches/torch_models.py target/torch-models    # MODELS=resnet18-b1,... for some
  for f in target/torch-models/*.onnx; do
    cargo run --release --example bench_report -- --onnx $f
  done

A model kiln cannot load is reported by bench_report with the reason.
"""
import json
import os
import sys

import numpy as np
import onnxruntime as ort
import torch
import torchvision
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import timed  # noqa: E402


class Lstm(nn.Module):
    """Two LSTM layers of 256 over 64 steps of 128 features, then a linear
    layer on the last step's output."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(128, 256, num_layers=2)
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[-1])


class UNet(nn.Module):
    """Three levels of two 3x3 convolutions with batch norm and ReLU,
    max pooling down, transposed convolutions up, skips concatenated."""

    def __init__(self, widths=(32, 64, 128)):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

        a, b, c = widths
        self.down = nn.ModuleList([block(3, a), block(a, b)])
        self.middle = block(b, c)
        self.up = nn.ModuleList([nn.ConvTranspose2d(c, b, 2, stride=2), nn.ConvTranspose2d(b, a, 2, stride=2)])
        self.merge = nn.ModuleList([block(2 * b, b), block(2 * a, a)])
        self.out = nn.Conv2d(a, 2, 1)

    def forward(self, x):
        skips = []
        for down in self.down:
            x = down(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.middle(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips)):
            x = merge(torch.cat([up(x), skip], 1))
        return self.out(x)


def models():
    vision = {
        "resnet18": torchvision.models.resnet18,
        "mobilenet_v2": torchvision.models.mobilenet_v2,
        "squeezenet1_1": torchvision.models.squeezenet1_1,
        "efficientnet_b0": torchvision.models.efficientnet_b0,
        "vit_b_16": torchvision.models.vit_b_16,
    }
    for name, make in vision.items():
        for batch in [1, 8]:
            yield f"{name}-b{batch}", make, [batch, 3, 224, 224]
    for batch in [1, 8]:
        yield f"lstm-b{batch}", Lstm, [64, batch, 128]
        yield f"unet-b{batch}", UNet, [batch, 3, 128, 128]


def main(folder):
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    only = os.environ.get("MODELS")
    for name, make, shape in models():
        if only and name not in only.split(","):
            continue
        model = make().eval()
        if isinstance(model, torchvision.models.VisionTransformer):
            # Its head starts at zeros, which would make every output 0.
            nn.init.normal_(model.heads.head.weight, std=0.02)
        x = rng.standard_normal(shape).astype(np.float32)
        stem = os.path.join(folder, name)
        with torch.no_grad():
            torch.onnx.export(model, (torch.from_numpy(x),), stem + ".onnx")
        session = ort.InferenceSession(stem + ".onnx", options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}
        (y,) = session.run(None, feed)
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()
        np.save(stem + "_x.npy", x)
        np.save(stem + "_out.npy", y)
        median, spread = timed(lambda: session.run(None, feed))
        print(json.dumps({
            "workload": name, "shape": "x".join(map(str, shape)),
            "variant": f"onnxruntime {ort.__version__}", "backend": "cpu",
            "median_s": median, "spread_s": spread,
            "ort_vs_torch": float(np.abs(y - want).max() / max(np.abs(want).max(), 1e-30)),
        }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/torch-models")
