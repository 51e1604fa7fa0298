"""wide_compile.templates"""

# Group-skipping linear kernels (decode GEMVs + prefill GEMMs with per-group token reordering).
from .group_linear import gated_up_groups, input_group_linear, output_group_linear  # noqa: E402
from .group_linear_reference import (  # noqa: E402
    gated_up_groups_reference,
    input_group_linear_reference,
    output_group_linear_reference,
)
from .group_plan import GroupPlan, build_group_plan  # noqa: E402

# Head-group-skipping attention (flash prefill with per-group row compaction + split-KV decode).
from .attention import group_attention  # noqa: E402
from .attention_decode import group_attention_decode  # noqa: E402
from .attention_prefill import group_attention_prefill  # noqa: E402
from .attention_reference import group_attention_reference  # noqa: E402
