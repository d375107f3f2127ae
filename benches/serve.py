"""A client of `bench_report --serve` (`examples/bench_report`), for the
scripts that time kiln taking turns: one process, its graphs compiled at
their first request, each request a window of calls answered with their
median."""
import json
import os
import subprocess
import sys


class Kiln:
    """A `bench_report --serve` process of `binary`, with `env` added to
    its environment (`KILN_CPU_ISA`, to force a GEMM path)."""

    def __init__(self, binary, env=None):
        self.proc = subprocess.Popen([binary, "--serve"], env={**os.environ, **(env or {})},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1)

    def median_s(self, workload, shape, window):
        """Median seconds of the fused graph of `workload` at `shape` (for
        `onnx`, the model at that path) over a window of `window` seconds."""
        self.proc.stdin.write(f"{workload}\t{shape}\t{window}\n")
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"bench_report --serve ended at {workload} {shape}")
        return json.loads(line)["median_s"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
