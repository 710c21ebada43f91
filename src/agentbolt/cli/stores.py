"""Opening a store for the read-side commands (``agentbolt export``, ``agentbolt inspect``) and reading finished
rollouts from it with a progress bar.

The ``--store`` value is either a store file (a path to an existing SQLite file, or ``sqlite:///path.db``; a job's
output folder stands for its ``store.db``), the ``http(s)://`` address of a running ``agentbolt serve`` (bearer token
from ``--token`` / ``AGENTBOLT_TOKEN``), or a ``postgresql://`` URL. A path that does not exist is refused instead of
being created empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentbolt.adapter.export_rows import FinishedRollout
from agentbolt.errors import ConfigError
from agentbolt.store.base import LightningStore
from agentbolt.types import Rollout, RolloutMode, RolloutStatus

PAGE_SIZE = 500
"""Rollouts read per ``query_rollouts`` call."""


def open_store(value: str, *, token: str | None = None) -> LightningStore:
    """The store ``value`` names (module docstring). Close it with ``await store.close()``.

    Raises:
        ConfigError: the file does not exist, ``memory://`` (a new, empty store), or a URL no backend accepts.
    """
    from agentbolt.store import build_store
    from agentbolt.store.sqlite import SqliteLightningStore

    value = value.strip()
    if value.startswith(("http://", "https://")):
        from agentbolt.client import HttpLightningStore

        return HttpLightningStore(value, token=token)
    if value.lower().startswith("memory://"):
        raise ConfigError(
            "memory:// is a new, empty store; give the store file (e.g. runs/demo/store.db) or the http(s):// address "
            "of a running `agentbolt serve`"
        )
    if "://" not in value:
        path = Path(value)
        if path.is_dir() and (path / "store.db").is_file():  # a job's output folder: its store
            path = path / "store.db"
        if not path.is_file():
            raise ConfigError(
                f"no store file at {value!r}; give the SQLite file written by `agentbolt serve`, `agentbolt train` or "
                "`agentbolt demo` (e.g. runs/demo/store.db), or the http(s):// address of a running server"
            )
        return SqliteLightningStore(path)
    store = build_store(value)
    if isinstance(store, SqliteLightningStore) and not store.path.is_file():
        raise ConfigError(
            f"no store file at {str(store.path)!r} (from {value!r}); check the path: three slashes then a relative "
            "path, four for an absolute one"
        )
    return store


async def query_all_rollouts(store: LightningStore, *, mode: RolloutMode | None = None) -> list[Rollout]:
    """Every rollout of ``mode`` (``None``: any), in enqueue order, read page by page."""
    out: list[Rollout] = []
    while True:
        page = await store.query_rollouts(mode=mode, limit=PAGE_SIZE, offset=len(out))
        out.extend(page)
        if len(page) < PAGE_SIZE:
            return out


async def read_finished(
    store: LightningStore,
    rollouts: Sequence[Rollout],
    *,
    resources_id: str | None = None,
    console: Console | None = None,
    description: str = "reading rollouts",
) -> list[FinishedRollout]:
    """The latest attempt and its spans of each rollout, showing a progress bar on ``console`` (``None``: none).

    With ``resources_id``, only rollouts that ran against it are kept: the rollout's ``resources_id``, or, when the
    rollout left it to claim time (``None``), its latest attempt's.
    """
    out: list[FinishedRollout] = []
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=console is None,
    )
    with progress:
        task = progress.add_task(description, total=len(rollouts))
        for rollout in rollouts:
            attempts = await store.query_attempts(rollout.rollout_id)
            last = attempts[-1] if attempts else None
            ran_on = rollout.resources_id or (last.resources_id if last is not None else None)
            if resources_id is None or ran_on == resources_id:
                spans = [] if last is None else list(await store.query_spans(rollout.rollout_id, last.attempt_id))
                out.append(FinishedRollout(rollout, last, spans))
            progress.advance(task)
    return out


TERMINAL = (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED)
"""Rollout statuses the export reads (the others are still running)."""
