"""``generate()`` on a static KV cache through ``torch.compile(model, backend="wide")``: equal to eager, no
recompilation per decode step; on a GPU the same with CUDA graphs (``mode="reduce-overhead"``).

Two ways to compile for generation are covered:
- the whole model (``model.compile(...)``): prefill and decode both run compiled. The cache must be created and
  initialised *before* the compiled call (``StaticCache`` + ``early_initialization``, passed to ``generate``), so that
  its K/V tensors are ordinary static-address inputs; a cache that initialises lazily inside the compiled prefill
  would allocate its K/V inside the graph (CUDA-graph-owned memory). ``disable_compile=True`` keeps ``generate``
  from wrapping the already compiled model a second time (it auto-compiles on CUDA with a static cache).
- HF's own path: ``generate(cache_implementation="static", compile_config=CompileConfig(backend="wide", ...))``
  compiles the decode step only (prefill stays eager and initialises the cache).

CPU tests use the backend's ``"wide.inner": "aot_eager"`` (AOTAutograd functionalisation of the in-place cache
updates, no Inductor codegen), so they take seconds. Recompiles are read from ``wide_compile.compile_report`` (Dynamo
compile ids ``frame/n``, n > 0 is a recompile) and, for the dense control, from a counting backend.
"""

from __future__ import annotations

import copy
import functools
import inspect

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from transformers import CompileConfig, LlamaForCausalLM, StaticCache

import wide_compile
from wide_compile.passes.torch_patterns import example_value
from wide_compile.testing.tiny_models import tiny_config

AOT_EAGER = {"wide.inner": "aot_eager"}
PROMPT, NEW_TOKENS = 6, 6
LAYERS = 2


# ----------------------------------------------------------------------------------------------- helpers
def tiny_llama(wide: bool, dtype: torch.dtype = torch.float32, seed: int = 0) -> LlamaForCausalLM:
    """2-layer Llama (hidden 64, 4 q / 2 kv heads, intermediate 128); WIDE: 2 attention and 4 MLP groups per layer."""
    torch.manual_seed(seed)
    config = tiny_config("llama")
    config.num_hidden_layers = LAYERS
    model = LlamaForCausalLM(config).to(dtype).eval()
    return wide_compile.apply(model, sparsity=0.5, ffn_group_size=32, seed=seed) if wide else model


def pattern_masks(block, shape, device="cpu"):
    """Forced token-dependent masks: mixed, with all-active (t % 5 == 0) and all-skipped (t % 7 == 3) tokens.
    Built on ``device`` (on CUDA a CPU-side mask inside the graph would make Inductor skip CUDA graphs)."""
    b, t, g = shape
    bi, ti, gi = (torch.arange(n, device=device).view(v) for n, v in ((b, (b, 1, 1)), (t, (1, t, 1)), (g, (1, 1, g))))
    key = bi * 7 + ti * 3 + gi * 5 + block.layer_index + (block.kind == "mlp")
    return ((key % 3 != 0) | (ti % 5 == 0)) & (ti % 7 != 3)


