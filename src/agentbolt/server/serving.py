"""Run the FastAPI app with uvicorn inside the caller's event loop, on a loopback port (0 = any free port)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn
from fastapi import FastAPI

from agentbolt.errors import ConfigError

logger = logging.getLogger(__name__)


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """Bind a listening TCP socket. Raises ConfigError with a clear message when the port is taken or invalid."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"port must be between 0 and 65535 (0 = any free port), got {port}")
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without it
    # Nagle + delayed ACK add ~40 ms to every keep-alive request.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is already in use; pick another with --port or stop the other server"
            ) from exc
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT/SIGTERM to its host program. uvicorn's own handlers would only stop the
    server, and a job still waiting on its runners (``agentbolt train``) would then hang; the CLI commands install
    handlers that stop the whole job instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serve_in_background(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` while the ``async with`` block runs; yields the base URL (``http://host:port``)."""
    sock = bind_socket(host, port)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30, proxy_headers=False)
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        # Inside the try: a cancellation while the server starts (Ctrl-C delivered once a model load gave the loop
        # back) still shuts it down, instead of leaving it to be killed mid-lifespan when the loop closes.
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        bound_port = sock.getsockname()[1]
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=10)
        except TimeoutError:  # requests still running (a long generation): stop without waiting for them
            logger.warning("the server did not stop within 10 s (requests still running); closing it now")
            server.force_exit = True
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, timeout=5)
        except asyncio.CancelledError:
            task.cancel()
        sock.close()
