"""``router_mask_lists`` (``wide::router_mask_lists``, ``passes/router_lists.py``): the router decision and the output-group GEMMs' per-group token lists from one launch
(``templates/router_mask.py``, ``LISTS``), under the Triton interpreter against the reference decisions and
``group_plan``'s lists (as sets: the router's tiles reserve their places with atomic counters, in the order they
finish); the pass (``wide.router_lists``, off by default until the GPU test below has run)."""
from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from test_router_mask import assert_decisions_match, rm, router_weights, tokens  # noqa: E402, F401
from test_row_order_sharing import compile_prefill  # noqa: E402

import wide_compile  # noqa: E402
import wide_compile.kernel_ops  # noqa: E402, F401
import wide_compile.router_mask_op  # noqa: E402, F401
from wide_compile.passes.router_lists import MIN_TOKENS  # noqa: E402
from wide_compile.passes.torch_patterns import wide_op_names  # noqa: E402
from wide_compile.router_mask_op import router_mask_lists_kernel  # noqa: E402

lists_op = torch.ops.wide.router_mask_lists.default
gated_op = torch.ops.wide.gated_up_groups.default
# the ops' CUDA implementations called on CPU tensors: under the interpreter only (conftest sets it without a GPU)
interpreter_only = pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
                                      reason="runs the CUDA implementations under the Triton interpreter")

CASES = [  # (tokens, groups, SPLIT, BLOCK_M, bias): one to seven token tiles, split or not, ragged groups
    (1, 8, 2, 16, "random"),
    (37, 40, 1, 16, "random"),
    (70, 5, 3, 32, "random"),
    (100, 70, 2, 16, "random"),
    (33, 12, 1, 16, "execute"),
    (33, 12, 2, 16, "skip"),
]


@pytest.mark.parametrize("m, g, split, block_m, bias", CASES)
def test_lists_hold_each_groups_active_tokens_first(rm, m, g, split, block_m, bias):  # noqa: F811
    x = tokens((m, 130), torch.float16, seed=m + g)
    weights = router_weights(130, 32, g, bias=bias, seed=g)
    mask, group_tokens, group_counts = rm.router_mask_lists(x, *weights, config={"SPLIT": split, "BLOCK_M": block_m})
    assert_decisions_match(mask, x, *weights, max_ties=1.0)
    active = mask != 0
    assert group_tokens.shape == (g, m) and group_tokens.dtype == group_counts.dtype == torch.int32
    assert torch.equal(group_counts, active.sum(0, dtype=torch.int32))
    for group in range(g):
        n = int(group_counts[group])
        listed = group_tokens[group].long()
        assert torch.equal(listed[:n].sort().values, active[:, group].nonzero().flatten())
        assert torch.equal(listed[n:].sort().values, (~active[:, group]).nonzero().flatten())
    counters = rm.arrival_counters(1, x.device)
    assert not counters.any(), "the launch left a counter set"  # the next launch starts from zero


def test_two_launches_in_a_row_start_from_zero(rm):  # noqa: F811
    x = tokens((50, 130), torch.float16, seed=3)
    weights = router_weights(130, 32, 9, seed=4)
    first = rm.router_mask_lists(x, *weights, config={"BLOCK_M": 16})
    second = rm.router_mask_lists(x, *weights, config={"BLOCK_M": 16})
    assert torch.equal(first[0], second[0]) and torch.equal(first[2], second[2])


def test_reference_path_gives_the_plans_lists(rm, monkeypatch):  # noqa: F811
    """Where Triton cannot run: the reference decision and ``group_plan``'s PyTorch lists (sorted)."""
    monkeypatch.setattr(rm, "_use_kernel", lambda x, w_in: False)
    x = tokens((20, 64), torch.float32, seed=5)
    weights = router_weights(64, 16, 6, seed=6)
    mask, group_tokens, group_counts = rm.router_mask_lists(x, *weights)
    active = mask != 0
    assert torch.equal(group_counts, active.sum(0, dtype=torch.int32))
    for group in range(6):
        n = int(group_counts[group])
        assert torch.equal(group_tokens[group, :n].long(), active[:, group].nonzero().flatten())


# ----------------------------------------------------------------------------------------------- op and pass


def test_op_is_the_router_and_the_plans_lists():
    x = tokens((2, 20, 48), torch.float32, seed=7)
    weights = router_weights(48, 16, 6, seed=8)
    mask, group_tokens, group_counts = lists_op(x, *weights)
    assert torch.equal(mask, torch.ops.wide.router_mask(x, *weights))
    from wide_compile.templates.group_plan import build_group_plan

    plan = build_group_plan(mask, parts=("output",))  # (its inactive tokens may come in another order)
    assert torch.equal(group_counts, plan.group_counts)
    for group in range(6):
        n = int(group_counts[group])
        assert torch.equal(group_tokens[group, :n], plan.group_tokens[group, :n])
        assert torch.equal(group_tokens[group, n:].sort().values, plan.group_tokens[group, n:].sort().values)
    torch.library.opcheck(torch.ops.wide.router_mask_lists, (x, *weights),
                          test_utils=("test_schema", "test_faketensor"))


