"""Token-in/token-out engines: llama.cpp, vLLM and SGLang served by prompt token ids, answering with generated ids.

The gateway's backend renders the chat template itself (:class:`~agentbolt.inference.prompt_encoding.PromptEncoder`,
the same code as the embedded backend) and sends the prompt as token ids, so the recorded ids are the ones the engine
ran, whatever template the engine would have applied (DESIGN.md, "gateway": no re-tokenization drift). The wire
formats (the requests, and where the answers hold the ids and logprobs) are in
:mod:`agentbolt.inference.engine_protocols`.

Weights: after each update the trainer saves the LoRA adapter and calls :meth:`TokenEngineBackend.load_adapter`:
vLLM ``POST /v1/load_lora_adapter`` (then requests name the adapter as ``model``), SGLang ``POST /load_lora_adapter``
(then requests carry ``lora_path``), llama.cpp through :class:`~agentbolt.inference.llamacpp.LlamaServer`, which
converts the adapter to GGUF and restarts ``llama-server`` with it (llama.cpp loads adapter files only at start).

Not forwarded (refused with a 400 naming the field): ``tool_choice`` ``required``/``function`` (the embedded backend
constrains those with a grammar). ``response_format`` goes to each engine's own structured output (llama.cpp
``json_schema``, vLLM ``response_format``, SGLang ``json_schema`` as a string). Streaming: the gateway streams the whole
answer once it is done (these backends have no ``stream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx

from agentbolt.errors import BackendError, ConfigError
from agentbolt.inference.base import (
    ContextLengthExceededError,
    FinishedStream,
    GenerationRequest,
    GenerationResult,
    GenerationStream,
    ThroughputStats,
    UpstreamError,
)
from agentbolt.inference.engine_protocols import (
    ENGINE_KINDS,
    EngineAnswer,
    EngineProtocol,
    LlamaCppProtocol,
    SGLangGenerateProtocol,
    VLLMCompletionsProtocol,
)
from agentbolt.inference.prompt_encoding import PromptEncoder, check_sampling, entries_within
from agentbolt.inference.remote import sse_chunks
from agentbolt.inference.stop_text import cut_at_stop

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 10.0
"""Longest wait (seconds) for an engine's answer to ``GET /health``."""


AdapterLoader = Callable[[Path, str], Awaitable[str | None]]
"""``(adapter folder, version) -> adapter name`` requests use from now on (``None``: none needed)."""


