"""Any Python value -> bounded, valid JSON text, for span attributes (``@operation`` inputs/outputs, ``emit_object``).

OpenTelemetry attributes hold only strings, numbers, booleans and flat lists of them, so structured values are
stored as JSON text. The conversion never raises and always yields valid JSON:

- ``None``, bool, int, str stay as they are; a float stays unless it is NaN or infinite (then its ``repr`` string);
- dict -> object (keys made strings); list, tuple, set, frozenset -> array (sets sorted by their JSON text);
- pydantic models -> ``model_dump(mode="json")``; dataclass instances -> their fields; bytes -> ``"<N bytes>"``;
  an exception -> ``{"type": ..., "message": ...}``; anything else -> its ``repr`` string;
- bounded: strings longer than ``limits.max_string_chars`` are cut and end with ``…[+N chars]``; containers keep
  their first ``limits.max_items`` entries and add one marker entry (``"…[+N items]"``; in a dict under the key
  ``"…"``); below ``limits.max_depth`` nesting levels a value becomes its ``repr`` (cut like a string); a cycle
  becomes ``"<cycle>"``. If the text is still longer than ``limits.max_chars``, it is replaced by a JSON string
  holding its first ``max_chars`` characters and the same ``…[+N chars]`` marker.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

TRUNCATION_MARK = "…"


@dataclass(frozen=True)
class JsonLimits:
    """Size bounds of the JSON text stored in one attribute.

    Attributes:
        max_chars: characters of the whole text.
        max_string_chars: characters of any one string inside it.
        max_items: entries kept from any one list or dict.
        max_depth: nesting levels kept; deeper values become their (cut) ``repr``.
    """

    max_chars: int = 65_536
    max_string_chars: int = 8_192
    max_items: int = 100
    max_depth: int = 8

    def __post_init__(self) -> None:
        for name in ("max_chars", "max_string_chars", "max_items", "max_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"JsonLimits.{name} must be at least 1, got {getattr(self, name)}")


DEFAULT_LIMITS = JsonLimits()


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}{TRUNCATION_MARK}[+{len(text) - limit} chars]"


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a broken __repr__ must not break the agent
        return f"<{type(value).__name__} object (repr failed: {type(exc).__name__})>"


def to_jsonable(value: object, limits: JsonLimits = DEFAULT_LIMITS) -> Any:
    """``value`` as plain JSON data (dict, list, str, int, float, bool, None) within ``limits`` (rules above)."""
    return _jsonable(value, limits, 0, set())


def _jsonable(value: object, limits: JsonLimits, depth: int, seen: set[int]) -> Any:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return _cut(value, limits.max_string_chars)
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    if isinstance(value, BaseException):
        return {"type": type(value).__name__, "message": _cut(str(value), limits.max_string_chars)}
    if depth >= limits.max_depth:
        return _cut(_safe_repr(value), limits.max_string_chars)
    if id(value) in seen:
        return "<cycle>"
    seen.add(id(value))
    try:
        return _container(value, limits, depth, seen)
    finally:
        seen.discard(id(value))


def _container(value: object, limits: JsonLimits, depth: int, seen: set[int]) -> Any:
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and not isinstance(value, type):
        try:
            return _jsonable(model_dump(mode="json"), limits, depth + 1, seen)
        except Exception:
            return _cut(_safe_repr(value), limits.max_string_chars)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
        return _jsonable(fields, limits, depth + 1, seen)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for i, (key, item) in enumerate(value.items()):
            if i >= limits.max_items:
                out[TRUNCATION_MARK] = f"{TRUNCATION_MARK}[+{len(value) - limits.max_items} items]"
                break
            name = key if isinstance(key, str) else _safe_repr(key)
            out[_cut(name, limits.max_string_chars)] = _jsonable(item, limits, depth + 1, seen)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        if isinstance(value, set | frozenset):
            converted = [_jsonable(v, limits, depth + 1, seen) for v in items]
            converted.sort(key=lambda v: json.dumps(v, sort_keys=True))
            return _bounded_list(converted, limits)
        kept = [_jsonable(v, limits, depth + 1, seen) for v in items[: limits.max_items]]
        if len(items) > limits.max_items:
            kept.append(f"{TRUNCATION_MARK}[+{len(items) - limits.max_items} items]")
        return kept
    return _cut(_safe_repr(value), limits.max_string_chars)


def _bounded_list(items: list[Any], limits: JsonLimits) -> list[Any]:
    if len(items) <= limits.max_items:
        return items
    return [*items[: limits.max_items], f"{TRUNCATION_MARK}[+{len(items) - limits.max_items} items]"]


def to_json_text(value: object, limits: JsonLimits = DEFAULT_LIMITS) -> str:
    """``value`` as compact JSON text of at most about ``limits.max_chars`` characters (rules in the module doc)."""
    text = json.dumps(to_jsonable(value, limits), ensure_ascii=False, separators=(",", ":"))
    if len(text) <= limits.max_chars:
        return text
    return json.dumps(_cut(text, limits.max_chars), ensure_ascii=False)
