"""How many bytes of the model's weights are resident in this process.

A transformers model holds its parameters in the process's own memory: all of weights_bytes is
resident. llama.cpp memory-maps the GGUF file: its weights are page-cache pages mapped into the
process, resident once touched (a warm-up touches every one). /proc/self/smaps says how many of the
file's pages this process has mapped in (Rss of the mappings of that path); None where there is no smaps.
"""

from __future__ import annotations

from pathlib import Path

SMAPS = Path("/proc/self/smaps")


def mapped_rss_bytes(path: Path) -> int | None:
    """Resident bytes of this process's mappings of `path`, or None when the platform cannot say."""
    target = str(Path(path).resolve())
    try:
        text = SMAPS.read_text()
    except OSError:
        return None
    total, inside = 0, False
    for line in text.splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):  # a mapping's header line
            inside = len(head) == 6 and head[5] == target
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024  # kB
    return total


def resident_weight_bytes(engine, gguf: Path | None) -> dict:
    """{"bytes", "how"}: measured for a memory-mapped GGUF, the parameters' size for transformers."""
    if engine.info.backend == "llama.cpp" and gguf is not None:
        mapped = mapped_rss_bytes(gguf)
        if mapped is not None:
            return {"bytes": mapped, "how": "mmap of the GGUF, resident pages (/proc/self/smaps)"}
        return {"bytes": None, "how": "mmap of the GGUF; this platform has no /proc/self/smaps"}
    return {"bytes": engine.info.weights_bytes, "how": "parameters in process memory"}
