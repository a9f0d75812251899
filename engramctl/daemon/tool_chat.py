"""A chat turn whose request declares tools, on /v1/chat/completions (OpenAI's shapes) and /api/chat (Ollama's).

    tools = ToolRequest.of(body.tools, body.tool_choice, body.parallel_tool_calls)   # 400s name the field
    turn = await run_tool_turn(d, request, tools, messages, session, params)

The model is told about the tools in a system message (agent/calls.py, once per conversation) and the reply
is held to agent/tool_grammar.py's grammar: "auto" lets it answer in text or call, "required" makes it call,
a named function makes it call that one, "none" keeps it to text; every call it writes is well formed
and its arguments validate against the function's `parameters`. Calls to engram tools (agent/tools.py) run in
the conversation's session; the client's own functions are handed back, as OpenAI and Ollama do. The turn is
an ordinary turn: snapshotted, and a next request carrying the tool results continues from its state (the
calls, sent back in the history, render to the text the model generated: calls.assistant_text).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse, StreamingResponse

from engramctl.agent import calls as agent_calls
from engramctl.agent.text_before_calls import TextBeforeCalls
from engramctl.agent.tool_grammar import ToolChoice, check_tools, tool_choice, tool_grammar
from engramctl.agent.tools import error_json
from engramctl.daemon.context import daemon_of
from engramctl.daemon.dispatch import Dispatcher
from engramctl.daemon.errors import body_for
from engramctl.daemon.json_frame import encode
from engramctl.daemon.response_format import constrained
from engramctl.daemon.service import ChatRequest
from engramctl.daemon.streaming import SSE_HEADERS, Completion, first_event, job_result, sse
from engramctl.daemon.turn_json import engram_json, finish_reason, usage_json
from engramctl.daemon.turn_result import TurnResult
from engramctl.engine.sampling_params import SamplingParams
from engramctl.errors import ContextOverflow, EngramError, NotFound, ToolArgumentError, UsageError


@dataclass(frozen=True)
class ToolRequest:
    tools: agent_calls.RequestTools
    choice: ToolChoice
    parallel: bool

    @classmethod
    def of(cls, tools: Any, choice: Any, parallel: bool | None) -> ToolRequest:
        declared = agent_calls.request_tools(tools or [])
        return cls(declared, tool_choice(choice, declared), parallel is not False)

    def params(self, params: SamplingParams, format_field: str = "response_format") -> SamplingParams:
        """`params` with the grammar of the reply; a tool whose parameters the grammar cannot enforce is a 400
        naming it, before anything runs (not for "none": it calls nothing). A structured-output grammar already
        there (`format_field`) cannot be combined with the tools'."""
        if params.grammar is not None:
            err = UsageError(f"{format_field}: a JSON reply cannot be combined with tools on this server.")
            err.param = format_field
            raise err
        if self.choice.mode != "none":
            check_tools(self.tools)
        return constrained(params, lambda: tool_grammar(self.tools, self.choice, self.parallel), "tools")

    def messages(self, d, messages: list[dict], session: str | None) -> list[dict]:
        """The request's messages with the tools system message, whatever tool_choice says: a conversation's
        prompt stays the same from turn to turn, so each continues from the state the last one left."""
        transcript: list[dict] = []
        if session is not None:
            try:
                transcript = d.store.transcripts.of_session(session)
            except NotFound:
                pass
        return agent_calls.with_tools_message(messages, transcript, agent_calls.tools_message(self.tools))


@dataclass
class ToolTurn:
    """A finished turn: its result, the reply's text outside the calls, the calls, and (for engram tools the
    daemon ran) their results and ready-to-append tool messages."""

    result: TurnResult
    content: str
    calls: list[agent_calls.ParsedCall]
    tool_results: list[dict] = field(default_factory=list)
    tool_messages: list[dict] = field(default_factory=list)

    @property
    def ran(self) -> bool:
        return bool(self.tool_results)

    def engram(self) -> dict[str, Any]:
        ext = engram_json(self.result)
        if self.calls:
            ext["tool_results"], ext["tool_messages"] = self.tool_results, self.tool_messages
        return ext


