"""What the ``agentbolt`` commands share: the consoles, running a long job under signals, and failing with a
message."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def run_job(job: Coroutine[Any, Any, Any], *, on_stop: str | None = None) -> None:
    """Run a long job (``train``, ``demo``) until it ends or SIGINT/SIGTERM arrives; a signal cancels it, so its
    runners are stopped and its store closed on the way out (everything finished stays in the store), then exit 130.
    ``on_stop`` is printed after a signal (e.g. the command that resumes the run)."""

    async def main() -> None:
        import signal

        task = asyncio.ensure_future(job)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            console.print("stopped by a signal; the store keeps every rollout and span recorded so far")
            if on_stop:
                console.print(on_stop)
            raise typer.Exit(130) from None

    asyncio.run(main())


def fail(exc: Exception) -> NoReturn:
    """Print ``exc`` as one error line (a validation error: only its reasons) and exit with status 2."""
    if isinstance(exc, ValidationError):  # a config object refused the options: show only the reasons
        message = "; ".join(str(err.get("msg", err)) for err in exc.errors())
    else:
        message = str(exc)
    err_console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    raise typer.Exit(code=getattr(exc, "exit_code", 2))  # a job that ran and failed (NothingToTrain) exits 1
