"""Mask reordering shared by paired group-skipping ops (gate/up -> down), computed once per mask.

``build_group_plan(mask)`` turns a per-token group mask ``mask[M, G]`` into the small index tables the
kernels need. Which tables are built depends on the path the ops will take:

- ``"output"`` (GEMM over output groups: gate/up, query projection): per group ``g`` the token indices
  with the group's active tokens first (``group_tokens[g, :group_counts[g]]``, ascending token order)
  and its inactive tokens after them. A kernel tile over this list is fully active, mixed, or fully
  inactive; fully inactive tiles only write zeros.
- ``"input"`` (GEMM over input groups: down / output projection): a token order (``token_order``) and,
  for every tile of ``block_m`` consecutive tokens of that order, the list of groups active for at least
  one token of the tile (``tile_groups[t, :tile_group_counts[t]]``). The kernel loops only over those.
  Token order: tokens are sorted lexicographically by their mask pattern (group 0 most significant), so
  tokens with identical patterns are adjacent and tiles share their active groups; tokens whose
  patterns share a prefix of groups also land together. With i.i.d. random masks no order helps (a
  tile of 64 tokens at 50% sparsity has almost every group active); with clustered / router-like masks
  the sort turns per-token sparsity into tile-level sparsity. ``sort_tokens=False`` keeps token order.
- ``"union"`` (decode GEMV, M <= 16): the groups active for any token of the batch
  (``union_groups[:union_count]``), so GEMVs read only those weight rows/columns.

On CUDA (or under ``TRITON_INTERPRET=1``) the tables are built by small Triton kernels (one launch per
table, two for the token lists of long prompts: ``group_lists_two_pass``; no host synchronisation, so the plan
can be captured in a CUDA graph); elsewhere by PyTorch ops.
Entries past a count are unspecified and never read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._triton_utils import HAS_TRITON, can_run_triton, cdiv, next_pow2
from .dependent_launch import pdl_launch
from .group_lists_two_pass import group_token_lists_two_pass, pop_two_pass_options, use_two_pass
from .list_scan import scan_launch

DECODE_MAX_TOKENS = 16
PARTS = ("output", "input", "union")

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _group_token_lists_kernel(mask_ptr, tokens_ptr, counts_ptr, M, G, BLOCK: tl.constexpr):
        """One program per group: active tokens to the front (ascending), inactive ones to the back."""
        g = tl.program_id(0)
        n_act = 0
        n_inact = 0
        for start in range(0, M, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            valid = offs < M
            m = tl.load(mask_ptr + offs.to(tl.int64) * G + g, mask=valid, other=0)
            act = (m != 0).to(tl.int32)
            inact = (valid & (m == 0)).to(tl.int32)
            pos_a = n_act + tl.cumsum(act, 0) - 1
            pos_i = M - n_inact - tl.cumsum(inact, 0)
            pos = tl.where(act > 0, pos_a, pos_i)
            tl.store(tokens_ptr + g.to(tl.int64) * M + pos, offs, mask=valid)
            n_act += tl.sum(act, 0)
            n_inact += tl.sum(inact, 0)
        tl.store(counts_ptr + g, n_act)

    @triton.jit
    def _tile_group_lists_kernel(
        mask_ptr,
        order_ptr,
        lists_ptr,
        counts_ptr,
        M,
        G,
        HAS_ORDER: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_G: tl.constexpr,
        USE_GDC: tl.constexpr,
    ):
        """One program per token tile: the groups active for at least one token of the tile."""
        if USE_GDC:  # programmatic dependent launch (dependent_launch.py): nothing read before this
            tl.extra.cuda.gdc_wait()
        t = tl.program_id(0)
        offs_m = t * BLOCK_M + tl.arange(0, BLOCK_M)
        valid_m = offs_m < M
        if HAS_ORDER:
            rows = tl.load(order_ptr + offs_m, mask=valid_m, other=0)
        else:
            rows = offs_m
        n = 0
        for g0 in range(0, G, BLOCK_G):
            offs_g = g0 + tl.arange(0, BLOCK_G)
            valid_g = offs_g < G
            m = tl.load(
                mask_ptr + rows.to(tl.int64)[:, None] * G + offs_g[None, :],
                mask=valid_m[:, None] & valid_g[None, :],
                other=0,
            )
            act = tl.max((m != 0).to(tl.int32), axis=0)
            pos = n + tl.cumsum(act, 0) - 1
            tl.store(lists_ptr + t.to(tl.int64) * G + pos, offs_g, mask=act > 0)
            n += tl.sum(act, 0)
        tl.store(counts_ptr + t, n)


@dataclass(frozen=True)
class GroupPlan:
    """Index tables for one mask ``[num_tokens, num_groups]`` (see module docstring)."""

    num_tokens: int
    num_groups: int
    mask_rows: torch.Tensor  # [M, G] contiguous rows the kernels read, nonzero = active (see ``mask_rows``)
    group_tokens: torch.Tensor | None = None  # [G, M] int32
    group_counts: torch.Tensor | None = None  # [G] int32
    block_m: int = 0  # token tile of the input-group tables
    token_order: torch.Tensor | None = None  # [M] int32
    tile_groups: torch.Tensor | None = None  # [T, G] int32
    tile_group_counts: torch.Tensor | None = None  # [T] int32
    union_groups: torch.Tensor | None = None  # [G] int32
    union_count: torch.Tensor | None = None  # [1] int32

    def has(self, part: str) -> bool:
        return {
            "output": self.group_tokens is not None,
            "input": self.token_order is not None,
            "union": self.union_groups is not None,
        }[part]

    def require(self, part: str, op: str) -> None:
        if not self.has(part):
            raise ValueError(
                f"{op}: the GroupPlan has no {part!r} tables; build it with build_group_plan(mask, parts=(..., {part!r}))"
            )


def mask_to_u8(mask: torch.Tensor) -> torch.Tensor:
    """``mask[..., G]`` (bool or any dtype, nonzero = active) -> contiguous uint8 ``[M, G]`` of 0 / 1."""
    m = mask.reshape(-1, mask.shape[-1])
    if m.dtype != torch.bool:
        m = m != 0
    return m.contiguous().view(torch.uint8)


_KERNEL_MASK_DTYPES = (torch.uint8, torch.float32, torch.float16, torch.bfloat16)


def mask_rows(mask: torch.Tensor) -> torch.Tensor:
    """``mask[..., G]`` as the contiguous ``[M, G]`` rows the Triton kernels read (they test ``!= 0``).

    Router masks (0.0 / 1.0 floats) are passed as they are: no conversion kernel per op, which matters at decode,
    where each op is a few microseconds. bool is reinterpreted as uint8; other dtypes become uint8 0 / 1.
    """
    m = mask.reshape(-1, mask.shape[-1])
    if m.dtype == torch.bool:
        return m.contiguous().view(torch.uint8)
    if m.dtype not in _KERNEL_MASK_DTYPES:
        return mask_to_u8(mask)
    return m.contiguous()


def plan_from_row_order(mask: torch.Tensor, order: torch.Tensor, count: torch.Tensor) -> GroupPlan | None:
    """The output tables of one sequence's ``mask[1, T, G]`` from its row order (``wide::group_rows``: ``order[1, G,
    T]``, ``count[1, G]``), which are the same lists (``row_order``); None for several sequences, whose row order is
    per sequence while these lists run over all their tokens."""
    if mask.dim() != 3 or mask.shape[0] != 1:
        return None
    return GroupPlan(mask.shape[1], mask.shape[2], mask_rows(mask), group_tokens=order[0], group_counts=count[0])


def default_block_m(num_tokens: int) -> int:
    """Token tile of the input-group GEMM: 64 for few tokens, else 128 (wider reuse of weight tiles)."""
    return 64 if num_tokens <= 64 else 128


def default_parts(num_tokens: int) -> tuple[str, ...]:
    """Tables the default ("auto") paths use: decode GEMVs need the union list, prefill output-group
    GEMMs the per-group token lists (the input-group op runs dense for prefill by default)."""
    return ("union",) if num_tokens <= DECODE_MAX_TOKENS else ("output",)


# ----------------------------------------------------------------------------------------- torch versions
def group_token_lists_torch(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch version of the ``output`` tables (inactive tokens in ascending order; kernels: any order)."""
    mt = m.t().to(torch.int8)
    tokens = torch.argsort(1 - mt, dim=1, stable=True).to(torch.int32)
    return tokens.contiguous(), mt.sum(1, dtype=torch.int32)


