"""OTLP/HTTP trace ingestion: ``POST /v1/traces``, so any OpenTelemetry exporter can write spans to the store.

Spec: https://opentelemetry.io/docs/specs/otlp/#otlphttp (``ExportTraceServiceRequest``, protobuf or JSON).

Encodings (by ``Content-Type``): ``application/x-protobuf`` (binary protobuf) and ``application/json`` (OTLP/JSON:
lowerCamelCase fields, trace and span ids as hex strings, 64-bit ints as strings or numbers, enums as integers).
``Content-Encoding: gzip`` or ``deflate`` is accepted; the decompressed body is held to the server's body limit too.
The answer uses the request's encoding: an ``ExportTraceServiceResponse`` on success, a ``google.rpc.Status`` on error
(in JSON, the Status fields ``code``/``message`` sit next to the API's usual ``error`` object).

Attribution rule: a span belongs to the attempt named by ``agentbolt.rollout_id`` and ``agentbolt.attempt_id``
(:data:`agentbolt.semconv.ROLLOUT_ID`, :data:`agentbolt.semconv.ATTEMPT_ID`). Each key is read from the span's
own attributes first and from its resource's attributes otherwise, so a span attribute takes precedence over a
resource attribute, key by key. Both must be non-empty strings.

Rejections (OTLP partial success): a span that lacks either key, or whose trace/span id has the wrong length, is
rejected. If some spans of the request are accepted, the accepted ones are stored and the answer is 200 with
``partial_success.rejected_spans`` and an ``error_message`` naming the missing keys. If none is accepted, the answer
is 400 with that message (so a misconfigured exporter fails loudly instead of dropping everything quietly). An
unknown rollout or attempt is 404 and nothing of the request is stored: all accepted spans go to the store in one
``add_spans`` call (all or nothing), grouped by attempt in order of first appearance, each group in request order.

Rewards (the store's rules, :mod:`agentbolt.store.rules`, the same as ``POST /v1/spans``): a reward span
(``agentbolt.reward``) whose ``agentbolt.reward.value`` is not a reward by :mod:`agentbolt.types.rewards` (a
``stringValue`` such as ``"1"``, an empty value, a NaN or infinite ``doubleValue``) makes the whole request a 422
naming the span and the value; an ``intValue`` (what the OpenTelemetry JS SDK sends for an integer) or a
``boolValue`` is accepted and stored as a float. A reward span for an attempt that has ended makes the whole request
a 409 naming the attempt and its status. In both cases nothing of the request is stored.

Conversion to :class:`agentbolt.types.Span`: ids become lowercase hex; times become float epoch seconds (an end
time of 0 becomes ``None``); attribute values map to JSON (string, bool, int, float, list for arrays, dict for
kvlists, base64 string for bytes, ``None`` for an empty value). The span's status code becomes ``UNSET``/``OK``/
``ERROR``. Scope, kind, resource, events and links are kept under the keys of :mod:`agentbolt.semconv`
(``otel.scope.name``, ``agentbolt.otlp.*``), only when present.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as OtlpStatus

from agentbolt import semconv
from agentbolt.errors import AgentboltError
from agentbolt.server.errors import error_body, status_kind
from agentbolt.store.base import LightningStore
from agentbolt.types import Span, SpanStatus

PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
JSON_TYPE = "application/json"

_NS_PER_S = 1_000_000_000  # int / int division is correctly rounded; int / 1e9 is not
_TRACE_ID_BYTES = 16
_SPAN_ID_BYTES = 8
_STATUS_CODES = {
    OtlpStatus.STATUS_CODE_UNSET: "UNSET",
    OtlpStatus.STATUS_CODE_OK: "OK",
    OtlpStatus.STATUS_CODE_ERROR: "ERROR",
}
_KEPT_KINDS = {
    OtlpSpan.SPAN_KIND_SERVER: "SERVER",
    OtlpSpan.SPAN_KIND_CLIENT: "CLIENT",
    OtlpSpan.SPAN_KIND_PRODUCER: "PRODUCER",
    OtlpSpan.SPAN_KIND_CONSUMER: "CONSUMER",
}
# google.rpc.Code of each HTTP status we answer with (https://github.com/googleapis/googleapis google/rpc/code.proto)
_GRPC_CODES = {400: 3, 404: 5, 409: 9, 413: 8, 415: 3, 422: 3, 500: 13, 503: 14}


class OtlpRequestError(Exception):
    """A request that cannot be ingested; ``status`` is the HTTP answer (400, 413 or 415)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------------------------ decoding


