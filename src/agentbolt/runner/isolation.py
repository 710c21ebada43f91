"""Where a runner runs a synchronous agent, and how it stops one that runs past its attempt's timeout.

An ``async def`` agent runs on the runner's event loop and is stopped by cancelling its task. A synchronous agent
cannot be cancelled from outside its thread, so a runner runs it in one of two places (``Runner(isolation=...)``):

- ``"process"``: a child process forked for the attempt (POSIX only). The child inherits the imported agent and the
  instrumented frameworks, runs the agent under the attempt's :class:`~agentbolt.tracing.AttemptContext`, and sends
  each span back to the runner over a pipe as soon as it ends, then the agent's return value (or its exception).
  Past the timeout the child is killed (``SIGKILL``): an agent asleep forever, blocked in a C call or waiting on a
  tool that never answers is gone, and the slot is free at once. Each attempt starts from the runner's state at the
  fork: what an agent changes in memory (module globals, ``self`` of a ``LitAgent``) does not carry over to the next
  attempt.
- ``"thread"``: a daemon thread of the runner. Past the timeout the runner stops waiting and frees the slot, but the
  thread cannot be killed: it is left running (logged) until it returns or the process exits.

Either way the attempt is reported ``timeout`` with ``error.type == "timeout"`` (:func:`timeout_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Final, Literal

from opentelemetry.sdk.trace import ReadableSpan

from agentbolt.tracing.context import AttemptContext, attempt_scope
from agentbolt.tracing.emit import emit_exception
from agentbolt.types import Span

logger = logging.getLogger(__name__)

Isolation = Literal["process", "thread"]

EXIT_GRACE_S: Final = 2.0
"""After sending its result, a child process gets this long to exit on its own (threads the agent left behind keep
it alive) before the runner kills it (seconds)."""


def process_isolation_available() -> bool:
    """True where a runner can fork a child process per attempt (POSIX ``fork``)."""
    return "fork" in mp.get_all_start_methods()


class AgentTimeout(Exception):
    """The agent ran past its attempt's ``timeout_seconds`` and was stopped (process) or abandoned (thread)."""

    def __init__(self, timeout_s: float, how: str) -> None:
        super().__init__(f"the agent ran past its timeout of {timeout_s:g} s and was {how}")
        self.timeout_s = timeout_s
        self.how = how


class AgentProcessDied(Exception):
    """The child process running the agent ended without a result (a crash, ``os._exit``, killed from outside)."""


@dataclass
class RemoteAgentError(Exception):
    """The agent raised in its child process; carries the original exception's type name, message and traceback.

    ``str()`` is the original message, so reports read as if the exception had been raised in the runner.
    """

    type_name: str
    message: str
    traceback_text: str = field(repr=False)

    def __str__(self) -> str:
        return self.message


def describe_exception(exc: BaseException) -> str:
    """``str(exc)``, with the URL of the HTTP request it failed on when it carries one (``httpx`` errors and the
    ``openai``/``anthropic`` clients' connection errors, whose own message is only ``Connection error.``)."""
    message = str(exc)
    url = None
    with contextlib.suppress(Exception):  # httpx raises RuntimeError for an error without a request
        request = getattr(exc, "request", None)
        url = getattr(request, "url", None)
    if url is not None and str(url) not in message:
        message = f"{message} (request to {url})" if message else f"request to {url} failed"
    return message


def timeout_error(exc: AgentTimeout, worker_id: str) -> dict[str, Any]:
    """The ``error`` a runner reports with an attempt it stopped at its timeout (``type`` ``"timeout"``)."""
    return {
        "type": "timeout",
        "cause": "timeout",
        "message": f"{exc} by runner {worker_id}",
        "timeout_seconds": exc.timeout_s,
    }


# ---------------------------------------------------------------------------------------------------- child side


class _PipeAttempt(AttemptContext):
    """The child's attempt context: every finished span is also sent to the runner over ``conn``."""

    conn: Connection | None = None
    send_lock: threading.Lock | None = None

    def finished(self, otel_span: ReadableSpan) -> Span:
        span = super().finished(otel_span)
        if self.conn is not None and self.send_lock is not None:
            with self.send_lock:
                self.conn.send(("span", span))
        return span


