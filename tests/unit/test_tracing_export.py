"""The export side of tracing, with real SDK spans and in-process exporters (no network):

- ``ExportQueue``: ``on_end`` never waits on the exporter; spans go out in the order they ended, one attempt per
  export call; ``flush`` resolves only once everything queued before it is handled, and times out otherwise;
  per-attempt counts of exported / failed / dropped spans; shutdown drains the queue;
- ``StoreSpanExporter`` writes into an in-memory store on its loop, and refuses to run on that loop;
- ``span_from_otel`` keeps ids, parents, times, kind, status, events, links, scope and resource;
- ``instrument``: unknown names, frameworks or instrumentors that are not installed (clear messages), and the
  counted acquire/release of the ``openai`` instrumentor.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from agentbolt import emit_message, emit_reward, semconv, trace_attempt
from agentbolt.errors import ConfigError
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracing import AttemptContext, attempt_scope, instrumentors
from agentbolt.tracing.convert import span_from_otel
from agentbolt.tracing.export import ExportQueue, StoreSpanExporter
from agentbolt.tracing.otel import agentbolt_tracer


class GatedExporter(SpanExporter):
    """Records each export call; blocks while ``gate`` is clear; fails the attempts named in ``fail``."""

    def __init__(self, fail: Sequence[str] = ()) -> None:
        self.calls: list[list[str]] = []
        self.attempts: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = set(fail)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.gate.wait()
        attempt_ids = {str((s.attributes or {})[semconv.ATTEMPT_ID]) for s in spans}
        assert len(attempt_ids) == 1, "one attempt per export call"
        [attempt_id] = attempt_ids
        self.calls.append([str((s.attributes or {})[semconv.MESSAGE_TEXT]) for s in spans])
        self.attempts.append(attempt_id)
        return SpanExportResult.FAILURE if attempt_id in self.fail else SpanExportResult.SUCCESS


def _emit(ctx: AttemptContext, *texts: str) -> None:
    with attempt_scope(ctx):
        for text in texts:
            emit_message(text)


def test_export_queue_is_prompt_ordered_and_counts_per_attempt() -> None:
    exporter = GatedExporter(fail=["at-bad"])
    queue = ExportQueue(exporter, max_batch_size=3)
    good = AttemptContext("ro-1", "at-good", export=queue)
    bad = AttemptContext("ro-2", "at-bad", export=queue)

    exporter.gate.clear()  # the exporter hangs: emitting must still return at once
    t0 = time.perf_counter()
    _emit(good, "g1")
    time.sleep(0.05)  # the worker has taken g1 and waits in export()
    _emit(good, "g2", "g3", "g4", "g5")
    _emit(bad, "b1", "b2")
    assert time.perf_counter() - t0 < 1.0
    assert not queue.force_flush(timeout_millis=50)  # still blocked: the flush times out
    exporter.gate.set()
    assert queue.force_flush(timeout_millis=5000)
    # g1 alone, then batches of at most 3 in end order, split by attempt
    assert exporter.calls == [["g1"], ["g2", "g3", "g4"], ["g5"], ["b1", "b2"]]
    assert exporter.attempts == ["at-good", "at-good", "at-good", "at-bad"]
    g, b = queue.take_attempt_counts("at-good"), queue.take_attempt_counts("at-bad")
    assert (g.exported, g.failed, g.dropped) == (5, 0, 0)
    assert (b.exported, b.failed, b.dropped) == (0, 2, 0)
    assert queue.take_attempt_counts("at-good").exported == 0  # taken
    assert (queue.totals.exported, queue.totals.failed) == (5, 2)
    queue.shutdown()
    _emit(good, "after shutdown")
    assert queue.take_attempt_counts("at-good").dropped == 1


def test_export_queue_drops_beyond_its_bound_and_flushes_async() -> None:
    exporter = GatedExporter()
    queue = ExportQueue(exporter, max_queue_size=2, max_batch_size=1)
    ctx = AttemptContext("ro-1", "at-1", export=queue)
    exporter.gate.clear()
    _emit(ctx, "m0")
    time.sleep(0.05)  # m0 is in export(); the queue is empty again
    _emit(ctx, "m1", "m2", "m3", "m4")  # room for two

    async def main() -> tuple[bool, bool]:
        timed_out = await queue.flush(timeout_s=0.05)
        exporter.gate.set()
        return timed_out, await queue.flush(timeout_s=5)

    assert asyncio.run(main()) == (False, True)
    assert exporter.calls == [["m0"], ["m1"], ["m2"]]
    counts = queue.take_attempt_counts("at-1")
    assert (counts.exported, counts.failed, counts.dropped) == (3, 0, 2)
    assert len(ctx.spans) == 5  # dropped from the export only; the attempt still saw them
    queue.shutdown()


def test_export_queue_shutdown_drains() -> None:
    exporter = GatedExporter()
    queue = ExportQueue(exporter)
    ctx = AttemptContext("ro-1", "at-1", export=queue)
    exporter.gate.clear()
    _emit(ctx, *[f"m{i}" for i in range(20)])
    threading.Timer(0.05, exporter.gate.set).start()
    queue.shutdown(timeout_s=5)
    assert [t for call in exporter.calls for t in call] == [f"m{i}" for i in range(20)]


def test_store_exporter_writes_on_the_store_loop() -> None:
    async def main() -> None:
        store = InMemoryLightningStore()
        rollout = await store.enqueue_rollout({"q": 1})
        claimed = await store.claim_rollout("w")
        assert claimed is not None
        queue = ExportQueue(StoreSpanExporter(store, asyncio.get_running_loop()))
        ctx = AttemptContext(rollout.rollout_id, claimed.attempt.attempt_id, export=queue)
        lost = AttemptContext(rollout.rollout_id, "at-unknown", export=queue)
        _emit(ctx, "one", "two")
        _emit(lost, "nowhere")
        with attempt_scope(ctx):
            emit_reward(1.0)
        assert await queue.flush(5)
        stored = await store.query_spans(rollout.rollout_id, claimed.attempt.attempt_id)
        assert [s.model_dump(exclude={"sequence_id"}) for s in stored] == [
            s.model_dump(exclude={"sequence_id"}) for s in ctx.spans
        ]
        assert [s.sequence_id for s in stored] == [1, 2, 3]
        assert queue.take_attempt_counts("at-unknown").failed == 1
        # on the store's own loop the exporter refuses instead of deadlocking
        exporter = StoreSpanExporter(store, asyncio.get_running_loop())
        assert exporter.export([]) is SpanExportResult.FAILURE
        await asyncio.to_thread(queue.shutdown)
        await store.close()

    asyncio.run(main())


def test_span_from_otel_keeps_everything() -> None:
    with trace_attempt("ro-9", "at-9", instrument=False) as attempt:
        tracer = agentbolt_tracer()
        with tracer.start_as_current_span("outer", kind=SpanKind.CLIENT) as outer:
            outer.add_event("thing", {"n": 1, "tags": ["a", "b"]})
            inner = tracer.start_span("inner", links=[Link(outer.get_span_context(), {"why": "test"})])
            inner.set_attribute("ints", [1, 2, 3])
            inner.set_status(Status(StatusCode.ERROR, "bad"))
            inner.end()
    inner_span, outer_span = attempt.spans
    ctx = outer.get_span_context()
    assert outer_span.span_id == format(ctx.span_id, "016x") and outer_span.trace_id == attempt.trace_id
    assert inner_span.parent_id == outer_span.span_id and outer_span.parent_id is None
    assert inner_span.attributes["ints"] == [1, 2, 3]
    assert inner_span.status.code == "ERROR" and inner_span.status.description == "bad"
    assert inner_span.attributes[semconv.OTLP_LINKS] == [
        {"trace_id": attempt.trace_id, "span_id": outer_span.span_id, "attributes": {"why": "test"}}
    ]
    assert outer_span.attributes[semconv.OTLP_SPAN_KIND] == "CLIENT"
    assert semconv.OTLP_SPAN_KIND not in inner_span.attributes
    [event] = outer_span.attributes[semconv.OTLP_EVENTS]
    assert event["name"] == "thing" and event["attributes"] == {"n": 1, "tags": ["a", "b"]}
    assert outer_span.attributes[semconv.OTEL_SCOPE_NAME] == "agentbolt"
    assert outer_span.attributes[semconv.OTLP_RESOURCE]["service.name"] == "agentbolt-agent"
    assert outer_span.start_time <= inner_span.start_time <= inner_span.end_time <= outer_span.end_time  # type: ignore[operator]
    assert outer_span.attributes[semconv.ROLLOUT_ID] == "ro-9"
    unattributed = ReadableSpan(
        name="x", context=SpanContext(1, 2, is_remote=False), attributes={"k": "v"}, resource=Resource({})
    )
    with pytest.raises(ValueError, match="names no attempt"):
        span_from_otel(unattributed)
    assert span_from_otel(unattributed, "ro-1", "at-1").attributes == {"k": "v"}


# ---------------------------------------------------------------------------------------------- instrumentors


def test_instrument_errors_say_what_to_install() -> None:
    with pytest.raises(ConfigError, match="unknown framework 'nope'; agentbolt can instrument autogen-agentchat"):
        instrumentors.instrument("nope")
    with pytest.raises(instrumentors.FrameworkUnavailable, match="pip install openinference-instrumentation-autogen"):
        instrumentors.instrument(["autogen-agentchat"])
    try:
        import langchain_core  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("langchain-core is installed here; the missing-framework message cannot be checked")
    try:
        import openinference.instrumentation.langchain  # noqa: F401
    except ImportError:
        pytest.skip("openinference-instrumentation-langchain is not installed (pip install 'agentbolt[integrations]')")
    with pytest.raises(instrumentors.FrameworkUnavailable, match=r"needs langchain_core .*pip install langchain-core"):
        instrumentors.instrument("langchain")
    assert "langchain" not in instrumentors.available_frameworks()


def test_acquire_release_counts_users() -> None:
    oi_openai = pytest.importorskip(
        "openinference.instrumentation.openai", reason="pip install openinference-instrumentation-openai"
    )
    instrumentor = oi_openai.OpenAIInstrumentor()
    assert not instrumentor.is_instrumented_by_opentelemetry
    try:
        first = instrumentors.acquire(["openai"])
        second = instrumentors.acquire(None)  # every available framework: openai at least
        assert first == ["openai"] and "openai" in second
        assert instrumentor.is_instrumented_by_opentelemetry
        instrumentors.release(first)
        assert instrumentor.is_instrumented_by_opentelemetry  # still held by the second user
        instrumentors.release(second)
        assert not instrumentor.is_instrumented_by_opentelemetry
        assert instrumentors.instrument("openai") == ["openai"]
        instrumentors.release(instrumentors.acquire("openai"))
        assert instrumentor.is_instrumented_by_opentelemetry  # kept by instrument()
    finally:
        instrumentors.uninstrument()
    assert not instrumentor.is_instrumented_by_opentelemetry and instrumentors.instrumented() == []
