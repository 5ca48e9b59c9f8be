"""Tool-call arguments typed by the tool's JSON schema, as vLLM's engine-based parsers type them.

Formats whose calls carry no JSON types (Gemma 4's ``key:value`` arguments) read every value as a
string; vLLM then converts each string the tool's schema types otherwise (``"2"`` for an integer
property becomes ``2``), and leaves the rest strings. Families whose hf parse must return vLLM's
fields use :func:`typed_arguments` with the request's tools. The gateway checks every parsed call
against the same schemas (:func:`tool_call_problem`): a call that does not parse against them is an
unparsed call in the trace.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

# Schema type spellings vLLM accepts besides JSON Schema's own.
_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum"), "string"),
    **dict.fromkeys(
        ("int", "int32", "int64", "uint", "uint32", "uint64", "long", "short", "unsigned"), "integer"
    ),
    **dict.fromkeys(("float", "float32", "float64", "double"), "number"),
    "bool": "boolean",
    "dict": "object",
    **dict.fromkeys(("arr", "list", "sequence"), "array"),
}
# The order in which a string is tried against the types its schema allows.
_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")


def tool_properties(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Each OpenAI function tool's name -> its parameters' ``properties``."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters") or {}
            found.setdefault(function["name"], dict(parameters.get("properties") or {}))
    return found


def typed_arguments(arguments: dict[str, Any], properties: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` (strings at the leaves) with each value its property's schema types converted."""
    return {
        key: _typed(value, properties[key]) if isinstance(properties.get(key), Mapping) else value
        for key, value in arguments.items()
    }


def _typed(value: Any, schema: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return _from_string(value, _types(schema))
    if isinstance(value, dict):
        nested = schema.get("properties")
        return typed_arguments(value, nested) if isinstance(nested, Mapping) else value
    if isinstance(value, list):
        items = schema.get("items")
        return [_typed(item, items) for item in value] if isinstance(items, Mapping) else value
    return value


def _types(schema: Any) -> set[str]:
    """The types a schema allows: ``type``, the kinds of its ``enum`` values, its alternatives."""
    if not isinstance(schema, Mapping):
        return {"string"}
    kinds = schema.get("type")
    found = {kinds} if isinstance(kinds, str) else {kind for kind in kinds or [] if isinstance(kind, str)}
    for value in schema.get("enum") or [] if isinstance(schema.get("enum"), list) else []:
        found.add(_kind(value))
    for choice in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(choice), list):
            for option in schema[choice]:
                found |= _types(option)
    return found or {"string"}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    for python, kind in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")):
        if isinstance(value, python):
            return kind
    return "array" if isinstance(value, list) else "object"


def _from_string(value: str, kinds: set[str]) -> Any:
    allowed = {_ALIASES.get(kind.strip().lower(), kind.strip().lower()) for kind in kinds}
    for kind in _PRIORITY:
        if kind not in allowed:
            continue
        if kind == "string":
            return value
        converted = _convert(value, kind)
        if converted is not _FAILED:
            return converted
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


_FAILED = object()


def _convert(value: str, kind: str) -> Any:
    """``value`` as ``kind``, or _FAILED."""
    try:
        if kind == "null":
            return None if value.lower() == "null" else _FAILED
        if kind == "integer":
            return int(value)
        if kind == "number":
            number = float(value)
            if not math.isfinite(number):
                return _FAILED
            return int(number) if number == int(number) else number
        if kind == "boolean":
            word = value.lower().strip()
            return {"true": True, "1": True, "false": False, "0": False}.get(word, _FAILED)
        parsed = json.loads(value)  # object or array
        return parsed if _finite(parsed) else _FAILED
    except ValueError:
        return _FAILED


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):
        return False
    return True


def tool_call_problem(call: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None) -> str | None:
    """Why a parsed tool call does not parse against the request's ``tools`` (a phrase), or None.

    The call's ``arguments`` must be a JSON object, its function one the request offers, and its
    arguments must match that function's parameters schema as far as a call can be checked without
    a validator: required properties present, each value of a type (and enum) the schema allows, at
    any depth. A schema that states no type allows any value.
    """
    function = call.get("function") or {}
    name, arguments = function.get("name"), function.get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return f"the arguments of {name!r} are not JSON: {str(arguments)[:80]!r}"
    if not isinstance(parsed, dict):
        return f"the arguments of {name!r} are not a JSON object"
    schemas = {
        tool["function"]["name"]: tool["function"].get("parameters") or {}
        for tool in tools or []
        if isinstance(tool.get("function"), Mapping) and isinstance(tool["function"].get("name"), str)
    }
    if name not in schemas:
        return f"it calls {name!r}, which the request's tools do not offer"
    problem = _schema_problem(parsed, schemas[name], "")
    return f"the arguments of {name!r} do not match its schema: {problem}" if problem else None


def _schema_problem(value: Any, schema: Any, path: str) -> str | None:
    """The first way ``value`` breaks ``schema`` (type, enum, required, nested), or None."""
    if not isinstance(schema, Mapping):
        return None
    where = path or "the arguments"
    if any(key in schema for key in ("type", "enum", "anyOf", "oneOf", "allOf")):
        allowed = {_ALIASES.get(kind.strip().lower(), kind.strip().lower()) for kind in _types(schema)}
        kind = _kind(value)
        if kind not in allowed and not (kind == "integer" and "number" in allowed):
            return f"{where} is {kind}, the schema asks for {' or '.join(sorted(allowed))}"
    if isinstance(schema.get("enum"), list) and value not in schema["enum"]:
        return f"{where} is {value!r}, not one of {schema['enum']}"
    if isinstance(value, dict):
        missing = [key for key in schema.get("required") or [] if key not in value]
        if missing:
            return f"{where} lack{'s' if path else ''} the required {', '.join(map(repr, missing))}"
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        for key, item in value.items():
            problem = _schema_problem(item, properties.get(key), f"{path}.{key}" if path else key)
            if problem:
                return problem
    if isinstance(value, list):
        for index, item in enumerate(value):
            problem = _schema_problem(item, schema.get("items"), f"{where}[{index}]")
            if problem:
                return problem
    return None
