"""JSON Schema validation whose errors name the argument: a maintained implementation (`jsonschema`) does
the checking, this module only words its first error as a sentence that starts with the field it is
about ("stop[1]: must be a string (got integer 1).") and raises ToolArgumentError with that `param`.

Used for the agent tools' arguments and results (agent/tools.py); no tool knowledge here.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import jsonschema
from jsonschema import Draft202012Validator

from engramctl.errors import ToolArgumentError

# JSON Schema as `jsonschema` implements it, with one strictness of our own: a float is never an integer
# (the spec lets 2.0 pass as one; `max_tokens: 2.0` is a client's bug worth naming).
_TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool)
)
_Validator = jsonschema.validators.extend(Draft202012Validator, type_checker=_TYPE_CHECKER)
_FIRST = {"required": 0, "additionalProperties": 1}  # report a missing or unknown argument before its neighbours'


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _a(t: str) -> str:
    return "an integer" if t == "integer" else "an object" if t == "object" else f"a {t}"


def _where(path: Any, prefix: str) -> str:
    where = prefix
    for part in path:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    return where


# How each keyword's failure reads after "<argument>: " ({rule}: the schema's value for the keyword).
_WORDS = {
    "type": "must be {rule} (got {got})",
    "enum": "must be one of {rule} (got {shown})",
    "nonEmpty": "must not be empty",
    "minLength": "must be at least {rule} characters",
    "maxLength": "must be at most {rule} characters",
    "pattern": "{shown} does not match {rule}",
    "minimum": "must be at least {rule} (got {value})",
    "exclusiveMinimum": "must be greater than {rule} (got {value})",
    "maximum": "must be at most {rule} (got {value})",
    "maxItems": "at most {rule} items",
}


def _problem(e: jsonschema.ValidationError, prefix: str) -> ToolArgumentError:
    """One validation error as a sentence that starts with the argument it names."""
    where, v, rule, value = _where(e.absolute_path, prefix), e.validator, e.validator_value, e.instance
    if v == "required":
        missing = next(k for k in rule if k not in value)
        field = _where([missing], where)
        return ToolArgumentError(f"{field}: is required.", field)
    if v == "additionalProperties":
        props = e.schema.get("properties", {})
        extra = next(str(k) for k in value if k not in props)
        field = _where([extra], where)
        return ToolArgumentError(f"{field}: unknown argument; the arguments are {', '.join(props) or 'none'}.", field)
    if v == "type":
        rule = " or ".join(_a(t) for t in ([rule] if isinstance(rule, str) else rule))
    elif v == "enum":
        rule = ", ".join(map(str, rule))
    elif v == "minLength" and rule == 1:
        v = "nonEmpty"
    words = _WORDS.get(str(v))
    if words is None:  # a keyword the tools do not use yet: jsonschema's own words
        text = e.message
    else:
        text = words.format(rule=rule, value=value, got=f"{type_name(value)} {_shown(value)}", shown=_shown(value))
    return ToolArgumentError(f"{where}: {text}.", where or None)


def check(schema: Mapping[str, Any], value: Any, where: str) -> None:
    """Validate `value` against a JSON Schema (jsonschema); the first problem raises ToolArgumentError
    naming the argument, prefixed with `where`."""
    errors = list(_Validator(schema).iter_errors(value))
    if errors:
        first = min(errors, key=lambda e: (len(e.absolute_path), _FIRST.get(str(e.validator), 2)))
        raise _problem(first, where)


def nullable(schema: Mapping[str, Any]) -> bool:
    t = schema.get("type")
    return t == "null" or (not isinstance(t, str) and "null" in (t or ()))
