"""``agentbolt serve`` wires its guards: the token (every route) and ``--max-body-mb`` (413), on a real process."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx


def test_serve_enforces_token_and_body_limit() -> None:
    cmd = [sys.executable, "-m", "agentbolt.cli.main", "serve", "--store", "memory://", "--port", "0"]
    cmd += ["--token", "cli-token", "--max-body-mb", "0.001"]  # 0.001 MiB = 1048 bytes
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"}
    )
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"agentbolt serve exited early with {proc.wait()}"
            found = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line)
            url = found.group(1) if found else None
        assert url is not None, "agentbolt serve did not report its URL"

        with httpx.Client(base_url=url) as client:
            assert client.get("/v1/health").status_code == 401
            auth = {"Authorization": "Bearer cli-token"}
            assert client.get("/v1/health", headers=auth).status_code == 200
            resp = client.post("/v1/metrics", headers=auth, json={"metrics": [], "pad": "x" * 2000})
            assert resp.status_code == 413 and "1048 bytes" in resp.json()["error"]["message"]
            resp = client.post("/v1/metrics", headers=auth, json={"metrics": []})
            assert resp.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_serve_refuses_a_non_positive_body_limit() -> None:
    cmd = [sys.executable, "-m", "agentbolt.cli.main", "serve", "--store", "memory://", "--max-body-mb", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--max-body-mb must be positive" in done.stdout + done.stderr


def test_sigterm_stops_the_server_and_closes_the_store(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    cmd = [sys.executable, "-m", "agentbolt.cli.main", "serve", "--store", f"sqlite:///{db}", "--port", "0"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"}
    )
    assert proc.stdout is not None
    url = None
    while url is None:
        line = proc.stdout.readline()
        assert line, f"agentbolt serve exited early with {proc.wait()}"
        found = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line)
        url = found.group(1) if found else None
    with httpx.Client(base_url=url) as client:
        assert client.post("/v1/rollouts", json={"input": {"q": 1}}).status_code in (200, 201)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "stopping" in out and "Traceback" not in out
    # A clean close checkpoints the WAL into the file and removes it.
    assert not Path(f"{db}-wal").exists()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM rollouts").fetchone() == (1,)


def test_backend_url_without_a_remote_backend_is_refused() -> None:
    cmd = [sys.executable, "-m", "agentbolt.cli.main", "serve", "--store", "memory://"]
    done = subprocess.run([*cmd, "--backend-url", "http://127.0.0.1:1/v1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "add --backend vllm or --backend openai" in done.stdout + done.stderr
