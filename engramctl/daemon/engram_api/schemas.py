"""The request bodies of the snapshot routes (engram_api/routes.py): the original Engram server's five, with its
own fields (turn_number, branch_name, a custom snapshot_id, create_new_request, continuation_ids,
max_new_tokens, rid, request_id: docs/engram-api.md), and ours beside them (pin, label, branch).

`session`, `conversation_id` and `rid` name one conversation (SessionRef); the sampling fields and the
message shape are the chat completion's (daemon/schemas.py).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engramctl.daemon.schemas import (
    ENGRAM_NAME_DOC,
    LABEL_DOC,
    SESSION_DOC,
    SNAPSHOT_REF_DOC,
    ChatMessage,
    Sampling,
    StreamOptions,
    documented,
)
from engramctl.engine.sampling_params import OPTIONS, SamplingParams
from engramctl.store.names import is_snapshot_id, named_session, validate_engram_api_name, validate_session_name


class SessionRef(BaseModel):
    """`session` and `conversation_id` name the same thing (the original Engram API used the latter, and
    its `rid` where no conversation_id is given)."""

    model_config = ConfigDict(extra="ignore")
    session: str | None = documented(None, SESSION_DOC)
    conversation_id: str | None = documented(None, ENGRAM_NAME_DOC)
    rid: str | None = documented(
        None, ENGRAM_NAME_DOC
    )  # the Engram server's request id: here only its fallback use as the conversation key

    @model_validator(mode="after")
    def _one_name(self):
        named_session(self.session, self.conversation_id, self.rid)
        return self

    @property
    def conversation_key(self) -> str | None:
        """The conversation as the Engram server reads it: conversation_id, else rid."""
        return self.conversation_id if self.conversation_id is not None else self.rid

    @property
    def session_name(self) -> str | None:
        return named_session(self.session, self.conversation_id, self.rid)

    @property
    def conversation(self) -> str | None:
        """The conversation's name as the request gave it (what the answers call conversation_id)."""
        return self.session if self.session is not None else self.conversation_key

    def given(self, *names: str) -> bool:
        """Whether the request carries any of these fields, even as an explicit null (the Engram server's
        Python client sends every field it knows, null when unset)."""
        return bool(self.model_fields_set & set(names))


# The Engram server's own fields: a request that carries one is answered in its terms (docs/engram-api.md).
ENGRAM_FIELDS = (
    "turn_number",
    "branch_name",
    "rid",
    "create_new_request",
    "continuation_ids",
    "max_new_tokens",
    "request_id",
)
_TURN = Field(None, ge=0, description="The Engram server's turn selector: turn 1 is the state after the first reply.")
_BRANCH = Field(
    None, description="The Engram server's branch selector (its own session here).", json_schema_extra=ENGRAM_NAME_DOC
)


class _Selectors(SessionRef):
    """The Engram server's snapshot selectors within a conversation: turn_number, branch_name."""

    turn_number: int | None = _TURN
    branch_name: str | None = _BRANCH

    @field_validator("branch_name")
    @classmethod
    def _branch(cls, v: str | None) -> str | None:
        return None if v is None else validate_engram_api_name(v, "branch_name")

    @property
    def selects(self) -> bool:
        return self.turn_number is not None or self.branch_name is not None

    def check_selectors(self, snapshot_id: str | None) -> None:
        if self.selects and self.session_name is None:
            raise ValueError(
                "turn_number and branch_name select a snapshot of a conversation: give its conversation_id"
            )
        if self.selects and snapshot_id is not None:
            raise ValueError("give a snapshot_id, or a conversation_id with turn_number or branch_name, not both")


class SaveSnapshotRequest(_Selectors):
    label: str | None = documented(None, LABEL_DOC)
    pin: bool = True
    snapshot_id: str | None = documented(
        None, ENGRAM_NAME_DOC
    )  # the Engram server's custom id: the name the snapshot is saved under

    @field_validator("snapshot_id")
    @classmethod
    def _custom_id(cls, v: str | None) -> str | None:
        if v is not None and is_snapshot_id(validate_engram_api_name(v, "snapshot_id")):
            raise ValueError("a custom snapshot_id cannot look like a snapshot's own id (32 hex digits)")
        return v

    @property
    def engram(self) -> bool:
        """Answered in the Engram server's terms: it uses one of its fields, or names the conversation only
        by conversation_id (none of ours: session, label, pin)."""
        return self.given("snapshot_id", *ENGRAM_FIELDS) or (
            self.given("conversation_id") and not self.given("session", "label", "pin")
        )


