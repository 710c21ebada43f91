"""The optimizer LLM: any OpenAI-compatible chat endpoint, with every call cached on disk by a content hash.

A call is keyed by ``sha256`` of the canonical JSON of ``{"model", "messages", "sampling", "sample_index"}``
(:func:`call_key`). ``sample_index`` tells apart deliberate repeats of one request (the ``k``-th critique of the same
traces); with it, a rerun of the same optimization replays every optimizer answer from the cache, and only the
rollouts are run again. The cache is one SQLite file (``<cache_dir>/optimizer_calls.sqlite``, table ``calls``); a
repeated call is a hit and is counted (:attr:`OptimizerLLM.cache_hits`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ConfigDict, Field

CreateCompletion = Callable[..., Awaitable[ChatCompletion]]
"""``AsyncOpenAI(...).chat.completions.create``, or a stand-in with the same call shape and return type."""

SamplingValue = float | int | str
CACHE_FILE_NAME = "optimizer_calls.sqlite"


class OptimizerLLMConfig(BaseModel):
    """Where the optimizer LLM is and how it is sampled.

    Attributes:
        model: model name sent in requests (``None``: the served model's name, when ``agentbolt train`` wires its
            embedded model as the optimizer).
        base_url: OpenAI-compatible base URL ending in ``/v1``. ``None``: under ``agentbolt train``, the job's own
            embedded model (its server's unrecorded ``/v1/chat/completions``); elsewhere the OpenAI client's default
            (``OPENAI_BASE_URL``, else api.openai.com).
        api_key_env: environment variable holding the API key (a placeholder key is sent when it is unset, which
            local endpoints accept).
        temperature: sampling temperature; > 0 so that the ``branch_factor`` edits differ.
        max_tokens: reply length cap in tokens.
        timeout_s: per-request timeout in seconds.
        max_retries: retries of a failed or timed-out request (the ``openai`` client's own retry). A local model
            keeps generating after a client gives up, so ``agentbolt train`` uses 0 for its embedded optimizer.
        cache_dir: folder of the call cache; ``None`` disables caching.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = Field(default=0.7, ge=0.0)
    max_tokens: int = Field(default=1024, gt=0)
    timeout_s: float = Field(default=300.0, gt=0.0)
    max_retries: int = Field(default=2, ge=0)
    cache_dir: str | None = ".agentbolt/optimizer_cache"


def call_key(
    model: str, messages: list[dict[str, str]], sampling: Mapping[str, SamplingValue], sample_index: int = 0
) -> str:
    """Hex sha256 of the canonical JSON (sorted keys, no spaces) of the request's content; see the module docstring."""
    document = {"model": model, "messages": messages, "sampling": dict(sampling), "sample_index": sample_index}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class CallCache:
    """Optimizer replies by call key, in one SQLite file. Each operation opens its own connection in a worker
    thread, so the event loop never waits on the disk and the cache can be shared by processes (SQLite locking)."""

    def __init__(self, cache_dir: str | Path) -> None:
        self.path = Path(cache_dir) / CACHE_FILE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as connection:
            connection.execute(
                "CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, model TEXT NOT NULL, reply TEXT NOT NULL, "
                "create_time REAL NOT NULL)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30.0)

    def _get(self, key: str) -> str | None:
        with self._connect() as connection:
            row = connection.execute("SELECT reply FROM calls WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _put(self, key: str, model: str, reply: str) -> None:
        with self._connect() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO calls (key, model, reply, create_time) VALUES (?, ?, ?, ?)",
                (key, model, reply, time.time()),
            )

    async def get(self, key: str) -> str | None:
        """The cached reply for ``key``, or ``None``."""
        return await asyncio.to_thread(self._get, key)

    async def put(self, key: str, model: str, reply: str) -> None:
        """Store ``reply`` under ``key`` (replacing an older one)."""
        await asyncio.to_thread(self._put, key, model, reply)


class OptimizerLLM:
    """Sends one-message chat requests to the optimizer and returns the reply text.

    Attributes:
        calls: requests asked of this object, cache hits included.
        cache_hits: of those, answered from the cache without a network call.
    """

    def __init__(
        self,
        create: CreateCompletion,
        *,
        model: str,
        sampling: Mapping[str, SamplingValue] | None = None,
        cache: CallCache | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.create = create
        self._close = close
        self.model = model
        self.sampling: dict[str, SamplingValue] = dict(sampling or {})
        self.cache = cache
        self.calls = 0
        self.cache_hits = 0

    async def aclose(self) -> None:
        """Close the HTTP client this object was built with (:func:`build_optimizer_llm`); idempotent."""
        close, self._close = self._close, None
        if close is not None:
            await close()

    async def complete(self, prompt: str, *, sample_index: int = 0) -> str:
        """The optimizer's reply (``choices[0].message.content``; ``""`` when it has none) to ``prompt`` sent as one
        user message. ``sample_index`` selects a distinct cached sample of the same request (see module docstring).

        Raises:
            Whatever the client raises (``openai.APIError`` and subclasses); nothing is cached then.
        """
        messages = [{"role": "user", "content": prompt}]
        key = call_key(self.model, messages, self.sampling, sample_index)
        self.calls += 1
        if self.cache is not None:
            cached = await self.cache.get(key)
            if cached is not None:
                self.cache_hits += 1
                return cached
        response = await self.create(model=self.model, messages=messages, **self.sampling)
        reply = (response.choices[0].message.content or "") if response.choices else ""
        if self.cache is not None:
            await self.cache.put(key, self.model, reply)
        return reply


def build_optimizer_llm(config: OptimizerLLMConfig) -> OptimizerLLM:
    """An :class:`OptimizerLLM` over ``openai.AsyncOpenAI`` built from ``config`` (no request is made here).

    Raises:
        ConfigError: ``config.model`` is not set.
    """
    import os

    from agentbolt.errors import ConfigError

    if not config.model:
        raise ConfigError("optimizer.model is not set: name the optimizer model (e.g. optimizer.model=gpt-4.1-mini)")

    from openai import AsyncOpenAI

    client = AsyncOpenAI(
        base_url=config.base_url,
        api_key=os.environ.get(config.api_key_env, "agentbolt"),
        timeout=config.timeout_s,
        max_retries=config.max_retries,
    )
    cache = CallCache(config.cache_dir) if config.cache_dir is not None else None
    return OptimizerLLM(
        client.chat.completions.create,
        model=config.model,
        sampling={"temperature": config.temperature, "max_tokens": config.max_tokens},
        cache=cache,
        close=client.close,
    )
