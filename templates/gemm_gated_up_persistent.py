"""EXPERIMENTAL (no default path uses it): the prefill gate/up GEMM as a persistent, warp-specialised Gluon kernel (Hopper).

Why: the Triton kernel (``gemm_gated_up``) launches one program per (token tile, n tile) with one program per SM, so
every tile pays its prologue (list and count loads, pipeline fill) and epilogue in the open, and about half its programs
(the zero-only tiles at 50%) hold an SM only to store zeros. Stop 21's warp-specialised Gluon kernel (commit
``a9e83be``) removed the K loop's CTA barriers but kept one program per tile and was no faster. Here one CTA per SM
walks a static list of tiles:

- a loader partition (the kernel's 4 warps) waits until a stage is free (``empty``), issues the tile's gate and up
  weight tiles by TMA and its gathered ``x`` rows by ``cp.async`` (each thread arriving on ``ready`` when its copies
  land), and goes straight on to the next tile's stages while the consumers finish this one;
- two consumer partitions (one warpgroup each, 64 of the tile's 128 rows) run two async wgmma per K step (gate, up),
  release a stage once its MMAs completed, then apply SiLU and the product, zero the rows past the group's active
  count and store ``h``. A consumer whose 64 rows are all past the count (a group's last, at most half active tile)
  runs no MMAs (the loader does not gather those rows either) and stores zeros; the other then has the tensor cores
  alone. Zero-only tiles cost the consumers one store of zeros each, the loader nothing.

Tile order: the token tiles below the largest group's count first (``GROUP_N`` n tiles side by side, sweeping token
tiles, for weight reuse in L2), then the tiles past it (zero-only in every group); CTA ``p`` takes tiles ``p, p + P,
...``. Stage and phase counters run across tiles. Same outputs as ``gemm_gated_up`` (bf16 / fp16, SiLU, K a multiple
of 64, group sizes a multiple of 128). Entry point :func:`gated_up_gemm_persistent`; ``benchmarks/gated_up_persistent_probe.py``
checks it against the Triton kernel and times both on the GPU.
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, cdiv, next_pow2, sm_count

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
    def _tiles_below_largest_count(counts_ptr, NUM_GROUPS: gl.constexpr, GROUPS_P2: gl.constexpr):
        """``cdiv(max(counts), BLOCK_M)``: token tiles holding an active row in some group."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # the kernel runs 4 warps outside its partitions
        offs = gl.arange(0, GROUPS_P2, layout)
        counts = gl.load(counts_ptr + offs, mask=offs < NUM_GROUPS, other=0)
        return (gl.max(counts, 0) + BLOCK_M - 1) // BLOCK_M

    @gluon.jit
    def _tile_coords(t, m_act, num_m, NUM_N: gl.constexpr, GROUP_N: gl.constexpr):
        """Tile ``t`` of the persistent order -> (token tile, n tile): below ``m_act`` token tiles GROUP_N n tiles side
        by side sweeping token tiles, then the rest (zero-only tiles) n tile by n tile."""
        first = m_act * NUM_N
        width = GROUP_N * m_act
        band = gl.maximum(width, 1)
        first_n = (t // band) * GROUP_N
        size_n = gl.minimum(NUM_N - first_n, GROUP_N)
        local = t % band
        m_lo = local // gl.maximum(size_n, 1)
        n_lo = first_n + local % gl.maximum(size_n, 1)
        rest = t - first
        m_hi = m_act + rest // NUM_N
        n_hi = rest % NUM_N
        below = t < first
        return gl.where(below, m_lo, m_hi), gl.where(below, n_lo, n_hi)

    @gluon.jit
    def _loader(x_ptr, wg_desc, wu_desc, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty, M, K, num_tiles,
                m_act, num_m, GROUP_SIZE: gl.constexpr, NUM_N: gl.constexpr, GROUP_N: gl.constexpr,
                STAGES: gl.constexpr):
        # 128 rows x 64 columns, 8 contiguous elements (16 bytes) per thread and copy, 4 warps
        gather: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        offs_r = gl.arange(0, BLOCK_M, gl.SliceLayout(1, gather))
        offs_k = gl.arange(0, BLOCK_K, gl.SliceLayout(0, gather))
        k_steps = K // BLOCK_K
        it = 0
        for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            m_tile, n_tile = _tile_coords(t, m_act, num_m, NUM_N, GROUP_N)
            n0 = n_tile * BLOCK_N
            group = n0 // GROUP_SIZE
            active_rows = gl.load(counts_ptr + group) - m_tile * BLOCK_M
            if active_rows > 0:
                used = gl.where(active_rows <= HALF_M, HALF_M, BLOCK_M)  # rows the consumers multiply
                offs_m = m_tile * BLOCK_M + offs_r
                row_ok = (offs_m < M) & (offs_r < used)
                rows = gl.load(tokens_ptr + group.to(gl.int64) * M + offs_m, mask=row_ok, other=0)
                x_ptrs = x_ptr + rows.to(gl.int64)[:, None] * K + offs_k[None, :]
                load_ok = row_ok[:, None] & (offs_k < BLOCK_K)[None, :]
                for i in range(k_steps):
                    s = it % STAGES
                    mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1 at once
                    mbarrier.expect(ready.index(s), 2 * wg_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(wg_desc, [n0, i * BLOCK_K], ready.index(s), w_smem.index(2 * s))
                    tma.async_copy_global_to_shared(wu_desc, [n0, i * BLOCK_K], ready.index(s),
                                                    w_smem.index(2 * s + 1))
                    cp.async_copy_global_to_shared(x_smem.index(s), x_ptrs + i * BLOCK_K, mask=load_ok)
                    cp.mbarrier_arrive(ready.index(s), increment_count=False)
                    it += 1

    @gluon.jit
    def _consumer(h_ptr, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty, M, N, K, num_tiles, m_act, num_m,
                  ROW0: gl.constexpr, GROUP_SIZE: gl.constexpr, NUM_N: gl.constexpr, GROUP_N: gl.constexpr,
                  STAGES: gl.constexpr):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_N, 16])
        offs_r = ROW0 + gl.arange(0, HALF_M, gl.SliceLayout(1, mma))
        offs_c = gl.arange(0, BLOCK_N, gl.SliceLayout(0, mma))
        k_steps = K // BLOCK_K
        it = 0
        step = gl.num_programs(0)
        _m, first_n = _tile_coords(gl.program_id(0), m_act, num_m, NUM_N, GROUP_N)
        count = gl.load(counts_ptr + first_n * BLOCK_N // GROUP_SIZE)
        for t in range(gl.program_id(0), num_tiles, step):
            m_tile, n_tile = _tile_coords(t, m_act, num_m, NUM_N, GROUP_N)
            n0 = n_tile * BLOCK_N
            group = n0 // GROUP_SIZE
            _m, next_n = _tile_coords(t + step, m_act, num_m, NUM_N, GROUP_N)  # the next tile's count, loaded early
            next_count = gl.load(counts_ptr + next_n * BLOCK_N // GROUP_SIZE, mask=t + step < num_tiles, other=0)
            offs_m = m_tile * BLOCK_M + offs_r
            row_ok = offs_m < M
            rows = gl.load(tokens_ptr + group.to(gl.int64) * M + offs_m, mask=row_ok, other=0)  # for the store
            active_rows = count - m_tile * BLOCK_M
            acc_g = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma)
            acc_u = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma)
            if active_rows > ROW0:  # this warpgroup's rows hold an active one: the K loop
                for i in range(k_steps):
                    s = it % STAGES
                    mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                    fence_async_shared()  # the cp.async rows (generic proxy) before the wgmma's reads (async proxy)
                    a = x_smem.index(s).slice(ROW0, HALF_M)
                    acc_g = warpgroup_mma(a, w_smem.index(2 * s).permute((1, 0)), acc_g, is_async=True)
                    acc_u = warpgroup_mma(a, w_smem.index(2 * s + 1).permute((1, 0)), acc_u, is_async=True)
                    acc_g, acc_u = warpgroup_mma_wait(num_outstanding=2, deps=(acc_g, acc_u))  # step i-1's MMAs done
                    mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=i > 0)
                    it += 1
                acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
            elif active_rows > 0:  # the other warpgroup multiplies; this one only passes the stages on
                for i in range(k_steps):
                    s = it % STAGES
                    mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                    mbarrier.arrive(empty.index(s))
                    it += 1
            h = acc_g / (1.0 + gl.exp(-acc_g)) * acc_u  # silu(gate) * up
            h = gl.where((offs_m < count)[:, None], h, 0.0)
            offs_n = n0 + offs_c
            ptrs = h_ptr + rows.to(gl.int64)[:, None] * N + offs_n[None, :]
            gl.store(ptrs, h.to(h_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n < N)[None, :])
            count = next_count

    @gluon.jit
    def _gated_up_persistent_kernel(x_ptr, wg_desc, wu_desc, h_ptr, tokens_ptr, counts_ptr, M, N, K,
                                    GROUP_SIZE: gl.constexpr, NUM_GROUPS: gl.constexpr, GROUPS_P2: gl.constexpr,
                                    GROUP_N: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr):
        NUM_N: gl.constexpr = NUM_GROUPS * (GROUP_SIZE // BLOCK_N)
        num_m = (M + BLOCK_M - 1) // BLOCK_M
        num_tiles = num_m * NUM_N
        m_act = _tiles_below_largest_count(counts_ptr, NUM_GROUPS, GROUPS_P2)
        x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], x_ptr.dtype.element_ty)
        x_smem = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, BLOCK_M, BLOCK_K], x_layout)
        w_smem = gl.allocate_shared_memory(wg_desc.dtype, [2 * STAGES, BLOCK_N, BLOCK_K], wg_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1 + 4 * 32)  # the TMA expect + every loader thread's cp.async arrival
            mbarrier.init(empty.index(s), count=2)  # one arrival per consumer warpgroup
        gl.warp_specialize([
            (_loader, (x_ptr, wg_desc, wu_desc, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty, M, K,
                       num_tiles, m_act, num_m, GROUP_SIZE, NUM_N, GROUP_N, STAGES)),
            (_consumer, (h_ptr, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty, M, N, K, num_tiles, m_act,
                         num_m, 0, GROUP_SIZE, NUM_N, GROUP_N, STAGES)),
            (_consumer, (h_ptr, tokens_ptr, counts_ptr, x_smem, w_smem, ready, empty, M, N, K, num_tiles, m_act,
                         num_m, HALF_M, GROUP_SIZE, NUM_N, GROUP_N, STAGES)),
        ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


def gated_up_gemm_persistent(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, group_tokens: torch.Tensor,
                             group_counts: torch.Tensor, group_size: int, activation: str = "silu", stages: int = 4,
                             group_n: int = 8, consumer_regs: int = 232, ctas: int | None = None) -> torch.Tensor:
    """``h[M, I]`` as ``gemm_gated_up.gated_up_gemm`` computes it (per-group token lists of a ``GroupPlan``), with the
    persistent warp-specialised kernel: ``ctas`` CTAs (default: one per SM). CUDA sm_90+, contiguous bf16 / fp16
    inputs, SiLU; raises otherwise."""
    if not HAS_GLUON:
        raise RuntimeError("gated_up_gemm_persistent needs Triton's Gluon (Triton >= 3.5)")
    num_tokens, k_dim = x.shape
    n_dim = w_gate.shape[0]
    if not (x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9):
        raise ValueError("gated_up_gemm_persistent: needs a CUDA device of compute capability 9.0 or newer")
    if x.dtype not in (torch.bfloat16, torch.float16) or w_gate.dtype != x.dtype or w_up.dtype != x.dtype:
        raise ValueError(f"gated_up_gemm_persistent: x and weights must share a bf16 / fp16 dtype, got {x.dtype}, "
                         f"{w_gate.dtype}, {w_up.dtype}")
    if k_dim % TILE_K or group_size % TILE_N or n_dim % group_size:
        raise ValueError(f"gated_up_gemm_persistent: needs K % {TILE_K} == 0 and group_size % {TILE_N} == 0, got "
                         f"K={k_dim}, group_size={group_size}")
    if activation != "silu":
        raise ValueError(f"gated_up_gemm_persistent: only activation 'silu' is written, got {activation!r}")
    x, w_gate, w_up = x.contiguous(), w_gate.contiguous(), w_up.contiguous()
    gdt = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([TILE_N, TILE_K], gdt)
    wg_desc, wu_desc = (TensorDescriptor.from_tensor(w, [TILE_N, TILE_K], layout) for w in (w_gate, w_up))
    h = torch.empty(num_tokens, n_dim, dtype=x.dtype, device=x.device)
    num_groups = n_dim // group_size
    tiles = cdiv(num_tokens, TILE_M) * (n_dim // TILE_N)
    grid = (min(ctas or sm_count(x.device), tiles),)
    _gated_up_persistent_kernel[grid](
        x, wg_desc, wu_desc, h, group_tokens, group_counts, num_tokens, n_dim, k_dim,
        GROUP_SIZE=group_size, NUM_GROUPS=num_groups, GROUPS_P2=max(32, next_pow2(num_groups)), GROUP_N=group_n,
        STAGES=stages, CONSUMER_REGS=consumer_regs, num_warps=4)
    return h
