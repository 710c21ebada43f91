"""Shared pytest setup."""

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Make the repository root importable, so tests can import the examples (``examples.calc_agent``).
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

# Tests run on 2 cores next to a server thread and runner processes; keep torch from oversubscribing.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted once per test session into a temporary cache (bf16 HF directory)."""
    from agentbolt.inference.model_files import prepare_model

    # Laid out like $AGENTBOLT_CACHE/models, so tests can point AGENTBOLT_CACHE at smollm2_dir.parent.parent.
    return prepare_model("smollm2-135m", cache_dir=tmp_path_factory.mktemp("agentbolt-cache") / "models")


# ---------------------------------------------------------------------------- a real PostgreSQL server

POSTGRES_URL_ENV = "AGENTBOLT_TEST_POSTGRES_URL"
"""Set it to a server URL (``postgresql://user@host:port/db``) to test against that server instead of a throwaway one;
each test gets its own schema there, dropped afterwards."""


class PostgresUnavailable(Exception):
    """No throwaway PostgreSQL server could be started; the message says why and what to do."""


def _postgres_bindir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest /usr/lib/postgresql/<N>/bin."""
    on_path = shutil.which("pg_ctl")
    if on_path and (Path(on_path).resolve().parent / "initdb").exists():
        return Path(on_path).resolve().parent
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    found = [d for d in found if (d / "pg_ctl").exists()]
    return max(found, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0) if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_SERVER_PREFIX = "agentbolt-pg-"
_OWNER_FILE = "owner.pid"


def _pid_alive(pid: int) -> bool:
    import psutil

    return psutil.pid_exists(pid)


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary folder, on 127.0.0.1 and a free port, trust auth, ``fsync=on``.

    PostgreSQL refuses to run as root, so under root every server command runs as the ``postgres`` system user
    (which then owns the folder).
    """

    def __init__(self) -> None:
        bindir = _postgres_bindir()
        if bindir is None:
            raise PostgresUnavailable(
                "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql/*/bin; install them "
                f"with scripts/ensure_postgres.sh (as root), or set {POSTGRES_URL_ENV} to a running server"
            )
        self.bindir = bindir
        self.user: tuple[int, int] | None = None
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "running as root, which PostgreSQL refuses, and there is no 'postgres' system user to run it as; "
                    f"create one (useradd --system postgres) or set {POSTGRES_URL_ENV}"
                ) from None
            self.user = (entry.pw_uid, entry.pw_gid)
        self.reap_stale()
        self.base = Path(tempfile.mkdtemp(prefix=_SERVER_PREFIX))  # short: the socket path must stay < 108 bytes
        (self.base / _OWNER_FILE).write_text(str(os.getpid()))
        if self.user is not None:
            os.chown(self.base, *self.user)
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.url = ""

    def reap_stale(self) -> None:
        """Stop and delete the servers of earlier test sessions that died without stopping them (killed, timed out)."""
        for base in Path(tempfile.gettempdir()).glob(f"{_SERVER_PREFIX}*"):
            try:
                owner = int((base / _OWNER_FILE).read_text())
            except (OSError, ValueError):
                continue
            if _pid_alive(owner):
                continue
            if (base / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(base / "data"), "-m", "immediate", "-w", "stop", timeout_s=60, cwd=base)
            shutil.rmtree(base, ignore_errors=True)

    def _run(self, *args: str, timeout_s: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        extra = {"user": self.user[0], "group": self.user[1], "extra_groups": []} if self.user else {}
        return subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            cwd=cwd or self.base,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            **extra,  # type: ignore[arg-type]
        )

    def _log_tail(self) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-5:])
        except OSError:
            return "(no server log)"

    def start(self) -> str:
        """Create the cluster (``-N``: no fsync while creating it; the server itself runs with ``fsync=on``) and
        start the server; return its URL. Raises PostgresUnavailable with the reason."""
        done = self._run(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "-N"
        )
        if done.returncode != 0:
            raise PostgresUnavailable(f"initdb failed (exit {done.returncode}): {(done.stderr or done.stdout)[-800:]}")
        for _ in range(3):  # a port picked free may be taken before the server binds it
            port = _free_port()
            options = f"-k {self.base} -p {port} -c listen_addresses=127.0.0.1 -c fsync=on"
            done = self._run(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start"
            )
            if done.returncode == 0:
                self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
                return self.url
        reason = done.stderr.strip()[-400:]
        raise PostgresUnavailable(f"pg_ctl start failed (exit {done.returncode}): {reason}; log: {self._log_tail()}")

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its folder."""
        if self.data.exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", timeout_s=60)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """URL of a PostgreSQL server for this test session: ``$AGENTBOLT_TEST_POSTGRES_URL`` when set (it must work),
    else a throwaway server started here and stopped at the end. Skips, saying why, when none can be had."""
    try:
        import psycopg
    except ImportError as exc:
        pytest.skip(f"psycopg is not installed ({exc}); run pip install -e '.[postgres]' (make setup does)")
    url = os.environ.get(POSTGRES_URL_ENV)
    if url:
        try:
            psycopg.connect(url, connect_timeout=10).close()
        except psycopg.Error as exc:
            pytest.fail(f"{POSTGRES_URL_ENV} is set but its server cannot be reached: {exc}")
        yield url
        return
    try:
        server = ThrowawayPostgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")
    try:
        server.start()
    except (PostgresUnavailable, OSError, subprocess.SubprocessError) as exc:
        server.stop()
        pytest.skip(f"PostgreSQL tests skipped: could not start a throwaway server: {exc}")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """The server's URL narrowed to a fresh, empty schema (``search_path``), dropped after the test."""
    import psycopg

    schema = f"agentbolt_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in postgres_server_url else "?"
    yield f"{postgres_server_url}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
