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
    proc, url = start_serve("--store", f"sqlite:///{db}", "--create", "--port", "0")
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


def test_serve_refuses_a_sqlite_file_that_does_not_exist_unless_told_to_create_it(tmp_path: Path) -> None:
    """A typo in --store is an error, not a new empty store; --create starts one; no --store uses the default file
    (created when missing, as documented)."""
    typo = tmp_path / "typo.db"
    cmd = [sys.executable, "-m", "agentbolt.cli.main", "serve", "--port", "0"]
    for store in (f"sqlite:///{typo}", str(typo)):
        done = subprocess.run([*cmd, "--store", store], capture_output=True, text=True, timeout=30)
        text = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2, text
        assert f"no store file at '{typo}'" in text and "pass --create" in text and "Traceback" not in text, text
    assert list(tmp_path.iterdir()) == [], "the refused store left files behind"

    new = tmp_path / "sub" / "new.db"
    proc, url = start_serve("--store", f"sqlite:///{new}", "--create", "--port", "0")
    try:
        assert httpx.post(f"{url}/v1/rollouts", json={"input": {"q": 1}}).status_code in (200, 201)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0 and new.is_file()

    proc, url = start_serve("--store", f"sqlite:///{new}", "--port", "0")  # it exists now: no --create needed
    try:
        assert len(httpx.get(f"{url}/v1/rollouts").json()) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)

    # the default store (no --store): ./agentbolt.db, created in the current folder
    default_dir = tmp_path / "default"
    default_dir.mkdir()
    proc = subprocess.Popen([*cmd], cwd=default_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving on" in line and "agentbolt.db, a new file" in line, line  # said, not done silently
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert (default_dir / "agentbolt.db").is_file()


def test_stopping_serve_mid_stream_records_the_call_before_the_store_closes(tmp_path: Path, smollm2_dir: Path) -> None:
    """SIGTERM while a long streamed call generates: the backend is closed first (the row ends at once), so the
    call's span reaches the SQLite file before the store closes, and the process exits 0."""
    from agentbolt import semconv
    from agentbolt.client.sync_store import SyncHttpLightningStore
    from agentbolt.types import LLM, AttemptStatus

    db = tmp_path / "s.db"
    proc, url = start_serve(
        "--store", f"sqlite:///{db}", "--create", "--port", "0", "--backend", "embedded", "--model", str(smollm2_dir)
    )
    try:
        store = SyncHttpLightningStore(url)
        rollout = store.enqueue_rollout({"q": 1})
        claimed = store.claim_rollout("w")
        assert claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id
        store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, AttemptStatus.RUNNING)
        base = LLM(endpoint=url, model="m").for_attempt(rollout.rollout_id, claimed.attempt.attempt_id).endpoint
        body = {"messages": [{"role": "user", "content": "Tell me a very long story."}], "max_tokens": 3000}
        with httpx.stream("POST", f"{base}/chat/completions", json={**body, "stream": True}, timeout=60) as resp:
            seen = 0
            for line in resp.iter_lines():
                seen += line.startswith("data: ")
                if seen == 3:
                    proc.send_signal(signal.SIGTERM)
                    break
        store.close()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    with sqlite3.connect(db) as conn:
        names = [row[0] for row in conn.execute("SELECT name FROM spans")]
    assert names.count(semconv.SPAN_LLM_CALL) == 1, (names, out)
