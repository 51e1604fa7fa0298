"""``passes/rotary_realize.py``: the rotary cos / sin table is stored once (``wide::realize``) when several layers
read it, and the graph's values do not change."""
from __future__ import annotations

import torch
from torch import fx

import wide_compile  # noqa: F401  (registers the wide:: ops)
from wide_compile.passes.rotary_realize import realize_rotary_tables


class _Rope(torch.nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.layers = layers

    def forward(self, pos, xs):
        freqs = pos[:, None] * torch.arange(1, 9, dtype=torch.float32)
        cos = (freqs.cos() * 0.5).to(torch.float16)
        sin = torch.sin(freqs)
        out = []
        for i in range(self.layers):
            out.append(xs[i] * cos + xs[i].flip(-1) * sin)
        return out


def _traced(layers: int) -> fx.GraphModule:
    return fx.symbolic_trace(_Rope(layers))


def test_shared_tables_are_realized_once_and_values_kept():
    gm = _traced(3)
    pos, xs = torch.arange(5, dtype=torch.float32), [torch.randn(5, 8, dtype=torch.float16) for _ in range(3)]
    expected = gm(pos, xs)
    for node in gm.graph.nodes:
        node.meta["example_value"] = node.name  # stands for the value a Dynamo graph records
    assert realize_rotary_tables(gm.graph) == 2  # cos (after its scaling and cast) and sin
    gm.recompile()
    realized = [n for n in gm.graph.nodes if n.target is torch.ops.wide.realize.default]
    assert len(realized) == 2
    assert all(r.meta["example_value"] == r.args[0].name for r in realized)  # the table's value, for later passes
    cos_table = next(r for r in realized if r.args[0].op == "call_method" and r.args[0].target == "to")
    assert len(cos_table.users) == 3 and len(cos_table.args[0].users) == 1  # every layer reads the stored table
    for got, want in zip(gm(pos, xs), expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_table_with_one_reader_is_left_alone():
    gm = _traced(1)
    assert realize_rotary_tables(gm.graph) == 0
    assert not any(n.target is torch.ops.wide.realize.default for n in gm.graph.nodes)


def test_a_decode_sized_table_is_left_alone():
    """With example values (Dynamo's graphs), a table of at most 16 positions (a decode step) stays inline; 17 is
    realized."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for rows, expected in ((1, 0), (16, 0), (17, 2)):
        gm = _traced(2)
        mode = FakeTensorMode()
        for node in gm.graph.nodes:  # (only the tables' values are read: every call gets a [rows, 8] value)
            if node.op in ("call_method", "call_function"):
                node.meta["example_value"] = mode.from_tensor(torch.empty(rows, 8))
        assert realize_rotary_tables(gm.graph) == expected, rows


def test_realize_op_copies_and_passes_gradients():
    x = torch.randn(4, 3, requires_grad=True)
    y = torch.ops.wide.realize(x)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
