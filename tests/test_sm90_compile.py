"""The default GPU kernels compile for the H200 (sm_90a) on any machine, as the GPU would compile them.

The interpreter runs the kernels' Python, not Triton's GPU front end, so code that only the GPU compiler refuses (an
early ``return`` in a constexpr branch over a TMA descriptor, stop 18) or paths the interpreter never takes (TMA
descriptors) passed the CPU suite and failed on the device. This compiles the launch configurations the end-to-end
prefill uses (``wide_compile.testing.sm90_compile``, Triton's bundled ptxas) in a process without
``TRITON_INTERPRET`` and checks what came out: tensor-core MMAs, TMA copies where the configuration asks for them
and none where it does not, no register spills, and the query GEMM's rotary epilogue within its shared memory.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = r'''
import json
from wide_compile.testing.sm90_compile import compile_sm90, kernel_stats
from wide_compile.templates.attention_decode import _decode_split_kernel
from wide_compile.templates.attention_prefill import _prefill_kernel
from wide_compile.templates.gemm_gated_up import _gated_up_gemm_kernel
from wide_compile.templates.gemm_output_groups import _output_groups_gemm_kernel
from wide_compile.templates.gemv_decode import _input_groups_gemv_kernel
from wide_compile.templates.router_mask import _router_mask_kernel

bf = "*bf16"
out = {}


def prefill(name, tma, warps, pack, causal=False, tile=False, stages=3):
    kv = "tensordesc<bf16[64, 128]>" if tma else bf
    ptrs = {"Q": bf, "K": kv, "V": kv, "O": bf, "ORDER": "*i32", "COUNT": "*i32", "AMASK": "*u8", "EXT": "*i32",
            "WORK": "*i32", "COUNTERS": "*i32"}
    consts = dict(HEAD_DIM=128, BLOCK_D=128, IS_CAUSAL=causal, HAS_AMASK=not causal, TILE_MASK=tile,
                  INPUT_PRECISION="tf32", BLOCK_M=32, BLOCK_N=64, H_PACK=pack, USE_TMA=tma,
                  HEADS_FIRST=tma, ACTIVE_FIRST=8 if tma else 0)
    out[name] = kernel_stats(compile_sm90(_prefill_kernel, ptrs, consts, ("qk_scale",), warps, stages))


prefill("prefill_4k_tma", True, 4, 2)
prefill("prefill_4k_pointers", False, 4, 2)
prefill("prefill_4k_tma_mask_tiles", True, 4, 2, tile=True)
prefill("prefill_causal_tma", True, 4, 2, causal=True)
prefill("prefill_16k_pointers", False, 8, 4)
out["decode"] = kernel_stats(compile_sm90(
    _decode_split_kernel,
    {"Q": bf, "K": bf, "V": bf, "MASK": "*u8", "O": bf, "PART_O": "*fp32", "PART_LSE": "*fp32", "AMASK": "*u8"},
    dict(Q_PER_KV=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_R=16, IS_CAUSAL=False, HAS_AMASK=True, DIRECT_OUT=False,
         INPUT_PRECISION="tf32", BLOCK_N=64, USE_GDC=False), ("qk_scale",), 4, 2))
gemm = dict(BLOCK_M=128, BLOCK_K=64, EVEN_K=True, EVEN_N=True, GROUP_N=8, UPCAST=False, DOT_PRECISION="tf32",
            USE_TMA=True, WARP_SPECIALIZE=False, TAIL_SPLIT=2, ACTIVE_FIRST=0)
for name, paired in (("gated_up_tma", False), ("gated_up_tma_paired", True)):
    box = "tensordesc<bf16[2, 128, 64]>" if paired else "tensordesc<bf16[128, 64]>"
    out[name] = kernel_stats(compile_sm90(
        _gated_up_gemm_kernel,
        {"x_ptr": bf, "wg_ptr": bf, "wu_ptr": bf, "h_ptr": bf, "tokens_ptr": "*i32", "counts_ptr": "*i32",
         "wg_desc": box, "wu_desc": box},
        dict(gemm, GROUP_SIZE=128, TILES_PER_GROUP=1, ACTIVATION=0, BLOCK_N=128, ACTIVE_FIRST=128, PAIRED=paired,
             UP_FIRST=paired), (), 8, 4))
query = {"x_ptr": bf, "w_ptr": bf, "b_ptr": bf, "y_ptr": bf, "tokens_ptr": "*i32", "counts_ptr": "*i32",
         "w_desc": "tensordesc<bf16[256, 64]>", "cos_ptr": bf, "sin_ptr": bf}
for name, rotary_dim in (("query_tma", 0), ("query_tma_rotary", 128)):
    out[name] = kernel_stats(compile_sm90(_output_groups_gemm_kernel, query, dict(
        gemm, GROUP_SIZE=512, TILES_PER_GROUP=2, HAS_BIAS=False, ROTARY_DIM=rotary_dim, BLOCK_N=256), (), 8, 4))
router = {"x_ptr": bf, "w_in_ptr": "*fp32", "w2_ptr": bf, "b_in_ptr": "*fp32", "w_out_ptr": "*fp32",
          "b_out_ptr": "*fp32", "out_ptr": "*fp32", "ws_ptr": "*fp32", "counter_ptr": "*i32"}
for name, presplit, block_k, stages in (("router_4k", False, 64, 3), ("router_4k_presplit", True, 128, 4)):
    out[name] = kernel_stats(compile_sm90(_router_mask_kernel, router, dict(
        SPLIT=1, BLOCK_M=64, BLOCK_K=block_k, BLOCK_R=32, BLOCK_G=64, EVEN_K=True, W_SPLIT3=True, W_PARTS=2,
        PRESPLIT=presplit, LOGIT_DIFF=True, EPILOGUE_PRECISION="tf32x3", USE_GDC=False), (), 4, stages))
gemv = {"x_ptr": bf, "w_ptr": bf, "b_ptr": bf, "y_ptr": bf, "mask_ptr": "*u8", "union_ptr": "*i32",
        "union_count_ptr": "*i32", "ws_ptr": "*fp32", "counter_ptr": "*i32"}
for name, all_groups in (("input_gemv_list", False), ("input_gemv_all_groups", True)):
    out[name] = kernel_stats(compile_sm90(_input_groups_gemv_kernel, gemv, dict(
        GROUP_SIZE=128, HAS_BIAS=False, ROW_MASK=False, OWN_UNION=not all_groups, ALL_GROUPS=all_groups, BITS=False,
        BLOCK_G=128, SPLIT=4, BLOCK_T=16, BLOCK_N=64, BLOCK_K=128, UPCAST=False, DOT_PRECISION="tf32", USE_GDC=False),
        (), 4, 5))
for name, own_union, bits in (("input_gemv_list_32_rows", True, False), ("input_gemv_bits_32_rows", False, True)):
    out[name] = kernel_stats(compile_sm90(_input_groups_gemv_kernel, gemv, dict(
        GROUP_SIZE=128, HAS_BIAS=False, ROW_MASK=False, OWN_UNION=own_union, ALL_GROUPS=False, BITS=bits,
        BLOCK_G=128, SPLIT=1, BLOCK_T=16, BLOCK_N=32, BLOCK_K=128, UPCAST=False, DOT_PRECISION="tf32", USE_GDC=False),
        (), 4, 8))
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def stats() -> dict:
    spec = importlib.util.find_spec("triton")
    if spec is None:
        pytest.skip("Triton is not installed")
    ptxas = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("Triton's bundled ptxas is missing")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                         cwd=Path(__file__).resolve().parents[1])
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    assert res.returncode == 0 and lines, f"sm_90a compile failed:\n{res.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("name", ["prefill_4k_tma", "prefill_4k_tma_mask_tiles", "prefill_causal_tma",
                                  "gated_up_tma", "gated_up_tma_paired", "query_tma", "query_tma_rotary"])
def test_tma_configurations_copy_through_tma(stats, name):
    s = stats[name]
    assert s["tma"] > 0 and s["wgmma"] > 0, s


@pytest.mark.parametrize("name", ["prefill_4k_pointers", "prefill_16k_pointers"])
def test_pointer_configurations_do_not(stats, name):
    s = stats[name]
    assert s["tma"] == 0 and s["cp_async"] > 0 and s["wgmma"] > 0, s


def test_no_register_spills(stats):
    """Every default configuration fits its registers (ptxas: 0 bytes of spill stores / loads); the attention's TMA
    path needs far fewer registers than its pointer loads (152-162 against 242-255 with Triton 3.7)."""
    spilled = {name: s["ptxas"] for name, s in stats.items() if s["spill_bytes"] or s["registers"] is None}
    assert not spilled, spilled
    assert stats["prefill_4k_tma"]["registers"] < stats["prefill_4k_pointers"]["registers"]
    assert stats["decode"]["wgmma"] == 0  # decode tiles are mma.sync-sized (16 rows at most)


def test_paired_gate_up_runs_one_mma_per_k_step_for_both_weights(stats):
    """With the gate and up tiles in one ``[2, 128, 64]`` box (``PAIRED``) each K step is one 128 x 256 wgmma group
    instead of two 128 x 128 ones (half the ``wgmma`` instructions, half the TMA copies) in the same shared memory."""
    two, one = stats["gated_up_tma"], stats["gated_up_tma_paired"]
    assert one["wgmma"] * 2 == two["wgmma"] and one["tma"] * 2 == two["tma"], (two, one)
    assert one["smem"] <= two["smem"], (two, one)


def test_router_reads_presplit_weight_parts_through_the_pipeline(stats):
    """With ``W_in``'s 16-bit parts made once (``PRESPLIT``) the router's K loop multiplies them on the tensor cores, as
    the in-register split does (its K steps of 128 hold more MMAs than the split's steps of 64); no spills (above)."""
    split, presplit = stats["router_4k"], stats["router_4k_presplit"]
    assert split["wgmma"] > 0 and presplit["wgmma"] > split["wgmma"], (split, presplit)


def test_rotary_epilogue_keeps_the_query_gemm_in_its_shared_memory(stats):
    """The rotation's reshapes go through shared memory once the K loop is done: the kernel must not need more than
    the un-rotated one's pipeline buffers (one program per SM either way) nor more than the H200's 227 KB."""
    plain, rotary = stats["query_tma"], stats["query_tma_rotary"]
    assert rotary["smem"] <= max(plain["smem"], 64 * 1024) and rotary["smem"] <= 227 * 1024, (plain, rotary)


def test_input_gemv_over_all_groups_keeps_its_whole_pipeline(stats):
    """The input-group GEMV's union list costs pipeline stages (each weight address waits on a list entry): with 5
    stages the list path holds 3 in shared memory; walking every group with predicated weight loads (``ALL_GROUPS``,
    the default at 2-32 tokens) holds all 5 ([64 x 128] weight + [128 x 16] token tile = 20 KB each)."""
    listed, walked = stats["input_gemv_list"], stats["input_gemv_all_groups"]
    assert walked["smem"] >= 5 * 20 * 1024 > listed["smem"], (listed, walked)
    assert walked["cp_async"] > listed["cp_async"], (listed, walked)


def test_input_gemv_over_union_bits_keeps_its_whole_pipeline(stats):
    """The pre-masked input GEMV's default at 1-16 tokens (``BITS``, unsplit 32-row tiles, 8 stages): with the union
    held as bits no load sits in the K loop, so all 8 stages stay ([32 x 128] weight + [128 x 16] token tile = 12 KB
    each, 7 in shared memory); the union list's dependent loads at the same tiles leave 3."""
    listed, bits = stats["input_gemv_list_32_rows"], stats["input_gemv_bits_32_rows"]
    assert bits["smem"] >= 7 * 12 * 1024 > 4 * 12 * 1024 > listed["smem"], (listed, bits)
    assert bits["cp_async"] >= 2 * listed["cp_async"], (listed, bits)
    assert bits["spill_bytes"] == 0, bits
