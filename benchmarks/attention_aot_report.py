"""Compile the attention kernels for sm_90a without a GPU and report shared memory, registers, spills, wgmma/cp.async.

Usage: ``TRITON_INTERPRET=0 python benchmarks/attention_aot_report.py`` (needs only Triton's bundled ptxas; the
compiling is ``wide_compile.testing.sm90_compile``). Pointer and stride arguments get the 16-divisibility hint the JIT
gives real tensors, so the software pipeliner behaves as it does on the GPU.
"""

from __future__ import annotations

from wide_compile.templates.attention_decode import _decode_split_kernel
from wide_compile.templates.attention_prefill import _prefill_kernel
from wide_compile.testing.sm90_compile import compile_sm90 as _compile
from wide_compile.testing.sm90_compile import ptxas_report as _ptxas_report


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
