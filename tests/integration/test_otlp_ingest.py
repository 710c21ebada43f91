"""OTLP/HTTP ingestion (``POST /v1/traces``) against a real server on 127.0.0.1 and a real SQLite store.

- the real OpenTelemetry SDK with the real ``OTLPSpanExporter`` (protobuf, plain and gzip) writes spans that are read
  back from the store with equal names, ids, parents, times, status, events and attributes;
- attribution: resource attributes name the attempt unless the span's own attributes say otherwise (key by key);
- a hand-written OTLP/JSON body (hex ids, camelCase, int64 as strings, every AnyValue kind) round-trips exactly;
- rejections: partial success when some spans lack attribution, 400 when all do, 404 for an unknown attempt (nothing
  stored), errors in the request's encoding (protobuf ``google.rpc.Status`` checked with googleapis' own class).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode

from agentbolt import semconv
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import Span

TOKEN = "otlp-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RESERVED = {
    semconv.OTEL_SCOPE_NAME,
    semconv.OTEL_SCOPE_VERSION,
    semconv.OTLP_SPAN_KIND,
    semconv.OTLP_RESOURCE,
    semconv.OTLP_EVENTS,
    semconv.OTLP_LINKS,
}


class RecordingExporter(SpanExporter):
    """Delegates to the real exporter and keeps each export's result (the SDK only logs failures)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.results: list[SpanExportResult] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        self.results.append(result)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


async def _two_attempts(store: SqliteLightningStore) -> list[tuple[str, str]]:
    ids = []
    for x in (1, 2):
        await store.enqueue_rollout({"x": x})
        claimed = await store.claim_rollout("w-otlp")
        assert claimed is not None
        ids.append((claimed.rollout.rollout_id, claimed.attempt.attempt_id))
    return ids


def _own_attributes(span: Span) -> dict[str, Any]:
    return {k: v for k, v in span.attributes.items() if k not in RESERVED}


def _export_with_sdk(url: str, first: tuple[str, str], second: tuple[str, str], compression: Compression) -> dict:
    """Runs in a worker thread (the SDK exporter blocks). Returns what the SDK saw, to compare with the store."""
    resource = Resource.create(
        {"service.name": "calc-agent", semconv.ROLLOUT_ID: first[0], semconv.ATTEMPT_ID: first[1]}
    )
    exporter = RecordingExporter(
        OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers=AUTH, compression=compression, timeout=10)
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=3))
    tracer = provider.get_tracer("agentbolt.tests", "9.9")
    agent_attrs = {
        "agent.name": "calc",
        "turn": 3,
        "temperature": 0.7,
        "greedy": False,
        "tools": ("add", "mul"),
        "token_ids": (1, 2, 3),
        "scores": (0.5, 1.5),
        "flags": (True, False),
    }
    with tracer.start_as_current_span("agent.run", attributes=agent_attrs, kind=SpanKind.SERVER) as parent:
        with tracer.start_as_current_span("tool.call", attributes={"tool.name": "add"}) as child:
            child.add_event("tool.output", {"value": 5})
            child.set_status(Status(StatusCode.ERROR, "division by zero"))
        # span attributes override the resource's, key by key: this one goes to the second attempt
        other_attrs = {semconv.ROLLOUT_ID: second[0], semconv.ATTEMPT_ID: second[1], "note": "elsewhere"}
        with tracer.start_as_current_span("other.attempt", attributes=other_attrs) as other:
            pass
    assert provider.force_flush(10_000)
    provider.shutdown()
    seen = {}
    for name, span in (("agent.run", parent), ("tool.call", child), ("other.attempt", other)):
        readable: Any = span
        ctx = span.get_span_context()
        seen[name] = {
            "trace_id": format(ctx.trace_id, "032x"),
            "span_id": format(ctx.span_id, "016x"),
            "start_time": readable.start_time / 1e9,
            "end_time": readable.end_time / 1e9,
        }
    seen["agent_attrs"] = agent_attrs
    seen["results"] = exporter.results
    return seen


