"""Model-quality evaluation: lm-eval zero-shot tasks (``evaluate``), WikiText-2 perplexity, skip rates."""

from wide_compile.evaluation.harness import evaluate, format_results
from wide_compile.evaluation.perplexity import PerplexityResult, perplexity

__all__ = ["PerplexityResult", "evaluate", "format_results", "perplexity"]
