"""``agentbolt serve`` wires its guards: the token (every route) and ``--max-body-mb`` (413), on a real process."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
from tests.integration.serve_process import start_serve


def test_serve_enforces_token_and_body_limit() -> None:
    # 0.001 MiB = 1048 bytes
    proc, url = start_serve("--store", "memory://", "--port", "0", "--token", "cli-token", "--max-body-mb", "0.001")
    try:
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
    proc, url = start_serve("--store", f"sqlite:///{db}", "--port", "0")
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
