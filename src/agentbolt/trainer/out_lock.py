"""One job at a time in an output directory.

A train job, a ``--resume`` of it, and an ``eval`` or prompt-optimization job each own their output directory while
they run: two jobs on one ``store.db`` would cancel each other's rollouts, overwrite each other's trained records
and checkpoints, and report steps that never trained. :func:`hold_out_dir` takes an exclusive lock on
``OUT/.agentbolt.lock`` (the ``filelock`` package: ``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows) for
the job's whole life. The operating system drops the lock when the process dies, even by SIGKILL, so a killed run
never leaves a stale lock behind; ``OUT/.agentbolt.owner.json`` says which process holds it (pid, command, start
time) for the error message.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from agentbolt.errors import ConfigError

LOCK_NAME = ".agentbolt.lock"
OWNER_NAME = ".agentbolt.owner.json"


@contextlib.contextmanager
def hold_out_dir(out_dir: Path, *, command: str | None = None, create: bool = True) -> Iterator[Path]:
    """Create ``out_dir`` if needed and hold its job lock until the block ends; yields ``out_dir``.

    Args:
        out_dir: the job's output directory.
        command: what holds it, for another job's error message (default: this process's command line).
        create: create a missing ``out_dir``; ``False`` (a resume) refuses one.

    Raises:
        ConfigError: ``out_dir`` is a file, cannot be created, or is missing and ``create`` is false, or another
            process's job holds it (the message names that process and says to wait for it, stop it, or choose
            another ``--out``).
    """
    import filelock

    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is a file; the output must be a directory (choose another --out)")
    if not create and not out_dir.is_dir():
        raise ConfigError(f"nothing to resume in {out_dir}: no such directory; run without --resume")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the output directory {out_dir}: {exc}") from exc
    lock = filelock.FileLock(str(out_dir / LOCK_NAME), timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise ConfigError(
            f"{out_dir} is in use by another agentbolt job ({_owner(out_dir)}); wait for it to end or stop it "
            "(Ctrl-C), or choose another --out"
        ) from None
    owner = out_dir / OWNER_NAME
    try:
        owner.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "command": command or " ".join(sys.argv),
                    "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                }
            )
        )
        yield out_dir
    finally:
        owner.unlink(missing_ok=True)
        lock.release()


def _owner(out_dir: Path) -> str:
    """``pid N: COMMAND, since TIME`` from the owner file, or ``owner unknown``."""
    try:
        data = json.loads((out_dir / OWNER_NAME).read_text())
        return f"pid {data['pid']}: {data['command']}, since {data['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "owner unknown"
