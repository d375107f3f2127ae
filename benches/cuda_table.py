#!/usr/bin/env python3
"""The tables of benches/RESULTS-cuda.md from one sitting of
benches/cuda_run.sh: kiln (kiln.jsonl, kiln-f32.jsonl) beside PyTorch
(torch.jsonl), host and device medians in microseconds.

    python3 benches/cuda_table.py DIR
"""

import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def us(row, key):
    return f"{row[key] * 1e6:.1f}" if key in row else ""


def main(folder):
    kiln = load(f"{folder}/kiln.jsonl") + load(f"{folder}/kiln-f32.jsonl")
    torch = load(f"{folder}/torch.jsonl")
    # Each file's copy is measured in its own run: the TF32 run's goes with
    # the elementwise workloads, which that run measures.
    copy = next(r for r in load(f"{folder}/kiln.jsonl") if r["workload"] == "device_copy")
    torch_copy = next(r for r in torch if r["workload"] == "device_copy")
    for name, r in [("kiln", copy), ("torch", torch_copy)]:
        gbs = r["bytes"] / r["device_s"] / 1e9
        print(f"device copy 1 GiB ({name}): {us(r, 'median_s')} us host, "
              f"{us(r, 'device_s')} us device = {gbs:.0f} GB/s read + written")
    print()
    print("| workload | shape | precision | kiln fused | kiln unfused | kernels fused/unfused "
          "| torch eager | torch.compile | fused vs eager | fused vs compile |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    keyed = {}
    for r in kiln:
        if r["workload"] == "device_copy":
            continue
        precision = "f32" if r["backend"] == "cuda-f32" else ("tf32" if "matmul" in r["workload"] else "")
        keyed.setdefault((r["workload"], r["shape"], precision), {})[r["variant"]] = r
    for r in torch:
        if r["workload"] == "device_copy":
            continue
        variant = r["variant"]
        precision = "f32" if variant.endswith(" f32") else ("tf32" if "matmul" in r["workload"] else "")
        keyed.setdefault((r["workload"], r["shape"], precision), {})[variant.removesuffix(" f32")] = r
    for (workload, shape, precision), v in keyed.items():
        fused, unfused = v.get("fused"), v.get("unfused")
        eager, compiled = v.get("torch"), v.get("torch.compile")
        if not fused:
            continue

        def cell(r):
            return f"{us(r, 'device_s')} ({us(r, 'median_s')})" if r else ""

        def ratio(other):
            if not other:
                return ""
            return (f"{other['device_s'] / fused['device_s']:.2f}x "
                    f"({other['median_s'] / fused['median_s']:.2f}x)")

        kernels = f"{fused['kernels']}/{unfused['kernels']}" if unfused else ""
        print(f"| {workload} | {shape} | {precision} | {cell(fused)} | {cell(unfused)} | {kernels} "
              f"| {cell(eager)} | {cell(compiled)} | {ratio(eager)} | {ratio(compiled)} |")


if __name__ == "__main__":
    main(sys.argv[1])
