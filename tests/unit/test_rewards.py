"""The one reward rule (``agentbolt.types.rewards``) and where it is applied without a store or a server: the pure
function on exact cases, the runner's helper for a returned value, ``emit_reward``, the status call's body, the
store's pure span rules and reading a stored reward back."""

from __future__ import annotations

import pickle
from fractions import Fraction
from typing import Any

import pytest
from pydantic import ValidationError

from agentbolt import semconv
from agentbolt.adapter import last_reward
from agentbolt.errors import ERRORS_BY_NAME, ConfigError, ConflictError, RewardError
from agentbolt.runner.local import trace_attempt
from agentbolt.store import rules
from agentbolt.tracing.emit import emit_reward
from agentbolt.types import AttemptStatus, Span
from agentbolt.types.api import AttemptStatusBody
from agentbolt.types.rewards import coerce_reward, returned_reward, stored_reward

ACCEPTED: list[tuple[Any, float]] = [
    (0, 0.0),
    (1, 1.0),
    (-3, -3.0),
    (0.5, 0.5),
    (-0.0, 0.0),
    (1e300, 1e300),
    (True, 1.0),
    (False, 0.0),
    (Fraction(1, 4), 0.25),
    (2**53 + 1, float(2**53 + 1)),
]

REFUSED: list[tuple[Any, str]] = [
    ("1", "'1' (str)"),
    ("0.5", "'0.5' (str)"),
    ("true", "'true' (str)"),
    ("", "'' (str)"),
    (b"1", "b'1' (bytes)"),
    (None, "None (NoneType)"),
    (float("nan"), "nan (float)"),
    (float("inf"), "inf (float)"),
    (float("-inf"), "-inf (float)"),
    (10**400, "(int)"),
    ([1.0], "[1.0] (list)"),
    ({"value": 1}, "{'value': 1} (dict)"),
    (object(), "(object)"),
]


@pytest.mark.parametrize(("value", "expected"), ACCEPTED)
def test_numbers_and_bools_are_rewards(value: Any, expected: float) -> None:
    reward = coerce_reward(value, where="here")
    assert type(reward) is float and reward == expected


@pytest.mark.parametrize(("value", "shown"), REFUSED)
def test_everything_else_is_refused_naming_the_value_its_type_and_where(value: Any, shown: str) -> None:
    with pytest.raises(RewardError) as info:
        coerce_reward(value, where="the test's value")
    message = str(info.value)
    assert message.startswith("the test's value: ") and shown in message and "is not a reward" in message
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    assert info.value.http_status == 422


def test_refusals_say_what_to_do() -> None:
    with pytest.raises(RewardError, match=r"strings are refused on every path.*float\(text\)"):
        coerce_reward("1", where="x")
    with pytest.raises(RewardError, match="not finite; pass a finite number"):
        coerce_reward(float("nan"), where="x")
    with pytest.raises(RewardError, match=r"\.item\(\)"):
        coerce_reward([1], where="x")


def test_a_long_value_is_shortened_in_the_message() -> None:
    with pytest.raises(RewardError) as info:
        coerce_reward("9" * 10_000, where="x")
    assert len(str(info.value)) < 400 and "...' (str)" not in str(info.value) and "... (str)" in str(info.value)


def test_reward_error_is_picklable_and_known_to_the_http_client() -> None:
    err = RewardError("x: '1' (str) is not a reward")
    assert str(pickle.loads(pickle.dumps(err))) == str(err)
    assert ERRORS_BY_NAME["RewardError"] is RewardError


def test_returned_value_none_is_no_reward_and_anything_else_follows_the_rule() -> None:
    assert returned_reward(None) is None
    assert returned_reward(1) == 1.0 and returned_reward(True) == 1.0 and returned_reward(0.25) == 0.25
    for value in ("1", float("nan"), [1.0]):
        with pytest.raises(RewardError, match="the agent's returned value: .* is not a reward"):
            returned_reward(value)


def test_emit_reward_refuses_a_numeric_string() -> None:
    with trace_attempt(instrument=False) as attempt:
        with pytest.raises(RewardError, match=r"emit_reward: '1' \(str\) is not a reward"):
            emit_reward("1")  # type: ignore[arg-type]
        with pytest.raises(RewardError, match=r"emit_reward: None \(NoneType\)"):
            emit_reward(None)  # type: ignore[arg-type]
        emit_reward(True)
    assert [s.attributes[semconv.REWARD_VALUE] for s in attempt.spans] == [1.0]