def submit_tool_turn(
    d, tools: ToolRequest, messages: list[dict], session: str | None, params: SamplingParams, *, ollama: bool = False
):
    """The turn's job, submitted. `ollama`: Ollama's rules, a reply budget past the context's room becomes the
    room, and `format` is the structured-output field."""
    fmt = "format" if ollama else "response_format"
    chat = ChatRequest(messages=tools.messages(d, messages, session), session=session, params=tools.params(params, fmt))

    def run(job):
        try:
            return d.service.chat(chat, job)
        except ContextOverflow:
            if not ollama or chat.params.max_tokens is None:
                raise
        roomy = dataclasses.replace(chat, params=dataclasses.replace(chat.params, max_tokens=None))
        return d.service.chat(roomy, job)

    return d.worker.submit(run, name="chat", turn=True, session=chat.session)


async def finish_tool_turn(d, tools: ToolRequest, result: TurnResult) -> ToolTurn:
    """The finished reply's calls (parsed once it has ended), and the engram tools among them run."""
    if tools.choice.mode == "none":
        return ToolTurn(result, result.text, [])
    content, parsed = agent_calls.parse_tool_calls(result.text, tools.tools.names)
    turn = ToolTurn(result, content, parsed)
    if parsed:
        turn.tool_results, turn.tool_messages = await _execute(d, parsed, tools.tools, result.session)
    return turn


async def run_tool_turn(
    d,
    request: Request,
    tools: ToolRequest,
    messages: list[dict],
    session: str | None,
    params: SamplingParams,
    *,
    ollama: bool = False,
) -> ToolTurn:
    """Run the turn to its end, then the engram tools it called (a reply that is not streamed)."""
    job = submit_tool_turn(d, tools, messages, session, params, ollama=ollama)
    return await finish_tool_turn(d, tools, await job_result(job, request))


async def _execute(d, parsed, tools, session: str | None) -> tuple[list[dict], list[dict]]:
    results, messages = [], []
    dispatcher = Dispatcher(d)
    for call in parsed:
        if call.name not in tools.engram:
            continue  # the client's own function: it runs it
        try:
            if call.error is not None:
                raise ToolArgumentError(call.error, "arguments")
            result = await dispatcher.call(call.name, call.arguments, session=session)
            results.append({"tool_call_id": call.id, "name": call.name, "ok": True, "result": result})
            messages.append(agent_calls.tool_message(call, result))
        except EngramError as e:
            err = error_json(e)
            results.append({"tool_call_id": call.id, "name": call.name, "ok": False, "error": err})
            messages.append(agent_calls.tool_message(call, {"error": err}))
    return results, messages


# -- /v1/chat/completions ----------------------------------------------------------------------------------
async def chat_with_tools(body, request: Request):
    """A chat completion whose request declares tools, answered in OpenAI's shapes. Streamed, the reply's text
    goes out as it is written (text_before_calls.py), its calls in one delta once the reply has ended."""
    d = daemon_of(request)
    tools = ToolRequest.of(body.tools, body.tool_choice, body.parallel_tool_calls)
    messages = agent_calls.plain_messages(body.messages)
    completion = Completion(d.model_id, d.engine.info.fingerprint)
    if body.stream:
        job = submit_tool_turn(d, tools, messages, body.session_name, body.params())
        await first_event(job, request)  # a refusal keeps its own HTTP status ("start" comes first)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _sse(d, job, tools, completion, include_usage, body.session_name is not None)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    turn = await run_tool_turn(d, request, tools, messages, body.session_name, body.params())
    response = completion.response(turn.result)
    if turn.calls:
        response["choices"][0]["message"] = {
            "role": "assistant",
            "content": turn.content or None,
            "tool_calls": [c.openai() for c in turn.calls],
        }
        response["choices"][0]["finish_reason"] = "tool_calls"
        response["engram"] = turn.engram()
    return JSONResponse(response)


