"""Runner processes end with the process that started them, even when it dies without cleanup (SIGKILL): a real
``agentbolt serve`` (which outlives the parent, as a shared server would), a real parent, real spawned runners."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.serve_process import start_serve

REPO = Path(__file__).resolve().parents[2]

PARENT = """
import sys, time
from agentbolt.runner.processes import start_runner_processes
pool = start_runner_processes("examples.room_agent.agent:room_agent", sys.argv[1], n_processes=2, concurrency=1)
time.sleep(3)  # the runners are up and polling the server for rollouts
print(" ".join(str(p.pid) for p in pool.processes), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a child of a dead parent is re-parented to init, which reaps it; a zombie still answers kill(0)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_runners_exit_when_their_parent_is_killed() -> None:
    serve, url = start_serve("--store", "memory://", "--port", "0")
    runner_pids: list[int] = []
    try:
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT, url], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, f"the parent process exited early: {parent.wait()} {parent.stderr.read() if parent.stderr else ''}"
        runner_pids = [int(pid) for pid in line.split()]
        assert len(runner_pids) == 2 and all(_alive(pid) for pid in runner_pids)

        parent.send_signal(signal.SIGKILL)  # no atexit, no daemon-process cleanup
        parent.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(pid) for pid in runner_pids):
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in runner_pids), "runner processes outlived their killed parent"
        assert serve.poll() is None  # the server was never the reason they stopped
    finally:
        for pid in runner_pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        serve.terminate()
        serve.wait(10)
