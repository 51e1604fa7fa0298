"""Every Triton template once on ragged shapes, for ``compute-sanitizer`` (issue 4: no out-of-bounds access).

    compute-sanitizer --tool memcheck --error-exitcode 3 python3 benchmarks/sanitize_kernels.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python3 benchmarks/sanitize_kernels.py --quick

Shapes are small and ragged (token counts, N, K, head counts and key lengths that are not multiples of any tile), so
the masked edges of every kernel run; the same case also checks the result against the PyTorch reference (a
sanitizer run that computes garbage would be no check). Paths: the decode GEMVs (split-K; the output-group one also
with two dense linears in the same launch), the prefill GEMMs with
token reordering, the fused gate/up, the input-group GEMM, the router decision (decode split, tensor-core split,
W_in's parts made once),
mask extents, and attention prefill (causal, explicit mask: both passes) and decode (split-KV, explicit mask); the
two-pass per-group token lists and row order of long prompts (from 2048 tokens: the prefill GEMMs at 2100 / 4133
tokens with bool and bf16 masks, the lists with the offsets pass forced, one 4100-token sequence's attention on a
strided mask); and
one sequence's shared row order (``wide::group_rows``): the query GEMM walking it as its lists with the rotary
epilogue, the prefill attention walking it as its row order.
Prints one line per case and exits 1 if a result is wrong (compute-sanitizer's own exit code reports accesses).
"""
from __future__ import annotations

import argparse
import sys

import torch

from wide_compile.templates import (
    gated_up_groups, gated_up_groups_reference, group_attention_decode, group_attention_prefill,
    group_attention_reference, input_group_linear, input_group_linear_reference, output_group_linear,
    output_group_linear_reference,
)
from wide_compile.templates.attention_compact import compact_active_rows, compact_active_rows_reference
from wide_compile.templates.attention_mask_extents import mask_extents, mask_extents_reference
from wide_compile.templates.group_lists_two_pass import group_token_lists_two_pass
from wide_compile.templates.group_plan import _group_token_lists, plan_from_row_order
from wide_compile.templates.group_linear_with_dense import output_group_linear_with_dense
from wide_compile.templates.router_mask import router_mask, split_router_weights
from wide_compile.templates.router_mask_reference import router_logits_reference, router_mask_reference
from wide_compile.templates.rotary_epilogue import rotate_reference
from wide_compile.templates.router_one_token import router_one_token

DT, DEVICE = torch.bfloat16, "cuda"  # --device cpu (TRITON_INTERPRET=1): float16, the interpreter's bf16 is wrong


def _randn(*shape, gen):
    return torch.randn(*shape, generator=gen, device=DEVICE).to(DT)


def _rand(*shape, gen):
    return torch.rand(*shape, generator=gen, device=DEVICE)


def _close(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float = 3e-2) -> bool:
    err = (got.float() - ref.float()).abs().max().item() / max(1e-6, ref.float().abs().max().item())
    ok = bool(torch.isfinite(got.float()).all()) and err <= tol
    print(f"{'ok  ' if ok else 'FAIL'} {name}: relative max error {err:.2e}", flush=True)
    return ok


