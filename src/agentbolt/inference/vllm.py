"""The ``vllm`` backend: forwards to any vLLM OpenAI-compatible server (``vllm serve MODEL``), ids from the engine.

Every request asks vLLM for the ids it used, so nothing is re-tokenized (DESIGN.md, "gateway"):
``return_token_ids: true`` (vLLM >= 0.10.2) returns ``prompt_token_ids`` at the top of the answer (first chunk of
a stream) and ``token_ids`` per choice (per chunk: the ids of that delta), and ``logprobs: true, top_logprobs: 0``
returns one logprob per generated id in ``choices[0].logprobs.content[*].logprob``. A server that returns no ids
(older vLLM, or not vLLM at all) is refused with an error that says so, before anything is answered.

Sampling is made explicit like the embedded backend's (``top_k: -1``, ``repetition_penalty: 1``, no
frequency/presence penalties), so the model's ``generation_config.json`` cannot change the distribution.
Which logprobs vLLM reports depends on its ``--logprobs-mode``: the default ``raw_logprobs`` is the model's
distribution before temperature; start vLLM with ``--logprobs-mode processed_logprobs`` to get logprobs of the
tempered distribution the embedded backend records (``gen_ai.request.temperature`` is recorded either way).

Tool calls: with vLLM's tool parser on (``--enable-auto-tool-choice --tool-call-parser hermes``) vLLM returns
``tool_calls`` itself and they are passed through; without it the text holds the ``<tool_call>`` tags and the
gateway parses them. Either way the recorded ids are the engine's.

Weight updates: :class:`VLLMWeightPushClient` drives vLLM's weight-transfer HTTP routes and :func:`nccl_bucket_sender`
broadcasts the tensors (GPU only, never run in this repository); call :meth:`VLLMBackend.set_model_version`
afterwards so that spans carry the new version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import httpx

from agentbolt.errors import BackendError, ConfigError
from agentbolt.inference.base import FinishReason, GenerationRequest, GenerationResult, UpstreamError
from agentbolt.inference.remote import (
    ChatEndpoint,
    ChunkAccumulator,
    RemoteStream,
    forwarded_fields,
    refuse_unforwarded,
)

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
    "abort": "abort",
}


class VLLMBackend:
    """An :class:`~agentbolt.inference.base.InferenceBackend` (streaming too) that forwards to a vLLM server.

    Build it with :meth:`connect` (checks the server and finds the model it serves).

    Attributes:
        model_name: the model the vLLM server serves (sent in every request; the gateway maps any name to it).
        model_version: stamped on every result; ``base`` until :meth:`set_model_version`.
        endpoint: the HTTP endpoint.
    """

    refused_request_fields: frozenset[str] = frozenset({"prompt"})
    """:class:`~agentbolt.inference.base.GenerationRequest` fields this backend cannot pass on (refused with a 400
    naming them; docs/gateway_conformance.md)."""

    def __init__(self, endpoint: ChatEndpoint, model_name: str) -> None:
        self.endpoint = endpoint
        self.model_name = model_name
        self.model_version = "base"

    @classmethod
    async def connect(
        cls,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> VLLMBackend:
        """Connect to the vLLM server at ``base_url`` (the API root, e.g. ``http://127.0.0.1:8000/v1``).

        Args:
            model: the served model name to use; default the first one ``GET /models`` lists.
            api_key: vLLM's ``--api-key``, if it was started with one.
            timeout_s: longest wait for an answer, or for the next chunk of a stream.
            transport: an httpx transport instead of the network (tests).

        Raises:
            ConfigError: bad URL, or ``model`` is not served there.
            BackendError: the server cannot be reached or lists no model.
        """
        endpoint = ChatEndpoint(
            base_url, api_key=api_key, timeout_s=timeout_s, label="the vLLM server", transport=transport
        )
        try:
            served = await endpoint.model_names()
            if model is None:
                if not served:
                    raise ConfigError(f"{endpoint.where} serves no model")
                model = served[0]
            elif model not in served:
                raise ConfigError(f"{endpoint.where} does not serve {model!r}; it serves: {', '.join(served)}")
        except BaseException:
            await endpoint.close()
            raise
        return cls(endpoint, model)

    def set_model_version(self, version: str) -> None:
        """Stamp results from now on with ``version`` (after the trainer updated the server's weights)."""
        self.model_version = version

    def payload(self, request: GenerationRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body sent to vLLM for ``request``: the request's own fields (``stop``, ``tool_choice``,
        ``parallel_tool_calls``, ``response_format`` (vLLM's guided decoding), ``top_logprobs``, penalties,
        ``logit_bias``, ``seed``, ``chat_template_kwargs``) and the fields that make vLLM return exact ids.

        Raises:
            RequestRefused: a raw ``prompt`` (legacy Completions), which this backend does not forward.
        """
        refuse_unforwarded(request, "vllm", self.refused_request_fields)
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": -1,
            "repetition_penalty": 1.0,
            "frequency_penalty": request.frequency_penalty,
            "presence_penalty": request.presence_penalty,
            "logprobs": True,
            "top_logprobs": request.top_logprobs if request.logprobs else 0,
            "return_token_ids": True,
            **forwarded_fields(request),
        }
        if request.chat_template_kwargs:
            body["chat_template_kwargs"] = request.chat_template_kwargs
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """One completion from vLLM, with the engine's ids and logprobs.

        Raises:
            ContextLengthExceededError: vLLM says the prompt + ``max_tokens`` exceed its ``max_model_len``.
            ConfigError: vLLM refused the request values (400).
            BackendError: vLLM cannot be reached, or refuses the key, URL or model.
            UpstreamError: vLLM failed (5xx), or returned no token ids / logprobs (too old: upgrade to >= 0.10.2).
        """
        body = await self.endpoint.complete(self.payload(request, stream=False))
        choice = body["choices"][0]
        message = choice.get("message") or {}
        prompt_ids = body.get("prompt_token_ids")
        response_ids = choice.get("token_ids")
        if not isinstance(prompt_ids, list) or not isinstance(response_ids, list):
            raise UpstreamError(self._no_ids_message())
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if not isinstance(content, list):
            raise UpstreamError(f"{self.endpoint.where} returned no logprobs although asked for them (logprobs: true)")
        stop_reason = choice.get("stop_reason")
        return self._result(
            prompt_ids=[int(t) for t in prompt_ids],
            response_ids=[int(t) for t in response_ids],
            logprobs=[float(entry["logprob"]) for entry in content],
            text=message.get("content") or "",
            tool_calls=message.get("tool_calls") or None,
            finish=str(choice.get("finish_reason") or "stop"),
            stop_sequence=stop_reason if isinstance(stop_reason, str) and stop_reason in request.stop else None,
            token_logprobs=[dict(entry) for entry in content] if request.logprobs else None,
        )

    async def stream(self, request: GenerationRequest) -> RemoteStream:
        """Start a streamed completion; returns once vLLM's first chunk arrived and carried the prompt ids.

        Raises:
            as :meth:`generate`, before anything is streamed.
        """
        response = await self.endpoint.open_stream(self.payload(request, stream=True))
        stream = RemoteStream(response, self.endpoint.where, self._build_streamed)
        first = await stream.first_chunk()
        if first is None or "error" in first or first.get("object") == "error":
            return stream  # an empty stream or an error event: text_deltas/result raise it
        if not isinstance(first.get("prompt_token_ids"), list):
            await stream.result()  # closes it
            raise UpstreamError(self._no_ids_message())
        return stream

    async def close(self) -> None:
        """Close the connection pool (the vLLM server keeps running)."""
        await self.endpoint.close()

    def _build_streamed(self, chunks: ChunkAccumulator, cancelled: bool) -> GenerationResult:
        if chunks.prompt_token_ids is None or (chunks.token_ids is None and not cancelled and chunks.content):
            raise UpstreamError(self._no_ids_message())
        if not chunks.logprobs_seen and chunks.token_ids:
            raise UpstreamError(f"{self.endpoint.where} streamed no logprobs although asked for them (logprobs: true)")
        finish = chunks.finish_reason or ("abort" if cancelled else "stop")
        return self._result(
            prompt_ids=chunks.prompt_token_ids,
            response_ids=chunks.token_ids or [],
            logprobs=chunks.logprobs,
            text=chunks.content,
            tool_calls=chunks.tool_call_list(),
            finish=finish,
        )

    def _result(
        self,
        *,
        prompt_ids: list[int],
        response_ids: list[int],
        logprobs: list[float],
        text: str,
        tool_calls: list[dict[str, Any]] | None,
        finish: str,
        stop_sequence: str | None = None,
        token_logprobs: list[dict[str, Any]] | None = None,
    ) -> GenerationResult:
        if len(logprobs) != len(response_ids):
            raise UpstreamError(
                f"{self.endpoint.where} returned {len(logprobs)} logprobs for {len(response_ids)} token ids; "
                "they must match one to one"
            )
        return GenerationResult(
            prompt_token_ids=prompt_ids,
            response_token_ids=response_ids,
            response_logprobs=logprobs,
            text=text,
            finish_reason=_FINISH_REASONS.get(finish, "stop"),
            model_version=self.model_version,
            tool_calls=tool_calls,
            stop_sequence=stop_sequence,
            token_logprobs=token_logprobs,
        )

    def _no_ids_message(self) -> str:
        return (
            f"{self.endpoint.where} returned no token ids (prompt_token_ids / token_ids) although asked for them "
            "with return_token_ids: it must be vLLM >= 0.10.2; upgrade it, or serve it with '--backend openai' to "
            "record calls without token ids (usable for prompt optimization and evaluation, not for RL)"
        )


class AnnouncedBucket(Protocol):
    """What vLLM is told about a group of tensors before their bytes arrive (satisfied by
    :class:`agentbolt.algorithms.rl.weight_sync_plan.WeightBucket`)."""

    @property
    def names(self) -> list[str]: ...

    @property
    def dtype_names(self) -> list[str]: ...

    @property
    def shapes(self) -> list[list[int]]: ...


class VLLMWeightPushClient:
    """The HTTP control plane of vLLM's weight transfer, for pushing trainer weights into a running ``vllm serve``.

    Written against vLLM's documented RLHF routes (vLLM docs "Weight Transfer"; example
    ``examples/online_serving/new_weight_syncing/rlhf_http_nccl.py``, vLLM 0.18): the server must be started with
    ``VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}'``. The bytes travel
    over NCCL from the trainer (rank 0) to every vLLM worker (ranks 1..world_size); this class only sends the
    control requests. **Never run against a real vLLM server in this repository** (no GPU here); its requests are
    tested against a fake transport only. The routes are young and have changed between vLLM releases (later
    releases add ``/start_weight_update`` and ``/finish_weight_update``): check them against the installed vLLM.

    One sync: :meth:`pause`, then per bucket :meth:`push_bucket` (the ``update_weights`` request runs while the
    trainer broadcasts that bucket's tensors), then :meth:`resume`, and
    :meth:`VLLMBackend.set_model_version`. Record it in a
    :class:`~agentbolt.algorithms.rl.weight_sync_plan.WeightVersionLedger` (``run_push``).

    Args:
        server_url: the server root, e.g. ``http://127.0.0.1:8000`` (not the ``/v1`` API root).
        timeout_s: longest wait for one request (an ``update_weights`` request lasts as long as its broadcast).
        transport: an httpx transport instead of the network (tests).
    """

    def __init__(
        self, server_url: str, *, timeout_s: float = 600.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self._client = httpx.Client(base_url=self.server_url, timeout=timeout_s, transport=transport)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as error:
            raise BackendError(f"vLLM server {self.server_url}: {method} {path} failed: {error}") from error
        if response.status_code == 404:
            raise BackendError(
                f"vLLM server {self.server_url} has no {path} route; start it with VLLM_SERVER_DEV_MODE=1 and "
                '--weight-transfer-config \'{"backend": "nccl"}\''
            )
        if response.status_code >= 400:
            raise BackendError(
                f"vLLM server {self.server_url}: {method} {path} answered {response.status_code}: {response.text}"
            )
        return response

    def world_size(self) -> int:
        """The number of vLLM workers (TP * PP * DP) that receive the weights."""
        return int(self._call("GET", "/get_world_size").json()["world_size"])

    def init_transfer(self, master_address: str, master_port: int, world_size: int, *, rank_offset: int = 1) -> None:
        """Ask the workers to join the NCCL group (blocks until the trainer joins too: run it in a thread)."""
        init_info = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
        }
        self._call("POST", "/init_weight_transfer_engine", {"init_info": init_info})

    def pause(self) -> None:
        """Stop generation (requests in flight wait) before weights change."""
        self._call("POST", "/pause")

    def resume(self) -> None:
        """Resume generation after a complete update."""
        self._call("POST", "/resume")

    def update_weights(self, bucket: AnnouncedBucket, *, packed: bool = True) -> None:
        """Announce one bucket; returns once the workers received and loaded its tensors."""
        update_info = {
            "names": bucket.names,
            "dtype_names": bucket.dtype_names,
            "shapes": bucket.shapes,
            "packed": packed,
        }
        self._call("POST", "/update_weights", {"update_info": update_info})

    def push_bucket(
        self, bucket: AnnouncedBucket, send: Callable[[AnnouncedBucket], None], *, packed: bool = True
    ) -> None:
        """Announce ``bucket`` and, at the same time, ``send`` its tensors (both sides meet in the same NCCL calls).

        Raises:
            BackendError: the server refused or failed the update.
            Exception: whatever ``send`` raised.
        """
        with ThreadPoolExecutor(max_workers=1) as pool:
            announced = pool.submit(self.update_weights, bucket, packed=packed)
            send(bucket)
            announced.result()

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()


def nccl_weight_group(client: VLLMWeightPushClient, master_address: str, master_port: int) -> Any:
    """Join the trainer (rank 0) and the vLLM workers in one NCCL group; returns the trainer's group handle.

    GPU only, **never run here**: imports vLLM lazily and follows its documented handshake
    (``NCCLWeightTransferEngine.trainer_init`` while the server's ``/init_weight_transfer_engine`` waits).
    """
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine  # pyright: ignore

    world_size = client.world_size() + 1
    with ThreadPoolExecutor(max_workers=1) as pool:
        joined = pool.submit(client.init_transfer, master_address, master_port, world_size)
        group = NCCLWeightTransferEngine.trainer_init(
            {"master_address": master_address, "master_port": master_port, "world_size": world_size}
        )
        joined.result()
    return group


def nccl_bucket_sender(
    group: Any, weights: Mapping[str, Any], *, packed: bool = True
) -> Callable[[AnnouncedBucket], None]:
    """A ``send`` for :meth:`VLLMWeightPushClient.push_bucket` that broadcasts a bucket's tensors from ``weights``
    (``name -> CUDA tensor``) in the bucket's order. GPU only, **never run here**; imports vLLM lazily."""

    def send(bucket: AnnouncedBucket) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import (  # pyright: ignore
            NCCLTrainerSendWeightsArgs,
            NCCLWeightTransferEngine,
        )

        NCCLWeightTransferEngine.trainer_send_weights(
            iterator=iter([(name, weights[name]) for name in bucket.names]),
            trainer_args=NCCLTrainerSendWeightsArgs(group=group, packed=packed),
        )

    return send
