"""The tool definitions (one source for every transport), argument validation that names the field,
and the parser of tool calls written by the model. No model, no daemon."""

from __future__ import annotations

import json

import pytest

from engramctl.agent import calls
from engramctl.agent.arguments import validate_arguments
from engramctl.agent.schema_check import check
from engramctl.agent.tools import STATE_TOOLS, TOOLS, openai_tools, result_schemas
from engramctl.errors import ToolArgumentError, UnknownTool

# For every tool: arguments that are valid, and bad ones with the field the error must name.
VALID = {
    "checkpoint": {"session": "s", "label": "before step 3"},
    "branch": {"source": "s", "new_session": "s-alt", "checkpoint": "before step 3"},
    "restore": {"session": "s", "checkpoint": "before step 3"},
    "list_checkpoints": {"session": "s", "include_turns": True},
    "delete_checkpoint": {"id": "0123abcd"},
    "session_info": {"session": "s"},
    "chat": {"session": "s", "message": "hi", "temperature": 0, "max_tokens": 4, "stop": ["\n"], "seed": 1},
}
BAD = {
    "checkpoint": [
        ({}, "session"),
        ({"session": 5}, "session"),
        ({"session": "a b"}, "session"),
        ({"session": ".."}, "session"),
        ({"session": "s", "label": ""}, "label"),
        ({"session": "s", "label": "x\ny"}, "label"),
        ({"session": "s", "label": "x" * 129}, "label"),
        ({"session": "s", "lable": "typo"}, "lable"),
    ],
    "branch": [
        ({"new_session": "b"}, "source"),
        ({"source": "s"}, "new_session"),
        ({"source": "s", "new_session": "no/slash"}, "new_session"),
        ({"source": 1, "new_session": "b"}, "source"),
        ({"source": "s", "new_session": "b", "checkpoint": ""}, "checkpoint"),
    ],
    "restore": [
        ({"session": "s"}, "checkpoint"),
        ({"checkpoint": "x"}, "session"),
        ({"session": "s", "checkpoint": ["x"]}, "checkpoint"),
    ],
    "list_checkpoints": [({}, "session"), ({"session": "s", "include_turns": "yes"}, "include_turns")],
    "delete_checkpoint": [
        ({}, "id"),
        ({"id": "xyz!"}, "id"),
        ({"id": "abc"}, "id"),
        ({"id": 1234}, "id"),
        ({"id": "abcd", "force": True}, "force"),
    ],
    "session_info": [({}, "session"), ({"session": None}, "session"), ({"session": "s" * 65}, "session")],
    "chat": [
        ({"session": "s"}, "message"),
        ({"session": "s", "message": ""}, "message"),
        ({"session": "s", "message": "m", "temperature": 3}, "temperature"),
        ({"session": "s", "message": "m", "temperature": "hot"}, "temperature"),
        ({"session": "s", "message": "m", "max_tokens": 0}, "max_tokens"),
        ({"session": "s", "message": "m", "max_tokens": 2.5}, "max_tokens"),
        ({"session": "s", "message": "m", "max_tokens": True}, "max_tokens"),
        ({"session": "s", "message": "m", "top_p": 0}, "top_p"),
        ({"session": "s", "message": "m", "stop": ["a", 1]}, "stop[1]"),
    ],
}


