"""The fused router decision: ``wide::router_mask`` (template, op, lowering of router_logits + threshold_gate).

- template (``templates/router_mask.py``) under the Triton interpreter vs the PyTorch reference: fp32 / fp16 / bf16
  ``x``, ragged H / R / G, M in {1, 3, 17, 40}, one program and one-launch split-H, biases that make every group
  execute / skip, outputs poisoned before each run; decisions equal except on near-ties (reference margin < 1e-4);
- the op: opcheck on the CPU, equal to ``threshold_gate(router_logits(...))``, no gradient (clear error);
- the lowering on Dynamo graphs: every router of a tiny WIDE model in eval / no_grad becomes one ``router_mask``
  (logits equal eager exactly), the dtype cast folded; kept, with a reason, where gradients are needed or the logits
  are reused; training (Gumbel noise) is not the pattern;
- bad input -> ValueError / TypeError naming the problem;
- GPU (``@pytest.mark.gpu``): Llama-3-8B router shapes, bf16 x, vs the reference, split determinism, CUDA graphs.
"""
from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from _interpreter import interpreted_module  # noqa: E402

import wide_compile  # noqa: E402
import wide_compile.router_mask_op  # noqa: E402, F401  (registers wide::router_mask)
from wide_compile.passes.lowering import lower_wide_patterns  # noqa: E402
from wide_compile.passes.torch_patterns import example_value, wide_op_names  # noqa: E402
from wide_compile.templates.router_mask_reference import (  # noqa: E402
    router_logits_reference,
    router_mask_reference,
)
from wide_compile.testing.tiny_models import tiny_config  # noqa: E402
from test_backend import capture, compiled_and_eager, fixed_gumbel_noise  # noqa: E402

TIE = 1e-4  # |l1 - l0| below this: the decision may flip with fp32 summation order
router_mask_op = torch.ops.wide.router_mask.default


# ----------------------------------------------------------------------------------------------- helpers
def router_weights(hidden: int, rank: int, groups: int, bias: str = "random", seed: int = 0, device="cpu"):
    """(w_in, b_in, w_out, b_out) in fp32; ``bias`` "execute" / "skip" pushes every group one way."""
    gen = torch.Generator().manual_seed(seed)
    w_in = torch.randn(rank, hidden, generator=gen) / hidden**0.5
    b_in = torch.randn(rank, generator=gen) * 0.1
    w_out = torch.randn(2 * groups, rank, generator=gen) / rank**0.5
    b_out = torch.randn(2 * groups, generator=gen) * 0.1
    if bias != "random":
        sign = 1.0 if bias == "execute" else -1.0
        b_out = b_out + sign * 50.0 * torch.tensor([-1.0, 1.0]).repeat(groups)  # odd rows = execute
    return [t.to(device) for t in (w_in, b_in, w_out, b_out)]