def test_status_body_applies_the_rule_to_final_reward() -> None:
    def body(final_reward: str) -> AttemptStatusBody:
        return AttemptStatusBody.model_validate_json(f'{{"status": "succeeded", "final_reward": {final_reward}}}')

    assert body("null").final_reward is None and body("true").final_reward == 1.0 and body("3").final_reward == 3.0
    for raw, shown in (('"1"', "'1' (str)"), ("NaN", "nan (float)"), ("Infinity", "inf (float)"), ("[1]", "(list)")):
        with pytest.raises(ValidationError, match=r"final_reward: .*is not a reward") as info:
            body(raw)
        assert shown in str(info.value)
    assert AttemptStatusBody.model_json_schema()["properties"]["final_reward"]["anyOf"] == [
        {"type": "number"},
        {"type": "null"},
    ]


def _span(name: str, **attributes: Any) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        span_id="00f067aa0ba902b7",
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        name=name,
        start_time=1.0,
        attributes=attributes,
    )


def test_store_rule_coerces_reward_values_and_refuses_bad_ones() -> None:
    plain = _span("tool.call", **{semconv.REWARD_VALUE: "1"})  # not a reward span: left alone
    as_float = _span(semconv.SPAN_REWARD, **{semconv.REWARD_VALUE: 0.5})
    as_bool = _span(semconv.SPAN_REWARD, **{semconv.REWARD_VALUE: True, semconv.REWARD_NAME: "ok"})
    as_int = _span(semconv.SPAN_REWARD, **{semconv.REWARD_VALUE: 1})
    checked = rules.check_reward_spans([plain, as_float, as_bool, as_int])
    assert checked[0] is plain and checked[1] is as_float
    assert checked[2].attributes == {semconv.REWARD_VALUE: 1.0, semconv.REWARD_NAME: "ok"}
    assert type(checked[3].attributes[semconv.REWARD_VALUE]) is float
    assert as_bool.attributes[semconv.REWARD_VALUE] is True  # inputs are never mutated

    for value, shown in (("1", "'1' (str)"), (None, "None (NoneType)"), (float("nan"), "nan (float)")):
        bad = _span(semconv.SPAN_REWARD, **{semconv.REWARD_VALUE: value})
        with pytest.raises(RewardError) as info:
            rules.check_reward_spans([as_float, bad])
        message = str(info.value)
        assert "reward span '00f067aa0ba902b7' of attempt at-1 of rollout ro-1" in message and shown in message
    with pytest.raises(RewardError, match="None"):
        rules.check_reward_spans([_span(semconv.SPAN_REWARD)])  # no value at all


@pytest.mark.parametrize("status", list(AttemptStatus))
def test_store_rule_refuses_a_reward_for_an_ended_attempt_only(status: AttemptStatus) -> None:
    reward = _span(semconv.SPAN_REWARD, **{semconv.REWARD_VALUE: 0.9})
    rules.check_span_target(_span("agentbolt.llm_call"), status)  # other spans: always
    if status in rules.ACTIVE_ATTEMPT_STATUSES:
        rules.check_span_target(reward, status)
        return
    with pytest.raises(ConflictError) as info:
        rules.check_span_target(reward, status)
    assert f"attempt at-1 of rollout ro-1 arrived after the attempt ended ('{status.value}')" in str(info.value)
    assert info.value.http_status == 409


def test_reading_back_uses_the_same_rule() -> None:
    assert stored_reward(True) == 1.0 and stored_reward(2) == 2.0
    assert stored_reward("1") is None and stored_reward(None) is None and stored_reward(float("nan")) is None
    spans = [
        _span(semconv.SPAN_REWARD, **{semconv.REWARD_VALUE: 0.0}),
        _span(semconv.SPAN_REWARD, **{semconv.REWARD_VALUE: True}),  # stored before the rule: read as 1.0
        _span(semconv.SPAN_REWARD, **{semconv.REWARD_VALUE: "0.9"}),  # stored before the rule: not a reward
    ]
    assert last_reward(spans) == 1.0


def test_numpy_scalars_are_rewards() -> None:
    import numpy as np

    from agentbolt.types.rewards import coerce_reward

    assert coerce_reward(np.array([1.0, 0.0]).mean() >= 0.5, where="x") == 1.0  # numpy.bool_, a common reward
    assert coerce_reward(np.bool_(False), where="x") == 0.0
    assert coerce_reward(np.float32(0.25), where="x") == 0.25
    assert coerce_reward(np.int64(3), where="x") == 3.0
