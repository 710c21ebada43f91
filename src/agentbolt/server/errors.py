"""Map exceptions to HTTP answers, all in one shape: ``{"error": {"type": ..., "message": ...}}``.

- agentbolt errors keep their status (:mod:`agentbolt.errors`: 404, 409, 422, 503).
- request validation errors (malformed JSON, wrong types, missing fields) are 422 ``ValidationError`` with a message
  that names each bad field and what is wrong with it; on the gateway's LLM routes, a 400 in the protocol's own
  error shape (OpenAI or Anthropic), as the real APIs answer.
- Starlette/FastAPI HTTP errors (unknown path 404, wrong method 405, unparsable body 400...) keep their status.
- anything else is a bug: 500 ``InternalError``, logged with its traceback, still in the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentbolt.errors import AgentboltError

logger = logging.getLogger(__name__)

_KIND_BY_STATUS: dict[int, str] = {
    404: "NotFoundError",
    409: "ConflictError",
    413: "ContentTooLarge",
    422: "ValidationError",
}
"""Error types named like the client's exception classes where one fits (see ``agentbolt.errors.ERRORS_BY_NAME``)."""

_MAX_LISTED_ERRORS = 10


def error_body(kind: str, message: str) -> dict[str, Any]:
    """The JSON body of every error answer (see :class:`agentbolt.types.api.ErrorBody`)."""
    return {"error": {"type": kind, "message": message}}


def error_response(status: int, kind: str, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The one error shape of the API, as a response."""
    return JSONResponse(status_code=status, content=error_body(kind, message), headers=headers)


def status_kind(status: int) -> str:
    """The ``error.type`` for a bare HTTP status: a client exception name where one fits, else the reason phrase."""
    if status in _KIND_BY_STATUS:
        return _KIND_BY_STATUS[status]
    try:
        return HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    except ValueError:
        return "HTTPError"


def describe_validation_errors(errors: Any) -> str:
    """One line naming each bad field (``body.status``) and what is wrong, for up to 10 errors."""
    parts: list[str] = []
    for err in list(errors)[:_MAX_LISTED_ERRORS]:
        loc = [str(p) for p in err.get("loc", ())]
        if err.get("type") == "json_invalid":
            # FastAPI reports malformed JSON as ("body", <character offset>) with the decoder's reason in ctx.
            reason = (err.get("ctx") or {}).get("error", "not valid JSON")
            where = f" at character {loc[1]}" if len(loc) > 1 else ""
            parts.append(f"request body is not valid JSON{where}: {reason}")
            continue
        if err.get("type") == "missing":
            parts.append(f"{'.'.join(loc)}: field required")
            continue
        parts.append(f"{'.'.join(loc)}: {err.get('msg')}")
    if len(list(errors)) > _MAX_LISTED_ERRORS:
        parts.append(f"(and {len(list(errors)) - _MAX_LISTED_ERRORS} more)")
    return "; ".join(parts) or "invalid request"


def validation_message(errors: Any, scope: Mapping[str, Any]) -> str:
    """:func:`describe_validation_errors`, plus a hint when body errors come with a body that was not sent as JSON.

    ``scope`` is the request's ASGI scope (its ``content-type`` header is read).
    """
    message = describe_validation_errors(errors)
    content_type = ""
    for key, value in scope.get("headers", ()):
        if key == b"content-type":
            content_type = value.decode("latin-1")
            break
    body_errors = any(tuple(err.get("loc", ()))[:1] == ("body",) for err in errors)
    if body_errors and "json" not in content_type:
        message += f" (the body was sent as {content_type or 'no Content-Type'}; send JSON as application/json)"
    return message


def error_for_exception(exc: Exception) -> tuple[int, str, str]:
    """``(status, error.type, message)`` of the answer to an exception raised by an endpoint.

    An :class:`~agentbolt.errors.AgentboltError` keeps its status and class name; anything else is a bug: 500
    ``InternalError`` (the caller logs the traceback).
    """
    if isinstance(exc, AgentboltError):
        return exc.http_status, type(exc).__name__, str(exc)
    return 500, "InternalError", f"internal error (a bug in agentbolt; please report it): {type(exc).__name__}: {exc}"


def install_error_handlers(app: FastAPI) -> None:
    """Register handlers so that every error, expected or not, answers in the one error shape."""

    @app.exception_handler(AgentboltError)
    async def _agentbolt_error(_: Request, exc: AgentboltError) -> JSONResponse:
        return error_response(*error_for_exception(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        from agentbolt.server.gateway.routes import gateway_validation_error  # the gateway's own shapes

        message = validation_message(exc.errors(), request.scope)
        answered = gateway_validation_error(request.url.path, message)
        return answered if answered is not None else error_response(422, "ValidationError", message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail) if exc.detail else HTTPStatus(exc.status_code).phrase
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}; the API is described at /openapi.json"
        elif exc.status_code == 405 and message == "Method Not Allowed":
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed or 'none'}"
        elif exc.status_code == 400 and message == "There was an error parsing the body":
            message = "the request body could not be parsed; send a JSON object with Content-Type: application/json"
        return error_response(exc.status_code, status_kind(exc.status_code), message, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(*error_for_exception(exc))
