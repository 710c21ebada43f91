"""Start ``agentbolt serve`` as a real child process and read the URL it reports (shared by the process tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time


def start_serve(*args: str, timeout_s: float = 60.0) -> tuple[subprocess.Popen[str], str]:
    """Run ``agentbolt serve <args>`` (stdout and stderr merged, text) and return the process and its base URL.

    The caller owns the process (terminate or signal it). Raises ``AssertionError`` when the server exits before it
    reports ``serving on http://127.0.0.1:<port>`` or does not report it within ``timeout_s``.
    """
    cmd = [sys.executable, "-m", "agentbolt.cli.main", "serve", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"}
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"agentbolt serve exited early with {proc.wait()}"
        found = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    raise AssertionError("agentbolt serve did not report its URL")
