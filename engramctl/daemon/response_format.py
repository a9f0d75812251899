"""Structured output as the requests ask for it: OpenAI's `response_format` ({"type": "json_object"} or
{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}) and Ollama's `format` ("json" or a
schema), turned into the engine's grammar spec (engine/constraint.py) and checked before the job is
submitted: a schema the grammar cannot enforce is a 400 naming the feature and the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engramctl.engine.constraint import JSON_OBJECT, check, grammar_spec
from engramctl.engine.sampling_params import SamplingParams
from engramctl.errors import UnsupportedSchema


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = Field(max_length=64, description="The schema's name (OpenAI's rule: at most 64 characters).")
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(
        None, alias="schema", description="The JSON Schema the reply follows; absent: any JSON value."
    )
    strict: bool | None = Field(None, description="Accepted: the reply always follows the schema.")


class ResponseFormat(BaseModel):
    """OpenAI's response_format: "text" (the default), "json_object" or "json_schema"."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs a json_schema object ({"name": ..., "schema": {...}})')
        return self

    def spec(self) -> str | None:
        if self.type == "json_object":
            return JSON_OBJECT
        if self.type == "json_schema":
            return grammar_spec(self.json_schema.json_schema if self.json_schema.json_schema is not None else {})
        return None


def ollama_spec(fmt: Any) -> str | None:
    """Ollama's `format`: "json" (any JSON object) or a JSON Schema; None or "" for free text."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return JSON_OBJECT
    if isinstance(fmt, dict):
        return grammar_spec(fmt)
    raise UnsupportedSchema(f'format must be "json" or a JSON Schema object (got {str(fmt)[:40]!r}).')


def constrained(params: SamplingParams, spec: Any, field: str) -> SamplingParams:
    """`params` with the grammar `spec` (a callable giving it, which may refuse) after checking it can be
    enforced; the refusal names `field`."""
    try:
        grammar = spec()
        if grammar is not None:
            check(grammar)
    except UnsupportedSchema as e:
        err = UnsupportedSchema(e.message if e.message.startswith(field) else f"{field}: {e.message}", e.hint)
        err.param = field
        raise err from None
    return params if grammar is None else dataclasses.replace(params, grammar=grammar)
