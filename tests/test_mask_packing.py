"""``passes/mask_packing.py``: a forward's masks end up in one tensor (one graph output under ``torch.compile``)."""
from __future__ import annotations

import torch

import wide_compile
from wide_compile.passes.mask_packing import pack_masks
from wide_compile.state import get_state
from wide_compile.testing.tiny_models import tiny_model

IDS = torch.randint(3, 120, (2, 7), generator=torch.Generator().manual_seed(0))


def _model():
    return wide_compile.apply(tiny_model("llama", dtype=torch.float32), sparsity=0.5, ffn_group_size=32).eval()


def test_forward_leaves_one_packed_tensor_and_views_of_it():
    model = _model()
    with torch.no_grad():
        model(IDS, use_cache=False)
    state = get_state(model)
    assert all(block.mask is None for block in state.blocks)
    groups = sum(block.groups for block in state.blocks)
    assert state.packed_masks.shape == (*IDS.shape, groups)
    masks = wide_compile.realized_masks(model)
    assert list(masks) == [block.key for block in state.blocks]
    for block in state.blocks:
        view = masks[block.key]
        assert view.shape == (*IDS.shape, block.groups) and view.untyped_storage().data_ptr() == \
            state.packed_masks.untyped_storage().data_ptr()
        assert torch.equal(state.packed(block.key), view)


def test_compiled_forward_returns_the_logits_and_one_mask_tensor():
    torch._dynamo.reset()
    model = _model()
    outputs = []

    def counting(gm, inputs):
        outputs.append(len(next(n for n in gm.graph.nodes if n.op == "output").args[0]))
        return gm.forward

    with torch.no_grad():
        eager = model(IDS, use_cache=False).logits
        eager_masks = {k: v.clone() for k, v in wide_compile.realized_masks(model).items()}
        compiled = torch.compile(model, backend=counting)(IDS, use_cache=False).logits
    assert outputs == [2]
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    masks = wide_compile.realized_masks(model)
    assert masks.keys() == eager_masks.keys() and all(torch.equal(masks[k], eager_masks[k]) for k in masks)


def test_a_projection_whose_mask_was_already_packed_reads_it_from_the_pack():
    """Robust to an unusual call order: a projection that runs after the masks were packed reads its mask there."""
    model = _model()
    state = get_state(model)
    with torch.no_grad():
        model(IDS, use_cache=False)
    masks = {k: v.clone() for k, v in wide_compile.realized_masks(model).items()}
    for block in state.blocks:
        block.mask = masks[block.key]
    pack_masks(state)
    assert all(block.mask is None for block in state.blocks)
    for index in (0, len(state.blocks) - 1):
        block = state.blocks[index]
        mask_hook = next(e.hook for e in state.hooks if getattr(e.hook, "block_index", None) == index)
        x = torch.randn(2, 7, block.groups * block.group_width)
        args, _ = mask_hook(None, (x,), {})
        torch.testing.assert_close(args[0], x * masks[block.key].repeat_interleave(block.group_width, dim=-1))


def test_masks_of_different_token_shapes_stay_on_their_blocks():
    model = _model()
    state = get_state(model)
    a, b = state.blocks[:2]
    a.mask, b.mask = torch.ones(2, 7, a.groups), torch.ones(3, b.groups)
    state.packed_masks = None
    pack_masks(state)
    assert state.packed_masks is None and a.mask is not None and b.mask is not None
    assert wide_compile.realized_masks(model)[b.key].shape == (3, b.groups)


def test_many_masks_are_joined_in_chunks_equal_to_one_cat():
    """More than ``CHUNK`` masks: a cat of chunk cats (fewer copy kernels under Inductor), equal to one cat, the layout
    and views unchanged; random 0 / 1 masks of different group counts."""
    from wide_compile.passes import mask_packing

    from wide_compile.testing.tiny_models import tiny_config

    config = tiny_config("llama")
    config.num_hidden_layers = 5  # 10 routed blocks > CHUNK
    from transformers import LlamaForCausalLM

    model = wide_compile.apply(LlamaForCausalLM(config).eval(), sparsity=0.5, ffn_group_size=32)
    state = get_state(model)
    assert len(state.blocks) > mask_packing.CHUNK
    gen = torch.Generator().manual_seed(3)
    masks = [(torch.rand(2, 7, b.groups, generator=gen) < 0.5).float() for b in state.blocks]
    for block, mask in zip(state.blocks, masks):
        block.mask = mask
    pack_masks(state)
    assert torch.equal(state.packed_masks, torch.cat(masks, dim=-1))
    for block, mask in zip(state.blocks, masks):
        assert torch.equal(state.packed(block.key), mask)
    assert torch.equal(mask_packing._join(masks[:3]), torch.cat(masks[:3], dim=-1))
