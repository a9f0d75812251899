"""Session names, labels and snapshot ids: the only user-supplied strings that reach the store.

Nothing a user types becomes a path: a session name lives only in the index, and a snapshot file is
named after its id, which must match SNAPSHOT_ID_RE (lowercase hex) before any path is built.

Snapshot ids are ULID-like: 12 hex digits of milliseconds since the epoch, then 20 random hex digits
(80 bits). They sort by creation time as plain strings; within one process they are strictly
increasing even when the clock stalls or steps back (the random part is incremented instead).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading

from engramctl.errors import InvalidName, NotFound, UsageError

SESSION_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# The original Engram server's conversation_id / branch_name / custom snapshot_id: the same alphabet, up to
# 255 characters. A conversation_id longer than a session name is kept under a shortened session name
# (session_for_conversation); the other two are only ever keys in the index.
ENGRAM_API_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,255}")
TURN_REF_RE = re.compile(r"(.+)-t([0-9]{1,9})")  # "<conversation_id>-t<turn_number>", their snapshot_id
SNAPSHOT_ID_RE = re.compile(r"[0-9a-f]{32}")
SNAPSHOT_SUFFIX = ".safetensors"
MAX_LABEL_CHARS = 128
# The shortest snapshot-id prefix accepted anywhere (CLI, daemon routes, agent tools). Ids start with a
# millisecond timestamp, so a short prefix usually names several snapshots: that is refused as ambiguous.
MIN_ID_PREFIX = 4
_HEX = frozenset("0123456789abcdef")
_TIME_HEX, _RAND_HEX = 12, 20
_RAND_MAX = 16**_RAND_HEX - 1

_id_lock = threading.Lock()
_last: tuple[int, int] = (-1, 0)  # (ms, random) of the last id handed out


def validate_session_name(name: object) -> str:
    """Return `name` if it is a valid session name, else raise InvalidName saying why."""
    if not isinstance(name, str):
        raise InvalidName(f"a session name must be a string, not {type(name).__name__}.")
    if name in (".", ".."):
        raise InvalidName(f"{name!r} is not a valid session name.")
    if not SESSION_NAME_RE.fullmatch(name):
        shown = name if len(name) <= 80 else name[:77] + "..."
        raise InvalidName(
            f"invalid session name {shown!r}: use 1-64 letters, digits, '-', '_' or '.'.",
            hint="for example: my-chat_2",
        )
    return name


def validate_engram_api_name(name: object, what: str = "conversation_id") -> str:
    """A name in the original Engram server's alphabet (conversation_id, branch_name, custom snapshot_id)."""
    if isinstance(name, str) and name not in (".", "..") and ENGRAM_API_NAME_RE.fullmatch(name):
        return name
    shown = repr(name) if not isinstance(name, str) or len(name) <= 80 else repr(name[:77] + "...")
    noun = "session name" if what == "conversation_id" else what
    raise InvalidName(f"invalid {noun} {shown} ({what}): use 1-255 letters, digits, '-', '_' or '.'.")


def session_for_conversation(conversation_id: object) -> str:
    """The session that holds an Engram conversation_id: the id itself when it is a valid session name,
    else (65-255 characters) its first 47 characters, '-' and 16 hex digits of its SHA-256 (64 in all)."""
    cid = validate_engram_api_name(conversation_id)
    if SESSION_NAME_RE.fullmatch(cid):
        return cid
    return f"{cid[:47]}-{_digest(cid)}"


def named_session(session: object, conversation_id: object, rid: object = None) -> str | None:
    """The session a request names by `session`, by `conversation_id` (the original Engram server's name for
    the same thing) or, without a conversation_id, by `rid` (its request id, which its clients use as the
    conversation key); None when it names none, UsageError when it names two."""
    conversation = conversation_id if conversation_id is not None else rid
    if session is not None and conversation is not None and session != conversation:
        raise UsageError("session and conversation_id (or rid) name the same thing; give one.")
    if session is not None:
        return validate_session_name(session)
    return None if conversation is None else session_for_conversation(conversation)


def branch_session_name(session: str, branch: str, taken: bool = False) -> str:
    """The session name for branch `branch` of `session`: "<session>.<branch>" when that is a valid session
    name not `taken` by another session, else a shortened form with 16 hex digits of a SHA-256 of both."""
    plain = f"{session}.{branch}"
    if not taken and SESSION_NAME_RE.fullmatch(plain):
        return plain
    return f"{session[:23]}.{branch[:23]}-{_digest(session + '/' + branch)}"


