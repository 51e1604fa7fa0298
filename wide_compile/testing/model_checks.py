"""The checks ``pytest --wide-model X`` runs (collected by wide_compile.testing.plugin)."""

import pytest

from wide_compile.testing.checks import CHECKS


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_wide_transformation(wide_pair, check):
    base, wide = wide_pair
    result = CHECKS[check](base, wide)
    assert result.passed, f"{result.name}: {result.detail}"
