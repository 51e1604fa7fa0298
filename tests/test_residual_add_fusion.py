"""``passes/residual_add_fusion.py`` and ``wide::masked_input_linear_add_``: a residual connection added in place by
the output / down projection.

- the op: in place, equal to ``residual + masked_input_linear(...)`` on the CPU bit for bit, bad residuals raise
  (the template's ``residual`` on each path: ``tests/test_templates_group_linear.py``);
- the pass on Dynamo graphs of a tiny bf16 Llama (CPU added to ``DEVICES``): every output / down projection of a
  prefill-sized inference graph takes the residual, logits equal eager exactly; decode-sized graphs, graphs that need
  gradients, biased projections and residuals that are graph inputs or read later are left alone; the backend option;
- compiled by Inductor (CPU), the in-place op runs on the residual stream's own buffer (no copy).
GPU: ``tests/test_gpu_core.py`` and the static-cache tests compile the 8B-shaped and tiny models with it on.
"""
from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import wide_compile  # noqa: E402
import wide_compile.kernel_ops  # noqa: E402, F401  (registers the ops)
from wide_compile.kernel_ops import mask_groups  # noqa: E402
from wide_compile.passes import residual_add_fusion  # noqa: E402
from wide_compile.passes.lowering import lower_wide_patterns  # noqa: E402
from wide_compile.passes.torch_patterns import wide_op_names  # noqa: E402
from wide_compile.testing.tiny_models import tiny_config  # noqa: E402
from test_backend import capture, compiled_and_eager  # noqa: E402

fused_op = torch.ops.wide.masked_input_linear_add_.default
linear_op = torch.ops.wide.masked_input_linear.default


