"""pytest plugin: ``pytest --wide-model PATH_OR_ID`` verifies WIDE on the user's own architecture.

Registered through the ``pytest11`` entry point. With ``--wide-model`` the session collects the checks of
:mod:`wide_compile.testing.model_checks` (all-execute equivalence, forced-mask equivalence, generate
consistency, router gradients) against that model, in addition to whatever else was asked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CHECKS_FILE = Path(__file__).with_name("model_checks.py")


def pytest_addoption(parser):
    group = parser.getgroup("wide-compile")
    group.addoption("--wide-model", default=None, help="model (local path, hub id or zoo alias) to verify WIDE on")
    group.addoption("--wide-sparsity", type=float, default=0.5, help="sparsity for the verification")
    group.addoption("--wide-ffn-group-size", type=int, default=None, help="FFN group size (default 128)")
    group.addoption("--wide-attn-group-size", type=int, default=None, help="query heads per attention group")




def pytest_collection_modifyitems(session, config, items):
    if config.getoption("--wide-model") is None or any(Path(str(i.fspath)) == CHECKS_FILE for i in items):
        return
    module = pytest.Module.from_parent(session, path=CHECKS_FILE)
    items.extend(module.collect())


@pytest.fixture(scope="session")
def wide_pair(request):
    """(untouched model, WIDE model) for ``--wide-model``."""
    from wide_compile.testing.checks import prepare

    opt = request.config.getoption
    if opt("--wide-model") is None:
        pytest.skip("no --wide-model given")
    kwargs = {}
    if opt("--wide-ffn-group-size"):
        kwargs["ffn_group_size"] = opt("--wide-ffn-group-size")
    if opt("--wide-attn-group-size"):
        kwargs["attn_group_size"] = opt("--wide-attn-group-size")
    return prepare(opt("--wide-model"), opt("--wide-sparsity"), **kwargs)
