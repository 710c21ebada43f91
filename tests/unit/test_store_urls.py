"""``build_store``: the URL forms it accepts and the message for the ones it does not."""

from __future__ import annotations

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


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("postgres://h/db", "accepted forms: memory://; sqlite:///"),
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