def _die_with_parent(parent_pid: int) -> None:
    """End this child when the runner that forked it dies, even by SIGKILL and even while the agent holds the GIL:
    the kernel's parent-death signal on Linux, else a watcher thread polling the parent's pid."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent_pid:  # the parent died before the signal was armed
                    os._exit(1)
                return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="agentbolt-parent-watch", daemon=True).start()


_PR_SET_PDEATHSIG: Final = 1


def _child_main(
    conn: Connection, call: Callable[[], Any], rollout_id: str, attempt_id: str, trace_id: str, parent_pid: int
) -> None:
    """Body of the forked child: run ``call`` under the attempt, stream its spans, send its outcome, exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner stops its children itself
    _die_with_parent(parent_pid)
    ctx = _PipeAttempt(rollout_id, attempt_id, trace_id=trace_id)
    ctx.conn, ctx.send_lock = conn, threading.Lock()
    message: tuple[Any, ...]
    try:
        with attempt_scope(ctx):
            returned = call()
        message = ("returned", returned)
    except BaseException as exc:  # the agent's failure is reported, whatever it is
        with attempt_scope(ctx):
            emit_exception(exc)
        message = ("raised", type(exc).__name__, describe_exception(exc), traceback.format_exc())
    with ctx.send_lock:
        try:
            conn.send(message)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # an unpicklable return value
            conn.send(("unpicklable", type(message[1]).__name__, repr(message[1])[:500], str(exc)))
        ctx.conn = None
    conn.close()


# ---------------------------------------------------------------------------------------------------- runner side

SpanWriter = Callable[[list[Span]], Awaitable[None]]


def _read_pipe(conn: Connection, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[Any, ...]]) -> None:
    """Reader thread: hand every message from the child to ``queue`` on ``loop``; ``("eof",)`` when the pipe ends."""
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:  # a message that cannot be unpickled
                message = ("garbled", repr(exc))
            loop.call_soon_threadsafe(queue.put_nowait, message)
    finally:
        conn.close()
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(queue.put_nowait, ("eof",))


async def _take_spans(first: Span, queue: asyncio.Queue[tuple[Any, ...]]) -> tuple[list[Span], tuple[Any, ...] | None]:
    """``first`` and every span already queued behind it; the first non-span message met, if any."""
    spans = [first]
    while not queue.empty():
        message = queue.get_nowait()
        if message[0] != "span":
            return spans, message
        spans.append(message[1])
    return spans, None


async def _outcome(
    queue: asyncio.Queue[tuple[Any, ...]], ctx: AttemptContext, write_spans: SpanWriter
) -> tuple[Any, ...]:
    """Write the child's spans as they come (in order, batched), until its outcome message or the end of the pipe."""
    pending: tuple[Any, ...] | None = None
    while True:
        message = pending or await queue.get()
        pending = None
        if message[0] != "span":
            return message
        spans, pending = await _take_spans(message[1], queue)
        ctx.spans.extend(spans)
        await write_spans(spans)


async def _drain(queue: asyncio.Queue[tuple[Any, ...]], ctx: AttemptContext, write_spans: SpanWriter) -> None:
    """After a kill: write the spans the child sent before it died (until the pipe's end, at most 2 s)."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(_outcome(queue, ctx, write_spans), EXIT_GRACE_S)


class _Child:
    """A forked child process: its pid, a kill and a reap (``os.fork`` directly: a runner process is itself a
    daemonic ``multiprocessing`` child, which ``multiprocessing`` forbids to have children)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exitcode: int | None = None

    def kill(self) -> None:
        if self.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def reap(self, grace_s: float) -> int | None:
        """Wait up to ``grace_s`` for the child to exit, then kill it; its exit code (blocking; run in a thread)."""
        deadline = time.monotonic() + grace_s
        while self.exitcode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                return None
            if pid:
                self.exitcode = os.waitstatus_to_exitcode(status)
            elif time.monotonic() >= deadline:
                self.kill()
                deadline = time.monotonic() + 5.0
            else:
                time.sleep(0.02)
        return self.exitcode


def _fork(target: Callable[[], None]) -> _Child:
    """Fork a child that runs ``target`` and exits (``os._exit``: no atexit handlers of the runner run there)."""
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+ warns on fork in a threaded process
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            target()
            code = 0
        except BaseException:  # nothing may escape into the runner's code in the child
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    return _Child(pid)


