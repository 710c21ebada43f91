"""HTTP plumbing shared by the backends that forward to an OpenAI-compatible server (``vllm``, ``openai``).

- :class:`ChatEndpoint`: POSTs to ``{base_url}/chat/completions`` with httpx (async, timeouts always on), whole
  or streamed, and maps the server's errors to agentbolt's (:func:`raise_for_answer`).
- :class:`ChunkAccumulator`: adds up the ``chat.completion.chunk`` objects of a stream: content, tool-call deltas
  (merged by ``index``), vLLM's ``prompt_token_ids`` / per-chunk ``token_ids``, per-token logprobs, finish reason,
  usage.
- :class:`RemoteStream`: a :class:`~agentbolt.inference.base.GenerationStream` over a streamed answer.

Only choice 0 is read: the gateway sends one request per choice. Error mapping (the remote server's answer ->
what the gateway answers the agent):

- 400/413/422 whose message speaks of the context length (or code ``context_length_exceeded``) ->
  ContextLengthExceededError (400); other 400/422 -> ConfigError (400, the agent's request is at fault);
- 401/403 (API key), 404 (URL or model name) and a server that cannot be reached -> BackendError (503: this
  server's configuration is at fault; the message says which option to check);
- anything else, including a broken stream or an error event inside one -> UpstreamError (502).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from agentbolt.errors import BackendError, ConfigError
from agentbolt.inference.base import (
    ContextLengthExceededError,
    GenerationRequest,
    GenerationResult,
    RequestRefused,
    UpstreamError,
)

logger = logging.getLogger(__name__)

_CONTEXT_OVERFLOW = re.compile(
    r"context[ _]length|context window|maximum model length|max_model_len|too long to fit|prompt is too long",
    re.IGNORECASE,
)
_MESSAGE_CHARS = 1000


def forwarded_fields(request: GenerationRequest) -> dict[str, Any]:
    """The OpenAI Chat Completions fields of ``request`` that a remote backend forwards as they are: ``tools``,
    ``tool_choice``, ``parallel_tool_calls``, ``response_format``, ``stop``, ``logit_bias``, ``seed`` (each only
    when set). The remote server does the constrained decoding, the stop strings and ``parallel_tool_calls``
    itself (so the gateway's inclusive ``</tool_call>`` stop, ``stop_inclusive``, is not sent)."""
    body: dict[str, Any] = {}
    if request.tools:
        body["tools"] = request.tools
        body["parallel_tool_calls"] = request.parallel_tool_calls
        choice = request.tool_choice
        body["tool_choice"] = (
            {"type": "function", "function": {"name": choice.name}} if choice.mode == "function" else choice.mode
        )
    if request.output_format is not None:
        if request.output_format.kind == "json_object":
            body["response_format"] = {"type": "json_object"}
        else:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": request.output_format.name or "answer",
                    "schema": request.output_format.schema or {},
                },
            }
    if request.stop:
        body["stop"] = list(request.stop)
    if request.logit_bias:
        body["logit_bias"] = {str(token_id): bias for token_id, bias in request.logit_bias.items()}
    if request.seed is not None:
        body["seed"] = request.seed
    return body


UNFORWARDED_REASONS: dict[str, str] = {
    "prompt": "serves chat requests only; the legacy Completions route (a raw prompt) needs the embedded backend",
    "chat_template_kwargs": "cannot pass on chat_template_kwargs (a vLLM extension)",
}
"""Why a remote backend refuses a :class:`GenerationRequest` field it lists in ``refused_request_fields``."""


def refuse_unforwarded(request: GenerationRequest, backend: str, refused: frozenset[str]) -> None:
    """Refuse the fields of ``request`` that the ``backend`` cannot pass on (``refused``: names of
    :class:`GenerationRequest` attributes, explained by :data:`UNFORWARDED_REASONS`) when they are set.

    Raises:
        RequestRefused: naming the first such field.
    """
    for name in sorted(refused):
        if getattr(request, name, None) not in (None, {}, (), []):
            raise RequestRefused(f"the {backend} backend {UNFORWARDED_REASONS[name]}", name)


