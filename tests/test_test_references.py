"""Every name the tests take from ``wide_compile`` exists, including in code the CPU suite never runs.

GPU-only tests are skipped on CI's CPU machine, so a wrong name in one (stop 25's review turned
``wide_compile.backend.reset_compile_report()`` into ``resetcompiled_and_eager()`` in a GPU test) stayed hidden until
the suite next ran on a device. This reads every test module's syntax tree and resolves, without running the tests:
``from wide_compile... import name`` statements (also inside functions) and attribute chains such as
``wide_compile.backend.reset_compile_report``.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

TESTS = sorted(Path(__file__).resolve().parent.glob("*.py"))


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for an attribute chain rooted at a plain name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _references(tree: ast.AST) -> set[tuple[str, str]]:
    """(module, name) pairs from ``from wide_compile... import`` and (``wide_compile``, dotted rest) chains."""
    refs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("wide_compile"):
            refs.update((node.module, alias.name) for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            dotted = _dotted(node)
            if dotted and dotted.startswith("wide_compile."):
                refs.add(("wide_compile", dotted.split(".", 1)[1]))
    return refs


def _resolve(module: str, rest: str) -> None:
    """Import ``module`` and walk ``rest``; a submodule not yet imported is imported on the way."""
    obj = importlib.import_module(module)
    path = module
    for part in rest.split("."):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            try:
                obj = importlib.import_module(f"{path}.{part}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{path}.{part}" and exc.name != path:
                    raise  # the submodule exists but imports something missing
                raise AttributeError(f"{path} has no attribute or submodule {part!r}") from None
        path = f"{path}.{part}"


def _unresolved(test_file: Path) -> list[str]:
    tree = ast.parse(test_file.read_text(), filename=str(test_file))
    for parent in ast.walk(tree):  # mark chains' inner links, so that only whole chains are checked
        for child in ast.iter_child_nodes(parent):
            child.parent = parent
    missing = []
    for module, rest in sorted(_references(tree)):
        try:
            _resolve(module, rest)
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("wide_compile"):
                continue  # an optional third-party package this machine lacks
            missing.append(f"{module}: {rest} ({exc})")
        except (AttributeError, ImportError) as exc:
            missing.append(f"{module}: {rest} ({exc})")
    return missing


@pytest.mark.parametrize("test_file", TESTS, ids=[p.name for p in TESTS])
def test_every_wide_compile_name_a_test_uses_exists(test_file):
    missing = _unresolved(test_file)
    assert not missing, missing


def test_the_check_finds_a_wrong_name(tmp_path):
    """The stop-25 slip and a wrong imported name are reported; right names are not."""
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        "import wide_compile\n"
        "def test_gpu():\n"
        "    wide_compile.backend.resetcompiled_and_eager()\n"
        "    wide_compile.backend.reset_compile_report()\n"
        "    from wide_compile.templates import no_such_kernel, output_group_linear\n"
    )
    missing = _unresolved(bad)
    assert len(missing) == 2, missing
    assert any("resetcompiled_and_eager" in m for m in missing) and any("no_such_kernel" in m for m in missing)
