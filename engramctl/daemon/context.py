"""The Daemon: what every route needs (settings, engine, store, the tier plan, the conversation service,
the worker), owned for the app's lifetime and reached from a request with `daemon_of(request)`.

Kept apart from app.py, which builds the app and includes the routes: the routes import this module,
app.py imports the routes, and nothing imports back.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from starlette.requests import Request

from engramctl import __version__
from engramctl.daemon.auth import ensure_token
from engramctl.daemon.prefetch import Prefetch
from engramctl.daemon.scheduler import Scheduler
from engramctl.daemon.service import ConversationService
from engramctl.daemon.worker import Worker
from engramctl.engine.engine import Engine
from engramctl.errors import ModelNotFound
from engramctl.protocol import same_model
from engramctl.settings import Settings
from engramctl.store.store import Store
from engramctl.tiers.hardware import detect_hardware
from engramctl.tiers.planner import TierPlanner

log = logging.getLogger("engramctl.daemon")


def engine_plan_args(settings: Settings, engine: Engine) -> dict[str, Any]:
    """What the tier plan takes from a loaded engine (TierPlanner.start / replan keywords): where its weights
    are, the hardware with the engine's own VRAM figure where it measures one (llama.cpp: ggml's), and whether
    its states can be held in VRAM."""
    return {
        "model_on_cpu": engine.info.device == "cpu",
        "hardware": detect_hardware(settings.paths.data_dir, gpu=engine.gpu_memory()),
        "vram_snapshots": engine.vram_snapshots,
    }


class Daemon:
    """Everything a route needs, owned for the app's lifetime."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        store: Store,
        tiers: TierPlanner | None = None,
        *,
        token: str | None = None,
        reuse: bool = True,
    ):
        self.settings, self.engine, self.store = settings, engine, store
        # the tier plan the store keeps within, the daemon's own: built here when the caller loaded the model
        # and opened the store itself (tests, benchmarks); shown by /v1/tiers
        self.tiers = tiers or TierPlanner.start(settings, store.retention, **engine_plan_args(settings, engine))
        self.token = token or ensure_token(settings)
        self.scheduler = Scheduler(engine, serial=settings.serial_turns)
        # as many hot states as turns run together, and as the backend keeps device copies of (llama.cpp's VRAM
        # tier): each of those conversations' next turn restores nothing, or only a device-to-device copy
        keep = self.scheduler.max_sequences + engine.device_slots
        self.service = ConversationService(engine, store, reuse=reuse, keep=keep)
        self.worker = Worker(settings.max_queue, self.scheduler, self.service)
        self.prefetch = Prefetch(store, engine.spec)  # started by `start` (prefetch.py)
        self.warmup_ms: float | None = None
        self.started = time.time()
        self.model_id = engine.info.model_id
        self.model_names = (self.model_id, settings.model)  # what a request's `model` may name (same_model)
        self._closed = False

    def check_model(self, name: str) -> None:
        if not same_model(name, *self.model_names):
            raise ModelNotFound(
                f"the model {name!r} does not exist; this daemon serves {self.model_id!r} (or use 'default').",
                hint="GET /v1/models lists it",
            )

    def start(self) -> None:
        """What a daemon that loaded its model does before it says it is ready: warm the backend's kernels (one
        tiny prompt and one decode on the worker thread, so the first request pays no first-call setup: CUDA
        kernels, llama.cpp's graph and buffers), then start loading the most recently used states in the
        background (prefetch.py), which readiness does not wait for."""
        t0 = time.perf_counter()
        self.worker.call(self._warm_up, name="warm_up")
        self.warmup_ms = round((time.perf_counter() - t0) * 1000, 1)
        log.info("backend warmed up in %.1f ms", self.warmup_ms)
        self.prefetch.start()

    def _warm_up(self) -> None:
        engine = self.engine
        token = (engine.tokenizer.encode("Hello") or [0])[:1]
        live = engine.new_live()
        try:
            engine.step([(live, token)])  # a prompt chunk
            engine.step([(live, token)])  # and one decode after it
        finally:
            engine.release(live)

    def begin_shutdown(self) -> None:
        """Refuse new work, cancel the generation in flight and everything queued."""
        self.worker.begin_shutdown()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker (cancelling what runs), write pending snapshots, close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.prefetch.stop(timeout)  # before the store closes under it
        if not self.worker.close(timeout):
            log.warning("the generation in flight did not stop within %.0f s; closing anyway", timeout)
        if not self.store.flush(timeout=max(timeout, 10.0)):
            log.warning("some snapshot writes did not finish in time")
        self.store.close()

    def status(self) -> dict[str, Any]:
        info = self.engine.info
        hot = self.service.hot
        try:
            import psutil

            rss = psutil.Process().memory_info().rss
        except Exception:  # noqa: BLE001
            rss = None
        return {
            "status": "ok",
            "version": __version__,
            "pid": os.getpid(),
            "model": self.model_id,
            "family": info.family,
            "architecture": info.architecture,
            "device": info.device,
            "dtype": info.dtype,
            "context_length": info.context_length,
            "weights_bytes": info.weights_bytes,
            "n_params": info.n_params,
            "fingerprint": info.fingerprint,
            "started": self.started,
            "uptime_s": round(time.time() - self.started, 3),
            "rss_bytes": rss,
            "sessions": self.store.sessions.count(),
            "hot": None
            if hot is None
            else {"session": hot.session, "snapshot_id": hot.head, "tokens": len(hot.live.token_ids)},
            "queue": {
                "busy": self.worker.busy,
                "waiting": self.worker.waiting,
                "running": self.worker.running,
                "max": self.worker.max_queue,
            },
            "serving": self.serving(),
            "turns": self.service.turns,
            "pending_writes": self.store.pending_writes,
            "warmup_ms": self.warmup_ms,
            "prefetched": self.prefetch.status(),
            "write_errors": list(self.store.write_errors),
        }

    def serving(self) -> dict[str, Any]:
        """How many conversations the daemon serves at once, and why not more."""
        n = self.scheduler.max_sequences
        if self.settings.serial_turns:
            why = "serial_turns: one turn at a time, each reply bitwise as alone"
        elif n == 1:
            why = f"the {self.engine.info.backend} backend runs one turn at a time; the others queue in arrival order"
        else:
            why = f"{n} conversations step together on the {self.engine.info.backend} backend"
            why += f", {self.engine.kv_layout}" if self.engine.kv_layout else ""
        running = sorted({r.session for r in list(self.scheduler.running) if r.session})  # a copy: the worker's list
        return {
            "at_once": n,
            "running": self.worker.running,
            "waiting": self.worker.waiting,
            "sessions": running,  # the sessions whose turns run now
            "why": why,
        }


def daemon_of(request: Request) -> Daemon:
    return request.app.state.daemon
