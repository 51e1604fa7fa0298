"""Compile Triton kernels for the H200's architecture (sm_90a) without a GPU, and read what the compiler made of them.

Triton compiles a ``@triton.jit`` function ahead of time from a signature (``triton.compile`` on an ``ASTSource`` with
``GPUTarget("cuda", 90, 32)``) and its bundled ``ptxas`` reports registers and spills. The CPU tests use this to catch
what the interpreter cannot see (code Triton's GPU front end refuses, TMA paths the interpreter does not run), and
``benchmarks/attention_aot_report.py`` to report shared memory, registers and instruction counts.

Must run in a process without ``TRITON_INTERPRET=1`` (under the interpreter ``@triton.jit`` functions are not
compiled); the tests start one.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

# Integer arguments the JIT would specialise as multiples of 16 for real tensors (strides, chunk sizes), and strides
# it would specialise to 1; giving them the same hints keeps the software pipeliner's choices those of the GPU.
_DIVISIBLE = re.compile(r"^(stride_.*[bhst]|chunk|LEN_BUCKET|CHUNK_BUCKET|K|N)$")
_UNIT_STRIDES = ("stride_as",)


def compile_sm90(fn, pointers: dict[str, str], consts: dict, floats: tuple[str, ...] = (), num_warps: int = 4,
                 num_stages: int = 3):
    """``triton.compile`` of ``fn`` for sm_90a. ``pointers``: argument name -> Triton type (``"*bf16"``, or
    ``"tensordesc<bf16[64, 128]>"`` for a host-side TMA descriptor); ``consts``: constexpr values; ``floats``: fp32
    scalars; every other argument is an i32."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = {**{k: 1 for k in _UNIT_STRIDES if k in fn.arg_names}, **consts}
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
            if pointers[name].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in floats:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if _DIVISIBLE.match(name):
                attrs[(i,)] = [["tt.divisibility", 16]]
    constexprs = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def ptxas_report(ptx: str) -> str:
    """ptxas's resource lines for ``ptx`` on sm_90a (registers, stack, spills; C7515 wgmma serialisation warnings)."""
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        res = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    lines = [ln.split("info    : ")[-1] for ln in res.stderr.splitlines() if "registers" in ln or "spill" in ln]
    return " | ".join(lines)


def kernel_stats(compiled) -> dict:
    """Shared memory, instruction counts (``wgmma``, ``cp.async``, TMA) and ptxas's registers / spill bytes."""
    ptx = compiled.asm["ptx"]
    report = ptxas_report(ptx)
    registers = re.search(r"Used (\d+) registers", report)
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
    return {"smem": compiled.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
            "cp_async": ptx.count("cp.async.cg"), "tma": ptx.count("cp.async.bulk.tensor"),
            "registers": int(registers.group(1)) if registers else None, "spill_bytes": sum(spills),
            "ptxas": report}


__all__ = ["compile_sm90", "kernel_stats", "ptxas_report"]
