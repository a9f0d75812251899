"""Ollama's API, so a client written for Ollama works by changing the address (and sending the token, or
with the ollama_no_token setting from loopback): /api/chat, /api/generate, /api/tags, /api/show, /api/ps,
/api/version. docs/ollama-api.md says what matches and what differs.

/api/chat is the same turn /v1/chat/completions makes without a session: the conversation the client resends
is rendered with the chat template and continues from the longest stored snapshot of it, so a second turn
prefills only its new messages (prompt_eval_count says how many tokens that took). /api/generate is a
completion of `prompt` (in the chat template unless `raw`, after the token ids of `context`), the same turn
/v1/completions makes; its answer's `context` is every token the state then holds, and a request that sends
it back continues from that state. Both stream NDJSON unless `stream` is false.
"""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator, Callable

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, StreamingResponse

from engramctl.daemon import prompts
from engramctl.daemon.context import Daemon, daemon_of
from engramctl.daemon.errors import body_for
from engramctl.daemon.json_frame import encode
from engramctl.daemon.ollama_answers import OLLAMA_API_VERSION, Answer, model_entry, running_entry, show
from engramctl.daemon.ollama_schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaShowRequest
from engramctl.daemon.sequence import Sequence
from engramctl.daemon.service import ChatRequest, CompletionRequest
from engramctl.daemon.streaming import SSE_HEADERS, first_event, job_result
from engramctl.engine.fim import fim_ids, infill_ids
from engramctl.engine.sampling_params import SamplingParams
from engramctl.errors import ContextOverflow

router = APIRouter()
NDJSON = "application/x-ndjson"


@router.get("/api/version")
async def version():
    return {"version": OLLAMA_API_VERSION}


@router.get("/api/tags")
async def tags(request: Request):
    return {"models": [model_entry(daemon_of(request))]}


@router.get("/api/ps")
async def ps(request: Request):
    return {"models": [running_entry(daemon_of(request))]}


@router.post("/api/show")
async def show_model(body: OllamaShowRequest, request: Request):
    d = daemon_of(request)
    d.check_model(_untagged(body.model or body.name or ""))
    return show(d, fim_ids(d.engine.tokenizer) is not None)


def _untagged(name: str) -> str:
    """An Ollama name's ":latest" tag is the only tag the served model has."""
    return name.removesuffix(":latest")


@router.post("/api/chat")
async def chat(body: OllamaChatRequest, request: Request):
    d = daemon_of(request)
    answer = Answer(d.model_id, chat=True)
    if not body.messages:  # Ollama's "load the model" (or, with keep_alive 0, "unload") request
        return JSONResponse(answer.idle("unload" if body.unload else "load"))
    if body.tools:  # the model may call tools: daemon/tool_chat.py
        from engramctl.daemon.tool_chat import ollama_chat_with_tools

        return await ollama_chat_with_tools(body, request, answer)
    messages = [m.plain() for m in body.messages]
    params = body.params()

    def run(job) -> Sequence:
        turn = lambda p: d.service.chat(ChatRequest(messages, None, p), job)  # noqa: E731
        return _within_context(turn, params)

    return await _answer(d, request, d.worker.submit(run, name="ollama-chat", turn=True), answer, body.stream)


@router.post("/api/generate")
async def generate(body: OllamaGenerateRequest, request: Request):
    d = daemon_of(request)
    answer = Answer(d.model_id, chat=False)
    if not body.prompt and not body.context and body.suffix is None:
        return JSONResponse(answer.idle("unload" if body.unload else "load"))
    params = body.params()

    def run(job) -> Sequence:
        def turn(p: SamplingParams) -> Sequence:
            return d.service.complete(_generate_prompt(d, body, p), job)

        return _within_context(turn, params)  # its result holds the reply state's token ids (the context)

    return await _answer(d, request, d.worker.submit(run, name="ollama-generate", turn=True), answer, body.stream)


def _within_context(turn: Callable[[SamplingParams], Sequence], params: SamplingParams) -> Sequence:
    """Ollama generates at most num_predict tokens and stops where the context ends; a num_predict past the
    context's room is therefore not an error: the turn is planned again with the room as its budget
    (planning changes nothing, so the first refusal cost only the check)."""
    try:
        return turn(params)
    except ContextOverflow:
        if params.max_tokens is None:
            raise
    return turn(dataclasses.replace(params, max_tokens=None))


def _generate_prompt(d: Daemon, body: OllamaGenerateRequest, params: SamplingParams) -> CompletionRequest:
    """The token ids of a generate request: `context`, then the prompt (FIM around `suffix`; in the chat
    template with `system` unless raw or the model has none)."""
    tok = d.engine.tokenizer
    prompts.check_ids(d.engine, body.context or [], "context")
    text = body.prompt
    if body.suffix is None and not body.raw and tok.has_chat_template:
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
            {"role": "user", "content": body.prompt}
        ]
        text = tok.render(messages, add_generation_prompt=True)
    elif body.system and not body.raw:
        text = f"{body.system}\n\n{text}"
    ids = tok.encode(text)
    if body.suffix is not None:
        ids = infill_ids(tok, ids, body.suffix)
    ids = list(body.context or []) + ids
    return prompts.completion(d.engine, ids, params)


async def _answer(d: Daemon, request: Request, job, answer: Answer, stream: bool):
    """One JSON object, or NDJSON lines once the turn has started (so that a refusal keeps its own status)."""
    if not stream:
        r = await job_result(job, request)
        return JSONResponse(answer.final(r, r.text))
    kind, value = await first_event(job, request)
    if kind == "done":  # not expected: a turn emits "start" first
        return JSONResponse(answer.final(value, value.text))
    return StreamingResponse(_lines(job, answer), media_type=NDJSON, headers=SSE_HEADERS)


def _line(obj: Any) -> str:
    return encode(obj) + "\n"


async def _lines(job, answer: Answer) -> AsyncIterator[str]:
    try:
        async for kind, value in job.events():
            if kind == "piece":
                yield answer.piece_line(value)
            elif kind == "done":
                yield _line(answer.final(value, ""))
            elif kind == "error":
                _, body = body_for(value)
                yield _line({"error": body["error"]["message"]})  # Ollama's mid-stream error: a string
    finally:
        job.cancel.set()  # the client went away mid-stream (or we are done: then it changes nothing)
