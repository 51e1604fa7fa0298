"""The query's rotary embedding in its projection: the GEMM epilogue (``templates/rotary_epilogue.py``, interpreter on
CPU), the op's ``cos`` / ``sin`` arguments (``wide::output_group_linear_with_dense``) and the pass that moves HF's
rotation there (``passes/query_rope_epilogue.py``).

- kernel: the output-group GEMM with ``rotary=`` equals the reference rotation of the reference projection (fp32
  within a few units in the last place of the two GEMMs' summation orders, fp16 within one rounding), ragged token
  counts, tables shared or per sequence, all-active / all-inactive / random masks, output poisoned first, and at head
  dims 16 / 32 called directly; other paths (GEMV, a head dim the epilogue cannot take or the GPU tests have not run)
  rotate afterwards;
- errors: tables of the wrong shape, dtype, or a head dim that does not divide the group;
- the op on CPU equals HF's rotation of its query, fakes agree (opcheck);
- the pass: a compiled tiny Llama / Qwen2 prefill (head dim 64, above the GEMV range) moves every query rotation
  (logits equal eager bit for bit, fp32 and bf16); decode-sized graphs, the option off, graphs that need gradients and
  head dims the GPU tests do not cover keep HF's rotation.
"""
from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import wide_compile  # noqa: E402
import wide_compile.dense_siblings_op  # noqa: E402, F401  (registers the op)
from wide_compile.passes.query_rope_epilogue import MIN_TOKENS  # noqa: E402
from wide_compile.passes.torch_patterns import wide_op_names  # noqa: E402
from wide_compile.templates import group_linear as gl  # noqa: E402
from wide_compile.templates.group_linear_reference import output_group_linear_reference  # noqa: E402
from wide_compile.templates.rotary_epilogue import rotate_reference  # noqa: E402

op = torch.ops.wide.output_group_linear_with_dense