async def run_in_child(
    call: Callable[[], Any], ctx: AttemptContext, write_spans: SpanWriter, timeout_s: float | None
) -> Any:
    """Run the synchronous ``call`` in a forked child process under ``ctx``'s ids; return what it returned.

    The child's spans are appended to ``ctx.spans`` and passed to ``write_spans`` in the order they ended, before
    this returns or raises.

    Args:
        call: the agent call, taking no arguments (inherited by the fork; nothing is pickled on the way in).
        ctx: the attempt (its rollout id, attempt id and trace id are the child's).
        write_spans: coroutine function writing a batch of the child's spans to the store.
        timeout_s: seconds from now after which the child is killed; ``None`` waits without limit.

    Raises:
        AgentTimeout: ``timeout_s`` passed; the child was killed.
        RemoteAgentError: the agent raised (type name, message and traceback of the child's exception), or returned
            a value that cannot be pickled back.
        AgentProcessDied: the child ended without a result (crash, ``os._exit``, killed by someone else).
        asyncio.CancelledError: the caller was cancelled; the child is killed first.
    """
    loop = asyncio.get_running_loop()
    parent_conn, child_conn = mp.Pipe(duplex=False)
    runner_pid = os.getpid()

    def in_child() -> None:
        parent_conn.close()
        _child_main(child_conn, call, ctx.rollout_id, ctx.attempt_id, ctx.trace_id, runner_pid)

    child = _fork(in_child)
    child_conn.close()  # the parent's copy: the pipe ends when the child's copy closes (exit or kill)
    queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    reader = threading.Thread(
        target=_read_pipe, args=(parent_conn, loop, queue), name=f"agentbolt-pipe-{ctx.attempt_id}", daemon=True
    )
    reader.start()
    limit = asyncio.timeout(timeout_s)
    try:
        async with limit:
            message = await _outcome(queue, ctx, write_spans)
    except TimeoutError:
        if not limit.expired():
            raise
        child.kill()
        await _drain(queue, ctx, write_spans)
        await asyncio.to_thread(child.reap, 0.0)
        raise AgentTimeout(timeout_s or 0.0, f"stopped (its process {child.pid} killed)") from None
    except BaseException:
        child.kill()
        await asyncio.to_thread(child.reap, 0.0)
        raise
    code = await asyncio.to_thread(child.reap, EXIT_GRACE_S)
    kind = message[0]
    if kind == "returned":
        return message[1]
    if kind == "raised":
        raise RemoteAgentError(message[1], message[2], message[3])
    if kind == "unpicklable":
        raise RemoteAgentError(
            "UnpicklableReturnValue",
            f"the agent returned a {message[1]} ({message[2]}) that cannot be sent back from its process: {message[3]};"
            " return a number (the reward) or None",
            "",
        )
    raise AgentProcessDied(
        f"the agent's process ended without a result (exit code {code}); a crash in native code, os._exit or an "
        "outside kill ends it this way" + (f" ({message[1]})" if kind == "garbled" else "")
    )


async def run_in_thread(call: Callable[[], Any], ctx: AttemptContext, timeout_s: float | None) -> Any:
    """Run the synchronous ``call`` in a daemon thread under ``ctx``; return what it returned.

    Raises:
        AgentTimeout: ``timeout_s`` passed; the thread is left running (it cannot be killed) and logged.
        Whatever ``call`` raised.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)

    def work() -> None:
        try:
            with attempt_scope(ctx):
                value = call()
        except BaseException as exc:  # handed to the awaiting runner
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, None)

    thread = threading.Thread(target=work, name=f"agentbolt-agent-{ctx.attempt_id}", daemon=True)
    thread.start()
    limit = asyncio.timeout(timeout_s)
    try:
        async with limit:
            return await asyncio.shield(done)
    except TimeoutError:
        if not limit.expired():  # the agent's own TimeoutError
            raise
        logger.warning(
            "attempt %s: the agent's thread ran past its timeout of %g s; it cannot be killed and is left running "
            "(use Runner(isolation='process') to have such agents stopped)",
            ctx.attempt_id,
            timeout_s,
        )
        raise AgentTimeout(timeout_s or 0.0, "abandoned (its thread cannot be killed)") from None


def default_isolation() -> Isolation:
    """``"process"`` where forking is available, else ``"thread"``."""
    return "process" if process_isolation_available() and os.name == "posix" else "thread"
