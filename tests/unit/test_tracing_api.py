"""The agent-side tracing API in one process, spans kept in memory (``trace_attempt``), no store, no network.

Pinned behaviour (exact values):
- rewards: several named ones and the last unnamed one is the final reward; validation errors;
- ``@operation``: inputs (bound, defaults applied, no ``self``), output, error status + re-raise, sync and async,
  nesting of what runs inside it, generator functions refused;
- emit_message / emit_object / emit_exception attributes; emit_* outside an attempt record nothing;
- all spans of an attempt share its trace id; threads that copy the context stay in the attempt, a span started
  elsewhere under an attempt's span joins that attempt;
- ``trace_attempt``: ids, the exception leaving the block, writing to a store, its errors.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest
from opentelemetry import trace
from pydantic import BaseModel

from agentbolt import (
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    operation,
    semconv,
    trace_attempt,
)
from agentbolt.errors import ConfigError, NotFoundError
from agentbolt.runner.local import LocalAttempt
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracing import JsonLimits, current_attempt
from agentbolt.tracing.serialize import to_json_text
from agentbolt.types import Span


def _by_name(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def _input(span: Span) -> object:
    return json.loads(span.attributes[semconv.OPERATION_INPUT])


def _output(span: Span) -> object:
    return json.loads(span.attributes[semconv.OPERATION_OUTPUT])


# ------------------------------------------------------------------------------------------------------- rewards


def test_named_rewards_and_last_unnamed_is_final() -> None:
    with trace_attempt(instrument=False) as attempt:
        assert emit_reward(0.1, name="format") is not None
        emit_reward(0.5)
        emit_reward(True, name="tool_ok")
        emit_reward(2, name="format")
        emit_reward(0.75)
        span = emit_reward(0.25, name="late")
    assert isinstance(span, Span) and span.attributes[semconv.REWARD_NAME] == "late"
    rewards = [(s.attributes.get(semconv.REWARD_NAME), s.attributes[semconv.REWARD_VALUE]) for s in attempt.spans]
    assert rewards == [("format", 0.1), (None, 0.5), ("tool_ok", 1.0), ("format", 2.0), (None, 0.75), ("late", 0.25)]
    assert all(s.name == semconv.SPAN_REWARD for s in attempt.spans)
    assert attempt.final_reward == 0.75
    assert attempt.reward("format") == 2.0 and attempt.reward("tool_ok") == 1.0 and attempt.reward("nope") is None
    assert all(s.rollout_id == attempt.rollout_id and s.attempt_id == attempt.attempt_id for s in attempt.spans)
    assert all(s.attributes[semconv.ATTEMPT_ID] == attempt.attempt_id for s in attempt.spans)


def test_reward_validation() -> None:
    with trace_attempt(instrument=False) as attempt:
        with pytest.raises(ConfigError, match="finite"):
            emit_reward(float("nan"))
        with pytest.raises(ConfigError, match="is not a reward"):
            emit_reward("high")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="non-empty string"):
            emit_reward(1.0, name="")
    assert attempt.spans == []
    assert attempt.final_reward is None


def test_emit_outside_an_attempt_records_nothing_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    from agentbolt.tracing import emit

    emit._warned_outside.clear()
    with caplog.at_level(logging.WARNING, logger="agentbolt.tracing.emit"):
        assert emit_reward(1.0) is None
        assert emit_reward(2.0) is None
        assert emit_message("hi") is None
        assert emit_object({"a": 1}) is None
        assert emit_exception(ValueError("x")) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 4 and all("outside a rollout attempt" in w for w in warnings)
    assert current_attempt() is None


# ------------------------------------------------------------------------------------------------ other emitters


@dataclass
class Point:
    x: int
    y: float


class Answer(BaseModel):
    text: str
    score: float


def test_message_object_exception() -> None:
    with trace_attempt(instrument=False) as attempt:
        emit_message("thinking about it", attributes={"step": 3})
        emit_object({"point": Point(1, 2.5), "answer": Answer(text="42", score=0.9), "tags": {"b", "a"}})
        try:
            raise KeyError("missing")
        except KeyError as exc:
            emit_exception(exc)
        with pytest.raises(ConfigError, match="use emit_object"):
            emit_message({"not": "text"})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="exception instance"):
            emit_exception("boom")  # type: ignore[arg-type]
    message, obj, exc_span = attempt.spans
    assert message.name == semconv.SPAN_MESSAGE
    assert message.attributes[semconv.MESSAGE_TEXT] == "thinking about it" and message.attributes["step"] == 3
    assert obj.name == semconv.SPAN_OBJECT and obj.attributes[semconv.OBJECT_TYPE] == "dict"
    assert json.loads(obj.attributes[semconv.OBJECT_JSON]) == {
        "point": {"x": 1, "y": 2.5},
        "answer": {"text": "42", "score": 0.9},
        "tags": ["a", "b"],
    }
    assert exc_span.name == semconv.SPAN_EXCEPTION and exc_span.status.code == "ERROR"
    assert exc_span.status.description == "KeyError: 'missing'"
    assert exc_span.attributes[semconv.EXCEPTION_TYPE] == "KeyError"
    assert exc_span.attributes[semconv.EXCEPTION_MESSAGE] == "'missing'"
    assert 'raise KeyError("missing")' in exc_span.attributes[semconv.EXCEPTION_STACKTRACE]


def test_json_text_is_bounded_and_valid() -> None:
    limits = JsonLimits(max_chars=10_000, max_string_chars=5, max_items=3, max_depth=2)
    cyclic: list[object] = [1]
    cyclic.append(cyclic)
    value = {
        "long": "abcdefghij",
        "many": list(range(10)),
        "deep": {"a": {"b": {"c": 1}}},
        "nan": float("nan"),
        "bytes": b"\x00\x01",
        "cycle": cyclic,
    }
    assert json.loads(to_json_text(value, limits)) == {
        "long": "abcde…[+5 chars]",
        "many": [0, 1, 2, "…[+7 items]"],
        "deep": {"a": "{'b':…[+10 chars]"},  # repr of {'b': {'c': 1}}, cut to 5 chars
        "…": "…[+3 items]",
    }
    assert json.loads(to_json_text(cyclic, limits)) == [1, "<cycle>"]
    assert json.loads(to_json_text({"nan": float("nan"), "b": b"ab"})) == {"nan": "nan", "b": "<2 bytes>"}
    text = to_json_text("x" * 100, JsonLimits(max_chars=20, max_string_chars=1000))
    assert json.loads(text) == '"' + "x" * 19 + "…[+82 chars]"
    with pytest.raises(ValueError, match="max_items"):
        JsonLimits(max_items=0)


# ---------------------------------------------------------------------------------------------------- @operation


class Toolbox:
    @operation
    def add(self, a: int, b: int = 10) -> int:
        emit_reward(0.5, name="add_called")
        return a + b

    @operation(name="fetch", record_output=False)
    async def fetch(self, key: str, *more: str, **options: object) -> dict[str, object]:
        await asyncio.sleep(0)
        emit_message(f"fetched {key}")
        return {"key": key}


def test_operation_records_inputs_outputs_and_nesting() -> None:
    tools = Toolbox()

    @operation
    def plan(steps: list[str]) -> str:
        total = tools.add(1)
        result = asyncio.run(tools.fetch("k", "x", "y", verbose=True))
        return f"{len(steps)} steps, {total}, {result['key']}"

    with trace_attempt(instrument=False) as attempt:
        out = plan(["a", "b"])
    assert out == "2 steps, 11, k"
    names = [s.name for s in attempt.spans]
    assert names == [
        semconv.SPAN_REWARD,
        semconv.SPAN_OPERATION,  # add
        semconv.SPAN_MESSAGE,
        semconv.SPAN_OPERATION,  # fetch
        semconv.SPAN_OPERATION,  # plan
    ]
    reward, add, message, fetch, plan_span = attempt.spans
    assert (
        plan_span.attributes[semconv.OPERATION_NAME]
        == "test_operation_records_inputs_outputs_and_nesting.<locals>.plan"
    )
    assert add.attributes[semconv.OPERATION_NAME] == "Toolbox.add"
    assert fetch.attributes[semconv.OPERATION_NAME] == "fetch"
    assert _input(plan_span) == {"steps": ["a", "b"]}
    assert _input(add) == {"a": 1, "b": 10}  # default applied, self dropped
    assert _input(fetch) == {"key": "k", "more": ["x", "y"], "options": {"verbose": True}}
    assert _output(plan_span) == "2 steps, 11, k" and _output(add) == 11
    assert semconv.OPERATION_OUTPUT not in fetch.attributes
    # nesting: plan is the root; add and fetch under plan; the reward under add; the message under fetch
    assert plan_span.parent_id is None
    assert add.parent_id == plan_span.span_id and fetch.parent_id == plan_span.span_id
    assert reward.parent_id == add.span_id and message.parent_id == fetch.span_id
    assert {s.trace_id for s in attempt.spans} == {attempt.trace_id}
    assert all(s.status.code == "UNSET" for s in attempt.spans)


def test_exception_in_the_third_of_five_operations() -> None:
    """The third step raises: its span is ERROR with the exception, the exception propagates through the caller's
    operation, steps 4 and 5 never run, and trace_attempt records the exception that left the block."""
    ran: list[int] = []

    @operation
    def step(i: int) -> int:
        ran.append(i)
        if i == 3:
            raise RuntimeError(f"step {i} broke")
        emit_reward(i / 10, name=f"step{i}")
        return i * i

    @operation
    def run_all(n: int) -> list[int]:
        return [step(i) for i in range(1, n + 1)]

    with pytest.raises(RuntimeError, match="step 3 broke"), trace_attempt(instrument=False) as attempt:
        run_all(5)
    assert ran == [1, 2, 3]
    ops = _by_name(attempt.spans, semconv.SPAN_OPERATION)
    assert [(_input(s), s.status.code) for s in ops] == [
        ({"i": 1}, "UNSET"),
        ({"i": 2}, "UNSET"),
        ({"i": 3}, "ERROR"),
        ({"n": 5}, "ERROR"),
    ]
    third, outer = ops[2], ops[3]
    assert third.status.description == "RuntimeError: step 3 broke"
    assert third.attributes[semconv.EXCEPTION_TYPE] == "RuntimeError"
    assert third.attributes[semconv.EXCEPTION_MESSAGE] == "step 3 broke"
    assert semconv.OPERATION_OUTPUT not in third.attributes
    [event] = third.attributes[semconv.OTLP_EVENTS]
    assert event["name"] == "exception" and "step 3 broke" in event["attributes"]["exception.stacktrace"]
    assert [_output(s) for s in ops[:2]] == [1, 4]
    assert [s.attributes[semconv.REWARD_NAME] for s in _by_name(attempt.spans, semconv.SPAN_REWARD)] == [
        "step1",
        "step2",
    ]
    [recorded] = _by_name(attempt.spans, semconv.SPAN_EXCEPTION)
    assert recorded.attributes[semconv.EXCEPTION_MESSAGE] == "step 3 broke"
    assert attempt.spans[-1] is recorded and recorded.parent_id is None
    assert all(s.parent_id == outer.span_id for s in ops[:3])


def test_operation_outside_an_attempt_just_calls() -> None:
    @operation
    def double(x: int) -> int:
        return 2 * x

    @operation
    async def adouble(x: int) -> int:
        return 2 * x

    assert double(4) == 8
    assert asyncio.run(adouble(5)) == 10
    assert not trace.get_current_span().get_span_context().is_valid


def test_operation_refuses_generators() -> None:
    with pytest.raises(ConfigError, match="generator"):

        @operation
        def gen() -> object:
            yield 1

    with pytest.raises(ConfigError, match="generator"):

        @operation(name="agen")
        async def agen() -> object:
            yield 1


def test_async_operation_error_and_concurrent_attempts() -> None:
    """Two attempts run concurrently on one loop; each span lands in its own attempt, errors re-raised."""

    @operation
    async def work(tag: str, fail: bool) -> str:
        await asyncio.sleep(0.01)
        emit_message(tag)
        if fail:
            raise ValueError(tag)
        return tag

    async def one(tag: str, fail: bool) -> LocalAttempt:
        async with trace_attempt(instrument=False) as attempt:
            for i in range(3):
                try:
                    await work(f"{tag}{i}", fail and i == 1)
                except ValueError as exc:
                    emit_exception(exc)
        return attempt

    async def main() -> tuple[LocalAttempt, LocalAttempt]:
        a, b = await asyncio.gather(one("a", False), one("b", True))
        return a, b

    a, b = asyncio.run(main())
    assert [s.attributes[semconv.MESSAGE_TEXT] for s in _by_name(a.spans, semconv.SPAN_MESSAGE)] == ["a0", "a1", "a2"]
    assert [s.attributes[semconv.MESSAGE_TEXT] for s in _by_name(b.spans, semconv.SPAN_MESSAGE)] == ["b0", "b1", "b2"]
    assert [s.status.code for s in _by_name(b.spans, semconv.SPAN_OPERATION)] == ["UNSET", "ERROR", "UNSET"]
    assert len(_by_name(b.spans, semconv.SPAN_EXCEPTION)) == 1 and not _by_name(a.spans, semconv.SPAN_EXCEPTION)
    assert {s.trace_id for s in a.spans} == {a.trace_id} and {s.trace_id for s in b.spans} == {b.trace_id}
    assert a.trace_id != b.trace_id


# -------------------------------------------------------------------------------------------------------- threads


def test_threads_with_a_copied_context_stay_in_the_attempt() -> None:
    @operation
    def parent() -> None:
        ctx = contextvars.copy_context()
        worker = threading.Thread(target=ctx.run, args=(emit_message, "from a copied context"))
        worker.start()
        worker.join()
        # a plain thread loses the attempt, unless it is handed the parent span explicitly
        parent_ctx = trace.set_span_in_context(trace.get_current_span())
        plain = threading.Thread(target=lambda: (emit_message("lost"), _child_span(parent_ctx)))
        plain.start()
        plain.join()

    with trace_attempt(instrument=False) as attempt:
        parent()
    message, child, op = attempt.spans
    assert message.attributes[semconv.MESSAGE_TEXT] == "from a copied context" and message.parent_id == op.span_id
    assert child.name == "explicit-child" and child.parent_id == op.span_id
    assert child.attributes[semconv.ATTEMPT_ID] == attempt.attempt_id


def _child_span(parent_ctx: object) -> None:
    from agentbolt.tracing.otel import agentbolt_tracer

    agentbolt_tracer().start_span("explicit-child", context=parent_ctx).end()  # type: ignore[arg-type]


def test_spans_outside_attempts_are_not_recorded() -> None:
    from agentbolt.tracing.otel import agentbolt_tracer

    span = agentbolt_tracer().start_span("outside")
    assert not span.is_recording()
    span.end()


# ---------------------------------------------------------------------------------------------------- trace_attempt


def test_trace_attempt_ids_and_store_writes() -> None:
    async def main() -> None:
        store = InMemoryLightningStore()
        rollout = await store.enqueue_rollout({"q": 1})
        claimed = await store.claim_rollout("w")
        assert claimed is not None
        attempt_id = claimed.attempt.attempt_id
        async with trace_attempt(rollout.rollout_id, attempt_id, store=store, instrument=False) as attempt:
            emit_reward(0.5, name="x")
            emit_reward(1.0)
        stored = await store.query_spans(rollout.rollout_id, attempt_id)
        assert [s.sequence_id for s in stored] == [1, 2]
        assert [s.model_dump(exclude={"sequence_id"}) for s in stored] == [
            s.model_dump(exclude={"sequence_id"}) for s in attempt.spans
        ]
        with (
            pytest.raises(ConfigError, match="async store"),
            trace_attempt(rollout.rollout_id, attempt_id, store=store, instrument=False),
        ):
            pass
        with pytest.raises(NotFoundError):
            async with trace_attempt(rollout.rollout_id, "at-missing", store=store, instrument=False):
                emit_reward(1.0)
        await store.close()

    asyncio.run(main())
    with pytest.raises(ConfigError, match="rollout_id and attempt_id"):
        trace_attempt(store=InMemoryLightningStore())
    with trace_attempt(instrument=False) as attempt:
        assert current_attempt() is attempt
        assert attempt.rollout_id.startswith("ro-local-") and attempt.attempt_id.startswith("at-local-")
    assert current_attempt() is None


def test_trace_attempt_with_a_blocking_store() -> None:
    class BlockingStore:
        def __init__(self) -> None:
            self.received: list[Span] = []

        def add_spans(self, spans: list[Span]) -> list[Span]:
            self.received.extend(spans)
            return spans

    store = BlockingStore()
    with trace_attempt("ro-1", "at-1", store=store, instrument=False) as attempt:
        emit_message("hello")
    assert store.received == attempt.spans and len(store.received) == 1

    async def main() -> None:
        with pytest.raises(ConfigError, match="blocking store"):
            async with trace_attempt("ro-1", "at-1", store=store, instrument=False):
                pass

    asyncio.run(main())


def test_sdk_disabled_by_environment_is_a_clear_error() -> None:
    """OTEL_SDK_DISABLED=true would silently drop every reward; agentbolt refuses it (fresh process: the tracer
    provider is made once per process)."""
    code = (
        "from agentbolt import emit_reward, trace_attempt\n"
        "from agentbolt.errors import ConfigError\n"
        "try:\n"
        "    with trace_attempt(instrument=False):\n"
        "        emit_reward(1.0)\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "OTEL_SDK_DISABLED": "true"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "OTEL_SDK_DISABLED=true turns OpenTelemetry off" in out.stdout


def test_trace_attempt_applies_the_runners_rule_to_the_returned_value() -> None:
    """Found by a new-user pass: the debugging helper ignored what the agent returned, so it could not show a
    returned reward, nor reproduce a bad_reward or no_reward failure."""
    import pytest as _pytest

    from agentbolt import emit_reward, trace_attempt
    from agentbolt.errors import RewardError

    def agent(task: dict) -> object:
        emit_reward(0.5)
        return task["give"]

    with trace_attempt(instrument=False) as attempt:
        assert attempt.returned(agent({"give": 1.0})) == 1.0  # the returned reward wins, recorded last
    assert [s.attributes["agentbolt.reward.value"] for s in attempt.spans] == [0.5, 1.0]
    with trace_attempt(instrument=False) as attempt:
        assert attempt.returned(agent({"give": None})) == 0.5  # None keeps the emitted one
    with trace_attempt(instrument=False) as attempt, _pytest.raises(RewardError, match="'1' \\(str\\) is not a reward"):
        attempt.returned("1")
    with trace_attempt(instrument=False) as attempt:
        assert attempt.returned(None) is None  # a runner fails this attempt: no_reward
