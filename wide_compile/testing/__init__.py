"""User-facing correctness checks for a transformed model (``verify``), also as a pytest plugin:

    pytest --wide-model PATH_OR_ID_OR_ALIAS [--wide-ffn-group-size 128]
"""

from .checks import CHECKS, CheckResult, Report, check_all_execute, check_forced_masks, check_generate, \
    check_router_gradients, prepare, verify

__all__ = ["CHECKS", "CheckResult", "Report", "check_all_execute", "check_forced_masks", "check_generate",
           "check_router_gradients", "prepare", "verify"]
