"""Document functions of the local lm-eval tasks, copied from lm-evaluation-harness (MIT licence).

The generated task yamls (see :mod:`wide_compile.evaluation.tasks`) reference these functions with
``!function wide_compile.evaluation.task_docs.<name>``.  They are verbatim copies of lm-eval's
``tasks/hellaswag/utils.py`` and ``tasks/winogrande/preprocess_winogrande.py`` (lm-eval 0.4.x), kept
here so the local tasks do not depend on the layout of lm-eval's task folder; ``tests/test_eval_harness.py``
checks that they produce the same prompts and scores as lm-eval's own task configs.  Only
:func:`boolq_process_docs` is new: it maps the ``google/boolq`` schema of the local file
(``answer: bool``) to the ``super_glue/boolq`` field that lm-eval's BoolQ yaml scores (``label: 0|1``).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["boolq_process_docs", "hellaswag_preprocess", "hellaswag_process_docs", "winogrande_doc_to_choice",
           "winogrande_doc_to_target", "winogrande_doc_to_text"]


def hellaswag_preprocess(text: str) -> str:
    """lm-eval ``hellaswag/utils.py::preprocess``."""
    text = text.strip()
    # NOTE: Brackets are artifacts of the WikiHow dataset portion of HellaSwag.
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def hellaswag_process_docs(dataset: Any) -> Any:
    """lm-eval ``hellaswag/utils.py::process_docs`` (adds ``query``, ``choices``, ``gold``)."""

    def _process_doc(doc: dict) -> dict:
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return {
            "query": hellaswag_preprocess(doc["activity_label"] + ": " + ctx),
            "choices": [hellaswag_preprocess(ending) for ending in doc["endings"]],
            "gold": int(doc["label"]),
        }

    return dataset.map(_process_doc)


def winogrande_doc_to_text(doc: dict) -> int:
    """lm-eval ``winogrande/preprocess_winogrande.py::doc_to_text`` (index of the right option)."""
    answer_to_num = {"1": 0, "2": 1}
    return answer_to_num[doc["answer"]]


def winogrande_doc_to_target(doc: dict) -> str:
    """lm-eval ``winogrande/preprocess_winogrande.py::doc_to_target`` (the text after the blank)."""
    idx = doc["sentence"].index("_") + 1
    return doc["sentence"][idx:].strip()


def winogrande_doc_to_choice(doc: dict) -> list[str]:
    """lm-eval ``winogrande/preprocess_winogrande.py::doc_to_choice`` (sentence start + each option)."""
    idx = doc["sentence"].index("_")
    options = [doc["option1"], doc["option2"]]
    return [doc["sentence"][:idx] + opt for opt in options]


def boolq_process_docs(dataset: Any) -> Any:
    """Add ``label`` (0 = no, 1 = yes) from the ``google/boolq`` field ``answer`` (a bool)."""
    return dataset.map(lambda doc: {"label": int(bool(doc["answer"]))})