def test_sdk_exporter_writes_spans_read_back_equal(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        (first, second) = await _two_attempts(store)
        async with serve_in_background(create_app(store, token=TOKEN)) as url:
            for compression in (Compression.NoCompression, Compression.Gzip):
                seen = await asyncio.to_thread(_export_with_sdk, url, first, second, compression)
                assert seen["results"] and all(r == SpanExportResult.SUCCESS for r in seen["results"])

        spans = await store.query_spans(*first)
        assert [s.name for s in spans] == ["tool.call", "agent.run"] * 2  # ended first, exported first
        tool, run = spans[2], spans[3]  # the gzip round
        assert run.span_id == seen["agent.run"]["span_id"] and run.trace_id == seen["agent.run"]["trace_id"]
        assert run.parent_id is None
        assert tool.parent_id == run.span_id and tool.trace_id == run.trace_id
        expected = {k: list(v) if isinstance(v, tuple) else v for k, v in seen["agent_attrs"].items()}
        assert _own_attributes(run) == expected
        assert abs(run.start_time - seen["agent.run"]["start_time"]) < 1e-6
        assert run.end_time is not None and abs(run.end_time - seen["agent.run"]["end_time"]) < 1e-6
        assert run.attributes[semconv.OTLP_SPAN_KIND] == "SERVER"
        assert run.attributes[semconv.OTEL_SCOPE_NAME] == "agentbolt.tests"
        assert run.attributes[semconv.OTEL_SCOPE_VERSION] == "9.9"
        resource = run.attributes[semconv.OTLP_RESOURCE]
        assert resource["service.name"] == "calc-agent" and resource[semconv.ATTEMPT_ID] == first[1]
        assert _own_attributes(tool) == {"tool.name": "add"}
        assert semconv.OTLP_SPAN_KIND not in tool.attributes  # INTERNAL is the default and is not kept
        assert tool.status.code == "ERROR" and tool.status.description == "division by zero"
        (event,) = tool.attributes[semconv.OTLP_EVENTS]
        assert event["name"] == "tool.output" and event["attributes"] == {"value": 5}
        assert tool.start_time <= event["time"] <= (tool.end_time or 0)

        others = await store.query_spans(*second)
        assert [s.name for s in others] == ["other.attempt"] * 2
        assert others[1].attributes["note"] == "elsewhere" and others[1].parent_id == run.span_id
        assert [s.sequence_id for s in others] == [1, 2]
        await store.close()

    asyncio.run(main())


TRACE_HEX = "5b8efff798038103d269b633813fc60c"
SPAN_HEX = "eee19b7ec3c1b174"
PARENT_HEX = "eee19b7ec3c1b173"


def _json_span(name: str, span_hex: str, attributes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "traceId": TRACE_HEX,
        "spanId": span_hex,
        "parentSpanId": PARENT_HEX,
        "name": name,
        "kind": 3,
        "startTimeUnixNano": "1700000000500000000",
        "endTimeUnixNano": "1700000001250000000",
        "attributes": attributes,
        "events": [
            {
                "timeUnixNano": "1700000001000000000",
                "name": "retry",
                "attributes": [{"key": "n", "value": {"intValue": 2}}],
            }
        ],
        "links": [{"traceId": TRACE_HEX, "spanId": PARENT_HEX, "attributes": []}],
        "status": {"code": 2, "message": "boom"},
    }


def _json_request(rollout_id: str | None, attempt_id: str | None, spans: list[dict[str, Any]]) -> dict[str, Any]:
    resource_attrs = [{"key": "service.name", "value": {"stringValue": "hand-written"}}]
    if rollout_id is not None:
        resource_attrs.append({"key": semconv.ROLLOUT_ID, "value": {"stringValue": rollout_id}})
    if attempt_id is not None:
        resource_attrs.append({"key": semconv.ATTEMPT_ID, "value": {"stringValue": attempt_id}})
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": resource_attrs},
                "scopeSpans": [{"scope": {"name": "hand", "version": "1"}, "spans": spans}],
                "schemaUrl": "https://opentelemetry.io/schemas/1.21.0",
            }
        ]
    }


