"""What `engramctl bench` runs (BenchConfig, built by cli/bench.py) and what it tells its caller (Progress)."""

from __future__ import annotations

from dataclasses import dataclass

from engramctl.errors import UsageError

MiB = 1 << 20


@dataclass(frozen=True)
class BenchConfig:
    contexts: tuple[int, ...] = (256, 1024, 4096)
    turns: int = 20
    runs: int = 3
    reply_tokens: int = 16
    message_tokens: int = 32
    seed: int = 0
    quick: bool = False
    model: str | None = None  # --model reference (directory, .gguf, hub id); None = preset
    preset: str | None = None
    backend: str = "auto"  # auto | transformers | llama.cpp; a preset on llama.cpp runs as a converted GGUF
    gguf_type: str = "f16"  # a preset's GGUF weight type on llama.cpp: f16 | q8_0 | f32
    prefill_tokens: int = 512  # speed workload: prefill N, then decode M tokens; 0 skips it
    decode_tokens: int = 64
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    memcpy_bytes: int = 256 * MiB
    disk_bytes: int = 256 * MiB
    wait_idle_s: float = 0.0
    keep_data: bool = False
    command: str = "engramctl bench"

    def validate(self) -> None:
        if not self.contexts and self.turns == 0 and self.prefill_tokens == 0:
            raise UsageError("nothing to run: give --contexts, --turns and/or --prefill-tokens.")
        if any(c < 1 for c in self.contexts):
            raise UsageError("every context length must be at least 1 token.")
        if self.runs < 1:
            raise UsageError("--runs must be at least 1.")
        if self.turns < 0 or self.reply_tokens < 1:
            raise UsageError("--turns must be >= 0 and --reply-tokens >= 1.")
        if self.prefill_tokens < 0 or self.decode_tokens < 1:
            raise UsageError("--prefill-tokens must be >= 0 and --decode-tokens >= 1.")


class Progress:
    """What the runner tells its caller; the CLI draws rich progress bars on stderr from it."""

    def phase(self, key: str, description: str, total: int) -> None: ...

    def advance(self, key: str, description: str | None = None) -> None: ...

    def note(self, text: str) -> None: ...


def engine_flags(threads: int | None, device: str, dtype: str) -> list[str]:
    """The engine's options as a reproduce command repeats them: only where they are not the defaults."""
    parts = ["--threads", str(threads)] if threads else []
    if device != "auto":
        parts += ["--device", device]
    if dtype != "auto":
        parts += ["--dtype", dtype]
    return parts
