"""Model-quality evaluation: perplexity (more tasks can be added as sibling modules)."""

from wide_compile.evaluation.perplexity import PerplexityResult, perplexity

__all__ = ["PerplexityResult", "perplexity"]
