"""The K-loop loads shared by the output-group GEMMs (``gemm_output_groups``, ``gemm_gated_up``).

Per K step a program reads one ``[BLOCK_M, BLOCK_K]`` tile of gathered token rows (pointer loads: the rows are a
group's reordered token list) and one ``[BLOCK_K, BLOCK_N]`` tile of ``W.T`` per weight, either through pointer loads
or, with ``USE_TMA``, through a host-side TMA descriptor of ``W[N, K]`` (``tma_weights``; the box's rows or columns
past the weight's edge read as zeros, so no mask is needed there). ``load_weight_pair`` reads the same n tile of two
weights at once through one ``[2, N, K]`` descriptor (``tma_weights.pair_descriptor``) as one ``[BLOCK_K, 2 * BLOCK_N]``
operand.
"""
from __future__ import annotations

from ._triton_utils import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def load_token_rows(x_ptrs, k, offs_k, K, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
        """``x[rows, k:k + BLOCK_K]`` (zeros past ``K``), in fp32 when ``UPCAST`` (the interpreter's bf16 is wrong)."""
        if EVEN_K:
            a = tl.load(x_ptrs)
        else:
            a = tl.load(x_ptrs, mask=((k + offs_k) < K)[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
        return a

    @triton.jit
    def load_weight_tile(w_ptrs, w_desc, n_start, k, offs_k, K, valid_n, USE_TMA: tl.constexpr,
                         EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, UPCAST: tl.constexpr):
        """``W[n tile, k:k + BLOCK_K].T`` as ``[BLOCK_K, BLOCK_N]`` (zeros outside the weight / the group)."""
        if USE_TMA:
            b = w_desc.load([n_start, k]).T
        elif EVEN_K and EVEN_N:
            b = tl.load(w_ptrs)
        elif EVEN_K:
            b = tl.load(w_ptrs, mask=valid_n[None, :], other=0.0)
        else:
            b = tl.load(w_ptrs, mask=((k + offs_k) < K)[:, None] & valid_n[None, :], other=0.0)
        if UPCAST:
            b = b.to(tl.float32)
        return b


    @triton.jit
    def load_weight_pair(w_pair_desc, n_start, k, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         UPCAST: tl.constexpr):
        """``[W_a[n tile, k:k + BLOCK_K]; W_b[n tile, k:k + BLOCK_K]].T`` as ``[BLOCK_K, 2 * BLOCK_N]``: one TMA box
        ``[2, BLOCK_N, BLOCK_K]`` that Triton reshapes in shared memory, so it feeds one MMA (zeros outside the
        weights)."""
        b = w_pair_desc.load([0, n_start, k]).reshape(2 * BLOCK_N, BLOCK_K).T
        if UPCAST:
            b = b.to(tl.float32)
        return b


__all__ = ["load_token_rows", "load_weight_pair", "load_weight_tile"]
