"""The query's rotary embedding inside the lowered attention: ``wide::group_attention_rope`` and its graph fusion
(``passes/query_rope_fusion.py``). The kernel's rotation is tested in ``test_attention_templates.py`` (interpreter) and
``test_gpu_attention.py`` (H200).

- the op: on CPU equal to ``wide::group_attention`` of HF's rotated query, fake shapes and layout, no gradient;
- the fusion: a compiled tiny Llama with a prefill-sized prompt (static shapes, inference) rotates the query inside
  every lowered attention (logits equal eager, fp32 and bf16); decode-sized graphs, the option off and graphs that
  need gradients keep HF's rotation; a rotated query with another user is left alone.
"""
from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from test_backend import Capture  # noqa: E402
from test_router_mask import tiny_wide_llama  # noqa: E402

import wide_compile  # noqa: E402
import wide_compile.group_attention_rope_op  # noqa: E402, F401  (registers wide::group_attention_rope)
from wide_compile.passes.query_rope_fusion import fuse_query_rotations  # noqa: E402
from wide_compile.passes.torch_patterns import wide_op_names  # noqa: E402
from wide_compile.templates.attention_rotary import rotate_query_reference  # noqa: E402

rope_op = torch.ops.wide.group_attention_rope.default


def inputs(tokens: int = 600, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, tokens, 16, generator=gen).to(dtype)
    k, v = (torch.randn(1, 2, tokens, 16, generator=gen).to(dtype) for _ in range(2))
    pos = torch.arange(tokens).float()[None, :, None] * torch.linspace(0.01, 1.0, 8).repeat(2)
    mask = (torch.rand(1, tokens, 2, generator=gen) < 0.5).to(dtype)
    return q, pos.cos().to(dtype), pos.sin().to(dtype), k, v, mask


def test_op_equals_group_attention_of_the_rotated_query():
    q, cos, sin, k, v, mask = inputs(37)
    out = rope_op(q, cos, sin, k, v, mask, True, None)
    expected = torch.ops.wide.group_attention(rotate_query_reference(q, cos, sin), k, v, mask, True, None)
    assert torch.equal(out, expected) and out.stride() == expected.stride()
    torch.library.opcheck(rope_op, (q, cos, sin, k, v, mask, True, None), test_utils=("test_schema",
                                                                                       "test_faketensor"))
    with pytest.raises(RuntimeError, match="group_attention_rope has no gradient"):
        rope_op(q.requires_grad_(), cos, sin, k, v, mask, True, None).sum().backward()
    with pytest.raises(ValueError, match="rotary cos must be"):
        with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
            rope_op(q.detach(), cos[:, :5], sin, k, v, mask, True, None)


def compile_tiny(model, ids, options=None, grad: bool = False):
    torch._dynamo.reset()
    wide_compile.backend.reset_compile_report()
    options = {"wide.inner": "eager", **(options or {})}
    with torch.set_grad_enabled(grad):
        actual = torch.compile(model, backend="wide", options=options)(ids, use_cache=False).logits
        expected = model(ids, use_cache=False).logits
    (graph,) = wide_compile.compile_report(model).graphs
    return actual, expected, graph


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_graph_rotates_the_query_inside_the_attention(dtype):
    model = tiny_wide_llama(dtype)
    actual, expected, graph = compile_tiny(model, torch.randint(3, 120, (1, 520)))
    assert torch.equal(actual, expected)
    assert graph.lowered["group_attention_rope"] == 2 and "group_attention" not in graph.lowered, graph.lowered
    ops = wide_op_names(graph.graph_module.graph)
    assert ops["group_attention_rope"] == 2 and "group_attention" not in ops
    negs = [n for n in graph.graph_module.graph.nodes if n.op == "call_function" and n.target.__name__ == "neg"]
    assert len(negs) == 2  # the keys' rotate_half in each layer; the queries' went into the attention


@pytest.mark.parametrize("tokens, options, grad", [(7, {}, False), (520, {"wide.fuse_query_rope": False}, False),
                                                   (520, {}, True)])
def test_decode_option_and_training_graphs_keep_hf_rotation(tokens, options, grad):
    model = tiny_wide_llama(torch.float32)
    if grad:
        for p in model.parameters():
            p.requires_grad_(True)
    actual, expected, graph = compile_tiny(model, torch.randint(3, 120, (1, tokens)), options, grad)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert "group_attention_rope" not in graph.lowered, graph.lowered
    assert graph.lowered.get("group_attention") == (None if grad else 2)  # training keeps SDPA (dense queries)
    with pytest.raises(ValueError, match="'wide.fuse_query_rope' must be a bool"):
        wide_compile.backend.parse_settings(None, {"wide.fuse_query_rope": 1})


def test_a_rotated_query_used_elsewhere_is_left_alone():
    def attention(q, cos, sin, k, v, mask):
        half = q.shape[-1] // 2
        q_embed = q * cos.unsqueeze(1) + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin.unsqueeze(1)
        return torch.ops.wide.group_attention(q_embed, k, v, mask, True, None), q_embed

    def fused_count(fn, *args):
        torch._dynamo.reset()
        cap = Capture()
        with torch.no_grad():
            torch.compile(fn, backend=cap, fullgraph=True)(*args)
        return fuse_query_rotations(cap.graphs[0].graph)

    args = inputs(600)
    assert fused_count(attention, *args) == 0
    assert fused_count(lambda *a: attention(*a)[0], *args) == 1
    assert fused_count(lambda *a: attention(*a)[0], *inputs(100)) == 0  # below MIN_TOKENS