def cache_argument(model) -> str:
    """transformers 5.24 names the cache argument ``cache``; 5.17 and older ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def static_cache(model, batch: int, max_len: int) -> StaticCache:
    """A StaticCache whose K/V tensors exist before the first (compiled) forward."""
    config = model.config
    cache = StaticCache(config=config, max_cache_len=max_len)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache.early_initialization(batch_size=batch, num_heads=config.num_key_value_heads, head_dim=head_dim,
                               dtype=next(model.parameters()).dtype, device=next(model.parameters()).device)
    return cache


def greedy(model, ids, **extra):
    """Greedy generation on a fresh, early-initialised static cache; returns sequences and per-step logits."""
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
              return_dict_in_generate=True, output_logits=True, disable_compile=True)
    cache = static_cache(model, ids.shape[0], ids.shape[1] + NEW_TOKENS)
    with torch.no_grad():
        return model.generate(ids, **kw, **{cache_argument(model): cache}, **extra)


def assert_greedy_consistent(actual, expected, rtol: float, atol: float, tie: float) -> None:
    """bf16 version of :func:`assert_same_generation`: logits close at every step while the sequences agree; a
    token may differ only where eager's top two logits are within ``tie`` (a bf16 near-tie), after which the
    sequences legitimately diverge and the comparison stops. At least the prefill step must agree."""
    prompt = expected.sequences.shape[1] - NEW_TOKENS
    assert actual.sequences.shape == expected.sequences.shape
    assert torch.equal(actual.sequences[:, :prompt], expected.sequences[:, :prompt])
    for step, (a, e) in enumerate(zip(actual.logits, expected.logits)):
        torch.testing.assert_close(a.float(), e.float(), rtol=rtol, atol=atol, msg=lambda m: f"step {step}: {m}")
        tok_a, tok_e = actual.sequences[:, prompt + step], expected.sequences[:, prompt + step]
        if not torch.equal(tok_a, tok_e):
            rows = (tok_a != tok_e).nonzero().flatten()
            gap = e.float()[rows, tok_e[rows]] - e.float()[rows, tok_a[rows]]
            assert (gap <= tie).all(), f"step {step}: compiled chose a token {gap.tolist()} below eager's choice"
            return


def lowered_every_layer(record) -> bool:
    """The graph's gated MLPs went to ``gated_up_groups`` and at least one more op per layer was lowered (the exact
    set grows as attention lowering is added), with no graph break."""
    lowered = record.lowered
    return (lowered.get("gated_up_groups") == LAYERS and sum(lowered.values()) >= 2 * LAYERS
            and record.graph_break is None)


def reset_compilation():
    torch._dynamo.reset()
    wide_compile.backend.reset_compile_report()


def assert_same_generation(actual, expected, rtol=1e-5, atol=1e-5):
    assert actual.sequences.shape[1] == expected.sequences.shape[1]
    assert torch.equal(actual.sequences, expected.sequences)
    assert len(actual.logits) == len(expected.logits) == NEW_TOKENS
    for step, (a, e) in enumerate(zip(actual.logits, expected.logits)):
        torch.testing.assert_close(a.float(), e.float(), rtol=rtol, atol=atol, msg=lambda m: f"step {step}: {m}")


# ----------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("decisions", ["routers", "forced"])
def test_whole_model_compiled_static_cache_generate_matches_eager_with_one_decode_graph(decisions, one_thread):
    reset_compilation()
    eager = tiny_llama(wide=True)
    if decisions == "forced":
        wide_compile.set_forced(eager, pattern_masks)
    compiled = copy.deepcopy(eager)
    compiled.compile(backend="wide", options=AOT_EAGER)
    ids = torch.randint(3, 120, (2, PROMPT))

    with wide_compile.track_skip_rates(eager) as meter:
        expected = greedy(eager, ids)
    actual = greedy(compiled, ids)
    assert_same_generation(actual, expected)
    # the compiled graphs left the same realized masks (last decode step) as eager: routing really ran inside them
    eager_masks, compiled_masks = wide_compile.realized_masks(eager), wide_compile.realized_masks(compiled)
    assert eager_masks.keys() == compiled_masks.keys() and len(eager_masks) == 4
    for key in eager_masks:
        assert torch.equal(compiled_masks[key].bool(), eager_masks[key].bool()), key
    rates = meter.rates()
    assert all(0.0 < r < 1.0 for r in rates.values()), rates  # token-dependent: some groups skipped, some run

    report = wide_compile.compile_report(compiled)
    print(f"\n[{decisions}] after {NEW_TOKENS - 1} decode steps:\n{report}")
    # prefill [2, 6] compiles once; the first decode step [2, 1] once more (a new shape for the same frame);
    # the remaining decode steps replay it: 2 graphs, 1 recompile, however many tokens are generated
    assert len(report.graphs) == 2 and report.recompiles == 1, str(report)
    assert all(lowered_every_layer(g) for g in report.graphs), str(report)
    # the static cache gives SDPA a boolean mask: the cores run wide::group_attention with it (prefill and decode),
    # on the cache's 2 KV heads (transformers' repeat_kv copy to the 4 query heads is bypassed)
    assert all(g.lowered.get("group_attention") == LAYERS for g in report.graphs), str(report)
    for g in report.graphs:
        cores = [n for n in g.graph_module.graph.nodes if n.target == torch.ops.wide.group_attention.default]
        assert len(cores) == LAYERS and all(example_value(n.args[1]).shape[1] == 2 for n in cores)
    assert sum(report.graph_breaks.values()) == 0 and not report.skipped_frames, str(report)

    greedy(compiled, torch.randint(3, 120, (2, PROMPT)))  # new prompt, new cache object: nothing recompiles
    again = wide_compile.compile_report(compiled)
    assert len(again.graphs) == 2 and again.recompiles == 1, str(again)


def test_dense_control_through_plain_compile_has_the_same_graph_count(one_thread):
    reset_compilation()
    eager = tiny_llama(wide=False)
    compiled = copy.deepcopy(eager)
    counter = CompileCounterWithBackend("aot_eager")
    compiled.compile(backend=counter)
    ids = torch.randint(3, 120, (2, PROMPT))
    assert_same_generation(greedy(compiled, ids), greedy(eager, ids))
    print(f"\n[dense control] graphs compiled: {counter.frame_count}")
    assert counter.frame_count == 2  # prefill + decode, as for the WIDE model
    greedy(compiled, torch.randint(3, 120, (2, PROMPT)))
    assert counter.frame_count == 2


def test_hf_compile_config_path_compiles_only_the_decode_step_once(one_thread):
    reset_compilation()
    eager = tiny_llama(wide=True)
    managed = copy.deepcopy(eager)
    config = CompileConfig(backend="wide", mode=None, options=AOT_EAGER, fullgraph=True)
    config._compile_all_devices = True  # HF compiles only on accelerators unless told (its testing hook)
    ids = torch.randint(3, 120, (2, PROMPT))
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
              return_dict_in_generate=True, output_logits=True, cache_implementation="static")
    with torch.no_grad():
        expected = eager.generate(ids, **kw, disable_compile=True)
        actual = managed.generate(ids, **kw, compile_config=config)
    assert_same_generation(actual, expected)
    report = wide_compile.compile_report(managed)
    print(f"\n[HF compile_config] {report}")
    assert len(report.graphs) == 1 and report.recompiles == 0, str(report)  # decode only; prefill ran eagerly
    assert lowered_every_layer(report.graphs[0]), str(report)


# ----------------------------------------------------------------------------------------------- GPU (CUDA graphs)
def sharpened_gpu_model() -> LlamaForCausalLM:
    """bf16 WIDE tiny Llama on CUDA with forced masks and an LM head scaled up (logit std about 8 instead of 0.16),
    so that most greedy choices are far apart compared with bf16 rounding."""
    model = tiny_llama(wide=True, dtype=torch.bfloat16, seed=3).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
    wide_compile.set_forced(model, functools.partial(pattern_masks, device="cuda"))
    return model


def _cuda_graph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_reduce_overhead_whole_model_static_cache_generate_matches_eager():
    reset_compilation()
    eager = sharpened_gpu_model()
    compiled = copy.deepcopy(eager)
    compiled.compile(backend="wide", mode="reduce-overhead")
    ids = torch.randint(3, 120, (2, 40), device="cuda")
    skips = _cuda_graph_skips()
    expected = greedy(eager, ids)
    for _ in range(3):  # 1: compile + warm-up run, 2: CUDA-graph recording, 3: replay
        assert_greedy_consistent(greedy(compiled, ids), expected, rtol=2e-2, atol=0.25, tie=0.5)
    assert _cuda_graph_skips() == skips, "Inductor skipped CUDA graphs for a graph"
    report = wide_compile.compile_report(compiled)
    assert len(report.graphs) == 2 and report.recompiles == 1, str(report)
    assert all(lowered_every_layer(g) and g.options.get("triton.cudagraphs") for g in report.graphs), str(report)
    # the 40-token prefill graph computes its mask's row extents once for both layers; the decode graph none
    assert sorted(g.lowered.get("attn_mask_extents", 0) for g in report.graphs) == [0, 1], str(report)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_reduce_overhead_hf_compile_config_static_cache_generate_matches_eager():
    reset_compilation()
    eager = sharpened_gpu_model()
    managed = copy.deepcopy(eager)
    config = CompileConfig(backend="wide", mode="reduce-overhead", fullgraph=True)
    ids = torch.randint(3, 120, (2, 40), device="cuda")
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
              return_dict_in_generate=True, output_logits=True, cache_implementation="static")
    skips = _cuda_graph_skips()
    with torch.no_grad():
        expected = eager.generate(ids, **kw, disable_compile=True)
        for _ in range(2):
            assert_greedy_consistent(managed.generate(ids, **kw, compile_config=config), expected,
                                     rtol=2e-2, atol=0.25, tie=0.5)
    assert _cuda_graph_skips() == skips, "Inductor skipped CUDA graphs for a graph"
    report = wide_compile.compile_report(managed)
    assert len(report.graphs) == 1 and report.recompiles == 0, str(report)
