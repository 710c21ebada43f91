"""The engine process dies with the job: ``llama-server`` is started with a parent-death signal
(:func:`agentbolt.inference.llamacpp._die_with_parent`), so a job killed with SIGKILL, or ended by ``os._exit`` after
Ctrl-C (:func:`agentbolt.cli.common.run_job`'s deadline), leaves no server behind. Real processes: a Python parent
starts a real child (``sleep``) the same way and is then killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")

PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from agentbolt.inference.llamacpp import _die_with_parent
    child = subprocess.Popen(["sleep", "120"], preexec_fn=_die_with_parent())
    print(child.pid, flush=True)
    if sys.argv[1] == "exit":
        time.sleep(0.3)
        os._exit(130)  # what run_job does at its stop deadline
    time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone: it was killed and waits for its new parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_the_engine_child_dies_with_its_parent(how: str) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    try:
        assert _alive(child_pid)
        if how == "sigkill":
            parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child_pid), f"the child outlived its parent ({how})"
    finally:
        if _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
