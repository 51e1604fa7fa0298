"""EXPERIMENTAL (not used by any default path): the prefill gate/up GEMM as a warp-specialised Gluon kernel (Hopper).

Why: Nsight Compute on ``gemm_gated_up``'s Triton kernel at 4096 tokens (``benchmarks/notes_linear.md``, stop 21) shows
its warps stalled at CTA-wide barriers 32% of the time: the gathered token rows are ``cp.async`` pointer loads (Hopper's
TMA cannot gather rows), and Triton synchronises each pipeline stage across all 8 warps before either warpgroup's MMA
reads it. Here the synchronisation is per stage and through mbarriers only:

- a loader partition (the kernel's 4 warps) waits until a stage is free (``empty[s]``), issues the two weight tiles by
  TMA (``expect`` + two copies on ``ready[s]``) and the tile's 128 gathered ``x`` rows by ``cp.async``, each thread then
  arriving on ``ready[s]`` when its own copies have landed (``cp.async.mbarrier.arrive.noinc``);
- two consumer partitions (4 warps each: one warpgroup, 64 of the tile's rows) wait on ``ready[s]``, run their two
  wgmma (gate and up) asynchronously, and after the previous stage's MMAs completed arrive on its ``empty`` barrier
  (one arrival per warpgroup); then the epilogue (activation, product, zeros past the group's active count, one
  scattered store of ``h``).

No CTA-wide barrier in the K loop. Same tiling and outputs as ``gemm_gated_up._gated_up_gemm_kernel`` (per-group token
lists, 128 x 128 tiles per weight, fully inactive tiles store zeros); bf16 / fp16, SiLU, K a multiple of 64, group
sizes a multiple of 128. Entry point :func:`gated_up_gemm_ws`; ``benchmarks/gated_up_ws_probe.py`` checks it against the
reference and times it against the Triton kernel on the GPU.
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, cdiv

TILE_M, TILE_N, TILE_K = 128, 128, 64  # tokens, columns of each weight, K step
try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAS_GLUON = HAS_TRITON
except ImportError:  # pragma: no cover - older Triton
    HAS_GLUON = False

if HAS_GLUON:
    BLOCK_M = gl.constexpr(TILE_M)
    BLOCK_N = gl.constexpr(TILE_N)
    BLOCK_K = gl.constexpr(TILE_K)
    HALF_M = gl.constexpr(TILE_M // 2)

    @gluon.jit
    def _tile_of(pid, T_TILES: gl.constexpr):
        """(weight row offset, token tile) of program ``pid``: consecutive programs share a weight tile."""
        return (pid // T_TILES) * BLOCK_N, pid % T_TILES

    @gluon.jit
    def _weight_tiles(w_smem, s, WIDE_N: gl.constexpr):
        """Stage ``s``'s gate and up tiles: two buffers, or the two halves of one ``[2 * BLOCK_N, BLOCK_K]`` buffer."""
        if WIDE_N:
            both = w_smem.index(s)
            return both.slice(0, BLOCK_N), both.slice(BLOCK_N, BLOCK_N)
        else:
            return w_smem.index(2 * s), w_smem.index(2 * s + 1)

    @gluon.jit
    def _loader(x_ptr, wg_desc, wu_desc, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty,
                M, K, GROUP_SIZE: gl.constexpr, T_TILES: gl.constexpr, STAGES: gl.constexpr, WIDE_N: gl.constexpr):
        n0, tile = _tile_of(gl.program_id(0), T_TILES)
        group = n0 // GROUP_SIZE
        count = gl.load(counts_ptr + group)
        k_steps = gl.where(tile * BLOCK_M < count, K // BLOCK_K, 0)
        # 128 rows x 64 columns, 8 contiguous elements (16 bytes) per thread and copy, 4 warps
        gather: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        offs_m = tile * BLOCK_M + gl.arange(0, BLOCK_M, gl.SliceLayout(1, gather))
        offs_k = gl.arange(0, BLOCK_K, gl.SliceLayout(0, gather))
        row_ok = offs_m < M
        rows = gl.load(tokens_ptr + group.to(gl.int64) * M + offs_m, mask=row_ok, other=0)
        x_ptrs = x_ptr + rows.to(gl.int64)[:, None] * K + offs_k[None, :]
        load_ok = row_ok[:, None] & (offs_k < BLOCK_K)[None, :]
        for i in range(k_steps):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1 at once
            mbarrier.expect(ready.index(s), 2 * wg_desc.block_type.nbytes)
            wg_tile, wu_tile = _weight_tiles(w_smem, s, WIDE_N)
            tma.async_copy_global_to_shared(wg_desc, [n0, i * BLOCK_K], ready.index(s), wg_tile)
            tma.async_copy_global_to_shared(wu_desc, [n0, i * BLOCK_K], ready.index(s), wu_tile)
            cp.async_copy_global_to_shared(x_smem.index(s), x_ptrs + i * BLOCK_K, mask=load_ok)
            cp.mbarrier_arrive(ready.index(s), increment_count=False)

    @gluon.jit
    def _consumer(h_ptr, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty, M, N, K,
                  ROW0: gl.constexpr, GROUP_SIZE: gl.constexpr, T_TILES: gl.constexpr, STAGES: gl.constexpr,
                  FENCE: gl.constexpr, WIDE_N: gl.constexpr):
        n0, tile = _tile_of(gl.program_id(0), T_TILES)
        group = n0 // GROUP_SIZE
        count = gl.load(counts_ptr + group)
        k_steps = gl.where(tile * BLOCK_M < count, K // BLOCK_K, 0)
        if WIDE_N:  # one m64n256 MMA per K step over [gate; up]: the x tile is read once for both products
            wide: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, 2 * BLOCK_N, 16])
            acc = gl.zeros([HALF_M, 2 * BLOCK_N], gl.float32, wide)
            for i in range(k_steps):
                s = i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                if FENCE:
                    fence_async_shared()
                a = x_smem.index(s).slice(ROW0, HALF_M)
                acc = warpgroup_mma(a, w_smem.index(s).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=i > 0)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index((k_steps + STAGES - 1) % STAGES), pred=k_steps > 0)
            acc_g, acc_u = gl.split(gl.permute(gl.reshape(acc, [HALF_M, 2, BLOCK_N]), (0, 2, 1)))
            mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, BLOCK_N, 16])
            acc_g = gl.convert_layout(acc_g, mma)
            acc_u = gl.convert_layout(acc_u, mma)
        else:
            mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, BLOCK_N, 16])
            acc_g = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma)
            acc_u = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma)
            for i in range(k_steps):
                s = i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                if FENCE:  # the cp.async rows (generic proxy) before the wgmma's reads (async proxy)
                    fence_async_shared()
                a = x_smem.index(s).slice(ROW0, HALF_M)
                wg_tile, wu_tile = _weight_tiles(w_smem, s, WIDE_N)
                acc_g = warpgroup_mma(a, wg_tile.permute((1, 0)), acc_g, is_async=True)
                acc_u = warpgroup_mma(a, wu_tile.permute((1, 0)), acc_u, is_async=True)
                acc_g, acc_u = warpgroup_mma_wait(num_outstanding=2, deps=(acc_g, acc_u))  # stage i-1's MMAs done
                mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=i > 0)
            acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))
            mbarrier.arrive(empty.index((k_steps + STAGES - 1) % STAGES), pred=k_steps > 0)
        h = acc_g / (1.0 + gl.exp(-acc_g)) * acc_u  # silu(gate) * up
        offs_m = tile * BLOCK_M + ROW0 + gl.arange(0, HALF_M, gl.SliceLayout(1, mma))
        offs_n = n0 + gl.arange(0, BLOCK_N, gl.SliceLayout(0, mma))
        row_ok = offs_m < M
        rows = gl.load(tokens_ptr + group.to(gl.int64) * M + offs_m, mask=row_ok, other=0)
        h = gl.where((offs_m < count)[:, None], h, 0.0)
        ptrs = h_ptr + rows.to(gl.int64)[:, None] * N + offs_n[None, :]
        gl.store(ptrs, h.to(h_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n < N)[None, :])

    @gluon.jit
    def _gated_up_ws_kernel(x_ptr, wg_desc, wu_desc, h_ptr, tokens_ptr, counts_ptr, M, N, K,
                            GROUP_SIZE: gl.constexpr, T_TILES: gl.constexpr, STAGES: gl.constexpr,
                            CONSUMER_REGS: gl.constexpr, FENCE: gl.constexpr, WIDE_N: gl.constexpr):
        x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], x_ptr.dtype.element_ty)
        x_smem = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, BLOCK_M, BLOCK_K], x_layout)
        if WIDE_N:
            w_smem = gl.allocate_shared_memory(wg_desc.dtype, [STAGES, 2 * BLOCK_N, BLOCK_K], wg_desc.layout)
        else:
            w_smem = gl.allocate_shared_memory(wg_desc.dtype, [2 * STAGES, BLOCK_N, BLOCK_K], wg_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1 + 4 * 32)  # the TMA expect + every loader thread's cp.async arrival
            mbarrier.init(empty.index(s), count=2)  # one arrival per consumer warpgroup
        gl.warp_specialize([
            (_loader, (x_ptr, wg_desc, wu_desc, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty,
                       M, K, GROUP_SIZE, T_TILES, STAGES, WIDE_N)),
            (_consumer, (h_ptr, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty, M, N, K,
                         0, GROUP_SIZE, T_TILES, STAGES, FENCE, WIDE_N)),
            (_consumer, (h_ptr, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty, M, N, K,
                         HALF_M, GROUP_SIZE, T_TILES, STAGES, FENCE, WIDE_N)),
        ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


def gated_up_gemm_ws(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, group_tokens: torch.Tensor,
                     group_counts: torch.Tensor, group_size: int, activation: str = "silu", stages: int = 4,
                     consumer_regs: int = 232, fence: bool = True, wide_n: bool = False) -> torch.Tensor:
    """``h[M, I]`` as ``gemm_gated_up.gated_up_gemm`` computes it (per-group token lists of a ``GroupPlan``), with the
    warp-specialised kernel. CUDA, sm_90+, contiguous bf16 / fp16 inputs; raises otherwise. ``fence=False`` drops the
    proxy fence between the gathered rows and the MMAs (only to measure its cost: without it the ordering is not
    guaranteed). ``wide_n``: one m64n256 MMA per K step over the stacked gate and up tiles instead of two m64n128."""
    if not HAS_GLUON:
        raise RuntimeError("gated_up_gemm_ws needs Triton's Gluon (Triton >= 3.5)")
    num_tokens, k_dim = x.shape
    n_dim = w_gate.shape[0]
    if not (x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9):
        raise ValueError("gated_up_gemm_ws: needs a CUDA device of compute capability 9.0 or newer")
    if x.dtype not in (torch.bfloat16, torch.float16) or w_gate.dtype != x.dtype or w_up.dtype != x.dtype:
        raise ValueError(f"gated_up_gemm_ws: x and weights must share a bf16 / fp16 dtype, got {x.dtype}, "
                         f"{w_gate.dtype}, {w_up.dtype}")
    if k_dim % TILE_K or group_size % TILE_N or n_dim % group_size:
        raise ValueError(f"gated_up_gemm_ws: needs K % {TILE_K} == 0 and group_size % {TILE_N} == 0, got K={k_dim}, "
                         f"group_size={group_size}")
    if activation != "silu":
        raise ValueError(f"gated_up_gemm_ws: only activation 'silu' is written, got {activation!r}")
    x, w_gate, w_up = x.contiguous(), w_gate.contiguous(), w_up.contiguous()
    gdt = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([TILE_N, TILE_K], gdt)
    wg_desc, wu_desc = (TensorDescriptor.from_tensor(w, [TILE_N, TILE_K], layout) for w in (w_gate, w_up))
    h = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device)
    t_tiles = cdiv(num_tokens, TILE_M)
    _gated_up_ws_kernel[(t_tiles * (n_dim // TILE_N),)](
        x, wg_desc, wu_desc, h, group_tokens, group_counts, num_tokens, n_dim, k_dim,
        GROUP_SIZE=group_size, T_TILES=t_tiles, STAGES=stages, CONSUMER_REGS=consumer_regs, FENCE=fence,
        WIDE_N=wide_n, num_warps=4)
    return h