EVERY_KIND = [
    {"key": "s", "value": {"stringValue": "text"}},
    {"key": "i", "value": {"intValue": "9007199254740993"}},  # int64 as a string, above 2**53
    {"key": "i_num", "value": {"intValue": 42}},
    {"key": "d", "value": {"doubleValue": 2.5}},
    {"key": "b", "value": {"boolValue": True}},
    {
        "key": "arr",
        "value": {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "two"}, {"doubleValue": 3.0}]}},
    },
    {
        "key": "kv",
        "value": {
            "kvlistValue": {
                "values": [
                    {"key": "inner", "value": {"stringValue": "x"}},
                    {
                        "key": "nested",
                        "value": {"kvlistValue": {"values": [{"key": "deep", "value": {"boolValue": False}}]}},
                    },
                ]
            }
        },
    },
    {"key": "raw", "value": {"bytesValue": base64.b64encode(b"\x00\xffhi").decode()}},
    {"key": "empty", "value": {}},
]
EVERY_KIND_JSON = {
    "s": "text",
    "i": 9007199254740993,
    "i_num": 42,
    "d": 2.5,
    "b": True,
    "arr": [1, "two", 3.0],
    "kv": {"inner": "x", "nested": {"deep": False}},
    "raw": base64.b64encode(b"\x00\xffhi").decode(),
    "empty": None,
}


