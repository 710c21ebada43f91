"""The one reward rule: which values are rewards, applied on every path a reward takes.

A reward is a finite real number. :func:`coerce_reward` is the rule, and every path calls it:

- the agent's returned value (the runner, through :func:`returned_reward`);
- ``emit_reward(value)`` (:mod:`agentbolt.tracing.emit`);
- ``final_reward`` of the status call (``POST /v1/rollouts/{id}/attempts/{id}/status`` and the store's
  ``update_attempt``);
- a reward span (``agentbolt.reward``) arriving at the store, from ``POST /v1/spans``, ``/v1/spans/batch``, OTLP
  ``/v1/traces`` or ``add_spans`` in process: its ``agentbolt.reward.value`` (:mod:`agentbolt.store.rules`);
- reading a reward span back (:mod:`agentbolt.adapter.trajectory`).

Accepted, as a float: ``int``, ``float``, ``bool`` (``True`` is 1.0, ``False`` 0.0; NumPy's ``bool_`` too) and any
other :class:`numbers.Real` (``fractions.Fraction``, NumPy integer and floating scalars), when finite.

Refused with :class:`~agentbolt.errors.RewardError` (a ``ConfigError``, so a ``ValueError`` and HTTP 422), whose
message names the value, its type, where it came from and what to pass instead:

- **strings, numeric or not** (``"1"``, ``"0.5"``, ``"true"``), on every path. A string is ambiguous (``"1"``,
  ``"1e3"``, ``"true"``, ``"NaN"``, a locale's ``"0,5"``), and OTLP/JSON and hand-written clients send strings
  where a number was meant, so a string is never read as a number anywhere: convert it where its meaning is known;
- ``None`` (a reward needs a value: to record no reward, emit none);
- NaN and infinities (also integers too large for a float);
- every other type (lists, dicts, ``Decimal``, tensors: call ``.item()`` or ``float(...)`` first).

The OpenTelemetry JS SDK records an integer attribute as an OTLP ``intValue``; it arrives as an ``int`` and is
accepted like any other integer.
"""

from __future__ import annotations

import math
import numbers
from typing import Annotated, Final

from pydantic import BeforeValidator

from agentbolt.errors import RewardError

_SHOWN_CHARS: Final = 80
"""At most this many characters of a refused value's ``repr`` go into the error message."""


def _shown(value: object) -> str:
    text = repr(value)
    if len(text) > _SHOWN_CHARS:
        text = text[: _SHOWN_CHARS - 3] + "..."
    return f"{text} ({type(value).__name__})"


def _refuse(value: object, where: str, reason: str, advice: str) -> RewardError:
    return RewardError(f"{where}: {_shown(value)} is not a reward: {reason}; {advice}")


def coerce_reward(value: object, *, where: str) -> float:
    """``value`` as a reward (a finite float), by the rule of this module. Pure.

    Args:
        value: the candidate reward.
        where: what the value is, for the error message (``"emit_reward"``, ``"final_reward of the status call"``,
            ``"reward span 'ab12' of attempt at-..."``).

    Returns:
        The reward as a float: ``True`` -> 1.0, ``False`` -> 0.0, a finite real number -> itself as a float.

    Raises:
        RewardError: a string (numeric strings included), ``None``, NaN, an infinity, an integer too large for a
            float, or any other type. The message names the value, its type and ``where``.
    """
    if isinstance(value, bool) or _is_numpy_bool(value):
        return 1.0 if value else 0.0
    if isinstance(value, numbers.Real):
        try:
            reward = float(value)
        except (OverflowError, TypeError, ValueError):
            raise _refuse(value, where, "it does not fit in a float", "pass a finite number") from None
        if not math.isfinite(reward):
            raise _refuse(value, where, "it is not finite", "pass a finite number (or a bool)")
        return reward
    if isinstance(value, str | bytes):
        raise _refuse(
            value,
            where,
            "strings are refused on every path, numeric ones too (a string is ambiguous)",
            "pass a number or a bool, converting the text where its meaning is known (e.g. float(text))",
        )
    if value is None:
        raise _refuse(
            value, where, "a reward needs a value", "pass a finite number or a bool; to record no reward, emit none"
        )
    raise _refuse(
        value,
        where,
        "only int, float, bool and other real numbers are rewards",
        "convert it first (float(x), or x.item() for a tensor or an array element)",
    )


def _is_numpy_bool(value: object) -> bool:
    """``numpy.bool_`` (what ``array.mean() >= 0.5`` gives): a bool that is not a :class:`numbers.Real`."""
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool")


RETURNED_VALUE: Final = "the agent's returned value"
"""``where`` of :func:`returned_reward` in error messages."""


def returned_reward(value: object) -> float | None:
    """The reward an agent returned: ``None`` when it returned ``None`` (no reward returned), else
    :func:`coerce_reward` of it. The runner calls this on the agent's return value.

    Raises:
        RewardError: the agent returned something other than ``None`` that is not a reward (a string such as
            ``"1"``, NaN, an infinity, a list...). The message names the value, its type and says the agent
            returned it, so the attempt fails with a named cause instead of ending with no reward in silence.
    """
    if value is None:
        return None
    return coerce_reward(value, where=RETURNED_VALUE)


def stored_reward(value: object) -> float | None:
    """The value of a stored reward span read back: :func:`coerce_reward` of it, or ``None`` for a value that is
    not a reward. Since the store refuses such spans, only spans stored before this rule existed can hold one, and
    they count as no reward (as they always did) instead of failing the read."""
    try:
        return coerce_reward(value, where="stored reward")
    except RewardError:
        return None


def _optional_reward(value: object) -> float | None:
    return None if value is None else coerce_reward(value, where="final_reward")


OptionalReward = Annotated[float | None, BeforeValidator(_optional_reward)]
"""A pydantic field type: ``None`` (no reward given) or a reward by :func:`coerce_reward`. In lax mode pydantic
would read ``"1"`` as 1.0 for a plain ``float`` field; this type applies the reward rule instead (a 422 on the API)."""
