"""What the ``agentbolt`` commands share: the consoles, running a long job under signals, and failing with a
message."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping
from types import FrameType
from typing import Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def print_table(renderable: Any) -> None:
    """Print a table on stdout: at the terminal's width on a terminal, at its own full width when piped or
    redirected (rich would cut it to 80 columns there unless ``COLUMNS`` is set)."""
    if console.is_terminal or os.environ.get("COLUMNS"):
        console.print(renderable)
        return
    wide = console.options.update(max_width=10_000)
    width, before = console.measure(renderable, options=wide).maximum, console.width
    console.width = max(width, before)  # print's own width= is capped at the console's
    try:
        console.print(renderable)
    finally:
        console.width = before


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a job (Ctrl-C sends SIGINT to the terminal's whole process group)."""

SIGNAL_EXIT_CODE = 130
"""The exit status of a job stopped by a signal (128 + SIGINT, what a shell reports after a Ctrl-C)."""

STOP_DEADLINE_S = 1.5
"""After the first signal the process exits within this long (seconds), even if the job's teardown is not done."""


def run_job(job: Coroutine[Any, Any, Any], *, on_stop: str | Callable[[], str] | None = None) -> None:
    """Run a long job (``train``, ``demo``, ``eval``) until it ends or SIGINT/SIGTERM arrives.

    The first signal cancels the job. The job never blocks the event loop for long (a model load or an update runs
    in a thread), so the cancellation lands at once in every phase; the job then does what matters first
    (``agentbolt train``: stop its runners, cancel its in-flight rollouts in the store, write the summary of its
    finished steps) and tears the rest down (server, store, model). The process exits with
    :data:`SIGNAL_EXIT_CODE` through ``os._exit`` as soon as the job has stopped, and at the latest
    :data:`STOP_DEADLINE_S` after the signal: the rest of a teardown that takes longer (a generation batch the
    server waits for) and any thread still busy (a model still loading, an update inside torch, which cannot be
    interrupted) are abandoned, not waited for; the store's committed writes are on disk by then. ``on_stop`` (a
    string, or a function called then) is printed on the way out (e.g. the command that resumes the run). A second
    signal exits at once, whatever the job is doing. No traceback is printed.
    """
    exiting = threading.Lock()

    def exit_stopped(note: str | None = None) -> None:
        """Print why the job stopped and end the process (once, from whichever thread gets here first)."""
        with exiting:
            if note:
                console.print(note)
            console.print("stopped by a signal; the store keeps every rollout and span recorded so far")
            note_after = on_stop() if callable(on_stop) else on_stop
            if note_after:
                console.print(note_after)
            sys.stdout.flush()
            sys.stderr.flush()
            _finish_multiprocessing()
            os._exit(SIGNAL_EXIT_CODE)

    async def main() -> None:
        task = asyncio.ensure_future(job)
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal(signum: int, frame: FrameType | None) -> None:
            nonlocal signals
            signals += 1
            if signals > 1:  # asked twice: no more cleanup
                os.write(2, b"\nstopped at once (second signal); the store keeps everything written so far\n")
                os._exit(SIGNAL_EXIT_CODE)
            loop.call_soon_threadsafe(task.cancel)
            deadline = threading.Timer(STOP_DEADLINE_S, exit_stopped, args=("the job's teardown was cut short",))
            deadline.daemon = True
            deadline.start()

        # Python-level handlers, not loop.add_signal_handler: they run on the main thread between bytecodes even
        # while a callback holds the loop, so a second signal always ends the process.
        previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
        stopped = False
        try:
            await task
        except asyncio.CancelledError:
            if signals == 0:
                raise  # cancelled from inside the job, not by a signal
            stopped = True
        finally:
            if not stopped:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        if stopped:
            exit_stopped()  # stopped by a signal

    asyncio.run(main())


def _finish_multiprocessing() -> None:
    """What multiprocessing does at a normal exit, before ``os._exit`` skips it: terminate child processes still
    running and run its finalizers (else its resource tracker reports the job's semaphores as "leaked")."""
    import multiprocessing.util

    finish = getattr(multiprocessing.util, "_exit_function", None)  # the atexit hook multiprocessing registers
    if finish is not None:
        with contextlib.suppress(Exception):
            finish()


def fail(exc: Exception, options: Mapping[str, str] | None = None) -> NoReturn:
    """Print ``exc`` as one error line and exit with status 2. A validation error of a config built from the
    command's options is shown as its reasons, each after the option it is about: ``options`` maps a config field
    to its option (``{"resources_id": "--resources"}``); other fields are shown as ``--field-name``."""
    if isinstance(exc, ValidationError):  # a config object refused the options: show only the reasons
        reasons = []
        for err in exc.errors():
            loc = err.get("loc") or ()
            field = str(loc[0]) if loc else ""
            name = (options or {}).get(field) or ("--" + field.replace("_", "-") if field else "")
            reason = str(err.get("msg", err)).removeprefix("Value error, ")
            reasons.append(f"{name}: {reason}" if name else reason)
        message = "; ".join(reasons)
    else:
        message = str(exc)
    # The message is plain text: escaped, so "pip install 'agentbolt[verl]'" keeps its brackets.
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    raise typer.Exit(code=getattr(exc, "exit_code", 2))  # a job that ran and failed (NothingToTrain) exits 1