def test_every_tool_is_defined_once_with_schemas():
    assert list(TOOLS) == [
        "checkpoint",
        "branch",
        "restore",
        "list_checkpoints",
        "delete_checkpoint",
        "session_info",
        "chat",
    ]
    assert set(VALID) == set(TOOLS) == set(BAD)
    assert "chat" not in STATE_TOOLS and len(STATE_TOOLS) == 6
    for fn in openai_tools():
        assert fn["type"] == "function" and set(fn["function"]) == {"name", "description", "parameters"}
        params = fn["function"]["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
        json.dumps(fn)
    assert [t["function"]["name"] for t in openai_tools(include_chat=True)][-1] == "chat"
    for name, schema in result_schemas(include_chat=True).items():
        assert schema["type"] == "object" and set(schema["required"]) == set(schema["properties"]), name
    # contextual schemas (WebSocket, MCP) let the conversation's session stand in
    assert "session" not in TOOLS["checkpoint"].input_schema(contextual=True)["required"]
    assert "source" not in TOOLS["branch"].input_schema(contextual=True)["required"]
    assert "session" in TOOLS["checkpoint"].parameters["required"]  # the canonical schema is untouched


@pytest.mark.parametrize("name", list(TOOLS))
def test_valid_arguments_pass(name):
    assert validate_arguments(name, VALID[name]) == VALID[name]
    assert validate_arguments(name, json.dumps(VALID[name])) == VALID[name]  # OpenAI's JSON-string form


@pytest.mark.parametrize("name,args,field", [(n, a, f) for n, cases in BAD.items() for a, f in cases])
def test_bad_arguments_name_the_field(name, args, field):
    with pytest.raises(ToolArgumentError) as e:
        validate_arguments(name, args)
    assert e.value.param == field
    assert e.value.message.startswith(f"{field}: ")
    assert e.value.kind == "invalid_arguments"


def test_arguments_shape_unknown_tools_and_context_session():
    for bad in ("{not json", "[1]", 3):
        with pytest.raises(ToolArgumentError) as e:
            validate_arguments("session_info", bad)
        assert e.value.param == "arguments"
    with pytest.raises(UnknownTool) as e:
        validate_arguments("rm_rf", {})
    assert "checkpoint" in e.value.message and e.value.param == "tool"
    assert validate_arguments("checkpoint", {"label": "a"}, session="conv") == {"session": "conv", "label": "a"}
    assert validate_arguments("checkpoint", {"session": "mine"}, session="conv") == {"session": "mine"}
    assert validate_arguments("branch", {"new_session": "b"}, session="conv") == {"source": "conv", "new_session": "b"}
    assert validate_arguments("delete_checkpoint", {"id": "abcd"}, session="conv") == {"id": "abcd"}
    assert validate_arguments("checkpoint", {"session": "s", "label": None}) == {"session": "s"}  # null = left out


def test_result_schemas_validate_what_the_tools_return():
    result = {
        "snapshot_id": "a" * 32,
        "session": "s",
        "label": None,
        "pinned": True,
        "tokens": 3,
        "n_messages": 2,
        "created": 1.5,
    }
    check(TOOLS["checkpoint"].returns, result, "")
    with pytest.raises(ToolArgumentError):
        check(TOOLS["checkpoint"].returns, {**result, "tokens": "3"}, "")


# -- tool calls in the model's reply -------------------------------------------------------------------------
NAMES = {"checkpoint", "restore", "get_weather"}


@pytest.mark.parametrize(
    "text,content",
    [
        ('<tool_call>\n{"name": "checkpoint", "arguments": {"label": "a"}}\n</tool_call>', ""),
        ('Saving first.\n<tool_call>{"name": "checkpoint", "arguments": {"label": "a"}}</tool_call>', "Saving first."),
        ('<tool_call>{"name": "checkpoint", "arguments": {"label": "a"}}', ""),  # stopped before the closing tag
        ('{"name": "checkpoint", "arguments": {"label": "a"}}', ""),
        ('```json\n{"name": "checkpoint", "parameters": {"label": "a"}}\n```', ""),
        ('[TOOL_CALLS][{"name": "checkpoint", "arguments": "{\\"label\\": \\"a\\"}"}]', ""),
        ('I will call {"name": "checkpoint", "arguments": {"label": "a"}} now.', "I will call  now."),
        ('{"type": "function", "function": {"name": "checkpoint", "arguments": {"label": "a"}}}', ""),
    ],
)
def test_parse_common_formats(text, content):
    rest, found = calls.parse_tool_calls(text, NAMES)
    assert rest == content
    assert [(c.name, c.arguments, c.error) for c in found] == [("checkpoint", {"label": "a"}, None)]
    assert json.loads(found[0].raw_arguments) == {"label": "a"}
    assert found[0].openai()["function"] == {"name": "checkpoint", "arguments": found[0].raw_arguments}
    assert found[0].id.startswith("call_")


def test_parse_several_calls_unknown_names_and_plain_text():
    text = (
        '<tool_call>{"name": "checkpoint", "arguments": {}}</tool_call>\n'
        '<tool_call>[{"name": "restore", "arguments": {"checkpoint": "a"}}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_call>'
    )
    rest, found = calls.parse_tool_calls(text, NAMES)
    assert rest == "" and [c.name for c in found] == ["checkpoint", "restore", "get_weather"]
    assert len({c.id for c in found}) == 3
    for plain in ("Hello there.", '{"name": "rm", "arguments": {}}', '{"a": 1}', "", "<tool_call>not json"):
        assert calls.parse_tool_calls(plain, NAMES) == (plain, [])
    assert calls.parse_tool_calls('{"name": "checkpoint", "arguments": {}}', set()) == (
        '{"name": "checkpoint", "arguments": {}}',
        [],
    )
    _, (bad,) = calls.parse_tool_calls('{"name": "checkpoint", "arguments": "{oops"}', NAMES)
    assert bad.arguments is None and bad.error.startswith("arguments: not valid JSON")


def test_request_tools_prompt_and_messages():
    tools = calls.request_tools(openai_tools() + [{"type": "function", "function": {"name": "get_weather"}}])
    assert tools.engram == frozenset(STATE_TOOLS) and tools.client == {"get_weather"}
    prompt = calls.tools_message(tools)
    assert prompt["role"] == "system" and "<tools>" in prompt["content"] and '"name": "checkpoint"' in prompt["content"]
    for bad, where in (
        ([{"type": "retrieval"}], "tools[0]"),
        ([{"function": {"name": "a b"}}], "tools[0].function.name"),
        ([{"function": {"name": "x"}}, {"function": {"name": "x"}}], "tools[1].function.name"),
    ):
        with pytest.raises(Exception) as e:
            calls.request_tools(bad)
        assert str(e.value).startswith(where)
    user = {"role": "user", "content": "hi"}
    assert calls.with_tools_message([user], [], prompt) == [prompt, user]
    assert calls.with_tools_message([prompt, user], [], prompt) == [prompt, user]  # already there
    stored = [prompt, user, {"role": "assistant", "content": "yo"}]
    assert calls.with_tools_message([user], stored, prompt) == [user]  # the session has it
    old = [user, {"role": "assistant", "content": "yo"}]
    assert calls.with_tools_message(old + [user], old, prompt) == old + [prompt, user]  # full history resent


def test_plain_messages_show_the_model_its_calls():
    from engramctl.daemon.schemas import ChatMessage

    msgs = [
        ChatMessage.model_validate(m)
        for m in (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "checkpoint", "arguments": '{"label": "a"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"snapshot_id": "x"}'},
        )
    ]
    first, second = calls.plain_messages(msgs)
    assert first == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "checkpoint", "arguments": {"label": "a"}}\n</tool_call>',
    }
    assert second == {"role": "tool", "content": '{"snapshot_id": "x"}'}
    # what the model is shown parses back to the same call
    assert [(c.name, c.arguments) for c in calls.parse_tool_calls(first["content"], NAMES)[1]] == [
        ("checkpoint", {"label": "a"})
    ]
