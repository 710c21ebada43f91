"""The OpenAI (legacy) Completions wire format: text in, text out, no chat template. Pure: no I/O.

https://platform.openai.com/docs/api-reference/completions. The prompt (a string, or token ids as vLLM accepts
them) is fed to the model as it is; the answer is the generated text. Tools do not exist in this protocol, so
nothing is parsed as a tool call. :data:`COMPLETIONS_FIELDS` says what happens to each request field.
"""

from __future__ import annotations

from typing import Any

from agentbolt.server.gateway.calls import CallSpec, ChoiceOutput, RequestRefused
from agentbolt.server.gateway.openai_format import (
    MAX_CHOICES,
    ErrorInfo,
    error_body,
    logit_bias_field,
    number_field,
    openai_envelope,
    sse_data,
    stop_field,
    stream_end_events,
)

LEGACY_LOGPROBS_MAX = 5
"""Largest ``logprobs`` of the legacy API."""

COMPLETIONS_FIELDS: dict[str, str] = {
    "model": "recorded; any name is served by the backend's model",
    "prompt": "honoured: one string or one list of token ids (several prompts refused: send one per request)",
    "max_tokens": "honoured (default 16, as OpenAI's)",
    "temperature": "honoured (a job's version overrides it in its rollouts)",
    "top_p": "honoured (a job's version overrides it in its rollouts)",
    "n": "honoured",
    "stream": "honoured (server-sent events)",
    "stream_options": "honoured: include_usage",
    "stop": "honoured (the stop text is not returned)",
    "logprobs": "honoured (0..5: tokens, token_logprobs, top_logprobs, text_offset)",
    "seed": "honoured",
    "presence_penalty": "honoured (a job's version sets 0 in its rollouts)",
    "frequency_penalty": "honoured (a job's version sets 0 in its rollouts)",
    "logit_bias": "honoured (a job's version drops it in its rollouts)",
    "user": "recorded",
    "best_of": "honoured when equal to n (or absent); larger refused",
    "echo": "refused unless false",
    "suffix": "refused unless null (no fill-in-the-middle)",
}
"""What the gateway does with each Completions request field (docs/gateway_conformance.md is made from it)."""

DEFAULT_COMPLETION_TOKENS = 16
"""OpenAI's default ``max_tokens`` for Completions."""


def _prompt(value: Any) -> str | list[int]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        return _prompt(value[0])
    if isinstance(value, list) and len(value) > 1:
        raise RequestRefused("several prompts in one request are not served; send one prompt per request", "prompt")
    raise RequestRefused("prompt must be a string or a list of token ids", "prompt", "invalid_value")


