"""agent/text_before_calls.py: what of a reply being written can be streamed before its tool calls."""

from __future__ import annotations

import pytest

from engramctl.agent.calls import TOOL_CALL_OPEN, parse_tool_calls
from engramctl.agent.text_before_calls import TextBeforeCalls

CALL = TOOL_CALL_OPEN + '\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def _stream(reply: str, sizes: int) -> tuple[list[str], str]:
    t = TextBeforeCalls()
    out = [t.feed(reply[i : i + sizes]) for i in range(0, len(reply), sizes)]
    return out, t.rest(parse_tool_calls(reply, {"get_weather"})[0])


@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
@pytest.mark.parametrize(
    "reply",
    [
        "It is sunny.",
        "Let me look.\n\n" + CALL,
        CALL,
        "Use <b>bold</b> or <tool> tags.",
        "Ends with <tool_c",
        "a  ",
        '  {"name": "get_weather", "arguments": {"city": "Oslo"}}',  # a call without the tag
        '```json\n{"name": "get_weather", "arguments": {}}\n```',
        '{"answer": 42}',  # JSON that calls nothing: held, then all of it
    ],
)
def test_what_goes_out_is_the_replys_text_and_only_it(reply, size):
    pieces, rest = _stream(reply, size)
    content, calls = parse_tool_calls(reply, {"get_weather"})
    assert "".join(pieces) + rest == content  # whatever the pieces' sizes
    assert bool(calls) == (TOOL_CALL_OPEN in reply or "get_weather" in reply)


def test_text_goes_out_as_it_comes_and_only_a_possible_tag_is_held():
    t = TextBeforeCalls()
    assert t.feed("Hello") == "Hello"
    assert t.feed(" wor") == " wor"
    assert t.feed("ld <tool") == "ld"  # " <tool" may be the tag: held
    assert t.feed("box>") == " <toolbox>"  # it was not
    assert t.feed("\n") == ""  # whitespace that would end the text before a call
    assert t.feed(TOOL_CALL_OPEN[:3]) == ""
    assert t.feed(TOOL_CALL_OPEN[3:] + '{"name"') == "" and t.calling
    assert t.feed(" more") == "" and t.text.startswith("Hello world <toolbox>\n" + TOOL_CALL_OPEN)


def test_a_reply_that_opens_like_a_bare_call_is_held_until_it_ends():
    t = TextBeforeCalls()
    assert t.feed(" ") == "" and t.feed('{"name": "get_weather", ') == "" and t.feed('"arguments": {}}') == ""
    assert t.rest("") == ""  # parsed as a call: no content
    t = TextBeforeCalls()
    assert t.feed(" Sure") == " Sure"  # leading whitespace goes with the first word