def tokens(shape, dtype, seed: int = 1, device="cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) + 0.1).to(device=device, dtype=dtype)


def assert_decisions_match(mask: torch.Tensor, x, w_in, b_in, w_out, b_out, max_ties: float = 0.02) -> None:
    """0/1, no poison left, equal to the reference except where the reference margin is a near-tie."""
    ref = router_mask_reference(x, w_in, b_in, w_out, b_out)
    logits = router_logits_reference(x, w_in, b_in, w_out, b_out)
    margin = (logits[..., 1] - logits[..., 0]).abs()
    assert mask.shape == ref.shape and mask.dtype == ref.dtype == w_in.dtype
    assert ((mask == 0) | (mask == 1)).all(), "mask has values other than 0 / 1 (unwritten poison?)"
    differ = (mask != ref) & (margin >= TIE)
    assert not differ.any(), f"{int(differ.sum())} decisions differ away from ties, margins {margin[differ][:5]}"
    assert (margin < TIE).float().mean() <= max_ties  # the comparison is not vacuous


# ----------------------------------------------------------------------------------------------- template (interpreter)
@pytest.fixture(scope="module")
def rm():
    """``wide_compile.templates.router_mask`` with its kernel defined under the interpreter (env restored after)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("interpreter tests; the GPU tests below run the compiled kernel")
    yield from interpreted_module("wide_compile.templates.router_mask")


SHAPES = [  # (M, H, R, G): ragged H (not a multiple of BLOCK_K = 64), R padded to 16 / 32 / 64, G over 2 chunks
    (1, 96, 32, 8),
    (3, 200, 20, 40),
    (17, 130, 32, 5),
    (40, 64, 7, 3),
    (1, 300, 33, 70),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "M{}-H{}-R{}-G{}".format(*s))
@pytest.mark.parametrize("split", [1, 3])
def test_template_matches_reference(rm, dtype, shape, split):
    """(bf16 works under the interpreter here: the kernel casts x to fp32 right after the load.)"""
    m, h, r, g = shape
    x = tokens((m, h), dtype, seed=m * h + r)
    weights = router_weights(h, r, g, seed=g)
    for fill in (float("nan"), 7.0):
        out = torch.full((m, g), fill)
        mask = rm.router_mask(x, *weights, config={"SPLIT": split}, out=out)
        assert mask is out
        assert_decisions_match(mask, x, *weights)
    assert 0 < mask.mean() < 1  # random biases: both decisions occur


@pytest.mark.parametrize("bias", ["execute", "skip"])
@pytest.mark.parametrize("m, split", [(1, 2), (3, 1), (17, 2), (40, 64)])  # SPLIT 64 is clamped to H / BLOCK_K
def test_template_all_execute_and_all_skip(rm, bias, m, split):
    x = tokens((m, 150), torch.float16, seed=m)
    weights = router_weights(150, 32, 12, bias=bias, seed=m)
    mask = rm.router_mask(x, *weights, config={"SPLIT": split}, out=torch.full((m, 12), float("nan")))
    assert torch.equal(mask, torch.full_like(mask, 1.0 if bias == "execute" else 0.0))


@pytest.mark.parametrize("m, split", [(1, 2), (17, 1), (40, 3)])
def test_template_split_weights_on_tensor_cores(rm, m, split):
    """``W_SPLIT3`` (W_in split into two fp16 parts by default, or three; 16-bit dots, fp32 accumulate) forced on and
    off for fp16 x: both equal the fp32 reference except on near-ties; it is the automatic choice above ``DECODE_TOKENS`` only."""
    x = tokens((m, 200), torch.float16, seed=m)
    weights = router_weights(200, 20, 40, seed=m)
    for choice in (True, False):
        out = torch.full((m, 40), float("nan"))
        assert_decisions_match(rm.router_mask(x, *weights, config={"SPLIT": split, "W_SPLIT3": choice}, out=out),
                               x, *weights)
    out = torch.full((m, 40), float("nan"))  # three parts of the split (exact products): near-ties only, too
    assert_decisions_match(rm.router_mask(x, *weights, config={"SPLIT": split, "W_SPLIT3": True, "W_PARTS": 3},
                                          out=out), x, *weights)
    with pytest.raises(ValueError, match="W_PARTS must be 2 or 3"):
        rm.router_mask(x, *weights, config={"W_PARTS": 1})
    assert rm._split_weights(x, m, None) == (m > rm.DECODE_TOKENS)
    assert not rm._split_weights(x.float(), 4096, True)  # fp32 x has no exact 16-bit form
    assert not rm._split_weights(x.bfloat16(), 4096, True)  # the interpreter's bf16 dot is wrong


@pytest.mark.parametrize("m, split, block_g", [(3, 1, 16), (40, 2, 16), (40, 1, 64)])
def test_template_epilogue_forms(rm, m, split, block_g):
    """The epilogue's logits as two products or one on the logit difference (``LOGIT_DIFF``), fp32 FMA or 3xTF32,
    with group chunks narrower and wider than G (40 groups): all equal the reference except on near-ties; an unknown
    precision is refused."""
    x = tokens((m, 130), torch.float16, seed=m + 1)
    weights = router_weights(130, 32, 40, seed=m)
    for diff in (False, True):
        for precision in rm.EPILOGUE_PRECISIONS:
            cfg = {"SPLIT": split, "BLOCK_G": block_g, "LOGIT_DIFF": diff, "EPILOGUE_PRECISION": precision}
            out = torch.full((m, 40), float("nan"))
            assert_decisions_match(rm.router_mask(x, *weights, config=cfg, out=out), x, *weights)
    with pytest.raises(ValueError, match="EPILOGUE_PRECISION must be one of"):
        rm.router_mask(x, *weights, config={"EPILOGUE_PRECISION": "tf32"})
    assert rm._block_g(8) == 16 and rm._block_g(40) == 64 and rm._block_g(112) == 64


def test_template_leading_dims_noncontiguous_and_determinism(rm):
    """x[2, 5, H] as a transposed view; the default allocation path; split results are bit-identical across calls."""
    xt = tokens((2, 100, 5), torch.float32, seed=9)
    x = xt.transpose(1, 2)
    assert not x.is_contiguous()
    weights = router_weights(100, 32, 6, seed=3)
    mask = rm.router_mask(x, *weights)
    assert mask.shape == (2, 5, 6)
    assert_decisions_match(mask, x, *weights)
    split = [rm.router_mask(x, *weights, config={"SPLIT": 2, "BLOCK_K": 32}) for _ in range(2)]
    assert torch.equal(split[0], split[1]) and torch.equal(split[0], mask)
    one_token = rm.router_mask(x[0, 0], *weights)  # 1-D x -> mask[G]
    assert one_token.shape == (6,) and torch.equal(one_token, mask[0, 0])
    empty = rm.router_mask(x[:, :0], *weights)
    assert empty.shape == (2, 0, 6)


def test_auto_split_keeps_prefill_programs_long(rm, monkeypatch):
    """The GPU rules: SPLIT = 0 gives about 2 programs per SM; at prefill each keeps >= 16 K steps (H = 576 at 4096
    tokens: no split; H = 4096: 4 splits), at decode a split may be one step (H = 4096, BLOCK_K 128: 32 splits).
    17-1024 tokens (17-128 for H >= 2048): 16-token tiles, split to about one program per SM; from 8192 tokens with
    H >= 2048 K steps of 128."""
    monkeypatch.setattr(rm, "_sm_count", lambda device: 132)
    cpu = torch.device("cpu")
    assert rm._auto_split(64, 576, 64, cpu, min_steps=16) == 1
    assert rm._auto_split(64, 4096, 64, cpu, min_steps=16) == 4
    assert rm._auto_split(1, 4096, 128, cpu) == 32
    monkeypatch.setattr(rm, "interpreting", lambda: False)
    small = rm.router_mask_config(32, 4096, 32, 112, cpu)  # 17-1024 tokens: 16-token tiles, ~one program per SM
    assert (small["BLOCK_M"], small["BLOCK_K"], small["SPLIT"]) == (16, 128, 32)
    assert rm.router_mask_config(1024, 576, 32, 12, cpu)["SPLIT"] == 2
    assert rm.router_mask_config(128, 4096, 32, 112, cpu)["BLOCK_M"] == 16
    assert rm.router_mask_config(1024, 4096, 32, 112, cpu)["BLOCK_M"] == 64  # wide H: the previous default
    assert rm.router_mask_config(4096, 4096, 32, 112, cpu)["BLOCK_M"] == 64
    # K steps of 128 from LARGE_TOKENS tokens with wide H only (H = 4096 at 4096 tokens and H = 576 keep 64)
    assert [rm.router_mask_config(m, 4096, 32, 112, cpu)["BLOCK_K"] for m in (4096, 8192, 16384)] == [64, 128, 128]
    assert rm.router_mask_config(16384, 576, 32, 12, cpu)["BLOCK_K"] == 64


def test_template_falls_back_to_the_reference(rm, monkeypatch):
    """CPU without the interpreter, and fp16 / bf16 router weights: the reference runs (the kernel is not called)."""
    monkeypatch.setattr(rm, "_router_mask_kernel", None)  # a launch would raise
    x = tokens((3, 64), torch.bfloat16)
    weights = router_weights(64, 16, 4, seed=5)
    half = [w.to(torch.bfloat16) for w in weights]
    expected = router_mask_reference(x, *half)
    assert expected.dtype == torch.bfloat16
    assert torch.equal(rm.router_mask(x, *half), expected)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    out = torch.full((3, 4), float("nan"))
    assert torch.equal(rm.router_mask(x, *weights, out=out), router_mask_reference(x, *weights))
    assert not out.isnan().any()


def test_registered_cuda_kernel_runs_the_template_on_the_interpreter(rm):
    x = tokens((2, 3, 80), torch.float16)
    weights = router_weights(80, 32, 5, seed=2)
    assert_decisions_match(wide_compile.router_mask_op.router_mask_kernel(x, *weights), x, *weights)


# ----------------------------------------------------------------------------------------------- the op
@pytest.mark.parametrize("x_dtype, lead", [(torch.float32, (4,)), (torch.bfloat16, (2, 3)), (torch.float16, (1,))])
def test_op_equals_router_logits_and_threshold_gate(x_dtype, lead):
    x = tokens((*lead, 48), x_dtype)
    weights = router_weights(48, 16, 6, seed=7)
    tau = torch.tensor(0.7)
    expected = torch.ops.wide.threshold_gate(torch.ops.wide.router_logits(x.float(), *weights), None, tau)
    mask = router_mask_op(x, *weights)
    assert torch.equal(mask, expected) and mask.dtype == torch.float32 and mask.shape == (*lead, 6)
    assert 0 < mask.mean() < 1
    torch.library.opcheck(router_mask_op, (x, *weights))


def test_op_refuses_gradients():
    x = tokens((3, 32), torch.float32)
    w_in, b_in, w_out, b_out = router_weights(32, 16, 4)
    mask = router_mask_op(x, w_in.requires_grad_(), b_in, w_out, b_out)
    with pytest.raises(RuntimeError, match="wide::router_mask has no gradient"):
        mask.sum().backward()


def test_bad_input_errors():
    x = tokens((3, 32), torch.float32)
    w_in, b_in, w_out, b_out = router_weights(32, 16, 4)
    bad = [
        ((x, w_in[0], b_in, w_out, b_out), ValueError, "w_in must be 2-D"),
        ((x, w_in, b_in[None], w_out, b_out), ValueError, "b_in must be 1-D"),
        ((x[:, :31], w_in, b_in, w_out, b_out), ValueError, "x has H=31"),
        ((x, w_in, b_in[:15], w_out, b_out), ValueError, "b_in has 15 entries"),
        ((x, w_in, b_in, w_out[:, :8], b_out), ValueError, "w_out is"),
        ((x, w_in, b_in, w_out[:7], b_out[:7]), ValueError, "2\\*G rows"),
        ((x, w_in, b_in, w_out, b_out[:6]), ValueError, "b_out has 6 entries"),
        ((x[0, 0], w_in, b_in, w_out, b_out), ValueError, "at least 1-D"),
        ((x.to("meta"), w_in, b_in, w_out, b_out), ValueError, "w_in is on cpu but x is on meta"),
        ((x.double(), w_in, b_in, w_out, b_out), TypeError, "x dtype torch.float64"),
        ((x.to(torch.int32), w_in, b_in, w_out, b_out), TypeError, "x dtype torch.int32"),
        ((x, w_in.double(), b_in, w_out, b_out), TypeError, "router weight dtype torch.float64"),
        ((x, w_in, b_in, w_out.half(), b_out), TypeError, "w_out dtype torch.float16 differs"),
        ((x, w_in, None, w_out, b_out), TypeError, "b_in must be a tensor"),
    ]
    from wide_compile.templates.router_mask import router_mask

    for args, error, message in bad:
        for fn in (router_mask, router_mask_reference):
            with pytest.raises(error, match=message):
                fn(*args)
        if all(isinstance(a, torch.Tensor) for a in args) and args[0].device.type == "cpu":
            with pytest.raises(error, match=message):
                router_mask_op(*args)
    with pytest.raises(ValueError, match="out must be a contiguous torch.float32 tensor of shape \\(3, 4\\)"):
        router_mask(x, w_in, b_in, w_out, b_out, out=torch.empty(3, 5))


# ----------------------------------------------------------------------------------------------- the lowering
def tiny_wide_llama(dtype=torch.float32, layers: int = 2):
    torch.manual_seed(0)
    config = tiny_config("llama")
    config.num_hidden_layers = layers
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(config).to(dtype).eval()
    return wide_compile.apply(model, sparsity=0.5, ffn_group_size=32)


def compiled_logits(model, ids, grad: bool = False):
    torch._dynamo.reset()
    wide_compile.backend.reset_compile_report()
    compiled = torch.compile(model, backend="wide", options={"wide.inner": "eager", "wide.fuse_routers": True})
    with torch.set_grad_enabled(grad):
        actual = compiled(ids, use_cache=False).logits
        expected = model(ids, use_cache=False).logits
    return actual, expected, wide_compile.compile_report(model)


def router_mask_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == router_mask_op]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inference_graph_lowers_every_router(dtype):
    """eval + no_grad: 2 routers per layer -> 2 router_mask per layer; no router_logits / threshold_gate left; the
    cast to the routers' fp32 folded into the op (bf16 model: the op reads the bf16 residual)."""
    model = tiny_wide_llama(dtype)
    ids = torch.randint(3, 120, (2, 7))
    actual, expected, report = compiled_logits(model, ids)
    assert torch.equal(actual, expected)
    (graph,) = report.graphs
    assert graph.lowered["router_mask"] == 4, str(report)
    assert not any("router decision" in why for why in graph.generic)
    ops = wide_op_names(graph.graph_module.graph)
    assert ops["router_mask"] == 4 and "router_logits" not in ops and "threshold_gate" not in ops
    for node in router_mask_nodes(graph.graph_module):
        assert example_value(node.args[0]).dtype == dtype  # the cast went into the op
        assert example_value(node).dtype == torch.float32 and not example_value(node).requires_grad
    with wide_compile.track_skip_rates(model) as rates, torch.no_grad():
        model(ids, use_cache=False)
    assert 0 < rates.rates()[(0, "mlp")] < 1  # the routers really decide both ways


@pytest.mark.parametrize("batch, tokens, dtype, fused", [(1, 1, torch.float32, False), (2, 7, torch.float32, True),
                                                        (8, 8, torch.float32, True), (5, 13, torch.float32, False),
                                                        (5, 13, torch.bfloat16, True), (1, 1, torch.bfloat16, False)])
def test_router_fusion_follows_the_measured_token_range(batch, tokens, dtype, fused):
    """Static shapes: routers are fused for 2-64 tokens (faster there on the H200), and above 64 for a bf16 model
    (tensor-core path), kept unfused above 64 in fp32 (silently: the unfused ops are the faster path there); one token
    takes the reduction form; ``wide.fuse_routers=False`` keeps them all; the option must be a bool."""
    model = tiny_wide_llama(dtype)
    ids = torch.randint(3, 120, (batch, tokens))
    for option in (True, False):
        actual, expected, graph = compiled_and_eager(model, ids, {"wide.fuse_routers": option})
        assert torch.equal(actual, expected)
        reduced = option and batch * tokens == 1  # one token: the reduction form (wide.one_token_routers default)
        assert graph.lowered.get("router_mask", 0) == (4 if fused and option else 0)
        assert graph.lowered.get("router_reduction", 0) == (4 if reduced else 0)
        assert not [why for why in graph.generic if "router decision kept" in why]  # a speed choice, not a fallback
        assert wide_op_names(graph.graph_module.graph).get("router_logits", 0) == (0 if (fused or reduced) and option
                                                                                  else 4)
    with pytest.raises(ValueError, match="'wide.fuse_routers' must be a bool"):
        wide_compile.backend.parse_settings(None, {"wide.fuse_routers": 1})


@pytest.mark.parametrize("x_dtype, lead", [(torch.float32, (1,)), (torch.bfloat16, (1, 1)), (torch.float16, (3,))])
def test_reduction_form_equals_the_reference(x_dtype, lead):
    """``router_mask_reduction`` (multiplies and sums, for one token under Inductor): decisions equal the matmul
    reference except on near-ties, eagerly and compiled; it checks its arguments like the reference."""
    from wide_compile.templates.router_mask_reference import router_mask_reduction

    for seed in range(4):
        x = tokens((*lead, 300), x_dtype, seed=seed)
        weights = router_weights(300, 32, 40, seed=seed)
        assert_decisions_match(router_mask_reduction(x, *weights), x, *weights)
    compiled = torch.compile(router_mask_reduction, backend="aot_eager", dynamic=False)
    assert_decisions_match(compiled(x, *weights), x, *weights)
    with pytest.raises(ValueError, match="w_in is"):
        router_mask_reduction(x, weights[0][:, :299], *weights[1:])


@pytest.mark.parametrize("form, expected", [("unfused", {}), ("reduction", {"router_reduction": 4}),
                                            (None, {"router_reduction": 4}), ("kernel", {"router_mask": 4})])
def test_one_token_router_form_option(form, expected):
    """``wide.one_token_routers``: one-token decisions become the reduction form by default (``None``: option not
    given) and on request, ``wide::router_mask`` with ``"kernel"``, stay unfused with ``"unfused"`` (logits equal
    eager); at 2+ tokens the option changes nothing; a bad value is a clear error."""
    model = tiny_wide_llama()
    for batch, tokens_, lowered in ((1, 1, expected), (2, 5, {"router_mask": 4})):
        torch._dynamo.reset()
        wide_compile.backend.reset_compile_report()
        options = {"wide.inner": "eager"} | ({} if form is None else {"wide.one_token_routers": form})
        ids = torch.randint(3, 120, (batch, tokens_))
        with torch.no_grad():
            actual = torch.compile(model, backend="wide", options=options)(ids, use_cache=False).logits
            expected_logits = model(ids, use_cache=False).logits
        assert torch.equal(actual, expected_logits)
        (graph,) = wide_compile.compile_report(model).graphs
        assert {k: v for k, v in graph.lowered.items() if k.startswith("router")} == lowered
        assert wide_op_names(graph.graph_module.graph).get("router_logits", 0) == (0 if lowered else 4)
    with pytest.raises(ValueError, match="'wide.one_token_routers' must be one of"):
        wide_compile.backend.parse_settings(None, {"wide.one_token_routers": "fast"})


def test_op_runs_the_kernel_only_in_the_token_range(monkeypatch):
    """On CUDA (here: the registered CUDA implementation called directly) the kernel runs for 2-64 tokens, and above
    64 for a 16-bit x (tensor-core path); otherwise the reference runs."""
    from wide_compile import router_mask_op

    calls = []
    import wide_compile.templates.router_mask as template

    monkeypatch.setattr(template, "router_mask", lambda *a, **k: calls.append(a[0].shape) or router_mask_reference(*a))
    weights = router_weights(64, 16, 4, seed=3)
    for shape, dtype in (((1, 64), torch.float32), ((2, 64), torch.float32), ((4, 16, 64), torch.float32),
                         ((5, 13, 64), torch.float32), ((5, 13, 64), torch.bfloat16), ((1, 64), torch.bfloat16)):
        x = tokens(shape, dtype, seed=4)
        out = router_mask_op.router_mask_kernel(x, *weights)
        assert torch.equal(out, router_mask_reference(x, *weights))
    assert calls == [(2, 64), (4, 16, 64), (5, 13, 64)]


def test_graphs_needing_gradients_keep_the_routers():
    """Under enable_grad with trainable routers the logits need a gradient: kept, with the reason."""
    model = tiny_wide_llama()
    ids = torch.randint(3, 120, (2, 7))
    actual, expected, report = compiled_logits(model, ids, grad=True)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    (graph,) = report.graphs
    assert "router_mask" not in graph.lowered, str(report)
    kept = [why for why in graph.generic if "router decision kept" in why]
    assert len(kept) == 4 and all("need a gradient" in why for why in kept)
    assert wide_op_names(graph.graph_module.graph)["router_logits"] == 4


def test_training_mode_gates_with_noise_are_not_the_pattern(monkeypatch):
    monkeypatch.setattr(wide_compile.ops, "gumbel_noise", fixed_gumbel_noise)
    model = tiny_wide_llama(layers=1).train()
    ids = torch.randint(3, 120, (2, 7))
    actual, expected, report = compiled_logits(model, ids)  # (no_grad: noise alone keeps the routers)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    (graph,) = report.graphs
    assert "router_mask" not in graph.lowered and not any("router decision" in why for why in graph.generic)
    assert wide_op_names(graph.graph_module.graph)["threshold_gate"] == 2


def test_hand_written_router_patterns():
    """Cast folding (``.to(fp32)`` / ``.float()``), a cast with another user (kept, op reads the cast), logits reused
    (kept with a reason), results equal before and after the rewrite."""
    weights = router_weights(64, 16, 4, seed=11)
    tau = torch.tensor(1.0)
    x = tokens((2, 5, 64), torch.bfloat16, seed=12)
    rl, gate = torch.ops.wide.router_logits, torch.ops.wide.threshold_gate

    def cast_to(x, wi, bi, wo, bo, tau):
        return gate(rl(x.to(torch.float32), wi, bi, wo, bo), None, tau)

    def cast_float(x, wi, bi, wo, bo, tau):
        return gate(rl(x.float(), wi, bi, wo, bo), None, tau)

    def cast_reused(x, wi, bi, wo, bo, tau):
        xc = x.to(dtype=torch.float32)
        return gate(rl(xc, wi, bi, wo, bo), None, tau), xc.sum()

    def logits_reused(x, wi, bi, wo, bo, tau):
        logits = rl(x.float(), wi, bi, wo, bo)
        return gate(logits, None, tau), logits

    for fn, folded in ((cast_to, True), (cast_float, True), (cast_reused, False)):
        gm, example = capture(fn, x, *weights, tau, grad=False)
        before = gm(*example)
        result = lower_wide_patterns(gm, fuse_routers=True)
        assert result.lowered == {"router_mask": 1} and result.generic == [], fn.__name__
        (node,) = router_mask_nodes(gm)
        assert (node.args[0].op == "placeholder") is folded, fn.__name__
        after = gm(*example)
        for a, b in zip(after, before, strict=True):  # (Dynamo graphs return tuples)
            assert torch.equal(a, b)
    gm, example = capture(logits_reused, x, *weights, tau, grad=False)
    result = lower_wide_patterns(gm, fuse_routers=True)
    assert result.lowered == {} and len(result.generic) == 1 and "also used outside the gate" in result.generic[0]


# ----------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("groups", [8, 112])
def test_gpu_llama3_8b_router_shapes(groups):
    """H=4096, R=32, bf16 x: M in {1, 8, 32, 1000, 4096, 16384} (decode split, small and prefill tiles), the op,
    W_in's parts made once (``w_parts``, with their own tiles), all-execute / all-skip, bit-identical repeated calls
    (fixed-order split sum), and replay in a CUDA graph."""
    from wide_compile.templates.router_mask import DECODE_TOKENS, router_mask, split_router_weights

    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must not use TF32
    try:
        weights = router_weights(4096, 32, groups, seed=groups, device="cuda")
        for m in (1, 8, 32, 1000, 4096, 16384):
            x = tokens((m, 4096), torch.bfloat16, seed=m, device="cuda")
            out = torch.full((m, groups), float("nan"), device="cuda")
            mask = router_mask(x, *weights, out=out)
            assert_decisions_match(mask, x, *weights)
            assert torch.equal(router_mask(x, *weights), mask)
            assert torch.equal(router_mask_op(x, *weights), mask)
            for split in (1, 4):
                assert_decisions_match(router_mask(x, *weights, config={"SPLIT": split}), x, *weights)
            for choice in (True, False):  # bf16 split of W_in on tensor cores / fp32 FMA
                assert_decisions_match(router_mask(x, *weights, config={"W_SPLIT3": choice}), x, *weights)
            parts, unsplit = split_router_weights(weights[0], torch.bfloat16), mask.clone()
            presplit = router_mask(x, *weights, w_parts=parts, out=out.fill_(float("nan")))
            assert_decisions_match(presplit, x, *weights)
            assert torch.equal(router_mask_op(x, *weights, w_parts=parts), presplit)
            assert torch.equal(router_mask(x, *weights, w_parts=parts), presplit)  # deterministic
            if m <= DECODE_TOKENS:  # no in-register split there: the parts are not read
                assert torch.equal(presplit, unsplit)
            for diff, precision in ((True, "ieee"), (True, "tf32x3"), (False, "tf32x3")):  # epilogue forms
                cfg = {"LOGIT_DIFF": diff, "EPILOGUE_PRECISION": precision}
                assert_decisions_match(router_mask(x, *weights, config=cfg), x, *weights)
            for bias in ("execute", "skip"):
                forced = router_weights(4096, 32, groups, bias=bias, seed=groups, device="cuda")
                expected = torch.full((m, groups), 1.0 if bias == "execute" else 0.0, device="cuda")
                assert torch.equal(router_mask(x, *forced, out=out.fill_(float("nan"))), expected)
        static_x = tokens((1, 4096), torch.bfloat16, seed=5, device="cuda")
        router_mask(static_x, *weights)  # warm-up (compile) outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_mask = router_mask(static_x, *weights)
        for seed in (6, 7, 8):
            static_x.copy_(tokens((1, 4096), torch.bfloat16, seed=seed, device="cuda"))
            graph.replay()
            assert torch.equal(static_mask, router_mask(static_x, *weights))
            assert_decisions_match(static_mask, static_x, *weights)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32


# ----------------------------------------------------------------------------------------------- W_in split once
@pytest.mark.parametrize("m, split", [(17, 1), (40, 3), (70, 2)])
@pytest.mark.parametrize("bias", ["random", "execute", "skip"])
def test_template_reads_presplit_weight_parts(rm, m, split, bias):
    """``w_parts`` (W_in's two fp16 parts made once) read instead of the in-register split: decisions equal the fp32
    reference except on near-ties, outputs poisoned first; where the kernel would not split (``DECODE_TOKENS`` or
    fewer tokens, ``W_SPLIT3`` off) the parts are checked and ignored: bit-equal to the call without them."""
    x = tokens((m, 200), torch.float16, seed=m)
    weights = router_weights(200, 20, 40, bias=bias, seed=m)
    parts = rm.split_router_weights(weights[0], torch.float16)
    assert parts.shape == (2, 20, 200) and parts.dtype == torch.float16
    assert (parts[0].float() + parts[1].float() - weights[0]).abs().max() <= weights[0].abs().max() * 2.0**-20
    out = torch.full((m, 40), float("nan"))
    mask = rm.router_mask(x, *weights, config={"SPLIT": split}, out=out, w_parts=parts)
    if bias == "random":
        assert_decisions_match(mask, x, *weights)
        assert 0 < mask.mean() < 1
    else:
        assert torch.equal(mask, torch.full_like(mask, 1.0 if bias == "execute" else 0.0))
    unsplit = rm.router_mask(x, *weights, config={"SPLIT": split, "W_SPLIT3": False}, w_parts=parts)
    assert torch.equal(unsplit, rm.router_mask(x, *weights, config={"SPLIT": split, "W_SPLIT3": False}))
    few = x[:rm.DECODE_TOKENS]
    assert torch.equal(rm.router_mask(few, *weights, w_parts=parts), rm.router_mask(few, *weights))


def test_presplit_weight_parts_bad_input(rm):
    x = tokens((40, 96), torch.float16)
    w_in, b_in, w_out, b_out = router_weights(96, 32, 8)
    good = rm.split_router_weights(w_in, torch.float16)
    for bad, why in ((good[:1], "shape"), (good.float(), "dtype"), (good.transpose(1, 2), "shape"),
                     (rm.split_router_weights(w_in, torch.bfloat16), "dtype")):
        with pytest.raises(ValueError, match="w_parts must be \\[2, 32, 96\\] in x's 16-bit dtype"):
            rm.router_mask(x, w_in, b_in, w_out, b_out, w_parts=bad)
        with pytest.raises(ValueError, match="w_parts must be"):
            router_mask_op(x, w_in, b_in, w_out, b_out, w_parts=bad)
    with pytest.raises(ValueError, match="w_parts must be"):  # fp32 x: nothing to split for
        router_mask_op(x.float(), w_in, b_in, w_out, b_out, w_parts=good)
    ref = router_mask_reference(x, w_in, b_in, w_out, b_out)
    assert torch.equal(router_mask_op(x, w_in, b_in, w_out, b_out, w_parts=good), ref)  # CPU op: the reference


def _split_nodes(gm):
    """(By name: the interpreter fixture above re-imports the template module, so function identities differ.)"""
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and getattr(n.target, "__name__", "") == "split_router_weights"]


