"""Progress off a terminal (a log file): plain lines while a task moves, at most every ``every_s``, and at its end."""

from __future__ import annotations

import io

from rich.console import Console

from agentbolt.trainer.progress_bars import JobProgress


def _log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=120), out


def test_lines_off_a_terminal() -> None:
    console, out = _log_console()
    with JobProgress(console, every_s=0.0) as progress:
        task = progress.add_task("step 1 rollouts", total=3)
        progress.advance(task)
        progress.update(task, completed=1)  # no change: no line
        progress.update(task, completed=3)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("step 1 rollouts:")]
    assert [line.split(" (")[0] for line in lines] == ["step 1 rollouts: 1/3", "step 1 rollouts: 3/3"]
    # only those lines: the bar is not printed once more at the end (rich does that off a terminal)
    assert out.getvalue().splitlines() == lines and "━" not in out.getvalue()


def test_a_slow_interval_prints_only_the_end() -> None:
    console, out = _log_console()
    with JobProgress(console, every_s=3600.0) as progress:
        task = progress.add_task("eval", total=2)
        progress.advance(task)
        progress.advance(task)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("eval:")]
    assert [line.split(" (")[0] for line in lines] == ["eval: 2/2"]


def test_a_terminal_gets_the_bar_and_no_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with JobProgress(console, every_s=0.0) as progress:
        task = progress.add_task("eval", total=2)
        progress.advance(task, 2)
    assert "eval: 2/2" not in out.getvalue() and "2/2" in out.getvalue()
