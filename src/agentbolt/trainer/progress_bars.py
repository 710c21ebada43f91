"""Progress bars that also work in a log file.

Rich draws a live bar only on a terminal; with output sent to a file or a pipe (``nohup``, CI, ``| tee``) it
prints the bars once, at the end, so a long job looks stuck. :class:`JobProgress` keeps rich's bar on a terminal and,
elsewhere, prints one plain line per task at most every ``every_s`` seconds while it moves, and when it completes.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TaskID, TextColumn, TimeElapsedColumn

LOG_EVERY_S = 30.0
"""Seconds between two progress lines of one task when the output is not a terminal."""


class JobProgress(Progress):
    """A :class:`rich.progress.Progress` (description, bar, done/total, elapsed, plus ``extra`` columns) that prints
    ``description: done/total (elapsed s)`` lines when its console is not a terminal.

    Args:
        console: where it draws or prints.
        extra: more columns after the elapsed time (e.g. a score field).
        every_s: seconds between two lines of one task, off a terminal.
    """

    def __init__(self, console: Console, *extra: ProgressColumn | str, every_s: float = LOG_EVERY_S) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), *extra)
        # off a terminal rich would print every bar once more at the end, after the plain lines: not drawn at all
        super().__init__(*columns, console=console, disable=not console.is_terminal)
        self.every_s = every_s
        self._logged: dict[TaskID, tuple[float, float]] = {}  # task -> (time of its last line, completed then)

    def update(self, task_id: TaskID, **kwargs: Any) -> None:  # type: ignore[override]
        super().update(task_id, **kwargs)
        self._log_line(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log_line(task_id)

    def _log_line(self, task_id: TaskID) -> None:
        if self.console.is_terminal:
            return
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or not task.total:
                return
            now = time.monotonic()
            last_time, last_done = self._logged.get(task_id, (task.start_time or now, 0.0))
            done = task.completed >= task.total
            if task.completed == last_done or (not done and now - last_time < self.every_s):
                return
            self._logged[task_id] = (now, task.completed)
            elapsed = task.elapsed or 0.0
            line = f"{task.description}: {task.completed:g}/{task.total:g} ({elapsed:.0f} s)"
        self.console.print(line, markup=False, highlight=False)
