"""hold_out_dir: one job at a time in an output directory, released when the holder dies (even by SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbolt.errors import ConfigError
from agentbolt.trainer.out_lock import OWNER_NAME, hold_out_dir


def test_a_second_job_is_refused_with_the_holders_pid_and_command(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with hold_out_dir(out, command="agentbolt train cfg.yaml"):
        assert out.is_dir() and (out / OWNER_NAME).is_file()
        with pytest.raises(ConfigError) as refused, hold_out_dir(out):
            pass
        message = str(refused.value)
        assert f"pid {os.getpid()}: agentbolt train cfg.yaml" in message and "choose another --out" in message
    assert not (out / OWNER_NAME).exists()
    with hold_out_dir(out):  # free again once the first job ended
        pass


def test_a_file_or_a_missing_folder_to_resume_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file"), hold_out_dir(tmp_path / "f"):
        pass
    with pytest.raises(ConfigError, match="nothing to resume"), hold_out_dir(tmp_path / "nope", create=False):
        pass
    assert not (tmp_path / "nope").exists()


def test_a_sigkilled_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from agentbolt.trainer.out_lock import hold_out_dir\n"
            "with hold_out_dir(Path(sys.argv[1]), command='holder'):\n"
            "    print('held', flush=True); time.sleep(60)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"pid {holder.pid}: holder"), hold_out_dir(out):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    deadline = time.monotonic() + 10
    while True:  # the kernel drops the lock with the process
        try:
            with hold_out_dir(out, command="next"):
                break
        except ConfigError:
            assert time.monotonic() < deadline, "the killed holder's lock was never released"
            time.sleep(0.1)
