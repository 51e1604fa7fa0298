"""The configuration grids that ``benchmarks/kernels_linear.py --sweep-*`` times (one function per flag; each
returns ``[(op, tokens, mask, [config, ...]), ...]`` for ``kernels_linear.run_sweep``), registered in ``FLAGS`` with
the result file each one writes and what it times (the command line is built from it). ``SWEEPS`` is the plain
``--sweep`` grid."""
from __future__ import annotations

import inspect

from kernels_linear_ops import MASKS, OPS, TRAINED

from wide_compile.templates.gemv_decode import _pipeline_stages, _token_tile


SWEEPS = [
    # (op, M, mask, [configs]); GEMM: BLOCK_M/BLOCK_N/BLOCK_K/num_warps/num_stages (+SPLIT, GROUP_N)
    ("gate_up", 256, "rand50", [dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3),
                               dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4),
                               dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)]),
    ("gate_up", 1024, "rand50", [dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3),
                                dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)]),
    ("down_pm", 4096, "rand50", [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
                                dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3),
                                dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3)]),
    ("down_pm", 4096, "pattern50", [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
                                   dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=5)]),
    ("down", 4096, "rand50", [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
                             dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)]),
    ("down_pm", 256, "rand50", [dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4),
                               dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
                               dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4, SPLIT=1),
                               dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4, SPLIT=8),
                               dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4)]),
    ("down_pm", 1024, "rand50", [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4),
                                dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
                                dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4)]),
    # GEMV: BLOCK_N/BLOCK_K/num_warps/num_stages/SPLIT
    ("gate_up", 1, "rand50", [dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=1),
                             dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=2),
                             dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=4),
                             dict(BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=4)]),
    ("gate_up", 16, "rand50", [dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=1),
                              dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=2),
                              dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=4)]),
    ("q_proj", 1, "rand50", [dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=4, SPLIT=1),
                            dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=4, SPLIT=4),
                            dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=4, SPLIT=8),
                            dict(BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=4, SPLIT=4),
                            dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=8)]),
    ("q_proj", 16, "rand50", [dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=4, SPLIT=4),
                             dict(BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=4, SPLIT=4),
                             dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=8)]),
    ("down", 1, "rand50", [dict(BLOCK_N=16, BLOCK_K=128, num_warps=4, num_stages=6, SPLIT=1),
                          dict(BLOCK_N=16, BLOCK_K=128, num_warps=4, num_stages=6, SPLIT=4),
                          dict(BLOCK_N=16, BLOCK_K=128, num_warps=4, num_stages=6, SPLIT=8),
                          dict(BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=6, SPLIT=4),
                          dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=8)]),
    ("down", 16, "rand50", [dict(BLOCK_N=16, BLOCK_K=128, num_warps=4, num_stages=6, SPLIT=4),
                           dict(BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=6, SPLIT=4),
                           dict(BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4, SPLIT=8)]),
    ("o_proj", 1, "rand50", [dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=6, SPLIT=2),
                            dict(BLOCK_N=16, BLOCK_K=128, num_warps=4, num_stages=6, SPLIT=4),
                            dict(BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=6, SPLIT=4)]),
]


def decode_sweeps() -> list:
    """A grid over the input-group GEMV's tile (BLOCK_N x BLOCK_K), pipeline depth and split, for the decode cases
    that are furthest from their byte bound (down and o_proj at one token; down at 8)."""
    grid = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=st, SPLIT=sp)
            for bn in (16, 32, 64) for bk in (128, 256) for st in (5, 9) for sp in (4, 8, 16)]
    down = [c for c in grid if c["BLOCK_K"] == 128]  # group size 128
    return [("down", 1, "rand50", down), ("o_proj", 1, "rand50", grid), ("down", 8, "rand50", down)]


def tma_sweeps(ms: tuple = (4096, 16384), wide: bool = True) -> list:
    """The prefill gate/up GEMM with its weight tiles through TMA descriptors (``TMA=True``) or pointer loads, at the
    128 x 128 x 64 tile with 8 warps; ``wide``: also other pipeline depths and tiles (the first sweep,
    ``kernels_linear_sweep_tma_v1.json``), else only the pointer loads with 3 stages (the old default) and TMA with 3
    and 4 stages, followed by the query projection's output-group GEMM at its default tile with and without TMA."""
    from wide_compile.templates.gemm_output_groups import default_config as q_default

    base = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8)
    configs = [dict(base, num_stages=3, TMA=False), dict(base, num_stages=3, TMA=True),
               dict(base, num_stages=4, TMA=True)]
    if wide:
        configs += [dict(base, BLOCK_K=128, num_stages=2, TMA=True), dict(base, num_stages=4, TMA=False),
                    dict(base, BLOCK_N=64, num_stages=4, TMA=True),
                    dict(base, BLOCK_M=64, num_warps=4, num_stages=4, TMA=True)]
        return [("gate_up", m, "rand50", configs) for m in ms]
    q_configs = {m: [dict(q_default(m, OPS["q_proj"]["gs"]), TMA=t) for t in (False, True)] for m in ms}
    return ([("gate_up", m, "rand50", configs) for m in ms]
            + [("q_proj", m, "rand50", q_configs[m]) for m in ms])


