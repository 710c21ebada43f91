"""Pure ASGI middlewares that guard every route: the bearer token and the request body size limit.

They are plain ASGI callables (not ``BaseHTTPMiddleware``, which wraps each request in extra tasks and streams), so
they cost one function call per request. :func:`agentbolt.server.app.create_app` puts the token check outermost:

    BearerTokenMiddleware -> BodySizeLimitMiddleware -> HotRoutes -> FastAPI's routes (store API, OTLP, gateway, docs)

Both answer in the API's error shape (``{"error": {"type": ..., "message": ...}}``).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentbolt.server.errors import error_body

MIB = 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 16 * MIB
"""Default limit on one request body (16 MiB): far above any store call or OTLP batch the SDK sends by default."""


async def send_json_error(send: Send, status: int, kind: str, message: str, headers: list[tuple[bytes, bytes]]) -> None:
    """Send a complete error response in the API's error shape on a raw ASGI ``send``."""
    body = json.dumps(error_body(kind, message)).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


DASHBOARD_PREFIX = "/ui/"
"""Where the dashboard's static files are served (``GET /`` is its index.html)."""


def is_dashboard_asset(scope: Scope) -> bool:
    """Whether the request is a ``GET``/``HEAD`` of the dashboard's static files: ``/`` or ``/ui/...``.

    These load without the token (they are the same files in every installation and hold no data); the page asks for
    the token and sends it on every ``/v1`` call.
    """
    if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
        return False
    path: str = scope["path"]
    return path == "/" or path.startswith(DASHBOARD_PREFIX)


class BearerTokenMiddleware:
    """Refuse every HTTP request (and WebSocket) that lacks ``Authorization: Bearer <token>``; 401 otherwise.
    ``x-api-key: <token>`` (how the Anthropic SDK and Claude Code send their key) is accepted like the bearer token.

    The one exception is the dashboard's static files (:func:`is_dashboard_asset`): ``GET /`` and ``GET /ui/...``.
    The comparison is constant-time (:func:`hmac.compare_digest`). Lifespan events pass through.

    Args:
        app: the wrapped ASGI app.
        token: the secret; non-empty.
    """

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        if not token:
            raise ValueError("BearerTokenMiddleware needs a non-empty token")
        self.app = app
        self._expected = b"Bearer " + token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the token, then hand the request to the wrapped app."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"authorization")
        api_key = _header(scope, b"x-api-key")
        if given is None and api_key is not None:
            given = b"Bearer " + api_key
        if (given is not None and hmac.compare_digest(given, self._expected)) or is_dashboard_asset(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong bearer token"})
            return
        reason = "missing" if given is None else "wrong"
        message = (
            f"{reason} 'Authorization: Bearer <token>' header; this server requires the token it was started with "
            "(agentbolt serve --token, or AGENTBOLT_TOKEN)"
        )
        await send_json_error(send, 401, "Unauthorized", message, [(b"www-authenticate", b"Bearer")])


class _BodyTooLarge(Exception):
    """Raised from ``receive`` once a streamed body passes the limit; turned into a 413 by the middleware."""


class BodySizeLimitMiddleware:
    """Answer 413 when a request body is larger than ``max_body_bytes``.

    A declared ``Content-Length`` above the limit is refused before any of the body is read (and one within it is
    trusted: the HTTP server delivers exactly that many bytes). A body without one (chunked transfer encoding) is
    counted as it streams; once it passes the limit, the app's ``receive`` raises and
    whatever the app answers is replaced by the 413 (unless its response had already started).

    Args:
        app: the wrapped ASGI app.
        max_body_bytes: the largest accepted body, in bytes (>= 1).
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _message(self) -> str:
        limit = self.max_body_bytes
        shown = f"{limit / MIB:g} MiB ({limit} bytes)" if limit >= MIB else f"{limit} bytes"
        return (
            f"request body is larger than this server's limit of {shown}; send smaller batches, "
            "or raise the limit (agentbolt serve --max-body-mb, or create_app(max_body_bytes=...))"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Enforce the limit on the declared and on the streamed body size."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                declared_bytes = int(declared)
            except ValueError:
                shown = declared.decode("latin-1")
                await send_json_error(send, 400, "BadRequest", f"Content-Length {shown!r} is not a number", [])
                return
            if declared_bytes > self.max_body_bytes:
                await send_json_error(send, 413, "ContentTooLarge", self._message(), [])
                return
            if _header(scope, b"transfer-encoding") is None:
                # The HTTP server delivers exactly Content-Length bytes, so a declared body within the limit needs
                # no counting: the fast path for nearly every request.
                await self.app(scope, receive, send)
                return

        received = 0
        exceeded = False
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    exceeded = True
                    raise _BodyTooLarge(self._message())
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            if exceeded and not response_started:
                return  # the app's answer to the cut-off body is replaced by the 413 below
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _BodyTooLarge:
            pass
        except Exception:
            if not exceeded:
                raise
        if exceeded and not response_started:
            await send_json_error(send, 413, "ContentTooLarge", self._message(), [])
