"""The FastAPI application: store API, gateway, and (later) dashboard, over one store and one inference backend."""

from __future__ import annotations

import secrets

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentbolt.inference.base import InferenceBackend
from agentbolt.server.errors import error_response, install_error_handlers
from agentbolt.server.gateway.routes import router as gateway_router
from agentbolt.server.store_routes import router as store_router
from agentbolt.store.base import LightningStore


def create_app(store: LightningStore, backend: InferenceBackend | None = None, *, token: str | None = None) -> FastAPI:
    """Build the server app.

    Args:
        store: the backend every route reads and writes.
        backend: the inference backend behind the gateway (``None``: gateway answers 503).
        token: when set, every route requires ``Authorization: Bearer <token>`` (401 otherwise).
    """
    app = FastAPI(title="agentbolt", version="1", summary="agentbolt store API and LLM gateway")
    app.state.store = store
    app.state.backend = backend
    install_error_handlers(app)

    if token:
        expected = f"Bearer {token}"

        @app.middleware("http")
        async def _require_token(request: Request, call_next):  # type: ignore[no-untyped-def]
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), expected.encode()):
                return error_response(401, "Unauthorized", "missing or wrong 'Authorization: Bearer <token>' header")
            return await call_next(request)

    app.include_router(store_router)
    app.include_router(gateway_router)

    @app.get("/", include_in_schema=False)
    async def _root() -> JSONResponse:
        return JSONResponse({"service": "agentbolt", "api": "/v1", "openapi": "/openapi.json"})

    return app