def gate_up_tile_sweeps(ms: tuple = (4096,)) -> list:
    """The prefill gate/up GEMM at its TMA default (128 x 128 tiles, 8 warps, 4 stages) against tiles of 256 tokens
    by 64 columns (each accumulator 256 x 64: the A tile read once per 128 MMA columns, as in cuBLAS's 256 x 128) and
    the program order's group width ``GROUP_N``, and Triton's automatic warp specialisation of the K loop
    (``WARP_SPECIALIZE``; stop 14's run had no such rows), and (stop 21) 128-wide K steps or one warpgroup per program
    (``kernels_linear_sweep_gate_up_tiles.json``)."""
    base = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4, TMA=True)
    wide_m = dict(base, BLOCK_M=256, BLOCK_N=64)
    configs = [base, dict(base, WARP_SPECIALIZE=True), dict(base, WARP_SPECIALIZE=True, num_stages=3),
               dict(base, GROUP_N=16), wide_m, dict(base, BLOCK_N=64, num_stages=5),
               # stop 21 (ncu: CTA-barrier stalls, one per K step): half the barriers per FLOP, or barriers over 4 warps
               dict(base, BLOCK_K=128, num_stages=2), dict(base, BLOCK_M=64, num_warps=4),
               dict(base, BLOCK_M=64, num_warps=4, num_stages=3)]
    return [("gate_up", m, "rand50", configs) for m in ms]


def gate_up_moderate_tile_sweeps(ms: tuple = (256,)) -> list:
    """The gate/up GEMM at 256 tokens (57% of the bound in stop 37's table). Nsight Compute there
    (``results/ncu_gate_up_256.txt``): 448 programs of one warpgroup, 1 per SM (131 KB of shared memory), 3.39 waves,
    half of them a group's second token tile (zero-only or a tail of a few rows), DRAM at 52% and L2 hits at 47%. So:
    tiles of 256 tokens (one token tile per group: no tails, no weight re-reads; every row's MMA), quarter tails, wider
    and narrower n tiles, the program order and ``ACTIVE_FIRST``, rand50 and trained masks."""
    base = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4, TMA=True, TAIL_SPLIT=2)
    configs = [base, dict(base, TAIL_SPLIT=4), dict(base, ACTIVE_FIRST=True), dict(base, GROUP_N=2),
               dict(base, GROUP_N=32), dict(base, num_stages=3),
               dict(base, BLOCK_N=128, num_warps=8), dict(base, BLOCK_N=32, TAIL_SPLIT=4),
               dict(base, BLOCK_M=256, num_warps=8, num_stages=3), dict(base, BLOCK_M=256, BLOCK_N=32, num_warps=8),
               dict(base, BLOCK_M=64, TAIL_SPLIT=1), dict(base, BLOCK_M=64, BLOCK_N=128, TAIL_SPLIT=1)]
    return [("gate_up", m, mask, configs) for m in ms for mask in ("rand50", "trained")]


def half_tail_sweeps(ms: tuple = (1024, 2048, 4096, 16384), splits: tuple = (1, 2, 4)) -> list:
    """The prefill gate/up GEMM and the query projection's output-group GEMM at their default tiles with and without
    ``TAIL_SPLIT`` 1 / 2 / 4 (a group's last tile with at most half / a quarter of its rows active runs its products on
    that many rows: at 50% and 4096 tokens about 1.5% of the gate/up tiles' rows are padding that halves remove;
    ``kernels_linear_sweep_half_tail.json``)."""
    from wide_compile.templates.gemm_gated_up import default_config

    from wide_compile.templates.gemm_output_groups import default_config as q_default

    gs, q_gs = OPS["gate_up"]["gs"], OPS["q_proj"]["gs"]
    q_groups = OPS["q_proj"]["N"] // q_gs
    return ([("gate_up", m, "rand50", [dict(default_config(m, gs), TAIL_SPLIT=t) for t in splits]) for m in ms]
            + [("q_proj", m, "rand50", [dict(q_default(m, q_gs, q_groups), TAIL_SPLIT=t)
                                       for t in splits])
               for m in ms])


def active_first_sweeps(ms: tuple = (4096, 16384, 1024)) -> list:
    """The prefill gate/up GEMM and the query projection's output-group GEMM at their default tiles with and without
    ``ACTIVE_FIRST`` (the tiles below the largest group's count first, the zero-only tiles last, where they can fill
    the SMs the last wave of MMA tiles leaves idle; ``kernels_linear_sweep_active_first.json``)."""
    from wide_compile.templates.gemm_gated_up import default_config

    from wide_compile.templates.gemm_output_groups import default_config as q_default

    gs, q_gs = OPS["gate_up"]["gs"], OPS["q_proj"]["gs"]
    q_groups = OPS["q_proj"]["N"] // q_gs
    return ([("gate_up", m, "rand50", [dict(default_config(m, gs), ACTIVE_FIRST=a) for a in (False, True)])
             for m in ms]
            + [("q_proj", m, "rand50", [dict(q_default(m, q_gs, q_groups), ACTIVE_FIRST=a) for a in (False, True)])
               for m in ms])


