"""The wire formats of the token engines (for :class:`~agentbolt.inference.token_engines.TokenEngineBackend`):
how a :class:`~agentbolt.inference.base.GenerationRequest` becomes an engine's request with a token-id prompt, and
where its answer holds the generated ids and one logprob per id:

============  =======================================  ===============================================================
engine        request                                  ids and logprobs in the answer
============  =======================================  ===============================================================
``llamacpp``  ``POST /completion``, ``prompt: [ids]``  ``tokens`` (``return_tokens``), ``completion_probabilities``
              (llama.cpp ``tools/server/README.md``)   (``n_probs``; ``post_sampling_probs`` when sampling)
``vllm``      ``POST /v1/completions``, ``prompt:``    ``choices[0].token_ids`` (``return_token_ids``),
              ``[ids]``                                ``choices[0].logprobs.token_logprobs`` (``logprobs``)
``sglang``    ``POST /generate``, ``input_ids``        ``output_ids``, ``meta_info.output_token_logprobs``
                                                       (``return_logprob``)
============  =======================================  ===============================================================

Sampling is made explicit as in the embedded backend: no top-k, no min-p, no repetition penalty, so an engine's
defaults (llama.cpp samples with top_k 40, min_p 0.05 unless told otherwise) cannot change the distribution.
Which distribution the logprobs are of (the embedded backend records ``log_softmax(logits / T)`` at the chosen id):

- llama.cpp: at temperature 1 (and greedy) a plain softmax of the logits, which is the sampling distribution (and
  what the embedded backend records when greedy); at other temperatures ``post_sampling_probs``, the probability
  after its sampler chain, here the temperature alone (plus top-p when ``top_p < 1``: then it is the renormalized
  nucleus probability, higher than the embedded backend's by the nucleus mass).
- vLLM: ``--logprobs-mode processed_logprobs`` gives the tempered distribution; its default ``raw_logprobs`` is the
  model's distribution before temperature (equal at T = 1).
- SGLang: the logprobs it returns (see ``tests/fixtures/engines/README.md`` for the flags that change them).

The trainer recomputes its own logprobs; the served ones feed the importance ratio and the ``approx_kl`` reported at
each step (docs/training.md), which shows any mismatch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from agentbolt.inference.base import (
    FinishReason,
    GenerationRequest,
    RequestRefused,
    UpstreamError,
)

EngineKind = Literal["llamacpp", "vllm", "sglang"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("llamacpp", "vllm", "sglang")


@dataclass
class EngineAnswer:
    """What an engine generated, read out of its answer.

    Attributes:
        ids: ``(R,)`` generated ids (a final stop id included when the engine reports it).
        logprobs: ``(R,)`` one logprob per id.
        top: per id, the top alternatives ``[(id or text, logprob), ...]`` (empty lists when not asked for).
        finish_reason: ``stop`` or ``length`` (``abort`` when the engine says so).
        cached_prompt_tokens: prompt tokens the engine reused from its cache (0 when it does not say).
        stop_word: the stop string the engine stopped on, when its ids end before it (llama.cpp).
        unscored: why some ids have no logprob (their ``logprobs`` entries are NaN), else ``None``: the answer is
            served but not trained.
        n_generated: how many ids the engine says it generated, when it says so (llama.cpp ``tokens_predicted``).
    """

    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int | str, float]]] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    cached_prompt_tokens: int = 0
    stop_word: str | None = None
    unscored: str | None = None
    n_generated: int | None = None


def _refuse_unforwarded(request: GenerationRequest, engine: str, output_format_ok: bool) -> None:
    if request.tool_choice.mode in ("required", "function"):
        raise RequestRefused(
            f"tool_choice {request.tool_choice.mode!r} is not served by the {engine} engine (the embedded backend "
            "constrains it with a grammar); send tool_choice 'auto' or 'none'",
            "tool_choice",
        )
    if request.output_format is not None and not output_format_ok:
        raise RequestRefused(
            f"response_format is not forwarded to the {engine} engine; drop it, or serve with the embedded backend",
            "response_format",
        )


def _json_schema(request: GenerationRequest) -> dict[str, Any] | None:
    if request.output_format is None:
        return None
    if request.output_format.kind == "json_object":
        return {"type": "object"}
    return request.output_format.schema or {}


def _floats(values: list[Any], where: str) -> list[float]:
    try:
        return [float(value) for value in values]
    except (TypeError, ValueError) as exc:
        raise UpstreamError(f"{where} returned a logprob that is not a number: {exc}") from exc


class LlamaCppProtocol:
    """llama.cpp's ``llama-server`` native ``POST /completion`` (llama.cpp ``tools/server/README.md``)."""

    kind: EngineKind = "llamacpp"
    path = "/completion"

    def payload(self, ids: list[int], request: GenerationRequest, adapter: str | None) -> dict[str, Any]:
        """The JSON body: the prompt as ids (no BOS is added to an id prompt), ``return_tokens``, ``n_probs`` and,
        when the temperature is neither 0 nor 1 (or top-p cuts), ``post_sampling_probs``; a sampler chain of only
        ``temperature`` (and ``top_p`` when below 1) so that the server's default top-k/min-p/penalties do not apply;
        ``cache_prompt`` (the slot reuses the longest common prefix).

        Raises:
            RequestRefused: ``tool_choice`` required/function.
        """
        _refuse_unforwarded(request, "llamacpp", output_format_ok=True)
        # A plain softmax of the logits is the sampling distribution at T = 1 (and what is recorded when greedy);
        # any other temperature, or a top-p cut, needs the probabilities after the sampler chain, which cost a
        # sort of the whole vocabulary per token (measured: 22.8 against 34.3 tokens/s at 16 requests, Qwen2.5-0.5B).
        post_sampling = request.temperature not in (0.0, 1.0) or request.top_p < 1 or request.penalized
        samplers = ["temperature"] if request.top_p >= 1 else ["temperature", "top_p"]
        if request.penalized:
            samplers = ["penalties", *samplers]
        body: dict[str, Any] = {
            "prompt": ids,
            "n_predict": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": 0,
            "min_p": 0.0,
            "typical_p": 1.0,
            "repeat_penalty": 1.0,
            "presence_penalty": request.presence_penalty,
            "frequency_penalty": request.frequency_penalty,
            "samplers": samplers,
            "n_probs": max(1, request.top_logprobs if request.logprobs else 0),
            "post_sampling_probs": post_sampling,
            "return_tokens": True,
            "cache_prompt": True,
            "stream": False,
        }
        if request.stop or request.stop_inclusive:
            body["stop"] = [*request.stop, *request.stop_inclusive]
        if request.seed is not None:
            body["seed"] = request.seed
        if request.logit_bias:
            body["logit_bias"] = [[token_id, bias] for token_id, bias in request.logit_bias.items()]
        schema = _json_schema(request)
        if schema is not None:
            body["json_schema"] = schema
        return body

    def parse(self, body: dict[str, Any], where: str) -> EngineAnswer:
        """Read ids, logprobs and the finish reason out of a ``/completion`` answer.

        Raises:
            UpstreamError: no ``tokens`` or no probabilities (a server too old for ``return_tokens``).
        """
        ids = body.get("tokens")
        probs = body.get("completion_probabilities")
        if not isinstance(ids, list) or not isinstance(probs, list):
            raise UpstreamError(
                f"{where} returned no token ids or no completion_probabilities although asked for them "
                "(return_tokens, n_probs): it must be llama.cpp's llama-server from 2025 or later"
            )
        generated = [int(t) for t in ids]
        # Each probability entry names its id. llama.cpp gives none for an id after which the text ends inside a
        # UTF-8 character (the next id completes it), nor (not streamed) for the ids of a stop string: the entries
        # are matched to the ids in order, and an id without one gets NaN.
        logprobs: list[float] = []
        top: list[list[tuple[int | str, float]]] = []
        j = 0
        for token in generated:
            entry = probs[j] if j < len(probs) else None
            if not isinstance(entry, dict) or int(entry.get("id", token)) != token:
                logprobs.append(math.nan)
                top.append([])
                continue
            j += 1
            if "logprob" in entry:
                logprobs.append(float(entry["logprob"]))
                alternatives: list[tuple[int | str, float]] = [
                    (int(a["id"]), float(a["logprob"])) for a in entry.get("top_logprobs") or []
                ]
            else:
                logprobs.append(_log(entry.get("prob")))
                alternatives = [(int(a["id"]), _log(a.get("prob"))) for a in entry.get("top_probs") or []]
            top.append(alternatives)
        if j < len(probs):
            raise UpstreamError(
                f"{where} returned {len(probs)} probabilities that do not match its {len(generated)} token ids"
            )
        stop_type = body.get("stop_type")
        finish: FinishReason = "length" if stop_type == "limit" else "stop"
        stop_word = None
        if stop_type == "word":
            # Not streamed, llama.cpp gives no probabilities for the stop string's ids: they are not recorded (the
            # answer's text ends before it anyway).
            kept = len(logprobs)
            while kept > 0 and math.isnan(logprobs[kept - 1]):
                kept -= 1
            if kept < len(generated):
                generated, logprobs, top = generated[:kept], logprobs[:kept], top[:kept]
                stop_word = str(body.get("stopping_word") or "") or None
        missing = sum(math.isnan(value) for value in logprobs)
        predicted = body.get("tokens_predicted")
        unscored = None
        if missing:
            unscored = (
                f"llama.cpp gave no probability for {missing} of {len(generated)} generated ids (an id that ends "
                "inside a UTF-8 character): served, not trained"
            )
        elif body.get("stream") and isinstance(predicted, int) and predicted > len(generated) and stop_type != "word":
            unscored = (
                f"llama.cpp streamed {len(generated)} of its {predicted} generated ids (it does not stream an id that "
                "ends inside a UTF-8 character): served, not trained"
            )
        return EngineAnswer(
            ids=generated,
            logprobs=logprobs,
            top=top,
            finish_reason=finish,
            # timings.cache_n: prompt ids the slot reused (llama.cpp server_slot_stats); tokens_cached is the slot's
            # whole content after the answer, not a reuse count
            cached_prompt_tokens=int((body.get("timings") or {}).get("cache_n") or 0),
            stop_word=stop_word,
            unscored=unscored,
            n_generated=predicted if isinstance(predicted, int) else None,
        )


