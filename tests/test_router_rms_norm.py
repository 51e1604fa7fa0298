"""Residual add + RMSNorm + router decision in one op: ``wide::router_rms_norm`` (template, op, graph fusion).

- template (``templates/router_rms_norm.py``) under the Triton interpreter vs the PyTorch reference: fp32 / fp16
  inputs (the interpreter's bf16 is wrong; bf16 runs on the GPU), ragged H, several M (one and several row tiles, a
  ragged last tile), R and G padded, routers pushed to execute / skip everything; ``x`` exact, ``y`` within one
  rounding of the reference, decisions equal except on near-ties;
- the op: CPU reference, fake shapes, no gradient, bad input;
- the fusion (``passes/router_norm_fusion.py``): a compiled bf16 tiny Llama with a prefill-sized prompt fuses every
  block whose residual add feeds its router and norm (logits equal eager); decode-sized graphs, the option off, and
  chains whose intermediates are used elsewhere are left alone;
- GPU (``@pytest.mark.gpu``): Llama-3-8B and SmolLM2 shapes in bf16 against the reference, and inside a CUDA graph.
"""
from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from _interpreter import interpreted_module  # noqa: E402
from test_backend import Capture  # noqa: E402
from test_router_mask import assert_decisions_match, router_weights, tiny_wide_llama, tokens  # noqa: E402

import wide_compile  # noqa: E402
import wide_compile.router_rms_norm_op  # noqa: E402, F401  (registers wide::router_rms_norm)
from wide_compile.passes.lowering import lower_wide_patterns  # noqa: E402
from wide_compile.passes.router_norm_fusion import fuse_router_norms  # noqa: E402
from wide_compile.passes.torch_patterns import wide_op_names  # noqa: E402
from wide_compile.templates.router_rms_norm_reference import (  # noqa: E402
    rms_norm_reference,
    router_rms_norm_reference,
)

fused_op = torch.ops.wide.router_rms_norm.default
EPS = 1e-5


def norm_weight(hidden: int, dtype, seed: int = 3, device="cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (1.0 + 0.2 * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)


def assert_matches_reference(outs, a, b, weight, router) -> None:
    x, y, mask = outs
    x_ref, y_ref, _ = router_rms_norm_reference(a, b, weight, EPS, *router)
    assert torch.equal(x, x_ref)
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    # y: within two roundings of the reference (rsqrt and the sum of squares' order may move the normalised value by
    # one unit in the last place, which the weight's product can turn into two)
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2 ** -6 if a.dtype != torch.float32 else 1e-5,
                               atol=1e-5)
    assert_decisions_match(mask, x_ref, *router)


