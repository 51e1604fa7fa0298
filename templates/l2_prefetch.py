"""``prefetch.global.L2`` from Triton kernels: ask L2 for lines a program will load later, without a register or a
shared-memory buffer to hold them.

A streaming kernel keeps as many bytes in flight as its shared-memory pipeline holds (the decode attention's split
kernel: two 64 KB K/V blocks per SM). Prefetching blocks further ahead into L2 raises the DRAM requests in flight
beyond that; when the pipeline's own copy of a block comes, it hits L2. No-op on lines already there.

Not available under ``TRITON_INTERPRET=1`` (inline PTX): kernels call it only under a compile-time flag that the
launchers leave off there.
"""
from __future__ import annotations

from ._triton_utils import HAS_TRITON

LINE_BYTES = 128  # an L2 line as a prefetch counts it

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def prefetch_l2(ptrs, mask):
        """One ``prefetch.global.L2`` per element of ``ptrs`` where ``mask`` (pass one pointer per 128-byte line)."""
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def prefetch_rows_l2(base, rows, row_ok, stride, LINES: tl.constexpr, LINE: tl.constexpr):
        """Prefetch ``LINES`` lines of ``LINE`` elements from the start of each row ``base + rows * stride``."""
        offs = tl.arange(0, rows.shape[0] * LINES)
        r = tl.reshape(tl.broadcast_to(rows[:, None], (rows.shape[0], LINES)), (rows.shape[0] * LINES,))
        ok = tl.reshape(tl.broadcast_to(row_ok[:, None], (rows.shape[0], LINES)), (rows.shape[0] * LINES,))
        prefetch_l2(base + r.to(tl.int64) * stride + (offs % LINES) * LINE, ok)


def lines_per_row(row_elements: int, element_size: int) -> tuple[int, int]:
    """``(LINES, LINE)``: the 128-byte lines a row of ``row_elements`` spans (a power of two, at least 1) and the
    elements per line."""
    line = max(1, LINE_BYTES // element_size)
    lines = 1
    while lines * line < row_elements:
        lines *= 2
    return lines, line


__all__ = ["LINE_BYTES", "lines_per_row"] + (["prefetch_l2", "prefetch_rows_l2"] if HAS_TRITON else [])
