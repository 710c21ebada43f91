"""The FastAPI application: store API, OTLP ingestion, gateway, and the dashboard, over one store and one inference
backend.

Every request passes two pure ASGI guards first (:mod:`agentbolt.server.middleware`): the bearer token (when one is
set, no route answers without it: docs, health, OpenAPI, OTLP and the gateway included; only the dashboard's static
files, ``GET /`` and ``/ui/...``, load without it, and the page then sends the token on every API call), then the body
size limit.
The store routes of the rollout lifecycle are then served by calling their endpoints directly
(:mod:`agentbolt.server.hot_routes`); everything else goes through FastAPI.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbolt.errors import ConfigError
from agentbolt.inference.base import InferenceBackend
from agentbolt.server.dashboard_api import router as dashboard_router
from agentbolt.server.dashboard_run import router as run_router
from agentbolt.server.errors import document_common_errors, install_error_handlers
from agentbolt.server.gateway.plain_routes import plain_router as plain_gateway_router
from agentbolt.server.gateway.routes import router as gateway_router
from agentbolt.server.gateway.sampling import VersionLLMCache
from agentbolt.server.gateway.swap import WeightSwapGate
from agentbolt.server.hot_routes import HotRoutes
from agentbolt.server.middleware import (
    DASHBOARD_PREFIX,
    DEFAULT_MAX_BODY_BYTES,
    BearerTokenMiddleware,
    BodySizeLimitMiddleware,
)
from agentbolt.server.otlp import router as otlp_router
from agentbolt.server.store_routes import router as store_router
from agentbolt.store.base import LightningStore

DASHBOARD_DIR = Path(__file__).parent / "dashboard"
"""The dashboard's static files (index.html, app.js, style.css, vendor/), shipped as package data."""


def _check_token(token: str) -> None:
    if not all(0x21 <= ord(ch) <= 0x7E for ch in token):
        raise ConfigError(
            "the server token must be printable ASCII without spaces (it travels in an HTTP header); "
            "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def create_app(
    store: LightningStore,
    backend: InferenceBackend | None = None,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    swap_gate: WeightSwapGate | None = None,
) -> AgentboltApp:
    """Build the server app.

    Args:
        store: the backend every route reads and writes.
        backend: the inference backend behind the gateway (``None``: gateway answers 503).
        token: when set (non-empty), every route requires ``Authorization: Bearer <token>`` (401 otherwise).
        max_body_bytes: largest accepted request body in bytes, declared or streamed (413 above it); for OTLP
            bodies the limit applies after decompression too. Default 16 MiB.
        swap_gate: holds gateway calls while a trainer swaps the serving weights
            (:mod:`agentbolt.server.gateway.swap`); ``None``: a gate of its own that nobody closes.

    Raises:
        ConfigError: ``max_body_bytes`` < 1, or a token that cannot travel in a header.
    """
    if max_body_bytes < 1:
        raise ConfigError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
    if token:
        _check_token(token)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Every backend starts its lease sweep on its first call. Make that call when the server starts, so leases
        # left behind by a killed server expire even if no client calls (and a bad store file fails at startup).
        await store.query_workers()
        yield

    app = AgentboltApp(
        title="agentbolt",
        version="1",
        summary="agentbolt store API, OTLP ingestion and LLM gateway",
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.backend = backend
    app.state.swap_gate = swap_gate if swap_gate is not None else WeightSwapGate()
    app.state.version_llms = VersionLLMCache()
    app.state.max_body_bytes = max_body_bytes
    app.state.unscoped_calls = 0  # LLM calls at the plain /v1 routes, outside any attempt (recorded nowhere)
    install_error_handlers(app)

    app.include_router(dashboard_router)  # before store_router: /v1/rollouts/search is not a rollout id
    app.include_router(run_router)
    app.include_router(store_router)
    app.include_router(otlp_router)
    app.include_router(gateway_router)
    app.include_router(plain_gateway_router)

    @app.get("/", include_in_schema=False)
    async def _root(request: Request) -> Response:
        # The dashboard for browsers; the service blurb for clients that ask for JSON (and not for HTML).
        accept = request.headers.get("accept", "")
        if "application/json" in accept and "text/html" not in accept:
            return JSONResponse({"service": "agentbolt", "api": "/v1", "openapi": "/openapi.json", "dashboard": "/"})
        return FileResponse(DASHBOARD_DIR / "index.html", headers={"cache-control": "no-cache"})

    app.mount(DASHBOARD_PREFIX.rstrip("/"), StaticFiles(directory=DASHBOARD_DIR), name="dashboard")

    _document_guards(app)

    # In front of FastAPI's own stack: the token check first, then the body size limit, then the direct path to the
    # hot store routes (which thereby skip FastAPI's middleware and routing, but never the guards).
    front: ASGIApp = HotRoutes(app.serve_with_fastapi, fastapi_app=app, routes=store_router.routes)
    front = BodySizeLimitMiddleware(front, max_body_bytes=max_body_bytes)
    if token:
        front = BearerTokenMiddleware(front, token=token)
    app.front = front
    return app


class AgentboltApp(FastAPI):
    """The FastAPI app, entered through ``front`` (the guards and the hot routes) when one is set."""

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request through ``front``, which ends in FastAPI's own handling (:meth:`serve_with_fastapi`)."""
        if self.front is None:
            await super().__call__(scope, receive, send)
        else:
            await self.front(scope, receive, send)

    async def serve_with_fastapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own request handling (its middleware stack and routes), without ``front``."""
        await super().__call__(scope, receive, send)


def _document_guards(app: FastAPI) -> None:
    """Declare the bearer token in the OpenAPI document (optional: it is required only when the server has one), and
    the error answers every route can give (:func:`~agentbolt.server.errors.document_common_errors`)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
            schemes["bearerAuth"] = {
                "type": "http",
                "scheme": "bearer",
                "description": "When the server was started with a token (agentbolt serve --token), every route "
                "requires 'Authorization: Bearer <token>' and answers 401 without it.",
            }
            schema["security"] = [{"bearerAuth": []}, {}]
            document_common_errors(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
