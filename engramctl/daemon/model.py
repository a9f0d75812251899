"""The model the daemon serves: settings.model (or the default model) loaded on settings.backend/device/dtype.

Apart from runner.py (which runs the app) so that app.py can load it without importing the runner back.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from engramctl.settings import Settings

log = logging.getLogger("engramctl.daemon")


def load_model(settings: Settings):
    """Load settings.model (or the default model) on settings.device/dtype; logs progress. What the
    user should know about the choice (the SmolLM2 fallback) is logged as a warning and kept in
    engine.notices, which /v1/status reports and the CLI prints once after starting the daemon."""
    from engramctl.engine.engram import ngram_config
    from engramctl.engine.loading import load_engine

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
    try:  # the per-file progress bars would fill the log
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    st = settings
    log.info("loading model %s (backend %s, device %s, dtype %s)", ref, st.backend, st.device, st.dtype)
    t0 = time.perf_counter()
    ngram = ngram_config(st.ngram_layers, st.ngram_table_rows)
    engine = load_engine(
        ref, st.paths.cache_dir, st.device, st.dtype, backend=st.backend, progress=log.info, ngram=ngram
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