# ----------------------------------------------------------------------------------------------- template (interpreter)
@pytest.fixture(scope="module")
def rrn():
    """``wide_compile.templates.router_rms_norm`` (and the router helpers it uses) under the interpreter."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("interpreter tests; the GPU tests below run the compiled kernel")
    helpers = interpreted_module("wide_compile.templates.router_mask")
    next(helpers)
    yield from interpreted_module("wide_compile.templates.router_rms_norm")
    next(helpers, None)


SHAPES = [  # (M, H, R, G): one / several / ragged row tiles, ragged H (BLOCK_K = 64 under the interpreter)
    (5, 64, 32, 3),
    (37, 200, 32, 40),
    (16, 96, 7, 112),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "M{}-H{}-R{}-G{}".format(*s))
@pytest.mark.parametrize("bias", ["random", "execute", "skip"])
@pytest.mark.parametrize("router_loop", [False, True])
def test_template_matches_reference(rrn, dtype, shape, bias, router_loop):
    m, hidden, rank, groups = shape
    a, b = tokens((m, hidden), dtype, seed=m), tokens((m, hidden), dtype, seed=m + 1)
    weight, router = norm_weight(hidden, dtype), router_weights(hidden, rank, groups, bias=bias, seed=hidden)
    config = {"ROUTER_LOOP": router_loop, "NORM_K": 128}  # with the router's own loop: a wider norm step
    outs = rrn.router_rms_norm(a, b, weight, EPS, *router, config=config)
    assert_matches_reference(outs, a, b, weight, router)
    if bias != "random":
        assert torch.equal(outs[2], torch.full_like(outs[2], 1.0 if bias == "execute" else 0.0))


def test_template_leading_dims_and_config(rrn):
    """``[B, T, H]`` inputs keep their leading dims; a non-contiguous ``b`` is read as its values; another tile
    shape gives the same results."""
    a = tokens((2, 9, 128), torch.float16, seed=1)
    b = tokens((2, 128, 9), torch.float16, seed=2).transpose(1, 2)
    weight, router = norm_weight(128, torch.float16), router_weights(128, 32, 6, seed=4)
    outs = rrn.router_rms_norm(a, b, weight, EPS, *router)
    assert [t.shape for t in outs] == [(2, 9, 128), (2, 9, 128), (2, 9, 6)]
    assert_matches_reference(outs, a, b, weight, router)
    for config in ({"BLOCK_M": 32, "BLOCK_K": 32}, {"ROUTER_LOOP": True, "NORM_K": 128, "BLOCK_K": 32}):
        other = rrn.router_rms_norm(a, b, weight, EPS, *router, config=config)
        for left, right in zip(outs, other):
            torch.testing.assert_close(left, right, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------- the op
def test_op_on_cpu_equals_the_reference_and_has_no_gradient():
    a, b = tokens((3, 7, 64), torch.bfloat16, seed=1), tokens((3, 7, 64), torch.bfloat16, seed=2)
    weight, router = norm_weight(64, torch.bfloat16), router_weights(64, 32, 4)
    x, y, mask = fused_op(a, b, weight, EPS, *router)
    assert torch.equal(x, a + b)
    assert torch.equal(y, rms_norm_reference(a + b, weight, EPS))
    assert mask.shape == (3, 7, 4) and mask.dtype == torch.float32
    torch.library.opcheck(fused_op, (a, b, weight, EPS, *router), test_utils=("test_schema", "test_faketensor"))
    with pytest.raises(RuntimeError, match="router_rms_norm has no gradient"):
        fused_op(a.clone().requires_grad_(), b, weight, EPS, *router)[1].sum().backward()


def test_bad_input_errors():
    a, b = tokens((4, 64), torch.float16, seed=1), tokens((4, 64), torch.float16, seed=2)
    weight, router = norm_weight(64, torch.float16), router_weights(64, 32, 4)
    cases = [
        ((a, b.float(), weight, EPS), TypeError, "b dtype torch.float32 differs from a dtype torch.float16"),
        ((a, b[:, :32], weight, EPS), ValueError, "a and b must have one shape"),
        ((a, b, weight[:32], EPS), ValueError, "norm_weight must have shape \\(64,\\)"),
        ((a, b, weight, -1.0), ValueError, "eps must be a float >= 0"),
        ((a.long(), b, weight, EPS), TypeError, "a dtype torch.int64 is not supported"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            fused_op(*args, *router)
    with pytest.raises(ValueError, match="w_in is \\(32, 48\\) = \\[R, H\\] but x has H=64"):
        fused_op(a, b, weight, EPS, router_weights(48, 32, 4)[0], *router[1:])


# ----------------------------------------------------------------------------------------------- the fusion
def compile_tiny(model, ids, options=None):
    torch._dynamo.reset()
    wide_compile.backend.reset_compile_report()
    options = {"wide.inner": "eager", **(options or {})}
    with torch.no_grad():
        actual = torch.compile(model, backend="wide", options=options)(ids, use_cache=False).logits
        expected = model(ids, use_cache=False).logits
    (graph,) = wide_compile.compile_report(model).graphs
    return actual, expected, graph


def test_prefill_graph_fuses_each_block_after_a_residual_add():
    """bf16, 2 layers, 520 tokens: 4 routers, the first reads the embeddings (no add before it): 3 fused, 1 kept as
    ``router_mask``; no RMSNorm of a fused block left in the graph (the final norm stays); logits equal eager."""
    model = tiny_wide_llama(torch.bfloat16)
    actual, expected, graph = compile_tiny(model, torch.randint(3, 120, (1, 520)))
    assert torch.equal(actual, expected)
    assert graph.lowered["router_rms_norm"] == 3 and graph.lowered["router_mask"] == 1, graph.lowered
    ops = wide_op_names(graph.graph_module.graph)
    assert ops["router_rms_norm"] == 3 and ops["router_mask"] == 1
    rsqrts = [n for n in graph.graph_module.graph.nodes if n.target in (torch.rsqrt, "rsqrt")]
    assert len(rsqrts) == 2  # the first layer's input norm and the model's final norm


@pytest.mark.parametrize("tokens_, options", [(7, {}), (520, {"wide.fuse_router_norms": False})])
def test_decode_sized_graphs_and_the_option_keep_the_norms(tokens_, options):
    model = tiny_wide_llama(torch.bfloat16)
    actual, expected, graph = compile_tiny(model, torch.randint(3, 120, (1, tokens_)), options)
    assert torch.equal(actual, expected)
    assert "router_rms_norm" not in graph.lowered and graph.lowered["router_mask"] == 4
    with pytest.raises(ValueError, match="'wide.fuse_router_norms' must be a bool"):
        wide_compile.backend.parse_settings(None, {"wide.fuse_router_norms": "yes"})


def _capture(fn, *args):
    torch._dynamo.reset()
    cap = Capture()
    with torch.no_grad():
        torch.compile(fn, backend=cap, fullgraph=True)(*args)
    return cap.graphs[0], cap.inputs[0]


def test_hand_written_patterns():
    """Fused: the Llama form with the weight on either side, or computed before ``x``. Kept: an intermediate with
    another user, a weight computed after ``x`` is first used, Gemma's fp32 weight product, fewer tokens."""
    router = router_weights(64, 32, 4)

    def llama(a, b, w, wi, bi, wo, bo):
        x = a + b
        mask = torch.ops.wide.router_mask(x, wi, bi, wo, bo)
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
        return x, xf.to(x.dtype) * w, mask

    def reused(a, b, w, wi, bi, wo, bo):
        x = a + b
        mask = torch.ops.wide.router_mask(x, wi, bi, wo, bo)
        xf = x.to(torch.float32)
        var = xf.pow(2).mean(-1, keepdim=True)
        return x, w * (xf * torch.rsqrt(var + 1e-5)).to(x.dtype), mask, var

    def computed_weight(a, b, w, wi, bi, wo, bo):  # the weight computed before x: the same products, fused
        scale = 1.0 + w
        x = a + b
        mask = torch.ops.wide.router_mask(x, wi, bi, wo, bo)
        xf = x.to(torch.float32)
        return x, scale * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype), mask

    def late_weight(a, b, w, wi, bi, wo, bo):  # the weight computed after x's first use: no place for the call
        x = a + b
        mask = torch.ops.wide.router_mask(x, wi, bi, wo, bo)
        xf = x.to(torch.float32)
        return x, ((1.0 + w) * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)), mask

    def gemma(a, b, w, wi, bi, wo, bo):  # Gemma's norm: the weight product in fp32, one cast at the end
        x = a + b
        mask = torch.ops.wide.router_mask(x, wi, bi, wo, bo)
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
        return x, (out * (1.0 + w.float())).type_as(x), mask

    a, b = tokens((600, 64), torch.bfloat16, seed=1), tokens((600, 64), torch.bfloat16, seed=2)
    weight = norm_weight(64, torch.bfloat16)
    for fn, fused in ((llama, 1), (reused, 0), (computed_weight, 1), (late_weight, 0), (gemma, 0)):
        gm, inputs = _capture(fn, a, b, weight, *router)
        assert fuse_router_norms(gm.graph) == fused, fn.__name__
        gm.recompile()
        with torch.no_grad():
            for got, want in zip(gm(*inputs), fn(a, b, weight, *router)):
                assert torch.equal(got, want)
    gm, _ = _capture(llama, a[:100], b[:100], weight, *router)
    assert fuse_router_norms(gm.graph) == 0  # 100 tokens: below MIN_TOKENS
    assert lower_wide_patterns(_capture(llama, a, b, weight, *router)[0]).lowered == {"router_rms_norm": 1}


