"""``WIDE_PDL=1`` on the GPU: a decode layer's chain of our kernels (router, gate/up GEMV, down plan + GEMV, query
GEMV, split-KV attention) launched with programmatic dependent launch gives the same bits as without, eagerly and
replayed in a CUDA graph, and matches the references."""

from __future__ import annotations

import pytest
import torch

from wide_compile.templates import (
    gated_up_groups, gated_up_groups_reference, group_attention_decode, group_attention_reference,
    input_group_linear, input_group_linear_reference, output_group_linear, output_group_linear_reference,
)
from wide_compile.templates.router_mask import router_mask

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _chain(x, w, q, k, v, routers):
    """One decode step's kernels back to back, each reading what the previous one wrote."""
    mlp_mask = router_mask(x, *routers)
    h = gated_up_groups(x, w["gate"], w["up"], mlp_mask, 128)
    y = input_group_linear(h, w["down"], mlp_mask, 128, x_is_masked=True)
    qy = output_group_linear(y, w["q"], mlp_mask[:, :32], 128)  # a mask slice as the query groups' mask
    head_mask = mlp_mask[:, None, :8].to(q.dtype)
    o = group_attention_decode(q + qy.view(1, 32, 1, 128), k, v, head_mask, causal=True, num_splits=4)
    return mlp_mask, h, y, qy, o


def test_dependent_launch_chain_is_bit_identical(monkeypatch):
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(dt)

    hidden, inter = 4096, 4096
    w = {"gate": randn(inter, hidden, scale=hidden**-0.5), "up": randn(inter, hidden, scale=hidden**-0.5),
         "down": randn(hidden, inter, scale=inter**-0.5), "q": randn(4096, hidden, scale=hidden**-0.5)}
    routers = [torch.randn(32, hidden, generator=gen, device="cuda") * hidden**-0.5,
               torch.zeros(32, device="cuda"), torch.randn(64, 32, generator=gen, device="cuda") * 32**-0.5,
               torch.zeros(64, device="cuda")]
    x = randn(1, hidden)
    q, k, v = randn(1, 32, 1, 128), randn(1, 8, 3000, 128), randn(1, 8, 3000, 128)
    results = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("WIDE_PDL", flag)
        eager = [t.clone() for t in _chain(x, w, q, k, v, routers)]
        static = [t.clone() for t in _chain(x, w, q, k, v, routers)]  # warm-up before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _chain(x, w, q, k, v, routers)
        for t in captured:
            t.fill_(float("nan") if t.is_floating_point() else 0)
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(eager, static))
        assert all(torch.equal(a, b) for a, b in zip(eager, captured)), f"WIDE_PDL={flag}: graph replay differs"
        results[flag] = eager
    assert all(torch.equal(a, b) for a, b in zip(results["0"], results["1"]))
    mask, h, y, qy, o = results["1"]
    assert 0 < mask.mean() < 1
    torch.testing.assert_close(h, gated_up_groups_reference(x, w["gate"], w["up"], mask, 128), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(y, input_group_linear_reference(h, w["down"], mask, 128), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(qy, output_group_linear_reference(y, w["q"], mask[:, :32], 128), atol=3e-2,
                               rtol=3e-2)
    ref = group_attention_reference(q + qy.view(1, 32, 1, 128), k, v, mask[:, None, :8].to(dt), causal=True)
    torch.testing.assert_close(o, ref, atol=3e-2, rtol=3e-2)