def query_tile_sweeps(ms: tuple = (4096,)) -> list:
    """The query projection's output-group GEMM (8 groups of 512) at its default tile for many tokens (128 x 256,
    8 warps, TMA, half-height tails) with 3 and 4 pipeline stages, against other tile shapes and program orders
    (``kernels_linear_sweep_query_tiles.json``)."""
    from wide_compile.templates.gemm_output_groups import default_config as q_default

    q_gs = OPS["q_proj"]["gs"]
    sweeps = []
    for m in ms:
        base = q_default(m, q_gs, OPS["q_proj"]["N"] // q_gs)
        sweeps.append(("q_proj", m, "rand50", [
            dict(base, num_stages=3), dict(base, num_stages=4), dict(base, BLOCK_N=128, num_stages=3),
            dict(base, BLOCK_N=128, num_stages=4), dict(base, BLOCK_M=256, BLOCK_N=128), dict(base, GROUP_N=4),
            dict(base, GROUP_N=16), dict(base, TAIL_SPLIT=4)]))
    return sweeps


def paired_sweeps(ms: tuple = (256, 512, 1024, 2048, 4096, 8192, 16384)) -> list:
    """The prefill gate/up GEMM with the gate and up tiles in one TMA box and one MMA per K step (``PAIRED``, the
    default with TMA since stop 24) against two boxes and two MMAs (``PAIRED=False``) at the default tiles; below 2048
    tokens also TMA + ``PAIRED`` on narrower or shorter tiles (256-511 tokens defaulted to pointer loads when the
    committed sweep ran; that sweep made TMA their default), and from 8192 4 stages against the default 3
    (``kernels_linear_sweep_paired.json``)."""
    from wide_compile.templates.gemm_gated_up import default_config

    sweeps = []
    for m in ms:
        base = default_config(m, OPS["gate_up"]["gs"])
        configs = [base, dict(base, PAIRED=False)] if base.get("TMA") else [base]
        if m < 2048:
            configs += [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_warps=w, num_stages=st, TMA=True, TAIL_SPLIT=2)
                        for bm, bn, w in ((128, 64, 4), (64, 128, 4), (128, 128, 8)) for st in (3, 4)]
        if m >= 8192:
            configs.append(dict(base, num_stages=4))
        sweeps.append(("gate_up", m, "rand50", configs))
    return sweeps


def moderate_tile_sweeps() -> list:
    """The output-group GEMMs (query projection: 8 groups of 512; gate/up: 112 groups of 128) at 64-1024 tokens,
    where the default tiles leave few programs per group (64 tokens: 32 programs for the query projection) or spill
    binomially over tile edges (256 tokens: 128 +- 8 active per group): token tile x output tile x pipeline depth
    (``kernels_linear_sweep_moderate.json``)."""
    def grid(bms, bns, stages=(3, 4), tma=(False,)):
        return [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, num_warps=8 if bm * bn >= 128 * 128 else 4,
                     num_stages=st, TMA=t) for bm in bms for bn in bns for st in stages for t in tma]
    return [("q_proj", 64, "rand50", grid((32, 64), (32, 64, 128), stages=(4,))),
            ("q_proj", 256, "rand50", grid((32, 64, 128), (32, 64, 128), stages=(4,))),
            ("q_proj", 1024, "rand50", grid((64, 128), (64, 128), tma=(False, True))),
            ("gate_up", 64, "rand50", grid((32, 64), (32, 64, 128), stages=(3,))),
            ("gate_up", 256, "rand50", grid((32, 64, 128), (64, 128), stages=(3, 4))),
            ("gate_up", 1024, "rand50", grid((64, 128), (64, 128), stages=(3, 4), tma=(True,)))]


def moderate_gemv_sweeps() -> list:
    """The output-group ops (query projection: 8 groups of 512; gate/up: 112 groups of 128) at 32-256 tokens, where
    with i.i.d. masks almost every group is active for some token, so the weight bytes are dense: the GEMV kernel
    (``path="gemv"``: one tile of all tokens, reads each active weight tile once, tensor cores on W x^T, split K)
    against the GEMM over reordered per-group token lists at its default tiles (``path="gemm"``) (``kernels_linear_sweep_moderate_gemv.json``)."""
    def gemv(bns, bks, splits, stages=(3, 4)):
        return [dict(path="gemv", BLOCK_N=bn, BLOCK_K=bk, SPLIT=sp, num_warps=4, num_stages=st)
                for bn in bns for bk in bks for sp in splits for st in stages]
    sweeps = []
    for m in (32, 64, 128, 256):
        sweeps.append(("q_proj", m, "rand50", [dict(path="gemm")] + gemv((32, 64), (128,), (2, 4, 8), (4,))))
        sweeps.append(("gate_up", m, "rand50", [dict(path="gemm")] + gemv((32, 64), (128,), (1, 2), (3,))))
    return sweeps


