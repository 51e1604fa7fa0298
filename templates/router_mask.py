"""The router decision of a routed block in one Triton launch: ``x -> mask[..., G]``.

Replaces ``x.to(fp32)`` + ``wide::router_logits`` (two GEMVs) + ``wide::threshold_gate(logits, None, tau)``:

    h    = x W_in^T + b_in                                  W_in[R, H], b_in[R]          (fp32 accumulate)
    l0/1 = h W_out[0::2]^T + b_out[0::2] / W_out[1::2], ...  even rows = skip, odd = execute
    mask = (l1 >= l0)                                       0.0 / 1.0 in the routers' dtype

Programs: a 2-D grid of (``BLOCK_M`` token tile) x (``SPLIT`` slices of H). Each program accumulates its slice of
``h[BLOCK_M, R]`` in fp32, so decisions equal the fp32 reference except on near-ties, in one of two ways:
- ``W_SPLIT3`` (bf16 / fp16 ``x``, more than ``DECODE_TOKENS`` tokens): each fp32 ``W_in`` tile is split in registers
  into parts in ``x``'s dtype, ``W = hi + mid (+ lo)``, and ``x`` (read as it is) is multiplied with each on the
  tensor cores, fp32 accumulate. With three parts (``W_PARTS=3``) and bf16 the split is exact (3 x 8 significand
  bits >= fp32's 24, same exponent range) and every product of two 8-bit significands is exact in fp32: the sum
  differs from an fp32 GEMM only in its order. The default is two parts (16 of W_in's 24 significand bits in bf16,
  22 in fp16; a relative weight error below 2^-16): on the H200 one tensor-core product fewer per K step took 15-20%
  off the launch (H=4096, 4096 tokens: 24.6 -> 20.9 µs for 112 groups, 21.9 -> 17.7 µs for 8; H=576: 9.8 -> 8.0 µs)
  and changed at most 9e-6 of the decisions at H=4096 (8e-5 at H=576, G=3), all near-ties
  (``benchmarks/results/kernels_router_sweep_parts.json``). An fp32 FMA GEMM (``ieee``) ran at about 5 TFLOP/s here:
  198 us per router at 4096 tokens on the H200.
  With ``w_parts`` (``PRESPLIT``: the two parts made once per forward by ``passes/router_weight_split.py``) the loop
  reads them as 16-bit tiles instead and keeps one accumulator per part (``PRESPLIT_TILES``).
- otherwise (fp32 ``x``, decode) fp32 ``tl.dot`` with ``input_precision="ieee"`` (no TF32).
 With ``SPLIT > 1`` (decode: M <= 16 reads all of W_in, 512 KB at H=4096, R=32, which one
program would read latency-bound) every program stores its partial in a workspace and increments the tile's arrival
counter; the last one to arrive sums the partials in a fixed order (deterministic), then runs the epilogue (``b_in``,
both logit columns per group chunk, compare, store) and resets the counter. ``SPLIT`` (automatic by default) gives
about 2 programs per SM at decode (32 at H=4096, BLOCK_K=128); from 17 to 1024 tokens (128 for H >= 2048)
16-token tiles split to about one program per SM (``SMALL_TOKENS``); above, a few splits of at least 16 K steps
each, and ``SPLIT = 1`` for large M (>= 2 token tiles per SM), where one program per token tile does everything.
The workspace is allocated per call; the counters come from ``arrival_counters`` (zero between launches: no memset
per call).

R and G are padded to powers of two >= 16 with masked loads; H may be ragged. ``x`` is read in its own dtype
(bf16 / fp16 / fp32) and cast to fp32 in registers (exact). The epilogue compares ``h (W_out[1::2] - W_out[0::2])^T +
(b_out[1::2] - b_out[0::2])`` with 0 (one product, three TF32 parts on tensor cores; see ``EPILOGUE``). Router
weights in fp16 / bf16 (not the default) take the PyTorch reference, whose intermediate rounding an fp32 kernel would
not reproduce.
"""
from __future__ import annotations

import torch