class ChatEndpoint:
    """An OpenAI-compatible chat completions endpoint.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (requests go to ``{base_url}/chat/completions``).
        api_key: sent as ``Authorization: Bearer <api_key>`` when given.
        timeout_s: longest wait for any one read (a whole answer, or the next chunk of a stream); connecting
            times out after 10 s.
        label: how error messages name the server (``the vLLM server``).
        transport: an httpx transport to use instead of the network (tests).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        label: str = "the OpenAI-compatible server",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"the backend URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.label = label
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=10.0), headers=headers, transport=transport
        )

    @property
    def where(self) -> str:
        """``the vLLM server at http://...`` for messages."""
        return f"{self.label} at {self.base_url}"

    async def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` (not streamed); the answer's JSON object.

        Raises:
            ContextLengthExceededError, ConfigError, BackendError, UpstreamError: see the module docstring.
        """
        try:
            response = await self._client.post(f"{self.base_url}/chat/completions", json=payload)
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        raise_for_answer(response.status_code, response.content, self.where)
        try:
            body = response.json()
        except ValueError as exc:
            raise UpstreamError(f"{self.where} answered something that is not JSON: {response.text[:200]!r}") from exc
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
            raise UpstreamError(f"{self.where} answered without choices: {str(body)[:200]}")
        return body

    async def open_stream(self, payload: dict[str, Any]) -> httpx.Response:
        """POST ``payload`` with ``stream: true``; the response, open, once its status says the stream started.
        The caller must ``aclose()`` it.

        Raises:
            as :meth:`complete`, for errors answered before the stream starts.
        """
        request = self._client.build_request("POST", f"{self.base_url}/chat/completions", json=payload)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        if response.status_code != 200:
            try:
                content = await response.aread()
            finally:
                await response.aclose()
            raise_for_answer(response.status_code, content, self.where)
        return response

    async def model_names(self) -> list[str]:
        """The ids listed by ``GET {base_url}/models``.

        Raises:
            BackendError: the server cannot be reached or does not list models.
        """
        try:
            response = await self._client.get(f"{self.base_url}/models")
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        if response.status_code != 200:
            raise BackendError(
                f"{self.where} did not list its models (GET /models answered {response.status_code}); "
                "name the model to use (--model)"
            )
        try:
            return [str(entry["id"]) for entry in response.json()["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendError(f"{self.where} listed its models in an unexpected shape: {exc!r}") from exc

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    def _transport_error(self, exc: httpx.TransportError) -> BackendError:
        if isinstance(exc, httpx.TimeoutException):
            return UpstreamError(f"{self.where} did not answer in time ({type(exc).__name__})")
        return BackendError(f"cannot reach {self.where}: {exc!r}; is it running, and is the URL right?")


def raise_for_answer(status: int, content: bytes, where: str) -> None:
    """Raise the agentbolt error for a non-200 answer (see the module docstring); return on 200."""
    if status == 200:
        return
    message, code = _error_fields(content)
    said = f"{where} answered {status}: {message}"
    if status in (400, 413, 422) and (code == "context_length_exceeded" or _CONTEXT_OVERFLOW.search(message)):
        raise ContextLengthExceededError(f"{said} (shorten the conversation or lower max_tokens)")
    if status in (400, 422):
        raise ConfigError(said)
    if status in (401, 403):
        raise BackendError(f"{said}; check the API key this agentbolt server was given (--api-key)")
    if status == 404:
        raise BackendError(f"{said}; check the backend URL (the API root, usually ending in /v1) and the model name")
    raise UpstreamError(said)


def _error_fields(content: bytes) -> tuple[str, str | None]:
    """(message, code) of an error body: OpenAI's ``{"error": {...}}``, older vLLM's flat ``{"message": ...}``,
    or the raw text."""
    text = content.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except ValueError:
        return (text.strip()[:_MESSAGE_CHARS] or "(empty body)"), None
    return _error_of(body)


def _error_of(body: Any) -> tuple[str, str | None]:
    if isinstance(body, dict):
        error = body.get("error")
        inner: dict[str, Any] = error if isinstance(error, dict) else body
        message = inner.get("message") or inner.get("detail") or json.dumps(body)[:_MESSAGE_CHARS]
        code = inner.get("code")
        return str(message)[:_MESSAGE_CHARS], (code if isinstance(code, str) else None)
    return str(body)[:_MESSAGE_CHARS], None


class ChunkAccumulator:
    """Adds up the chunks of one streamed chat completion (choice 0).

    Attributes:
        prompt_token_ids: vLLM's ``prompt_token_ids`` (first chunk), ``None`` until seen.
        token_ids: vLLM's per-chunk ``token_ids``, concatenated; ``None`` until any chunk carries them.
        logprobs: ``logprobs.content[*].logprob`` of every chunk, concatenated.
        logprobs_seen: whether any chunk carried ``logprobs.content``.
        content: the content deltas, concatenated.
        tool_calls: the tool calls, merged by ``index`` (``id``, ``type``, ``function.name``, ``function.arguments``).
        finish_reason: of choice 0, once sent.
        usage: the usage chunk, once sent.
    """

    def __init__(self) -> None:
        self.prompt_token_ids: list[int] | None = None
        self.token_ids: list[int] | None = None
        self.logprobs: list[float] = []
        self.logprobs_seen = False
        self.content = ""
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0

    def add(self, chunk: dict[str, Any], where: str) -> str:
        """Take one chunk; return its content delta (``""`` when none).

        Raises:
            UpstreamError: the chunk is an error event.
        """
        if "error" in chunk or chunk.get("object") == "error":
            message, _ = _error_of(chunk)
            raise UpstreamError(f"{where} reported an error mid-stream: {message}")
        self.chunks += 1
        if isinstance(chunk.get("prompt_token_ids"), list):
            self.prompt_token_ids = [int(t) for t in chunk["prompt_token_ids"]]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        delta_text = ""
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                delta_text += piece
            for call in delta.get("tool_calls") or []:
                self._merge_tool_call(call)
            if isinstance(choice.get("token_ids"), list):
                self.token_ids = (self.token_ids or []) + [int(t) for t in choice["token_ids"]]
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
                self.logprobs_seen = True
                self.logprobs.extend(float(entry["logprob"]) for entry in logprobs["content"])
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        self.content += delta_text
        return delta_text

    def tool_call_list(self) -> list[dict[str, Any]] | None:
        """The merged tool calls in index order, ``None`` when there were none."""
        if not self.tool_calls:
            return None
        return [self.tool_calls[index] for index in sorted(self.tool_calls)]

    def _merge_tool_call(self, call: dict[str, Any]) -> None:
        index = int(call.get("index", len(self.tool_calls)))
        entry = self.tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if call.get("id"):
            entry["id"] = call["id"]
        if call.get("type"):
            entry["type"] = call["type"]
        function = call.get("function") or {}
        if function.get("name"):
            entry["function"]["name"] = function["name"]
        if function.get("arguments"):
            entry["function"]["arguments"] += function["arguments"]


async def sse_chunks(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, until ``data: [DONE]`` or its end.

    Raises:
        UpstreamError: an event that is not JSON.
    """
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
            continue
        if line.strip() or not data:
            continue  # comments (": ping"), event names, or a blank line with no data
        event = "\n".join(data)
        data = []
        if event == "[DONE]":
            return
        try:
            yield json.loads(event)
        except ValueError as exc:
            raise UpstreamError(f"a stream event is not JSON: {event[:200]!r}") from exc
    if data and "\n".join(data) != "[DONE]":
        try:
            yield json.loads("\n".join(data))
        except ValueError as exc:
            raise UpstreamError(f"a stream event is not JSON: {data[:1]!r}") from exc


class RemoteStream:
    """A :class:`~agentbolt.inference.base.GenerationStream` over a streamed answer of a :class:`ChatEndpoint`.

    Args:
        response: the open streamed response (closed by this object).
        where: the server, for messages.
        build: turns the accumulated chunks into the result; its second argument says whether the stream was
            cancelled before its end.
    """

    def __init__(
        self,
        response: httpx.Response,
        where: str,
        build: Callable[[ChunkAccumulator, bool], GenerationResult],
    ) -> None:
        self._response = response
        self._where = where
        self._build = build
        self._chunks = sse_chunks(response)
        self._first: dict[str, Any] | None = None
        self.accumulated = ChunkAccumulator()
        self._cancelled = False
        self._ended = False

    async def first_chunk(self) -> dict[str, Any] | None:
        """Read (and keep for :meth:`text_deltas`) the first chunk, so a backend can check it before the gateway
        starts answering. ``None`` when the stream is empty."""
        if self._first is None:
            try:
                self._first = await anext(self._chunks)
            except StopAsyncIteration:
                return None
            except httpx.TransportError as exc:
                await self._close()
                raise UpstreamError(f"the stream from {self._where} broke: {exc!r}") from exc
        return self._first

    async def text_deltas(self) -> AsyncIterator[str]:
        """Content deltas as chunks arrive (see :class:`~agentbolt.inference.base.GenerationStream`)."""
        try:
            if self._first is not None:
                first, self._first = self._first, None
                delta = self.accumulated.add(first, self._where)
                if delta:
                    yield delta
            while not self._cancelled:
                try:
                    chunk = await anext(self._chunks)
                except StopAsyncIteration:
                    break
                except httpx.TransportError as exc:
                    if self._cancelled:
                        break
                    raise UpstreamError(f"the stream from {self._where} broke: {exc!r}") from exc
                delta = self.accumulated.add(chunk, self._where)
                if delta:
                    yield delta
        finally:
            await self._close()

    async def result(self) -> GenerationResult:
        """The whole (or, after :meth:`cancel`, partial) result."""
        if not self._ended and not self._cancelled:
            async for _ in self.text_deltas():
                pass
        await self._close()
        return self._build(self.accumulated, self._cancelled and self.accumulated.finish_reason is None)

    def cancel(self) -> None:
        """Stop reading; the connection is closed, which makes vLLM abort the request."""
        self._cancelled = True

    async def _close(self) -> None:
        if not self._ended:
            self._ended = True
            await self._response.aclose()
