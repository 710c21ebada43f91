"""The direct path to the hot store routes (``agentbolt.server.hot_routes``) answers exactly like FastAPI's own path.

Each request is sent twice to the same app and store: through the app's front (guards, then the direct path) and
straight into FastAPI's own handling (``AgentboltApp.serve_with_fastapi``). Status and error type must agree.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from agentbolt.server.app import create_app
from agentbolt.server.hot_routes import HOT_ROUTES
from agentbolt.store import InMemoryLightningStore

SPAN = {"span_id": "00f067aa0ba902b7", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "name": "s", "start_time": 1.0}


async def _both(app: Any, method: str, paths: tuple[str, str], **kwargs: Any) -> tuple[httpx.Response, ...]:
    """Send the request through the front to ``paths[0]`` and straight to FastAPI to ``paths[1]``."""
    answers = []
    for asgi, path in zip((app, app.serve_with_fastapi), paths, strict=True):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as client:
            answers.append(await client.request(method, path, **kwargs))
    return tuple(answers)


def test_hot_routes_answer_like_fastapi() -> None:
    async def main() -> None:
        store = InMemoryLightningStore()
        app = create_app(store)
        ids = []
        for task in ("a", "b"):  # one attempt per path, for the requests that change state
            await store.enqueue_rollout(task)
            claimed = await store.claim_rollout("w")
            assert claimed is not None
            ids.append((claimed.rollout.rollout_id, claimed.attempt.attempt_id))
        status = tuple(f"/v1/rollouts/{rid}/attempts/{aid}/status" for rid, aid in ids)
        unknown = tuple(f"/v1/rollouts/{rid}/attempts/at-nope/status" for rid, _ in ids)
        span = {**SPAN, "rollout_id": ids[0][0], "attempt_id": ids[0][1]}
        spans = ("/v1/spans", "/v1/spans")
        cases: list[tuple[str, tuple[str, str], dict[str, Any], int | None]] = [
            ("POST", spans, {"json": span}, 200),
            ("POST", spans, {"content": b'{"rollout_id": ', "headers": {"content-type": "application/json"}}, 422),
            ("POST", spans, {"json": {**span, "start_time": "soon"}}, 422),
            ("POST", spans, {"json": {**span, "attempt_id": "at-nope"}}, 404),
            ("POST", spans, {"content": json.dumps(span), "headers": {"content-type": "text/plain"}}, 422),
            ("POST", spans, {"content": json.dumps(span), "headers": {"content-type": "application/x+json"}}, 200),
            ("POST", spans, {"json": [span]}, 422),
            ("POST", ("/v1/claims", "/v1/claims"), {"json": {"worker_id": ""}}, 422),
            ("POST", ("/v1/claims", "/v1/claims"), {"json": {"worker_id": "w", "extra": 1}}, 422),
            ("POST", ("/v1/claims", "/v1/claims"), {"json": {"worker_id": "w"}}, 200),  # empty queue: null
            ("POST", ("/v1/rollouts", "/v1/rollouts"), {"json": {"input": {"q": 1}, "mode": "nope"}}, 422),
            ("POST", ("/v1/rollouts", "/v1/rollouts"), {"json": {"input": 1, "resources_id": "rs-9"}}, 404),
            ("POST", ("/v1/rollouts", "/v1/rollouts"), {"json": {"input": 1}}, 200),
            ("POST", status, {"json": {"status": "queuing"}}, 422),  # not an attempt status
            ("POST", status, {"json": {"status": "preparing"}}, 409),  # not one a runner reports
            ("POST", unknown, {"json": {"status": "running"}}, 404),
            ("POST", status, {"json": {"status": "running"}}, 200),
            ("POST", status, {"json": {"status": "succeeded", "final_reward": 1.5}}, 200),
            ("POST", status, {"json": {"status": "running"}}, 409),  # terminal now
            ("GET", spans, {}, 405),
            ("POST", ("/v1/spans/", "/v1/spans/"), {"json": span}, None),  # not a hot path: FastAPI answers both
        ]
        for method, paths, kwargs, expected in cases:
            front, fastapi_path = await _both(app, method, paths, **kwargs)
            where = f"{method} {paths[0]} {kwargs}"
            assert front.status_code == fastapi_path.status_code, where
            if expected is not None:
                assert front.status_code == expected, f"{where}: {front.text}"
            if front.status_code >= 400:
                assert front.json()["error"]["type"] == fastapi_path.json()["error"]["type"], where
                assert front.json()["error"]["message"], where
            elif front.status_code == 200 and paths[0] == "/v1/spans":
                # The same span was stored twice (once per path): consecutive sequence numbers, same content.
                a, b = front.json(), fastapi_path.json()
                assert b["sequence_id"] == a["sequence_id"] + 1
                assert {k: v for k, v in a.items() if k != "sequence_id"} == {
                    k: v for k, v in b.items() if k != "sequence_id"
                }
            elif front.status_code == 200:
                assert front.json().keys() == fastapi_path.json().keys() if front.json() else not fastapi_path.json()

    asyncio.run(main())


def test_every_hot_route_is_a_documented_route() -> None:
    app = create_app(InMemoryLightningStore())
    documented = app.openapi()["paths"]
    for method, path in HOT_ROUTES:
        assert method.lower() in documented[path], f"{method} {path}"
