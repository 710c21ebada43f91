"""Map exceptions to HTTP answers, all in one shape: ``{"error": {"type": ..., "message": ...}}``.

- agentbolt errors keep their status (:mod:`agentbolt.errors`: 404, 409, 422, 503).
- request validation errors (malformed JSON, wrong types, missing fields) are 422 ``ValidationError`` with a message
  that names each bad field and what is wrong with it; on the gateway's LLM routes, a 400 in the protocol's own
  error shape (OpenAI or Anthropic), as the real APIs answer.
- Starlette/FastAPI HTTP errors (unknown path 404, wrong method 405, unparsable body 400...) keep their status
  (an unparsable body on the gateway's LLM routes: in the protocol's shape too).
- anything else is a bug: 500 ``InternalError``, logged with its traceback, still in the same shape.

The OpenAPI document declares each of those answers with :class:`ErrorAnswer`: a route lists the statuses of its own
outcomes with :func:`error_responses` (``404``, ``409``...), and the app adds those every route can answer
(:func:`document_common_errors`: 401 from the token guard, 400/413/422 for a request body or parameters).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
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


class ErrorObject(BaseModel):
    """The ``error`` object of an error answer."""

    type: str = Field(description="the error's name, e.g. NotFoundError, ConflictError, ValidationError")
    message: str = Field(description="what went wrong and what to do about it")


class ErrorAnswer(BaseModel):
    """The body of every error answer of the API (the gateway's LLM routes answer in their protocol's own shape)."""

    error: ErrorObject


ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "the request body could not be read (not UTF-8 text, or a malformed Content-Length)",
    401: "the server has a token (agentbolt serve --token) and the request lacks 'Authorization: Bearer <token>'",
    404: "an id in the path or the body names a record the store does not have",
    409: "the record's state does not allow it (e.g. an illegal status transition, or a rollout already finished)",
    413: "the request body is larger than the server's limit (agentbolt serve --max-body-mb)",
    422: "a field or parameter is missing, of the wrong type or out of its bounds; the message names each",
    503: "a backend the route needs is missing or unavailable; the message says how to start one",
}
"""What each error status means, as the OpenAPI document describes it."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of a route: each of ``statuses`` is an :class:`ErrorAnswer` described by
    :data:`ERROR_DESCRIPTIONS`. Example: ``@router.get("/rollouts/{rollout_id}", responses=error_responses(404))``."""
    return {status: {"model": ErrorAnswer, "description": ERROR_DESCRIPTIONS[status]} for status in statuses}


def error_body(kind: str, message: str) -> dict[str, Any]:
    """The JSON body of every error answer (declared as :class:`ErrorAnswer`)."""
    return {"error": {"type": kind, "message": message}}


def error_response(status: int, kind: str, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The one error shape of the API, as a response."""
    return JSONResponse(status_code=status, content=error_body(kind, message), headers=headers)


def document_common_errors(schema: dict[str, Any]) -> None:
    """Declare, in an OpenAPI document built by FastAPI, the error answers that do not depend on the route.

    Every operation: 401 (the token guard). An operation with a request body: 400 (unreadable body) and 413 (the
    body size guard). FastAPI's default 422 (its ``HTTPValidationError``, which is not what the API answers) becomes
    an :class:`ErrorAnswer`; on the gateway's LLM routes, where a bad body is a 400 in the protocol's own shape
    (declared by the route), it is dropped. A status the route declares itself is left as it is.
    """
    from agentbolt.server.gateway.routes import gateway_validation_error  # the gateway's own shapes

    ref = {"$ref": "#/components/schemas/ErrorAnswer"}

    def declared(status: int) -> dict[str, Any]:
        return {"description": ERROR_DESCRIPTIONS[status], "content": {"application/json": {"schema": ref}}}

    for path, operations in schema.get("paths", {}).items():
        gateway_llm_route = gateway_validation_error(path, "") is not None
        for operation in operations.values():
            responses: dict[str, Any] = operation.setdefault("responses", {})
            statuses = [401, 400, 413] if "requestBody" in operation else [401]
            for status in statuses:
                responses.setdefault(str(status), declared(status))
            default_422 = "HTTPValidationError" in str(responses.get("422", {}))
            if default_422 and gateway_llm_route:
                del responses["422"]
            elif default_422:
                responses["422"] = declared(422)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    answer = ErrorAnswer.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in {**answer.pop("$defs", {}), "ErrorAnswer": answer}.items():
        components.setdefault(name, definition)
    for name in ("HTTPValidationError", "ValidationError"):
        if f"#/components/schemas/{name}" not in str(schema):
            components.pop(name, None)


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
            from agentbolt.server.gateway.routes import gateway_validation_error  # the gateway's own shapes

            message = "the request body could not be parsed; send a JSON object with Content-Type: application/json"
            answered = gateway_validation_error(request.url.path, message)
            if answered is not None:
                return answered
        return error_response(exc.status_code, status_kind(exc.status_code), message, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(*error_for_exception(exc))