class TokenEngineBackend:
    """An :class:`~agentbolt.inference.base.InferenceBackend` over a token-in/token-out engine.

    Build it with :meth:`connect`. Concurrent calls go to the engine at once (it batches them itself).

    Attributes:
        model_name: the served name (the gateway maps any requested name to it).
        model_version: stamped on every result; ``base`` until :meth:`set_model_version` / :meth:`load_adapter`.
        encoder: the chat template and tokenizer side (:class:`PromptEncoder`).
        max_context_tokens: prompt + ``max_tokens`` must fit (the engine's context per request).
        stats: generated tokens and the seconds with at least one request in flight.
        adapter: the LoRA adapter name requests use (``None``: the base weights).
    """

    refused_request_values: Mapping[str, str] = MappingProxyType({"tool_choice": "`required` / a named function"})
    """Fields whose other values are served: field -> the values refused with a 400."""

    refused_request_fields: frozenset[str] = frozenset()
    """:class:`GenerationRequest` fields refused whatever their value (none; some values are, see
    :attr:`refused_request_values`; docs/gateway_conformance.md)."""

    def __init__(
        self,
        protocol: EngineProtocol,
        encoder: PromptEncoder,
        *,
        base_url: str,
        model_name: str,
        max_context_tokens: int,
        timeout_s: float = 600.0,
        api_key: str | None = None,
        adapter_loader: AdapterLoader | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.protocol = protocol
        self.encoder = encoder
        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self.model_version = "base"
        self.max_context_tokens = max_context_tokens
        self.stats = ThroughputStats()
        self.adapter: str | None = None
        self.where = f"the {protocol.kind} engine at {self.base_url}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=10.0), headers=headers, transport=transport
        )
        self._adapter_loader = adapter_loader
        self._on_close = on_close
        self._in_flight = 0
        self._busy_since = 0.0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._pauses = 0
        self._closed = False

    @classmethod
    async def connect(
        cls,
        kind: str,
        base_url: str,
        *,
        model_dir: Path | str,
        model_name: str,
        max_context_tokens: int,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        adapter_loader: AdapterLoader | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> TokenEngineBackend:
        """Connect to the engine ``kind`` at ``base_url`` (its server root, e.g. ``http://127.0.0.1:8080``) serving
        the weights of ``model_dir`` (whose tokenizer and chat template render the prompts here).

        Args:
            model_name: the name requests send as ``model`` (vLLM: the served model name) and the gateway serves.
            max_context_tokens: the engine's context per request (llama.cpp: ``-c`` / ``-np``; vLLM:
                ``--max-model-len``).
            adapter_loader: how :meth:`load_adapter` publishes an adapter; default the engine's own route (vLLM,
                SGLang); llama.cpp needs one (:class:`~agentbolt.inference.llamacpp.LlamaServer`).

        Raises:
            ConfigError: unknown ``kind``.
            BackendError: the tokenizer cannot be loaded, or the engine does not answer its health check.
        """
        protocol: EngineProtocol
        if kind == "llamacpp":
            protocol = LlamaCppProtocol()
        elif kind == "vllm":
            protocol = VLLMCompletionsProtocol(model_name)
        elif kind == "sglang":
            protocol = SGLangGenerateProtocol()
        else:
            raise ConfigError(f"unknown token engine {kind!r}; known engines: {', '.join(ENGINE_KINDS)}")
        encoder = await asyncio.to_thread(PromptEncoder.from_model_dir, model_dir)
        backend = cls(
            protocol,
            encoder,
            base_url=base_url,
            model_name=model_name,
            max_context_tokens=max_context_tokens,
            timeout_s=timeout_s,
            api_key=api_key,
            adapter_loader=adapter_loader,
            on_close=on_close,
            transport=transport,
        )
        try:
            await backend.check_health()
            if kind == "vllm":
                await backend.check_served_model()
        except BaseException:
            await backend._client.aclose()
            raise
        return backend

    async def check_served_model(self) -> None:
        """vLLM: ``GET /v1/models`` lists :attr:`model_name` (requests name it as ``model``).

        Raises:
            ConfigError: it does not (the message lists what the server serves, for ``inference.served_model``).
            BackendError: the server cannot be reached.
        """
        try:
            response = await self._client.get("/v1/models")
        except httpx.HTTPError as exc:
            raise BackendError(f"{self.where} cannot be reached ({exc!r})") from exc
        if response.status_code != 200:
            return  # not a listing this client understands: the first request will say what is wrong
        served: list[str] = []
        with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
            served = [str(entry["id"]) for entry in response.json().get("data", [])]
        if served and self.model_name not in served:
            raise ConfigError(
                f"{self.where} does not serve {self.model_name!r}; it serves {', '.join(served)}: set "
                "inference.served_model to the base model's name"
            )

    async def check_health(self, timeout_s: float | None = None) -> None:
        """``GET /health`` (all three engines have it), waiting at most ``timeout_s`` seconds for the answer
        (default :data:`HEALTH_TIMEOUT_S`), so a hung engine is named at once rather than after the generation
        requests' much longer timeout.

        Raises:
            BackendError: the engine cannot be reached, did not answer in time, or is not ready.
        """
        timeout_s = HEALTH_TIMEOUT_S if timeout_s is None else timeout_s
        try:
            response = await self._client.get("/health", timeout=timeout_s)
        except httpx.TimeoutException as exc:
            raise BackendError(
                f"{self.where} accepted the connection but did not answer GET /health within {timeout_s:g} s: is "
                "the engine hung or still loading? Check its log, or restart it"
            ) from exc
        except httpx.HTTPError as exc:
            raise BackendError(f"{self.where} cannot be reached ({exc!r}); is it running?") from exc
        if response.status_code == 404:
            raise BackendError(
                f"{self.where} answered 404 to GET /health: inference.url must be the {self.protocol.kind} "
                f"server's root (http://host:port), and the server a {self.protocol.kind} server"
            )
        if response.status_code != 200:
            raise BackendError(f"{self.where} is not ready: GET /health answered {response.status_code}")

    # ------------------------------------------------------------------ training hooks

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[TokenEngineBackend]:
        """Wait for the requests in flight to end; new ones wait until the block exits (the weights change
        meanwhile). Re-entrant."""
        self._pauses += 1
        self._open.clear()
        try:
            await self._idle.wait()
            yield self
        finally:
            self._pauses -= 1
            if self._pauses == 0:
                self._open.set()

    def set_model_version(self, version: str) -> None:
        """Stamp results from now on with ``version``."""
        self.model_version = version

    async def load_adapter(self, folder: Path, version: str) -> None:
        """Serve the LoRA adapter saved in ``folder`` (peft's files) from now on, as weights version ``version``.
        Call it inside :meth:`paused`.

        Raises:
            BackendError: the engine refused or failed to load it (the message gives its answer).
        """
        if self._adapter_loader is not None:
            name = await self._adapter_loader(folder, version)
        elif self.protocol.kind == "vllm":
            name = await self._load_route("/v1/load_lora_adapter", "/v1/unload_lora_adapter", folder, version)
        elif self.protocol.kind == "sglang":
            name = await self._load_route("/load_lora_adapter", "/unload_lora_adapter", folder, version)
        else:
            raise BackendError(
                "the llamacpp engine loads adapters only at start: serve it through agentbolt (inference.url "
                "unset), which restarts llama-server with each new adapter"
            )
        self.adapter = name
        self.model_version = version

    async def _load_route(self, load: str, unload: str, folder: Path, version: str) -> str:
        name = f"agentbolt-{version}"
        body = {"lora_name": name, "lora_path": str(Path(folder).resolve())}
        response = await self._post(load, body)
        refused = response.status_code >= 400
        with contextlib.suppress(ValueError, AttributeError):
            refused = refused or response.json().get("success") is False  # SGLang: JSON with success
        if refused:
            hint = (
                " (start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora --max-lora-rank R)"
                if self.protocol.kind == "vllm"
                else " (start SGLang with --enable-lora and --max-lora-rank R)"
            )
            raise BackendError(
                f"{self.where} refused to load the adapter {folder}: POST {load} answered "
                f"{response.status_code}: {response.text[:500]}{hint}; the path must be readable by the engine"
            )
        previous = self.adapter
        if previous is not None:
            answer = await self._post(unload, {"lora_name": previous})
            if answer.status_code >= 400:
                logger.warning("%s did not unload adapter %s: %s", self.where, previous, answer.text[:200])
        return name

    async def _post(self, path: str, body: dict[str, Any], *, stream: bool = False) -> httpx.Response:
        """POST ``body``; with ``stream`` the answer's body is left to read (the caller closes the response)."""
        try:
            return await self._client.send(self._client.build_request("POST", path, json=body), stream=stream)
        except httpx.HTTPError as exc:
            raise BackendError(f"{self.where}: POST {path} failed: {exc!r}") from exc

    # ------------------------------------------------------------------ the Protocol

    def encode_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The exact prompt ids for ``messages`` (:meth:`PromptEncoder.encode_prompt`).

        Raises:
            ConfigError: the template rejects the messages.
        """
        return self.encoder.encode_prompt(messages, tools, chat_template_kwargs)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """One completion from the engine, with the prompt ids sent and the ids and logprobs it returned.

        Raises:
            ContextLengthExceededError: prompt + ``max_tokens`` exceeds :attr:`max_context_tokens`.
            ConfigError / RequestRefused: bad values, or a field this engine does not serve.
            BackendError: the engine cannot be reached or the backend is closed.
            UpstreamError: the engine answered with an error, or without ids/logprobs.
        """
        ids = await self._admit(request)
        try:
            body = self.protocol.payload(ids, request, self.adapter)
            version = self.model_version
            response = await self._post(self.protocol.path, body)
            answer_body = self._json(response)
            answer = self.protocol.parse(answer_body, self.where)
        finally:
            self._leave()
        return self._finish(request, ids, answer, version)

    async def stream(self, request: GenerationRequest) -> GenerationStream:
        """Start one completion and stream its text as the engine sends it: llama.cpp streams (``stream: true``,
        one chunk per token with its id and probabilities); vLLM and SGLang answer whole (the text arrives at the
        end, :class:`~agentbolt.inference.base.FinishedStream`). Returns once the engine accepted the request.

        Raises:
            What :meth:`generate` raises, before anything is generated.
        """
        if self.protocol.kind != "llamacpp":
            return FinishedStream(await self.generate(request))
        ids = await self._admit(request)
        try:
            body = {**self.protocol.payload(ids, request, self.adapter), "stream": True}
            version = self.model_version
            response = await self._post(self.protocol.path, body, stream=True)
            if response.status_code >= 400:
                await response.aread()
                await response.aclose()
                self._json(response)  # raises the error it names
        except BaseException:
            self._leave()
            raise
        return _LlamaCppStream(self, request, ids, response, version)

    async def _admit(self, request: GenerationRequest) -> list[int]:
        """Check the request, wait while the engine is paused and count it in flight; return the prompt ids. The
        caller must call :meth:`_leave` once the engine has answered."""
        if self._closed:
            raise BackendError(f"the {self.protocol.kind} backend is closed")
        check_sampling(request)
        ids = self.encoder.request_ids(request)
        if len(ids) + request.max_tokens > self.max_context_tokens:
            raise ContextLengthExceededError(
                f"the prompt has {len(ids)} tokens and max_tokens is {request.max_tokens}: together more than the "
                f"engine's context of {self.max_context_tokens} tokens per request; shorten the conversation, lower "
                "max_tokens, or raise inference.context_per_request in the job's config"
            )
        while not self._open.is_set():  # a pause that began while this one waited holds it again
            await self._open.wait()
        self._enter()
        return ids

    def _finish(
        self,
        request: GenerationRequest,
        ids: list[int],
        answer: EngineAnswer,
        version: str,
        streamed_text: str | None = None,
    ) -> GenerationResult:
        if len(answer.logprobs) != len(answer.ids):
            raise UpstreamError(
                f"{self.where} returned {len(answer.logprobs)} logprobs for {len(answer.ids)} token ids; they must "
                "match one to one"
            )
        self.stats.requests += 1
        self.stats.generated_tokens += len(answer.ids)
        return self._result(request, ids, answer, version, streamed_text)

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        text = response.text[:1000]
        if response.status_code >= 400:
            lowered = text.lower()
            if response.status_code in (400, 413, 422) and ("context" in lowered or "too long" in lowered):
                raise ContextLengthExceededError(f"{self.where} refused the prompt as too long: {text}")
            if response.status_code in (400, 422):
                raise ConfigError(f"{self.where} refused the request ({response.status_code}): {text}")
            raise UpstreamError(f"{self.where} answered {response.status_code}: {text}")
        try:
            body = response.json()
        except ValueError as exc:
            raise UpstreamError(f"{self.where} answered with something that is not JSON: {text!r}") from exc
        if not isinstance(body, dict):
            raise UpstreamError(f"{self.where} answered with JSON that is not an object: {text!r}")
        return body

    def _result(
        self,
        request: GenerationRequest,
        prompt_ids: list[int],
        answer: EngineAnswer,
        version: str,
        streamed_text: str | None = None,
    ) -> GenerationResult:
        # Ids missing (an unscored stream): the text is what the engine sent, which the client already has.
        text = self.encoder.decode(answer.ids) if answer.unscored is None or streamed_text is None else streamed_text
        stop_sequence = None
        if answer.stop_word is not None:  # the ids end before the stop string
            stop_sequence = answer.stop_word
            if answer.stop_word in request.stop_inclusive:
                text += answer.stop_word
        elif request.stop or request.stop_inclusive:
            text, stop_sequence = cut_at_stop(text, request.stop, request.stop_inclusive)
        token_logprobs = None
        if request.logprobs and answer.unscored is None:
            token_logprobs = self.encoder.token_logprobs(answer.ids, answer.logprobs)
            for entry, alternatives in zip(token_logprobs, answer.top, strict=False):
                entry["top_logprobs"] = [
                    self.encoder.token_entry(alt, value)
                    if isinstance(alt, int)
                    else {"token": alt, "logprob": value, "bytes": list(alt.encode())}
                    for alt, value in alternatives[: request.top_logprobs]
                ]
            if stop_sequence is not None:
                token_logprobs = entries_within(token_logprobs, len(text))
        extra: dict[str, Any] = {"engine": self.protocol.kind, "cached_prompt_tokens": answer.cached_prompt_tokens}
        if answer.unscored is not None:  # served whole, recorded without logprobs, never trained
            extra["not_trainable_reason"] = answer.unscored
            return GenerationResult(
                prompt_token_ids=prompt_ids,
                response_token_ids=[],
                response_logprobs=[],
                text=text,
                finish_reason=answer.finish_reason,
                model_version=version,
                extra=extra,
                trainable=False,
                completion_tokens=max(len(answer.ids), answer.n_generated or 0),
                stop_sequence=stop_sequence,
            )
        if answer.finish_reason != "abort" and request.prompt is None:
            self.encoder.remember(prompt_ids, answer.ids)
        return GenerationResult(
            prompt_token_ids=prompt_ids,
            response_token_ids=answer.ids,
            response_logprobs=answer.logprobs,
            text=text,
            finish_reason=answer.finish_reason,
            model_version=version,
            extra=extra,
            stop_sequence=stop_sequence,
            token_logprobs=token_logprobs,
        )

    def _enter(self) -> None:
        if self._in_flight == 0:
            self._busy_since = time.monotonic()
            self._idle.clear()
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self.stats.generation_s += time.monotonic() - self._busy_since
            self._idle.set()

    async def close(self) -> None:
        """Close the connection pool, and stop the engine when this backend started it."""
        if self._closed:
            return
        self._closed = True
        await self._client.aclose()
        if self._on_close is not None:
            await self._on_close()


class _LlamaCppStream:
    """A :class:`~agentbolt.inference.base.GenerationStream` over llama.cpp's streamed ``/completion``: the server
    sends one server-sent event per generated token (``content``: the text it releases, held back while it could be
    the start of a stop string; ``tokens``: the id; ``completion_probabilities``), then a last one with ``stop: true``
    (``stop_type``, ``timings``). The ids and probabilities of every event make the same answer a whole request
    gets, read by :meth:`LlamaCppProtocol.parse`; every streamed id has its probability, the stop string's too, so
    they are all recorded (the text still ends before the stop string)."""

    def __init__(
        self,
        backend: TokenEngineBackend,
        request: GenerationRequest,
        prompt_ids: list[int],
        response: httpx.Response,
        version: str,
    ) -> None:
        self._backend = backend
        self._request = request
        self._prompt_ids = prompt_ids
        self._response = response
        self._version = version
        self._tokens: list[Any] = []
        self._probs: list[Any] = []
        self._final: dict[str, Any] | None = None
        self._content: list[str] = []
        self._deltas: asyncio.Queue[str | None] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        where = self._backend.where
        try:
            async for chunk in sse_chunks(self._response):
                if not isinstance(chunk, dict):
                    raise UpstreamError(f"{where} streamed an event that is not a JSON object: {str(chunk)[:200]!r}")
                if "error" in chunk:
                    raise UpstreamError(f"{where} failed while streaming: {json.dumps(chunk['error'])[:500]}")
                self._tokens.extend(chunk.get("tokens") or [])
                self._probs.extend(chunk.get("completion_probabilities") or [])
                if chunk.get("content"):
                    self._content.append(str(chunk["content"]))
                    self._deltas.put_nowait(self._content[-1])
                if chunk.get("stop"):
                    self._final = chunk
                    break
            if self._final is None:
                raise UpstreamError(f"{where} ended the stream before its last event (stop: true)")
        except httpx.HTTPError as exc:
            raise BackendError(f"{where}: the stream broke off: {exc!r}") from exc
        finally:
            self._deltas.put_nowait(None)
            await self._response.aclose()
            self._backend._leave()

    async def text_deltas(self) -> AsyncIterator[str]:
        """The text as the server releases it.

        Raises:
            BackendError / UpstreamError: the stream broke off, or the server reported an error.
        """
        while (delta := await self._deltas.get()) is not None:
            yield delta
        await asyncio.wait({self._task})  # the reader has put its end marker; let it finish closing
        if not self._task.cancelled() and self._task.exception() is not None:
            raise self._task.exception()  # type: ignore[misc]

    async def result(self) -> GenerationResult:
        """The whole result (after :meth:`cancel`: what was streamed until then, ``finish_reason`` ``abort``).

        Raises:
            BackendError / UpstreamError: as :meth:`text_deltas`; a mismatch of ids and probabilities.
        """
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({self._task})
        if not self._task.cancelled() and self._task.exception() is not None:
            raise self._task.exception()  # type: ignore[misc]
        protocol = self._backend.protocol
        if self._final is None:  # cancelled: the ids that came with their probabilities
            n = min(len(self._tokens), len(self._probs))
            body = {"tokens": self._tokens[:n], "completion_probabilities": self._probs[:n]}
            answer = protocol.parse(body, self._backend.where)
            answer.finish_reason = "abort"
        else:
            body = {**self._final, "tokens": self._tokens, "completion_probabilities": self._probs, "stream": True}
            answer = protocol.parse(body, self._backend.where)
        streamed = "".join(self._content)
        return self._backend._finish(self._request, self._prompt_ids, answer, self._version, streamed)

    def cancel(self) -> None:
        """Stop reading and close the connection (llama.cpp then stops generating for it)."""
        if not self._task.done():
            self._task.cancel()
