"""wide-compile: token-level dynamic width pruning (WIDE) for HuggingFace causal LMs."""

__version__ = "0.1.0"