def _decompress(body: bytes, encoding: str, max_bytes: int) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise OtlpRequestError(415, f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none")
    inflater = zlib.decompressobj(32 + zlib.MAX_WBITS)  # 32: accept a gzip or a zlib header
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise OtlpRequestError(400, f"the {encoding} body could not be decompressed: {exc}") from exc
    if len(out) > max_bytes:
        raise OtlpRequestError(
            413,
            f"decompressed request body is larger than this server's limit of {max_bytes} bytes; export smaller "
            "batches, or raise the limit (agentbolt serve --max-body-mb)",
        )
    if not inflater.eof:
        raise OtlpRequestError(400, f"the {encoding} body is truncated")
    return out


def _hex_to_base64(value: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value  # json_format reports the wrong type with the field's name
    try:
        raw = bytes.fromhex(value)
    except ValueError as exc:
        raise OtlpRequestError(
            400, f"{where} {value!r} is not a hex string (OTLP/JSON encodes trace and span ids as hex, not base64)"
        ) from exc
    return base64.b64encode(raw).decode()


def _ids_to_base64(obj: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        if key in obj:
            obj[key] = _hex_to_base64(obj[key], f"{where}.{key}")


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def json_ids_to_protobuf_json(doc: dict[str, Any]) -> None:
    """Rewrite, in place, the hex ids of an OTLP/JSON request as base64, the proto3 JSON form of ``bytes``.

    ``google.protobuf.json_format`` reads ``bytes`` fields as base64; a hex id is also valid base64, so without this
    step it would be decoded silently into wrong bytes. Both lowerCamelCase and snake_case keys are rewritten.
    """
    span_keys = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")
    link_keys = ("traceId", "spanId", "trace_id", "span_id")
    for r, resource_spans in enumerate(_dicts(doc.get("resourceSpans", doc.get("resource_spans")))):
        for s, scope_spans in enumerate(_dicts(resource_spans.get("scopeSpans", resource_spans.get("scope_spans")))):
            for i, span in enumerate(_dicts(scope_spans.get("spans"))):
                where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                _ids_to_base64(span, span_keys, where)
                for j, link in enumerate(_dicts(span.get("links"))):
                    _ids_to_base64(link, link_keys, f"{where}.links[{j}]")


def decode_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """Parse an OTLP/HTTP trace export body given its media type (``application/x-protobuf`` or JSON).

    Raises:
        OtlpRequestError: 415 for another media type, 400 for a body that does not parse.
    """
    request = ExportTraceServiceRequest()
    if content_type in PROTOBUF_TYPES:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpRequestError(400, f"the body is not a protobuf ExportTraceServiceRequest: {exc}") from exc
        return request
    if content_type != JSON_TYPE:
        shown = content_type or "none"
        raise OtlpRequestError(
            415, f"Content-Type {shown!r} is not supported; send application/x-protobuf or application/json"
        )
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise OtlpRequestError(400, f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise OtlpRequestError(400, "the JSON body is nested too deeply") from exc
    if not isinstance(doc, dict):
        raise OtlpRequestError(400, 'an OTLP/JSON body is an object like {"resourceSpans": [...]}')
    json_ids_to_protobuf_json(doc)
    try:
        json_format.ParseDict(doc, request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise OtlpRequestError(400, f"the body is not an OTLP/JSON ExportTraceServiceRequest: {exc}") from exc
    return request


# ---------------------------------------------------------------------------------------------- conversion


def any_value_to_json(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a JSON-compatible Python value (bytes become a base64 string, empty becomes None)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "array_value":
        return [any_value_to_json(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_to_json(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return None


def attributes_to_json(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP ``repeated KeyValue`` as a dict (a repeated key keeps its last value)."""
    return {kv.key: any_value_to_json(kv.value) for kv in attributes}


@dataclass
class Conversion:
    """The spans of one export request: those attributed to an attempt, and counts of the rejected ones.

    Attributes:
        spans: accepted spans, grouped by attempt (first appearance order), request order within a group.
        rejected: reason -> number of spans rejected for it.
        examples: reason -> name of the first span rejected for it (for the error message).
    """

    spans: list[Span] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    @property
    def rejected_count(self) -> int:
        """How many spans were rejected in all."""
        return sum(self.rejected.values())

    def reject(self, reason: str, span_name: str) -> None:
        """Count one rejected span."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self.examples.setdefault(reason, span_name)

    def message(self) -> str:
        """Why spans were rejected, naming each reason, its count and one example span."""
        total = self.rejected_count + len(self.spans)
        parts = [
            f"{count} span(s) {reason} (e.g. span {self.examples[reason]!r})" for reason, count in self.rejected.items()
        ]
        return f"{self.rejected_count} of {total} span(s) rejected: " + "; ".join(parts)


def _attribution(span_attrs: dict[str, Any], resource_attrs: dict[str, Any]) -> tuple[str | None, str | None]:
    found: list[str | None] = []
    for key in (semconv.ROLLOUT_ID, semconv.ATTEMPT_ID):
        value = span_attrs.get(key, resource_attrs.get(key))
        found.append(value if isinstance(value, str) and value else None)
    return found[0], found[1]


def _missing_reason(rollout_id: str | None, attempt_id: str | None) -> str:
    missing = [key for key, value in ((semconv.ROLLOUT_ID, rollout_id), (semconv.ATTEMPT_ID, attempt_id)) if not value]
    keys = " and ".join(repr(k) for k in missing)
    return f"lack {keys} (set as a span or resource attribute, non-empty string)"


def _convert_span(otlp: OtlpSpan, rollout_id: str, attempt_id: str, extra: dict[str, Any]) -> Span:
    attributes = attributes_to_json(otlp.attributes)
    attributes.update(extra)
    if otlp.kind in _KEPT_KINDS:
        attributes[semconv.OTLP_SPAN_KIND] = _KEPT_KINDS[otlp.kind]
    if otlp.events:
        attributes[semconv.OTLP_EVENTS] = [
            {"name": e.name, "time": e.time_unix_nano / _NS_PER_S, "attributes": attributes_to_json(e.attributes)}
            for e in otlp.events
        ]
    if otlp.links:
        attributes[semconv.OTLP_LINKS] = [
            {
                "trace_id": link.trace_id.hex(),
                "span_id": link.span_id.hex(),
                "attributes": attributes_to_json(link.attributes),
            }
            for link in otlp.links
        ]
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id=otlp.span_id.hex(),
        trace_id=otlp.trace_id.hex(),
        parent_id=otlp.parent_span_id.hex() or None,
        name=otlp.name,
        start_time=otlp.start_time_unix_nano / _NS_PER_S,
        end_time=otlp.end_time_unix_nano / _NS_PER_S if otlp.end_time_unix_nano else None,
        attributes=attributes,
        status=SpanStatus(code=_STATUS_CODES.get(otlp.status.code, "UNSET"), description=otlp.status.message or None),
    )


def convert_request(request: ExportTraceServiceRequest) -> Conversion:
    """Turn an export request into agentbolt spans by the module's attribution rule (pure; no I/O)."""
    result = Conversion()
    groups: dict[tuple[str, str], list[Span]] = {}
    for resource_spans in request.resource_spans:
        resource_attrs = attributes_to_json(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            extra: dict[str, Any] = {}
            if scope_spans.scope.name:
                extra[semconv.OTEL_SCOPE_NAME] = scope_spans.scope.name
            if scope_spans.scope.version:
                extra[semconv.OTEL_SCOPE_VERSION] = scope_spans.scope.version
            if resource_attrs:
                extra[semconv.OTLP_RESOURCE] = resource_attrs
            for otlp in scope_spans.spans:
                span_attrs = attributes_to_json(otlp.attributes)
                rollout_id, attempt_id = _attribution(span_attrs, resource_attrs)
                if rollout_id is None or attempt_id is None:
                    result.reject(_missing_reason(rollout_id, attempt_id), otlp.name)
                    continue
                ids_ok = len(otlp.trace_id) == _TRACE_ID_BYTES and len(otlp.span_id) == _SPAN_ID_BYTES
                if not ids_ok or len(otlp.parent_span_id) not in (0, _SPAN_ID_BYTES):
                    result.reject("have a trace id that is not 16 bytes or a span id that is not 8 bytes", otlp.name)
                    continue
                span = _convert_span(otlp, rollout_id, attempt_id, extra)
                groups.setdefault((rollout_id, attempt_id), []).append(span)
    result.spans = [span for group in groups.values() for span in group]
    return result


# ------------------------------------------------------------------------------------------------ answers


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_rpc_status(code: int, message: str) -> bytes:
    """A ``google.rpc.Status`` (``int32 code = 1; string message = 2``) in protobuf wire format, without details."""
    text = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _error(status: int, message: str, as_protobuf: bool) -> Response:
    code = _GRPC_CODES.get(status, 2)  # 2: UNKNOWN
    if as_protobuf:
        return Response(encode_rpc_status(code, message), status_code=status, media_type=PROTOBUF_TYPES[0])
    body = {**error_body(status_kind(status), message), "code": code, "message": message}
    return Response(json.dumps(body), status_code=status, media_type=JSON_TYPE)


def _success(response: ExportTraceServiceResponse, as_protobuf: bool) -> Response:
    if as_protobuf:
        return Response(response.SerializeToString(), media_type=PROTOBUF_TYPES[0])
    return Response(json.dumps(json_format.MessageToDict(response)), media_type=JSON_TYPE)


# -------------------------------------------------------------------------------------------------- route

router = APIRouter()

_DESCRIPTION = f"""Ingest spans exported by any OpenTelemetry OTLP/HTTP exporter (an `ExportTraceServiceRequest`).

**Encodings**: `Content-Type: application/x-protobuf` or `application/json` (OTLP/JSON: hex ids); optional
`Content-Encoding: gzip|deflate`. The answer uses the request's encoding: `ExportTraceServiceResponse` on success,
`google.rpc.Status` on error (JSON errors also carry the API's usual `error` object).

**Attribution**: a span belongs to the attempt named by `{semconv.ROLLOUT_ID}` and `{semconv.ATTEMPT_ID}`. Each
key is read from the span's attributes first, then from its resource's attributes: span attributes take precedence
over resource attributes, key by key.

**Rejections**: spans lacking either key (or with malformed ids) are rejected. When others in the request are
accepted, the answer is 200 with `partialSuccess.rejectedSpans` and an `errorMessage` naming the missing keys; when
none is, it is 400. An unknown rollout or attempt answers 404 and stores nothing of the request.

**Rewards**: a reward span (`{semconv.SPAN_REWARD}`) whose `{semconv.REWARD_VALUE}` is not a finite number or a bool
(a `stringValue` such as `"1"`, an empty value, NaN) answers 422 naming the span and the value; one for an attempt
that has already ended answers 409 naming the attempt and its status. Either way nothing of the request is stored."""

_OTLP_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "OTLP/JSON ExportTraceServiceRequest (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding)",
    "properties": {
        "resourceSpans": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "resource": {"type": "object"},
                    "scopeSpans": {"type": "array", "items": {"type": "object"}},
                },
            },
        }
    },
}


@router.post(
    "/v1/traces",
    summary="Ingest OTLP/HTTP spans",
    description=_DESCRIPTION,
    response_class=Response,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                PROTOBUF_TYPES[0]: {"schema": {"type": "string", "format": "binary"}},
                JSON_TYPE: {"schema": _OTLP_JSON_SCHEMA},
            },
        }
    },
    responses={
        200: {"description": "ExportTraceServiceResponse (with partialSuccess when some spans were rejected)"},
        400: {"description": "unparsable body, or no span could be attributed to an attempt"},
        404: {"description": "unknown rollout or attempt"},
        409: {"description": "a reward span for an attempt that has already ended (nothing stored)"},
        413: {"description": "body (or decompressed body) larger than the server's limit"},
        415: {"description": "unsupported Content-Type or Content-Encoding"},
        422: {"description": "a reward span whose value is not a reward, e.g. a string or NaN (nothing stored)"},
    },
)
async def export_traces(request: Request) -> Response:
    """Decode the request, attribute each span to an attempt, and store the accepted spans in one batch."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    as_protobuf = content_type in PROTOBUF_TYPES
    store: LightningStore = request.app.state.store
    max_bytes: int = request.app.state.max_body_bytes
    try:
        body = _decompress(await request.body(), request.headers.get("content-encoding", ""), max_bytes)
        conversion = convert_request(decode_request(body, content_type))
    except OtlpRequestError as exc:
        return _error(exc.status, str(exc), as_protobuf)
    if conversion.rejected_count and not conversion.spans:
        return _error(400, conversion.message(), as_protobuf)
    try:
        if conversion.spans:
            await store.add_spans(conversion.spans)
    except AgentboltError as exc:
        return _error(exc.http_status, str(exc), as_protobuf)
    response = ExportTraceServiceResponse()
    if conversion.rejected_count:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(rejected_spans=conversion.rejected_count, error_message=conversion.message())
        )
    return _success(response, as_protobuf)
