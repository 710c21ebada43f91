"""Every route of the server, walked over real HTTP (uvicorn on 127.0.0.1, httpx), for safety properties.

The walker enumerates ``app.routes`` itself and fills path parameters with unknown ids, so a new route is covered
the day it is added; a route it cannot handle (a new route type, or a route taking a body that the ``BODY_CASES``
table does not describe) fails the test instead of being skipped.

- auth: with a token set, every route and method answers 401 without the token and with a wrong one, except the
  dashboard's static files (``GET /`` and the ``/ui`` mount), which load without it;
- bodies: for every route that takes one, malformed JSON, a body of the wrong JSON type, and each field given a
  value of the wrong type (derived from the route's OpenAPI schema) answer 4xx, never 5xx; an oversized body
  answers 413, with a Content-Length and chunked;
- unknown ids answer 404; illegal transitions answer 409; an unexpected exception still answers in the error shape.

Every error answer (HEAD aside, which has no body) must carry a non-empty ``error.message``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from agentbolt import semconv
from agentbolt.inference.base import GenerationRequest, GenerationResult
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import AttemptStatus

TOKEN = "walker-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 64 * 1024
UNKNOWN = "unknown-{name}"


class FakeBackend:
    """A real inference backend in shape, answering a fixed completion (the gateway needs one to reach the store)."""

    model_name = "fake"
    model_version = "base"

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return GenerationResult([1, 2], [3], [-0.1], "ok", "stop", self.model_version)

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------- the routes


def _leaf_routes(routes: list[BaseRoute]) -> Iterator[tuple[str, set[str]]]:
    """(path template, methods) of every route, looking inside included routers."""
    for route in routes:
        if isinstance(route, Route):  # APIRoute too
            yield route.path, set(route.methods or ())
        elif isinstance(route, Mount) and isinstance(route.app, StaticFiles):
            continue  # the dashboard's static files: public by design (test_dashboard_assets_are_public)
        elif hasattr(route, "effective_route_contexts"):  # FastAPI's included router (newer FastAPI versions)
            for context in route.effective_route_contexts():  # type: ignore[attr-defined]
                original = context.original_route
                if not isinstance(original, Route):
                    pytest.fail(f"the walker cannot handle {type(original).__name__} at {context.path}; teach it")
                yield context.path, set(original.methods or ())
        else:
            pytest.fail(f"the walker cannot handle route {route!r} ({type(route).__name__}); teach it")


def all_operations(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path template) the app answers."""
    ops = sorted({(method, path) for path, methods in _leaf_routes(app.routes) for method in methods})
    assert len(ops) > 20, ops  # the store API alone has more; an empty walk must not pass
    return ops


def fill(path: str) -> str:
    """The path with each ``{param}`` replaced by an id no store has."""
    return re.sub(r"\{(\w+)(?::[^}]*)?\}", lambda m: UNKNOWN.format(name=m.group(1)), path)


# ------------------------------------------------------------------------------------- what bodies look like

SPAN = {
    "rollout_id": "unknown-rollout",
    "attempt_id": "unknown-attempt",
    "span_id": "00000000000000aa",
    "trace_id": "0" * 31 + "1",
    "name": "probe",
    "start_time": 1.0,
}
OTLP_UNKNOWN = {
    "resourceSpans": [
        {
            "resource": {
                "attributes": [
                    {"key": semconv.ROLLOUT_ID, "value": {"stringValue": "unknown-rollout"}},
                    {"key": semconv.ATTEMPT_ID, "value": {"stringValue": "unknown-attempt"}},
                ]
            },
            "scopeSpans": [{"spans": [{"traceId": SPAN["trace_id"], "spanId": SPAN["span_id"], "name": "probe"}]}],
        }
    ]
}

TRAINED_SAMPLE = {
    "train_step": 1,
    "sample_index": 0,
    "rollout_id": "unknown-rollout",
    "attempt_id": "unknown-attempt",
    "calls": [{"span_id": SPAN["span_id"], "response_start": 1, "response_end": 2}],
    "loss_mask_ranges": [[1, 2]],
    "advantage": 0.5,
    "advantage_estimator": "grpo",
    "credit_assignment": "broadcast",
}


@dataclass(frozen=True)
class BodyCase:
    """A valid body for a route (naming unknown ids where the body can name any) and the status it gets."""

    valid: Any
    status: int
    wrong_fields: tuple[tuple[str, Any], ...] = ()
    """For a route whose body schema is a free JSON object (the gateway's protocols, which check every field
    themselves): bodies with one field of a wrong type."""


