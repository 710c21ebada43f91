"""The runner's tracing, end to end, without a model: a real server on 127.0.0.1 over a real SQLite store.

Two ways into the store, same agent, same expectations:
- ``otlp``: the runner talks to the server through ``HttpLightningStore`` (with a bearer token); spans go over
  OTLP/HTTP (protobuf) to ``POST /v1/traces``;
- ``in-process``: the runner holds the SQLite store itself; spans go straight to ``store.add_spans``.

Pinned per attempt (exact values): final reward = returned number, else the last unnamed ``emit_reward``; named
rewards kept in order; an exception in the third of five ``@operation`` steps, caught (attempt succeeds, step 3 is
``ERROR``, steps 4 and 5 run) or not (attempt fails with the error, steps 4 and 5 never run, the runner records the
exception last); every span attributed to its own attempt, one trace per attempt, every parent id is a span of the
same attempt, store sequence = the order spans ended. Both paths store equal spans (ids and times aside). Nothing is
lost at attempt end, even behind a slow exporter; export failures are counted, not raised.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from agentbolt import emit_exception, emit_message, emit_reward, operation, rollout, semconv
from agentbolt.client import HttpLightningStore
from agentbolt.runner.worker import Runner
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.base import LightningStore
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.tracing import FrameworkUnavailable
from agentbolt.tracing.export import StoreSpanExporter
from agentbolt.types import AttemptStatus, Rollout, RolloutStatus, Span

TOKEN = "tracing-test-token"
MODES = ["rewards", "returns", "caught", "raises"]


@operation
def step(i: int, fail_at: int) -> int:
    if i == fail_at:
        raise RuntimeError(f"step {i} broke")
    emit_reward(i / 10, name=f"step{i}")
    return i * i


@operation(name="body")
def body(mode: str) -> float | None:
    if mode == "rewards":
        emit_reward(0.1, name="format")
        emit_reward(0.4)
        emit_reward(0.2, name="tool")
        emit_reward(0.9)
        emit_reward(0.3, name="late")
        return None
    if mode == "returns":
        emit_reward(0.5)
        return 2.0
    if mode == "caught":
        for i in range(1, 6):
            try:
                step(i, 3)
            except RuntimeError as exc:
                emit_exception(exc)
        emit_reward(1.0)
        return None
    for i in range(1, 6):  # "raises"
        step(i, 3)
    return None


@rollout
def traced_agent(task: dict) -> float | None:
    emit_message(f"start {task['mode']}")
    return body(task["mode"])


def _ops(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.name == semconv.SPAN_OPERATION]


def _rewards(spans: list[Span]) -> list[tuple[str | None, float]]:
    return [
        (s.attributes.get(semconv.REWARD_NAME), s.attributes[semconv.REWARD_VALUE])
        for s in spans
        if s.name == semconv.SPAN_REWARD
    ]


async def _run_modes(
    store: LightningStore, runner_store: LightningStore, **runner_kw: Any
) -> tuple[list[Rollout], Runner]:
    rollouts = [await store.enqueue_rollout({"mode": mode}) for mode in MODES]
    runner = Runner(
        traced_agent,
        runner_store,
        worker_id="w-trace",
        concurrency=2,
        poll_interval_s=0.02,
        instrument=False,
        **runner_kw,
    )
    stop = asyncio.Event()
    run_task = asyncio.create_task(runner.run(stop=stop))
    done = await store.wait_for_rollouts([r.rollout_id for r in rollouts], timeout_s=60)
    stop.set()
    await run_task
    return done, runner


def _check_attempt(mode: str, rollout: Rollout, spans: list[Span], attempt_id: str) -> None:
    """The exact expectations for one mode (shared by both export paths)."""
    assert all(s.rollout_id == rollout.rollout_id and s.attempt_id == attempt_id for s in spans)
    assert all(s.attributes[semconv.ATTEMPT_ID] == attempt_id for s in spans)
    assert [s.sequence_id for s in spans] == list(range(1, len(spans) + 1))
    assert len({s.trace_id for s in spans}) == 1
    ids = {s.span_id for s in spans}
    assert all(s.parent_id is None or s.parent_id in ids for s in spans)
    by_id = {s.span_id: s for s in spans}
    assert spans[0].name == semconv.SPAN_MESSAGE and spans[0].attributes[semconv.MESSAGE_TEXT] == f"start {mode}"
    [body_span] = [s for s in _ops(spans) if s.attributes[semconv.OPERATION_NAME] == "body"]
    steps = [s for s in _ops(spans) if s.attributes[semconv.OPERATION_NAME] == "step"]
    assert all(s.parent_id == body_span.span_id for s in steps)
    assert json.loads(body_span.attributes[semconv.OPERATION_INPUT]) == {"mode": mode}

    if mode == "rewards":
        assert rollout.status is RolloutStatus.SUCCEEDED and rollout.final_reward == 0.9
        assert _rewards(spans) == [("format", 0.1), (None, 0.4), ("tool", 0.2), (None, 0.9), ("late", 0.3)]
        assert all(by_id[s.parent_id].name == semconv.SPAN_OPERATION for s in spans if s.name == semconv.SPAN_REWARD)
        assert spans[-1] is body_span and json.loads(body_span.attributes[semconv.OPERATION_OUTPUT]) is None
    elif mode == "returns":
        assert rollout.status is RolloutStatus.SUCCEEDED and rollout.final_reward == 2.0
        assert _rewards(spans) == [(None, 0.5), (None, 2.0)]
        assert spans[-1].name == semconv.SPAN_REWARD and spans[-1].parent_id is None  # recorded by the runner, last
        assert json.loads(body_span.attributes[semconv.OPERATION_OUTPUT]) == 2.0
    elif mode == "caught":
        assert rollout.status is RolloutStatus.SUCCEEDED and rollout.final_reward == 1.0
        assert [json.loads(s.attributes[semconv.OPERATION_INPUT])["i"] for s in steps] == [1, 2, 3, 4, 5]
        assert [s.status.code for s in steps] == ["UNSET", "UNSET", "ERROR", "UNSET", "UNSET"]
        assert steps[2].status.description == "RuntimeError: step 3 broke"
        [exc_span] = [s for s in spans if s.name == semconv.SPAN_EXCEPTION]
        assert exc_span.parent_id == body_span.span_id and exc_span.attributes[semconv.EXCEPTION_TYPE] == "RuntimeError"
        assert _rewards(spans) == [("step1", 0.1), ("step2", 0.2), ("step4", 0.4), ("step5", 0.5), (None, 1.0)]
        assert body_span.status.code == "UNSET"
    else:  # raises
        assert rollout.status is RolloutStatus.FAILED and rollout.final_reward is None
        assert [json.loads(s.attributes[semconv.OPERATION_INPUT])["i"] for s in steps] == [1, 2, 3]
        assert [s.status.code for s in steps] == ["UNSET", "UNSET", "ERROR"]
        assert body_span.status.code == "ERROR" and body_span.status.description == "RuntimeError: step 3 broke"
        assert _rewards(spans) == [("step1", 0.1), ("step2", 0.2)]
        exc_span = spans[-1]  # recorded by the runner after the agent raised
        assert exc_span.name == semconv.SPAN_EXCEPTION and exc_span.parent_id is None
        assert exc_span.attributes[semconv.EXCEPTION_MESSAGE] == "step 3 broke"
        assert "in step" in exc_span.attributes[semconv.EXCEPTION_STACKTRACE]


def _normalized(spans: list[Span]) -> list[tuple[str, str | None, dict[str, Any], str]]:
    """Spans without what differs between two runs: ids, times, the attempt, stack traces."""
    by_id = {s.span_id: s for s in spans}
    out = []
    for s in spans:
        attrs = {
            k: v
            for k, v in s.attributes.items()
            if k not in (semconv.ROLLOUT_ID, semconv.ATTEMPT_ID, semconv.EXCEPTION_STACKTRACE, semconv.OTLP_EVENTS)
        }
        events = [e["name"] for e in s.attributes.get(semconv.OTLP_EVENTS, [])]
        parent = by_id[s.parent_id].name if s.parent_id else None
        out.append((s.name, parent, {**attrs, "events": events}, s.status.code))
    return out


def test_runner_exports_spans_over_otlp_and_in_process_alike(tmp_path: Path) -> None:
    async def main() -> dict[str, dict[str, list[Span]]]:
        results: dict[str, dict[str, list[Span]]] = {}
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            async with serve_in_background(create_app(store, token=TOKEN)) as url:
                client = HttpLightningStore(url, token=TOKEN)
                for path, runner_store in (("otlp", client), ("in-process", store)):
                    t0 = time.perf_counter()
                    done, runner = await _run_modes(store, runner_store)
                    per_mode: dict[str, list[Span]] = {}
                    for mode, r in zip(MODES, done, strict=True):
                        [attempt] = await store.query_attempts(r.rollout_id)
                        spans = await store.query_spans(r.rollout_id, attempt.attempt_id)
                        _check_attempt(mode, r, spans, attempt.attempt_id)
                        per_mode[mode] = spans
                    total = sum(len(v) for v in per_mode.values())
                    assert runner.stats.spans_written == total and runner.stats.span_write_errors == 0
                    assert (runner.stats.succeeded, runner.stats.failed) == (3, 1)
                    results[path] = per_mode
                    print(f"{path}: {total} spans, {time.perf_counter() - t0:.2f} s")
                await client.close()
        finally:
            await store.close()
        return results

    results = asyncio.run(main())
    traces = {spans[0].trace_id for per_mode in results.values() for spans in per_mode.values()}
    assert len(traces) == 2 * len(MODES)  # one trace per attempt
    for mode in MODES:
        assert _normalized(results["otlp"][mode]) == _normalized(results["in-process"][mode])


class SlowExporter(SpanExporter):
    """Delays every export, then delegates; or fails every export when ``inner`` is None."""

    def __init__(self, inner: SpanExporter | None, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        time.sleep(self.delay_s)
        return self.inner.export(spans) if self.inner is not None else SpanExportResult.FAILURE


@rollout
def chatty_agent(task: dict) -> None:
    for i in range(task["n"]):
        emit_message(f"m{i}")
    emit_reward(0.5)


def test_nothing_is_lost_at_attempt_end_and_failures_are_counted(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            slow = SlowExporter(StoreSpanExporter(store, asyncio.get_running_loop()), delay_s=0.05)
            for exporter, n in ((slow, 300), (SlowExporter(None, 0.0), 20)):
                r = await store.enqueue_rollout({"n": n})
                runner = Runner(chatty_agent, store, poll_interval_s=0.02, instrument=False, span_exporter=exporter)
                stop = asyncio.Event()
                task = asyncio.create_task(runner.run(stop=stop))
                [done] = await store.wait_for_rollouts([r.rollout_id], timeout_s=60)
                # the attempt was reported only after its spans were exported: they are all there already
                spans = await store.query_spans(r.rollout_id)
                stop.set()
                await task
                assert done.status is RolloutStatus.SUCCEEDED and done.final_reward == 0.5
                [attempt] = await store.query_attempts(r.rollout_id)
                assert attempt.status is AttemptStatus.SUCCEEDED
                if exporter is slow:
                    assert len(spans) == n + 1 and [s.attributes.get(semconv.MESSAGE_TEXT) for s in spans[:3]] == [
                        "m0",
                        "m1",
                        "m2",
                    ]
                    assert slow.calls >= 2  # more than one batch went through the slow exporter
                    assert runner.stats.spans_written == n + 1 and runner.stats.span_write_errors == 0
                else:
                    assert spans == []
                    assert runner.stats.span_write_errors == n + 1 and runner.stats.spans_written == 0
        finally:
            await store.close()

    asyncio.run(main())


def test_a_named_framework_that_is_not_installed_fails_the_runner(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            r = await store.enqueue_rollout({"n": 1})
            runner = Runner(chatty_agent, store, instrument=["autogen-agentchat"])
            with pytest.raises(
                FrameworkUnavailable, match="pip install openinference-instrumentation-autogen-agentchat"
            ):
                await runner.run(stop=lambda: False)
            assert (await store.get_rollout(r.rollout_id)).status is RolloutStatus.QUEUING  # nothing was claimed
        finally:
            await store.close()

    asyncio.run(main())
