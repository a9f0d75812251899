"""The JSON Ollama's API answers with, built from the daemon's domain objects: a chat or generate answer
(one object, or NDJSON lines while streaming), its timing fields, and the model's description for
/api/tags, /api/show and /api/ps. Field names are those of Ollama's api/types.go.

Timings are nanoseconds, as Ollama's: total_duration from the request's arrival to the answer,
load_duration the conversation state's restore (the model itself stays loaded), prompt_eval_* the tokens
prefilled this turn (a prompt whose start came from a snapshot counts only the rest: reuse shows here, as it
does in Ollama's own prompt cache), eval_* the reply's tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from engramctl.daemon.context import Daemon
from engramctl.daemon.json_frame import Frame, slot
from engramctl.daemon.turn_json import engram_json, finish_reason
from engramctl.daemon.turn_result import TurnResult

# The Ollama API release whose shapes these routes follow (GET /api/version answers it)
OLLAMA_API_VERSION = "0.12.0"
NEVER = "9999-12-31T23:59:59Z"  # /api/ps expires_at: the model stays loaded while the daemon runs


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def _ns(ms: float | None) -> int:
    return int(round((ms or 0.0) * 1e6))


@dataclass
class Answer:
    """The objects of one /api/chat (chat=True) or /api/generate answer."""

    model: str
    chat: bool
    started_ns: int = field(default_factory=time.perf_counter_ns)
    _piece_frame: Frame | None = field(default=None, init=False, repr=False)

    def _base(self, done: bool) -> dict[str, Any]:
        return {"model": self.model, "created_at": now_iso(), "done": done}

    def _text(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}} if self.chat else {"response": text}

    def piece(self, text: str) -> dict[str, Any]:
        return {**self._base(False), **self._text(text)}

    def piece_line(self, text: str) -> str:
        """The NDJSON line of piece(text). A stream sends one a token, and only its time and text change: the
        rest of its JSON is made once (json_frame.py)."""
        if self._piece_frame is None:
            self._piece_frame = Frame({**self.piece(slot(1)), "created_at": slot(0)})
        return self._piece_frame.fill(now_iso(), text) + "\n"

    def final(self, r: TurnResult, text: str = "") -> dict[str, Any]:
        """The last object: `text` is the whole reply when not streaming (a stream sent it piece by piece);
        generate's also has the `context`, the token ids the reply state holds."""
        out = {
            **self._base(True),
            **self._text(text),
            "done_reason": finish_reason(r),
            "total_duration": time.perf_counter_ns() - self.started_ns,
            "load_duration": _ns(r.restore_ms),
            "prompt_eval_count": r.computed_tokens,
            "prompt_eval_duration": _ns(r.prefill_ms),
            "eval_count": r.completion_tokens,
            "eval_duration": _ns(r.decode_ms),
            "engram": engram_json(r),
        }
        if not self.chat:
            out["context"] = list(r.context)
        return out

    def idle(self, reason: str) -> dict[str, Any]:
        """Nothing to generate: Ollama's answer to a request that only loads ("load") or unloads the model."""
        out = {**self._base(True), **self._text(""), "done_reason": reason}
        return out | ({} if self.chat else {"context": []})


def _parameter_size(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "")
    return str(n)


def details(d: Daemon) -> dict[str, Any]:
    info = d.engine.info
    return {
        "parent_model": "",
        "format": "gguf" if info.backend == "llama.cpp" else "safetensors",
        "family": info.family,
        "families": [info.family],
        "parameter_size": _parameter_size(info.n_params),
        "quantization_level": info.weight_type or info.dtype,
    }


def model_entry(d: Daemon) -> dict[str, Any]:
    """The served model as /api/tags lists it."""
    info = d.engine.info
    return {
        "name": d.model_id,
        "model": d.model_id,
        "modified_at": iso(d.started),
        "size": info.weights_bytes,
        "digest": info.fingerprint,
        "details": details(d),
    }


def running_entry(d: Daemon) -> dict[str, Any]:
    """The served model as /api/ps lists it."""
    info = d.engine.info
    return {
        **model_entry(d),
        "expires_at": NEVER,
        "size_vram": info.weights_bytes if info.device.startswith("cuda") else 0,
        "context_length": info.context_length or 0,
    }


def show(d: Daemon, fim: bool) -> dict[str, Any]:
    """The served model as /api/show describes it: the chat template is the model's own (Jinja, not Go)."""
    from engramctl.engine.sampling_params import CHAT_DEFAULTS

    info = d.engine.info
    tok = d.engine.tokenizer
    template = getattr(tok, "chat_template", None) or getattr(getattr(tok, "hf", None), "chat_template", None)
    model_info: dict[str, Any] = {
        "general.architecture": info.family,
        "general.parameter_count": info.n_params,
        "general.file_type": info.weight_type or info.dtype,
    }
    if info.context_length:
        model_info[f"{info.family}.context_length"] = info.context_length
    return {
        "license": "",
        "modelfile": f"# served by engramctl\nFROM {d.model_id}\n",
        "parameters": "\n".join(f"{k} {v}" for k, v in CHAT_DEFAULTS.items()),
        "template": template if isinstance(template, str) else "",
        "details": details(d),
        "model_info": model_info,
        "capabilities": ["completion", "tools", *(["insert"] if fim else [])],  # tools: daemon/tool_chat.py
        "modified_at": iso(d.started),
    }