BODY_CASES: dict[tuple[str, str], BodyCase] = {
    ("POST", "/v1/rollouts"): BodyCase({"input": {"q": 1}, "resources_id": "unknown-resources"}, 404),
    ("POST", "/v1/rollouts/batch"): BodyCase({"requests": [{"input": 1, "resources_id": "unknown-resources"}]}, 404),
    ("POST", "/v1/rollouts/wait"): BodyCase({"rollout_ids": ["unknown-rollout"], "timeout_s": 0}, 404),
    ("POST", "/v1/claims"): BodyCase({"worker_id": "w-walker"}, 200),
    ("POST", "/v1/claims/batch"): BodyCase({"worker_id": "w-walker", "n": 2}, 200),
    ("POST", "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/status"): BodyCase({"status": "running"}, 404),
    ("POST", "/v1/spans"): BodyCase(SPAN, 404),
    ("POST", "/v1/spans/batch"): BodyCase({"spans": [SPAN]}, 404),
    ("POST", "/v1/resources"): BodyCase(
        {"resources": {"prompt": {"resource_type": "prompt_template", "template": "{q}"}}}, 200
    ),
    ("POST", "/v1/workers/{worker_id}/heartbeat"): BodyCase(
        {"rollout_id": "unknown-rollout", "attempt_id": "unknown-attempt"}, 404
    ),
    ("POST", "/v1/metrics"): BodyCase({"metrics": [{"name": "loss", "train_step": 1, "value": 0.5, "time": 1.0}]}, 200),
    ("POST", "/v1/trained-samples"): BodyCase({"train_step": 1, "samples": [TRAINED_SAMPLE]}, 404),
    ("POST", "/v1/traces"): BodyCase(OTLP_UNKNOWN, 404),
    ("POST", "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1/chat/completions"): BodyCase(
        {"messages": [{"role": "user", "content": "hi"}]},
        404,
        (("messages", {"messages": "hi"}), ("temperature", {"messages": [], "temperature": "hot"})),
    ),
    ("POST", "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1/completions"): BodyCase(
        {"prompt": "hi"}, 404, (("prompt", {"prompt": {"a": 1}}),)
    ),
    ("POST", "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1/responses"): BodyCase(
        {"input": "hi"}, 404, (("input", {"input": 42}),)
    ),
    ("POST", "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1/messages"): BodyCase(
        {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        404,
        (("max_tokens", {"max_tokens": "4", "messages": []}),),
    ),
    ("POST", "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1/messages/count_tokens"): BodyCase(
        {"messages": [{"role": "user", "content": "hi"}]}, 404, (("messages", {"messages": "hi"}),)
    ),
    # the unrecorded routes (the optimizer LLM, serve --adapter), served by this app's scripted backend
    ("POST", "/v1/chat/completions"): BodyCase(
        {"messages": [{"role": "user", "content": "hi"}]}, 200, (("messages", {"messages": "hi"}),)
    ),
    ("POST", "/v1/completions"): BodyCase({"prompt": "hi"}, 200, (("prompt", {"prompt": {"a": 1}}),)),
    ("POST", "/v1/responses"): BodyCase({"input": "hi"}, 200, (("input", {"input": 42}),)),
    ("POST", "/v1/messages"): BodyCase(
        {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        200,
        (("max_tokens", {"max_tokens": "4", "messages": []}),),
    ),
    # the scripted backend does not tokenize: count_tokens says so (400), as for any such backend
    ("POST", "/v1/messages/count_tokens"): BodyCase(
        {"messages": [{"role": "user", "content": "hi"}]}, 400, (("messages", {"messages": "hi"}),)
    ),
}
"""Every route that takes a body. A new one must be added here (the test says so)."""

NO_BODY_UNKNOWN_ID_STATUS: dict[tuple[str, str], int] = {}
"""Routes with path ids that do not answer 404 for unknown ids, and why (none today)."""


# ------------------------------------------------------------------------------ wrong values from the schema


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return _resolve(spec, schema["allOf"][0])
    return schema


def json_types(spec: dict[str, Any], schema: dict[str, Any]) -> set[str] | None:
    """The JSON types a schema accepts (``None``: any)."""
    schema = _resolve(spec, schema)
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        found: set[str] = set()
        for option in options:
            types = json_types(spec, option)
            if types is None:
                return None
            found |= types
        return found
    kind = schema.get("type")
    if kind is None:
        return {"object"} if "properties" in schema else None
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if "integer" in kinds:
        kinds.add("number")
    return kinds


WRONG_VALUES: list[tuple[str, Any]] = [("object", {"wrong": ["type"]}), ("array", [{"wrong": "type"}])]


def wrong_field_bodies(spec: dict[str, Any], path: str, valid: Any) -> Iterator[tuple[str, Any]]:
    """For each top-level field of the JSON body schema: the valid body with that field of a wrong JSON type."""
    operation = spec["paths"][path]["post"]
    schema = _resolve(spec, operation["requestBody"]["content"]["application/json"]["schema"])
    for name, prop in schema.get("properties", {}).items():
        allowed = json_types(spec, prop)
        if allowed is None:
            continue  # takes any JSON value
        for kind, value in WRONG_VALUES:
            if kind not in allowed:
                yield name, {**valid, name: value}
                break


# ------------------------------------------------------------------------------------------------ helpers


def assert_error(resp: httpx.Response, statuses: range | set[int], what: str) -> None:
    """The status is in range and the body is the error shape with a non-empty message."""
    assert resp.status_code in statuses, f"{what}: {resp.status_code} {resp.text[:300]}"
    if resp.request.method == "HEAD":
        return
    message = resp.json()["error"]["message"]
    assert isinstance(message, str) and message.strip(), f"{what}: empty error message"


async def _chunks(data: bytes, size: int = 8192) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _app() -> FastAPI:
    return create_app(InMemoryLightningStore(), FakeBackend(), token=TOKEN, max_body_bytes=LIMIT)


# -------------------------------------------------------------------------------------------------- tests


def test_every_route_requires_the_token() -> None:
    async def main() -> None:
        app = _app()
        ops = all_operations(app)
        async with serve_in_background(app) as url, httpx.AsyncClient(base_url=url) as client:
            for method, path in ops:
                if (method, path) in PUBLIC_OPERATIONS:
                    continue
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                    resp = await client.request(method, fill(path), headers=headers)
                    assert_error(resp, {401}, f"{method} {path} with {headers or 'no header'}")
                    assert resp.headers["www-authenticate"] == "Bearer"
                if method == "GET":  # and the right token gets through (not 401)
                    resp = await client.request(method, fill(path), headers=AUTH)
                    assert resp.status_code != 401, f"{method} {path}: {resp.text[:200]}"

    asyncio.run(main())


PUBLIC_OPERATIONS = {("GET", "/"), ("HEAD", "/")}
"""The dashboard's index.html; with the ``/ui`` mount, the only answers a token-guarded server gives without it."""


def test_dashboard_assets_are_public() -> None:
    async def main() -> None:
        async with serve_in_background(_app()) as url, httpx.AsyncClient(base_url=url) as client:
            for path in ("/", "/ui/app.js", "/ui/style.css", "/ui/vendor/uPlot.iife.min.js"):
                resp = await client.get(path)
                assert resp.status_code == 200, f"{path}: {resp.status_code}"
            assert "<title>agentbolt</title>" in (await client.get("/")).text
            blurb = await client.get("/", headers={"Accept": "application/json"})
            assert blurb.json()["api"] == "/v1"
            # the same prefix is not a way around the token: anything else, and any other method, stays guarded
            for method, path in (("POST", "/"), ("PUT", "/ui/app.js"), ("GET", "/v1/rollouts"), ("GET", "/uix")):
                assert (await client.request(method, path)).status_code == 401, f"{method} {path}"
            assert (await client.get("/ui/../v1/rollouts")).status_code in (401, 404)

    asyncio.run(main())


def test_every_body_route_refuses_bad_bodies_with_4xx() -> None:
    async def main() -> None:
        app = _app()
        spec = app.openapi()
        body_routes = {
            (method, path)
            for method, path in all_operations(app)
            if spec["paths"].get(path, {}).get(method.lower(), {}).get("requestBody")
        }
        missing = body_routes - BODY_CASES.keys()
        assert not missing, f"routes taking a body that BODY_CASES does not describe (add them): {sorted(missing)}"
        stale = BODY_CASES.keys() - body_routes
        assert not stale, f"BODY_CASES entries for routes that no longer take a body: {sorted(stale)}"

        async with (
            serve_in_background(app) as url,
            httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as client,
        ):
            for method, path in sorted(body_routes):
                case = BODY_CASES[(method, path)]
                target = fill(path)
                what = f"{method} {path}"
                json_headers = {"Content-Type": "application/json"}

                resp = await client.request(method, target, json=case.valid)
                assert resp.status_code == case.status, f"{what} valid body: {resp.status_code} {resp.text[:300]}"
                if case.status >= 400:
                    assert_error(resp, {case.status}, f"{what} valid body")

                for raw in (b'{"input": ', b"\xff\xfe not utf-8", b"", b'{"a": ' + b"[" * 30_000):
                    resp = await client.request(method, target, content=raw, headers=json_headers)
                    assert_error(resp, range(400, 500), f"{what} malformed JSON {raw!r}")

                for wrong_type in ([case.valid], "a string", 42, None):
                    resp = await client.request(method, target, json=wrong_type)
                    assert_error(resp, range(400, 500), f"{what} body of the wrong JSON type {wrong_type!r}")

                fields = list(wrong_field_bodies(spec, path, case.valid)) + list(case.wrong_fields)
                assert fields or path == "/v1/traces", f"{what}: no typed field found in its schema"
                for name, body in fields:
                    resp = await client.request(method, target, json=body)
                    assert_error(resp, range(400, 500), f"{what} field {name!r} of the wrong type")

                oversized = b'{"pad": "' + b"x" * LIMIT + b'"}'
                resp = await client.request(method, target, content=oversized, headers=json_headers)
                assert_error(resp, {413}, f"{what} oversized body")
                assert str(LIMIT) in resp.json()["error"]["message"]
                resp = await client.request(method, target, content=_chunks(oversized), headers=json_headers)
                assert "content-length" not in resp.request.headers
                assert_error(resp, {413}, f"{what} oversized chunked body")

            # the connection stays usable after a refused body
            assert (await client.get("/v1/health")).status_code == 200

    asyncio.run(main())


def test_unknown_ids_are_404() -> None:
    async def main() -> None:
        app = _app()
        with_ids = [(m, p) for m, p in all_operations(app) if "{" in p and m != "HEAD"]
        assert with_ids
        async with serve_in_background(app) as url, httpx.AsyncClient(base_url=url, headers=AUTH) as client:
            for method, path in with_ids:
                case = BODY_CASES.get((method, path))
                resp = await client.request(method, fill(path), json=None if case is None else case.valid)
                expected = NO_BODY_UNKNOWN_ID_STATUS.get((method, path), 404)
                assert_error(resp, {expected}, f"{method} {path} with unknown ids")
            resp = await client.get("/v1/no-such-route")
            assert_error(resp, {404}, "unknown path")
            resp = await client.delete("/v1/health")
            assert_error(resp, {405}, "wrong method")

    asyncio.run(main())


def test_illegal_transitions_are_409() -> None:
    async def main() -> None:
        store = InMemoryLightningStore()
        app = create_app(store, FakeBackend(), token=TOKEN)
        async with serve_in_background(app) as url, httpx.AsyncClient(base_url=url, headers=AUTH) as client:
            rollout = (await client.post("/v1/rollouts", json={"input": 1})).json()
            claimed = (await client.post("/v1/claims", json={"worker_id": "w"})).json()
            rollout_id, attempt_id = claimed["rollout"]["rollout_id"], claimed["attempt"]["attempt_id"]
            assert rollout_id == rollout["rollout_id"]
            status_path = f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/status"
            resp = await client.post(status_path, json={"status": AttemptStatus.SUCCEEDED.value, "final_reward": 1})
            assert resp.status_code == 200, resp.text

            resp = await client.post(status_path, json={"status": AttemptStatus.RUNNING.value})
            assert_error(resp, {409}, "succeeded attempt back to running")
            resp = await client.post(f"/v1/rollouts/{rollout_id}/cancel")
            assert_error(resp, {409}, "cancel a succeeded rollout")
            chat = f"/v1/rollouts/{rollout_id}/attempts/{attempt_id}/v1/chat/completions"
            resp = await client.post(chat, json={"messages": [{"role": "user", "content": "hi"}]})
            assert_error(resp, {409}, "LLM call for a finished attempt")

    asyncio.run(main())


def test_unexpected_exceptions_answer_in_the_error_shape() -> None:
    async def main() -> None:
        app = _app()

        @app.get("/v1/boom")
        async def boom() -> None:
            """Fails like a bug would."""
            raise RuntimeError("kaboom")

        async with serve_in_background(app) as url, httpx.AsyncClient(base_url=url, headers=AUTH) as client:
            resp = await client.get("/v1/boom")
            assert_error(resp, {500}, "unexpected exception")
            assert resp.json()["error"]["type"] == "InternalError" and "kaboom" in resp.json()["error"]["message"]

    asyncio.run(main())
