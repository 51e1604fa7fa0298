"""The wide:: custom ops: reference semantics, fake tensors/opcheck, and autograd formulas."""

import pytest
import torch

from wide_compile import ops


def _rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(5, 12), (2, 3, 12), (1, 1, 12)])
@pytest.mark.parametrize("kind", ["all", "none", "random"])
def test_group_mask_zeroes_exactly_the_inactive_groups(shape, kind):
    x = _rand(*shape)
    mask_shape = (*shape[:-1], 3)
    mask = {"all": torch.ones(mask_shape), "none": torch.zeros(mask_shape),
            "random": (torch.rand(mask_shape, generator=torch.Generator().manual_seed(1)) < 0.5).float()}[kind]
    out = ops.group_mask(x, mask.to(x.dtype), 4)
    expected = x * mask.to(x.dtype).repeat_interleave(4, dim=-1)
    assert torch.equal(out, expected)


def test_router_logits_matches_two_linears_and_has_group_pairs():
    x, w_in, b_in, w_out, b_out = _rand(2, 5, 16), _rand(8, 16, seed=1), _rand(8, seed=2), _rand(6, 8, seed=3), _rand(6, seed=4)
    out = ops.router_logits(x, w_in, b_in, w_out, b_out)
    ref = ((x @ w_in.T + b_in) @ w_out.T + b_out).view(2, 5, 3, 2)
    assert out.shape == (2, 5, 3, 2)
    torch.testing.assert_close(out, ref)


def test_threshold_gate_executes_iff_exec_logit_at_least_skip():
    logits = _rand(4, 7, 5, 2)
    logits[0, 0, 0] = torch.tensor([0.3, 0.3], dtype=logits.dtype)  # tie -> execute
    mask = ops.threshold_gate(logits, None, torch.tensor(1.0))
    assert torch.equal(mask, (logits[..., 1] >= logits[..., 0]).to(logits.dtype))
    assert mask[0, 0, 0] == 1


def test_topk_gate_keeps_exactly_k_largest_margins():
    logits = _rand(3, 4, 8, 2)
    mask = ops.topk_gate(logits, None, torch.tensor(1.0), 3)
    assert torch.equal(mask.sum(-1), torch.full((3, 4), 3.0, dtype=mask.dtype))
    margin = logits[..., 1] - logits[..., 0]
    kept_min = torch.where(mask.bool(), margin, torch.inf).amin(-1)
    dropped_max = torch.where(mask.bool(), -torch.inf, margin).amax(-1)
    assert (kept_min >= dropped_max).all()


def test_gate_straight_through_gradient_is_softmax_gradient():
    logits = _rand(3, 5, 2).requires_grad_()
    noise = _rand(3, 5, 2, seed=9)
    tau = torch.tensor(0.7, dtype=torch.float64)
    mask = ops.threshold_gate(logits, noise, tau)
    weights = _rand(3, 5, seed=5)
    (mask * weights).sum().backward()
    soft = torch.softmax((logits.detach() + noise) / tau, -1)[..., 1]
    ref_logits = logits.detach().clone().requires_grad_()
    soft_ref = torch.softmax((ref_logits + noise) / tau, -1)[..., 1]
    (soft_ref * weights).sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad)
    assert torch.equal(mask, (soft >= 0.5).to(mask.dtype))


def test_group_mask_and_router_gradcheck():
    x = _rand(2, 3, 8).requires_grad_()
    mask = torch.rand(2, 3, 2, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, m: ops.group_mask(a, m, 4), (x, mask))
    w_in, b_in = _rand(4, 8, seed=1).requires_grad_(), _rand(4, seed=2).requires_grad_()
    w_out, b_out = _rand(6, 4, seed=3).requires_grad_(), _rand(6, seed=4).requires_grad_()
    assert torch.autograd.gradcheck(ops.router_logits, (x, w_in, b_in, w_out, b_out))


@pytest.mark.parametrize("op,args", [
    (torch.ops.wide.group_mask.default, lambda: (torch.randn(2, 3, 8, requires_grad=True),
                                                  torch.rand(2, 3, 2, requires_grad=True), 4)),
    (torch.ops.wide.router_logits.default, lambda: (torch.randn(2, 3, 8, requires_grad=True), torch.randn(4, 8),
                                                     torch.randn(4), torch.randn(6, 4), torch.randn(6))),
    (torch.ops.wide.threshold_gate.default, lambda: (torch.randn(2, 3, 2, requires_grad=True),
                                                      torch.randn(2, 3, 2), torch.tensor(1.0))),
    (torch.ops.wide.topk_gate.default, lambda: (torch.randn(2, 3, 2, requires_grad=True),
                                                 None, torch.tensor(1.0), 2)),
])
def test_opcheck(op, args):
    torch.library.opcheck(op, args(), test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_router_logits_ignore_autocast_and_backprop_under_it():
    """Under bf16 autocast (GPU training) the router still computes in its own dtype: same logits, same grads."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, requires_grad=True)
    params = [torch.randn(4, 16), torch.randn(4), torch.randn(6, 4), torch.randn(6)]
    params = [p.requires_grad_() for p in params]
    results = []
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = torch.ops.wide.router_logits(x, *params)
        assert logits.dtype == torch.float32
        grads = torch.autograd.grad((logits * torch.linspace(-1, 1, 6).view(3, 2)).sum(), [x, *params])
        results.append((logits.detach(), grads))
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b)
