"""OpenAI-compatible routes: GET /v1/models, POST /v1/chat/completions (/v1/completions: routes_completions.py).

The daemon serves one model, so a chat request's `model` names it whatever it says (as llama-server
does: clients written for another server send their own names); the answer's `model` is the served one.
GET /v1/models/{id} still answers only for the names of the served model. A chat's `session` may also be
called `conversation_id`, the original Engram server's name for it."""

from __future__ import annotations

from fastapi import APIRouter, Request

from engramctl.daemon.context import daemon_of
from engramctl.daemon.logprobs_json import LogprobText
from engramctl.daemon.prompts import check_params
from engramctl.daemon.schemas import ChatCompletionRequest
from engramctl.daemon.service import ChatRequest
from engramctl.daemon.streaming import Completion, answer_turn

router = APIRouter()


def _model_card(request: Request) -> dict:
    d = daemon_of(request)
    info = d.engine.info
    return {
        "id": d.model_id,
        "object": "model",
        "created": int(d.started),
        "owned_by": "engramctl",
        "engram": {
            "family": info.family,
            "device": info.device,
            "dtype": info.dtype,
            "context_length": info.context_length,
            "fingerprint": info.fingerprint,
        },
    }


@router.get("/v1/models")
async def list_models(request: Request):
    return {"object": "list", "data": [_model_card(request)]}


@router.get("/v1/models/{model:path}")
async def get_model(model: str, request: Request):
    daemon_of(request).check_model(model)
    return _model_card(request)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    d = daemon_of(request)
    body.check_reply_room(d.engine.info.context_length)
    if body.tools:  # the model may call tools: engramctl/agent/calls.py
        from engramctl.daemon.tool_chat import chat_with_tools

        return await chat_with_tools(body, request)
    params = body.params()
    check_params(d.engine, params)  # a logit_bias token the model lacks is a 400 now, not an error mid-stream
    chat = ChatRequest(messages=[m.plain() for m in body.messages], session=body.session_name, params=params)
    job = d.worker.submit(lambda job: d.service.chat(chat, job), name="chat", turn=True, session=chat.session)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    logprobs = LogprobText(d.engine.tokenizer) if body.logprobs else None
    completion = Completion(d.model_id, d.engine.info.fingerprint, logprobs)
    return await answer_turn(job, request, completion, body.stream, include_usage, trailer=chat.session is not None)
