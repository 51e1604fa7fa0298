"""``wide::output_group_linear_with_dense`` and the pass that inserts it (``passes/dense_siblings.py``): a lowered query
projection takes the dense linears of its input (key, value) along, in inference graphs only."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_backend_attention import random_masks, through_backend, wide_model

import wide_compile
import wide_compile.dense_siblings_op  # noqa: F401  (registers the op)
from wide_compile.passes.torch_patterns import wide_op_names

FUSED = "output_group_linear_with_dense"
op = torch.ops.wide.output_group_linear_with_dense


def test_op_equals_the_expressions_and_checks_its_arguments():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 48, generator=gen)
    w, wk, wv = (torch.randn(rows, 48, generator=gen) for rows in (64, 16, 16))
    b, bk = torch.randn(64, generator=gen), torch.randn(16, generator=gen)
    mask = (torch.rand(2, 3, 4, generator=gen) < 0.5).float()
    q, k, v = op(x, mask, w, b, 16, [wk, wv], [bk, None])
    assert torch.equal(q, F.linear(x, w, b) * mask.repeat_interleave(16, -1))
    assert torch.equal(k, F.linear(x, wk, bk)) and torch.equal(v, F.linear(x, wv))
    with pytest.raises(ValueError, match="2 dense weights but 1 dense biases"):
        op(x, mask, w, b, 16, [wk, wv], [bk])
    with pytest.raises(ValueError, match=r"dense_weights\[0\] must be 2-D"):
        op(x, mask, w, b, 16, [wk[0]], [None])
    with pytest.raises(RuntimeError, match=r"dense_weights\[0\] has K=40"):
        op(x, mask, w, b, 16, [wk[:, :40]], [None])


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi"])
@pytest.mark.parametrize("tokens", [1, 5])
def test_backend_joins_key_and_value_projections_to_the_query(family, tokens):
    """Inference: each lowered query projection and its key / value projections become one op (qwen2, phi: with
    biases; phi's parallel MLP input projection reads the same input and stays apart); logits equal eager bit for bit;
    ``wide.fuse_dense_siblings=False`` keeps them apart."""
    model = wide_model(family)
    ids = torch.randint(3, 120, (1, tokens), generator=torch.Generator().manual_seed(2))
    for option in (True, False):
        torch._dynamo.reset()
        wide_compile.backend.reset_compile_report()
        compiled = torch.compile(model, backend="wide", options={"wide.inner": "eager",
                                                                  "wide.fuse_dense_siblings": option})
        with torch.no_grad(), wide_compile.forced(model, random_masks(model, 1, tokens)):
            torch.testing.assert_close(compiled(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                       rtol=0, atol=0)
        (graph,) = wide_compile.compile_report(model).graphs
        assert wide_op_names(graph.graph_module.graph).get(FUSED, 0) == (2 if option else 0)
        for node in graph.graph_module.graph.nodes:
            if node.op == "call_function" and node.target is op.default:
                dense = [w.name for w in node.args[5]]
                assert len(dense) == 2 and "k_proj" in dense[0] and "v_proj" in dense[1], dense
                biased = family in ("qwen2", "phi")
                assert (node.args[3] is None) != biased and all((b is None) != biased for b in node.args[6])


def test_training_graphs_keep_the_projections_apart():
    """With gradients enabled (training) nothing is joined: the fused op has no backward."""
    model = wide_model("llama")
    ids = torch.randint(3, 120, (2, 5))
    compiled = through_backend(model)
    with wide_compile.forced(model, random_masks(model, 2, 5)):
        compiled(ids, use_cache=False).logits.sum().backward()
    (graph,) = wide_compile.compile_report(model).graphs
    assert FUSED not in wide_op_names(graph.graph_module.graph) and FUSED not in graph.lowered


def test_option_must_be_a_bool():
    with pytest.raises(ValueError, match="'wide.fuse_dense_siblings' must be a bool"):
        wide_compile.backend.parse_settings(None, {"wide.fuse_dense_siblings": "yes"})


def test_with_lora_adapters_the_base_key_and_value_projections_join():
    """PEFT LoRA on q, k, v at inference: the adapters' down-projections also read x (three linears of one shape), but
    the base key and value projections (the most output rows) are the ones joined; logits equal eager."""
    peft = pytest.importorskip("peft")
    model = wide_model("llama")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"], lora_dropout=0.0,
                             init_lora_weights=False)
    model = peft.get_peft_model(model, config)
    ids = torch.randint(3, 120, (1, 1), generator=torch.Generator().manual_seed(3))
    compiled = through_backend(model)
    with torch.no_grad(), wide_compile.forced(model, random_masks(model, 1, 1)):
        torch.testing.assert_close(compiled(input_ids=ids, use_cache=False).logits,
                                   model(input_ids=ids, use_cache=False).logits, rtol=0, atol=0)
    (graph,) = wide_compile.compile_report(model).graphs
    joined = [n for n in graph.graph_module.graph.nodes if n.op == "call_function" and n.target is op.default]
    assert len(joined) == 2
    for node in joined:
        names = [w.name for w in node.args[5]]
        assert "k_proj" in names[0] and "v_proj" in names[1] and all("base_layer" in n for n in names), names


def test_a_weight_computed_after_the_query_keeps_the_projections_apart_with_a_reason():
    """The joined op would go before the first projection; a sibling's weight computed later (here a scaled value
    weight) cannot move there: the projections stay apart, the reason is reported, the result is unchanged."""
    from test_backend_attention import capture

    from wide_compile.passes.lowering import lower_wide_patterns

    heads, dim, gs = 4, 16, 32

    def block(x, m, wq, wk, wv, wo):
        b, t, _ = x.shape
        q = F.linear(x, wq).view(b, t, heads, dim).transpose(1, 2)
        k = F.linear(x, wk).view(b, t, heads, dim).transpose(1, 2)
        v = F.linear(x, wv * 0.5).view(b, t, heads, dim).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, heads * dim)
        return F.linear(torch.ops.wide.group_mask(a, m, gs), wo)

    gen = torch.Generator().manual_seed(1)
    args = (torch.randn(2, 5, 48, generator=gen), (torch.rand(2, 5, 2, generator=gen) > 0.5).float(),
            *(torch.randn(64, 48, generator=gen) / 7 for _ in range(3)), torch.randn(48, 64, generator=gen) / 8)
    gm, example = capture(block, *args)
    with torch.no_grad():
        expected = gm(*example)
        result = lower_wide_patterns(gm)
        actual = gm(*example)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert result.lowered.get("output_group_linear") == 1 and FUSED not in result.lowered
    assert [why for why in result.generic if "stay apart" in why and "is computed after" in why], result.generic
