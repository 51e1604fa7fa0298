"""benchmarks/kernels_targets.py: issue 4's targets read from benchmark results (synthetic results, no GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from kernels_targets import attention_targets, linear_targets, misses_summary, render  # noqa: E402


def _linear_row(op, m, ours, dense, bound, union=None, half=None, mask="rand50"):
    return dict(op=op, mask=mask, M=m, ours_us=ours, dense_us=dense, bound_us=bound, union_us=union or dense,
                half_us=half or dense / 2, speedup=dense / ours, frac_bound=bound / ours)


def _attention_row(kind, batch, length, sparsity, ours_ms, sdpa_ms, roofline_ms, sdpa_tbps=3.0):
    return dict(kind=kind, batch=batch, T=length if kind == "prefill" else 1, S=length, sparsity=sparsity,
                ms=ours_ms, sdpa_ms=sdpa_ms, roofline_ms=roofline_ms, speedup=sdpa_ms / ours_ms, sdpa_TBps=sdpa_tbps)


LINEAR = {"meta": {"command": "python3 benchmarks/kernels_linear.py --out X", "date": "today"}, "rows": [
    _linear_row("gate_up", 1, 30.0, 57.0, 27.0, union=31.0),           # 1.90x: met; union cuBLAS 1.84x
    _linear_row("down", 8, 34.0, 32.6, 27.6),                           # 81% of the bound
    _linear_row("q_proj", 4096, 125.0, 176.0, 100.0, half=99.0),       # 1.41x; half-width cuBLAS 1.78x
    _linear_row("o_proj", 1024, 60.0, 45.0, 25.0),                      # no target between 256 and 4096 tokens
    _linear_row("gate_up", 1, 20.0, 57.0, 17.0, mask="rand70"),         # not a target mask
    _linear_row("ffn", 1, 51.0, 96.0, 42.0),                            # not a target op
]}
ATTENTION = {"command": "python benchmarks/kernels_attention.py", "date": "today",
             "ceilings": {"read_TBps": 4.4}, "rows": [
                 _attention_row("prefill", 1, 8192, 0.5, 0.6, 1.7, 0.4),
                 _attention_row("prefill", 1, 4096, 0.5, 0.16, 0.5, 0.1),       # below 8k: no target
                 _attention_row("decode", 16, 4096, 0.5, 0.0418, 0.0750, 0.0305),  # 1.79x: not met
                 _attention_row("decode", 4, 4096, 0.5, 0.016, 0.028, 0.008),    # B x S < 64k: "elsewhere"
                 _attention_row("decode", 1, 1024, 0.5, 0.008, 0.011, 0.001),    # worst elsewhere, 1.35x
                 _attention_row("decode", 16, 4096, 0.0, 0.073, 0.075, 0.061),   # 0%: no target
             ]}


def test_linear_targets_pick_the_50_percent_rows_with_their_goal_and_reference():
    rows = linear_targets(LINEAR)
    assert [r["name"] for r in rows] == ["gate_up, 1 token", "down, 8 tokens", "q_proj, 4096 tokens"]
    one, eight, prefill = rows
    assert one["met"] and abs(one["value"] - 1.9) < 1e-9 and not one["baseline_reaches"]
    assert "union cuBLAS 1.84x" in one["reference"] and "byte bound 2.11x" in one["reference"]
    assert not eight["met"] and abs(eight["value"] - 27.6 / 34.0) < 1e-9
    assert eight["reference"] == "union cuBLAS at 85% of the bound" and not eight["baseline_reaches"]
    assert not prefill["met"] and prefill["reference"] == "static half-width cuBLAS 1.78x"


def test_attention_targets_split_decode_by_bandwidth_bound_shapes():
    rows = attention_targets(ATTENTION)
    assert [r["name"] for r in rows] == ["prefill, T = 8192", "decode, B = 16, S = 4096",
                                         "decode elsewhere (worst: B = 1, S = 1024)"]
    prefill, decode, elsewhere = rows
    assert prefill["met"] and prefill["reference"] == "roofline 4.25x"
    assert not decode["met"] and "SDPA reads 3.00 of 4.40 TB/s" in decode["reference"]
    assert elsewhere["met"] and abs(elsewhere["value"] - 0.011 / 0.008) < 1e-9
    assert all(r["baseline_reaches"] is None for r in rows)


def test_render_counts_met_targets_and_names_its_sources():
    text = render(LINEAR, ATTENTION)
    assert "**3 of 6 targets met.**" in text
    assert "`python3 benchmarks/kernels_linear.py --out X`" in text
    assert "| linear | down, 8 tokens | fraction of bound >= 0.9 | 81% | NO | union cuBLAS at 85% of the bound | no |" in text
    assert "| attention | decode, B = 16, S = 4096 | speed-up >= 1.8 | 1.79x | NO |" in text


def test_trained_router_rows_are_targets_only_at_2_to_256_tokens():
    def trained(op, m, ours, bound):
        return dict(_linear_row(op, m, ours, 32.6, bound, mask="trained"), active_frac=0.48, union_frac=0.7)

    linear = {"meta": LINEAR["meta"], "rows": [trained("down", 8, 30.0, 28.0), trained("down", 1, 20.0, 15.0),
                                               trained("down", 4096, 900.0, 400.0)]}
    rows = linear_targets(linear)
    assert [r["name"] for r in rows] == ["down, 8 tokens, trained routers (52% skipped, union 70%)"]
    assert rows[0]["met"] and abs(rows[0]["value"] - 28.0 / 30.0) < 1e-9


def test_values_keep_enough_digits_to_show_a_miss():
    linear = {"meta": LINEAR["meta"], "rows": [_linear_row("gate_up", 64, 62.0, 63.7, 55.5),     # 89.5%
                                               _linear_row("q_proj", 1, 6.93, 13.2, 4.0)]}    # 1.9048x: met
    attention = {"ceilings": {"read_TBps": 4.4}, "rows": [
        _attention_row("decode", 16, 4096, 0.5, 0.04035, 0.07258, 0.030)]}                   # 1.7987x
    text = render(linear, attention)
    assert "| 89.5% | NO |" in text and "| 1.90x | yes |" in text and "| 1.799x | NO |" in text


def test_misses_summary_counts_each_kind_of_miss():
    linear = {"meta": LINEAR["meta"], "rows": [
        _linear_row("down", 8, 34.0, 32.6, 27.6, union=33.0),         # miss; union cuBLAS 84%; ours 3% longer
        _linear_row("o_proj", 64, 14.5, 12.4, 8.0),                   # miss; union cuBLAS 65%; ours 17% longer
        _linear_row("gate_up", 4, 54.0, 56.0, 52.0),                  # 96%: met, not counted
        _linear_row("q_proj", 4096, 125.0, 176.0, 100.0, half=90.0),  # half-width 1.96x meets it
        _linear_row("o_proj", 4096, 230.0, 205.0, 110.0, half=115.0),  # half-width 1.78x does not
    ]}
    text = misses_summary(linear_targets(linear) + attention_targets(ATTENTION))
    assert text.startswith("Of the 5 misses, 2 are linear targets at 1-256 tokens;")
    assert "does not meet 2 of them either, and on 1 of those ours takes at most 5% longer" in text
    assert "2 are prefill linear targets (q_proj at 4096 tokens; o_proj at 4096 tokens)" in text
    assert "it meets 1 of them" in text
    assert text.endswith("1 is attention (decode, B = 16, S = 4096).")


def test_a_read_of_the_union_bytes_says_whether_any_kernel_could_meet_the_target():
    def with_read(row, read):
        return dict(row, read_us=read)

    linear = {"meta": LINEAR["meta"], "rows": [
        with_read(_linear_row("o_proj", 1, 7.4, 13.3, 4.2, union=8.0), 7.2),    # read alone 1.85x: out of reach
        with_read(_linear_row("q_proj", 16, 12.0, 13.3, 8.0), 11.9),            # read alone at 67% of the bound
        with_read(_linear_row("down", 4, 31.5, 31.5, 26.0), 28.0),              # read alone at 93%: reachable
        _linear_row("gate_up", 2, 60.0, 56.0, 41.8),                            # no read timed (older results)
    ]}
    rows = linear_targets(linear)
    assert [r["read_reaches"] for r in rows] == [False, False, True, None]
    assert rows[0]["reference"].endswith("; read alone 1.85x")
    assert rows[1]["reference"] == "union cuBLAS at 60% of the bound; read alone at 67%"
    text = render(linear, ATTENTION)
    assert "| union cuBLAS at 60% of the bound; read alone at 67% | no | no |" in text
    assert "| gate_up, 2 tokens | fraction of bound >= 0.9 | 70% | NO | union cuBLAS at 75% of the bound | no | - |" \
        in text
    summary = misses_summary(rows)
    assert "Of the 3 with a read timed beside them, 2 are out of reach of a kernel that only reads" in summary


def test_decode_rows_carry_the_read_reference_where_it_was_timed():
    """With ``read_ms`` (a kernel that only reads the active pairs' K / V bytes) a decode row says what a read alone
    would give and whether it meets the target; rows of results from before the column keep "-"."""
    timed = dict(ATTENTION, rows=[dict(r, read_ms=r["sdpa_ms"] / 2.1) if r["kind"] == "decode" else r
                                  for r in ATTENTION["rows"]])
    _prefill, decode, elsewhere = attention_targets(timed)
    assert decode["read_reaches"] and decode["reference"].endswith("; read alone 2.10x")
    assert elsewhere["read_reaches"] and elsewhere["reference"] == "read alone 2.10x"
    slow = dict(ATTENTION, rows=[dict(r, read_ms=r["sdpa_ms"] / 1.7) for r in ATTENTION["rows"]])
    assert not attention_targets(slow)[1]["read_reaches"]
    assert all(r["read_reaches"] is None for r in attention_targets(ATTENTION))
