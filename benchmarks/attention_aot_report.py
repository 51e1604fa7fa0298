"""Compile the attention kernels for sm_90a without a GPU and report shared memory, registers, spills, wgmma/cp.async.

Usage: ``python benchmarks/attention_aot_report.py`` (needs only Triton's bundled ptxas). Pointer and stride arguments
get the 16-divisibility hint the JIT gives real tensors, so the software pipeliner behaves as it does on the GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from wide_compile.templates.attention_decode import _decode_split_kernel
from wide_compile.templates.attention_prefill import _prefill_kernel

_DIVISIBLE = re.compile(r"^(stride_.*[bhst]|chunk|LEN_BUCKET|CHUNK_BUCKET)$")


_UNIT_STRIDES = ("stride_as",)  # the boolean mask's key stride: 1 for a real mask, which the JIT specialises


def _compile(fn, pointers: dict[str, str], consts: dict, floats: tuple[str, ...], num_warps: int, num_stages: int):
    consts = {**{k: 1 for k in _UNIT_STRIDES if k in fn.arg_names}, **consts}
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in floats:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if _DIVISIBLE.match(name):
                attrs[(i,)] = [["tt.divisibility", 16]]
    constexprs = {(fn.arg_names.index(k),): v for k, v in consts.items()}
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages})


def _ptxas_report(ptx: str) -> str:
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    res = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    os.unlink(f.name)
    lines = [ln.split("info    : ")[-1] for ln in res.stderr.splitlines() if "registers" in ln or "spill" in ln]
    return " | ".join(lines)


def main() -> None:
    bf = "*bf16"
    # (BLOCK_M, BLOCK_N, warps, stages, H_PACK, causal, explicit mask, mask-tile pass); each with pointer and TMA K / V
    prefill = [(m, n, w, s, 1, True, False, False) for m, n, w, s in
               [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)]]
    # explicit boolean mask (static caches): the extents pass (contiguous rows) and the mask-tile pass; packed heads
    prefill += [(m, n, w, s, p, False, True, tile) for m, n, w, s, p in
                [(64, 64, 4, 3, 1), (128, 64, 8, 3, 1), (32, 64, 4, 3, 2), (32, 64, 4, 2, 2), (32, 64, 8, 3, 4)]
                for tile in (False, True)]
    for (m, n, w, s, pack, causal, amask, tile), tma in ((c, t) for c in prefill for t in (False, True)):
        kv = f"tensordesc<bf16[{n}, 128]>" if tma else bf
        prefill_ptrs = {"Q": bf, "K": kv, "V": kv, "O": bf, "ORDER": "*i32", "COUNT": "*i32", "AMASK": "*u8",
                        "EXT": "*i32"}
        consts = dict(HEAD_DIM=128, BLOCK_D=128, IS_CAUSAL=causal, HAS_AMASK=amask, TILE_MASK=tile,
                      INPUT_PRECISION="tf32", BLOCK_M=m, BLOCK_N=n, H_PACK=pack, USE_TMA=tma)
        k = _compile(_prefill_kernel, prefill_ptrs, consts, ("qk_scale",), w, s)
        ptx = k.asm["ptx"]
        kind = ("explicit, mask-tile pass" if tile else "explicit, extents pass") if amask else "causal"
        print(f"prefill BM={m} BN={n} w={w} s={s} H_PACK={pack} mask={kind} K/V={'TMA' if tma else 'pointers'}: "
              f"smem={k.metadata.shared} wgmma={ptx.count('wgmma.mma_async')} cp.async={ptx.count('cp.async.cg')} "
              f"tma={ptx.count('cp.async.bulk.tensor')} :: {_ptxas_report(ptx)}")
    dec_ptrs = {"Q": bf, "K": bf, "V": bf, "MASK": "*u8", "O": bf, "PART_O": "*fp32", "PART_LSE": "*fp32",
                "AMASK": "*u8"}
    for n, w, s, causal, amask, gdc in [(64, 4, 3, True, False, False), (128, 4, 3, True, False, False),
                                        (128, 8, 3, True, False, False), (64, 4, 2, False, True, False),
                                        (128, 4, 3, False, True, False), (128, 4, 3, False, True, True)]:
        consts = dict(Q_PER_KV=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_R=16, IS_CAUSAL=causal, HAS_AMASK=amask,
                      DIRECT_OUT=False, INPUT_PRECISION="tf32", BLOCK_N=n, USE_GDC=gdc)
        k = _compile(_decode_split_kernel, dec_ptrs, consts, ("qk_scale",), w, s)
        ptx = k.asm["ptx"]
        print(f"decode BN={n} w={w} s={s} mask={'explicit' if amask else 'causal'}{' pdl' if gdc else ''}: "
              f"smem={k.metadata.shared} wgmma={ptx.count('wgmma.mma_async')} mma.sync={ptx.count('mma.sync')} "
              f"cp.async={ptx.count('cp.async.cg')} griddepcontrol={ptx.count('griddepcontrol')} :: "
              f"{_ptxas_report(ptx)}")


if __name__ == "__main__":
    main()
