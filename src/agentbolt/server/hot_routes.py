"""A direct ASGI path to the endpoints of the rollout lifecycle: span ingestion, claims, status changes, enqueue.

Those routes carry one request per span and per status change, and FastAPI's request machinery (route matching,
dependency solving, ``json.loads`` then validating the parsed dict) cost about as much server CPU per request as the
store call itself. :class:`HotRoutes` sits just inside the guards (token, body size) and, for a request whose method
and path match one of :data:`HOT_ROUTES`, calls the same FastAPI endpoint function directly: the body is validated
from its raw bytes by pydantic in one pass (``model_validate_json``), path parameters are passed as keyword arguments,
and errors are answered exactly as the app's exception handlers answer them (:mod:`agentbolt.server.errors`).
Every other request, and the OpenAPI document, go through FastAPI unchanged; there is one endpoint per route.

Measured on the project's 2-core machine (``POST /v1/spans`` with a 1.7 KB span, memory store, one client): server CPU
per request 257 us through FastAPI, 137 us through this path (a bare uvicorn ASGI app: 87 us).
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbolt.server.errors import error_for_exception, validation_message
from agentbolt.server.middleware import send_json_error

logger = logging.getLogger(__name__)

HOT_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/v1/spans"),
    ("POST", "/v1/claims"),
    ("POST", "/v1/rollouts/{rollout_id}/attempts/{attempt_id}/status"),
    ("POST", "/v1/rollouts"),
)
"""``(method, path template)`` of the routes served directly; each must be a FastAPI route of the app whose endpoint
takes at most one pydantic body parameter, ``str`` path parameters and the ``Request``."""


@dataclass(frozen=True)
class _Hot:
    segments: tuple[str | None, ...]  # a literal segment, or None for a path parameter
    param_names: tuple[str, ...]  # path parameters, in path order
    body_name: str | None
    body_model: type[BaseModel] | None
    request_name: str | None
    endpoint: Callable[..., Awaitable[Any]]


def _compile(route: APIRoute) -> _Hot:
    """The direct-call plan of one FastAPI route.

    Raises:
        TypeError: the endpoint takes something other than one pydantic body, ``str`` path parameters and the
            ``Request`` (it must then stay on FastAPI's path).
    """
    segments: list[str | None] = []
    params: list[str] = []
    for part in route.path.strip("/").split("/"):
        if part.startswith("{") and part.endswith("}"):
            segments.append(None)
            params.append(part[1:-1])
        else:
            segments.append(part)
    hints = typing.get_type_hints(route.endpoint)
    body_name = body_model = request_name = None
    for name in inspect.signature(route.endpoint).parameters:
        hint = hints.get(name)
        if name in params:
            if hint is not str:
                raise TypeError(f"{route.path}: path parameter {name} must be a str to be served directly")
        elif hint is Request:
            request_name = name
        elif isinstance(hint, type) and issubclass(hint, BaseModel) and body_name is None:
            body_name, body_model = name, hint
        else:
            raise TypeError(f"{route.path}: parameter {name} ({hint}) cannot be served directly")
    return _Hot(tuple(segments), tuple(params), body_name, body_model, request_name, route.endpoint)


class HotRoutes:
    """ASGI middleware: serve :data:`HOT_ROUTES` by calling their FastAPI endpoints directly.

    Args:
        app: the next ASGI app (the FastAPI app, inside the guards).
        fastapi_app: the app the endpoints belong to (their ``Request`` sees it as ``request.app``).
        routes: the FastAPI routes to take the hot ones from (e.g. ``APIRouter.routes``, prefix included).

    Raises:
        LookupError: a route of :data:`HOT_ROUTES` is not among ``routes``.
        TypeError: a hot route's endpoint takes a parameter that cannot be passed directly.
    """

    def __init__(self, app: ASGIApp, *, fastapi_app: FastAPI, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.fastapi_app = fastapi_app
        by_key = {(method, r.path): r for r in routes if isinstance(r, APIRoute) for method in r.methods or ()}
        self._table: dict[tuple[str, int], list[_Hot]] = {}
        for method, path in HOT_ROUTES:
            route = by_key.get((method, path))
            if route is None:
                raise LookupError(f"hot route {method} {path} is not among the routes given")
            hot = _compile(route)
            self._table.setdefault((method, len(hot.segments)), []).append(hot)

    def _match(self, method: str, path: str) -> tuple[_Hot, dict[str, Any]] | None:
        parts = path.strip("/").split("/")
        for hot in self._table.get((method, len(parts)), ()):
            values: dict[str, Any] = {}
            for want, got in zip(hot.segments, parts, strict=True):
                if want is None:
                    if not got:
                        break
                    values[hot.param_names[len(values)]] = got
                elif want != got:
                    break
            else:
                if not path.endswith("/") or path == "/":
                    return hot, values
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a hot route directly; hand anything else to the next app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        matched = self._match(scope["method"], scope["path"])
        if matched is None:
            await self.app(scope, receive, send)
            return
        hot, kwargs = matched
        if hot.body_model is not None:
            body = await _read_body(receive)
            try:
                if _sent_as_json(scope):
                    kwargs[hot.body_name] = hot.body_model.model_validate_json(body)  # type: ignore[index]
                else:  # FastAPI's rule: a body declared as something else is not parsed, so it cannot validate
                    hot.body_model.model_validate(body)
            except ValidationError as exc:
                errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
                await send_json_error(send, 422, "ValidationError", validation_message(errors, scope), [])
                return
        if hot.request_name is not None:
            scope.setdefault("app", self.fastapi_app)
            kwargs[hot.request_name] = Request(scope, receive)
        try:
            response = await hot.endpoint(**kwargs)
        except Exception as exc:
            status, kind, message = error_for_exception(exc)
            if status >= 500:
                logger.exception("unhandled error in %s %s", scope["method"], scope["path"])
            await send_json_error(send, status, kind, message, [])
            return
        await response(scope, receive, send)


def _sent_as_json(scope: Scope) -> bool:
    """Whether the body is to be parsed as JSON: no ``Content-Type``, ``application/json`` or ``application/*+json``
    (the rule FastAPI applies to a route's body)."""
    for key, value in scope["headers"]:
        if key == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))
    return True


async def _read_body(receive: Receive) -> bytes:
    """The whole request body (the size limit is enforced by the guard outside)."""
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body"):
        return body
    chunks = [body]
    while message.get("more_body"):
        message = await receive()
        chunks.append(message.get("body", b""))
    return b"".join(chunks)
