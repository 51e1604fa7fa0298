"""Group importance for static width pruning (FLAP / Wanda-sp style), from calibration activations.

For a routed block whose output projection ``W`` (o_proj / down_proj) reads ``x[..., G * gw]`` split into
``G`` groups of ``gw`` channels, the importance of group ``g`` is

    importance[g] = mean over calibration tokens t of ||x_t[g]||_2  *  ||W[:, g]||_F

where ``x_t[g]`` is token ``t``'s input to ``W`` restricted to the group's channels and ``W[:, g]`` the
weight columns that read them (Wanda's |W| * ||X|| with both norms taken over the whole group).
:func:`select_groups` then keeps the ``round((1 - sparsity) * G)`` most important groups of every block.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

__all__ = ["group_activation_norms", "group_importance", "group_weight_norms", "kept_group_count", "select_groups"]

BlockKey = tuple[int, str]  # (layer_index, "attention" | "mlp")


def _weight_in_out(module: nn.Module, width: int, where: str) -> Tensor:
    """The weight of ``module`` as ``[out, in]`` (nn.Linear layout; GPT-2 Conv1D stores ``[in, out]``)."""
    base = getattr(module, "base_layer", module)  # PEFT LoRA wrappers keep the frozen layer here
    weight = getattr(base, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError(f"{where}: expected a 2-D weight on {type(base).__name__}, found none")
    if isinstance(base, nn.Linear) and weight.shape[1] == width:
        return weight
    if type(base).__name__ == "Conv1D" and weight.shape[0] == width:
        return weight.t()
    raise ValueError(f"{where}: weight {tuple(weight.shape)} of {type(base).__name__} has no input dimension "
                     f"of {width} channels (groups x group width)")


def group_weight_norms(module: nn.Module, groups: int, group_width: int, where: str = "projection") -> Tensor:
    """``[groups]``: Frobenius norm of the weight columns each group of input channels feeds."""
    weight = _weight_in_out(module, groups * group_width, where).detach().float()
    return weight.reshape(weight.shape[0], groups, group_width).pow(2).sum(dim=(0, 2)).sqrt()


def group_activation_norms(x: Tensor, groups: int, group_width: int,
                           token_mask: Tensor | None = None) -> tuple[Tensor, int]:
    """``(sum over tokens of ||x_t[g]||_2 per group [groups], number of tokens)`` for ``x[..., groups*gw]``."""
    if x.shape[-1] != groups * group_width:
        raise ValueError(f"activation has {x.shape[-1]} channels, expected {groups} x {group_width}")
    norms = x.detach().float().reshape(-1, groups, group_width).norm(dim=-1)  # [tokens, groups]
    if token_mask is not None:
        keep = token_mask.reshape(-1).to(norms.device).bool()
        if keep.numel() != norms.shape[0]:
            raise ValueError(f"token mask has {keep.numel()} entries for {norms.shape[0]} tokens")
        norms = norms[keep]
    return norms.sum(dim=0), norms.shape[0]


class _ActivationCollector:
    """Forward pre-hook accumulating group activation norms at one output projection."""

    def __init__(self, groups: int, group_width: int):
        self.groups, self.group_width = groups, group_width
        self.total: Tensor | None = None
        self.tokens = 0
        self.token_mask: Tensor | None = None

    def __call__(self, module, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states", kwargs.get("input"))
        sums, count = group_activation_norms(x, self.groups, self.group_width, self.token_mask)
        self.total = sums if self.total is None else self.total + sums
        self.tokens += count
        return None


def _batch_inputs(batch) -> tuple[dict, Tensor | None]:
    if torch.is_tensor(batch):
        if batch.dim() != 2 or batch.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"a calibration batch must be input ids [batch, seq] (int), got {tuple(batch.shape)} "
                             f"{batch.dtype}")
        return {"input_ids": batch}, None
    if isinstance(batch, Mapping) and "input_ids" in batch:
        return dict(batch), batch.get("attention_mask")
    raise ValueError("a calibration batch must be an input-id tensor [batch, seq] or a dict with 'input_ids'")


@torch.no_grad()
def group_importance(model: nn.Module, blocks: Iterable, calibration_batches: Iterable) -> dict[BlockKey, Tensor]:
    """``{(layer, kind): importance[groups]}`` of every routed block (see the module docstring).

    Args:
        model: the model whose blocks' projections are measured (it runs on every calibration batch;
            a WIDE model must be forced to ``"execute"`` by the caller so inputs are unmasked).
        blocks: objects with ``key``, ``groups``, ``group_width``, ``target_path``
            (``wide_compile.state.RoutedBlock``).
        calibration_batches: input-id tensors ``[batch, seq]`` or dicts with ``input_ids`` (and optionally
            ``attention_mask``: padded tokens are then left out of the means).
    """
    blocks = list(blocks)
    device = next(model.parameters()).device
    collectors, handles = {}, []
    try:
        for block in blocks:
            collector = _ActivationCollector(block.groups, block.group_width)
            target = model.get_submodule(block.target_path)
            handles.append(target.register_forward_pre_hook(collector, with_kwargs=True))
            collectors[block.key] = collector
        seen = 0
        for batch in calibration_batches:
            inputs, token_mask = _batch_inputs(batch)
            for collector in collectors.values():
                collector.token_mask = token_mask
            model(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}, use_cache=False)
            seen += 1
        if seen == 0:
            raise ValueError("calibration_batches is empty")
    finally:
        for handle in handles:
            handle.remove()
    importance = {}
    for block in blocks:
        collector = collectors[block.key]
        if collector.tokens == 0:
            raise RuntimeError(f"no calibration token reached {block.target_path}")
        weight_norms = group_weight_norms(model.get_submodule(block.target_path), block.groups, block.group_width,
                                          block.target_path)
        importance[block.key] = (collector.total / collector.tokens).cpu() * weight_norms.cpu()
    return importance


def kept_group_count(groups: int, sparsity: float) -> int:
    """Groups a block keeps at ``sparsity``: ``round((1 - sparsity) * groups)``."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    return max(0, min(groups, round((1.0 - sparsity) * groups)))


def select_groups(importance: Mapping[BlockKey, Tensor], sparsity: float) -> dict[BlockKey, Tensor]:
    """``{(layer, kind): keep[groups]}`` (float 0/1): the most important groups of each block, ties to lower index."""
    masks = {}
    for key, scores in importance.items():
        keep = kept_group_count(scores.numel(), sparsity)
        order = torch.sort(scores, descending=True, stable=True).indices[:keep]
        mask = torch.zeros(scores.numel())
        mask[order] = 1.0
        masks[key] = mask
    return masks