def linear_cases(gen, tokens_list) -> list[bool]:
    out = []
    n, k, gs = 336, 400, 16  # 21 output / 25 input groups of 16; neither a multiple of the tiles
    w = _randn(n, k, gen=gen) / k**0.5
    wg, wu = _randn(n, k, gen=gen) / k**0.5, _randn(n, k, gen=gen) / k**0.5
    wd = _randn(k, n, gen=gen) / n**0.5
    for m in tokens_list:
        x = _randn(m, k, gen=gen)
        om = _rand(m, n // gs, gen=gen) < 0.5
        out.append(_close(f"output_group_linear M={m}", output_group_linear(x, w, om, gs),
                          output_group_linear_reference(x, w, om, gs)))
        out.append(_close(f"gated_up_groups M={m}", gated_up_groups(x, wg, wu, om, gs),
                          gated_up_groups_reference(x, wg, wu, om, gs)))
        wk, wv = _randn(72, k, gen=gen) / k**0.5, _randn(72, k, gen=gen) / k**0.5  # dense siblings, ragged N
        joined = output_group_linear_with_dense(x, w, om, gs, None, [wk, wv], [None, None])
        out.append(_close(f"output_group_linear_with_dense M={m}", torch.cat(joined, -1), torch.cat(
            [output_group_linear_reference(x, w, om, gs), x.float() @ wk.float().T, x.float() @ wv.float().T], -1)))
        if m > 16:  # cuBLAS with the inactive outputs zeroed in place ("auto" from 129 to 512 tokens), and weight
            # tiles through TMA descriptors (the gate/up default from 512 tokens on the GPU)
            out.append(_close(f"output_group_linear M={m} path=dense", output_group_linear(x, w, om, gs, path="dense"),
                              output_group_linear_reference(x, w, om, gs)))
            tma = {"TMA": True}
            out.append(_close(f"output_group_linear M={m} TMA", output_group_linear(x, w, om, gs, path="gemm",
                                                                                    config=tma),
                              output_group_linear_reference(x, w, om, gs)))
            out.append(_close(f"gated_up_groups M={m} TMA", gated_up_groups(x, wg, wu, om, gs, path="gemm",
                                                                            config=tma),
                              gated_up_groups_reference(x, wg, wu, om, gs)))
        h = _randn(m, n, gen=gen)
        for path in ("auto", "gemm", "gemv", "dense") if 16 < m <= 128 else ("auto", "gemm") if m > 16 else ("auto",):
            out.append(_close(f"input_group_linear M={m} path={path}", input_group_linear(h, wd, om, gs, path=path),
                              input_group_linear_reference(h, wd, om, gs)))
    if DEVICE == "cuda":  # the one-token defaults of large projections (gemv_decode's configs, gemv_rows' kernels)
        rows, cols, big = 2100, 2100, 512  # 8 groups of 512 channels beside ragged rows / K
        x, mask = _randn(1, cols, gen=gen), _rand(1, 8, gen=gen) < 0.5
        w_out, w_in = _randn(8 * big, cols, gen=gen) / cols**0.5, _randn(rows, 8 * big, gen=gen) / (8 * big) ** 0.5
        mma = dict(ROWS=0)
        out.append(_close("output_group_linear M=1, K=2100 (4 splits, 6 stages)",
                          output_group_linear(x, w_out, mask, big, config=mma),
                          output_group_linear_reference(x, w_out, mask, big)))
        out.append(_close("output_group_linear M=1, K=2100 (row kernel)", output_group_linear(x, w_out, mask, big),
                          output_group_linear_reference(x, w_out, mask, big)))
        x5, mask5 = _randn(5, cols, gen=gen), _rand(5, 8, gen=gen) < 0.5  # 2-16 tokens: K in 2, 6 stages
        out.append(_close("output_group_linear M=5, K=2100 (2 splits, 6 stages)",
                          output_group_linear(x5, w_out, mask5, big), output_group_linear_reference(x5, w_out, mask5,
                                                                                                   big)))
        h = _randn(1, 8 * big, gen=gen)
        out.append(_close("input_group_linear M=1, 2100 rows (unsplit, 12 stages)",
                          input_group_linear(h, w_in, mask, big, config=mma),
                          input_group_linear_reference(h, w_in, mask, big)))
        out.append(_close("input_group_linear M=1, 2100 rows (row kernel)", input_group_linear(h, w_in, mask, big),
                          input_group_linear_reference(h, w_in, mask, big)))
        fmask = mask.to(torch.bfloat16)  # the routers' masks: bf16 0 / 1, read by the row kernel as int16 bits
        out.append(_close("input_group_linear M=1, 2100 rows (row kernel, bf16 mask)",
                          input_group_linear(h, w_in, fmask, big), input_group_linear_reference(h, w_in, fmask, big)))
        out += union_bits_cases(gen)
        out += two_pass_list_cases(gen, w, wg, wu, gs)
    return out


def union_bits_cases(gen) -> list[bool]:
    """The input-group GEMV's ``BITS`` default (``gemv_decode._union_bits_applies``: a pre-masked input at 1-16 tokens,
    at most 128 groups of at most 128 channels, at least 2048 rows): 2100 ragged rows over 75 groups of 128 (the union
    spans both of its 64-bit words), at 1, 3 and 16 tokens; one token also with the input not zeroed outside its
    groups (``input_groups_gemv`` treats one token as pre-masked since stop 38). ``ROWS=0``: this 38 MB weight would
    take the row kernel at one token (``gemv_rows.applies``), the 8B down projection (117 MB) takes ``BITS``."""
    out, mma = [], dict(ROWS=0)
    rows, groups, gs = 2100, 75, 128
    w_in = _randn(rows, groups * gs, gen=gen) / (groups * gs) ** 0.5
    for m in (1, 3, 16):
        mask = _rand(m, groups, gen=gen) < 0.5
        h = _randn(m, groups * gs, gen=gen) * mask.repeat_interleave(gs, dim=1)
        out.append(_close(f"input_group_linear M={m}, 2100 rows, 75 groups, pre-masked (BITS)",
                          input_group_linear(h, w_in, mask, gs, x_is_masked=True, config=mma),
                          input_group_linear_reference(h, w_in, mask, gs)))
        if m == 1:
            raw = _randn(m, groups * gs, gen=gen)
            out.append(_close("input_group_linear M=1, 2100 rows, 75 groups, input not masked (BITS)",
                              input_group_linear(raw, w_in, mask, gs, config=mma),
                              input_group_linear_reference(raw, w_in, mask, gs)))
    return out


def two_pass_list_cases(gen, w, wg, wu, gs) -> list[bool]:
    """Prefill GEMMs on long ragged prompts, whose per-group token lists take the two-pass build
    (``group_lists_two_pass``: from 2048 tokens with at least 64 per group), with bool and bf16 0 / 1 masks; and the
    lists with the offsets pass forced."""
    out = []
    for m in (2100, 4133):
        x = _randn(m, w.shape[1], gen=gen)
        om = _rand(m, w.shape[0] // gs, gen=gen) < 0.5
        for name, mask in (("bool", om), ("bf16", om.to(torch.bfloat16))):
            out.append(_close(f"output_group_linear M={m} two-pass lists, {name} mask",
                              output_group_linear(x, w, mask, gs, path="gemm"),
                              output_group_linear_reference(x, w, om, gs)))
            out.append(_close(f"gated_up_groups M={m} two-pass lists, {name} mask",
                              gated_up_groups(x, wg, wu, mask, gs, path="gemm"),
                              gated_up_groups_reference(x, wg, wu, om, gs)))
        lists = group_token_lists_two_pass(om, offsets_pass=True)  # the offsets pass, forced (65 chunks at 4133)
        ok = all(torch.equal(a, b) for a, b in zip(lists, _group_token_lists(om.view(torch.uint8),
                                                                             {"two_pass": False})))
        print(f"{'ok  ' if ok else 'FAIL'} two-pass token lists with the offsets pass M={m}", flush=True)
        out.append(ok)
    return out


def router_cases(gen, tokens_list) -> list[bool]:
    out = []
    h, r, g = 600, 20, 37
    w_in = _randn(r, h, gen=gen).float() / h**0.5
    b_in = _randn(r, gen=gen).float() * 0.1
    w_out = _randn(2 * g, r, gen=gen).float() / r**0.5
    b_out = _randn(2 * g, gen=gen).float() * 0.1
    for m in tokens_list:
        x = _randn(m, h, gen=gen)
        runs = [(f"router_mask M={m} {cfg}", lambda cfg=cfg: router_mask(x, w_in, b_in, w_out, b_out, config=cfg))
                for cfg in ({}, {"W_SPLIT3": True}, {"SPLIT": 3})]
        parts = split_router_weights(w_in, x.dtype)  # W_in's 16-bit parts made once (PRESPLIT)
        runs += [(f"router_mask M={m} presplit {cfg}",
                  lambda cfg=cfg: router_mask(x, w_in, b_in, w_out, b_out, config=cfg, w_parts=parts))
                 for cfg in ({}, {"W_SPLIT3": True})]
        if m == 1:
            runs.append(("router_one_token", lambda: router_one_token(x, w_in, b_in, w_out, b_out, block_h=256)))
        for name, run in runs:
            mask = run()
            logits = router_logits_reference(x, w_in, b_in, w_out, b_out)
            far = (logits[..., 1] - logits[..., 0]).abs() > 1e-3
            ok = bool(((mask == router_mask_reference(x, w_in, b_in, w_out, b_out)) | ~far).all())
            print(f"{'ok  ' if ok else 'FAIL'} {name}", flush=True)
            out.append(ok)
    return out


def attention_cases(gen) -> list[bool]:
    out = []
    b, hq, hkv, d, groups = 2, 8, 2, 64, 4
    for t, s in ((37, 37), (70, 133)):
        q, k, v = _randn(b, hq, t, d, gen=gen), _randn(b, hkv, s, d, gen=gen), _randn(b, hkv, s, d, gen=gen)
        hm = (_rand(b, t, groups, gen=gen) < 0.5).to(DT)
        if t == s:
            out.append(_close(f"prefill causal T={t}", group_attention_prefill(q, k, v, hm, causal=True),
                              group_attention_reference(q, k, v, hm, causal=True)))
        pos = torch.arange(t, device=DEVICE)[:, None] + (s - t)
        amask = (torch.arange(s, device=DEVICE)[None, :] <= pos).expand(b, 1, t, s).clone()
        amask[1, :, t // 2:, 5::7] = False  # holes in later rows of one sequence: both passes run
        out.append(_close(f"prefill explicit mask T={t} S={s}",
                          group_attention_prefill(q, k, v, hm, causal=False, attn_mask=amask),
                          group_attention_reference(q, k, v, hm, causal=False, attn_mask=amask)))
        ext = mask_extents(amask)
        ok = torch.equal(ext, mask_extents_reference(amask))
        print(f"{'ok  ' if ok else 'FAIL'} mask_extents T={t} S={s}", flush=True)
        out.append(ok)
    for t, s in ((1, 300), (3, 1000), (2, 2600)):  # (S=2600: 21 chunks of 128 keys for the reduction kernel)
        q, k, v = _randn(b, hq, t, d, gen=gen), _randn(b, hkv, s, d, gen=gen), _randn(b, hkv, s, d, gen=gen)
        hm = (_rand(b, t, groups, gen=gen) < 0.5).to(DT)
        splits = 3 if s < 2000 else 40
        out.append(_close(f"decode causal T={t} S={s}",
                          group_attention_decode(q, k, v, hm, causal=True, num_splits=splits),
                          group_attention_reference(q, k, v, hm, causal=True)))
        amask = (torch.arange(s, device=DEVICE) < s - 77).expand(b, 1, t, s)  # unfilled static-cache slots
        out.append(_close(f"decode explicit mask T={t} S={s}",
                          group_attention_decode(q, k, v, hm, causal=False, num_splits=4, attn_mask=amask),
                          group_attention_reference(q, k, v, hm, causal=False, attn_mask=amask)))
    # one long sequence: its row order from the two-pass build (the default from TWO_PASS_MIN_TOKENS), on a strided
    # slice of a packed mask; the interpreter's check of this script forces that build on 300 tokens instead (the
    # same kernels; 4100 causal tokens took 104 of its 135 s)
    long_run = DEVICE == "cuda"
    t = 4100 if long_run else 300
    q, k, v = _randn(1, hq, t, d, gen=gen), _randn(1, hkv, t, d, gen=gen), _randn(1, hkv, t, d, gen=gen)
    hm = (_rand(1, t, 2 * groups, gen=gen) < 0.5).to(DT)[..., ::2]
    order, count = compact_active_rows(hm, None if long_run else {"two_pass": True})
    ok = all(torch.equal(a, b) for a, b in zip((order, count), compact_active_rows_reference(hm)))
    print(f"{'ok  ' if ok else 'FAIL'} compact_active_rows T={t}, one sequence (two passes)", flush=True)
    out.append(ok)
    out.append(_close(f"prefill causal T={t}, one sequence (two-pass row order)",
                      group_attention_prefill(q, k, v, hm, causal=True, row_order=None if long_run else (order, count)),
                      group_attention_reference(q, k, v, hm, causal=True)))
    return out


def shared_order_cases(gen) -> list[bool]:
    """One sequence of 300 tokens (the query GEMM's tiles, not its GEMV), 8 query heads of 16 in 2 groups: the row
    order computed once, then the query projection (rotary epilogue, two dense siblings) and the causal prefill
    attention both given it."""
    out = []
    t, k_in, hq, hkv, d = 300, 80, 8, 2, 16
    x = _randn(1, t, k_in, gen=gen)
    w, wk, wv = (_randn(n, k_in, gen=gen) / k_in**0.5 for n in (hq * d, hkv * d, hkv * d))
    hm = (_rand(1, t, hkv, gen=gen) < 0.5).to(DT)
    order, count = compact_active_rows(hm)
    angles = torch.arange(t, device=DEVICE).float()[:, None] / 10000.0 ** (torch.arange(0, d, 2, device=DEVICE) / d)
    angles = torch.cat((angles, angles), -1)[None]
    cos, sin = angles.cos().to(DT), angles.sin().to(DT)
    q, k, v = output_group_linear_with_dense(x, w, hm, hq * d // hkv, None, [wk, wv], [None, None], rotary=(cos, sin),
                                             plan=plan_from_row_order(hm, order, count))
    want = rotate_reference(output_group_linear_reference(x, w, hm, hq * d // hkv).to(DT), cos, sin)
    out.append(_close(f"query GEMM on a shared row order, rotary epilogue T={t}", q, want))
    heads = lambda y, n: y.view(1, t, n, d).transpose(1, 2).contiguous()  # noqa: E731
    q4, k4, v4 = heads(q, hq), heads(k, hkv), heads(v, hkv)
    out.append(_close(f"prefill causal on a shared row order T={t}",
                      group_attention_prefill(q4, k4, v4, hm, causal=True, row_order=(order, count)),
                      group_attention_reference(q4, k4, v4, hm, causal=True)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer token counts (racecheck is slow)")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1 (a check of this "
                        "script, in float16)")
    parser.add_argument("--only", choices=("linear", "router", "attention", "shared"), default=None,
                        help="one family of cases (a shorter sanitizer run after a change to one template)")
    args = parser.parse_args()
    global DT, DEVICE
    DEVICE = args.device
    if DEVICE == "cpu":
        DT = torch.float16
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu with TRITON_INTERPRET=1)")
        return 2
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    tokens_list = (1, 70) if args.quick else (1, 5, 16, 24, 48, 70, 300)
    families = {"linear": lambda: linear_cases(gen, tokens_list), "router": lambda: router_cases(gen, tokens_list),
                "attention": lambda: attention_cases(gen), "shared": lambda: shared_order_cases(gen)}
    results = [ok for name, run in families.items() if args.only in (None, name) for ok in run()]
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    print(f"{sum(results)} of {len(results)} results correct", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
