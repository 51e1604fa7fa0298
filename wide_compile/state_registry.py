"""Where the routing hooks find their model's :class:`~wide_compile.state.WideState`: one module-level registry.

Under ``torch.compile`` Dynamo guards every *duplicate* route to one Python object: when the same object is reached
through two different sources of the same kind (two local attribute chains), it adds a guard ``a is b`` that
``skip_guard_eval_unsafe`` still runs on every call, evaluated in Python over both chains. With a strong ``state``
attribute on each of a model's hooks (and the routed blocks reached both from a hook and from ``state.blocks``), a
call carried about 8 such guards per layer (32 on a 4-layer model), each walking
``L['args'][0]._modules['model']._modules['layers']._modules['0']._forward_pre_hooks[...]...``; on an 8-layer CPU model
the cache lookup under that stance took about four times the dense model's (124 vs 32 µs, profiled).

Hooks therefore keep only an integer key, and reach the state (and through it, the blocks) through
:func:`live_state`, a global: one source for every hook, no duplicate-route guards. The registry holds weak
references, so it keeps no model alive; a state registers itself on creation and on ``copy.deepcopy``
(``WideState.__reduce_ex__``; pickling too), so a copied model's hooks point at the copy's state.

A freed state's entry is removed on the next :func:`register`, not by its weak reference's callback: the callback runs
whenever the garbage collector does, and Dynamo, tracing :func:`live_state`, iterates over the registry (flaky
``RuntimeError: dictionary changed size during iteration`` inside a compile when a previous model was collected
mid-trace).
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import WideState

_LIVE_STATES: dict[int, weakref.ReferenceType] = {}
_KEYS = itertools.count()
_FREED: list[int] = []  # keys whose state was collected; dropped from _LIVE_STATES by the next register()


def register(state: WideState) -> int:
    """Give ``state`` a new key in the registry (dropped by a later call once the state is garbage-collected)."""
    while _FREED:
        _LIVE_STATES.pop(_FREED.pop(), None)
    key = next(_KEYS)
    _LIVE_STATES[key] = weakref.ref(state, lambda _ref, key=key: _FREED.append(key))
    return key


def live_state(key: int) -> WideState:
    """The state registered under ``key``; a clear error if its model is gone."""
    ref = _LIVE_STATES.get(key)
    state = ref() if ref is not None else None
    if state is None:
        raise RuntimeError(f"wide_compile: the WIDE state {key} of this hook no longer exists (its model was freed)")
    return state


__all__ = ["live_state", "register"]