def tables(batch: int, tokens: int, head_dim: int, dtype, seed: int = 0):
    """Rotary tables like HF's (``cat(freqs, freqs)``) plus a per-table offset, so per-sequence tables differ."""
    gen = torch.Generator().manual_seed(seed)
    freqs = torch.rand(head_dim // 2, generator=gen)
    angles = torch.arange(tokens).float()[None, :, None] * freqs.repeat(2) + torch.arange(batch).float()[:, None, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def problem(batch, tokens, k_dim, n_dim, group_size, head_dim, dtype, mask_kind="random", table_batch=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, tokens, k_dim, generator=gen).to(dtype)
    w = (torch.randn(n_dim, k_dim, generator=gen) / k_dim ** 0.5).to(dtype)
    b = torch.randn(n_dim, generator=gen).to(dtype)
    groups = n_dim // group_size
    mask = {"random": torch.rand(batch, tokens, groups, generator=gen) < 0.5,
            "all": torch.ones(batch, tokens, groups, dtype=torch.bool),
            "none": torch.zeros(batch, tokens, groups, dtype=torch.bool)}[mask_kind]
    return x, w, b, mask, tables(table_batch, tokens, head_dim, dtype, seed)


def expected(x, w, b, mask, group_size, rotary):
    return rotate_reference(output_group_linear_reference(x, w, mask, group_size, b), *rotary)


# fp32: the interpreter's dot (NumPy) and PyTorch's CPU matmul sum the K products in different orders, so the two
# projections differ by a few units in the last place before any rotation (with NumPy 2.4.6 up to 1.3e-6 on values
# near 1.5); a wrong rotation is off by O(1) (and each test also checks that the rotation changed the output).
FP32 = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("batch, tokens, table_batch", [(1, 37, 1), (2, 40, 1), (2, 33, 2)])
@pytest.mark.parametrize("mask_kind", ["random", "all", "none"])
def test_gemm_epilogue_equals_the_reference_rotation(dtype, batch, tokens, table_batch, mask_kind):
    x, w, b, mask, rotary = problem(batch, tokens, 64, 256, 128, 64, dtype, mask_kind, table_batch)
    out = torch.full((batch, tokens, 256), float("nan"), dtype=dtype)
    y = gl.output_group_linear(x, w, mask, 128, b, path="gemm", rotary=rotary, out=out)
    want = expected(x, w, b, mask, 128, rotary)
    assert y.data_ptr() == out.data_ptr() and not torch.isnan(y).any()
    assert torch.equal(y[~mask.repeat_interleave(128, -1)], torch.zeros_like(y[~mask.repeat_interleave(128, -1)]))
    if dtype == torch.float32:
        torch.testing.assert_close(y, want, **FP32)
    else:  # the kernel rounds once, the reference after each fp16 op
        torch.testing.assert_close(y, want, rtol=2e-3, atol=4e-3)
    unrotated = output_group_linear_reference(x, w, mask, 128, b)
    if mask_kind != "none":
        assert not torch.allclose(y.float(), unrotated.float(), atol=1e-2)  # the rotation did something


@pytest.mark.parametrize("path, head_dim, group_size, config", [
    ("gemv", 16, 32, None),     # decode path: rotated after the GEMV
    ("gemm", 12, 24, None),     # not a power of two: rotated after the GEMM
    ("gemm", 32, 64, None),     # a head dim the GPU tests have not run: rotated after the GEMM
    ("gemm", 64, 128, {"BLOCK_M": 16, "TAIL_SPLIT": 2}),  # 16-row tiles, split tails
    ("gemm", 64, 192, {"BLOCK_N": 128}),  # SmolLM2's groups: 3 heads in 2 tiles, the second one half valid
])
def test_other_paths_rotate_the_same(path, head_dim, group_size, config):
    x, w, b, mask, rotary = problem(1, 45, 48, 2 * group_size, group_size, head_dim, torch.float32, seed=3)
    y = gl.output_group_linear(x, w, mask, group_size, b, path=path, rotary=rotary, config=config)
    torch.testing.assert_close(y, expected(x, w, b, mask, group_size, rotary), **FP32)


@pytest.mark.parametrize("head_dim, group_size, block_n", [(16, 32, 32), (32, 64, 32), (16, 48, 32)])
def test_epilogue_of_other_head_dims_in_the_gemm(head_dim, group_size, block_n):
    """The GEMM's epilogue itself at small head dims, called directly: equal to the reference rotation under the
    interpreter."""
    from wide_compile.templates.gemm_output_groups import output_groups_gemm
    from wide_compile.templates.group_plan import build_group_plan
    from wide_compile.templates.rotary_epilogue import kernel_tables

    x, w, b, mask, rotary = problem(1, 45, 48, 2 * group_size, group_size, head_dim, torch.float32, seed=4)
    plan = build_group_plan(mask, parts=("output",))
    y = output_groups_gemm(x[0], w, b, plan.group_tokens, plan.group_counts, group_size, config={"BLOCK_N": block_n},
                           rotary=kernel_tables(*rotary, x))
    torch.testing.assert_close(y[None], expected(x, w, b, mask, group_size, rotary), **FP32)


def test_bad_rotary_tables_raise():
    x, w, b, mask, (cos, sin) = problem(2, 20, 32, 64, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="do not fit x"):
        gl.output_group_linear(x, w, mask, 32, b, rotary=(cos[:, :5], sin[:, :5]))
    with pytest.raises(TypeError, match="rotary cos must be torch.float32"):
        gl.output_group_linear(x, w, mask, 32, b, rotary=(cos.half(), sin))
    with pytest.raises(ValueError, match="rotary head_dim 24 must be even and divide"):
        c, s = tables(1, 20, 24, torch.float32)
        gl.output_group_linear(x, w, mask, 32, b, rotary=(c, s))
    with pytest.raises(ValueError, match=r"needs x of shape \[B, T, K\]"):
        gl.output_group_linear(x[0], w, mask[0], 32, b, rotary=(cos, sin))
    from wide_compile.templates.gemm_output_groups import output_groups_gemm
    from wide_compile.templates.group_plan import build_group_plan
    from wide_compile.templates.rotary_epilogue import kernel_tables

    plan = build_group_plan(mask[:1], parts=("output",))
    with pytest.raises(ValueError, match="BLOCK_N"):
        output_groups_gemm(x[0], w, b, plan.group_tokens, plan.group_counts, 32, config={"BLOCK_N": 8},
                           rotary=kernel_tables(cos, sin, x[:1]))


def test_op_rotates_its_query_and_checks_the_tables():
    x, w, b, mask, rotary = problem(1, 9, 48, 64, 32, 16, torch.float32, seed=5)
    wk = torch.randn(16, 48)
    q, k = op(x, mask.float(), w, b, 32, [wk], [None], *rotary)
    q_hf = (F.linear(x, w, b) * mask.float().repeat_interleave(32, -1)).view(1, 9, 4, 16).transpose(1, 2)
    half = 8
    cos, sin = (t.unsqueeze(1) for t in rotary)
    q_embed = q_hf * cos + torch.cat((-q_hf[..., half:], q_hf[..., :half]), dim=-1) * sin
    assert torch.equal(q.view(1, 9, 4, 16).transpose(1, 2), q_embed) and torch.equal(k, F.linear(x, wk))
    torch.library.opcheck(op.default, (x, mask.float(), w, b, 32, [wk], [None], *rotary),
                          test_utils=("test_schema", "test_faketensor"))
    with pytest.raises(ValueError, match="pass both rotary tables"):
        op(x, mask.float(), w, b, 32, [wk], [None], rotary[0])


def test_op_kernel_path_under_the_interpreter():
    """The op's CUDA implementation (templates) on CPU: above the GEMV range the GEMM rotates in its epilogue."""
    from wide_compile.dense_siblings_op import output_group_linear_with_dense_kernel

    x, w, b, mask, rotary = problem(1, MIN_TOKENS + 3, 32, 128, 64, 64, torch.float32, seed=7)
    wk, wv = torch.randn(16, 32), torch.randn(16, 32)
    q, k, v = output_group_linear_with_dense_kernel(x, mask.float(), w, b, 64, [wk, wv], [None, None], *rotary)
    torch.testing.assert_close(q, expected(x, w, b, mask, 64, rotary), rtol=0, atol=1e-5)
    torch.testing.assert_close(k, F.linear(x, wk), rtol=0, atol=1e-5)


def wide_model_head_dim(family: str, head_dim: int = 64, dtype=torch.float32):
    """A tiny ``family`` model with heads of ``head_dim`` (the rotary epilogue runs only at GPU-tested head dims)."""
    from transformers import AutoModelForCausalLM

    from wide_compile.testing.tiny_models import tiny_config

    config = tiny_config(family)
    config.head_dim = head_dim
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    return wide_compile.apply(model, sparsity=0.5, ffn_group_size=32)


def compile_prefill(model, tokens: int, options=None, grad: bool = False):
    torch._dynamo.reset()
    wide_compile.backend.reset_compile_report()
    ids = torch.randint(3, 120, (1, tokens), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="wide", options={"wide.inner": "eager", **(options or {})})
    with torch.set_grad_enabled(grad):
        actual = compiled(ids, use_cache=False).logits
        want = model(ids, use_cache=False).logits
    (graph,) = wide_compile.compile_report(model).graphs
    return actual, want, graph


def negs(graph) -> int:
    return sum(n.op == "call_function" and getattr(n.target, "__name__", "") == "neg"
               for n in graph.graph_module.graph.nodes)


@pytest.mark.parametrize("family, dtype", [("llama", torch.float32), ("llama", torch.bfloat16),
                                           ("qwen2", torch.float32)])
def test_prefill_graph_moves_every_query_rotation(family, dtype):
    model = wide_model_head_dim(family, 64, dtype)
    actual, want, graph = compile_prefill(model, MIN_TOKENS + 11)
    assert torch.equal(actual, want)
    layers = model.config.num_hidden_layers
    assert graph.lowered.get("query_rope_epilogue") == layers, graph.lowered
    rotating = [n for n in graph.graph_module.graph.nodes if n.op == "call_function" and n.target is op.default]
    assert len(rotating) == layers and all(len(n.args) >= 9 and None not in n.args[7:9] for n in rotating)
    assert negs(graph) == layers  # the keys' rotate_half in each layer; the queries' went into the projection


@pytest.mark.parametrize("head_dim, tokens, options, grad", [
    (64, 7, {}, False), (64, MIN_TOKENS + 11, {"wide.fuse_query_rope": False}, False), (64, MIN_TOKENS + 11, {}, True),
    (8, MIN_TOKENS + 11, {}, False)])  # a head dim the GPU tests do not cover: Inductor's RoPE, not the epilogue
def test_decode_option_off_training_and_other_head_dims_keep_hf_rotation(head_dim, tokens, options, grad):
    model = wide_model_head_dim("llama", head_dim)
    if grad:
        for p in model.parameters():
            p.requires_grad_(True)
    actual, want, graph = compile_prefill(model, tokens, options, grad)
    torch.testing.assert_close(actual, want, rtol=0, atol=0)
    assert "query_rope_epilogue" not in graph.lowered, graph.lowered
    assert negs(graph) == 2 * model.config.num_hidden_layers
    with pytest.raises(ValueError, match="'wide.fuse_query_rope' must be a bool"):
        wide_compile.backend.parse_settings(None, {"wide.fuse_query_rope": 1})