# ----------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("hidden, groups", [(4096, 8), (4096, 112), (576, 3), (576, 12)])
def test_gpu_model_shapes(hidden, groups):
    """bf16 at Llama-3-8B (H=4096) and SmolLM2 (H=576) router shapes, M in {600, 4096, 4100}: against the
    reference, all-execute / all-skip, and replayed in a CUDA graph."""
    from wide_compile.templates.router_rms_norm import router_rms_norm

    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        weight = norm_weight(hidden, torch.bfloat16, device="cuda")
        router = router_weights(hidden, 32, groups, seed=groups, device="cuda")
        for m in (600, 4096, 4100):
            a = tokens((m, hidden), torch.bfloat16, seed=m, device="cuda")
            b = tokens((m, hidden), torch.bfloat16, seed=m + 1, device="cuda")
            assert_matches_reference(router_rms_norm(a, b, weight, EPS, *router), a, b, weight, router)
            for bias in ("execute", "skip"):
                forced = router_weights(hidden, 32, groups, bias=bias, seed=groups, device="cuda")
                mask = router_rms_norm(a, b, weight, EPS, *forced)[2]
                assert torch.equal(mask, torch.full_like(mask, 1.0 if bias == "execute" else 0.0))
        a = tokens((4096, hidden), torch.bfloat16, seed=9, device="cuda")
        b = tokens((4096, hidden), torch.bfloat16, seed=10, device="cuda")
        router_rms_norm(a, b, weight, EPS, *router)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = router_rms_norm(a, b, weight, EPS, *router)
        for seed in (11, 12):
            a.copy_(tokens((4096, hidden), torch.bfloat16, seed=seed, device="cuda"))
            graph.replay()
            assert_matches_reference(static, a, b, weight, router)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
