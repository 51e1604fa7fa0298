"""The abstract values of the group-locality analysis (``group_locality``) and their shape algebra.

A :class:`Flow` says, for every axis of a source tensor ``y`` (its lead axes, then its feature axis), where that axis
went in a tensor computed from ``y`` and how coarse it became (:class:`AxisMap`). Sizes may be symbolic (dynamic
shapes): they are compared as sympy expressions, equal only when equal for every value of their symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import sympy
import torch


class NotLocal(Exception):
    """The analysis stopped: the reason names the node and what it does."""


@dataclass(frozen=True)
class AxisMap:
    axis: int  # where the source axis is in this tensor
    k: int = 1  # positions per source block
    width: int = 1  # source coordinates per block


@dataclass(frozen=True)
class Flow:
    maps: tuple[AxisMap, ...]  # one per source axis: lead axes, then the feature axis
    core: bool = False  # passed an attention core (SDPA, or a matmul whose first operand depends on the source)

    def axes(self) -> set[int]:
        return {m.axis for m in self.maps}

    def moved(self, where) -> Flow:
        return replace(self, maps=tuple(replace(m, axis=where(m.axis)) for m in self.maps))


def dims_of(value: Any) -> tuple:
    return tuple(value.shape)


def _expr(d) -> sympy.Expr:
    return sympy.Integer(d) if isinstance(d, int) else sympy.sympify(d.node.expr)


def prod(dims) -> sympy.Expr:
    return sympy.Mul(*[_expr(d) for d in dims]) if dims else sympy.Integer(1)


def same_size(a, b) -> bool:
    """Two (possibly symbolic) sizes are equal for every value of their symbols."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return _is_zero(_expr(a) - _expr(b))


def _is_zero(expr: sympy.Expr) -> bool:
    """``expr == 0`` for all symbol values (products of sizes: sympy's canonical form, else expanded)."""
    return expr == 0 or (not expr.is_Number and sympy.expand(expr) == 0)


def _int_ratio(num: sympy.Expr, den: sympy.Expr) -> int | None:
    ratio = num / den
    if not ratio.is_Number:
        ratio = sympy.cancel(ratio)
    return int(ratio) if ratio.is_Integer and ratio > 0 else None


def norm_dim(dim, rank: int) -> int:
    if not isinstance(dim, int):
        raise NotLocal(f"non-constant dim {dim!r}")
    if not -rank <= dim < max(rank, 1):
        raise NotLocal(f"dim {dim} out of range for rank {rank}")
    return dim % rank if rank else 0


def dim_list(dim, rank: int) -> list[int]:
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return [norm_dim(d, rank) for d in dims]


def check_not_tracked(flow: Flow, dims, what: str) -> None:
    hit = flow.axes() & set(dims)
    if hit:
        raise NotLocal(f"{what} over a head/token axis (dim {sorted(hit)})")



# ----------------------------------------------------------------------------------------------- transfer functions
def view_axis(m: AxisMap, old: tuple, new: tuple) -> AxisMap:
    """Follow one tracked axis through a row-major reshape ``old -> new`` (see module docstring)."""
    outer = prod(old[: m.axis])
    candidates = [a for a in range(len(new)) if _is_zero(prod(new[:a]) - outer)]
    if not candidates:
        raise NotLocal(f"reshape {list(old)} -> {list(new)} merges a head/token axis with an outer axis")
    inner_old = prod(old[m.axis + 1:])
    # Candidates differ only by size-1 axes of ``new``: take the one keeping the positions exactly, else the one
    # axis of size > 1 among them (a size-1 axis would merge all positions into one).
    exact = [a for a in candidates if _is_zero(prod(new[a + 1:]) - inner_old)]
    sized = [a for a in candidates if not same_size(new[a], 1)]
    a = (exact or sized or candidates)[-1]
    inner_new = prod(new[a + 1:])
    r = _int_ratio(inner_new, inner_old)
    if r is not None:
        if r % m.k == 0:
            return AxisMap(a, 1, m.width * r // m.k)
        if m.k % r == 0:
            return AxisMap(a, m.k // r, m.width)
    else:
        s = _int_ratio(inner_old, inner_new)
        if s is not None:
            return AxisMap(a, s * m.k, m.width)
    raise NotLocal(f"reshape {list(old)} -> {list(new)} splits a head/token axis unevenly")


def broadcast_in(flow: Flow, value: torch.Tensor, out: torch.Tensor) -> Flow:
    """Flow of an operand after broadcasting to ``out``; the tracked axes must not be broadcast."""
    shift = out.dim() - value.dim()
    moved = flow.moved(lambda a: a + shift)
    for m_in, m_out in zip(flow.maps, moved.maps):
        if not same_size(value.shape[m_in.axis], out.shape[m_out.axis]):
            raise NotLocal("broadcasts a head/token axis")
    return moved


def merge(flows: list[Flow]) -> Flow:
    first = flows[0]
    if any(f.maps != first.maps for f in flows[1:]):
        raise NotLocal("combines values of the source laid out differently")
    return replace(first, core=any(f.core for f in flows))


def getitem_tensor(flow: Flow, index, value: torch.Tensor) -> Flow:
    items = list(index) if isinstance(index, tuple) else [index]
    rank = value.dim()
    consumed = sum(1 for it in items if it is not None and it is not Ellipsis)
    mapping, i, o = {}, 0, 0
    for it in items:
        if it is None:
            o += 1
        elif it is Ellipsis:
            for _ in range(rank - consumed):
                mapping[i] = o
                i, o = i + 1, o + 1
        elif isinstance(it, slice):
            full = it.start in (None, 0) and it.stop is None and it.step in (None, 1)
            if i in flow.axes() and not full:
                raise NotLocal(f"slices a head/token axis (dim {i}): a fused q/k/v projection, or heads taken apart")
            mapping[i] = o
            i, o = i + 1, o + 1
        elif isinstance(it, int):
            if i in flow.axes():
                raise NotLocal(f"indexes a head/token axis (dim {i})")
            i += 1
        else:
            raise NotLocal("advanced indexing")
    while i < rank:
        mapping[i] = o
        i, o = i + 1, o + 1
    return flow.moved(lambda a: mapping[a])


__all__ = ["AxisMap", "Flow", "NotLocal", "broadcast_in", "check_not_tracked", "dim_list", "dims_of", "getitem_tensor",
           "merge", "norm_dim", "same_size", "view_axis"]
