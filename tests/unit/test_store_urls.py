"""``build_store``: the URL forms it accepts and the message for the ones it does not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentbolt.errors import ConfigError
from agentbolt.store import (
    STORE_BACKENDS,
    InMemoryLightningStore,
    SqliteLightningStore,
    build_store,
    register_store_backend,
)


def test_accepted_forms() -> None:
    assert isinstance(build_store("memory://"), InMemoryLightningStore)
    relative = build_store("sqlite:///data/run.db")
    assert isinstance(relative, SqliteLightningStore) and relative.path == Path("data/run.db")
    absolute = build_store("sqlite:////tmp/run.db")
    assert isinstance(absolute, SqliteLightningStore) and absolute.path == Path("/tmp/run.db")
    plain = build_store("runs/store.db")
    assert isinstance(plain, SqliteLightningStore) and plain.path == Path("runs/store.db")


def test_postgres_urls_pick_the_postgres_store() -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed; run pip install -e '.[postgres]'")
    from agentbolt.store.postgres import PostgresLightningStore

    for url in ("postgresql://user@db.example:5432/agentbolt", "postgres://user@db.example/agentbolt"):
        assert isinstance(build_store(url), PostgresLightningStore)  # opens lazily: no server needed here


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("mysql://h/db", "accepted forms: memory://; sqlite:///.*postgresql://"),
        ("store", "accepted forms"),
        ("", "accepted forms"),
        ("sqlite://run.db", "sqlite:////absolute/path.db"),
        ("sqlite:///", "sqlite:///agentbolt.db"),
        ("memory://x", "use 'memory://'"),
    ],
)
def test_bad_urls_say_which_forms_work(url: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=hint):
        build_store(url)


def test_register_adds_a_scheme_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agentbolt.store.STORE_BACKENDS", dict(STORE_BACKENDS))
    register_store_backend("fake", lambda url: InMemoryLightningStore())
    assert isinstance(build_store("fake://anything"), InMemoryLightningStore)
    with pytest.raises(ConfigError, match="already registered"):
        register_store_backend("fake", lambda url: InMemoryLightningStore())


def test_a_missing_postgres_driver_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "agentbolt.store.postgres", raising=False)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes ``import psycopg`` fail, as when it is not installed
    with pytest.raises(ConfigError, match=r"pip install 'agentbolt\[postgres\]'"):
        build_store("postgresql://127.0.0.1:5/db")