class RestoreSnapshotRequest(_Selectors, Sampling):
    snapshot_id: str | None = documented(None, SNAPSHOT_REF_DOC)
    continuation: str | ChatMessage | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    model: str = "default"
    # the Engram server's restore-and-generate
    create_new_request: bool | None = None
    continuation_ids: list[Annotated[int, Field(ge=0)]] | None = None
    max_new_tokens: int | None = Field(None, ge=1)
    request_id: str | None = None

    @model_validator(mode="after")
    def _target(self):
        if self.snapshot_id is None and self.session_name is None:
            raise ValueError("give a snapshot_id, or a session (conversation_id) to restore its head")
        self.check_selectors(self.snapshot_id)
        if self.continuation is not None and self.continuation_ids is not None:
            raise ValueError("give continuation (a message) or continuation_ids (token ids), not both")
        if self.create_new_request is False and (self.continuation_ids is not None or self.max_new_tokens is not None):
            raise ValueError("continuation_ids and max_new_tokens can only be provided when create_new_request=true")
        if self.max_new_tokens is not None and self.continuation_ids is None and not self.create_new_request:
            raise ValueError("max_new_tokens goes with continuation_ids (restore-and-generate)")
        if self.continuation_ids is not None and self.stream:
            raise ValueError("a restore-and-generate with continuation_ids answers once; stream is not supported")
        mine = {self.max_tokens, self.max_completion_tokens} - {None}  # type: ignore[attr-defined]
        if self.max_new_tokens is not None and mine - {self.max_new_tokens}:
            raise ValueError("max_new_tokens and max_tokens say different things; give one")
        return self

    def continuation_message(self) -> dict[str, str] | None:
        if self.continuation is None:
            return None
        if isinstance(self.continuation, str):
            return {"role": "user", "content": self.continuation}
        return self.continuation.plain()

    def params(self) -> SamplingParams:
        """Sampling for a restore that generates (continuation_ids or a continuation message): as asked, else
        greedy (temperature 0: a restore continues reproducibly, as the Engram server's does); max_new_tokens
        is max_tokens."""
        options = {name: getattr(self, name) for name in OPTIONS}
        if options["temperature"] is None:
            options["temperature"] = 0.0
        mine = self.max_tokens or self.max_completion_tokens  # type: ignore[attr-defined]
        options["max_tokens"] = self.max_new_tokens or mine
        return SamplingParams.from_options(options)


class ListSnapshotsRequest(SessionRef):
    @property
    def engram(self) -> bool:
        """Listed in the Engram server's terms (its order, an empty list for an unknown conversation): the
        conversation is named by conversation_id (or rid), not by our `session`."""
        return self.session is None and self.conversation_key is not None


class SnapshotInfoRequest(_Selectors):
    snapshot_id: str | None = documented(None, SNAPSHOT_REF_DOC)

    @model_validator(mode="after")
    def _target(self):
        if self.snapshot_id is None and self.session_name is None:
            raise ValueError("give a snapshot_id, or a session (conversation_id) for its head")
        self.check_selectors(self.snapshot_id)
        return self


class DeleteSnapshotRequest(_Selectors):
    snapshot_id: str | None = documented(None, SNAPSHOT_REF_DOC)
    force: bool | None = None  # default: false for a snapshot_id, true for the Engram selectors (their delete)

    @model_validator(mode="after")
    def _target(self):
        if self.snapshot_id is None and not (self.selects and self.session_name is not None):
            raise ValueError("give a snapshot_id, or a conversation_id with its turn_number or branch_name")
        self.check_selectors(self.snapshot_id)
        return self


class SnapshotRef(BaseModel):
    """One snapshot by id or unique id prefix (/unpin_snapshot, /get_snapshot_transcript)."""

    model_config = ConfigDict(extra="ignore")
    snapshot_id: str = Field(json_schema_extra=SNAPSHOT_REF_DOC)


class PinSnapshotRequest(SnapshotRef):
    label: str | None = documented(None, LABEL_DOC)  # also set this label


class LabelSnapshotRequest(SnapshotRef):
    label: str | None = Field(..., json_schema_extra=LABEL_DOC)  # null clears it


class BranchSnapshotRequest(SessionRef):
    snapshot_id: str | None = documented(None, SNAPSHOT_REF_DOC)
    source: str | None = documented(None, ENGRAM_NAME_DOC)  # a session name or snapshot id
    new_session: str = Field(json_schema_extra=SESSION_DOC)

    @model_validator(mode="after")
    def _source(self):
        given = [x for x in (self.snapshot_id, self.source, self.session_name) if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of snapshot_id, source or session (conversation_id) to branch from")
        validate_session_name(self.new_session)
        return self

    @property
    def source_ref(self) -> str:
        return next(x for x in (self.snapshot_id, self.source, self.session_name) if x is not None)
