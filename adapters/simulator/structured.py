"""Structured outputs: a reply that fits the JSON schema of ``response_format: json_schema``,
as OpenAI's does, made from the simulated answer wherever that fits.

The simulated model answers a step decision (``replies.reply_content``); under a schema its
values are kept where they fit the schema (a schema of ``action`` and ``message`` gets the
decision's), and every other value is made up from the schema alone: the first of an ``enum``,
a ``const``, the first branch of ``anyOf``, an object's every property, the fewest items an
array may have, a string of the ``format`` it names. It answered the decision whatever the
schema, so the SDK's ``parse()`` failed with a ValidationError on every call.
"""

from __future__ import annotations

import json
from typing import Any

_FORMATS = {
    "date-time": "2025-01-01T00:00:00Z",
    "date": "2025-01-01",
    "time": "00:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
_DEPTH = 32
"""How deep a recursive schema (a tree of nodes) is followed before its nullable or empty
form is taken."""
MAX_NODES = 10_000
"""The most values one reply is made of; past it, null. A schema of a few bytes asked for a
reply without end (four properties each a tree of four: 4**32 values), holding the
simulator's event loop, or of 15 MB (``minItems: 1000000``)."""
MAX_ITEMS = 100
"""The most items made for an array's ``minItems``."""
MAX_TEXT = 10_000
"""The longest string made for a ``minLength`` (``minLength: 50000000`` made 50 MB)."""


class _Budget:
    """Values still to be made for one reply (``MAX_NODES``)."""

    def __init__(self) -> None:
        self.left = MAX_NODES

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def fitted_reply(schema: dict[str, Any], content: str) -> str:
    """``content`` (the simulated answer) as JSON that fits ``schema``."""
    try:
        hint: Any = json.loads(content)
    except ValueError:
        hint = content
    return json.dumps(_instance(schema, hint, (schema, _Budget()), 0))


Root = tuple[dict[str, Any], _Budget]
"""The whole schema (for references) and the reply's budget of values."""


def _instance(schema: Any, hint: Any, root: Root, depth: int) -> Any:
    if not isinstance(schema, dict) or depth > _DEPTH or not root[1].take():
        return None
    if isinstance(ref := schema.get("$ref"), str):
        return _instance(_resolve(ref, root[0]), hint, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(enum := schema.get("enum"), list) and enum:
        return hint if hint in enum else enum[0]
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches:
        return _branch(branches, hint, root, depth)
    kinds = schema.get("type")
    kind = _kind_for(kinds if isinstance(kinds, list) else [kinds], hint)
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        given = hint if isinstance(hint, dict) else {}
        return {
            name: _instance(sub, given.get(name), root, depth + 1)
            for name, sub in (properties.items() if isinstance(properties, dict) else ())
        }
    if kind == "array":
        least = schema.get("minItems")
        made = min(least, MAX_ITEMS) if isinstance(least, int) else 0
        items = hint if isinstance(hint, list) else [None] * made
        return [_instance(schema.get("items"), item, root, depth + 1) for item in items]
    return _scalar(kind, schema, hint)


def _branch(branches: list[Any], hint: Any, root: Root, depth: int) -> Any:
    """Null where a branch allows it and there is nothing to keep (or a recursive schema has
    gone deep), else the first branch of the hint's own type, else the first that is not null."""
    typed = [branch for branch in branches if isinstance(branch, dict)]
    if any(branch.get("type") == "null" for branch in typed) and (hint is None or depth >= _DEPTH // 2):
        return None
    for branch in typed:
        kind = branch.get("type")
        if isinstance(kind, str) and kind != "null" and _is(kind, hint):
            return _instance(branch, hint, root, depth + 1)
    first = next((branch for branch in typed if branch.get("type") != "null"), None)
    return _instance(first, hint, root, depth + 1)


def _kind_for(kinds: list[Any], hint: Any) -> str | None:
    """The JSON type, of those allowed, that ``hint`` is (else the first that is not null)."""
    allowed = [kind for kind in kinds if isinstance(kind, str)]
    for kind in allowed:
        if _is(kind, hint):
            return kind
    others = [kind for kind in allowed if kind != "null"]
    return others[0] if others else (allowed[0] if allowed else None)


def _is(kind: str, value: Any) -> bool:
    if kind == "integer":
        return type(value) is int
    if kind == "number":
        return type(value) in (int, float)
    return {
        "null": value is None,
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
    }.get(kind, False)


def _scalar(kind: str | None, schema: dict[str, Any], hint: Any) -> Any:
    if kind is not None and _is(kind, hint) and not (kind == "string" and "format" in schema):
        return hint
    if kind == "string":
        text = _FORMATS.get(str(schema.get("format")), "simulated")
        least = schema.get("minLength")
        return text.ljust(min(least, MAX_TEXT), "x") if isinstance(least, int) else text
    if kind in ("integer", "number"):
        least = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        value = least if type(least) in (int, float) else 0
        if "exclusiveMinimum" in schema and value == schema["exclusiveMinimum"]:
            value += 1
        return int(value) if kind == "integer" else value
    if kind == "boolean":
        return False
    return None


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    """A local reference (``#/$defs/Line``, ``#/definitions/Line``, ``#``), else nothing."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref.lstrip("#").strip("/").split("/") if ref != "#" else ():
        node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
    return node
