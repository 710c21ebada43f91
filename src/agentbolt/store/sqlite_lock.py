"""Who has a SQLite store file open: a lock that says so, so the file is never moved or removed under a live process.

Every :class:`~agentbolt.store.sqlite.SqliteLightningStore` holds a shared lock (``flock(LOCK_SH)``) on
``.<name>.lock`` beside its file (``OUT/.store.db.lock`` for ``OUT/store.db``) from its first call to
:meth:`~agentbolt.store.sqlite.SqliteLightningStore.close`: ``agentbolt serve``, a train job, ``export``. Processes
that share the file share the lock. What replaces or removes the file (``agentbolt train --overwrite``, a job
clearing the empty store of a run that stopped early) first takes it exclusively with :func:`exclusive_store`, which
fails at once, naming the holders, while any other process has the store open. Otherwise a server would go on
acknowledging writes into a file that is no longer in the folder, and lose them all.

The operating system drops the lock when its process dies, even by SIGKILL, so a crashed server never blocks anyone.
The lock file itself is never removed (removing it could let two processes lock two different files). Holders are
named from ``/proc/locks`` where the system has it (Linux), else from the record the latest holder wrote into the
lock file. Without ``fcntl`` (Windows) there is no lock: there an open file cannot be renamed or deleted anyway.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from agentbolt.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

OPEN_WAIT_S = 10.0
"""How long opening a store waits while another process holds its lock exclusively (an ``--overwrite`` moving it
aside holds it for the moment of a rename)."""


def lock_path(db: Path) -> Path:
    """The lock file of the store file ``db``: ``.<name>.lock`` in the same folder."""
    return db.with_name(f".{db.name}.lock")


class StoreFileLock:
    """The shared lock a process holds while it has the store file ``db`` open (module docstring).

    :meth:`acquire` is idempotent and thread-safe (the store opens connections from several threads);
    :meth:`release` drops it. A folder where the lock file cannot be created (read-only) is used without a lock.
    """

    def __init__(self, db: Path) -> None:
        self.db = db
        self._fd: int | None = None
        self._mutex = threading.Lock()

    def acquire(self, wait_s: float = OPEN_WAIT_S) -> None:
        """Hold the shared lock (no-op when held already, or without ``fcntl``).

        Raises:
            ConfigError: another process held the lock exclusively (moving the store aside) for ``wait_s`` seconds.
        """
        if fcntl is None or str(self.db) == ":memory:":
            return
        with self._mutex:
            if self._fd is not None:
                return
            path = lock_path(self.db)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                logger.debug("no owner lock for %s (%s): the store is used without one", self.db, exc)
                return
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        raise ConfigError(
                            f"{self.db} is being replaced by another process ({describe_holders(self.db)}); "
                            "wait for it to finish, then try again"
                        ) from None
                    time.sleep(0.05)
            _write_record(fd)
            self._fd = fd

    def release(self) -> None:
        """Drop the lock (no-op when not held)."""
        with self._mutex:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops its flock


@contextlib.contextmanager
def exclusive_store(db: Path, *, action: str) -> Iterator[None]:
    """Hold the lock of the store file ``db`` exclusively while the block runs: no other process has the store open,
    and none can open it until the block ends (an opener waits up to :data:`OPEN_WAIT_S`).

    Args:
        db: the store file (it need not exist).
        action: what the block does, for the error message (e.g. ``"--overwrite moves it aside"``).

    Raises:
        ConfigError: another process has the store open; the message names it (pid and command when known) and says
            to stop it first or choose another output folder.
    """
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(lock_path(db), os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:  # no folder: no store, and nobody has it open
        yield
        return
    except OSError as exc:
        message = f"cannot create the lock file {lock_path(db)}: {exc}; check the folder's permissions"
        raise ConfigError(message) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{db} is open in another process ({describe_holders(db)}), and {action}: that process would go on "
                "writing into a file that is no longer there, and what it writes would be lost. Stop that process "
                "first (Ctrl-C), or choose another --out"
            ) from None
        yield
    finally:
        os.close(fd)


def describe_holders(db: Path) -> str:
    """``pid N: COMMAND`` for each process holding the lock of ``db`` (``/proc/locks``), else the record the
    latest holder wrote, else ``holder unknown``."""
    path = lock_path(db)
    holders = [f"pid {pid}: {_command_of(pid)}" for pid in _proc_lock_pids(path)]
    if holders:
        return "; ".join(holders)
    try:
        record = json.loads(path.read_text())
        return f"pid {record['pid']}: {record['command']}, since {record['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def _write_record(fd: int) -> None:
    """Write who holds the lock into the lock file (best effort: the file is shared by every holder)."""
    record = {
        "pid": os.getpid(),
        "command": " ".join(sys.argv),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)


def _proc_lock_pids(path: Path) -> list[int]:
    """Pids of other processes holding a ``flock`` on ``path``, from ``/proc/locks`` (empty where there is none)."""
    try:
        inode = path.stat().st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids: list[int] = []
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  READ  1234 fd:01:5678 0 EOF"; a waiter has "->" after the number
        if len(fields) < 6 or fields[1] != "FLOCK" or not fields[4].isdigit():
            continue
        if fields[5].rsplit(":", 1)[-1] == str(inode):
            pid = int(fields[4])
            if pid != os.getpid() and pid not in pids:
                pids.append(pid)
    return pids


def _command_of(pid: int) -> str:
    """The command line of process ``pid`` (``/proc``), or ``command unknown``."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "command unknown"
    command = " ".join(raw.decode(errors="replace").replace("\0", " ").split())  # one line
    return command[:300] or "command unknown"
