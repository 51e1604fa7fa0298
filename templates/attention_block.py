"""One key block of online-softmax attention, shared by the decode kernel and the prefill kernel's explicit-mask loop.

``attend_block`` reads the K/V rows of ``cols`` where ``col_ok`` (a predicate of False reads nothing), scores them with
``q``, hides the scores where ``valid`` is False (-inf) and folds the block into the running ``(acc, l, m)`` (scores in
the log2 domain, ``qk_scale`` includes log2(e)). A row that has seen no visible key keeps ``m = -inf, l = 0``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["attend_block", "load_key_block", "load_value_block"]


@triton.jit
def load_key_block(k_base, stride_ks, cols, col_ok, offs_d, dmask, row0, start_n, USE_TMA: tl.constexpr):
    """``K[cols].T`` as ``[BLOCK_D, BLOCK_N]``: pointer loads where ``col_ok`` (zeros elsewhere), or with ``USE_TMA``
    one TMA box of the descriptor ``k_base`` over the keys as rows (``row0``: this (batch, KV head)'s first row).
    A box reads whole rows past the key length too (the next head's keys, zeros past the tensor): callers hide those
    scores (-inf), so they only ever meet a probability of 0."""
    if USE_TMA:  # (one return per function: Triton compiles the code after an early return too)
        k = k_base.load([row0 + start_n, 0]).T
    else:
        k = tl.load(k_base + cols[None, :] * stride_ks + offs_d[:, None], mask=col_ok[None, :] & dmask[:, None],
                    other=0.0)
    return k


@triton.jit
def load_value_block(v_base, stride_vs, cols, col_ok, offs_d, dmask, row0, start_n, USE_TMA: tl.constexpr):
    """``V[cols]`` as ``[BLOCK_N, BLOCK_D]`` (see :func:`load_key_block`)."""
    if USE_TMA:
        v = v_base.load([row0 + start_n, 0])
    else:
        v = tl.load(v_base + cols[:, None] * stride_vs + offs_d[None, :], mask=col_ok[:, None] & dmask[None, :],
                    other=0.0)
    return v


@triton.jit
def attend_block(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, cols, col_ok, valid, offs_d, dmask, qk_scale,
                 row0, start_n, INPUT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr):
    """Online-softmax update over one key block: K/V read where ``col_ok`` (or as TMA boxes, ``load_key_block``),
    ``valid[rows, keys]`` says which scores count."""
    k = load_key_block(k_base, stride_ks, cols, col_ok, offs_d, dmask, row0, start_n, USE_TMA)
    qk = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale
    qk = tl.where(valid, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet stays at 0
    p = tl.math.exp2(qk - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = load_value_block(v_base, stride_vs, cols, col_ok, offs_d, dmask, row0, start_n, USE_TMA)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
    return acc, l_i, m_new
