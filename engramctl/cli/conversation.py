"""The conversation model of `engramctl chat`: what it needs from the daemon (`ChatLink`) and one conversation
(`ChatSession`: sends turns, streams the reply, keeps the numbers for /stats). The command is chat.py's, the
interactive loop repl.py's; both use this, and this uses neither.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Protocol

from engramctl.cli.output import Output, count
from engramctl.errors import EngramError


class ChatLink(Protocol):
    """What a chat needs from the daemon (chatlink.DaemonChatLink implements it over the client)."""

    model_id: str

    def open_session(self, session: str) -> dict | None: ...  # restore its head: None if no such session
    def stream(self, session: str, messages: list[dict], sampling: dict) -> Iterator[dict]: ...
    def save(self, session: str, label: str | None) -> dict: ...
    def branch(self, session: str, new_session: str) -> dict: ...
    def transcript(self, session: str) -> list[dict]: ...
    def reset(self, session: str) -> dict | None: ...  # start over, snapshots kept: {kept_snapshots, ...}; None if new
    def snapshot(self, snapshot_id: str) -> dict: ...
    def head(self, session: str) -> dict | None: ...  # the snapshot the session continues from now
    def settle(self, timeout: float = 5.0) -> None: ...  # after Ctrl-C: wait until the daemon recorded the turn


class ChatSession:
    """One conversation: sends turns, streams the reply to stdout, keeps the numbers for /stats.

    Stream events (from ChatLink.stream): {"type": "start", "engram": {...}},
    {"type": "token", "text": "..."}, {"type": "done", "finish_reason", "usage", "engram"}."""

    def __init__(
        self,
        link: ChatLink,
        out: Output,
        session: str,
        *,
        system: str | None = None,
        sampling: dict | None = None,
        events: bool = False,
    ):
        self.link, self.out, self.session = link, out, session
        self.system = system
        self.sampling = dict(sampling or {})
        self.events = events  # NDJSON on stdout instead of text
        self.turns = 0
        self.last: dict[str, Any] = {}
        self.header_shown = False
        self.fresh = True  # no messages sent in this session yet (a --system prompt goes first)

    # -- header --------------------------------------------------------------------------------------
    def header(self, ext: dict | None) -> None:
        """`model · session · new session | resumed N tokens from TIER in X ms` on stderr, once."""
        if self.header_shown or not self.out.human:
            self.header_shown = True
            return
        self.header_shown = True
        self.out.dim(f"{self.link.model_id} · session {self.session} · {describe_origin(ext)}")

    def open(self) -> dict | None:
        """Load the session's state now (interactive start): the header can say where it came from."""
        ext = self.link.open_session(self.session)
        if ext is not None:
            self.fresh = not ext.get("n_messages")
        self.header(ext)
        return ext

    # -- a turn --------------------------------------------------------------------------------------
    def send(self, text: str) -> dict:
        msgs = [{"role": "user", "content": text}]
        if self.fresh and self.system:
            msgs.insert(0, {"role": "system", "content": self.system})
        spinner = self.out.spinner("thinking")
        spinner.start()
        started = time.monotonic()
        first_at: float | None = None
        pieces: list[str] = []
        done: dict = {}
        start_ext: dict = {}
        stream = self.link.stream(self.session, msgs, self.sampling)
        try:
            for ev in stream:
                kind = ev.get("type")
                if kind == "start":
                    start_ext = ev.get("engram") or {}
                    if not self.header_shown:
                        spinner.stop()
                        self.header(start_ext)
                        spinner = self.out.spinner("thinking").start()
                elif kind == "token":
                    if first_at is None:
                        first_at = time.monotonic()
                        spinner.stop()
                    pieces.append(ev["text"])
                    if self.events:
                        self.out.event({"event": "token", "text": ev["text"]})
                    else:
                        self.out.write(ev["text"])
                elif kind == "done":
                    done = ev
        except KeyboardInterrupt:
            spinner.stop()
            _close(stream)  # disconnects: the daemon cancels the generation and records the partial reply
            if pieces and not self.events:
                self.out.write("\n")
            self.link.settle()
            self.out.note("(reply stopped; the session keeps what was generated so far)")
            self.fresh = False
            self.turns += 1
            self.last = {"interrupted": True, **self._numbers(start_ext, {}, pieces, started, first_at)}
            self._after_interrupt(self.last)
            if self.events:
                self.out.event({"event": "done", **self.last})
            return self.last
        finally:
            spinner.stop()
            _close(stream)
        self.fresh = False
        self.turns += 1
        self.last = self._numbers(start_ext, done, pieces, started, first_at)
        if self.events:
            self.out.event({"event": "done", **self.last})
        elif pieces and not "".join(pieces).endswith("\n"):
            self.out.write("\n")
        if self.last["finish_reason"] == "cancelled":  # not by us: the daemon was stopped mid-reply
            raise EngramError(
                "the daemon ended this reply before it finished (it was being stopped); the session keeps "
                "what was generated so far.",
                hint=f"engramctl chat --session {self.session}",
            )
        return self.last

    def _after_interrupt(self, last: dict) -> None:
        """A stopped reply never gets its last chunk (we disconnected to stop it), so the numbers only the
        daemon knows come from the snapshot it took of the partial reply: the session's head now."""
        try:
            head = self.link.head(self.session)
        except EngramError:
            return
        if head is None or head.get("id") == last.get("snapshot_id"):
            return
        last["snapshot_id"] = head["id"]
        last["state_tokens"] = head.get("n_tokens")
        prompt = last.get("prompt_tokens")
        if prompt is not None and head.get("n_tokens") is not None and head["n_tokens"] >= prompt:
            last["completion_tokens"] = head["n_tokens"] - prompt

    def _numbers(self, start: dict, done: dict, pieces: list[str], started: float, first_at: float | None) -> dict:
        ext = {**start, **(done.get("engram") or {})}
        usage = done.get("usage") or {}
        completion = usage.get("completion_tokens", ext.get("completion_tokens"))
        prompt = usage.get("prompt_tokens", ext.get("prompt_tokens"))
        # Time to first token as the user saw it: request, restore, prefill and the first decode step.
        ttft = round((first_at - started) * 1000, 1) if first_at is not None else None
        decode_ms = ext.get("decode_ms")
        tps = None
        if completion and decode_ms:
            tps = completion / (decode_ms / 1000)
        elif completion and first_at is not None:
            tps = completion / max(1e-6, time.monotonic() - first_at)
        return {
            "session": ext.get("session", self.session),
            "text": "".join(pieces),
            # the daemon's own word first: OpenAI's finish_reason has no "cancelled" and says "length"
            "finish_reason": ext.get("finish_reason")
            or done.get("finish_reason")
            or ("cancelled" if not done else None),
            "snapshot_id": ext.get("snapshot_id"),
            "resumed": bool(ext.get("resumed")),
            "restored_tokens": ext.get("restored_tokens", 0),
            "tier": ext.get("tier"),
            "restore_ms": ext.get("restore_ms"),
            "prompt_tokens": prompt,
            "cached_tokens": ext.get("cached_tokens", (usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
            "completion_tokens": completion if completion is not None else len(pieces),
            "state_tokens": (prompt or 0) + (completion or 0) if prompt is not None else None,
            "ttft_ms": ttft,
            "tokens_per_s": None if tps is None else round(tps, 2),
        }

    # -- slash-command actions -----------------------------------------------------------------------
    def save(self, label: str | None) -> dict:
        return self.link.save(self.session, label)

    def branch(self, new_session: str) -> None:
        self.link.branch(self.session, new_session)
        self.session = new_session

    def history(self) -> list[dict]:
        return self.link.transcript(self.session)

    def clear(self) -> dict | None:
        """Start the session over (its snapshots are kept); returns what the link says about it."""
        res = self.link.reset(self.session)
        self.fresh = True
        self.last = {}
        return res

    def stats(self) -> dict:
        s = {"session": self.session, "model": self.link.model_id, "turns": self.turns, **self.last}
        sid = s.get("snapshot_id")
        if sid:
            try:
                snap = self.link.snapshot(sid)
                s["snapshot_bytes"] = snap.get("nbytes")
                s["state_tokens"] = snap.get("n_tokens", s.get("state_tokens"))
            except EngramError:
                pass
        return s


def describe_origin(ext: dict | None) -> str:
    if not ext or not (ext.get("restored_tokens") or ext.get("tokens")):
        if ext and ext.get("n_messages"):
            return f"resumed from the transcript ({ext['n_messages']} messages, state rebuilt on the first turn)"
        return "new session"
    tokens = ext.get("restored_tokens") or ext.get("tokens")
    tier = ext.get("tier") or "?"
    where = "memory (already loaded)" if tier == "live" else tier
    rms = ext.get("restore_ms")
    took = f" in {rms:.0f} ms" if isinstance(rms, (int, float)) else ""
    return f"resumed: {count(tokens)} tokens restored from {where}{took}"


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001 - closing a broken stream must not mask the real outcome
            pass
