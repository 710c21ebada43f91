"""Map exceptions to HTTP answers: agentbolt errors keep their status; validation errors are 422."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from agentbolt.errors import AgentboltError

logger = logging.getLogger(__name__)


def error_response(status: int, kind: str, message: str) -> JSONResponse:
    """The one error shape of the API (see :class:`agentbolt.types.api.ErrorBody`)."""
    return JSONResponse(status_code=status, content={"error": {"type": kind, "message": message}})


def install_error_handlers(app: FastAPI) -> None:
    """Register handlers so no expected error becomes a 500."""

    @app.exception_handler(AgentboltError)
    async def _agentbolt_error(_: Request, exc: AgentboltError) -> JSONResponse:
        return error_response(exc.http_status, type(exc).__name__, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors()[:10]:
            loc = ".".join(str(p) for p in err.get("loc", ()))
            parts.append(f"{loc}: {err.get('msg')}")
        return error_response(422, "ValidationError", "; ".join(parts) or "invalid request")
