"""Check a model's tool arguments against a tool's JSON Schema, without raising on bad input.

Models send anything: missing fields, strings for numbers, extra keys, nested junk. A
dialect validates the arguments before doing anything and turns every problem into a
clear sentence the model can act on. Only the schema features the dialects use are
understood: an object with `properties` (types `string`, `integer`, `number`, `boolean`,
optionally an `enum` or a `minimum`) and `required`.

Two deliberate choices:

- an argument given as `null` counts as absent: several function-calling APIs (OpenAI's
  strict mode among them) make models send every optional field, as null when unused;
- an argument the schema does not name is refused, even though the tools' schemas do not
  say `additionalProperties: false`: a misspelt `timout` silently ignored would run a
  command with a timeout the model did not mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bashfleet.worker.wire.models import MAX_COMMAND_BYTES

_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
}


class ArgError(ValueError):
    """The arguments do not fit the schema; the message says how, for the model."""


@dataclass(frozen=True)
class Args:
    """Arguments that passed the schema, with typed accessors (absent: None)."""

    values: Mapping[str, object]

    def given(self, name: str) -> bool:
        """True when the argument is present (and not null)."""
        return name in self.values

    def text(self, name: str) -> str | None:
        """A `string` argument."""
        value = self.values.get(name)
        return value if isinstance(value, str) else None

    def integer(self, name: str) -> int | None:
        """An `integer` argument (floats with no fraction were converted on parsing)."""
        value = self.values.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def number(self, name: str) -> float | None:
        """A `number` (or `integer`) argument, as a float."""
        value = self.values.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)

    def flag(self, name: str) -> bool | None:
        """A `boolean` argument."""
        value = self.values.get(name)
        return value if isinstance(value, bool) else None


def _kind(value: object) -> str:
    """The JSON name of a Python value's type, for messages."""
    match value:
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list() | tuple():
            return "an array"
        case dict():
            return "an object"
    return type(value).__name__


def _shown(value: object, limit: int = 40) -> str:
    """A short rendering of a bad value, so a huge string never floods the message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _coerce(name: str, value: object, spec: Mapping[str, Any]) -> object:
    """The value checked against one property's schema; raises ArgError."""
    wanted = spec.get("type")
    ok: bool
    match wanted:
        case "string":
            ok = isinstance(value, str)
        case "boolean":
            ok = isinstance(value, bool)
        case "integer":
            # JSON Schema counts 3.0 as an integer; Python code wants an int.
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                value = int(value)
            ok = isinstance(value, int) and not isinstance(value, bool)
        case "number":
            ok = (isinstance(value, int) and not isinstance(value, bool)) or (
                isinstance(value, float) and math.isfinite(value)
            )
        case _:
            ok = True
    if not ok:
        expected = _TYPE_NAMES.get(str(wanted), str(wanted))
        raise ArgError(
            f"parameter '{name}' must be {expected}, not {_kind(value)} ({_shown(value)})"
        )
    minimum = spec.get("minimum")
    if minimum is not None and isinstance(value, int | float) and value < minimum:
        raise ArgError(f"parameter '{name}' must be at least {minimum}, not {_shown(value)}")
    choices = spec.get("enum")
    if choices is not None and value not in choices:
        listed = ", ".join(repr(choice) for choice in choices)
        raise ArgError(f"parameter '{name}' must be one of {listed}, not {_shown(value)}")
    return value


def parse_args(tool: str, schema: Mapping[str, Any], raw: object) -> Args:
    """Check `raw` against `schema`; return the typed arguments or raise ArgError."""
    if not isinstance(raw, Mapping):
        raise ArgError(f"the arguments of {tool} must be a JSON object, not {_kind(raw)}")
    properties: Mapping[str, Any] = schema.get("properties", {})
    values: dict[str, object] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or name not in properties:
            known = ", ".join(properties)
            raise ArgError(f"unknown parameter {_shown(name)} ({tool} takes: {known})")
        if value is None:
            continue
        values[name] = _coerce(name, value, properties[name])
    for name in schema.get("required", ()):
        if name not in values:
            raise ArgError(f"missing required parameter '{name}'")
    return Args(values)


def command_problem(command: str) -> str | None:
    """Why a command cannot be sent to the fleet, or None when it can."""
    if not command.strip():
        return "command is empty"
    if "\x00" in command:
        return "command contains a NUL byte, which bash cannot receive"
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        return (
            f"command is {size} bytes; the limit is {MAX_COMMAND_BYTES}: "
            "write long scripts to a file and run the file"
        )
    return None


def path_problem(name: str, path: str) -> str | None:
    """Why a path argument cannot be used, or None when it can."""
    if "\x00" in path:
        return f"parameter '{name}' contains a NUL byte"
    return None
