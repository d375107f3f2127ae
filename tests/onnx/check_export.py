"""Checks the models kiln exported with readers other than kiln's own.

`cargo test --test onnx_export` leaves each model it exports in a folder of
`target/tmp/onnx_export/`: `model.onnx`, its inputs `input_{i}.npy` and
kiln's outputs on the CPU `output_{k}.npy`. The `mlp-*` folder holds a
784-64-10 MLP trained on the shipped digits (the quickstart's
normalization of the bytes, then logits and log-softmax) and a batch of
250 test digits; the others one kiln op each. For every folder this
script runs onnx's checker on the model (`full_check`: ONNX's shape and
type inference too) and onnxruntime on the inputs, and compares
onnxruntime's outputs with kiln's.

    python tests/onnx/check_export.py [DIR]    # needs numpy, onnx, onnxruntime
"""

import pathlib
import sys

import numpy as np
import onnx
import onnxruntime as ort

# Floats agree to rounding, not to the bit: kiln and onnxruntime sum a
# matmul's products in other orders, and their exp, tanh and the like are
# different approximations. Integers and bools must be equal.
RTOL, ATOL = 1e-5, 1e-5


def check(folder: pathlib.Path) -> list[str]:
    """Checks one folder; returns what is wrong, or nothing."""
    model = onnx.load(folder / "model.onnx")
    try:
        onnx.checker.check_model(model, full_check=True)
        session = ort.InferenceSession(
            str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
        )
    except Exception as e:  # the checker's and onnxruntime's own errors
        return [f"{type(e).__name__}: {str(e).splitlines()[0]}"]
    feeds = {
        i.name: np.load(folder / f"{i.name}.npy") for i in session.get_inputs()
    }
    wrong = []
    for k, got in enumerate(session.run(None, feeds)):
        want = np.load(folder / f"output_{k}.npy")
        if got.dtype != want.dtype or got.shape != want.shape:
            wrong.append(f"output_{k}: {got.dtype}{got.shape}, kiln {want.dtype}{want.shape}")
        elif want.dtype.kind == "f":
            if not np.allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True):
                diff = np.nanmax(np.abs(got.astype(np.float64) - want))
                wrong.append(f"output_{k}: max |diff| {diff:.3g}")
        elif not np.array_equal(got, want):
            wrong.append(f"output_{k}: {np.sum(got != want)} elements differ")
    if folder.name.startswith("mlp-"):
        logits = np.load(folder / "output_0.npy")
        ort_logits = session.run(None, feeds)[0]
        print(
            f"{folder.name}: ir_version {model.ir_version}, opset "
            f"{model.opset_import[0].version}, {len(model.graph.node)} nodes, "
            f"{len(model.graph.initializer)} initializers; logits max |diff| "
            f"{np.abs(ort_logits - logits).max():.3g}, bitwise equal "
            f"{np.mean(ort_logits == logits):.1%}, argmax agrees on "
            f"{np.mean(ort_logits.argmax(-1) == logits.argmax(-1)):.1%}"
        )
    return wrong


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/tmp/onnx_export")
    folders = sorted(p for p in root.iterdir() if (p / "model.onnx").exists())
    print(f"onnx {onnx.__version__}, onnxruntime {ort.__version__}, rtol {RTOL}, atol {ATOL}")
    failed = 0
    for folder in folders:
        wrong = check(folder)
        if wrong:
            failed += 1
            print(f"FAILED {folder.name}: {'; '.join(wrong)}")
    print(f"{len(folders) - failed} of {len(folders)} models pass the checker and match kiln")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