from ._triton_utils import HAS_TRITON, can_run_triton, cdiv, interpreting, next_pow2, sm_count
from .arrival_counters import arrival_counters
from .dependent_launch import pdl_launch
from .router_mask_reference import check_router_mask_args, router_mask_reference

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _router_mask_kernel(
        x_ptr, w_in_ptr, w2_ptr, b_in_ptr, w_out_ptr, b_out_ptr, out_ptr, ws_ptr, counter_ptr,
        M, H, R, G, stride_xm,
        SPLIT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_G: tl.constexpr,
        EVEN_K: tl.constexpr,
        W_SPLIT3: tl.constexpr,
        W_PARTS: tl.constexpr,
        PRESPLIT: tl.constexpr,
        LOGIT_DIFF: tl.constexpr,
        EPILOGUE_PRECISION: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        tile = pid // SPLIT
        split = pid % SPLIT
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        valid_m = offs_m < M
        offs_r = tl.arange(0, BLOCK_R)
        valid_r = offs_r < R
        offs_k = tl.arange(0, BLOCK_K)

        # ---- h partial over this program's slice of H: x[BLOCK_M, BLOCK_K] @ W_in^T[BLOCK_K, BLOCK_R]
        k_len = tl.cdiv(tl.cdiv(H, SPLIT), BLOCK_K) * BLOCK_K
        k_begin = split * k_len
        k_stop = tl.minimum(H, k_begin + k_len)
        x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + (k_begin + offs_k)[None, :]
        w_ptrs = (w2_ptr if PRESPLIT else w_in_ptr) + offs_r.to(tl.int64)[None, :] * H + (k_begin + offs_k)[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        acc_mid = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k in range(k_begin, k_stop, BLOCK_K):
            if EVEN_K:
                xt = tl.load(x_ptrs, mask=valid_m[:, None], other=0.0)
                wt = tl.load(w_ptrs, mask=valid_r[None, :], other=0.0)
                if PRESPLIT:
                    wt_mid = tl.load(w_ptrs + R * H, mask=valid_r[None, :], other=0.0)
            else:
                k_ok = (k + offs_k) < k_stop
                xt = tl.load(x_ptrs, mask=valid_m[:, None] & k_ok[None, :], other=0.0)
                wt = tl.load(w_ptrs, mask=k_ok[:, None] & valid_r[None, :], other=0.0)
                if PRESPLIT:
                    wt_mid = tl.load(w_ptrs + R * H, mask=k_ok[:, None] & valid_r[None, :], other=0.0)
            if PRESPLIT:  # the two 16-bit parts of W_in, split once outside (split_router_weights); two
                # accumulators: independent products, so the MMAs of one step need not wait for each other
                acc = tl.dot(xt, wt, acc)
                acc_mid = tl.dot(xt, wt_mid, acc_mid)
            elif W_SPLIT3:  # tensor cores: x (16-bit) times W_in = hi + mid (+ lo: fp32-exact products) in x's dtype
                w_hi = wt.to(xt.dtype)
                rest = wt - w_hi.to(tl.float32)
                w_mid = rest.to(xt.dtype)
                if W_PARTS == 3:
                    w_lo = (rest - w_mid.to(tl.float32)).to(xt.dtype)
                    acc = tl.dot(xt, w_lo, acc)
                acc = tl.dot(xt, w_mid, acc)
                acc = tl.dot(xt, w_hi, acc)
            else:
                acc = tl.dot(xt.to(tl.float32), wt.to(tl.float32), acc, input_precision="ieee")
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if PRESPLIT:
            acc += acc_mid
        if USE_GDC:
            tl.extra.cuda.gdc_launch_dependents()

        # ---- one-launch split: partials to the workspace, the last program of the tile sums them in split order
        finish = True
        if SPLIT > 1:
            part = tl.arange(0, BLOCK_M)[:, None] * BLOCK_R + offs_r[None, :]  # [BLOCK_M, BLOCK_R] of this tile
            ws_tile = ws_ptr + tile.to(tl.int64) * (SPLIT * BLOCK_M * BLOCK_R)
            tl.store(ws_tile + split * BLOCK_M * BLOCK_R + part, acc, mask=valid_m[:, None])
            tl.debug_barrier()
            arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
            finish = arrived == SPLIT - 1
            if finish:
                tl.debug_barrier()
                acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
                for s in tl.static_range(SPLIT):
                    acc += tl.load(ws_tile + s * BLOCK_M * BLOCK_R + part, mask=valid_m[:, None], other=0.0,
                                   cache_modifier=".cg")
                tl.atomic_xchg(counter_ptr + tile, 0)

        # ---- epilogue: h = acc + b_in; per chunk of groups both logit columns, compare, store 0/1
        if finish:
            h = acc + tl.load(b_in_ptr + offs_r, mask=valid_r, other=0.0).to(tl.float32)[None, :]
            out_rows = out_ptr + offs_m.to(tl.int64)[:, None] * G
            for g0 in range(0, G, BLOCK_G):
                offs_g = g0 + tl.arange(0, BLOCK_G)
                valid_g = offs_g < G
                w_mask = valid_r[:, None] & valid_g[None, :]
                skip_rows = w_out_ptr + (2 * offs_g)[None, :] * R + offs_r[:, None]  # W_out[2g, r] as [R, G]
                w_skip = tl.load(skip_rows, mask=w_mask, other=0.0).to(tl.float32)
                w_exec = tl.load(skip_rows + R, mask=w_mask, other=0.0).to(tl.float32)
                b_skip = tl.load(b_out_ptr + 2 * offs_g, mask=valid_g, other=0.0).to(tl.float32)
                b_exec = tl.load(b_out_ptr + 2 * offs_g + 1, mask=valid_g, other=0.0).to(tl.float32)
                if LOGIT_DIFF:  # one product: l_exec - l_skip = h (w_exec - w_skip) + (b_exec - b_skip)
                    margin = tl.dot(h, w_exec - w_skip, input_precision=EPILOGUE_PRECISION)
                    decision = (margin + (b_exec - b_skip)[None, :] >= 0).to(out_ptr.dtype.element_ty)
                else:
                    l_skip = tl.dot(h, w_skip, input_precision=EPILOGUE_PRECISION) + b_skip[None, :]
                    l_exec = tl.dot(h, w_exec, input_precision=EPILOGUE_PRECISION) + b_exec[None, :]
                    decision = (l_exec >= l_skip).to(out_ptr.dtype.element_ty)
                tl.store(out_rows + offs_g[None, :], decision, mask=valid_m[:, None] & valid_g[None, :])


DECODE_TOKENS = 16  # M <= this: one token tile, H split among programs
# M <= this (and > DECODE_TOKENS): 16-token tiles, H split so that there is about one program per SM. A router
# decision over few tokens is a chain of dependent memory round trips; more, shorter programs shorten it. H200,
# µs, default before -> this rule (benchmarks/results/kernels_router_sweep_small.json): H = 4096 at 32 tokens 25.9 ->
# 10.4 (32 splits of one 128-wide K step); H = 576 at 32 tokens 14.2 -> 6.9, at 1024 tokens 14.7 -> 8.7 (2 splits).
# From 4096 tokens 64-token tiles are faster (kernels_router_sweep_prefill). With H >= 2048 the rule stops at
# SMALL_TOKENS_WIDE: measured at 32 tokens only, and its 16-token tiles re-read W_in once per tile (64 MB of L2 reads
# at 1024 tokens and H = 4096, where the previous default measured 32.0 µs, kernels_router.json).
SMALL_TOKENS = 1024
SMALL_TOKENS_WIDE = 128
# M >= this with H >= 2048: K steps of 128 instead of 64 (the same 64-token tiles, 3 stages, automatic split). H200,
# H = 4096, µs, median of 5 interleaved rounds, default -> this (``results/kernels_router_sweep_large.json``): 8192
# tokens 34.6 -> 30.8 (112 groups); 16384 tokens 57.3 -> 49.2 (112 groups), 52.3 -> 46.4 (8 groups). At 4096 tokens
# it lost (21.2 -> 22.7 and 18.0 -> 20.8), so the 64-wide steps stay there.
LARGE_TOKENS = 8192
# With W_in's two parts made once per forward (``w_parts``, passes/router_weight_split.py) the loop reads two 16-bit
# tiles and keeps two accumulators, so its MMAs need not wait for each other. H200, µs, H = 4096 unless said, default
# kernel -> pre-split with these tiles (``results/kernels_router_sweep_presplit.json``, 3 interleaved rounds):
# 4096 tokens 21.3 -> 16.8 (112 groups), 17.9 -> 14.6 (8 groups), H = 576 8.1 -> 6.2 (K steps of 128, 4 stages);
# 16384 tokens 49.0 -> 42.8 (K steps of 128, 3 stages); 1024 tokens 15.9 -> 11.2 (8 splits of H, K steps of 64,
# 3 stages). Between the measured sizes the nearest rule applies (not measured at 2048 or 8192 tokens).
PRESPLIT_TILES = {"split_below": 2048, "split": 8}
# The epilogue's logits from h[BLOCK_M, R] (fp32): two products (skip and execute columns, compared) or one product
# with the difference of the columns (``LOGIT_DIFF``: half the work; rounding differs from the reference's only on
# near-ties), as fp32 FMA (``"ieee"``) or on tensor cores with three TF32 products (``"tf32x3"``, about fp32's error).
# The fp32 FMA products were the slow part. H200, µs, two FMA products with 64-group chunks -> one 3xTF32 product with
# ``_block_g`` chunks (``benchmarks/results/kernels_router_sweep_epilogue.json``; decisions differ from the reference
# on the same 2e-6 of near-ties): H = 4096 at 4096 tokens 40.2 -> 24.8 (112 groups) and 25.2 -> 21.6 (8 groups), at
# 1024 tokens 26.7 -> 19.1; at 32 tokens 10.4 -> 6.7; H = 576 at 4096 tokens 12.1 -> 9.7, at 1024 7.5 -> 6.8, at 32
# 5.3 -> 4.6. Decode (<= 16 tokens) takes the same epilogue (not swept there).
EPILOGUE = {"LOGIT_DIFF": True, "EPILOGUE_PRECISION": "tf32x3"}
EPILOGUE_PRECISIONS = ("ieee", "tf32x3")


def _sm_count(device: torch.device) -> int:
    return 4 if interpreting() or device.type != "cuda" else sm_count(device)


def _block_g(groups: int) -> int:
    """Groups per epilogue step: 64, or fewer where the router has fewer groups (16 at least, ``tl.dot``'s minimum)."""
    return min(64, max(16, next_pow2(groups)))


def router_mask_config(num_tokens: int, hidden: int, rank: int, groups: int, device: torch.device,
                       presplit: bool = False) -> dict:
    """Default launch configuration (the keys :func:`router_mask` accepts in ``config``); ``presplit``: for ``W_in``'s
    parts read as they are (``w_parts``, see ``PRESPLIT_TILES``)."""
    block_r = max(16, next_pow2(rank))
    if interpreting():  # ~1 ms per program and loop step: few, large tiles
        block_m = 16 if num_tokens <= DECODE_TOKENS else 32
        return dict(BLOCK_M=block_m, BLOCK_K=64, BLOCK_G=32, SPLIT=1, num_warps=4, num_stages=1, W_SPLIT3=None)
    if presplit and num_tokens > (SMALL_TOKENS if hidden < 2048 else SMALL_TOKENS_WIDE):
        return _presplit_config(num_tokens, hidden, block_r, groups)
    if num_tokens <= DECODE_TOKENS:
        block_m, block_k, block_g, stages = 16, 128, min(128, max(16, next_pow2(groups))), 2
    elif num_tokens <= (SMALL_TOKENS if hidden < 2048 else SMALL_TOKENS_WIDE):  # 16-token tiles, ~1 program per SM
        block_k = max(16, min(128 if hidden >= 2048 else 64, 8192 // block_r, next_pow2(hidden)))
        split = max(1, min(_sm_count(device) // cdiv(num_tokens, 16), cdiv(hidden, block_k), 64))
        return dict(BLOCK_M=16, BLOCK_K=block_k, BLOCK_G=_block_g(groups), SPLIT=split, num_warps=4, num_stages=3,
                    W_SPLIT3=None)
    else:
        block_k = 128 if num_tokens >= LARGE_TOKENS and hidden >= 2048 else 64
        block_m, block_g, stages = (64 if block_r <= 64 else 16), _block_g(groups), 3
    block_k = max(16, min(block_k, 8192 // block_r, next_pow2(hidden)))  # bounded W_in tile
    return dict(BLOCK_M=block_m, BLOCK_K=block_k, BLOCK_G=block_g, SPLIT=0, num_warps=4, num_stages=stages,
                W_SPLIT3=None)


def _presplit_config(num_tokens: int, hidden: int, block_r: int, groups: int) -> dict:
    """64-token tiles with ``W_in``'s parts read as they are (see ``PRESPLIT_TILES``)."""
    small, mid = num_tokens < PRESPLIT_TILES["split_below"], num_tokens < LARGE_TOKENS
    block_k = max(16, min(64 if small else 128, 8192 // block_r, next_pow2(hidden)))
    split = PRESPLIT_TILES["split"] if small and hidden >= 2048 else 0
    return dict(BLOCK_M=64 if block_r <= 64 else 16, BLOCK_K=block_k, BLOCK_G=_block_g(groups), SPLIT=split,
                num_warps=4, num_stages=4 if mid and not small else 3, W_SPLIT3=None)


def _w_parts(parts: int) -> int:
    """Parts of the ``W_SPLIT3`` split multiplied: 2 (``hi + mid``, the default: one tensor-core product fewer per K
    step) or 3 (fp32-exact products); see the module docstring for the measurements."""
    if parts not in (2, 3):
        raise ValueError(f"router_mask: W_PARTS must be 2 or 3, got {parts!r}")
    return parts


def _epilogue_precision(choice: str) -> str:
    if choice not in EPILOGUE_PRECISIONS:
        raise ValueError(f"router_mask: EPILOGUE_PRECISION must be one of {EPILOGUE_PRECISIONS}, got {choice!r}")
    return choice


def _split_weights(x: torch.Tensor, num_tokens: int, choice: bool | None) -> bool:
    """Whether ``W_SPLIT3`` runs: asked for (``True`` / ``False``) or automatic (``None``: a 16-bit ``x`` and more
    than ``DECODE_TOKENS`` tokens). Never for fp32 ``x`` (no exact 16-bit form), nor for bf16 under the interpreter
    (its bf16 ``tl.dot`` is wrong)."""
    if x.dtype not in (torch.bfloat16, torch.float16) or (interpreting() and x.dtype == torch.bfloat16):
        return False
    return num_tokens > DECODE_TOKENS if choice is None else bool(choice)


def _auto_split(tiles: int, hidden: int, block_k: int, device: torch.device, min_steps: int = 1) -> int:
    """Programs for about 2 per SM, each with at least ``min_steps`` BLOCK_K steps of H (at most 64 splits).

    Prefill asks for 16 steps per program: SmolLM2's H = 576 at 4096 tokens ran in 15.1 µs unsplit against 18.5 µs
    in 4 splits of 2-3 steps (H200, ``benchmarks/results/kernels_router_sweep_prefill.json``); Llama-3-8B's H = 4096
    keeps its 4 splits of 16 steps. Decode (one token tile) splits down to one step per program."""
    want = (2 * _sm_count(device)) // tiles
    return max(1, min(want, cdiv(hidden, block_k * min_steps), 64))


def _use_kernel(x: torch.Tensor, w_in: torch.Tensor) -> bool:
    return w_in.dtype == torch.float32 and can_run_triton(x)


def split_router_weights(w_in: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[2, R, H]``: ``W_in``'s two parts in ``dtype`` (``hi = W_in.to(dtype)``, ``mid = (W_in - hi).to(dtype)``), the
    ``w_parts`` argument of :func:`router_mask`: what ``W_SPLIT3`` with two parts makes per K step in registers."""
    hi = w_in.to(dtype)
    return torch.stack([hi, (w_in - hi.to(w_in.dtype)).to(dtype)])


def check_w_parts(w_parts: torch.Tensor, x: torch.Tensor, w_in: torch.Tensor) -> None:
    """Raise a ValueError unless ``w_parts`` can be :func:`split_router_weights` of ``w_in`` for ``x``: ``[2, R, H]`` in
    ``x``'s 16-bit dtype on ``x``'s device, ``W_in`` fp32."""
    rank, hidden = w_in.shape
    if (tuple(w_parts.shape) != (2, rank, hidden) or w_parts.dtype != x.dtype or w_parts.device != x.device
            or x.dtype not in (torch.bfloat16, torch.float16) or w_in.dtype != torch.float32):
        raise ValueError(f"router_mask: w_parts must be [2, {rank}, {hidden}] in x's 16-bit dtype on {x.device} "
                         f"(split_router_weights of an fp32 W_in), got {tuple(w_parts.shape)} {w_parts.dtype} on "
                         f"{w_parts.device} (x {x.dtype}, W_in {w_in.dtype})")


def router_mask(x: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor, w_out: torch.Tensor, b_out: torch.Tensor,
                config: dict | None = None, out: torch.Tensor | None = None,
                w_parts: torch.Tensor | None = None) -> torch.Tensor:
    """``mask[..., G]`` (dtype of ``w_in``, values 0.0 / 1.0) equal to :func:`router_mask_reference` except on
    near-ties (``|l1 - l0|`` at fp32 rounding level). ``config`` overrides :func:`router_mask_config` keys
    (``SPLIT = 0``: automatic); ``out`` (contiguous ``[..., G]``) receives the mask. ``w_parts``
    (:func:`split_router_weights` of ``w_in`` in ``x``'s 16-bit dtype, made once per forward for all routers by
    ``passes/router_weight_split.py``) replaces the split of ``W_in`` per K step where the kernel would make it
    (``W_SPLIT3``, two parts); elsewhere it is checked and not used, so the result never depends on it. Runs the
    reference where Triton cannot run (CPU without ``TRITON_INTERPRET=1``) and for fp16 / bf16 router weights."""
    check_router_mask_args(x, w_in, b_in, w_out, b_out)
    if w_parts is not None:
        check_w_parts(w_parts, x, w_in)
    hidden, rank, groups = x.shape[-1], w_in.shape[0], w_out.shape[0] // 2
    lead = x.shape[:-1]
    if out is not None and (out.shape != (*lead, groups) or out.dtype != w_in.dtype or out.device != x.device
                            or not out.is_contiguous()):
        raise ValueError(f"router_mask: out must be a contiguous {w_in.dtype} tensor of shape {(*lead, groups)} on "
                         f"{x.device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    if not _use_kernel(x, w_in):
        mask = router_mask_reference(x, w_in, b_in, w_out, b_out)
        return mask if out is None else out.copy_(mask)
    x2 = x.reshape(-1, hidden)
    if hidden and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    num_tokens = x2.shape[0]
    mask = torch.empty((*lead, groups), dtype=w_in.dtype, device=x.device) if out is None else out
    if num_tokens == 0:
        return mask
    asked = config or {}  # (the defaults leave W_SPLIT3 automatic and W_PARTS at 2)
    split3 = _split_weights(x2, num_tokens, asked.get("W_SPLIT3"))
    presplit = w_parts is not None and split3 and _w_parts(asked.get("W_PARTS", 2)) == 2
    cfg = dict(router_mask_config(num_tokens, hidden, rank, groups, x.device, presplit=presplit), **asked)
    block_m, block_k = cfg["BLOCK_M"], cfg["BLOCK_K"]
    tiles = cdiv(num_tokens, block_m)
    split = int(cfg.get("SPLIT", 0))
    if split <= 0:
        split = _auto_split(tiles, hidden, block_k, x.device, 1 if num_tokens <= DECODE_TOKENS else 16)
    split = max(1, min(split, max(1, cdiv(hidden, block_k))))
    block_r = max(16, next_pow2(rank))
    if split > 1:  # workspace per call; counters zero between launches (the kernel leaves them at 0)
        ws = torch.empty(tiles * split * block_m * block_r, dtype=torch.float32, device=x.device)
        counters = arrival_counters(tiles, x.device)
    else:
        ws, counters = mask, mask  # unused
    _router_mask_kernel[(tiles * split,)](
        x2, w_in.contiguous(), w_parts.contiguous() if presplit else w_in, b_in.contiguous(), w_out.contiguous(),
        b_out.contiguous(), mask, ws, counters,
        num_tokens, hidden, rank, groups, x2.stride(0),
        SPLIT=split,
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        BLOCK_R=block_r,
        BLOCK_G=cfg["BLOCK_G"],
        EVEN_K=hidden % (block_k * split) == 0,
        W_SPLIT3=split3,
        W_PARTS=_w_parts(cfg.get("W_PARTS", 2)),
        PRESPLIT=presplit,
        LOGIT_DIFF=bool(cfg.get("LOGIT_DIFF", EPILOGUE["LOGIT_DIFF"])),
        EPILOGUE_PRECISION=_epilogue_precision(cfg.get("EPILOGUE_PRECISION", EPILOGUE["EPILOGUE_PRECISION"])),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **pdl_launch(x.device),
    )
    return mask