def pattern_sort_order(m: torch.Tensor) -> torch.Tensor:
    """Token order sorting mask rows lexicographically (group 0 most significant), stable."""
    num_tokens, num_groups = m.shape
    order = torch.arange(num_tokens, device=m.device)
    bits_per_word = 62
    for w0 in reversed(range(0, num_groups, bits_per_word)):
        chunk = m[:, w0 : w0 + bits_per_word].to(torch.int64)
        shifts = torch.arange(chunk.shape[1] - 1, -1, -1, device=m.device, dtype=torch.int64)
        key = (chunk << shifts).sum(1)
        order = order[torch.argsort(key[order], stable=True)]
    return order.to(torch.int32)


def tile_group_lists_torch(
    m: torch.Tensor, order: torch.Tensor | None, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch version of the per-tile active-group lists."""
    num_tokens, num_groups = m.shape
    mo = m if order is None else m[order.long()]
    tiles = cdiv(num_tokens, block_m)
    pad = tiles * block_m - num_tokens
    mo = torch.cat([mo, mo.new_zeros(pad, num_groups)]) if pad else mo
    act = mo.view(tiles, block_m, num_groups).amax(1).to(torch.int8)
    lists = torch.argsort(1 - act, dim=1, stable=True).to(torch.int32)
    return lists.contiguous(), act.sum(1, dtype=torch.int32)


# ----------------------------------------------------------------------------------------- builders
def _group_token_lists(m: torch.Tensor, scan: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``scan``: ``{"max_block": ..., "num_warps": ...}`` overrides of :func:`list_scan.scan_launch`, or
    ``{"two_pass": bool, "tile_elements": int, "offsets_pass": bool}`` to force / forbid the chunked build, size its
    chunks and force / forbid its offsets pass (benchmarks, tests); by default the chunked build runs where
    ``group_lists_two_pass.use_two_pass`` says it is faster."""
    if not can_run_triton(m):
        return group_token_lists_torch(m)
    num_tokens, num_groups = m.shape
    scan = dict(scan or {})
    two_pass_options = pop_two_pass_options(scan)
    if scan.pop("two_pass", use_two_pass(num_tokens, num_groups)):
        return group_token_lists_two_pass(m, **two_pass_options)
    tokens = torch.empty(num_groups, num_tokens, dtype=torch.int32, device=m.device)
    counts = torch.empty(num_groups, dtype=torch.int32, device=m.device)
    _group_token_lists_kernel[(num_groups,)](m, tokens, counts, num_tokens, num_groups,
                                             **scan_launch(num_tokens, **scan))
    return tokens, counts


def _tile_group_lists(
    m: torch.Tensor, order: torch.Tensor | None, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if not can_run_triton(m):
        return tile_group_lists_torch(m, order, block_m)
    num_tokens, num_groups = m.shape
    tiles = cdiv(num_tokens, block_m)
    lists = torch.empty(tiles, num_groups, dtype=torch.int32, device=m.device)
    counts = torch.empty(tiles, dtype=torch.int32, device=m.device)
    _tile_group_lists_kernel[(tiles,)](
        m,
        order if order is not None else m,
        lists,
        counts,
        num_tokens,
        num_groups,
        HAS_ORDER=order is not None,
        BLOCK_M=block_m,
        BLOCK_G=min(128, max(16, next_pow2(num_groups))),
        **pdl_launch(m.device),
    )
    return lists, counts


def build_group_plan(
    mask: torch.Tensor,
    *,
    parts: tuple[str, ...] | None = None,
    block_m: int | None = None,
    sort_tokens: bool = True,
) -> GroupPlan:
    """Build the index tables for ``mask[..., G]`` once; pass the plan to every op that uses this mask.

    Args:
        mask: ``[..., G]`` per-token group mask (bool, or nonzero = active); leading dims are flattened.
        parts: which tables to build (subset of ``("output", "input", "union")``); default: ``("union",)``
            for at most 16 tokens (decode GEMVs), else ``("output",)`` (prefill GEMMs; add ``"input"``
            for ``input_group_linear(..., path="gemm")``).
        block_m: token tile of the input-group tables (power of two >= 16); default 64 up to 64
            tokens, else 128. The input-group GEMM uses the plan's tile.
        sort_tokens: sort tokens by mask pattern for the input-group tables (see module docstring).
    """
    if not isinstance(mask, torch.Tensor) or mask.dim() < 1:
        raise ValueError("build_group_plan: mask must be a tensor [..., G]")
    m = mask_rows(mask) if can_run_triton(mask) else mask_to_u8(mask)
    num_tokens, num_groups = m.shape
    if num_groups == 0:
        raise ValueError("build_group_plan: mask has zero groups")
    parts = default_parts(num_tokens) if parts is None else tuple(parts)
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise ValueError(f"build_group_plan: unknown parts {bad}; expected a subset of {PARTS}")
    fields: dict = {}
    if "output" in parts:
        fields["group_tokens"], fields["group_counts"] = _group_token_lists(m)
    if "input" in parts:
        bm = default_block_m(num_tokens) if block_m is None else int(block_m)
        if bm < 16 or bm & (bm - 1):
            raise ValueError(f"build_group_plan: block_m must be a power of two >= 16, got {bm}")
        if sort_tokens and num_tokens > bm:
            order = pattern_sort_order(mask_to_u8(m))
        else:
            order = torch.arange(num_tokens, dtype=torch.int32, device=m.device)
        fields["block_m"] = bm
        fields["token_order"] = order
        fields["tile_groups"], fields["tile_group_counts"] = _tile_group_lists(m, order, bm)
    if "union" in parts:
        if num_tokens <= 256:  # one tile covering every token
            lists, counts = _tile_group_lists(m, None, max(16, next_pow2(num_tokens)))
        else:
            lists, counts = tile_group_lists_torch(mask_to_u8(m), None, num_tokens)
        fields["union_groups"], fields["union_count"] = lists[0], counts[:1]
    return GroupPlan(num_tokens=num_tokens, num_groups=num_groups, mask_rows=m, **fields)
