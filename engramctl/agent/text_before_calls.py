"""The text of a reply that may go on to call tools, sent to the user as the model writes it.

Under tool_grammar.py's grammar a reply is text, then (maybe) calls that start at calls.TOOL_CALL_OPEN and end
it. While it is being written, each piece of text can go out at once except what could still be the start of
that tag, and whitespace that would end the text if a call follows (parse_tool_calls strips the text around
calls); nothing from the tag on is text. A reply that opens like a call written without the tag (JSON, a code
fence: calls.parse_tool_calls reads those as calls too) is held whole until it ends. What went out is a prefix
of the reply's content, so a stream never takes back a character; `rest(content)` is what the end adds.
"""

from __future__ import annotations

from engramctl.agent.calls import TOOL_CALL_OPEN

_BARE_CALL_OPENINGS = ("{", "[", "`")  # a JSON call, a list of them ("[TOOL_CALLS]" too), a fenced one


class TextBeforeCalls:
    def __init__(self) -> None:
        self.text = ""  # everything fed
        self.sent = 0  # characters of it handed out
        self.calling = False  # the tag has been written: no more text

    def feed(self, piece: str) -> str:
        """The text that can go out now that `piece` has been generated ("" while it is held back)."""
        self.text += piece
        if self.calling:
            return ""
        opening = self.text.lstrip()[:1]
        if not self.sent and (not opening or opening in _BARE_CALL_OPENINGS):
            return ""  # nothing but whitespace yet, or it may be a call without the tag: held until the end
        at = self.text.find(TOOL_CALL_OPEN, max(0, self.sent - len(TOOL_CALL_OPEN)))
        if at >= 0:
            self.calling = True
            return self._send(len(self.text[:at].rstrip()))
        end = len(self.text) - _tag_start(self.text)
        return self._send(len(self.text[:end].rstrip()))

    def rest(self, content: str) -> str:
        """At the reply's end: what of `content` (the reply's text outside its calls, as parsed) has not gone out
        ("" if what went out is not its start, which the rules above prevent)."""
        sent = self.text[: self.sent]
        return content[len(sent) :] if content.startswith(sent) else ""

    def _send(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : upto], upto
        return out


def _tag_start(text: str) -> int:
    """How many of `text`'s last characters could be the start of the opening tag."""
    for k in range(min(len(text), len(TOOL_CALL_OPEN) - 1), 0, -1):
        if text.endswith(TOOL_CALL_OPEN[:k]):
            return k
    return 0
