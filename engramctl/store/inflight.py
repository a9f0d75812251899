"""One load per snapshot id at a time: a caller asking for a snapshot that another thread is loading waits for that
load and shares its payload instead of reading the files a second time (the daemon's prefetch after a restart and
the first turn of the same session, say).

    @one_load_per_id            # on Snapshots.load_from, the store's one entry point for reading a payload
    def load_from(self, snapshot_id, *, copy=False): ...

Every caller gets what the one load returned: its payload (the stored tensors, read-only by contract; copy=True
copies them for that caller alone) and where it came from ("disk" for everyone who waited on a read), or its error.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from engramctl.store import arrays


class _Load:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.waiters = 0


class InFlight:
    """The loads running now, by key; `run` starts one or joins the one running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads: dict[str, _Load] = {}
        self.joined = 0  # calls that waited on another's load instead of starting their own (since start)

    def run(self, key: str, fn: Callable[[], Any]) -> Any:
        with self._lock:
            load = self._loads.get(key)
            leader = load is None
            if leader:
                load = self._loads[key] = _Load()
            else:
                load.waiters += 1
                self.joined += 1
        if not leader:
            load.done.wait()
            if load.error is not None:
                raise load.error
            return load.result
        try:
            load.result = fn()
        except BaseException as e:
            load.error = e
            raise
        finally:
            with self._lock:
                del self._loads[key]
            load.done.set()
        return load.result

    def loading(self) -> set[str]:
        """The keys being loaded now."""
        with self._lock:
            return set(self._loads)


def in_flight(owner: object) -> InFlight:
    """The owner's (a Snapshots part's) loads in flight, made on first use."""
    found = owner.__dict__.get("_in_flight")
    if found is None:
        found = owner.__dict__.setdefault("_in_flight", InFlight())
    return found


def one_load_per_id(load_from: Callable[..., tuple[Any, str]]) -> Callable[..., tuple[Any, str]]:
    """Wrap Snapshots.load_from so that concurrent loads of one snapshot id perform one."""

    @functools.wraps(load_from)
    def wrapped(self, snapshot_id: str, *, copy: bool = False, into: Any = None) -> tuple[Any, str]:
        # a caller that joins another's load gets that load's layout: `into` is where a payload may be laid out,
        # never what it must be
        payload, tier = in_flight(self).run(snapshot_id, lambda: load_from(self, snapshot_id, copy=False, into=into))
        if copy:
            tensors, meta = payload
            payload = {k: arrays.copy(t) for k, t in tensors.items()}, dict(meta)
        return payload, tier

    return wrapped