def _operands(tokens=40, k=64, n=48, gs=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, tokens, k, generator=gen).to(dtype)
    mask = (torch.rand(2, tokens, k // gs, generator=gen) < 0.5).float()
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    residual = torch.randn(2, tokens, n, generator=gen).to(dtype)
    return residual, x, mask, weight, gs


@pytest.mark.parametrize("x_is_masked", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_op_adds_in_place_equal_to_the_expression(x_is_masked, bias):
    residual, x, mask, weight, gs = _operands()
    if x_is_masked:
        x = mask_groups(x, mask, gs)
    b = torch.randn(weight.shape[0]) if bias else None
    expected = residual + linear_op(x, mask, weight, b, gs, x_is_masked)
    buffer = residual.clone()
    assert fused_op(buffer, x, mask, weight, b, gs, x_is_masked) is None
    assert torch.equal(buffer, expected)


def test_opcheck():
    residual, x, mask, weight, gs = _operands(tokens=5)
    torch.library.opcheck(fused_op, (residual, x, mask, weight, None, gs, False))
    torch.library.opcheck(fused_op, (residual, mask_groups(x, mask, gs), mask, weight, torch.randn(48), gs, True))


def test_op_refuses_gradients():
    residual, x, mask, weight, gs = _operands()
    for needs in (x, mask):
        with pytest.raises(RuntimeError, match="masked_input_linear_add_ has no gradient"):
            fused_op(residual, *(t.detach().requires_grad_(t is needs) for t in (x, mask)), weight, None, gs, False)
    fused_op(residual, x, mask, weight.requires_grad_(), None, gs, False)  # weights requiring grad: inference graphs


def test_op_bad_residual():
    residual, x, mask, weight, gs = _operands()
    for bad in (residual[..., :5], residual.double(), residual[:, :3]):
        with pytest.raises(ValueError, match="residual must be torch.float32 of shape \\(2, 40, 48\\)"):
            fused_op(bad.clone(), x, mask, weight, None, gs, False)


# ----------------------------------------------------------------------------------------------- the pass
def _on_cpu_from(monkeypatch, tokens: int) -> None:
    """Let the pass act on CPU graphs of at least ``tokens`` tokens (the tiny models' prefill sizes)."""
    monkeypatch.setattr(residual_add_fusion, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(residual_add_fusion, "MIN_TOKENS", tokens)


def _tiny_bf16_llama(layers=2):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = tiny_config("llama")
    config.num_hidden_layers = layers
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return wide_compile.apply(model, sparsity=0.5, ffn_group_size=32)


@pytest.mark.parametrize("tokens, fused", [(40, 4), (8, 0)])
def test_prefill_graphs_add_every_residual_in_the_projection(monkeypatch, tokens, fused):
    """2 layers: attention output and down projection per layer -> 4 in-place ops, no plain projection left, logits
    equal eager bit for bit; 16 tokens (2 x 8), below ``MIN_TOKENS`` (32 here): none; ``wide.fuse_residual_adds=False``:
    none."""
    _on_cpu_from(monkeypatch, 32)
    model = _tiny_bf16_llama()
    ids = torch.randint(3, 120, (2, tokens))
    for option in (True, False):
        actual, expected, graph = compiled_and_eager(model, ids, {"wide.fuse_residual_adds": option})
        assert torch.equal(actual, expected)
        want = fused if option else 0
        assert graph.lowered.get("residual_add", 0) == want, graph.lowered
        ops = wide_op_names(graph.graph_module.graph)
        assert ops.get("masked_input_linear_add_", 0) == want and ops.get("masked_input_linear", 0) == 4 - want
    with pytest.raises(ValueError, match="'wide.fuse_residual_adds' must be a bool"):
        wide_compile.backend.parse_settings(None, {"wide.fuse_residual_adds": 1})


def test_not_on_cpu_by_default_nor_with_gradients(monkeypatch):
    model = _tiny_bf16_llama()
    ids = torch.randint(3, 120, (2, 40))
    monkeypatch.setattr(residual_add_fusion, "MIN_TOKENS", 32)
    _, _, graph = compiled_and_eager(model, ids, {})
    assert "residual_add" not in graph.lowered  # DEVICES is CUDA only
    _on_cpu_from(monkeypatch, 32)
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    actual, expected, graph = compiled_and_eager(model.eval(), ids, {}, grad=True)
    assert "residual_add" not in graph.lowered
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_hand_written_graphs(monkeypatch):
    """A residual that is a graph input (an in-place update would change the caller's tensor), one read after the
    projection (directly or through a view taken before it), and a biased projection stay unfused; an intermediate
    residual is fused and the graph still computes the same values."""
    _on_cpu_from(monkeypatch, 32)
    residual, x, mask, weight, gs = _operands()
    bias = torch.randn(weight.shape[0])

    def from_input(r, x, m, w):
        return r + linear_op(x, m, w, None, gs, False)

    def read_later(r, x, m, w):
        s = r * 2.0
        y = s + linear_op(x, m, w, None, gs, False)
        return y, s.sum()

    def view_read_later(r, x, m, w):
        s = r * 2.0
        v = s.view(-1, s.shape[-1])
        y = s + linear_op(x, m, w, None, gs, False)
        return y, v.sum()

    def biased(r, x, m, w):
        s = r * 2.0
        return s + linear_op(x, m, w, bias, gs, False)

    def fusable(r, x, m, w):
        s = r * 2.0
        return (linear_op(x, m, w, None, gs, False) + s) * 3.0

    for fn, want in ((from_input, 0), (read_later, 0), (view_read_later, 0), (biased, 0), (fusable, 1)):
        gm, inputs = capture(fn, residual, x, mask, weight, grad=False)
        expected = gm(*inputs)
        result = lower_wide_patterns(gm)
        assert result.lowered.get("residual_add", 0) == want, (fn.__name__, result.lowered)
        actual = gm(*inputs)
        for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                        expected if isinstance(expected, tuple) else (expected,)):
            assert torch.equal(a, e), fn.__name__


def test_inductor_runs_the_op_on_the_residual_buffer(monkeypatch):
    """Compiled by Inductor (CPU): the functionalized in-place op is reinplaced, so every call mutates one buffer (the
    embedding's output) and no copy of the residual is made; logits close to eager."""
    _on_cpu_from(monkeypatch, 32)
    from torch._inductor.utils import run_and_get_code

    model = _tiny_bf16_llama()
    ids = torch.randint(3, 120, (2, 40))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="wide")
    with torch.no_grad():
        out, codes = run_and_get_code(lambda: compiled(ids, use_cache=False).logits)
        expected = model(ids, use_cache=False).logits
    calls = [line.strip() for code in codes for line in code.splitlines()
             if "torch.ops.wide.masked_input_linear_add_.default(" in line]
    assert len(calls) == 4, calls
    buffers = {c.split("(", 1)[1].split(",", 1)[0] for c in calls}
    assert len(buffers) == 1, calls
    torch.testing.assert_close(out.float(), expected.float(), rtol=0.05, atol=0.05)


# ----------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_projection_adds_the_residual(monkeypatch):
    """bf16 on CUDA: the op (cuBLAS ``addmm_`` at 4096 x 4096, the GEMV at 4 tokens) against ``residual + y`` within
    one bf16 rounding; a tiny Llama's compiled 300-token prefill with the fusion on (4 in-place ops) against off:
    logits within bf16 rounding noise, same top-1 tokens."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    for tokens in (4096, 4):
        x = torch.randn(1, tokens, 4096, device="cuda", generator=gen, dtype=torch.bfloat16)
        mask = (torch.rand(1, tokens, 32, device="cuda", generator=gen) < 0.5).float()
        x = mask_groups(x, mask, 128)
        w = torch.randn(4096, 4096, device="cuda", generator=gen, dtype=torch.bfloat16) / 64
        residual = torch.randn(1, tokens, 4096, device="cuda", generator=gen, dtype=torch.bfloat16)
        expected = residual + linear_op(x, mask, w, None, 128, True)
        buffer = residual.clone()
        fused_op(buffer, x, mask, w, None, 128, True)
        torch.testing.assert_close(buffer, expected, rtol=2**-7, atol=2**-6)
    monkeypatch.setattr(residual_add_fusion, "MIN_TOKENS", 256)
    model = _tiny_bf16_llama().cuda()
    ids = torch.randint(3, 120, (1, 300), device="cuda")
    logits = {}
    for option in (True, False):
        torch._dynamo.reset()
        wide_compile.backend.reset_compile_report()
        with torch.no_grad():
            logits[option] = torch.compile(model, backend="wide", options={"wide.fuse_residual_adds": option})(
                ids, use_cache=False).logits.float()
        graphs = wide_compile.compile_report(model).graphs  # (transformers 5.17 compiles each block on its own here)
        assert sum(g.lowered.get("residual_add", 0) for g in graphs) == (4 if option else 0), graphs
    torch.testing.assert_close(logits[True], logits[False], rtol=0.05, atol=0.05)
    assert (logits[True].argmax(-1) == logits[False].argmax(-1)).float().mean() > 0.98