def gated_decode_sweeps() -> list:
    """The fused gate/up GEMV at 1-16 tokens (its default: 64-row tiles, no split of K, 4 stages; at 50% one token
    leaves about 112 active programs for 132 SMs) against splitting K and narrower tiles
    (``kernels_linear_sweep_gated_decode.json``)."""
    configs = [dict(path="gemv", BLOCK_N=bn, BLOCK_K=128, SPLIT=sp, num_warps=4, num_stages=st)
               for bn, sp, st in ((64, 1, 4), (64, 2, 4), (64, 4, 4), (32, 1, 4), (32, 2, 4), (32, 4, 4), (64, 2, 3))]
    return [("gate_up", m, "rand50", configs) for m in (1, 4, 16)]


def _gated_gemv(block_n: int, block_k: int, stages: int, warps: int = 4) -> dict:
    """One configuration of the fused gate/up GEMV for the sweeps below (K not split)."""
    return dict(path="gemv", BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=1, num_warps=warps, num_stages=stages)


def gated_moderate_sweeps(ms: tuple = (1, 2, 32, 64)) -> list:
    """The fused gate/up GEMV's tile height, pipeline depth and warps where its issue-4 rows miss 90% of the byte
    bound (2 tokens: ~168 of 224 programs active for 132 SMs; 64 tokens, where "auto" takes the GEMM) and at one
    token (``kernels_linear_sweep_gated_moderate.json``)."""
    few = [_gated_gemv(64, 128, 4, 4), _gated_gemv(32, 128, 4, 4), _gated_gemv(32, 128, 3, 4),
           _gated_gemv(64, 128, 3, 4), _gated_gemv(64, 128, 4, 8), _gated_gemv(32, 128, 6, 4)]
    many = [dict(path="gemm"), _gated_gemv(64, 128, 3, 4), _gated_gemv(64, 128, 4, 4), _gated_gemv(64, 128, 4, 8),
            _gated_gemv(32, 128, 4, 4), _gated_gemv(128, 128, 2, 8)]
    return [("gate_up", m, "rand50", few if m <= 16 else many) for m in ms]


def gated_stage_sweeps(ms: tuple = (1, 2, 4, 8, 16, 32, 64, 128)) -> list:
    """The fused gate/up GEMV's pipeline: 4 stages of 128-wide K steps (one program per SM), 3 (two fit), and up to 16
    tokens 5 / 6 / 8 stages of 64-wide steps (two / two / one per SM); above 16 tokens the GEMM beside them; every
    mask kind (``kernels_linear_sweep_gated_stages.json``; ``_v1.json``: the first run, 128-wide steps only)."""
    few = [_gated_gemv(64, 128, 4), _gated_gemv(64, 128, 3), _gated_gemv(64, 64, 5), _gated_gemv(64, 64, 6),
           _gated_gemv(64, 64, 8)]
    many = [_gated_gemv(64, 128, 4), _gated_gemv(64, 128, 3), dict(path="gemm")]
    return [("gate_up", m, mask, few if m <= 16 else many) for m in ms for mask in MASKS]


def gated_wide_k_sweeps(ms: tuple = (1, 2, 4)) -> list:
    """The fused gate/up GEMV with 256-wide K steps (512 B of each weight row per load instead of 256 B: fewer, longer
    runs per DRAM page) against its default 128-wide ones, 4 / 8 warps, 32- / 64-row tiles, every mask kind
    (``kernels_linear_sweep_gated_wide_k.json``)."""
    configs = [_gated_gemv(64, 128, 4, 4), _gated_gemv(64, 256, 2, 4), _gated_gemv(64, 256, 3, 4),
               _gated_gemv(64, 256, 2, 8), _gated_gemv(64, 256, 3, 8), _gated_gemv(32, 256, 3, 4),
               _gated_gemv(32, 256, 4, 4), _gated_gemv(64, 128, 4, 8)]
    return [("gate_up", m, mask, configs) for m in ms for mask in MASKS]


def _input_gemv(block_n: int, stages: int, split: int) -> dict:
    """One configuration of the input-group GEMV (down / o_proj) for the sweeps below (128-wide K steps, 4 warps)."""
    return dict(BLOCK_N=block_n, BLOCK_K=128, num_warps=4, num_stages=stages, SPLIT=split)


def input_split_sweeps(ms: tuple = (1, 2, 8, 16)) -> list:
    """The input-group GEMV (down / o_proj) with K split in fewer parts than its default 4: each split's last program
    sums the partials, a tail on the critical path that the unsplit gated GEMV has not; fewer splits need taller or
    deeper pipelines to keep the bytes in flight (``kernels_linear_sweep_input_split.json``)."""
    g = _input_gemv
    configs = [g(64, 5, 4), g(64, 5, 2), g(64, 8, 2), g(64, 5, 3), g(32, 5, 2), g(32, 8, 2), g(32, 8, 1), g(32, 12, 1),
               g(16, 8, 1), g(16, 12, 1), g(128, 4, 2)]
    return [(op, m, "rand50", configs) for op in ("down", "o_proj") for m in ms]


