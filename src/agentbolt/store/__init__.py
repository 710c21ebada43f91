"""agentbolt.store: the ``LightningStore`` contract, its backends, and :func:`build_store` to pick one by URL.

Store URLs::

    memory://                      InMemoryLightningStore (this process only, nothing kept)
    sqlite:///relative/path.db     SqliteLightningStore; three slashes then the path (as in SQLAlchemy), so an
    sqlite:////absolute/path.db    absolute path gives four slashes; add ?synchronous=full for power-loss
                                   durability (default normal: survives a process crash)
    path/to/file.db                a plain path ending in .db, .sqlite or .sqlite3 means SQLite too
    postgresql://user:pw@host:5432/dbname
                                   PostgresLightningStore (``postgres://`` too; any libpq URL parameter, e.g.
                                   ``?options=-csearch_path%3Dmyschema``); needs ``pip install 'agentbolt[postgres]'``

A new backend registers a builder for its URL scheme with :func:`register_store_backend`; builders import their
backend lazily, so an unused backend never loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from agentbolt.errors import ConfigError
from agentbolt.store.base import EnqueueRequest, LightningStore, StoreCapabilities
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.search import ResourceRewardStats, RolloutSearch
from agentbolt.store.sqlite import SqliteLightningStore

StoreBuilder = Callable[[str], LightningStore]
"""Builds a store from its full URL (the builder parses what follows the scheme)."""

SQLITE_SUFFIXES: tuple[str, ...] = (".db", ".sqlite", ".sqlite3")
"""File name endings that make a plain path mean a SQLite store."""


def _build_memory(url: str) -> LightningStore:
    if url.lower() != "memory://":
        raise ConfigError(f"store URL {url!r}: the memory store takes no path or options; use 'memory://'")
    return InMemoryLightningStore()


def _build_sqlite(url: str) -> LightningStore:
    parts = urlsplit(url)
    if parts.netloc or not parts.path.startswith("/") or parts.fragment:
        raise ConfigError(
            f"store URL {url!r}: write 'sqlite:///relative/path.db' or 'sqlite:////absolute/path.db' "
            "(three slashes, then the path)"
        )
    path = parts.path[1:]
    if not path:
        raise ConfigError(f"store URL {url!r} has no file path; write e.g. 'sqlite:///agentbolt.db'")
    options = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(options) - {"synchronous"})
    if unknown or any(len(v) != 1 for v in options.values()):
        raise ConfigError(
            f"store URL {url!r}: the only SQLite option is '?synchronous=normal' or '?synchronous=full' "
            f"(got {', '.join(unknown) or 'a repeated option'})"
        )
    synchronous = options.get("synchronous", ["normal"])[0].lower()
    return SqliteLightningStore(path, synchronous=synchronous)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    url = re.sub(r"(://[^:/@?#]*:)[^@/?#]*@", r"\1***@", url)
    return re.sub(r"(password=)[^&\s]*", r"\1***", url)


POSTGRES_INSTALL_HINT = "pip install 'agentbolt[postgres]'"
"""How to get the PostgreSQL driver (psycopg 3 and psycopg_pool)."""


def _build_postgres(url: str) -> LightningStore:
    try:
        from agentbolt.store.postgres import PostgresLightningStore
    except ImportError as exc:
        if exc.name not in ("psycopg", "psycopg_pool"):
            raise
        raise ConfigError(
            f"a PostgreSQL store URL needs the psycopg driver, which cannot be imported; install it with "
            f"{POSTGRES_INSTALL_HINT} ({exc.msg})"
        ) from exc
    return PostgresLightningStore(url)


STORE_BACKENDS: dict[str, StoreBuilder] = {
    "memory": _build_memory,
    "sqlite": _build_sqlite,
    "postgresql": _build_postgres,
    "postgres": _build_postgres,
}
"""URL scheme -> builder. The HTTP client registers ``http``/``https`` here (see :func:`register_store_backend`)."""


def register_store_backend(scheme: str, builder: StoreBuilder) -> None:
    """Make :func:`build_store` accept ``<scheme>://...`` URLs.

    Raises:
        ConfigError: ``scheme`` is already registered.
    """
    scheme = scheme.lower()
    if scheme in STORE_BACKENDS:
        raise ConfigError(f"a store backend for scheme '{scheme}' is already registered")
    STORE_BACKENDS[scheme] = builder


def accepted_store_urls() -> list[str]:
    """Human-readable forms :func:`build_store` accepts (used in error messages and CLI help)."""
    forms = {
        "memory": "memory://",
        "sqlite": "sqlite:///relative/path.db | sqlite:////absolute/path.db",
        "postgresql": "postgresql://user:password@host:port/dbname",
        "postgres": "postgres://user:password@host:port/dbname",
    }
    listed = [forms.get(scheme, f"{scheme}://...") for scheme in STORE_BACKENDS]
    return [*listed, f"a plain file path ending in {' / '.join(SQLITE_SUFFIXES)}"]


def build_store(url: str) -> LightningStore:
    """Create the store backend a URL names (see the module docstring for the forms).

    The store opens lazily: files and connections are touched on its first call. Close it with ``await
    store.close()``.

    Raises:
        ConfigError: the URL matches no registered form; the message lists the accepted ones.
    """
    url = url.strip()
    if "://" in url:
        builder = STORE_BACKENDS.get(urlsplit(url).scheme.lower())
        if builder is not None:
            return builder(url)
    elif url.lower().endswith(SQLITE_SUFFIXES):
        return SqliteLightningStore(url)
    raise ConfigError(f"unknown store URL {url!r}; accepted forms: {'; '.join(accepted_store_urls())}")


def __getattr__(name: str) -> object:
    """``PostgresLightningStore`` loads on first access, so psycopg is imported only by those who use it."""
    if name == "PostgresLightningStore":
        from agentbolt.store.postgres import PostgresLightningStore

        return PostgresLightningStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "STORE_BACKENDS",
    "EnqueueRequest",
    "InMemoryLightningStore",
    "LightningStore",
    "ResourceRewardStats",
    "RolloutSearch",
    "SqliteLightningStore",
    "StoreBuilder",
    "StoreCapabilities",
    "accepted_store_urls",
    "build_store",
    "register_store_backend",
]