@interpreter_only
def test_cuda_kernel_on_the_interpreter_gives_lists_of_the_same_sets():
    x = tokens((1, 40, 130), torch.float16, seed=9)
    weights = router_weights(130, 32, 10, seed=10)
    mask, group_tokens, group_counts = router_mask_lists_kernel(x, *weights)
    ref_mask, ref_tokens, ref_counts = lists_op(x, *weights)
    assert_decisions_match(mask, x, *weights, max_ties=1.0)
    assert torch.equal(group_counts, (mask != 0).reshape(-1, 10).sum(0, dtype=torch.int32))
    for group in range(10):
        n = int(group_counts[group])
        assert torch.equal(group_tokens[group, :n].sort().values, (mask[0, :, group] != 0).nonzero().flatten().int())


@interpreter_only
def test_gated_up_with_given_lists_equals_building_them():
    """The gate/up op's CUDA path (interpreter) with the router's lists in any order equals it building its own."""
    gen = torch.Generator().manual_seed(11)
    x, wg, wu = torch.randn(1, 45, 32, generator=gen), torch.randn(64, 32, generator=gen), torch.randn(64, 32,
                                                                                                       generator=gen)
    mask = (torch.rand(1, 45, 4, generator=gen) < 0.5).float()
    from wide_compile.kernel_ops import gated_up_groups_kernel
    from wide_compile.templates.group_plan import group_token_lists_torch

    group_tokens, group_counts = group_token_lists_torch(mask[0] != 0)
    shuffled = group_tokens.clone()
    for group in range(4):  # any order within the actives and within the inactives
        n = int(group_counts[group])
        shuffled[group, :n] = shuffled[group, :n].flip(0)
    want = gated_up_groups_kernel(x, wg, wu, mask, 16)
    got = gated_up_groups_kernel(x, wg, wu, mask, 16, "silu", shuffled, group_counts)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="pass both group_tokens and group_counts"):
        gated_op(x, wg, wu, mask, 16, "silu", group_tokens, None)
    with pytest.raises(RuntimeError, match="do not fit a mask"):
        gated_op(x, wg, wu, mask, 16, "silu", group_tokens[:, :5].contiguous(), group_counts)


def test_prefill_graph_takes_the_ffn_lists_from_the_routers():
    from test_backend_attention import wide_model

    model = wide_model("llama")
    actual, want, graph = compile_prefill(model, 1, MIN_TOKENS + 7, {"wide.router_lists": True})
    assert torch.equal(actual, want)
    layers = model.config.num_hidden_layers
    assert graph.lowered.get("router_lists") == layers, graph.lowered
    assert wide_op_names(graph.graph_module.graph).get("router_mask_lists") == layers
    gated = [n for n in graph.graph_module.graph.nodes if n.op == "call_function" and n.target is gated_op]
    assert len(gated) == layers and all(len(n.args) == 8 for n in gated)
    for node in gated:  # the lists and the mask (through its reshape) come from one router_mask_lists
        sources = {node.args[3].args[0].args[0], node.args[6].args[0], node.args[7].args[0]}
        assert len(sources) == 1 and next(iter(sources)).target is lists_op


@pytest.mark.parametrize("tokens, options", [(MIN_TOKENS - 1, {"wide.router_lists": True}), (MIN_TOKENS + 7, {})])
def test_decode_sized_graphs_and_the_default_keep_the_plain_router(tokens, options):
    from test_backend_attention import wide_model

    model = wide_model("llama")
    actual, want, graph = compile_prefill(model, 1, tokens, options)
    assert torch.equal(actual, want)
    assert "router_lists" not in graph.lowered and "router_mask_lists" not in wide_op_names(graph.graph_module.graph)
    with pytest.raises(ValueError, match="'wide.router_lists' must be a bool"):
        wide_compile.backend.parse_settings(None, {"wide.router_lists": 1})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_prefill_with_router_lists_equals_without():
    """Inductor on CUDA, one 300-token bf16 prefill of the tiny Llama: the FFN lists from the routers' launches (any
    order inside a group's actives) must give the same logits bit for bit as the gate/up ops building their own, and
    the atomic counters must leave the next call's lists right (two calls)."""
    from test_backend_attention import wide_model

    model = wide_model("llama", dtype=torch.bfloat16).cuda()
    ids = torch.randint(3, 120, (1, 300), device="cuda")
    logits, lowered = {}, {}
    for name, options in (("lists", {"wide.router_lists": True}), ("own", {})):
        torch._dynamo.reset()
        wide_compile.backend.reset_compile_report()
        compiled = torch.compile(model, backend="wide", options=options)
        with torch.no_grad():
            logits[name] = [compiled(ids, use_cache=False).logits.float() for _ in range(2)]
        lowered[name] = sum(g.lowered.get("router_lists", 0) for g in wide_compile.compile_report(model).graphs)
    assert lowered == {"lists": model.config.num_hidden_layers, "own": 0}, lowered
    for a, b in zip(logits["lists"], logits["own"]):
        assert torch.equal(a, b), (a - b).abs().max().item()
