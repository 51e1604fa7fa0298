"""User-facing configuration of the WIDE transformation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

BUDGETS = ("learned", "topk")
BLOCKS = ("attention", "mlp")


@dataclass(frozen=True)
class WideConfig:
    """How :func:`wide_compile.apply` prunes a model.

    Attributes:
        sparsity: target fraction of (token, group) pairs skipped, in [0, 1). With ``budget="learned"``
            it is the training target; with ``budget="topk"`` every token keeps exactly
            ``round((1 - sparsity) * groups)`` groups per block.
        attn_group_size: consecutive query heads per attention group (default: the query heads that
            share one key/value head). Must divide the number of query heads.
        ffn_group_size: contiguous intermediate channels per FFN group (default 128). Must divide the
            intermediate size.
        router_rank: inner width of the low-rank routers (the method uses 32).
        budget: ``"learned"`` (WIDE: per-token argmax of learned logits) or ``"topk"``.
        blocks: which sub-blocks get routers: ``("attention", "mlp")`` or one of them.
        allow_partial: keep going when a layer lacks a recognisable block instead of raising.
    """

    sparsity: float = 0.5
    attn_group_size: int | None = None
    ffn_group_size: int = 128
    router_rank: int = 32
    budget: str = "learned"
    blocks: tuple[str, ...] = BLOCKS
    allow_partial: bool = False

    def __post_init__(self):
        if isinstance(self.sparsity, bool) or not isinstance(self.sparsity, (int, float)):
            raise TypeError(f"sparsity must be a number in [0, 1), got {self.sparsity!r}")
        if not 0.0 <= float(self.sparsity) < 1.0:
            raise ValueError(f"sparsity must be in [0, 1), got {self.sparsity}")
        if self.attn_group_size is not None and (not isinstance(self.attn_group_size, int) or self.attn_group_size < 1):
            raise ValueError(f"attn_group_size must be a positive integer or None, got {self.attn_group_size!r}")
        if not isinstance(self.ffn_group_size, int) or self.ffn_group_size < 1:
            raise ValueError(f"ffn_group_size must be a positive integer, got {self.ffn_group_size!r}")
        if not isinstance(self.router_rank, int) or self.router_rank < 1:
            raise ValueError(f"router_rank must be a positive integer, got {self.router_rank!r}")
        if self.budget not in BUDGETS:
            raise ValueError(f"budget must be one of {BUDGETS}, got {self.budget!r}")
        blocks = (self.blocks,) if isinstance(self.blocks, str) else tuple(self.blocks)
        unknown = [b for b in blocks if b not in BLOCKS]
        if unknown or not blocks:
            raise ValueError(f"blocks must be a non-empty subset of {BLOCKS}, got {self.blocks!r}")
        object.__setattr__(self, "blocks", blocks)

    def kept_groups(self, groups: int) -> int:
        """Groups each token keeps under ``budget="topk"``."""
        return max(0, min(groups, round((1.0 - self.sparsity) * groups)))

    def to_dict(self) -> dict:
        data = asdict(self)
        data["blocks"] = list(self.blocks)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "WideConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: (tuple(v) if k == "blocks" else v) for k, v in data.items() if k in known})
