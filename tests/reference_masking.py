"""An independent reference for WIDE's masking semantics, written with plain module hooks.

It does not use ``wide_compile``'s discovery: the projection names per family are spelled out here,
and masks are expanded and multiplied with ordinary tensor ops.
"""

from __future__ import annotations

import torch

# family -> (attention output projection suffix, MLP down projection suffix)
TARGETS = {
    "gpt2": ("attn.c_proj", "mlp.c_proj"),
    "gpt_neox": ("attention.dense", "mlp.dense_4h_to_h"),
    "opt": ("self_attn.out_proj", "fc2"),
    "falcon": ("self_attention.dense", "mlp.dense_4h_to_h"),
    "phi": ("self_attn.dense", "mlp.fc2"),
    "gptj": ("attn.out_proj", "mlp.fc_out"),
}
DEFAULT_TARGETS = ("self_attn.o_proj", "mlp.down_proj")


def layer_modules(model):
    """The decoder layers' ModuleList (the only ModuleList holding the projections)."""
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == model.config.num_hidden_layers:
            return module
    raise LookupError("no decoder layer list")


def masked_reference(model, family: str, masks: dict, attn_width: int, ffn_width: int):
    """Context: hooks that zero each token's inactive head groups / channel groups of ``model``."""
    o_name, down_name = TARGETS.get(family, DEFAULT_TARGETS)
    handles = []

    def make(mask, width):
        def hook(module, args):
            x = args[0]
            expanded = mask.reshape(*x.shape[:-1], -1).repeat_interleave(width, dim=-1).to(x.dtype)
            return (x * expanded,)
        return hook

    for index, layer in enumerate(layer_modules(model)):
        handles.append(layer.get_submodule(o_name).register_forward_pre_hook(make(masks[(index, "attention")], attn_width)))
        handles.append(layer.get_submodule(down_name).register_forward_pre_hook(make(masks[(index, "mlp")], ffn_width)))
    return _Handles(handles)


class _Handles:
    def __init__(self, handles):
        self.handles = handles

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
