"""The one-token router kernel (``templates/router_one_token.py``) against the fp32 reference: under the Triton
interpreter on CPU (fp32 / fp16 ``x``: the interpreter mis-computes bf16), on a GPU at the Llama-3-8B router shapes.
Outputs are NaN-poisoned before each call; masks random and forced all-execute / all-skip."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from _interpreter import interpreted_module
from test_router_mask import assert_decisions_match, router_weights, tokens

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


@pytest.fixture(scope="module")
def one():
    """The template module with its kernel defined under the interpreter (env restored after)."""
    if torch.cuda.is_available():
        pytest.skip("interpreter tests; the GPU test below runs the compiled kernel")
    yield from interpreted_module("wide_compile.templates.router_one_token")


def _poisoned(lead, groups, device="cpu"):
    return torch.full((*lead, groups), float("nan"), device=device)


@pytest.mark.parametrize("hidden, rank, groups, block_h", [(96, 32, 8, 1024), (300, 20, 40, 64), (1000, 33, 5, 256),
                                                           (64, 7, 3, 16)])
@pytest.mark.parametrize("dtype, lead", [(torch.float32, (1,)), (torch.float16, (1, 1)), (torch.float32, ())])
def test_matches_the_reference(one, hidden, rank, groups, block_h, dtype, lead):
    """Ragged H (several blocks, a partial last one), R and G padded to powers of two, any leading shape of one
    token; the arrival counter is back at zero after each call (the next call is correct too)."""
    for seed in range(3):
        weights = router_weights(hidden, rank, groups, seed=seed)
        x = tokens((*lead, hidden), dtype, seed=seed)
        out = one.router_one_token(x, *weights, block_h=block_h, out=_poisoned(lead, groups))
        assert_decisions_match(out, x, *weights)


@pytest.mark.parametrize("bias, value", [("execute", 1.0), ("skip", 0.0)])
def test_forced_decisions(one, bias, value):
    weights = router_weights(200, 32, 12, bias=bias, seed=4)
    out = one.router_one_token(tokens((1, 200), torch.float32, seed=4), *weights, out=_poisoned((1,), 12))
    assert torch.equal(out, torch.full((1, 12), value))


def test_bad_input_is_refused(one):
    weights = router_weights(64, 8, 4)
    with pytest.raises(ValueError, match="exactly one token"):
        one.router_one_token(tokens((2, 64), torch.float32), *weights)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        one.router_one_token(tokens((1, 64), torch.float32), *weights, out=torch.empty(1, 5))
    with pytest.raises(ValueError, match="block_h must be a power of two"):
        one.router_one_token(tokens((1, 64), torch.float32), *weights, block_h=100)
    with pytest.raises(ValueError, match="w_in is"):
        one.router_one_token(tokens((1, 63), torch.float32), *weights)


def test_half_precision_router_weights_take_the_reference(one):
    weights = [w.half() for w in router_weights(64, 8, 4)]
    x = tokens((1, 64), torch.float16)
    from wide_compile.templates.router_mask_reference import router_mask_reference

    assert torch.equal(one.router_one_token(x, *weights), router_mask_reference(x, *weights))


def test_the_op_runs_one_token_through_this_kernel(one, monkeypatch):
    """``wide::router_mask``'s CUDA implementation (called directly: the interpreter runs it on CPU) takes this
    kernel for one token, and the generic template for more."""
    import wide_compile.router_mask_op

    calls = []
    kernel = one.router_one_token
    monkeypatch.setattr(one, "router_one_token", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    weights = router_weights(80, 32, 5, seed=2)
    for lead, expected_calls in (((1, 1), 1), ((2, 1), 1)):
        x = tokens((*lead, 80), torch.float16)
        assert_decisions_match(wide_compile.router_mask_op.router_mask_kernel(x, *weights), x, *weights)
        assert len(calls) == expected_calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("groups", [8, 112])
def test_gpu_llama3_8b_router_shapes(groups):
    """H=4096, R=32, bf16 token: random and forced decisions, repeated calls (counter reset), under a CUDA graph."""
    from wide_compile.templates.router_one_token import router_one_token

    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must not use TF32
    try:
        for seed in range(4):
            weights = router_weights(4096, 32, groups, seed=seed, device="cuda")
            x = tokens((1, 1, 4096), torch.bfloat16, seed=seed, device="cuda")
            out = router_one_token(x, *weights, out=_poisoned((1, 1), groups, "cuda"))
            assert_decisions_match(out, x, *weights, max_ties=0.05)
        for bias, value in (("execute", 1.0), ("skip", 0.0)):
            forced = router_weights(4096, 32, groups, bias=bias, device="cuda")
            assert torch.equal(router_one_token(x, *forced), torch.full((1, 1, groups), value, device="cuda"))
        static_out = _poisoned((1, 1), groups, "cuda")
        router_one_token(x, *weights, out=static_out)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            router_one_token(x, *weights, out=static_out)
        for seed in range(3):
            x.copy_(tokens((1, 1, 4096), torch.bfloat16, seed=10 + seed, device="cuda"))
            static_out.fill_(float("nan"))
            graph.replay()
            assert_decisions_match(static_out, x, *weights, max_ties=0.05)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