def input_all_groups_sweeps(ms: tuple = (1, 2, 4, 8, 16, 32)) -> list:
    """The input-group GEMV without its union list (``ALL_GROUPS``: every program walks every group and predicates off
    the weight loads of unused ones), against the default (the list built in each program, whose dependent loads
    left the sm_90a pipeline 3 of its 5 stages), at its split / stage neighbours; down, down pre-masked and o_proj,
    50% and trained masks. Stop 36's question: the down GEMV took ~15% longer than a pipelined read of the same bytes
    (``kernels_linear.json``'s ``read`` column)."""
    def allg(**kw) -> dict:
        return dict(path="gemv", ALL_GROUPS=True, **kw)

    configs = [dict(path="gemv"), allg(), allg(SPLIT=2), allg(SPLIT=8), allg(num_stages=7),
               allg(BLOCK_N=32, SPLIT=2, num_stages=8), allg(BLOCK_N=128, SPLIT=4, num_warps=8, num_stages=4)]
    return [(op, m, mask, configs) for m in ms for op in ("down", "down_pm", "o_proj") for mask in ("rand50", "trained")
            if not (op == "o_proj" and m == 1)]


def input_bits_sweeps(ms: tuple = (1, 2, 4, 8, 16, 32)) -> list:
    """The input-group GEMV with its split's share of the union held as bits in registers (``BITS``,
    ``templates/group_bits.py``: no load in the K loop) against the default (one token: the union list built by each
    program, whose dependent loads leave the 12-stage sm_90a pipeline 5 buffers; 2-32 tokens: every group walked with
    a mask row loaded per step); at the default tiles and neighbours. Stop 37's question
    (``down_gemv_parts_probe.py``): the per-step loads were worth 1 µs at 8 tokens with 128-row tiles and 17 µs with
    32-row tiles."""
    def bits(**kw) -> dict:
        return dict(path="gemv", BITS=True, **kw)

    configs = [dict(path="gemv"), bits(), bits(BLOCK_N=32, SPLIT=1, num_warps=4, num_stages=12),
               bits(BLOCK_N=32, SPLIT=1, num_warps=4, num_stages=8),
               bits(BLOCK_N=64, SPLIT=2, num_warps=4, num_stages=6),
               bits(BLOCK_N=64, SPLIT=4, num_warps=4, num_stages=5)]
    return [(op, m, mask, configs) for m in ms for op in ("down", "down_pm", "o_proj")
            for mask in ("rand50", "trained")]


def input_bits_premasked_sweeps(ms: tuple = (1, 2, 4, 8, 16)) -> list:
    """``BITS`` with unsplit 32-row tiles on pre-masked inputs (the model's down and output projections), where
    ``input_bits_sweeps`` found it 1-6% faster for the down projection at 1-8 tokens; 6, 8 and 12 stages."""
    def bits(stages: int) -> dict:
        return dict(path="gemv", BITS=True, BLOCK_N=32, SPLIT=1, num_warps=4, num_stages=stages)

    configs = [dict(path="gemv"), bits(6), bits(8), bits(12)]
    return [(op, m, mask, configs) for m in ms for op in ("down_pm", "o_proj_pm") for mask in ("rand50", "trained")]


def small_k_decode_sweeps(ms: tuple = (1, 2)) -> list:
    """The query projection's output-group GEMV and the output projection's input-group GEMV (K = 4096: 32 MB weights,
    where a launch's fixed time is a large part) with fewer K splits and deeper pipelines than their defaults (8 and 4
    splits), every mask kind, three draws of the 50% mask at one token
    (``kernels_linear_sweep_small_k_decode.json``; at 2-16 tokens ``_m2_16.json``)."""
    def out_gemv(block_n: int, block_k: int, split: int, stages: int) -> dict:
        return dict(path="gemv", BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=4, num_stages=stages)

    q = [out_gemv(64, 128, 8, 4), out_gemv(64, 128, 4, 6), out_gemv(32, 128, 4, 6), out_gemv(32, 128, 2, 8),
         out_gemv(32, 128, 1, 12), out_gemv(64, 128, 2, 8), out_gemv(32, 256, 2, 4), out_gemv(64, 256, 4, 3)]
    if max(ms) > 2:  # 4-16 tokens (stop 30): also the shallower 2- and 4-split pipelines
        q += [out_gemv(64, 128, 2, 4), out_gemv(64, 128, 4, 3), out_gemv(64, 128, 2, 6)]
    o = [_input_gemv(64, 5, 4), _input_gemv(32, 12, 1), _input_gemv(32, 16, 1), _input_gemv(32, 10, 2),
         _input_gemv(64, 8, 2), _input_gemv(16, 16, 1), _input_gemv(32, 8, 4)]
    masks = ["rand50", "rand50", "rand50", "pattern50", "rand25", "rand70"]
    return [(op, m, mask, configs) for m in ms for op, configs in (("q_proj", q), ("o_proj", o))
            for mask in (masks if m == 1 else ["rand50"])]


