"""One streaming chat request, timed as the client sees it: `stream_chat(client, server, messages, sampling)`.

Times are taken when each SSE chunk arrives (perf_counter, right after the bytes are parsed). ms/token after
the first is (the chunk that ends the reply - the first chunk with text) / (completion_tokens - 1): counting
chunks instead would flatter whichever server held back more pieces (a token ending inside a UTF-8
character waits for the next one; random-weight models sample many such). The end is where the client sees
it: engramctl sends the chunk with the finish_reason as soon as generation stops, before its settle step
(one more decode, so the state holds the last token), the state capture and the snapshot commit, whose
snapshot id follows in a trailing chunk (daemon/streaming.py). Token counts and reuse come from each server's own
report: `usage` (engramctl, and llama-server with include_usage) and llama-server's `timings.cache_n` where
its usage has no `prompt_tokens_details`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from engramctl.bench.serve.servers import Server

# `engramctl chat`'s defaults (Ollama's): what "sampled" means in this bench. llama-server also gets what it
# would otherwise add on its own (min_p 0.05, a repeat window of its own) so both run the same sampler.
CHAT_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1}
PEER_EXTRA = {"min_p": 0.0, "repeat_last_n": 64, "typical_p": 1.0}
GREEDY = {"temperature": 0.0}


@dataclass(frozen=True)
class Reply:
    text: str
    ttft_s: float  # request sent -> first chunk with text
    chunk_times_s: tuple[float, ...]  # arrival of each chunk with text, from the request
    end_s: float  # arrival of the chunk with the finish_reason, from the request
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None

    @property
    def ms_per_token(self) -> float | None:
        """First text to the end of the reply, per token after the first: the decode rate the client sees."""
        n = self.completion_tokens
        return None if not n or n < 2 else (self.end_s - self.ttft_s) * 1000 / (n - 1)


def request_body(server: Server, messages: list[dict], sampling: dict, max_tokens: int, seed: int) -> dict:
    body: dict[str, Any] = {"model": "bench", "messages": messages, "stream": True, "max_tokens": max_tokens}
    body |= {"stream_options": {"include_usage": True}, "seed": seed, **sampling}
    if server.name == "llama-server" and sampling.get("temperature", 0) > 0:
        body |= PEER_EXTRA
    return body


def stream_chat(
    client: httpx.Client, server: Server, messages: list[dict], sampling: dict, max_tokens: int, seed: int = 0
) -> Reply:
    body = request_body(server, messages, sampling, max_tokens, seed)
    text: list[str] = []
    times: list[float] = []
    usage: dict = {}
    timings: dict = {}
    finish = None
    end = None
    t0 = time.perf_counter()
    with client.stream("POST", server.url + "/v1/chat/completions", json=body, headers=server.headers) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{server.name} answered {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            obj = json.loads(data)
            for choice in obj.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    times.append(time.perf_counter() - t0)
                    text.append(piece)
                if choice.get("finish_reason") and end is None:
                    end = time.perf_counter() - t0
                finish = choice.get("finish_reason") or finish
            usage = obj.get("usage") or usage
            timings = obj.get("timings") or timings
    if not times:
        raise RuntimeError(f"{server.name} streamed no text (finish_reason {finish!r}, usage {usage})")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None and "cache_n" in timings:
        cached = int(timings["cache_n"])
    return Reply(
        text="".join(text),
        ttft_s=times[0],
        chunk_times_s=tuple(times),
        end_s=end if end is not None else times[-1],
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=cached,
        completion_tokens=usage.get("completion_tokens"),
        finish_reason=finish,
    )
