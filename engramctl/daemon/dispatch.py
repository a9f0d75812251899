"""Running an agent tool (engramctl.agent.tools) inside the daemon, against its store and conversation service.

    result = await Dispatcher(daemon).call("checkpoint", {"session": "s", "label": "before"})

Arguments are validated first (agent/arguments.py validate_arguments): bad ones raise ToolArgumentError and nothing
is touched. Tools that change state (checkpoint, branch, restore, delete_checkpoint, chat) run as jobs
on the daemon's single worker thread, between the scheduler's steps: a checkpoint (or a branch of a session)
asked for while a reply is being generated waits for that reply and takes the state after it, a restore
is refused (409 session_busy) while a turn of that session runs or waits, and the conversation service's
in-memory "hot" state is only ever touched from that thread. Read-only tools answer at once.

Semantics (what an agent can rely on):
- checkpoint pins the session's head (snapshotting it first if the session has only a transcript) and
  labels it; a checkpoint is a pinned or labelled snapshot, never evicted by retention.
- restore accepts a checkpoint of the session's own history: a snapshot the session owns, or one its
  head descends from (a branch's source history), and also one grown from those (a branch explored
  from it: restoring there adopts the branch's result). Labels resolve to the newest match, the
  session's own first. The head moves there, the transcript follows (it becomes the one that snapshot
  was taken with), and the state is loaded into the model, so the next turn continues exactly from it;
  later snapshots stay listed (restore forward works too). A snapshot of an unrelated conversation is
  refused: branch from it instead.
- branch never copies: the new session points at the source state and shares the transcript up to it.
- delete_checkpoint unpins and unlabels, then deletes the data unless a session still continues or
  branches from it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from engramctl.agent.arguments import validate_arguments
from engramctl.agent.tools import Tool, get_tool
from engramctl.daemon import session_changes
from engramctl.daemon.engram_api import restore
from engramctl.daemon.sequence import Sequence
from engramctl.daemon.service import ChatRequest
from engramctl.daemon.streaming import job_result
from engramctl.daemon.turn_json import turn_info, usage_json
from engramctl.daemon.turn_result import TurnResult
from engramctl.engine.sampling_params import SamplingParams
from engramctl.errors import NotFound, ToolArgumentError, UsageError
from engramctl.protocol import Snapshot
from engramctl.store.names import is_id_prefix, is_snapshot_id

# A checkpoint as list_checkpoints shows it: these fields of the wire Snapshot, plus is_head / in_history.
_ITEM_FIELDS = ("snapshot_id", "session", "label", "pinned", "tokens", "n_messages", "bytes", "created", "tier")
_CHECKPOINT_FIELDS = ("snapshot_id", "session", "label", "pinned", "tokens", "n_messages", "created")


def _fields(rec, names: tuple[str, ...]) -> dict[str, Any]:
    wire = Snapshot.from_record(rec).to_json()
    return {k: wire[k] for k in names}


def is_checkpoint(rec) -> bool:
    return bool(rec.pinned or rec.label)


async def wait_job(job, request=None) -> Any:
    """A worker job's result (its error raised here). With an HTTP request, a client disconnect
    cancels the job; a cancelled caller (WebSocket closed) cancels it too."""
    if request is not None:
        return await job_result(job, request)
    try:
        return await job.result()
    except asyncio.CancelledError:
        job.cancel.set()
        raise


class Dispatcher:
    def __init__(self, daemon):
        self.daemon = daemon
        self.store = daemon.store
        self.service = daemon.service

    async def call(self, name: str, arguments: Any, *, session: str | None = None, request=None) -> dict:
        """Validate and run one tool; `session` is the calling conversation's (fills a missing one)."""
        tool: Tool = get_tool(name)
        args = validate_arguments(tool, arguments, session=session)
        run = getattr(self, f"_{tool.name}")
        if not tool.mutates:
            return run(args, None)
        turn = tool.name == "chat"  # a turn: the scheduler runs it with the others
        job = self.daemon.worker.submit(
            lambda job: run(args, job), name=f"tool {tool.name}", turn=turn, session=self._after(tool.name, args)
        )
        return await wait_job(job, request)

    def _after(self, tool: str, args: dict) -> str | None:
        """The session whose turns running or queued now the call comes after: a chat continues its
        session's; a checkpoint or a branch of a session takes its head once their replies are in it."""
        if tool in ("chat", "checkpoint"):
            return args.get("session")
        if tool == "branch" and self.store.sessions.has(args.get("source") or ""):
            return args["source"]
        return None

    # -- lookups ---------------------------------------------------------------------------------------
    def _pool(self, session: str) -> tuple[dict[str, Any], set[str]]:
        """The snapshots a session may go back to: those it owns and those its head descends from."""
        owned = self.store.snapshots.list(session)
        history = self.store.sessions.history(session)
        pool = {r.id: r for r in owned}
        pool.update((r.id, r) for r in history)
        return pool, {r.id for r in history}

    def _related(self, rec, pool: dict[str, Any]) -> bool:
        """Does `rec` descend from (or is it) one of the pool's snapshots: the same conversation tree?"""
        for _ in range(1_000_000):
            if rec.id in pool:
                return True
            if not rec.parent:
                return False
            try:
                rec = self.store.snapshots.info(rec.parent)
            except NotFound:
                return False
        return False

    def _in_history(self, session: str, ref: str):
        """A checkpoint `session` may move to, by snapshot id, unique id prefix or label (newest match): one
        it owns or descends from, or one grown from those (a branch explored from it: adopting its result)."""
        pool, _ = self._pool(session)

        def unrelated(rec):
            return ToolArgumentError(
                f"checkpoint: snapshot {rec.id} belongs to session {rec.session!r}, which did not grow from "
                f"session {session!r}'s history.",
                "checkpoint",
                hint="branch from it into a new session instead",
            )

        if is_snapshot_id(ref):
            if ref in pool:
                return pool[ref]
            rec = self.store.snapshots.info(ref)  # NotFound when it does not exist at all
            if self._related(rec, pool):
                return rec
            raise unrelated(rec)
        labelled = [r for r in pool.values() if r.label == ref]
        if not labelled:
            labelled = [r for r in self.store.snapshots.list() if r.label == ref and self._related(r, pool)]
        if labelled:
            return max(labelled, key=lambda r: r.id)  # ids sort by creation time
        if is_id_prefix(ref):
            matches = [r for sid, r in pool.items() if sid.startswith(ref)]
            if len(matches) > 1:
                raise ToolArgumentError(
                    f"checkpoint: snapshot id prefix {ref!r} is ambiguous; give more digits.", "checkpoint"
                )
            if matches:
                return matches[0]
            try:
                rec = self.store.snapshots.info(self.store.resolve(ref))
            except NotFound:
                rec = None
            except UsageError as e:
                raise ToolArgumentError(f"checkpoint: {e.message}", "checkpoint") from None
            if rec is not None:
                if self._related(rec, pool):
                    return rec
                raise unrelated(rec)
        raise NotFound(
            f"session {session!r} has no checkpoint {ref!r} (label or snapshot id) in its history.",
            hint="list_checkpoints shows them",
        )

    def _branch_source(self, source: str, checkpoint: str | None) -> tuple[str, str | None]:
        """(what store.sessions.branch takes: a snapshot id or a session name, the source session)."""
        if checkpoint is not None:
            if not self.store.sessions.has(source):
                raise NotFound(f"no session named {source!r} (with `checkpoint`, the source is a session).")
            return self._in_history(source, checkpoint).id, source
        if is_snapshot_id(source):
            return source, self.store.snapshots.info(source).session
        if self.store.sessions.has(source):
            return source, source
        if is_id_prefix(source):
            try:
                sid = self.store.resolve(source)
                return sid, self.store.snapshots.info(sid).session
            except NotFound:
                pass
        labelled = [r for r in self.store.snapshots.list() if r.label == source]
        sessions = {r.session for r in labelled}
        if len(sessions) > 1:
            raise ToolArgumentError(
                f"source: the label {source!r} is used in several sessions ({', '.join(sorted(sessions))}).",
                "source",
                hint="give the session as source and the label as checkpoint",
            )
        if labelled:
            rec = max(labelled, key=lambda r: r.id)
            return rec.id, rec.session
        raise NotFound(f"no session, snapshot or checkpoint label {source!r} to branch from.")

    @staticmethod
    def _item(rec, head: str | None, history: set[str]) -> dict:
        return {**_fields(rec, _ITEM_FIELDS), "is_head": rec.id == head, "in_history": rec.id in history}

    # -- tools (mutating ones run on the worker thread) -------------------------------------------------
    def _checkpoint(self, args: dict, job) -> dict:
        sid = restore.save(self.service, args["session"], args.get("label"), True)
        return {**_fields(self.store.snapshots.info(sid), _CHECKPOINT_FIELDS), "session": args["session"]}

    def _branch(self, args: dict, job) -> dict:
        ref, source_session = self._branch_source(args["source"], args.get("checkpoint"))
        info = self.store.sessions.branch(ref, args["new_session"])
        rec = self.store.snapshots.info(info.head) if info.head else None
        return {
            "session": info.name,
            "source_session": source_session,
            "snapshot_id": info.head,
            "tokens": rec.n_tokens if rec else 0,
            "n_messages": info.n_messages,
        }

    def _restore(self, args: dict, job) -> dict:
        session = args["session"]
        before = self.store.sessions.get(session)
        rec = self._in_history(session, args["checkpoint"])
        # The service moves the head (rewinding the transcript) and loads the state into the model as
        # the session's hot state, so the next turn continues from exactly this point.
        out = restore.restore(self.service, rec.id, session, idle=session_changes.restore_check(self.daemon))
        return {
            "session": session,
            "snapshot_id": rec.id,
            "label": rec.label,
            "previous_head": before.head,
            "tokens": out.tokens,
            "n_messages": out.n_messages,
            "tier": out.tier,
            "restore_ms": out.restore_ms,
        }

    def _list_checkpoints(self, args: dict, job) -> dict:
        session = args["session"]
        info = self.store.sessions.get(session)
        pool, history = self._pool(session)
        turns = bool(args.get("include_turns"))
        items = [self._item(r, info.head, history) for _, r in sorted(pool.items()) if turns or is_checkpoint(r)]
        return {"session": session, "head": info.head, "checkpoints": items}

    def _delete_checkpoint(self, args: dict, job) -> dict:
        from engramctl.errors import SnapshotInUse

        try:
            sid = self.store.resolve(args["id"])
        except NotFound:
            raise
        except UsageError as e:  # an ambiguous prefix
            raise ToolArgumentError(f"id: {e.message}", "id", e.hint) from None
        rec = self.store.snapshots.info(sid)
        if rec.pinned:
            self.store.snapshots.unpin(sid)
        if rec.label is not None:
            self.store.snapshots.label(sid, None)
        try:
            self.store.snapshots.delete(sid)
            deleted, reason = True, None
        except SnapshotInUse as e:
            deleted, reason = False, e.message
        hot = self.service.hot
        if deleted and hot is not None and hot.head == sid:
            self.service.invalidate()
        return {"snapshot_id": sid, "session": rec.session, "deleted": deleted, "reason": reason}

    def _session_info(self, args: dict, job) -> dict:
        session = args["session"]
        info = self.store.sessions.get(session)
        head = self.store.snapshots.info(info.head) if info.head else None
        pool, _ = self._pool(session)
        hot = self.service.hot
        return {
            "session": session,
            "head": info.head,
            "tokens": head.n_tokens if head else 0,
            "snapshot_bytes": head.nbytes if head else 0,
            "stored_bytes": info.stored_bytes,
            "tier": head.tiers[0] if head and head.tiers else None,
            "hot": head is not None and hot is not None and hot.session == session and hot.head == head.id,
            "n_messages": info.n_messages,
            "n_snapshots": info.n_snapshots,
            "n_checkpoints": sum(1 for r in pool.values() if is_checkpoint(r)),
            "base": info.base,
            "model_id": info.model_id,
            "created": info.created,
            "last_used": info.last_used,
        }

    def _chat(self, args: dict, job) -> Sequence:
        chat = ChatRequest(
            messages=[{"role": "user", "content": args["message"]}],
            session=args["session"],
            params=SamplingParams.from_options(args),
        )
        seq = self.service.chat(chat, job)
        seq.answer = chat_result
        return seq


def chat_result(r: TurnResult) -> dict:
    """A turn's result as the chat tool's result: the turn's wire fields (protocol.TurnInfo)."""
    t, usage = turn_info(r), usage_json(r)
    return {
        "session": t.session,
        "reply": r.text,
        "finish_reason": t.finish_reason,
        "snapshot_id": t.snapshot_id,
        "usage": {
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
            "cached_tokens": t.cached_tokens or 0,
        },
        "resumed": t.resumed,
        "restored_tokens": t.restored_tokens,
        "tier": t.tier,
        "restore_ms": t.restore_ms,
    }