def _log(prob: Any) -> float:
    value = float(prob) if isinstance(prob, int | float) else 0.0
    return math.log(value) if value > 0 else -math.inf


class VLLMCompletionsProtocol:
    """vLLM's OpenAI-compatible ``POST /v1/completions`` with a token-id prompt and ``return_token_ids``
    (vLLM >= 0.10.2); see ``tests/fixtures/engines/README.md`` for the fields and their sources."""

    kind: EngineKind = "vllm"
    path = "/v1/completions"

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def payload(self, ids: list[int], request: GenerationRequest, adapter: str | None) -> dict[str, Any]:
        """The JSON body; ``model`` is the loaded LoRA adapter's name once one is loaded.

        Raises:
            RequestRefused: ``tool_choice`` required/function.
        """
        _refuse_unforwarded(request, "vllm", output_format_ok=True)
        body: dict[str, Any] = {
            "model": adapter or self.model_name,
            "prompt": ids,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": request.presence_penalty,
            "frequency_penalty": request.frequency_penalty,
            "logprobs": request.top_logprobs if request.logprobs else 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stream": False,
        }
        if request.stop or request.stop_inclusive:
            body["stop"] = [*request.stop, *request.stop_inclusive]
            body["include_stop_str_in_output"] = True
        if request.seed is not None:
            body["seed"] = request.seed
        if request.logit_bias:
            body["logit_bias"] = {str(token_id): bias for token_id, bias in request.logit_bias.items()}
        schema = _json_schema(request)
        if schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        return body

    def parse(self, body: dict[str, Any], where: str) -> EngineAnswer:
        """Read ids, logprobs and the finish reason out of a completions answer (choice 0).

        Raises:
            UpstreamError: no ``token_ids`` or no ``logprobs`` (vLLM older than 0.10.2, or not vLLM).
        """
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices:
            raise UpstreamError(f"{where} answered without choices")
        choice = choices[0]
        ids = choice.get("token_ids")
        logprobs = choice.get("logprobs")
        values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        if not isinstance(ids, list) or not isinstance(values, list):
            raise UpstreamError(
                f"{where} returned no token_ids or no logprobs although asked for them (return_token_ids, "
                "logprobs): it must be vLLM >= 0.10.2"
            )
        tops = (logprobs or {}).get("top_logprobs") or []
        # each step's dict holds the sampled token first, then the most likely ones: most likely first here
        top: list[list[tuple[int | str, float]]] = [
            sorted(((str(text), float(value)) for text, value in (step or {}).items()), key=lambda pair: -pair[1])
            for step in tops
        ]
        usage = body.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        return EngineAnswer(
            ids=[int(t) for t in ids],
            logprobs=_floats(values, where),
            top=top,
            finish_reason=finish,
            cached_prompt_tokens=int(details.get("cached_tokens") or 0),
        )


