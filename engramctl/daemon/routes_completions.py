"""POST /v1/completions: OpenAI's text completion (the legacy API editor plugins and scripts still use).

The prompt is completed as given, no chat template: a string or token ids, or with `suffix` the
fill-in-the-middle prompt of a model that has FIM tokens. Like a chat without a session, the turn starts
from the longest stored snapshot whose token ids are a prefix of the prompt's (a prompt that extends an
earlier one, or an earlier prompt plus its completion, reuses that state: usage.prompt_tokens_details.
cached_tokens says how much), and is snapshotted in its turn. The answer is OpenAI's `text_completion`
object, or its SSE chunks with stream: true; with `logprobs`, each choice (or chunk) carries its tokens'
logprobs in the legacy shape (logprobs_json.py).
"""

from __future__ import annotations

import uuid
from typing import Any, Sequence

from fastapi import APIRouter, Request

from engramctl.daemon import prompts
from engramctl.daemon.completion_schemas import CompletionBody
from engramctl.daemon.context import daemon_of
from engramctl.daemon.logprobs_json import LogprobText, TextOffsets
from engramctl.daemon.streaming import Completion, answer_turn
from engramctl.daemon.turn_json import engram_json, finish_reason, usage_json
from engramctl.daemon.turn_result import TurnResult
from engramctl.engine.logprobs import TokenLogprob
from engramctl.errors import UsageError

router = APIRouter()


class TextCompletion(Completion):
    """The `text_completion` objects of one answer, built where streaming.answer_turn asks a Completion for
    chat objects: a chat delta's content is the text; the stream's first chunk (the assistant role's) carries
    the echoed prompt, or nothing."""

    def __init__(self, model: str, fingerprint: str, echo: str | None, logprobs: LogprobText | None = None):
        super().__init__(model, fingerprint, logprobs)
        self.id = f"cmpl-{uuid.uuid4().hex[:24]}"
        self.echo = echo
        self._offsets = TextOffsets(len(echo or ""))  # a stream's: its chunks' text_offset run on

    def logprobs_json(self, entries: Sequence[TokenLogprob] | None, offsets: TextOffsets | None = None):
        if self.logprobs is None or entries is None:
            return None
        return self.logprobs.completion(entries, offsets or self._offsets)

    def _object(self, choices: list[dict], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
            **extra,
        }

    def response(self, r: TurnResult) -> dict[str, Any]:
        text = (self.echo or "") + r.text
        logprobs = self.logprobs_json(r.logprobs, TextOffsets(len(self.echo or "")))
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(r)}
        return self._object([choice], usage=usage_json(r), engram=engram_json(r))

    def chunk(
        self,
        delta: dict,
        finish_reason: str | None = None,
        entries: Sequence[TokenLogprob] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        text = (self.echo or "") if "role" in delta else delta.get("content", "")
        logprobs = self.logprobs_json(entries)
        return self._object([{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}], **extra)

    def usage_chunk(self, usage: dict | None = None, **extra: Any) -> dict[str, Any]:
        return self._object([], **({} if usage is None else {"usage": usage}), **extra)


@router.post("/v1/completions")
async def completions(body: CompletionBody, request: Request):
    d = daemon_of(request)
    prompt = body.prompt_one()
    if body.suffix is not None and body.echo:
        raise UsageError("suffix: cannot be used with echo (the prompt is not the start of the answer's text).")
    if body.logprobs is not None and body.echo:
        raise UsageError("logprobs: cannot be used with echo here (the prompt's tokens are not scored).")
    params = body.params()
    prompts.check_params(d.engine, params)  # a bad logit_bias id is a 400 now, not an error mid-stream
    echo = None
    if body.echo:
        if not isinstance(prompt, str):
            prompts.check_ids(d.engine, prompt, "prompt")  # before decoding them (an id past the vocabulary)
        echo = prompt if isinstance(prompt, str) else d.engine.tokenizer.decode(prompt, skip_special=False)

    def run(job):
        req = prompts.completion(d.engine, prompt, params, body.suffix)
        return d.service.complete(req, job)

    job = d.worker.submit(run, name="completion", turn=True)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    logprobs = None if body.logprobs is None else LogprobText(d.engine.tokenizer)
    completion = TextCompletion(d.model_id, d.engine.info.fingerprint, echo, logprobs)
    return await answer_turn(job, request, completion, body.stream, include_usage, trailer=False)
