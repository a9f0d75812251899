"""The Hugging Face hub as engramctl uses it: where its cache is, whether it may be asked at all, and how
long to wait for it. huggingface_hub is imported inside functions: a cache hit must stay cheap."""

from __future__ import annotations

import os

HUB_TIMEOUT_S = 5.0  # for the reachability probe; snapshot_download's own lookup has no timeout
LOCAL_HINT = "download it elsewhere and pass a local directory: --model /path/to/dir"


def hub_env() -> tuple[str, bool]:
    """(hub cache dir, offline?) read from the env now: huggingface_hub freezes both at import."""
    from huggingface_hub import constants

    env = os.environ
    home = env.get("HF_HOME")
    cache = env.get("HF_HUB_CACHE") or (os.path.join(home, "hub") if home else constants.HF_HUB_CACHE)
    flag = (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").upper()
    return cache, constants.HF_HUB_OFFLINE or flag in {"1", "ON", "YES", "TRUE"}
