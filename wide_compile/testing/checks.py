"""Correctness checks a user runs on their own model before training (also the pytest plugin's tests).

    from wide_compile.testing import verify
    report = verify("path/or/hub-id")      # or an untouched model object
    print(report)                          # one line per check; report.ok is True when all passed
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

import wide_compile


@dataclass
class CheckResult:
    name: str
    passed: bool
    detail: str


@dataclass
class Report:
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.results)

    def __str__(self) -> str:
        return "\n".join(f"[{'PASS' if r.passed else 'FAIL'}] {r.name}: {r.detail}" for r in self.results)


def _ids(model: nn.Module, batch: int = 2, tokens: int = 12, seed: int = 0) -> torch.Tensor:
    vocab = model.get_input_embeddings().num_embeddings
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(min(3, vocab - 1), vocab, (batch, tokens), generator=gen).to(device)


def _random_masks(model: nn.Module, shape: tuple, seed: int = 1) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {b.key: (torch.rand(*shape, b.groups, generator=gen) < 0.5).float()
            for b in wide_compile.state.get_state(model).blocks}


def check_all_execute(base: nn.Module, wide: nn.Module, tol: float = 1e-5) -> CheckResult:
    """Forced all-execute logits equal the untouched model's (max relative error <= tol)."""
    ids = _ids(base)
    with torch.no_grad():
        ref = base(ids).logits.float()
        with wide_compile.forced(wide, "execute"):
            out = wide(ids).logits.float()
    rel = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
    return CheckResult("all-execute equivalence", rel <= tol, f"max rel err {rel:.2e} (tol {tol:.0e})")


def check_forced_masks(wide: nn.Module, tol: float = 1e-5) -> CheckResult:
    """Forced random masks through the wide:: ops equal plain-torch masking hooks on the same projections."""
    ids = _ids(wide, seed=2)
    masks = _random_masks(wide, tuple(ids.shape))
    state = wide_compile.state.get_state(wide)
    handles = []
    for block in state.blocks:
        mask, width = masks[block.key], block.group_width

        def hook(module, args, mask=mask, width=width):
            x = args[0]
            return (x * mask.to(x.device, x.dtype).reshape(*x.shape[:-1], -1).repeat_interleave(width, -1),)

        handles.append(wide.get_submodule(block.target_path).register_forward_pre_hook(hook))
    try:
        with torch.no_grad(), wide_compile.forced(wide, "execute"):
            ref = wide(ids).logits.float()  # our ops multiply by 1, the plain hooks do the masking
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad(), wide_compile.forced(wide, masks):
        out = wide(ids).logits.float()
    rel = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
    return CheckResult("forced-mask equivalence", rel <= tol, f"max rel err {rel:.2e} vs plain-torch masking")


def check_generate(base: nn.Module, wide: nn.Module, new_tokens: int = 8) -> CheckResult:
    """Greedy generate() with forced all-execute gives the untouched model's tokens (KV cache path)."""
    ids = _ids(base, batch=1, tokens=6, seed=3)
    kwargs = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    ref = base.generate(ids, **kwargs)
    with wide_compile.forced(wide, "execute"):
        out = wide.generate(ids, **kwargs)
    same = out.shape == ref.shape and bool(torch.equal(out, ref))
    return CheckResult("generate consistency", same, f"{'same' if same else 'different'} greedy tokens")


def check_router_gradients(wide: nn.Module) -> CheckResult:
    """Stage-1 style backward: every router parameter gets a finite gradient, frozen base weights none."""
    model = copy.deepcopy(wide)
    routers = {id(p) for p in wide_compile.router_parameters(model)}
    for p in model.parameters():
        p.requires_grad_(id(p) in routers)
    model.train()
    wide_compile.set_temperature(model, 5.0)
    ids = _ids(model, seed=4)
    loss = model(ids, labels=ids).loss + 20 * (0.5 - wide_compile.skip_rate_tensors(model)["mean"]).abs()
    loss.backward()
    missing = [n for n, p in model.named_parameters() if id(p) in routers and (p.grad is None or not torch.isfinite(p.grad).all())]
    leaked = [n for n, p in model.named_parameters() if id(p) not in routers and p.grad is not None]
    ok = not missing and not leaked
    return CheckResult("router gradients", ok, f"{len(routers)} router tensors; missing={missing[:2]} leaked={leaked[:2]}")


def _guarded(name: str, fn: Callable) -> Callable:
    """A check that reports an exception as a failure instead of raising it."""
    @functools.wraps(fn)
    def run(*args, **kwargs) -> CheckResult:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the report names it
            return CheckResult(name, False, f"raised {type(exc).__name__}: {exc}")
    return run


check_all_execute = _guarded("all-execute equivalence", check_all_execute)
check_forced_masks = _guarded("forced-mask equivalence", check_forced_masks)
check_generate = _guarded("generate consistency", check_generate)
check_router_gradients = _guarded("router gradients", check_router_gradients)

CHECKS: dict[str, Callable] = {
    "all_execute": lambda base, wide: check_all_execute(base, wide),
    "forced_masks": lambda base, wide: check_forced_masks(wide),
    "generate": lambda base, wide: check_generate(base, wide),
    "router_gradients": lambda base, wide: check_router_gradients(wide),
}


def prepare(model_or_path, sparsity: float = 0.5, **apply_kwargs) -> tuple[nn.Module, nn.Module]:
    """(untouched model, WIDE copy) in fp32 eval mode, from a model object, local path, hub id or zoo alias."""
    if isinstance(model_or_path, nn.Module):
        base = model_or_path
    else:
        from wide_compile.model_zoo import load_model

        base, _ = load_model(str(model_or_path), dtype="fp32", device="cpu")
    base = base.float().eval()
    if wide_compile.is_applied(base):
        raise ValueError("verify() needs the untouched model (before wide_compile.apply)")
    wide = wide_compile.apply(copy.deepcopy(base), sparsity=sparsity, **apply_kwargs)
    return base, wide


def verify(model_or_path, sparsity: float = 0.5, checks: tuple[str, ...] = tuple(CHECKS), **apply_kwargs) -> Report:
    """Run the correctness checks of the WIDE transformation on a model (fp32, CPU-friendly sizes)."""
    base, wide = prepare(model_or_path, sparsity, **apply_kwargs)
    report = Report()
    for name in checks:
        report.results.append(CHECKS[name](base, wide))
    return report
