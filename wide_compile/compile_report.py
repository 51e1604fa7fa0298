"""What the ``wide`` backend compiled: one record per graph, plus Dynamo's graph-break counters.

``wide_compile.compile_report(model)`` after running a ``torch.compile(model, backend="wide")`` model:

    report = wide_compile.compile_report(model)
    print(report)               # one line per graph: compile id, wide:: ops captured, ops lowered, why not
    report.recompiles           # graphs compiled again for a frame (Dynamo compile id "frame/n" with n > 0)
    report.graph_breaks         # {reason: count}, process-wide since the last reset_compile_report()
                                # (torch._dynamo.utils.counters["graph_break"])
    report.skipped_frames       # {reason: count}: frames Dynamo gave up on and ran eagerly, e.g. a graph break
                                # inside a context manager it cannot resume from (counters["unimplemented"]; these
                                # are not in graph_breaks: the model then runs as several graphs, e.g. one per block)

Recompile reasons are not recorded here: run with ``TORCH_LOGS=recompiles`` (or
``torch._logging.set_logs(recompiles=True)``) to see the failing guard of each recompile, and
``torch._dynamo.explain(model)(*inputs)`` for graph-break locations without compiling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx, nn


@dataclass
class GraphRecord:
    """One graph the ``wide`` backend compiled."""

    compile_id: str  # Dynamo's "frame/n": n > 0 means this frame was recompiled
    code: str  # "file:line in function" where the graph's frame starts
    nodes: int  # call nodes in the captured graph
    wide_ops: dict[str, int]  # wide:: ops in the captured graph, by name
    lowered: dict[str, int]  # lowered ops inserted by the backend, by name
    generic: list[str]  # group_mask nodes left (partly) on the generic path, with the reason
    graph_break: str | None  # reason, when the graph ended at a graph break
    inner: str  # inner compiler: "inductor", "aot_eager" or "eager"
    options: dict  # Inductor config patches used (mode + options)
    graph_module: fx.GraphModule = field(repr=False)  # the rewritten graph given to the inner compiler
    storages: frozenset[int] = field(default=frozenset(), repr=False)  # storages of the real inputs
    is_recompile: bool = False  # Dynamo compiled this frame before (frame_compile_id > 0)
    stored: dict[str, int] = field(default_factory=dict)  # values the backend has Inductor store once (not inline)


@dataclass
class CompileReport:
    graphs: list[GraphRecord]
    graph_breaks: dict[str, int]
    skipped_frames: dict[str, int] = field(default_factory=dict)

    @property
    def recompiles(self) -> int:
        return sum(g.is_recompile for g in self.graphs)

    @property
    def lowered(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for g in self.graphs:
            for op, n in g.lowered.items():
                totals[op] = totals.get(op, 0) + n
        return totals

    def __str__(self) -> str:
        lines = [f"wide backend: {len(self.graphs)} graph(s), {self.recompiles} recompile(s), "
                 f"{sum(self.graph_breaks.values())} graph break(s), {sum(self.skipped_frames.values())} frame(s) run "
                 f"eagerly (process-wide); lowered {self.lowered}"]
        for g in self.graphs:
            lines.append(f"  [{g.compile_id}] {g.code}: {g.nodes} nodes, wide ops {g.wide_ops}, lowered {g.lowered}"
                         f"{f', stored once {g.stored}' if g.stored else ''}"
                         f"{', ended by graph break' if g.graph_break else ''}")
            lines += [f"      generic path: {why}" for why in g.generic]
        for reason, n in self.graph_breaks.items():
            lines.append(f"  graph break x{n}: {reason.splitlines()[0]}")
        for reason, n in self.skipped_frames.items():
            lines.append(f"  frame run eagerly x{n}: {_one_line(reason)}")
        return "\n".join(lines)


def _one_line(reason: str) -> str:
    """A skipped frame's reason in one line: its first line, and the nested break's when Dynamo gives one."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    nested = [lines[i + 1] for i, line in enumerate(lines[:-1]) if "another graph break occurred" in line]
    return lines[0] + (f" -> {nested[0]}" if nested else "") if lines else ""


_RECORDS: list[GraphRecord] = []


def input_storages(example_inputs) -> frozenset[int]:
    """Data pointers of the parameters among a graph's inputs (they share the model's storage).

    Only parameters: the storage of a temporary input (token ids, a cache tensor) is freed after the call and may
    be reused by another model's weights, which would then match graphs it never ran.
    """
    keys = set()
    for t in example_inputs:
        if isinstance(t, nn.Parameter) and not isinstance(t, torch._subclasses.FakeTensor) and t.device.type != "meta":
            ptr = t.untyped_storage().data_ptr()
            if ptr:
                keys.add(ptr)
    return frozenset(keys)


def add_record(record: GraphRecord) -> None:
    _RECORDS.append(record)


def reset_compile_report() -> None:
    """Forget the recorded graphs and Dynamo's graph-break and skipped-frame counts (``torch._dynamo.reset()`` keeps
    the counts)."""
    from torch._dynamo.utils import counters

    _RECORDS.clear()
    counters["graph_break"].clear()
    counters["unimplemented"].clear()


def _model_storages(model: nn.Module) -> set[int]:
    inner = getattr(model, "_orig_mod", model)
    tensors = list(inner.parameters())
    return {t.untyped_storage().data_ptr() for t in tensors if t.device.type != "meta"} - {0}


def compile_report(model: nn.Module | None = None) -> CompileReport:
    """The graphs the ``wide`` backend compiled (for ``model`` only when given: graphs reading its parameters)."""
    from torch._dynamo.utils import counters

    graphs = list(_RECORDS)
    if model is not None:
        keys = _model_storages(model)
        graphs = [g for g in graphs if g.storages & keys]
    return CompileReport(graphs=graphs, graph_breaks=dict(counters["graph_break"]),
                         skipped_frames=dict(counters["unimplemented"]))
