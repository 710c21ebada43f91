"""Local runner processes: each one imports the agent by reference and serves rollouts over HTTP.

The agent is given as ``"package.module:attribute"`` so that a fresh (spawned) process can import it; the process
talks to the server only through :class:`~agentbolt.client.HttpLightningStore` and the gateway.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as MpEvent

from agentbolt.errors import ConfigError
from agentbolt.runner.agent import FunctionAgent, LitAgent

logger = logging.getLogger(__name__)

#: After its parent process is gone, a runner gets this long to stop on its own before it exits hard.
ORPHAN_GRACE_S = 10.0


def load_agent(reference: str) -> LitAgent:
    """Import ``"module:attribute"`` and return it as a :class:`LitAgent`.

    Raises:
        ConfigError: malformed reference, missing module or attribute, or an object that is not an agent.
    """
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"agent reference must look like 'package.module:attribute', got {reference!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        parts = module_name.split(".")
        if missing and missing not in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
            # the agent's module was found; something it imports is not installed
            raise ConfigError(
                f"agent module {module_name!r} imports {missing!r}, which is not installed in this environment "
                f"({sys.executable}); install it there (pip install the package that provides it)"
            ) from exc
        raise ConfigError(
            f"cannot import agent module {module_name!r}: {exc}; run agentbolt from the folder that holds "
            f"{parts[0]!r}, or add that folder to PYTHONPATH"
        ) from exc
    except Exception as exc:  # a syntax error (its text names the file and line) or one raised at its top level
        raise ConfigError(
            f"agent module {module_name!r} failed to import: {type(exc).__name__}: {exc}; fix the module "
            f"(python -c 'import {module_name}' shows the traceback)"
        ) from exc
    obj = getattr(module, attr, None)
    if obj is None:
        agents = [
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and (
                isinstance(value, LitAgent)  # a @rollout function
                or (isinstance(value, type) and issubclass(value, LitAgent) and value.__module__ == module_name)
                or (inspect.isfunction(value) and value.__module__ == module_name)
            )
        ]
        found = (
            f"the agents and functions it defines: {', '.join(sorted(agents))}"
            if agents
            else "it defines no function, @rollout function or LitAgent"
        )
        raise ConfigError(
            f"module {module_name!r} ({getattr(module, '__file__', None) or 'no file'}) has no attribute {attr!r}; "
            f"{found}; set agent: {module_name}:NAME"
        )
    if isinstance(obj, type) and issubclass(obj, LitAgent):
        obj = obj()
    if isinstance(obj, LitAgent):
        return obj
    if callable(obj):
        return FunctionAgent(obj)
    raise ConfigError(f"{reference!r} is neither a LitAgent nor a function")


def _watch_parent(parent_pid: int, orphaned: threading.Event, grace_s: float, poll_s: float = 1.0) -> None:
    """Set ``orphaned`` when the parent process is gone, then end this process if it is still alive ``grace_s`` later.

    A parent killed by SIGKILL or SIGTERM runs no cleanup, so its runners would go on claiming rollouts (or sit in an
    agent's HTTP retries) for as long as the server lives. The parent is gone when ``os.getppid()`` changes (the OS
    re-parents an orphan to init or to a subreaper).
    """
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    logger.warning("runner's parent process %d is gone; stopping (hard exit in %.0f s)", parent_pid, grace_s)
    orphaned.set()
    time.sleep(grace_s)
    logger.warning("runner did not stop within %.0f s of its parent's exit; exiting now", grace_s)
    os._exit(1)


def _runner_main(
    agent_ref: str,
    store_url: str,
    token: str | None,
    worker_id: str,
    concurrency: int,
    stop: MpEvent,
    path: list[str],
    instrument: bool | list[str] = True,
    parent_pid: int | None = None,
) -> None:
    # Ctrl-C in a terminal reaches the whole process group; the parent job stops its runners itself (``stop``), so a
    # runner ignores SIGINT instead of dying with a KeyboardInterrupt traceback in the user's terminal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    orphaned = threading.Event()
    if parent_pid is not None:
        threading.Thread(
            target=_watch_parent,
            args=(parent_pid, orphaned, ORPHAN_GRACE_S),
            name="agentbolt-parent-watch",
            daemon=True,
        ).start()
    for entry in path:
        if entry not in sys.path:
            sys.path.append(entry)
    logging.basicConfig(level=logging.WARNING)
    from agentbolt.client import HttpLightningStore
    from agentbolt.runner.isolation import default_isolation
    from agentbolt.runner.worker import Runner

    async def main() -> None:
        store = HttpLightningStore(store_url, token=token)
        runner = Runner(
            load_agent(agent_ref),
            store,
            worker_id=worker_id,
            concurrency=concurrency,
            instrument=instrument,
            isolation=default_isolation(),
        )
        try:
            await runner.run(stop=lambda: stop.is_set() or orphaned.is_set())
        finally:
            await store.close()

    asyncio.run(main())


def peak_rss_mb(pid: int) -> float | None:
    """Peak resident memory of the live process ``pid``, in MiB: Linux's ``VmHWM`` (``/proc/<pid>/status``), the peak
    of the process's own address space. ``None`` where it cannot be read (not Linux, the process is gone).

    ``getrusage(RUSAGE_CHILDREN)`` cannot stand in for it: a child started by fork + exec (``spawn``, ``subprocess``)
    is charged its parent's resident size at the fork, so every child of a 12 GB trainer reads as 12 GB there.
    """
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class RunnerPool:
    """Runner processes started by :func:`start_runner_processes`; :meth:`stop` ends them (waits, then kills).

    Attributes:
        peak_rss_mb: each runner's peak resident memory in MiB (:func:`peak_rss_mb`; ``None`` where unknown), read by
            :meth:`note_peak_rss` just before the runners are told to stop (:meth:`stop` calls it).
    """

    processes: list[BaseProcess]
    stop_event: MpEvent
    peak_rss_mb: dict[str, float | None] = field(default_factory=dict)

    def note_peak_rss(self) -> None:
        """Read each live runner's peak resident memory into :attr:`peak_rss_mb` (call it before stopping them)."""
        for proc in self.processes:
            if proc.pid is not None and proc.is_alive():
                self.peak_rss_mb[proc.name] = peak_rss_mb(proc.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.note_peak_rss()
        self.stop_event.set()
        for proc in self.processes:
            proc.join(timeout_s)
            if proc.is_alive():
                logger.warning("runner %s did not stop in %.0f s; terminating", proc.name, timeout_s)
                proc.terminate()
                proc.join(2.0)

    def alive(self) -> int:
        return sum(p.is_alive() for p in self.processes)


def start_runner_processes(
    agent_ref: str,
    store_url: str,
    *,
    n_processes: int = 2,
    concurrency: int = 4,
    token: str | None = None,
    instrument: bool | Sequence[str] = True,
) -> RunnerPool:
    """Start ``n_processes`` spawned runner processes, each running ``concurrency`` rollouts at once.

    ``instrument`` is passed to each :class:`~agentbolt.runner.worker.Runner` (frameworks to instrument; ``True``:
    every installed one). Spans go to the server over OTLP/HTTP (``<store_url>/v1/traces``). A synchronous agent
    runs in a child process forked per attempt (``isolation="process"``, where fork exists), so an attempt past its
    ``timeout_seconds`` is killed and its slot freed at once.

    The runners end with the calling process: :meth:`RunnerPool.stop` stops them cleanly, and if the caller dies
    without stopping them (SIGKILL, SIGTERM), each runner notices within a second, stops claiming rollouts, and exits
    at the latest :data:`ORPHAN_GRACE_S` seconds later. An attempt cut short that way is handled like any lost worker's:
    by the rollout's :class:`~agentbolt.types.core.RolloutConfig` (``unresponsive_seconds``, ``max_attempts``).
    """
    load_agent(agent_ref)  # fail here, with a clear error, rather than in every child
    wanted: bool | list[str] = instrument if isinstance(instrument, bool) else list(instrument)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = []
    for i in range(n_processes):
        proc = ctx.Process(
            target=_runner_main,
            args=(agent_ref, store_url, token, f"runner-{i}", concurrency, stop, list(sys.path), wanted, os.getpid()),
            name=f"agentbolt-runner-{i}",
            daemon=True,
        )
        proc.start()
        procs.append(proc)
    return RunnerPool(procs, stop)
