"""A compiled model's prefill long enough for the two-pass per-group token lists (CUDA; skipped without a GPU).

From 2048 tokens (and at least 64 per group) ``group_plan`` builds the prefill GEMMs' lists, and from 4096
``attention_compact`` one sequence's attention row order, with the two launches of ``group_lists_two_pass`` instead
of one program per group. The kernel tests check those tables entry for entry; this checks the model's path through
them: a tiny Llama compiled with ``backend="wide"`` on one 4100-token prompt with forced random masks must run the
two-pass build for both and give eager's logits within bf16 tolerance.
"""
from __future__ import annotations

import pytest
import torch
from test_backend_attention import random_masks, wide_model

import wide_compile
from wide_compile.templates import attention_compact, group_plan
from wide_compile.templates.group_lists_two_pass import use_two_pass

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOKENS = 4100


def test_gpu_compiled_long_prefill_builds_two_pass_lists_and_matches_eager(monkeypatch):
    model = wide_model("llama", dtype=torch.bfloat16).cuda()
    groups = {b.kind: b.groups for b in wide_compile.state.get_state(model).blocks}
    assert set(groups) == {"attention", "mlp"} and all(use_two_pass(TOKENS, g) for g in groups.values()), groups
    built = {"lists": [], "row order": []}
    two_pass = group_plan.group_token_lists_two_pass
    for name, module in (("lists", group_plan), ("row order", attention_compact)):
        def counting(mask, *args, _name=name, **kwargs):
            built[_name].append(tuple(mask.shape))
            return two_pass(mask, *args, **kwargs)

        monkeypatch.setattr(module, "group_token_lists_two_pass", counting)
    ids = torch.randint(3, 120, (1, TOKENS), device="cuda")
    masks = {k: v.cuda() for k, v in random_masks(model, 1, TOKENS, seed=7).items()}
    torch._dynamo.reset()
    wide_compile.backend.reset_compile_report()
    compiled = torch.compile(model, backend="wide")
    with torch.no_grad(), wide_compile.forced(model, masks):
        got = compiled(ids, use_cache=False).logits.float()
        assert built["lists"] and built["row order"], f"the compiled prefill did not build both in two passes: {built}"
        assert all(shape[0] == TOKENS for shapes in built.values() for shape in shapes), built
        want = model(ids, use_cache=False).logits.float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)
