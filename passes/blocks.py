"""What the discovery pass found, in terms of the live model's modules (no graph references)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class AttentionBlock:
    """One self-attention block of a decoder layer."""

    q_proj: str  # module path of the query projection (may be a fused qkv projection)
    k_proj: str
    v_proj: str
    o_proj: str  # output projection: its input is [..., num_heads * head_dim], head-major
    router_source: str  # module whose first input is the residual before the attention's input norm
    num_heads: int
    num_kv_heads: int
    head_dim: int
    fused_qkv: bool
    core: str  # "sdpa" or "eager"

    @property
    def width(self) -> int:
        return self.num_heads * self.head_dim


@dataclass(frozen=True)
class MlpBlock:
    """One feed-forward block of a decoder layer."""

    in_projs: tuple[str, ...]  # gate/up (or fc1), in graph order; one entry when gate_up is fused
    down_proj: str  # its input is the intermediate activation [..., intermediate]
    router_source: str  # module whose first input is the residual before the MLP's input norm
    intermediate: int
    gated: bool
    activation: str
    fused_gate_up: bool


@dataclass(frozen=True)
class LayerBlocks:
    """The blocks of one decoder layer."""

    index: int
    path: str
    attention: AttentionBlock | None
    mlp: MlpBlock | None
    parallel: bool = False  # attention and MLP read the same residual (GPT-NeoX / Falcon / Phi style)


@dataclass(frozen=True)
class ModelBlueprint:
    """Every decoder layer's blocks, in order."""

    architecture: str
    hidden_size: int
    layers: tuple[LayerBlocks, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelBlueprint":
        layers = []
        for layer in data["layers"]:
            attn = AttentionBlock(**layer["attention"]) if layer.get("attention") else None
            mlp = None
            if layer.get("mlp"):
                mlp_data = dict(layer["mlp"])
                mlp_data["in_projs"] = tuple(mlp_data["in_projs"])
                mlp = MlpBlock(**mlp_data)
            layers.append(LayerBlocks(layer["index"], layer["path"], attn, mlp, layer.get("parallel", False)))
        return cls(data["architecture"], data["hidden_size"], tuple(layers))