def rows_gemv_sweeps(ms: tuple = (1,)) -> list:
    """The row-streaming one-token GEMVs (``templates/gemv_rows.py``: ``ROWS`` weight rows per program through
    register loads, no split of K) against ``gemv_decode``'s MMA GEMVs (``ROWS=0``) on the 32 MB projections, every
    mask kind and two draws of the 50% mask, and on the down projection (117 MB) at 50%
    (``kernels_linear_sweep_rows_gemv.json``)."""
    rows = [dict(ROWS=r, num_warps=w) for r, w in ((1, 4), (2, 4), (2, 8), (4, 8), (8, 8))]
    out = []
    for m in ms:
        for op in ("q_proj", "o_proj_pm", "o_proj"):
            out += [(op, m, mask, [dict(ROWS=0), *rows]) for mask in ("rand50", "rand50", "pattern50", "rand25",
                                                                       "rand70")]
        out.append(("down_pm", m, "rand50", [dict(ROWS=0), dict(ROWS=1, num_warps=8), dict(ROWS=2, num_warps=8)]))
    return out


def input_moderate_gemv_sweeps(ms: tuple = (32, 64, 128, 256)) -> list:
    """The input-group GEMV (down / o_proj, input not masked) above 16 tokens, where "auto" ran cuBLAS on the masked
    input (``path="dense"``, the first configuration): with i.i.d. masks a few dozen tokens use every group, so both
    read the whole weight, and the GEMV masks ``x`` in its loads instead of in a separate pass
    (``kernels_linear_sweep_input_moderate.json``). Stages are cut to what fits in shared memory at each token tile."""
    def g(block_n: int, stages: int, split: int, m: int) -> dict:
        fit = _pipeline_stages(block_n, 128, _token_tile(m), 2, most=stages)  # what the library's rule allows
        return dict(path="gemv", BLOCK_N=block_n, BLOCK_K=128, num_warps=4, num_stages=fit, SPLIT=split)

    out = []
    for m in ms:
        configs = [dict(path="dense"), g(64, 5, 4, m), g(64, 4, 2, m), g(64, 3, 8, m), g(32, 5, 4, m), g(32, 6, 2, m),
                   g(128, 3, 2, m), g(128, 3, 4, m)]
        for op in ("down", "o_proj"):
            out += [(op, m, mask, configs) for mask in ("rand50", "trained")]
    return out


def input_wide_moderate_sweeps(ms: tuple = (48, 64, 96, 128), ops: tuple = ("down_pm", "down")) -> list:
    """The input-group GEMV above 32 tokens with the 128-row, 8-warp tiles it takes at 4-32 tokens (every group walked,
    unused groups' weight loads predicated off: ``ALL_GROUPS``), against cuBLAS (``path="dense"``, the default there:
    on the input as it is for ``down_pm``, after the masking launch for ``down``). Stop 32's moderate sweep timed
    only 4-warp tiles above 32 tokens (64 tokens: 42.5 µs against cuBLAS's 39.0); the down projection at 64 tokens
    is at 72% of its byte bound on cuBLAS (``kernels_linear_sweep_input_wide_moderate.json``)."""
    def g(split: int, m: int, block_n: int = 128, warps: int = 8, most: int = 4) -> dict:
        fit = _pipeline_stages(block_n, 128, _token_tile(m), 2, most=most)
        return dict(path="gemv", ALL_GROUPS=True, BLOCK_N=block_n, BLOCK_K=128, num_warps=warps, num_stages=fit,
                    SPLIT=split)

    out = []
    for m in ms:
        configs = [dict(path="dense"), g(4, m), g(2, m), g(8, m), g(4, m, most=3), g(4, m, block_n=64, warps=4, most=5)]
        out += [(op, m, mask, configs) for op in ops for mask in ("rand50", TRAINED)]
    return out


def input_wide_moderate_o_proj_sweeps(ms: tuple = (48, 64)) -> list:
    """``input_wide_moderate_sweeps`` on the output projection (groups of 512, K = 4096): its 128-row tiles
    (``kernels_linear_sweep_input_wide_moderate_o_proj.json``)."""
    return input_wide_moderate_sweeps(ms, ops=("o_proj",))


def gated_wide_rows_sweeps(ms: tuple = (64, 32)) -> list:
    """The fused gate/up GEMV at 32-64 tokens with 128-row tiles (one group's gate and up rows per program, 112
    programs for 132 SMs) against its default 64-row tiles (224 programs): every program reads the whole token tile
    ``x`` from L2 (512 KB at 64 tokens), so 224 programs move 115 MB of ``x`` beside the 235 MB of weights, 112 move
    half that (``kernels_linear_sweep_gated_wide_rows.json``)."""
    def g(block_n: int, block_k: int, stages: int, warps: int, split: int = 1) -> dict:
        return dict(path="gemv", BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=warps, num_stages=stages)

    configs = [g(64, 128, 4, 4), g(128, 64, 5, 8), g(128, 64, 4, 8), g(128, 64, 5, 4), g(128, 32, 8, 8),
               g(128, 64, 4, 8, split=2)]
    return [("gate_up", m, mask, configs) for m in ms for mask in ("rand50", TRAINED)]


