"""All kernel benchmarks (issue 4) in one call: linear (GEMM/GEMV) then attention, on a CUDA GPU.

    python3 benchmarks/kernels.py --out benchmarks/results [--quick]

Each part writes its own JSON + markdown (kernels_linear.*, kernels_attention.*) under --out; then
``kernels_targets.py`` writes issue 4's targets from both into ``kernels_targets.md``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--quick", action="store_true", help="attention: fewer shapes")
    args = parser.parse_args()
    linear = [sys.executable, str(HERE / "kernels_linear.py"), "--out", args.out]
    attention = [sys.executable, str(HERE / "kernels_attention.py"), "--out-dir", args.out] + (["--quick"] if args.quick else [])
    targets = [sys.executable, str(HERE / "kernels_targets.py"), "--linear", str(Path(args.out) / "kernels_linear.json"),
               "--attention", str(Path(args.out) / "kernels_attention.json"),
               "--out", str(Path(args.out) / "kernels_targets.md")]
    for cmd in (linear, attention, targets):
        print("+", " ".join(cmd), flush=True)
        code = subprocess.call(cmd)
        if code:
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
