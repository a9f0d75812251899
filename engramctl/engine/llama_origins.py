"""Where a state's bytes already lie as llama.cpp loads them: the blob a captured state was parsed from, or the
buffer a state was read into from disk (llama_place.place), known by the state's own arrays.

A state's tensors are views of one blob that nothing modifies (llama_state.parse's of a capture, store/reader.py's
of a read). While a state's tensors are still those very views, restoring it loads that blob as it lies (one copy:
set_data) instead of serializing its tensors first (two). Found by identity, not by looking at where each array
lies again (64 layer tensors' addresses, shapes and dtype names cost ~1.3 ms a restore on the 350M preset): the
arrays are the objects remembered (held weakly, so a new array at a reused address is another object), a numpy
array's memory cannot be rebound (numpy 2 refuses `a.data = ...`), and shape and dtype are compared again.

A blob is remembered until its state's first tensor is collected; then its serial is queued in `collected`, which
the sequence pool drains under the backend's lock (a finalizer runs on whatever thread the collector does).
"""

from __future__ import annotations

import collections
import itertools
import weakref

from engramctl.state import SessionState
from engramctl.store import arrays


class Origins:
    def __init__(self, collected: collections.deque[int]):
        self.collected = collected
        # a state's first tensor's id -> (its blob, tokens, each tensor's identity, serial)
        self._by_first: dict[int, tuple] = {}
        self._serials = itertools.count(1)  # what a kept state is known by (llama_pool.SequencePool.keep)

    def remember(self, state: SessionState, blob) -> int | None:
        """`state`'s tensors are views of `blob` laid out as set_data takes it: remember it until they are collected.
        The serial it is known by (None: a state without numpy tensors, which is never found)."""
        tensors = _tensors(state)
        if not tensors or not all(arrays.is_numpy(t) for t in tensors):
            return None
        serial = next(self._serials)
        # keyed by the first tensor's id, dropped with the array (a WeakKeyDictionary would compare arrays with ==)
        self._by_first[id(tensors[0])] = (blob, state.n_tokens, _identity(tensors), serial)
        weakref.finalize(tensors[0], _forget, self._by_first, id(tensors[0]), self.collected, serial)
        return serial

    def find(self, state: SessionState) -> tuple[bytearray, int] | None:
        """The blob `state`'s tensors are views of and its serial, when they are still exactly the arrays
        remembered (a state captured here, or read into place, and kept in RAM); else None."""
        tensors = _tensors(state)
        found = self._by_first.get(id(tensors[0])) if tensors else None
        if found is None:
            return None
        blob, n_tokens, identity, serial = found
        if n_tokens != state.n_tokens or len(identity) != len(tensors):
            return None
        for (ref, shape, dtype), t in zip(identity, tensors):
            if ref() is not t or t.shape != shape or t.dtype != dtype:
                return None
        return blob, serial


def _forget(by_first: dict, key: int, collected: collections.deque[int], serial: int) -> None:
    """A remembered state's tensors were collected: forget its blob, and queue its serial (its kept sequence goes)."""
    by_first.pop(key, None)
    collected.append(serial)


def _tensors(state: SessionState) -> list:
    return [t for layer in state.layers for t in layer.tensors().values()]


def _identity(tensors: list) -> list[tuple]:
    """What `find` compares: each array itself (weakly), its shape and its dtype."""
    return [(weakref.ref(t), t.shape, t.dtype) for t in tensors]