class SGLangGenerateProtocol:
    """SGLang's native ``POST /generate`` with ``input_ids`` and ``return_logprob``; see
    ``tests/fixtures/engines/README.md`` for the fields and their sources."""

    kind: EngineKind = "sglang"
    path = "/generate"

    def payload(self, ids: list[int], request: GenerationRequest, adapter: str | None) -> dict[str, Any]:
        """The JSON body; ``lora_path`` names the loaded LoRA adapter once one is loaded (SGLang reads it as the
        registered adapter name). SGLang refuses unknown ``sampling_params`` keys (0.5.23), so only its own are sent.

        Raises:
            RequestRefused: ``tool_choice`` required/function.
        """
        _refuse_unforwarded(request, "sglang", output_format_ok=True)
        sampling: dict[str, Any] = {
            "max_new_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": request.presence_penalty,
            "frequency_penalty": request.frequency_penalty,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if request.stop or request.stop_inclusive:
            sampling["stop"] = [*request.stop, *request.stop_inclusive]
        if request.seed is not None:
            sampling["sampling_seed"] = request.seed
        if request.logit_bias:
            sampling["logit_bias"] = {str(token_id): bias for token_id, bias in request.logit_bias.items()}
        schema = _json_schema(request)
        if schema is not None:
            sampling["json_schema"] = json.dumps(schema)  # a JSON string, not an object
        body: dict[str, Any] = {
            "input_ids": ids,
            "sampling_params": sampling,
            "return_logprob": True,
            "top_logprobs_num": request.top_logprobs if request.logprobs else 0,
            "logprob_start_len": -1,
            "stream": False,
        }
        if adapter is not None:
            body["lora_path"] = adapter
        return body

    def parse(self, body: dict[str, Any], where: str) -> EngineAnswer:
        """Read ids, logprobs and the finish reason out of a ``/generate`` answer.

        Raises:
            UpstreamError: no ``output_ids`` or no ``output_token_logprobs``.
        """
        meta = body.get("meta_info")
        ids = body.get("output_ids")
        pairs = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
        if not isinstance(ids, list) or not isinstance(pairs, list) or not isinstance(meta, dict):
            raise UpstreamError(
                f"{where} returned no output_ids or no meta_info.output_token_logprobs although asked for them "
                "(return_logprob)"
            )
        logprobs = _floats([pair[0] for pair in pairs], where)
        top: list[list[tuple[int | str, float]]] = [
            [(int(alt[1]), float(alt[0])) for alt in (step or [])] for step in meta.get("output_top_logprobs") or []
        ]
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
        finish: FinishReason = "length" if kind == "length" else "abort" if kind == "abort" else "stop"
        return EngineAnswer(
            ids=[int(t) for t in ids],
            logprobs=logprobs,
            top=top,
            finish_reason=finish,
            cached_prompt_tokens=int(meta.get("cached_tokens") or 0),
        )


EngineProtocol = LlamaCppProtocol | VLLMCompletionsProtocol | SGLangGenerateProtocol
