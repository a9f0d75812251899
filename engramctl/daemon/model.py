"""The model the daemon serves: settings.model (or the default model) loaded on settings.backend/device/dtype.

Apart from runner.py (which runs the app) so that app.py can load it without importing the runner back.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from engramctl.settings import Settings

log = logging.getLogger("engramctl.daemon")


def load_model(settings: Settings, place_tables=None):
    """Load settings.model (or the default model) on settings.device/dtype; logs progress. What the
    user should know about the choice (the SmolLM2 fallback) is logged as a warning and kept in
    engine.notices, which /v1/status reports and the CLI prints once after starting the daemon.
    `place_tables` is the tier planner's claim for the N-gram tables (the daemon's TierPlanner.claim_tables);
    without it they are placed on a plan of this machine's tiers."""
    from engramctl.ngram.config import ngram_config  # not engine/ngram_hooks: that imports torch
    from engramctl.engine.loading import choose_backend, load_engine
    from engramctl.ngram.tableset import TableSetup

    notices: list[str] = []

    def say(message: str) -> None:
        log.warning("%s", message)
        notices.append(message)

    ref = settings.model
    if ref is None:
        from engramctl.engine.models import default_model_ref

        ref = default_model_ref(settings.paths.cache_dir, say=say, device=settings.device, backend=settings.backend)
    path = Path(ref).expanduser()
    if path.exists():
        ref = str(path.resolve())
    if choose_backend(ref, settings.backend) == "transformers":  # llama.cpp never needs transformers' 20 MB
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # the per-file progress bars would fill the log
    st = settings
    log.info("loading model %s (backend %s, device %s, dtype %s)", ref, st.backend, st.device, st.dtype)
    t0 = time.perf_counter()
    ngram = ngram_config(st.ngram_layers, st.ngram_table_rows)
    tables = TableSetup(
        data_dir=st.paths.data_dir,
        cache_dir=st.paths.cache_dir,
        tier=st.ngram_table_tier,
        place=place_tables or _planner(settings),
        progress=log.info,
    )
    engine = load_engine(
        ref,
        st.paths.cache_dir,
        st.device,
        st.dtype,
        backend=st.backend,
        progress=log.info,
        ngram=ngram,
        tables=tables,
        threads=st.threads,
        sequences=st.sequences,
        vram_tier_bytes=st.tier_vram_bytes,
    )
    i = engine.info
    log.info(
        "model ready in %.1f s: %s (%s on %s, %s weights, %s, context %s)",
        time.perf_counter() - t0,
        i.model_id,
        i.family,
        i.backend,
        i.weight_type or i.dtype,
        i.device,
        i.context_length,
    )
    engine.notices.extend(notices)
    return engine


def _planner(settings: Settings):
    """claim_tables on a fresh plan of this machine's tiers: the placement when no store claims them."""

    def place(tables, tier):
        from engramctl.tiers.hardware import detect_hardware
        from engramctl.tiers.plan import claim_tables, plan

        claimed = claim_tables(plan(detect_hardware(settings.paths.data_dir), settings), tables, tier)
        return {c.name: c.tier for c in claimed.tables}

    return place
