"""POST /import_snapshot's work: an export file (engramctl.store.exchange) -> a new session.

The file is verified like a restore before anything is stored: checksum and format, then the state
against the loaded model (fingerprint, dtype, layer layout, every shape, finite values). A snapshot
of another model is refused (SnapshotMismatch -> 409) and nothing is written. Runs on the worker
thread, so it cannot interleave with a turn creating the same session.
"""

from __future__ import annotations

from engramctl.daemon.schemas import ROLES
from engramctl.engine.engine import Engine
from engramctl.errors import SnapshotMismatch, UsageError
from engramctl.state.codec import from_payload, written_by
from engramctl.errors import AlreadyExists
from engramctl.store.exchange import unpack
from engramctl.store.names import validate_label, validate_session_name
from engramctl.store.records import SnapshotRecord
from engramctl.store.store import Store

DURABLE_WAIT_S = 60.0


def import_file(
    engine: Engine, store: Store, buf: bytes, session: str | None, label: str | None
) -> tuple[SnapshotRecord, int]:
    """Store the file as the head of a new session; returns (its record, transcript length)."""
    if session is not None:
        validate_session_name(session)
    if label is not None:
        validate_label(label)
    if not buf:
        raise UsageError("the request body must be the bytes of a snapshot file written by `snapshots export`.")
    payload, messages, recorded = unpack(buf, source="the uploaded snapshot file")
    _check_transcript(messages)
    name = session or recorded
    if not name:
        raise UsageError("the snapshot file does not record a session name; give one (session=NAME).")
    validate_session_name(name)
    tensors, meta = payload
    spec = engine.spec
    writer = written_by(meta)["backend"]
    # Another model, or the same one on another backend (a fingerprint is the backend's own: a GGUF's
    # header on llama.cpp, the converted weights on transformers), is said first: a dtype hint would mislead.
    if meta.get("fingerprint") != spec.fingerprint or writer != spec.backend:
        model = meta.get("model_id") or "the model that wrote it"
        if writer != spec.backend:
            raise SnapshotMismatch(
                f"cannot import: the snapshot belongs to model {model!r} on the {writer} backend; this daemon "
                f"serves {spec.model_id!r} on {spec.backend}, whose state is not interchangeable with it.",
                hint=f"import it into a daemon serving that model: engramctl daemon stop && engramctl daemon start "
                f"--model {model} --backend {writer}",
            )
        raise SnapshotMismatch(
            f"cannot import: the snapshot belongs to model {model!r} (fingerprint {meta.get('fingerprint')}); "
            f"this daemon serves {spec.model_id!r} (fingerprint {spec.fingerprint}).",
            hint=f"import it into a daemon serving that model: engramctl daemon stop && engramctl daemon start "
            f"--model {model}",
        )
    try:
        from_payload(tensors, meta, spec)  # dtype, layout, every shape, finite values: as a restore does
    except SnapshotMismatch as e:
        raise SnapshotMismatch(f"cannot import: {e.message}", hint=e.hint) from None
    try:
        store.sessions.create(name)
    except AlreadyExists:
        raise AlreadyExists(
            f"session {name!r} already exists.", hint="import it under another name: --session NEW"
        ) from None
    try:
        rec = store.snapshots.commit(name, payload, messages=messages or None, label=label)
    except BaseException:
        store.delete_session(name)
        raise
    return store.snapshots.wait_durable(rec.id, timeout=DURABLE_WAIT_S), len(messages)


def _check_transcript(messages: list[dict]) -> None:
    """The file's transcript becomes the session's and is rendered through the chat template on its next
    turn: a message that is not {role, content} text would fail there, in the middle of a turn, so it is
    refused here, before anything is stored."""
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise UsageError(
                f"the uploaded snapshot file's transcript message {i} has role {str(role)[:40]!r}; "
                f"a role is one of {', '.join(ROLES)}."
            )
        if not isinstance(content, str):
            raise UsageError(f"the uploaded snapshot file's transcript message {i} has no text content.")
        odd = next((k for k, v in m.items() if v is not None and not isinstance(v, str)), None)
        if odd is not None:
            raise UsageError(
                f"the uploaded snapshot file's transcript message {i} has a field {str(odd)[:40]!r} that is not text."
            )
