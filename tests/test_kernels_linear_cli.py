"""benchmarks/kernels_linear.py's command line: one ``--sweep-<name>`` flag per registered grid
(``kernels_linear_sweeps.FLAGS``), each choosing its own grid and result file, ``--ms`` reaching the grids that take
token counts, and ``--sweep`` alone the plain grid (no GPU: the parser and the grid choice only)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.fixture(scope="module")
def cli():
    import kernels_linear
    import kernels_linear_sweeps

    return kernels_linear, kernels_linear_sweeps


def test_every_registered_grid_has_a_flag_and_its_own_result_file(cli):
    linear, sweeps = cli
    parser = linear.build_parser()
    for name, (make, out, _what) in sweeps.FLAGS.items():
        args = vars(parser.parse_args([f"--sweep-{name}", "--no-main"]))
        grid, chosen_out = sweeps.chosen_grid(args, ())
        assert chosen_out == out and out.startswith("kernels_linear_sweep") and out.endswith(".json")
        assert grid == make() and all(len(case) == 4 for case in grid), name
    outs = [out for _make, out, _what in sweeps.FLAGS.values()]
    assert len(set(outs)) == len(outs)  # (--sweep-decode shares kernels_linear_sweep.json with --sweep: its history)


def test_token_counts_reach_the_grids_that_take_them(cli):
    linear, sweeps = cli
    args = vars(linear.build_parser().parse_args(["--sweep-input-bits", "--ms", "2,8"]))
    grid, _out = sweeps.chosen_grid(args, (2, 8))
    assert {case[1] for case in grid} == {2, 8}
    args = vars(linear.build_parser().parse_args(["--sweep-decode", "--ms", "2,8"]))  # takes none: its own grid
    assert sweeps.chosen_grid(args, (2, 8))[0] == sweeps.decode_sweeps()
    args = vars(linear.build_parser().parse_args(["--sweep-tma", "--ms", "4096"]))  # three configs there
    assert {case[1] for case in sweeps.chosen_grid(args, (4096,))[0]} == {4096}


def test_plain_sweep_and_no_sweep(cli):
    linear, sweeps = cli
    assert sweeps.chosen_grid(vars(linear.build_parser().parse_args(["--sweep"])), ()) == (
        None, "kernels_linear_sweep.json")
    assert sweeps.chosen_grid(vars(linear.build_parser().parse_args([])), ()) is None