@pytest.mark.parametrize("tokens_per_row, expected", [(40, 4), (8, 0)])
def test_router_weights_split_once_per_forward(monkeypatch, tokens_per_row, expected):
    """bf16 model, prefill-sized graph: every router_mask reads ``w_parts``, the splits sit together before the first
    router, logits equal eager exactly (the CPU op checks the parts and runs the reference); a graph of 16 tokens (below
    ``MIN_TOKENS``, 32 here) and ``wide.presplit_routers=False`` get none; the option must be a bool."""
    from wide_compile.passes import router_weight_split

    monkeypatch.setattr(router_weight_split, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(router_weight_split, "MIN_TOKENS", 32)
    model = tiny_wide_llama(torch.bfloat16)
    ids = torch.randint(3, 120, (2, tokens_per_row))
    for option in (True, False):
        actual, expected_logits, graph = compiled_and_eager(model, ids, {"wide.presplit_routers": option})
        assert torch.equal(actual, expected_logits)
        gm, want = graph.graph_module, expected if option else 0
        assert graph.lowered.get("router_weight_split", 0) == want, str(graph.lowered)
        routers, splits = router_mask_nodes(gm), _split_nodes(gm)
        assert len(routers) == 4 and len(splits) == want
        assert sum(r.kwargs.get("w_parts") is not None for r in routers) == want
        if want:
            order = {n: i for i, n in enumerate(gm.graph.nodes)}
            positions = sorted(order[s] for s in splits)
            assert positions == list(range(positions[0], positions[0] + want))  # together, after every input
            assert all(order[n] < positions[0] for n in gm.graph.nodes if n.op == "placeholder")
            assert positions[-1] < min(order[r] for r in routers)
            assert {r.kwargs["w_parts"] for r in routers} == set(splits)
    with pytest.raises(ValueError, match="'wide.presplit_routers' must be a bool"):
        wide_compile.backend.parse_settings(None, {"wide.presplit_routers": "yes"})


def test_fp32_routers_inputs_get_no_split(monkeypatch):
    """fp32 model: the kernel multiplies in fp32 (no 16-bit parts), so no split is inserted."""
    from wide_compile.passes import router_weight_split

    monkeypatch.setattr(router_weight_split, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(router_weight_split, "MIN_TOKENS", 32)
    model = tiny_wide_llama(torch.float32)
    ids = torch.randint(3, 120, (2, 40))
    actual, expected, report = compiled_logits(model, ids)
    assert torch.equal(actual, expected)
    assert "router_weight_split" not in report.graphs[0].lowered and not _split_nodes(report.graphs[0].graph_module)
