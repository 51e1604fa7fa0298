"""Discovery on more families (all-execute exactness only) and a clear refusal of MoE MLPs."""

import copy

import pytest
import torch

import wide_compile
from wide_compile.passes.errors import DiscoveryError
from wide_compile.testing.tiny_models import EXTRA_FAMILIES, tiny_model


@pytest.mark.parametrize("family", sorted(EXTRA_FAMILIES))
def test_all_execute_is_exact(family):
    base = tiny_model(family)
    wide = wide_compile.apply(copy.deepcopy(base), ffn_group_size=16)
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), wide_compile.forced(wide, "execute"):
        out = wide(ids).logits
    with torch.no_grad():
        ref = base(ids).logits
    assert ((out - ref).abs().max() / ref.abs().max()) <= 1e-5
    rows = wide_compile.describe(wide, print_table=False)
    assert {r["block"] for r in rows} == {"attention", "mlp"} and len(rows) == 4


def test_mixture_of_experts_mlp_is_refused_naming_the_layer():
    model = tiny_model("mixtral")
    with pytest.raises(DiscoveryError, match=r"layer model\.layers\.0: projections \['model\.layers\.0\.mlp\.gate'\]"):
        wide_compile.apply(model, ffn_group_size=16)
    assert not wide_compile.is_applied(model)
