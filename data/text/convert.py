#!/usr/bin/env python3
"""Writes `liber-primus.txt`: the text of Cicero's De finibus bonorum et
malorum, book 1, as the `lipsum` crate ships it (`src/liber-primus.txt` of
lipsum 0.9.1 from crates.io), checked against the hashes in README.md.

  python3 data/text/convert.py [path/to/lipsum-0.9.1.crate]

Without a path it downloads the crate from crates.io.
"""
import hashlib
import io
import pathlib
import sys
import tarfile
import urllib.request

CRATE = "https://static.crates.io/crates/lipsum/lipsum-0.9.1.crate"
CRATE_SHA256 = "636860251af8963cc40f6b4baadee105f02e21b28131d76eba8e40ce84ab8064"
TEXT = "lipsum-0.9.1/src/liber-primus.txt"
TEXT_SHA256 = "3a8b53b29465c55f000a4985191e434cf202546943b81cc819c63c68a296c18d"


def main():
    if len(sys.argv) > 1:
        crate = pathlib.Path(sys.argv[1]).read_bytes()
    else:
        with urllib.request.urlopen(CRATE) as response:
            crate = response.read()
    if hashlib.sha256(crate).hexdigest() != CRATE_SHA256:
        sys.exit(f"the crate's sha256 is not {CRATE_SHA256}")
    with tarfile.open(fileobj=io.BytesIO(crate), mode="r:gz") as archive:
        text = archive.extractfile(TEXT).read()
    if hashlib.sha256(text).hexdigest() != TEXT_SHA256:
        sys.exit(f"{TEXT}'s sha256 is not {TEXT_SHA256}")
    out = pathlib.Path(__file__).with_name("liber-primus.txt")
    out.write_bytes(text)
    print(f"wrote {out}: {len(text)} bytes")


if __name__ == "__main__":
    main()