def completions_call(body: Any) -> CallSpec:
    """A Completions request body as a :class:`~agentbolt.server.gateway.calls.CallSpec` (``protocol="completions"``,
    ``prompt`` set, no messages, no tools).

    Raises:
        RequestRefused: a field that is not served, a bad value, or a key the real API does not have.
    """
    if not isinstance(body, dict):
        raise RequestRefused("the request body must be a JSON object", None, "invalid_value")
    unknown = sorted(key for key in body if key not in COMPLETIONS_FIELDS)
    if unknown:
        raise RequestRefused(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0], "unknown_parameter")
    if "prompt" not in body:
        raise RequestRefused("prompt is required", "prompt", "invalid_value")
    if body.get("echo"):
        raise RequestRefused("echo is not served: the answer never repeats the prompt", "echo")
    if body.get("suffix") is not None:
        raise RequestRefused("suffix is not served (no fill-in-the-middle)", "suffix")
    n = int(number_field(body, "n", 1, MAX_CHOICES, integer=True) or 1)
    best_of = number_field(body, "best_of", 1, MAX_CHOICES, integer=True)
    if best_of is not None and best_of != n:
        raise RequestRefused(f"best_of {best_of} is not served (only best_of == n, {n}): ask for n choices", "best_of")
    logprobs = number_field(body, "logprobs", 0, LEGACY_LOGPROBS_MAX, integer=True)
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage", "include_obfuscation"}:
        raise RequestRefused("stream_options takes include_usage only", "stream_options")
    requested: dict[str, float | int] = {"max_tokens": DEFAULT_COMPLETION_TOKENS}
    for key, value in (
        ("temperature", number_field(body, "temperature", 0, 2)),
        ("top_p", number_field(body, "top_p", 0, 1, low_open=True)),
        ("max_tokens", number_field(body, "max_tokens", 1, 10**9, integer=True)),
    ):
        if value is not None:
            requested[key] = value
    seed = number_field(body, "seed", -(2**63), 2**63 - 1, integer=True)
    prompt = _prompt(body.get("prompt"))
    return CallSpec(
        protocol="completions",
        prompt=prompt,
        stop=stop_field(body.get("stop")),
        logprobs=logprobs is not None,
        top_logprobs=int(logprobs or 0),
        n=n,
        seed=None if seed is None else int(seed),
        presence_penalty=float(number_field(body, "presence_penalty", -2, 2) or 0.0),
        frequency_penalty=float(number_field(body, "frequency_penalty", -2, 2) or 0.0),
        logit_bias=logit_bias_field(body.get("logit_bias")),
        sampling_requested=requested,
        stream=bool(body.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        attributes={"agentbolt.llm.request.user": body["user"]} if body.get("user") is not None else {},
    )


def legacy_logprobs(spec: CallSpec, output: ChoiceOutput) -> dict[str, Any] | None:
    """The legacy ``logprobs`` object: ``tokens``, ``token_logprobs``, ``top_logprobs`` (one ``{token: logprob}``
    per position, ``k`` entries) and ``text_offset`` (each token's character offset in the returned text)."""
    if not spec.logprobs:
        return None
    entries = output.result.token_logprobs or []
    tokens: list[str] = []
    offsets: list[int] = []
    offset = 0
    for entry in entries:
        tokens.append(entry["token"])
        offsets.append(offset)
        offset += len(entry["token"])
    return {
        "tokens": tokens,
        "token_logprobs": [entry["logprob"] for entry in entries],
        "top_logprobs": [
            {alt["token"]: alt["logprob"] for alt in (entry.get("top_logprobs") or [])[: spec.top_logprobs]}
            for entry in entries
        ]
        if spec.top_logprobs
        else None,
        "text_offset": offsets,
    }


def completion_body(
    spec: CallSpec, outputs: list[ChoiceOutput], *, response_id: str, created_s: int, model: str
) -> dict[str, Any]:
    """A whole ``text_completion``; ``prompt_token_ids`` and per-choice ``token_ids`` (vLLM's names) when the
    backend has exact ids."""
    choices = [
        {
            "index": output.index,
            "text": output.result.text,
            "finish_reason": output.finish,
            "logprobs": legacy_logprobs(spec, output),
        }
        for output in outputs
    ]
    return openai_envelope(
        "text_completion", outputs, choices, response_id=response_id, created_s=created_s, model=model
    )


class CompletionsStreamEncoder:
    """The :class:`~agentbolt.server.gateway.calls.StreamEncoder` of Completions: ``text_completion`` chunks with
    text deltas, a last chunk per choice with its ``finish_reason`` (and its ``logprobs``), the usage chunk when
    ``stream_options.include_usage``, then ``data: [DONE]``."""

    def __init__(self, spec: CallSpec, *, response_id: str, created_s: int, model: str) -> None:
        self._spec = spec
        self._head = {"id": response_id, "object": "text_completion", "created": created_s, "model": model}

    def _chunk(self, index: int, text: str, finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
        return sse_data({**self._head, "choices": [choice]})

    def begin(self) -> list[str]:
        """Nothing."""
        return []

    def choice_begin(self, index: int) -> list[str]:
        """Nothing: the first text chunk opens the choice."""
        return []

    def text(self, index: int, delta: str) -> list[str]:
        """A text chunk."""
        return [self._chunk(index, delta)]

    def choice_end(self, output: ChoiceOutput) -> list[str]:
        """The finish chunk."""
        return [self._chunk(output.index, "", output.finish, legacy_logprobs(self._spec, output))]

    def end(self, outputs: list[ChoiceOutput]) -> list[str]:
        """The usage chunk (``include_usage``), then ``[DONE]``."""
        return stream_end_events(self._head, self._spec, outputs)

    def error(self, status: int, type_: str, message: str, code: str | None) -> list[str]:
        """``data: {"error": {...}}``."""
        return [sse_data(error_body(ErrorInfo(status, type_, message, code)))]