def output_dense_sweeps(ms: tuple = (192, 256, 512, 1024)) -> list:
    """The query projection above the GEMV's 128 tokens: its output-group GEMM over per-group token lists (with the
    plan that needs) against cuBLAS on the whole weight with the inactive groups' outputs zeroed in one launch
    (``path="dense"``, ``templates/zero_groups.py``); ``kernels_linear_sweep_output_dense.json``."""
    return [("q_proj", m, mask, [dict(path="gemm"), dict(path="dense")]) for m in ms for mask in ("rand50", TRAINED)]


def prefill_order_sweeps(ms: tuple = (16384, 4096)) -> list:
    """The two prefill output-group GEMMs (gate/up: 112 groups of 128; query projection: 8 groups of 512) at their
    default tiles against other program orders (``GROUP_N`` groups of n tiles side by side while the token tiles
    sweep, so that concurrently running programs share weight tiles and token rows in L2), ``ACTIVE_FIRST`` toggled
    and the other pipeline depth, in one call (earlier sweeps compared some of these only across calls, whose clocks
    differ by up to 15%; ``kernels_linear_sweep_prefill_order.json``)."""
    from wide_compile.templates.gemm_gated_up import default_config

    from wide_compile.templates.gemm_output_groups import default_config as q_default

    def variants(base: dict, group_ns: tuple) -> list:
        other_stages = 4 if base["num_stages"] == 3 else 3
        return ([base, dict(base, num_stages=other_stages), dict(base, ACTIVE_FIRST=not base.get("ACTIVE_FIRST"))]
                + [dict(base, GROUP_N=n) for n in group_ns])

    gs, q_gs = OPS["gate_up"]["gs"], OPS["q_proj"]["gs"]
    q_groups = OPS["q_proj"]["N"] // q_gs
    return ([("q_proj", m, "rand50", variants(q_default(m, q_gs, q_groups), (2, 4, 16))) for m in ms]
            + [("gate_up", m, "rand50", variants(default_config(m, gs), (4, 16, 32))) for m in ms])


def prefill_order_focus_sweeps(ms: tuple = (4096, 2048, 8192)) -> list:
    """The orders that ``prefill_order_sweeps`` found ahead at 4096 tokens, around that length: the query
    projection's GEMM with ``ACTIVE_FIRST`` and ``GROUP_N`` 4, the gate/up GEMM with ``GROUP_N`` 4 and 16
    (``kernels_linear_sweep_prefill_order_focus.json``)."""
    from wide_compile.templates.gemm_gated_up import default_config

    from wide_compile.templates.gemm_output_groups import default_config as q_default

    gs, q_gs = OPS["gate_up"]["gs"], OPS["q_proj"]["gs"]
    q_groups = OPS["q_proj"]["N"] // q_gs
    sweeps = []
    for m in ms:
        q = q_default(m, q_gs, q_groups)
        g = default_config(m, gs)
        sweeps.append(("q_proj", m, "rand50", [q, dict(q, ACTIVE_FIRST=True), dict(q, ACTIVE_FIRST=True, GROUP_N=4),
                                               dict(q, GROUP_N=4)]))
        sweeps.append(("gate_up", m, "rand50", [g, dict(g, GROUP_N=4), dict(g, GROUP_N=4, ACTIVE_FIRST=False),
                                                dict(g, GROUP_N=16)]))
    return sweeps


def _tma_at(ms: tuple | None = None) -> list:
    """``--sweep-tma``: three configs at ``--ms``'s token counts, else the wide grid at its own."""
    return tma_sweeps(ms, wide=False) if ms else tma_sweeps()