def parse_turn_ref(ref: object) -> tuple[str, int] | None:
    """(conversation_id, turn_number) from "<conversation_id>-t<turn>" (split at the last "-t"), else None."""
    if not isinstance(ref, str):
        return None
    m = TURN_REF_RE.fullmatch(ref)
    if m is None or not ENGRAM_API_NAME_RE.fullmatch(m[1]) or m[1] in (".", ".."):
        return None
    return m[1], int(m[2])


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def validate_label(label: object) -> str:
    """Labels are free text for people (spaces allowed), but short and without control characters."""
    if not isinstance(label, str) or not label.strip():
        raise InvalidName("a label must be a non-empty string.")
    if len(label) > MAX_LABEL_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in label):
        raise InvalidName(f"a label must be at most {MAX_LABEL_CHARS} printable characters.")
    return label


def is_snapshot_id(text: object) -> bool:
    return isinstance(text, str) and SNAPSHOT_ID_RE.fullmatch(text) is not None


def validate_snapshot_id(text: object) -> str:
    if not is_snapshot_id(text):
        shown = repr(text)[:80]
        raise InvalidName(f"{shown} is not a snapshot id (32 lowercase hex digits).")
    return text  # type: ignore[return-value]


def is_id_prefix(text: object) -> bool:
    """A snapshot id or a prefix of one, long enough to look it up (MIN_ID_PREFIX+ lowercase hex digits)."""
    return isinstance(text, str) and MIN_ID_PREFIX <= len(text) <= 32 and set(text) <= _HEX


def parse_id_ref(ref: object) -> str:
    """A snapshot id or id prefix as typed (surrounding blanks and case forgiven), or UsageError saying why not."""
    text = ref.strip().lower() if isinstance(ref, str) else ref
    if is_id_prefix(text):
        return text  # type: ignore[return-value]
    shown = repr(ref)[:40]
    if isinstance(text, str) and text and len(text) < MIN_ID_PREFIX and set(text) <= _HEX:
        raise UsageError(f"snapshot id prefix {shown} is too short; give at least {MIN_ID_PREFIX} hex digits.")
    raise UsageError(f"{shown} is not a snapshot id (32 hex digits) or an id prefix ({MIN_ID_PREFIX}+ hex digits).")


def one_id(prefix: str, matches: list[str]) -> str:
    """The one snapshot id `prefix` names, given the ids that start with it (two are enough to refuse)."""
    if not matches:
        raise NotFound(f"no snapshot id starts with {prefix!r}.")
    if len(matches) > 1:
        raise UsageError(
            f"snapshot id prefix {prefix!r} is too short: it matches more than one snapshot; give more characters."
        )
    return matches[0]


def snapshot_filename(snapshot_id: str) -> str:
    """File name for a snapshot id; validates the id first, so the result is always a plain name."""
    return validate_snapshot_id(snapshot_id) + SNAPSHOT_SUFFIX


def id_from_filename(filename: str) -> str | None:
    """The snapshot id a file name stands for, or None if it is not one of ours."""
    if not filename.endswith(SNAPSHOT_SUFFIX):
        return None
    stem = filename[: -len(SNAPSHOT_SUFFIX)]
    return stem if is_snapshot_id(stem) else None


def new_snapshot_id(now_s: float) -> str:
    """A fresh time-sortable id for a snapshot created at `now_s` (seconds since the epoch)."""
    global _last
    ms = max(0, int(now_s * 1000)) & (16**_TIME_HEX - 1)
    with _id_lock:
        last_ms, last_rand = _last
        if ms <= last_ms:
            ms, rand = last_ms, last_rand + 1
            if rand > _RAND_MAX:  # 2^80 ids in one millisecond: move to the next one
                ms, rand = ms + 1, secrets.randbits(79)
        else:
            rand = secrets.randbits(79)  # leaves headroom for increments within the millisecond
        _last = (ms, rand)
    return f"{ms:0{_TIME_HEX}x}{rand:0{_RAND_HEX}x}"


def id_time(snapshot_id: str) -> float:
    """Creation time encoded in an id, in seconds."""
    return int(validate_snapshot_id(snapshot_id)[:_TIME_HEX], 16) / 1000