async def _streamed(d, job, tools: ToolRequest):
    """The turn's stream in the terms both APIs answer in: ("text", what of the reply can go out now), then
    ("turn", the finished ToolTurn, its engram tools run), or ("error", the exception)."""
    text = TextBeforeCalls()
    async for kind, value in job.events():
        if kind == "piece" and (piece := text.feed(str(value))):
            yield "text", piece
        elif kind == "done":
            turn = await finish_tool_turn(d, tools, value)
            if rest := text.rest(turn.content):
                yield "text", rest
            yield "turn", turn
        elif kind == "error":
            yield "error", value


async def _sse(d, job, tools: ToolRequest, completion: Completion, include_usage: bool, session: bool):
    """The turn as SSE chunks, ending as streaming.py's: the finish, then (for a session, usage asked for, or
    tools the daemon ran: their results) the chunk without choices with the `engram` object."""
    events = _streamed(d, job, tools)
    try:
        yield sse(completion.chunk({"role": "assistant", "content": ""}))
        async for kind, value in events:
            if kind == "text":
                yield completion.text_sse(value)
            elif kind == "turn":
                if value.calls:
                    deltas = [{"index": i, **c.openai()} for i, c in enumerate(value.calls)]
                    yield sse(completion.chunk({"tool_calls": deltas}))
                yield sse(completion.chunk({}, "tool_calls" if value.calls else finish_reason(value.result)))
                if session or value.ran or include_usage:
                    usage = usage_json(value.result) if include_usage else None
                    yield sse(completion.usage_chunk(usage, engram=value.engram()))
                yield "data: [DONE]\n\n"
            else:
                yield sse(body_for(value)[1])
                yield "data: [DONE]\n\n"
    finally:
        await events.aclose()
        job.cancel.set()  # the client went away mid-stream (or we are done: then it changes nothing)


# -- /api/chat -----------------------------------------------------------------------------------------------
async def ollama_chat_with_tools(body, request: Request, answer):
    """/api/chat with tools, answered in Ollama's shapes: `message.tool_calls` ([{"function": {"index", "name",
    "arguments": {...}}}]), done_reason "stop". Streamed as NDJSON: the reply's text as it is written, then one
    message line with the calls, then the done line."""
    d = daemon_of(request)
    tools = ToolRequest.of(body.tools, body.choice, body.parallel_tool_calls)
    messages = [m.plain() for m in body.messages]
    if body.stream:
        job = submit_tool_turn(d, tools, messages, None, body.params(), ollama=True)
        await first_event(job, request)  # a refusal keeps its own HTTP status
        return StreamingResponse(_ndjson(d, job, tools, answer), media_type="application/x-ndjson", headers=SSE_HEADERS)
    turn = await run_tool_turn(d, request, tools, messages, None, body.params(), ollama=True)
    final = answer.final(turn.result, turn.content)
    if turn.calls:
        final["engram"] = turn.engram()
        final["message"]["tool_calls"] = _ollama_calls(turn)
    return JSONResponse(final)


def _ollama_calls(turn: ToolTurn) -> list[dict]:
    return [
        {"id": c.id, "function": {"index": i, "name": c.name, "arguments": c.arguments or {}}}
        for i, c in enumerate(turn.calls)
    ]


async def _ndjson(d, job, tools: ToolRequest, answer):
    events = _streamed(d, job, tools)
    try:
        async for kind, value in events:
            if kind == "text":
                yield answer.piece_line(value)
            elif kind == "turn":
                final = answer.final(value.result, "")
                if value.calls:
                    final["engram"] = value.engram()
                    message = {"role": "assistant", "content": "", "tool_calls": _ollama_calls(value)}
                    yield encode({**answer.piece(""), "message": message}) + "\n"
                yield encode(final) + "\n"
            else:
                yield encode({"error": body_for(value)[1]["error"]["message"]}) + "\n"  # Ollama's: a string
    finally:
        await events.aclose()
        job.cancel.set()
