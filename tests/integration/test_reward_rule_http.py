"""The one reward rule and the no-late-rewards rule over HTTP: a real server on 127.0.0.1 over a real SQLite store.

- ``POST /v1/spans`` and ``/v1/spans/batch``: a reward value ``true`` is stored as 1.0; ``"1"``, ``null``, NaN or no
  value is a 422 naming the span and the value, and nothing is stored;
- OTLP ``/v1/traces`` (JSON and protobuf): ``intValue`` (what the OpenTelemetry JS SDK sends for an integer) and
  ``boolValue`` are accepted as floats; ``stringValue "1"``, an empty value and NaN are a 422 naming the value;
- the status call: ``final_reward: "1"`` (or NaN) is a 422 naming the value and the attempt does not move;
- a reward span posted after the rollout succeeded (no ``final_reward`` in the status call) is a 409 on every route,
  naming the attempt and its status, and the trajectory's reward stays what it was; the HTTP client raises the
  matching exceptions (``RewardError``, ``ConflictError``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agentbolt import semconv
from agentbolt.adapter import build_trajectory
from agentbolt.client import HttpLightningStore
from agentbolt.errors import ConflictError, RewardError
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import AttemptStatus, RolloutStatus, Span

TOKEN = "reward-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TRACE_HEX = "5b8efff798038103d269b633813fc60c"


async def _running(store: SqliteLightningStore) -> tuple[str, str]:
    rollout = await store.enqueue_rollout({"q": "2+2"})
    claimed = await store.claim_rollout("w-reward")
    assert claimed is not None
    await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, AttemptStatus.RUNNING)
    return rollout.rollout_id, claimed.attempt.attempt_id


def _span_json(ids: tuple[str, str], span_id: str, attributes: dict[str, Any], name: str = semconv.SPAN_REWARD) -> str:
    """A ``POST /v1/spans`` body as raw JSON text (``NaN`` is written as the bare token a client would send)."""
    span = {
        "rollout_id": ids[0],
        "attempt_id": ids[1],
        "span_id": span_id,
        "trace_id": TRACE_HEX,
        "name": name,
        "start_time": 1700000000.0,
        "end_time": 1700000000.5,
        "attributes": attributes,
    }
    return json.dumps(span)


def _otlp_json(ids: tuple[str, str], value: dict[str, Any] | None, span_id: str = "eee19b7ec3c1b174") -> dict[str, Any]:
    """An OTLP/JSON request with one reward span whose value is the ``AnyValue`` ``value`` (``None``: no value key)."""
    attributes: list[dict[str, Any]] = [
        {"key": semconv.ROLLOUT_ID, "value": {"stringValue": ids[0]}},
        {"key": semconv.ATTEMPT_ID, "value": {"stringValue": ids[1]}},
    ]
    if value is not None:
        attributes.append({"key": semconv.REWARD_VALUE, "value": value})
    span = {
        "traceId": TRACE_HEX,
        "spanId": span_id,
        "name": semconv.SPAN_REWARD,
        "startTimeUnixNano": "1700000000500000000",
        "endTimeUnixNano": "1700000001250000000",
        "attributes": attributes,
    }
    return {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "agentbolt-js"}, "spans": [span]}]}]}


def _otlp_protobuf(
    ids: tuple[str, str], span_id: str, *, int_value: int | None = None, text: str | None = None
) -> bytes:
    request = ExportTraceServiceRequest()
    span = (
        request.resource_spans.add()
        .scope_spans.add()
        .spans.add(trace_id=bytes.fromhex(TRACE_HEX), span_id=bytes.fromhex(span_id), name=semconv.SPAN_REWARD)
    )
    span.attributes.add(key=semconv.ROLLOUT_ID).value.string_value = ids[0]
    span.attributes.add(key=semconv.ATTEMPT_ID).value.string_value = ids[1]
    value = span.attributes.add(key=semconv.REWARD_VALUE).value
    if int_value is not None:
        value.int_value = int_value
    if text is not None:
        value.string_value = text
    return request.SerializeToString()


def _reward_values(spans: list[Span]) -> list[Any]:
    return [s.attributes.get(semconv.REWARD_VALUE) for s in spans if s.name == semconv.SPAN_REWARD]


def test_span_routes_accept_true_as_one_and_refuse_strings_null_and_nan(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        ids = await _running(store)
        async with (
            serve_in_background(create_app(store, token=TOKEN)) as url,
            httpx.AsyncClient(base_url=url, headers={**AUTH, "Content-Type": "application/json"}) as client,
        ):
            resp = await client.post(
                "/v1/spans", content=_span_json(ids, "00000000000000a1", {semconv.REWARD_VALUE: True})
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["attributes"][semconv.REWARD_VALUE] == 1.0

            refused = [
                ('"1"', "'1' (str)"),
                ("null", "None (NoneType)"),
                ("NaN", "nan (float)"),
            ]
            for raw, shown in refused:
                body = _span_json(ids, "00000000000000b2", {semconv.REWARD_VALUE: "PLACEHOLDER"})
                body = body.replace('"PLACEHOLDER"', raw)
                resp = await client.post("/v1/spans", content=body)
                assert resp.status_code == 422, (raw, resp.text)
                error = resp.json()["error"]
                assert error["type"] == "RewardError"
                assert shown in error["message"] and "'00000000000000b2'" in error["message"], error
            resp = await client.post("/v1/spans", content=_span_json(ids, "00000000000000b3", {}))
            assert resp.status_code == 422 and "None (NoneType)" in resp.json()["error"]["message"]

            # the batch route: one bad reward refuses the whole batch
            good = json.loads(_span_json(ids, "00000000000000c1", {"note": "x"}, name="tool.call"))
            bad = json.loads(_span_json(ids, "00000000000000c2", {semconv.REWARD_VALUE: "1"}))
            resp = await client.post("/v1/spans/batch", json={"spans": [good, bad]})
            assert resp.status_code == 422 and "'1' (str)" in resp.json()["error"]["message"], resp.text

        spans = await store.query_spans(*ids)
        assert [s.span_id for s in spans] == ["00000000000000a1"]  # nothing refused was stored
        assert _reward_values(spans) == [1.0]
        await store.close()

    asyncio.run(main())


def test_otlp_accepts_int_and_bool_values_and_refuses_strings_empty_and_nan(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        ids = await _running(store)
        async with (
            serve_in_background(create_app(store, token=TOKEN)) as url,
            httpx.AsyncClient(base_url=url, headers=AUTH) as client,
        ):
            accepted = [({"intValue": "1"}, "00000000000000a1"), ({"intValue": 0}, "00000000000000a2")]
            accepted.append(({"boolValue": True}, "00000000000000a3"))
            for value, span_id in accepted:
                resp = await client.post("/v1/traces", json=_otlp_json(ids, value, span_id))
                assert resp.status_code == 200, (value, resp.text)
            proto = {"Content-Type": "application/x-protobuf"}
            resp = await client.post(
                "/v1/traces", content=_otlp_protobuf(ids, "00000000000000a4", int_value=3), headers=proto
            )
            assert resp.status_code == 200, resp.content

            refused = [
                ({"stringValue": "1"}, "'1' (str)"),
                ({"doubleValue": "NaN"}, "nan (float)"),  # proto3 JSON writes NaN as a string
                ({}, "None (NoneType)"),
                (None, "None (NoneType)"),
            ]
            for value, shown in refused:
                resp = await client.post("/v1/traces", json=_otlp_json(ids, value, "00000000000000b1"))
                assert resp.status_code == 422, (value, resp.text)
                message = resp.json()["error"]["message"]
                assert shown in message and "'00000000000000b1'" in message, message
            resp = await client.post(
                "/v1/traces", content=_otlp_protobuf(ids, "00000000000000b2", text="1"), headers=proto
            )
            assert resp.status_code == 422 and resp.headers["content-type"] == "application/x-protobuf"
            assert b"'1' (str)" in resp.content

        spans = await store.query_spans(*ids)
        assert _reward_values(spans) == [1.0, 0.0, 1.0, 3.0]
        assert all(type(v) is float for v in _reward_values(spans))
        await store.close()

    asyncio.run(main())


def test_status_call_refuses_a_string_final_reward(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        ids = await _running(store)
        path = f"/v1/rollouts/{ids[0]}/attempts/{ids[1]}/status"
        async with (
            serve_in_background(create_app(store, token=TOKEN)) as url,
            httpx.AsyncClient(base_url=url, headers={**AUTH, "Content-Type": "application/json"}) as client,
        ):
            for raw, shown in (('"1"', "'1' (str)"), ("NaN", "nan (float)")):
                resp = await client.post(path, content=f'{{"status": "succeeded", "final_reward": {raw}}}')
                assert resp.status_code == 422, resp.text
                assert "final_reward" in resp.json()["error"]["message"] and shown in resp.json()["error"]["message"]
            rollout = await store.get_rollout(ids[0])
            assert rollout.status is RolloutStatus.RUNNING and rollout.final_reward is None

            resp = await client.post(path, content='{"status": "succeeded", "final_reward": true}')
            assert resp.status_code == 200, resp.text
        assert (await store.get_rollout(ids[0])).final_reward == 1.0
        await store.close()

    asyncio.run(main())


def test_a_reward_after_the_rollout_succeeded_is_409_on_every_route(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        ids = await _running(store)
        async with (
            serve_in_background(create_app(store, token=TOKEN)) as url,
            httpx.AsyncClient(base_url=url, headers={**AUTH, "Content-Type": "application/json"}) as client,
        ):
            resp = await client.post(
                "/v1/spans", content=_span_json(ids, "00000000000000a1", {semconv.REWARD_VALUE: 0.0})
            )
            assert resp.status_code == 200, resp.text
            path = f"/v1/rollouts/{ids[0]}/attempts/{ids[1]}/status"
            resp = await client.post(path, json={"status": "succeeded"})  # no final_reward
            assert resp.status_code == 200, resp.text
            rollout = await store.get_rollout(ids[0])
            read_by_trainer = build_trajectory(rollout, ids[1], await store.query_spans(*ids)).final_reward
            assert read_by_trainer == 0.0

            late = _span_json(ids, "00000000000000d1", {semconv.REWARD_VALUE: 0.9})
            answers = [
                await client.post("/v1/spans", content=late),
                await client.post("/v1/spans/batch", json={"spans": [json.loads(late)]}),
                await client.post("/v1/traces", json=_otlp_json(ids, {"doubleValue": 0.9}, "00000000000000d2")),
            ]
            for resp in answers:
                assert resp.status_code == 409, resp.text
                message = resp.json()["error"]["message"]
                assert ids[1] in message and "'succeeded'" in message and "after the attempt ended" in message

            # the HTTP client raises the store's own exceptions
            client_store = HttpLightningStore(url, token=TOKEN)
            try:
                with pytest.raises(ConflictError, match="after the attempt ended"):
                    await client_store.add_span(Span.model_validate_json(late))
                with pytest.raises(RewardError, match=r"'1' \(str\)"):
                    bad = Span.model_validate_json(_span_json(ids, "00000000000000e1", {semconv.REWARD_VALUE: "1"}))
                    await client_store.add_span(bad)
            finally:
                await client_store.close()

            # a non-reward span after the end is still stored
            resp = await client.post("/v1/spans", content=_span_json(ids, "00000000000000f1", {}, name="tool.call"))
            assert resp.status_code == 200, resp.text

        spans = await store.query_spans(*ids)
        assert [s.span_id for s in spans] == ["00000000000000a1", "00000000000000f1"]
        rollout = await store.get_rollout(ids[0])
        assert build_trajectory(rollout, ids[1], spans).final_reward == read_by_trainer
        await store.close()

    asyncio.run(main())