def test_hand_written_otlp_json_round_trips(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        ((rollout_id, attempt_id), _) = await _two_attempts(store)
        async with (
            serve_in_background(create_app(store, token=TOKEN)) as url,
            httpx.AsyncClient(base_url=url, headers=AUTH) as client,
        ):
            body = _json_request(rollout_id, attempt_id, [_json_span("hand.span", SPAN_HEX, EVERY_KIND)])
            resp = await client.post("/v1/traces", json=body)
            assert resp.status_code == 200, resp.text
            assert resp.headers["content-type"].startswith("application/json") and resp.json() == {}

            (span,) = await store.query_spans(rollout_id, attempt_id)
            assert (span.trace_id, span.span_id, span.parent_id) == (TRACE_HEX, SPAN_HEX, PARENT_HEX)
            assert span.start_time == 1700000000.5 and span.end_time == 1700000001.25
            assert _own_attributes(span) == EVERY_KIND_JSON
            assert span.attributes[semconv.OTLP_SPAN_KIND] == "CLIENT"
            assert span.attributes[semconv.OTLP_EVENTS] == [
                {"name": "retry", "time": 1700000001.0, "attributes": {"n": 2}}
            ]
            assert span.attributes[semconv.OTLP_LINKS] == [
                {"trace_id": TRACE_HEX, "span_id": PARENT_HEX, "attributes": {}}
            ]
            assert span.status.code == "ERROR" and span.status.description == "boom"
            assert span.attributes[semconv.OTLP_RESOURCE]["service.name"] == "hand-written"
        await store.close()

    asyncio.run(main())


def test_rejections_partial_success_and_errors(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        ((rollout_id, attempt_id), _) = await _two_attempts(store)
        good = _json_span("good", SPAN_HEX, [])
        stray = _json_span("stray", "00000000000000aa", [{"key": semconv.ROLLOUT_ID, "value": {"stringValue": "x"}}])
        async with (
            serve_in_background(create_app(store, token=TOKEN, max_body_bytes=64 * 1024)) as url,
            httpx.AsyncClient(base_url=url, headers=AUTH) as client,
        ):
            # one span lacks the attempt id (its own rollout id overrides nothing it needs): partial success
            body = _json_request(None, None, [{**good, "attributes": _attribution(rollout_id, attempt_id)}, stray])
            resp = await client.post("/v1/traces", json=body)
            assert resp.status_code == 200, resp.text
            partial = resp.json()["partialSuccess"]
            assert partial["rejectedSpans"] == "1"
            assert semconv.ATTEMPT_ID in partial["errorMessage"] and "'stray'" in partial["errorMessage"]
            assert [s.name for s in await store.query_spans(rollout_id, attempt_id)] == ["good"]

            # no span attributed at all: 400 naming both keys
            resp = await client.post("/v1/traces", json=_json_request(None, None, [good]))
            assert resp.status_code == 400
            message = resp.json()["error"]["message"]
            assert semconv.ROLLOUT_ID in message and semconv.ATTEMPT_ID in message
            assert resp.json()["message"] == message and resp.json()["code"] == 3  # google.rpc.Status fields too

            # unknown attempt: 404 and nothing of the request stored (all or nothing)
            body = _json_request(rollout_id, attempt_id, [good])
            body["resourceSpans"].append(_json_request(rollout_id, "at-unknown", [good])["resourceSpans"][0])
            resp = await client.post("/v1/traces", json=body)
            assert resp.status_code == 404 and "at-unknown" in resp.json()["error"]["message"]
            assert len(await store.query_spans(rollout_id, attempt_id)) == 1

            # protobuf errors come back as a protobuf google.rpc.Status
            request = ExportTraceServiceRequest()
            request.resource_spans.add().scope_spans.add().spans.add(
                trace_id=bytes.fromhex(TRACE_HEX), span_id=bytes.fromhex(SPAN_HEX), name="unattributed"
            )
            resp = await client.post(
                "/v1/traces",
                content=request.SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            assert resp.status_code == 400 and resp.headers["content-type"] == "application/x-protobuf"
            status = status_pb2.Status.FromString(resp.content)
            assert status.code == 3 and semconv.ATTEMPT_ID in status.message

            # protobuf success: an ExportTraceServiceResponse without partial success
            request.resource_spans[0].resource.attributes.add(key=semconv.ROLLOUT_ID).value.string_value = rollout_id
            request.resource_spans[0].resource.attributes.add(key=semconv.ATTEMPT_ID).value.string_value = attempt_id
            resp = await client.post(
                "/v1/traces", content=request.SerializeToString(), headers={"Content-Type": "application/x-protobuf"}
            )
            assert resp.status_code == 200, resp.content
            assert not ExportTraceServiceResponse.FromString(resp.content).HasField("partial_success")

            # malformed inputs: 4xx with a message, never 5xx
            bad = _json_request(rollout_id, attempt_id, [{**good, "spanId": "not-hex!"}])
            cases: list[tuple[bytes, dict[str, str], int, str]] = [
                (json.dumps(bad).encode(), {"Content-Type": "application/json"}, 400, "hex"),
                (b"{not json", {"Content-Type": "application/json"}, 400, "JSON"),
                (b'{"resourceSpans": ' + b"[" * 30_000, {"Content-Type": "application/json"}, 400, "JSON"),
                (_deep_kvlist(200), {"Content-Type": "application/json"}, 400, "depth"),
                (b"[1, 2]", {"Content-Type": "application/json"}, 400, "resourceSpans"),
                (b'{"resourceSpans": 5}', {"Content-Type": "application/json"}, 400, "resourceSpans"),
                (b"\x0a\xff\xff", {"Content-Type": "application/x-protobuf"}, 400, ""),
                (b"{}", {"Content-Type": "text/plain"}, 415, "application/x-protobuf"),
                (b"{}", {"Content-Type": "application/json", "Content-Encoding": "br"}, 415, "gzip"),
                (b"not gzip", {"Content-Type": "application/json", "Content-Encoding": "gzip"}, 400, "decompress"),
                # a small gzip body that inflates past the limit (64 KiB here) is refused after decompression
                (
                    gzip.compress(b" " * 200_000 + b"{}"),
                    {"Content-Type": "application/json", "Content-Encoding": "gzip"},
                    413,
                    "limit",
                ),
            ]
            for content, headers, status_code, hint in cases:
                resp = await client.post("/v1/traces", content=content, headers=headers)
                assert resp.status_code == status_code, (headers, resp.text)
                if headers["Content-Type"] != "application/x-protobuf":
                    assert hint in resp.json()["error"]["message"], resp.text
        await store.close()

    asyncio.run(main())


def _deep_kvlist(depth: int) -> bytes:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(depth):
        value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
    span = {**_json_span("deep", SPAN_HEX, [{"key": "deep", "value": value}])}
    return json.dumps(_json_request("r", "a", [span])).encode()


def _attribution(rollout_id: str, attempt_id: str) -> list[dict[str, Any]]:
    return [
        {"key": semconv.ROLLOUT_ID, "value": {"stringValue": rollout_id}},
        {"key": semconv.ATTEMPT_ID, "value": {"stringValue": attempt_id}},
    ]