# ``benchmarks/kernels_linear.py --sweep-<name>`` -> (its grid, the result file it writes, what it times). Grids with
# a token-count parameter take ``--ms``'s counts when given. ``--sweep`` alone times ``SWEEPS``.
FLAGS = {
    "decode": (decode_sweeps, "kernels_linear_sweep.json", "a grid of input-group GEMV configs"),
    "tma": (_tma_at, "kernels_linear_sweep_tma.json", "the prefill gate/up GEMM with TMA weight tiles against "
            "pointer loads (with --ms: at those token counts, three configs)"),
    "moderate": (moderate_tile_sweeps, "kernels_linear_sweep_moderate.json",
                 "tile grids of the output-group GEMMs at 64-1024 tokens"),
    "moderate-gemv": (moderate_gemv_sweeps, "kernels_linear_sweep_moderate_gemv.json",
                      "the output-group GEMV kernel against the GEMM at 32-256 tokens"),
    "gate-up-moderate-tiles": (gate_up_moderate_tile_sweeps, "kernels_linear_sweep_gate_up_moderate_tiles.json",
                               "the gate/up GEMM's tiles, tails and program order at 256 tokens"),
    "gate-up-tiles": (gate_up_tile_sweeps, "kernels_linear_sweep_gate_up_tiles.json",
                      "the prefill gate/up GEMM's tile shapes and program order"),
    "gated-decode": (gated_decode_sweeps, "kernels_linear_sweep_gated_decode.json",
                     "the fused gate/up GEMV's tiles and K splits at 1-16 tokens"),
    "gated-moderate": (gated_moderate_sweeps, "kernels_linear_sweep_gated_moderate.json",
                       "the fused gate/up GEMV's tiles, stages and warps at 1, 2, 32 and 64 tokens"),
    "gated-stages": (gated_stage_sweeps, "kernels_linear_sweep_gated_stages.json",
                     "the fused gate/up GEMV with 3 and 4 stages at 1-128 tokens, every mask"),
    "gated-wide-k": (gated_wide_k_sweeps, "kernels_linear_sweep_gated_wide_k.json",
                     "the fused gate/up GEMV with 256-wide K steps against 128-wide ones at 1-4 tokens, every mask"),
    "half-tail": (half_tail_sweeps, "kernels_linear_sweep_half_tail.json",
                  "the prefill gate/up GEMM with and without half-height last tiles"),
    "active-first": (active_first_sweeps, "kernels_linear_sweep_active_first.json",
                     "the prefill output-group GEMMs with and without ACTIVE_FIRST (zero-only tiles last)"),
    "query-tiles": (query_tile_sweeps, "kernels_linear_sweep_query_tiles.json",
                    "the query projection's output-group GEMM tiles (default 4096 tokens)"),
    "paired": (paired_sweeps, "kernels_linear_sweep_paired.json", "the prefill gate/up GEMM with its gate and up "
               "tiles in one TMA box against two (PAIRED), and TMA tiles below 2048 tokens"),
    "input-split": (input_split_sweeps, "kernels_linear_sweep_input_split.json",
                    "the input-group GEMV with K split in fewer parts at 1-16 tokens"),
    "input-all-groups": (input_all_groups_sweeps, "kernels_linear_sweep_input_all_groups.json",
                         "the input-group GEMV over all groups (weight loads of unused groups predicated off, no "
                         "union list) against the default at 1-32 tokens"),
    "input-bits": (input_bits_sweeps, "kernels_linear_sweep_input_bits.json", "the input-group GEMV walking its "
                   "union as bits in registers (BITS) against the default at 1-32 tokens"),
    "input-bits-premasked": (input_bits_premasked_sweeps, "kernels_linear_sweep_input_bits_premasked.json",
                             "BITS with unsplit 32-row tiles on pre-masked inputs at 1-16 tokens"),
    "small-k-decode": (small_k_decode_sweeps, "kernels_linear_sweep_small_k_decode.json", "the q / o projection "
                       "GEMVs with fewer K splits and deeper pipelines at 1-2 tokens, every mask"),
    "rows-gemv": (rows_gemv_sweeps, "kernels_linear_sweep_rows_gemv.json",
                  "the row-streaming one-token GEMVs (templates/gemv_rows.py) against the MMA GEMVs"),
    "input-moderate": (input_moderate_gemv_sweeps, "kernels_linear_sweep_input_moderate.json",
                       "the input-group GEMV against cuBLAS on the masked input at 32-256 tokens (down / o_proj)"),
    "output-dense": (output_dense_sweeps, "kernels_linear_sweep_output_dense.json",
                     "the query projection's GEMM against cuBLAS with the inactive outputs zeroed at 192-1024 tokens"),
    "input-wide-moderate": (input_wide_moderate_sweeps, "kernels_linear_sweep_input_wide_moderate.json",
                            "the input-group GEMV's 128-row, 8-warp tiles against cuBLAS at 48-128 tokens (down)"),
    "input-wide-moderate-o-proj": (input_wide_moderate_o_proj_sweeps,
                                   "kernels_linear_sweep_input_wide_moderate_o_proj.json",
                                   "the same on the output projection at 48-64 tokens"),
    "gated-wide-rows": (gated_wide_rows_sweeps, "kernels_linear_sweep_gated_wide_rows.json",
                        "the fused gate/up GEMV with 128-row tiles against its 64-row default at 32-64 tokens"),
    "prefill-order": (prefill_order_sweeps, "kernels_linear_sweep_prefill_order.json", "the prefill gate/up and "
                      "query GEMMs' program orders (GROUP_N, ACTIVE_FIRST) and pipeline depths in one call"),
    "prefill-order-focus": (prefill_order_focus_sweeps, "kernels_linear_sweep_prefill_order_focus.json",
                            "the orders the prefill-order sweep found ahead at 4096 tokens, at 2048-8192 tokens"),
}


def takes_token_counts(make) -> bool:
    """Whether a grid function takes ``--ms``'s token counts (its first parameter)."""
    return bool(inspect.signature(make).parameters)


def chosen_grid(flags: dict, ms: tuple) -> tuple[list | None, str] | None:
    """``(grid, result file)`` of the first ``--sweep-*`` flag set in ``flags`` (argparse's attribute -> value; the
    grid at ``ms`` where given and it takes token counts), ``(None, ...)`` for ``--sweep`` alone (``SWEEPS``), or
    None."""
    for name, (make, out, _what) in FLAGS.items():
        if flags.get("sweep_" + name.replace("-", "_")):
            return (make(ms) if ms and takes_token_counts(make) else make()), out
    return (None, "kernels_linear_sweep.json") if flags.get("sweep") else None
