#!/usr/bin/env bash
# Fetches ONNX's backend test data into target/onnx/: the models, inputs and
# expected outputs under onnx/backend/test/data/ of the onnx 1.22.0 wheel,
# the last release that ships them. tests/onnx_node.rs runs them.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=1.22.0
dest=target/onnx
stamp="$dest/onnx-$version.fetched"
if [ -f "$stamp" ]; then
    exit 0
fi
mkdir -p "$dest/wheel"
# pip of this Python, or of a virtual environment where it has none.
pip=(python3 -m pip)
if ! python3 -m pip --version >/dev/null 2>&1; then
    python3 -m venv "$dest/venv"
    pip=("$dest/venv/bin/python" -m pip)
fi
# One pinned wheel, whatever this machine's Python: only its data is used.
"${pip[@]}" download "onnx==$version" --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --python-version 3.11 \
    --quiet --disable-pip-version-check -d "$dest/wheel"
wheel=$(ls "$dest/wheel"/onnx-"$version"-*.whl | head -n 1)
rm -rf "$dest/onnx"
python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("onnx/backend/test/data/")]
    z.extractall(sys.argv[2], names)
    print(f"onnx {sys.argv[1]}: {len(names)} files of backend test data")
PY
touch "$stamp"
