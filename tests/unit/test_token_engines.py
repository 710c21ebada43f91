"""The token-in/token-out engine backend (:mod:`agentbolt.inference.token_engines`) against recorded payloads.

No engine runs here: an ``httpx.MockTransport`` handed to :class:`TokenEngineBackend` checks the path and JSON body the
backend sends and answers as the engine would. The vLLM and SGLang answers are the recorded payloads of
``tests/fixtures/engines/`` (reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: see its
README.md). Those payloads hold Qwen2.5 token ids; the prompts here are rendered by SmolLM2's real tokenizer, so the
generated ids of the fixtures are mapped to SmolLM2's ids for the same tokens (the ``token_map`` fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from agentbolt.errors import BackendError, ConfigError
from agentbolt.inference import token_engines
from agentbolt.inference.base import (
    ContextLengthExceededError,
    GenerationRequest,
    GenerationResult,
    OutputFormat,
    RequestRefused,
    ToolChoice,
    UpstreamError,
)
from agentbolt.inference.engine_protocols import LlamaCppProtocol, SGLangGenerateProtocol, VLLMCompletionsProtocol
from agentbolt.inference.prompt_encoding import PromptEncoder
from agentbolt.inference.token_engines import TokenEngineBackend
from agentbolt.inference.transcripts import TranscriptCache
from agentbolt.trainer.job_config import InferenceConfig, TrainConfig, check_trainer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"

QUESTION = [{"role": "user", "content": "What is 2+2?"}]

# SmolLM2-135M-Instruct's chat template for QUESTION (its default system message included), written out by hand from
# the tokenizer: <|im_start|>=1, <|im_end|>=2, "\n"=198, "4"=36.
SMOLLM2_QUESTION_IDS = [
    *[1, 9690, 198],  # <|im_start|>system\n
    *[2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182],
    *[2, 198],  # <|im_end|>\n
    *[1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198],  # <|im_start|>user\nWhat is 2+2?<|im_end|>\n
    *[1, 520, 9531, 198],  # <|im_start|>assistant\n
]
SMOLLM2_FOUR = 36
SMOLLM2_IM_END = 2

QWEN_FOUR = 19
QWEN_IM_END = 151645

SGLANG_SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "ignore_eos",
        "no_stop_trim",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "logit_bias",
        "sampling_seed",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "skip_special_tokens",
        "spaces_between_special_tokens",
    }
)
"""``sampling_params`` keys SGLang 0.5.23 accepts (it answers 400 to any other; fixtures README)."""

SGLANG_GENERATE_KEYS = frozenset(
    {
        "input_ids",
        "sampling_params",
        "return_logprob",
        "top_logprobs_num",
        "logprob_start_len",
        "token_ids_logprob",
        "return_text_in_logprobs",
        "lora_path",
        "stream",
        "rid",
        "return_prompt_token_ids",
    }
)

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def token_map(smollm2_encoder: PromptEncoder) -> dict[int, int]:
    """The fixtures' Qwen2.5 ids -> SmolLM2's ids for the same tokens, looked up in SmolLM2's tokenizer."""
    tokenizer = smollm2_encoder.tokenizer
    four = tokenizer.convert_tokens_to_ids("4")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (four, im_end) == (SMOLLM2_FOUR, SMOLLM2_IM_END)
    return {QWEN_FOUR: four, QWEN_IM_END: im_end}


@pytest.fixture(scope="module")
def smollm2_encoder(smollm2_dir: Path) -> PromptEncoder:
    return PromptEncoder.from_model_dir(smollm2_dir)


@pytest.fixture
def encoder(smollm2_encoder: PromptEncoder) -> PromptEncoder:
    """SmolLM2's encoder with an empty transcript cache for each test (the tokenizer is loaded once)."""
    fresh = copy.copy(smollm2_encoder)
    fresh.transcripts = TranscriptCache()
    return fresh


class Engine:
    """A fake engine behind ``httpx.MockTransport``: ``routes`` maps a path to a handler; every request is recorded
    as ``(path, json body or None)``."""

    def __init__(self, routes: dict[str, Handler]) -> None:
        self.routes = routes
        self.calls: list[tuple[str, Any]] = []
        self.transport = httpx.MockTransport(self._handle)

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.url.path, body))
        handler = self.routes.get(request.url.path)
        if handler is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return await handler(request)

    def bodies(self, path: str) -> list[Any]:
        return [body for called, body in self.calls if called == path]


def answer(status: int = 200, *, json_body: Any = None, text: str | None = None) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=json_body)

    return handler


def backend_for(kind: str, encoder: PromptEncoder, engine: Engine, *, max_context_tokens: int = 2048):
    protocol: Any
    if kind == "vllm":
        protocol = VLLMCompletionsProtocol("served-name")
    elif kind == "sglang":
        protocol = SGLangGenerateProtocol()
    else:
        protocol = LlamaCppProtocol()
    return TokenEngineBackend(
        protocol,
        encoder,
        base_url="http://engine.test:8000/",
        model_name="served-name",
        max_context_tokens=max_context_tokens,
        transport=engine.transport,
    )


def vllm_response(token_map: dict[int, int]) -> dict[str, Any]:
    """The recorded vLLM answer with its generated ids mapped to SmolLM2's (19 "4" -> 36, 151645 <|im_end|> -> 2);
    the echoed ``prompt_token_ids`` are left as Qwen's: the backend must report the ids it sent, not the echo."""
    response = copy.deepcopy(load_fixture("vllm_completions.json")["response"])
    choice = response["choices"][0]
    choice["token_ids"] = [token_map[t] for t in choice["token_ids"]]
    return response


def sglang_response(token_map: dict[int, int]) -> dict[str, Any]:
    """The recorded SGLang answer with its ids mapped to SmolLM2's (19 "4" -> 36, 151645 <|im_end|> -> 2)."""
    response = copy.deepcopy(load_fixture("sglang_generate.json")["response"])
    response["output_ids"] = [token_map[t] for t in response["output_ids"]]
    meta = response["meta_info"]
    meta["output_token_logprobs"] = [[lp, token_map[t], text] for lp, t, text in meta["output_token_logprobs"]]
    meta["finish_reason"]["matched"] = token_map[meta["finish_reason"]["matched"]]
    return response


# ---------------------------------------------------------------------------- vLLM, recorded payloads


def test_vllm_recorded_payload_round_trip_and_adapter_as_model(
    encoder: PromptEncoder, token_map: dict[int, int], tmp_path: Path
) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: the backend sends
    the prompt as the ids its encoder rendered, with the fields the recorded request has, and reads the recorded
    answer's ``choices[0].token_ids`` / ``token_logprobs`` / ``cached_tokens``; after ``load_adapter`` the adapter's
    name is the ``model``."""
    fixture = load_fixture("vllm_completions.json")
    assert encoder.encode_prompt(QUESTION) == SMOLLM2_QUESTION_IDS

    async def completions(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=vllm_response(token_map))

    engine = Engine(
        {
            "/v1/completions": completions,
            "/v1/load_lora_adapter": answer(text="Success: LoRA adapter 'agentbolt-step-1' added successfully."),
        }
    )
    backend = backend_for("vllm", encoder, engine)

    async def run() -> tuple[GenerationResult, GenerationResult]:
        first = await backend.generate(GenerationRequest(messages=QUESTION, max_tokens=16, temperature=1.0))
        await backend.load_adapter(tmp_path / "adapter", "step-1")
        second = await backend.generate(GenerationRequest(messages=QUESTION, max_tokens=16, temperature=1.0))
        await backend.close()
        return first, second

    first, second = asyncio.run(run())

    sent = engine.bodies("/v1/completions")
    assert len(sent) == 2
    body = sent[0]
    assert set(fixture["request"]) <= set(body)  # every field of the recorded request is sent
    assert body["prompt"] == SMOLLM2_QUESTION_IDS
    assert body["return_token_ids"] is True
    assert body["logprobs"] == 0
    assert body["top_k"] == -1
    assert body["model"] == "served-name"
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["stream"]) == (16, 1.0, 1.0, False)
    assert "stop" not in body and "response_format" not in body

    assert first.prompt_token_ids == SMOLLM2_QUESTION_IDS  # not the Qwen ids the answer echoes
    assert first.response_token_ids == [SMOLLM2_FOUR, SMOLLM2_IM_END]
    assert first.response_logprobs == [-0.0123, -0.0456]
    assert first.finish_reason == "stop"
    assert first.text == "4"
    assert first.extra["cached_prompt_tokens"] == 16
    assert first.extra["engine"] == "vllm"
    assert first.model_version == "base"
    assert first.stop_sequence is None and first.token_logprobs is None

    assert sent[1]["model"] == "agentbolt-step-1"
    assert sent[1]["prompt"] == SMOLLM2_QUESTION_IDS
    assert second.model_version == "step-1"
    assert second.response_token_ids == [SMOLLM2_FOUR, SMOLLM2_IM_END]


def test_vllm_recorded_payload_with_stop_logprobs_and_response_format(
    encoder: PromptEncoder, token_map: dict[int, int]
) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: stop strings,
    logprobs and a json_schema response_format go in vLLM's own fields; the token_logprobs entries leave out the
    final <|im_end|>."""

    async def completions(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=vllm_response(token_map))

    engine = Engine({"/v1/completions": completions})
    backend = backend_for("vllm", encoder, engine)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    request = GenerationRequest(
        messages=QUESTION,
        max_tokens=16,
        stop=("\n\n",),
        stop_inclusive=("</tool_call>",),
        logprobs=True,
        top_logprobs=2,
        seed=7,
        logit_bias={36: 5.0},
        output_format=OutputFormat("json_schema", schema=schema),
    )

    async def run() -> GenerationResult:
        try:
            return await backend.generate(request)
        finally:
            await backend.close()

    result = asyncio.run(run())
    (body,) = engine.bodies("/v1/completions")
    assert body["stop"] == ["\n\n", "</tool_call>"]
    assert body["include_stop_str_in_output"] is True
    assert body["logprobs"] == 2
    assert body["seed"] == 7
    assert body["logit_bias"] == {"36": 5.0}
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    assert result.text == "4" and result.stop_sequence is None
    assert result.token_logprobs is not None
    assert [(e["token"], e["logprob"], e["bytes"]) for e in result.token_logprobs] == [("4", -0.0123, [52])]
    # vLLM's top_logprobs are keyed by token text
    assert result.token_logprobs[0]["top_logprobs"] == [{"token": "4", "logprob": -0.0123, "bytes": [52]}]


def test_vllm_top_logprobs_are_the_most_likely_tokens(encoder: PromptEncoder, token_map: dict[int, int]) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: with
    ``logprobs: N`` each ``top_logprobs`` dict holds the sampled token first, then the N most likely (fixtures
    README); here the sampled "4" is only third, so top_logprobs 2 must be "5" and "6"."""
    response = vllm_response(token_map)
    response["choices"][0]["logprobs"]["token_logprobs"] = [-2.0, -0.0456]
    response["choices"][0]["logprobs"]["top_logprobs"] = [
        {"4": -2.0, "5": -0.5, "6": -1.0},
        {"<|im_end|>": -0.0456, "<|endoftext|>": -4.0},
    ]
    engine = Engine({"/v1/completions": answer(json_body=response)})
    backend = backend_for("vllm", encoder, engine)
    result = run_one(backend, GenerationRequest(messages=QUESTION, max_tokens=16, logprobs=True, top_logprobs=2))
    (body,) = engine.bodies("/v1/completions")
    assert body["logprobs"] == 2
    assert result.token_logprobs is not None
    (entry,) = result.token_logprobs
    assert (entry["token"], entry["logprob"]) == ("4", -2.0)
    assert [(alt["token"], alt["logprob"]) for alt in entry["top_logprobs"]] == [("5", -0.5), ("6", -1.0)]


# ---------------------------------------------------------------------------- SGLang, recorded payloads


def test_sglang_recorded_payload_round_trip_with_json_schema_and_lora_path(
    encoder: PromptEncoder, token_map: dict[int, int], tmp_path: Path
) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: ``input_ids`` are
    the encoder's ids, every ``sampling_params`` key is one SGLang accepts (it refuses others with a 400), a
    json_schema response_format goes as a JSON string, and after ``load_adapter`` requests carry ``lora_path``."""
    fixture = load_fixture("sglang_generate.json")
    load_fixture_body = load_fixture("sglang_load_lora.json")["response_body"]

    async def generate(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=sglang_response(token_map))

    async def load(request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["lora_name"]
        return httpx.Response(200, json={**load_fixture_body, "loaded_adapters": {name: "/somewhere"}})

    engine = Engine({"/generate": generate, "/load_lora_adapter": load})
    backend = backend_for("sglang", encoder, engine)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    constrained = GenerationRequest(
        messages=QUESTION,
        max_tokens=16,
        temperature=0.7,
        top_p=0.9,
        seed=11,
        stop=("\n\n",),
        presence_penalty=0.5,
        logit_bias={36: -3.0},
        output_format=OutputFormat("json_schema", schema=schema),
    )

    async def run() -> tuple[GenerationResult, GenerationResult]:
        first = await backend.generate(GenerationRequest(messages=QUESTION, max_tokens=16, temperature=1.0))
        await backend.load_adapter(tmp_path / "adapter", "step-3")
        second = await backend.generate(constrained)
        await backend.close()
        return first, second

    first, second = asyncio.run(run())
    plain, shaped = engine.bodies("/generate")

    for body in (plain, shaped):
        assert set(body) <= SGLANG_GENERATE_KEYS
        assert set(body["sampling_params"]) <= SGLANG_SAMPLING_KEYS, set(body["sampling_params"]) - SGLANG_SAMPLING_KEYS
        assert body["input_ids"] == SMOLLM2_QUESTION_IDS
        assert body["return_logprob"] is True
        assert (body["top_logprobs_num"], body["logprob_start_len"], body["stream"]) == (0, -1, False)
    assert set(fixture["request"]) <= set(plain)
    assert set(fixture["request"]["sampling_params"]) <= set(plain["sampling_params"])
    assert "lora_path" not in plain
    assert plain["sampling_params"]["max_new_tokens"] == 16
    assert plain["sampling_params"]["top_k"] == -1
    assert "json_schema" not in plain["sampling_params"]

    assert shaped["lora_path"] == "agentbolt-step-3"
    params = shaped["sampling_params"]
    assert isinstance(params["json_schema"], str)
    assert json.loads(params["json_schema"]) == schema
    assert params["sampling_seed"] == 11
    assert params["stop"] == ["\n\n"]
    assert params["logit_bias"] == {"36": -3.0}
    assert (params["temperature"], params["top_p"], params["presence_penalty"]) == (0.7, 0.9, 0.5)

    assert first.prompt_token_ids == SMOLLM2_QUESTION_IDS
    assert first.response_token_ids == [SMOLLM2_FOUR, SMOLLM2_IM_END]
    assert first.response_logprobs == [-0.0123, -0.0456]
    assert first.finish_reason == "stop"
    assert first.text == "4"
    assert first.extra == {"engine": "sglang", "cached_prompt_tokens": 25}
    assert first.model_version == "base"
    assert second.model_version == "step-3"


def test_sglang_json_object_is_sent_as_a_schema_string(encoder: PromptEncoder, token_map: dict[int, int]) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: a json_object
    response_format becomes the string ``{"type": "object"}``; a finish_reason of type length reads as length."""

    async def generate(request: httpx.Request) -> httpx.Response:
        response = sglang_response(token_map)
        response["meta_info"]["finish_reason"] = {"type": "length", "length": 2}
        return httpx.Response(200, json=response)

    engine = Engine({"/generate": generate})
    backend = backend_for("sglang", encoder, engine)
    request = GenerationRequest(messages=QUESTION, max_tokens=2, output_format=OutputFormat("json_object"))

    async def run() -> GenerationResult:
        try:
            return await backend.generate(request)
        finally:
            await backend.close()

    result = asyncio.run(run())
    (body,) = engine.bodies("/generate")
    assert body["sampling_params"]["json_schema"] == '{"type": "object"}'
    assert result.finish_reason == "length"


# ---------------------------------------------------------------------------- load_adapter


def test_vllm_load_adapter_posts_name_and_absolute_path_and_unloads_the_previous(
    encoder: PromptEncoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: a plain-text 200
    is success; the second load unloads the first adapter by name."""
    monkeypatch.chdir(tmp_path)
    engine = Engine(
        {
            "/v1/load_lora_adapter": answer(text="Success: LoRA adapter 'x' added successfully."),
            "/v1/unload_lora_adapter": answer(text="Success: LoRA adapter 'x' removed successfully."),
        }
    )
    backend = backend_for("vllm", encoder, engine)

    async def run() -> list[tuple[str | None, str]]:
        seen = []
        await backend.load_adapter(Path("adapters/step-1"), "step-1")  # a relative folder
        seen.append((backend.adapter, backend.model_version))
        await backend.load_adapter(tmp_path / "adapters" / "step-2", "step-2")
        seen.append((backend.adapter, backend.model_version))
        await backend.close()
        return seen

    seen = asyncio.run(run())
    assert seen == [("agentbolt-step-1", "step-1"), ("agentbolt-step-2", "step-2")]
    base = tmp_path.resolve() / "adapters"
    assert engine.calls == [
        ("/v1/load_lora_adapter", {"lora_name": "agentbolt-step-1", "lora_path": str(base / "step-1")}),
        ("/v1/load_lora_adapter", {"lora_name": "agentbolt-step-2", "lora_path": str(base / "step-2")}),
        ("/v1/unload_lora_adapter", {"lora_name": "agentbolt-step-1"}),
    ]
    assert os.path.isabs(engine.calls[0][1]["lora_path"])


def test_vllm_failed_unload_only_warns(
    encoder: PromptEncoder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: the unload answer
    404 (name not loaded) does not undo the new adapter."""
    not_found = load_fixture("vllm_load_lora.json")["error_examples"][1]
    engine = Engine(
        {
            "/v1/load_lora_adapter": answer(text="Success"),
            "/v1/unload_lora_adapter": answer(not_found["response_status"], json_body=not_found["response_body"]),
        }
    )
    backend = backend_for("vllm", encoder, engine)

    async def run() -> None:
        await backend.load_adapter(tmp_path / "a", "step-1")
        await backend.load_adapter(tmp_path / "b", "step-2")
        await backend.close()

    with caplog.at_level("WARNING", logger="agentbolt.inference.token_engines"):
        asyncio.run(run())
    assert (backend.adapter, backend.model_version) == ("agentbolt-step-2", "step-2")
    assert "did not unload adapter agentbolt-step-1" in caplog.text


@pytest.mark.parametrize("status", [404, 400])
def test_vllm_refused_load_names_the_route_and_the_env_var(encoder: PromptEncoder, tmp_path: Path, status: int) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: 404 is the route
    missing (VLLM_ALLOW_RUNTIME_LORA_UPDATING unset), 400 the recorded "already loaded" error."""
    already = load_fixture("vllm_load_lora.json")["error_examples"][0]
    routes: dict[str, Handler] = {}
    if status == 400:
        routes["/v1/load_lora_adapter"] = answer(400, json_body=already["response_body"])
    engine = Engine(routes)  # without the route, the fake engine answers 404 as vLLM does
    backend = backend_for("vllm", encoder, engine)

    async def run() -> None:
        try:
            await backend.load_adapter(tmp_path / "adapter", "step-1")
        finally:
            await backend.close()

    with pytest.raises(BackendError) as refused:
        asyncio.run(run())
    message = str(refused.value)
    assert "POST /v1/load_lora_adapter" in message
    assert f"answered {status}" in message
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in message
    if status == 400:
        assert "has already been loaded" in message
    assert (backend.adapter, backend.model_version) == (None, "base")
    assert [path for path, _ in engine.calls] == ["/v1/load_lora_adapter"]


def test_sglang_load_answering_success_false_is_refused(encoder: PromptEncoder, tmp_path: Path) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: SGLang's
    ``{"success": false, ...}`` is a refusal even under HTTP 200."""
    refusal = load_fixture("sglang_load_lora.json")["error_examples"][0]["response_body"]
    engine = Engine({"/load_lora_adapter": answer(200, json_body=refusal)})
    backend = backend_for("sglang", encoder, engine)

    async def run() -> None:
        try:
            await backend.load_adapter(tmp_path / "adapter", "step-1")
        finally:
            await backend.close()

    with pytest.raises(BackendError) as refused:
        asyncio.run(run())
    message = str(refused.value)
    assert "POST /load_lora_adapter answered 200" in message
    assert "LoRA is not enabled" in message
    assert "--enable-lora" in message
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in message
    assert (backend.adapter, backend.model_version) == (None, "base")
    assert engine.calls == [
        ("/load_lora_adapter", {"lora_name": "agentbolt-step-1", "lora_path": str((tmp_path / "adapter").resolve())})
    ]


def test_llamacpp_without_a_loader_cannot_load_an_adapter(encoder: PromptEncoder, tmp_path: Path) -> None:
    engine = Engine({})
    backend = backend_for("llamacpp", encoder, engine)

    async def run() -> None:
        try:
            await backend.load_adapter(tmp_path, "step-1")
        finally:
            await backend.close()

    with pytest.raises(BackendError, match="only at start"):
        asyncio.run(run())
    assert engine.calls == []


# ---------------------------------------------------------------------------- errors


def run_one(backend: TokenEngineBackend, request: GenerationRequest) -> GenerationResult:
    async def run() -> GenerationResult:
        try:
            return await backend.generate(request)
        finally:
            await backend.close()

    return asyncio.run(run())


def test_an_answer_without_token_ids_is_an_upstream_error(encoder: PromptEncoder, token_map: dict[int, int]) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server: without
    return_token_ids vLLM answers ``token_ids: null``."""
    response = vllm_response(token_map)
    response["choices"][0]["token_ids"] = None
    engine = Engine({"/v1/completions": answer(json_body=response)})
    backend = backend_for("vllm", encoder, engine)
    with pytest.raises(UpstreamError, match="return_token_ids"):
        run_one(backend, GenerationRequest(messages=QUESTION, max_tokens=16))
    assert backend.stats.requests == 0


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_logprobs_not_one_per_id_is_an_upstream_error(
    kind: str, encoder: PromptEncoder, token_map: dict[int, int]
) -> None:
    """Recorded payloads reconstructed from vLLM 0.34 / SGLang 0.5.23 source, not a running server, with one logprob
    dropped."""
    if kind == "vllm":
        response = vllm_response(token_map)
        response["choices"][0]["logprobs"]["token_logprobs"] = [-0.0123]
        routes = {"/v1/completions": answer(json_body=response)}
    else:
        response = sglang_response(token_map)
        del response["meta_info"]["output_token_logprobs"][1]
        routes = {"/generate": answer(json_body=response)}
    engine = Engine(routes)
    backend = backend_for(kind, encoder, engine)
    with pytest.raises(UpstreamError, match="returned 1 logprobs for 2 token ids"):
        run_one(backend, GenerationRequest(messages=QUESTION, max_tokens=16))
    assert (backend.stats.requests, backend.stats.generated_tokens) == (0, 0)


@pytest.mark.parametrize(
    ("status", "body", "error", "said"),
    [
        (
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 2048 tokens. However, you requested 2100 "
                    "tokens (2090 in the messages, 10 in the completion). Please reduce the length of the messages "
                    "or completion.",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            },
            ContextLengthExceededError,
            "refused the prompt as too long",
        ),
        (400, {"error": {"message": "top_p must be in (0, 1]", "code": 400}}, ConfigError, "refused the request (400)"),
        (500, {"error": {"message": "engine died", "code": 500}}, UpstreamError, "answered 500"),
    ],
)
def test_http_errors_map_to_backend_errors(
    encoder: PromptEncoder, status: int, body: dict[str, Any], error: type[Exception], said: str
) -> None:
    engine = Engine({"/v1/completions": answer(status, json_body=body)})
    backend = backend_for("vllm", encoder, engine)
    with pytest.raises(error) as raised:
        run_one(backend, GenerationRequest(messages=QUESTION, max_tokens=16))
    assert error is ContextLengthExceededError or not isinstance(raised.value, ContextLengthExceededError)
    assert said in str(raised.value)
    assert body["error"]["message"][:20] in str(raised.value)


def test_context_overflow_is_refused_before_any_request(encoder: PromptEncoder) -> None:
    engine = Engine({})
    backend = backend_for("vllm", encoder, engine, max_context_tokens=52)  # the prompt is 37 tokens
    with pytest.raises(ContextLengthExceededError) as refused:
        run_one(backend, GenerationRequest(messages=QUESTION, max_tokens=16))
    assert "37 tokens and max_tokens is 16" in str(refused.value)
    assert "52" in str(refused.value)
    assert engine.calls == []

    exact = Engine({"/v1/completions": answer(500, json_body={"error": "down"})})
    fits = backend_for("vllm", encoder, exact, max_context_tokens=53)  # 37 + 16 = 53 fits
    with pytest.raises(UpstreamError):
        run_one(fits, GenerationRequest(messages=QUESTION, max_tokens=16))
    assert len(exact.calls) == 1


@pytest.mark.parametrize("kind", ["llamacpp", "vllm", "sglang"])
@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("function", "calculate")])
def test_tool_choice_required_is_refused_without_a_request(
    encoder: PromptEncoder, kind: str, choice: ToolChoice
) -> None:
    engine = Engine({})
    backend = backend_for(kind, encoder, engine)
    tools = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]

    async def run() -> None:
        try:
            with pytest.raises(RequestRefused) as refused:
                await backend.generate(GenerationRequest(messages=QUESTION, tools=tools, tool_choice=choice))
            assert refused.value.param == "tool_choice"
            assert kind in str(refused.value)
            # the refusal left nothing in flight: a pause is entered at once
            async with asyncio.timeout(2):
                async with backend.paused():
                    pass
        finally:
            await backend.close()

    asyncio.run(run())
    assert engine.calls == []


# ---------------------------------------------------------------------------- llama.cpp


def test_llamacpp_payload_pins_the_sampler_chain() -> None:
    protocol = LlamaCppProtocol()
    ids = [1, 2, 3]
    sampled = protocol.payload(ids, GenerationRequest(messages=QUESTION, max_tokens=8, temperature=0.7), None)
    assert sampled["prompt"] == ids
    assert sampled["n_predict"] == 8
    assert sampled["samplers"] == ["temperature"]
    assert sampled["top_k"] == 0
    assert sampled["min_p"] == 0.0
    assert sampled["return_tokens"] is True
    assert sampled["cache_prompt"] is True
    assert sampled["post_sampling_probs"] is True
    assert sampled["n_probs"] == 1
    assert sampled["stream"] is False
    assert "stop" not in sampled and "json_schema" not in sampled

    nucleus = protocol.payload(ids, GenerationRequest(messages=QUESTION, temperature=0.7, top_p=0.9), None)
    assert nucleus["samplers"] == ["temperature", "top_p"]
    assert nucleus["top_p"] == 0.9

    greedy = protocol.payload(ids, GenerationRequest(messages=QUESTION, temperature=0.0), None)
    assert greedy["post_sampling_probs"] is False
    assert greedy["n_probs"] == 1
    # at T = 1 the plain softmax is the sampling distribution: no sort of the vocabulary after the chain
    plain = protocol.payload(ids, GenerationRequest(messages=QUESTION, temperature=1.0), None)
    assert plain["post_sampling_probs"] is False
    assert nucleus["post_sampling_probs"] is True

    rich = protocol.payload(
        ids,
        GenerationRequest(
            messages=QUESTION,
            logprobs=True,
            top_logprobs=5,
            frequency_penalty=0.5,
            logit_bias={7: 2.0},
            stop=("END",),
            stop_inclusive=("</tool_call>",),
            seed=3,
            output_format=OutputFormat("json_object"),
        ),
        None,
    )
    assert rich["n_probs"] == 5
    assert rich["samplers"] == ["penalties", "temperature"]
    assert rich["logit_bias"] == [[7, 2.0]]
    assert rich["stop"] == ["END", "</tool_call>"]
    assert rich["seed"] == 3
    assert rich["json_schema"] == {"type": "object"}


def test_llamacpp_parse_reads_probs_and_logprobs() -> None:
    protocol = LlamaCppProtocol()
    post_sampling = {
        "tokens": [10, 11, 12],
        "completion_probabilities": [
            {"id": 10, "prob": 0.5, "top_probs": [{"id": 10, "prob": 0.5}, {"id": 3, "prob": 0.25}]},
            {"id": 11, "prob": 0.25, "top_probs": []},
            {"id": 12, "prob": 0.0},
        ],
        "stop_type": "limit",
        "tokens_cached": 40,  # the slot's size after the answer: not a reuse count
        "timings": {"cache_n": 9, "prompt_n": 3},
    }
    parsed = protocol.parse(post_sampling, "llama")
    assert parsed.ids == [10, 11, 12]
    assert parsed.logprobs == [-0.6931471805599453, -1.3862943611198906, -math.inf]  # log(0.5), log(0.25), log(0)
    assert parsed.top == [[(10, -0.6931471805599453), (3, -1.3862943611198906)], [], []]
    assert parsed.finish_reason == "length"
    assert parsed.cached_prompt_tokens == 9
    assert parsed.stop_word is None

    greedy = {
        "tokens": [10, 2],
        "completion_probabilities": [
            {"id": 10, "logprob": -0.125, "top_logprobs": [{"id": 10, "logprob": -0.125}, {"id": 4, "logprob": -3.5}]},
            {"id": 2, "logprob": -0.75},
        ],
        "stop_type": "eos",
    }
    parsed = protocol.parse(greedy, "llama")
    assert parsed.ids == [10, 2]
    assert parsed.logprobs == [-0.125, -0.75]
    assert parsed.top == [[(10, -0.125), (4, -3.5)], []]
    assert parsed.finish_reason == "stop"
    assert parsed.cached_prompt_tokens == 0

    with pytest.raises(UpstreamError, match="return_tokens"):
        protocol.parse({"content": "hi", "completion_probabilities": []}, "llama")


def test_llamacpp_stop_word_cuts_the_ids_to_the_probabilities(encoder: PromptEncoder) -> None:
    """llama.cpp returns every id but probabilities only before the stop string: the ids are cut there, the text
    ends before the stop string, or with it when the stop string is inclusive."""
    hello, world, end = 19556, 905, 16317  # SmolLM2: "Hello", " world", "END"
    body = {
        "content": "Hello world",
        "tokens": [hello, world, end],
        "completion_probabilities": [{"id": hello, "prob": 0.5}, {"id": world, "prob": 0.25}],
        "stop_type": "word",
        "stopping_word": "END",
        "timings": {"cache_n": 30},
    }
    engine = Engine({"/completion": answer(json_body=body)})

    plain = run_one(
        backend_for("llamacpp", encoder, engine),
        GenerationRequest(messages=QUESTION, max_tokens=8, stop=("END",), logprobs=True),
    )
    assert plain.response_token_ids == [hello, world]
    assert plain.response_logprobs == [-0.6931471805599453, -1.3862943611198906]
    assert plain.text == "Hello world"
    assert plain.stop_sequence == "END"
    assert plain.finish_reason == "stop"
    assert plain.extra == {"engine": "llamacpp", "cached_prompt_tokens": 30}
    assert plain.token_logprobs is not None
    assert [e["token"] for e in plain.token_logprobs] == ["Hello", " world"]

    inclusive = run_one(
        backend_for("llamacpp", encoder, engine),
        GenerationRequest(messages=QUESTION, max_tokens=8, stop_inclusive=("END",)),
    )
    assert inclusive.response_token_ids == [hello, world]
    assert inclusive.text == "Hello worldEND"
    assert inclusive.stop_sequence == "END"

    path_and_stops = [(path, body["stop"], body["prompt"]) for path, body in engine.calls]
    assert path_and_stops == [
        ("/completion", ["END"], SMOLLM2_QUESTION_IDS),
        ("/completion", ["END"], SMOLLM2_QUESTION_IDS),
    ]


def test_llamacpp_an_id_without_a_probability_is_served_but_not_trained(encoder: PromptEncoder) -> None:
    """llama.cpp gives no probability for an id after which the text ends inside a UTF-8 character (its
    ``process_token`` skips it, llama.cpp server source): the answer is served whole, recorded without ids and
    logprobs, untrainable, with the reason; the probabilities of the other ids are still matched by id."""
    hello, world = 19556, 905  # SmolLM2: "Hello", " world"
    first_byte, second_byte = 163, 251  # two byte-level ids of one character (made up for the shape)
    body = {
        "content": "Hello world",
        "tokens": [hello, first_byte, second_byte, world],
        "completion_probabilities": [
            {"id": hello, "logprob": -0.5},
            {"id": second_byte, "logprob": -0.25},
            {"id": world, "logprob": -1.0},
        ],
        "stop_type": "limit",
        "tokens_predicted": 4,
    }
    parsed = LlamaCppProtocol().parse(body, "llama")
    assert parsed.ids == [hello, first_byte, second_byte, world]
    assert parsed.logprobs[0] == -0.5 and math.isnan(parsed.logprobs[1]) and parsed.logprobs[2:] == [-0.25, -1.0]
    assert parsed.unscored is not None and "1 of 4 generated ids" in parsed.unscored

    result = run_one(
        backend_for("llamacpp", encoder, Engine({"/completion": answer(json_body=body)})),
        GenerationRequest(messages=QUESTION, max_tokens=4, logprobs=True),
    )
    assert not result.trainable and result.response_token_ids == [] and result.response_logprobs == []
    assert result.num_completion_tokens == 4 and result.finish_reason == "length" and result.token_logprobs is None
    assert "no probability for 1 of 4 generated ids" in result.extra["not_trainable_reason"]

    # Streamed, llama.cpp never sends such an id: fewer ids than tokens_predicted is caught the same way.
    streamed = {**body, "tokens": [hello, second_byte, world], "stream": True}
    assert "streamed 3 of its 4 generated ids" in (LlamaCppProtocol().parse(streamed, "llama").unscored or "")
    with pytest.raises(UpstreamError, match="do not match"):
        LlamaCppProtocol().parse({**body, "tokens": [world, hello]}, "llama")


def test_llamacpp_stream_errors_are_named_and_the_engine_is_released(encoder: PromptEncoder) -> None:
    """Server-sent events in llama.cpp's streamed ``/completion`` shape: an ``error`` event midway and a stream that
    ends without its ``stop: true`` event both raise UpstreamError from the text and the result, after the pieces
    that came; the request no longer counts as in flight (a pause does not wait for it)."""
    hello, world = 19556, 905  # SmolLM2: "Hello", " world"

    def events(*chunks: dict[str, Any]) -> Handler:
        text = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks)

        async def handler(request: httpx.Request) -> httpx.Response:
            assert json.loads(request.content)["stream"] is True
            return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

        return handler

    first = {"content": "Hello", "tokens": [hello], "completion_probabilities": [{"id": hello, "logprob": -0.5}]}
    second = {"content": " world", "tokens": [world], "completion_probabilities": [{"id": world, "logprob": -1.0}]}
    last = {"content": "", "tokens": [], "stop": True, "stop_type": "limit", "tokens_predicted": 2}
    last["timings"] = {"cache_n": 7, "prompt_n": 23}

    async def run(handler: Handler) -> tuple[list[str], GenerationResult | BaseException, BaseException | None, int]:
        backend = backend_for("llamacpp", encoder, Engine({"/completion": handler}))
        pieces: list[str] = []
        stream = await backend.stream(GenerationRequest(messages=QUESTION, max_tokens=2))
        failed = None
        try:
            async for piece in stream.text_deltas():
                pieces.append(piece)
        except UpstreamError as exc:
            failed = exc
        try:
            outcome: GenerationResult | BaseException = await stream.result()
        except UpstreamError as exc:
            outcome = exc
        in_flight = backend._in_flight
        await backend.close()
        return pieces, outcome, failed, in_flight

    pieces, result, failed, in_flight = asyncio.run(run(events(first, second, last)))
    assert pieces == ["Hello", " world"] and failed is None and in_flight == 0
    assert isinstance(result, GenerationResult)
    assert result.response_token_ids == [hello, world] and result.response_logprobs == [-0.5, -1.0]
    assert result.text == "Hello world" and result.finish_reason == "length"
    assert result.extra["cached_prompt_tokens"] == 7

    broken = events(first, {"error": {"code": 500, "message": "slot failed", "type": "server_error"}})
    pieces, outcome, failed, in_flight = asyncio.run(run(broken))
    assert pieces == ["Hello"] and in_flight == 0
    assert isinstance(failed, UpstreamError) and "slot failed" in str(failed)
    assert isinstance(outcome, UpstreamError)

    pieces, outcome, failed, in_flight = asyncio.run(run(events(first, second)))
    assert pieces == ["Hello", " world"] and in_flight == 0
    assert isinstance(failed, UpstreamError) and "before its last event" in str(failed)

    # llama.cpp never streams an id after which the text ends inside a UTF-8 character: the result is untrainable,
    # its text is what was streamed (not a decoding of the ids that came), its token count the engine's.
    symbol = {"content": " ∨", "tokens": [world], "completion_probabilities": [{"id": world, "logprob": -1.0}]}
    last3 = {**last, "tokens_predicted": 3}
    pieces, outcome, failed, in_flight = asyncio.run(run(events(first, symbol, last3)))
    assert failed is None and in_flight == 0 and isinstance(outcome, GenerationResult)
    assert not outcome.trainable and outcome.text == "Hello ∨" == "".join(pieces)
    assert outcome.num_completion_tokens == 3 and "streamed 2 of its 3" in outcome.extra["not_trainable_reason"]


# ---------------------------------------------------------------------------- paused() and stats


def test_paused_holds_new_requests_and_waits_for_those_in_flight(
    encoder: PromptEncoder, token_map: dict[int, int]
) -> None:
    release = asyncio.Event()
    arrived = asyncio.Event()

    async def completions(request: httpx.Request) -> httpx.Response:
        arrived.set()
        await release.wait()
        return httpx.Response(200, json=vllm_response(token_map))

    engine = Engine({"/v1/completions": completions})
    backend = backend_for("vllm", encoder, engine)
    request = GenerationRequest(messages=QUESTION, max_tokens=16)

    async def run() -> None:
        try:
            # a pause waits for the request in flight
            in_flight = asyncio.create_task(backend.generate(request))
            await asyncio.wait_for(arrived.wait(), 5)
            entered = asyncio.Event()

            async def pause() -> None:
                async with backend.paused():
                    entered.set()
                    await asyncio.sleep(0)

            pausing = asyncio.create_task(pause())
            await asyncio.sleep(0.05)
            assert not entered.is_set()
            release.set()
            await asyncio.wait_for(pausing, 5)
            assert (await in_flight).response_token_ids == [SMOLLM2_FOUR, SMOLLM2_IM_END]

            # while paused, a new request waits; it goes once the block exits
            async with backend.paused():
                waiting = asyncio.create_task(backend.generate(request))
                await asyncio.sleep(0.05)
                assert not waiting.done()
                assert len(engine.calls) == 1
                async with backend.paused():  # re-entrant
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.02)
                assert not waiting.done()  # the inner block's exit does not open
            result = await asyncio.wait_for(waiting, 5)
            assert result.text == "4"
            assert len(engine.calls) == 2
        finally:
            await backend.close()

    asyncio.run(run())
    assert backend.stats.requests == 2
    assert backend.stats.generated_tokens == 4
    assert backend.stats.generation_s > 0


def test_a_request_released_by_one_pause_waits_for_the_next(encoder: PromptEncoder, token_map: dict[int, int]) -> None:
    """Two weight updates back to back (no await between the blocks): the request held by the first must not be sent
    while the second holds the pause."""
    engine = Engine({"/v1/completions": answer(json_body=vllm_response(token_map))})
    backend = backend_for("vllm", encoder, engine)
    request = GenerationRequest(messages=QUESTION, max_tokens=16)

    async def run() -> list[str]:
        try:
            async with backend.paused():
                waiting = asyncio.create_task(backend.generate(request))
                await asyncio.sleep(0.05)
            async with backend.paused():  # the next weight update, right away
                backend.set_model_version("step-2")
                await asyncio.sleep(0.05)
                sent_while_paused = len(engine.calls)
            result = await asyncio.wait_for(waiting, 5)
            return [str(sent_while_paused), result.model_version]
        finally:
            await backend.close()

    assert asyncio.run(run()) == ["0", "step-2"]


def test_a_closed_backend_refuses(encoder: PromptEncoder) -> None:
    engine = Engine({})
    backend = backend_for("sglang", encoder, engine)

    async def run() -> None:
        await backend.close()
        await backend.generate(GenerationRequest(messages=QUESTION))

    with pytest.raises(BackendError, match="closed"):
        asyncio.run(run())
    assert engine.calls == []


# ---------------------------------------------------------------------------- configuration


def test_inference_config_url_rules() -> None:
    with pytest.raises(ValidationError) as missing:
        TrainConfig(inference={"engine": "vllm"})
    assert "inference.url" in str(missing.value)
    assert missing.value.errors()[0]["loc"][0] == "inference"

    with pytest.raises(ValidationError, match="inference.url"):
        InferenceConfig(engine="sglang")
    with pytest.raises(ValidationError, match="leave inference.url unset"):
        InferenceConfig(engine="llamacpp", url="http://127.0.0.1:8080")
    with pytest.raises(ValidationError, match="embedded engine runs in the job's process"):
        InferenceConfig(engine="embedded", url="http://127.0.0.1:8080")

    assert InferenceConfig(engine="vllm", url="http://127.0.0.1:8000").url == "http://127.0.0.1:8000"
    with pytest.raises(ValidationError, match=r"use http://127.0.0.1:8000 instead of http://127.0.0.1:8000/v1/"):
        InferenceConfig(engine="vllm", url="http://127.0.0.1:8000/v1/")
    assert InferenceConfig(engine="llamacpp").url is None
    assert InferenceConfig().engine == "embedded"


def test_int8_quantization_is_for_the_embedded_engine_and_turns_on_truncated_importance_sampling() -> None:
    from agentbolt.algorithms.rl.trainer_config import TorchTrainerConfig
    from agentbolt.trainer.local import INT8_TIS_CAP, with_serving_tis

    assert InferenceConfig().quantization == "none"
    with pytest.raises(ValidationError, match="quantization applies to the embedded engine; llamacpp serves"):
        InferenceConfig(engine="llamacpp", quantization="int8")
    with pytest.raises(ValidationError, match="Input should be 'none' or 'int8'"):
        InferenceConfig(quantization="int4")  # type: ignore[arg-type]
    int8 = InferenceConfig(quantization="int8")
    assert with_serving_tis(TorchTrainerConfig(), int8).tis_cap == INT8_TIS_CAP == 2.0
    assert with_serving_tis(TorchTrainerConfig(tis_cap=5.0), int8).tis_cap == 5.0  # the caller's choice stays
    assert with_serving_tis(TorchTrainerConfig(tis_cap=None), int8).tis_cap == INT8_TIS_CAP  # as a dumped config
    assert with_serving_tis(TorchTrainerConfig(), InferenceConfig()).tis_cap is None
    assert with_serving_tis(TorchTrainerConfig(), None).tis_cap is None
    parsed = TrainConfig(inference={"quantization": "int8"}, torch_trainer={"kl_coef": 0.1})
    assert with_serving_tis(parsed.trainer_settings, parsed.inference).tis_cap == INT8_TIS_CAP


def test_an_answer_budget_the_engine_context_cannot_hold_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"grpo.max_tokens \(512\) leaves no room .* \(256 tokens per request\)"):
        TrainConfig(grpo={"max_tokens": 512}, inference={"engine": "llamacpp", "context_per_request": 256})
    fits = TrainConfig(grpo={"max_tokens": 128}, inference={"engine": "llamacpp", "context_per_request": 256})
    assert fits.inference.context_per_request == 256
    assert TrainConfig(grpo={"max_tokens": 8192}).grpo.max_tokens == 8192  # embedded: the model's own context


def test_trainer_verl_parses_but_is_refused() -> None:
    config = TrainConfig(trainer="verl")
    assert config.trainer == "verl"
    with pytest.raises(ConfigError, match="trainer: verl is not run by agentbolt train yet"):
        check_trainer(config)
    assert check_trainer(TrainConfig()) is None


def test_vllm_connect_checks_the_served_model_name(smollm2_dir: Path) -> None:
    """``connect`` asks vLLM's ``GET /v1/models`` (recorded shape) and refuses a name it does not serve."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        assert request.url.path == "/v1/models"
        return httpx.Response(200, json={"object": "list", "data": [{"id": "Qwen/Qwen2.5-0.5B-Instruct"}]})

    async def connect(name: str) -> TokenEngineBackend:
        return await TokenEngineBackend.connect(
            "vllm",
            "http://vllm.test",
            model_dir=smollm2_dir,
            model_name=name,
            max_context_tokens=2048,
            transport=httpx.MockTransport(handler),
        )

    with pytest.raises(ConfigError, match=r"does not serve 'smollm2'; it serves Qwen/Qwen2.5-0.5B-Instruct"):
        asyncio.run(connect("smollm2"))
    backend = asyncio.run(connect("Qwen/Qwen2.5-0.5B-Instruct"))
    assert backend.model_name == "Qwen/Qwen2.5-0.5B-Instruct"
    asyncio.run(backend.close())


def test_health_check_names_a_hung_engine_and_a_wrong_root(smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real sockets on 127.0.0.1: a server that accepts and never answers is named after the short health timeout
    (not the generation timeout); a server without ``/health`` (404) gets the hint that the URL must be the root."""
    monkeypatch.setattr(token_engines, "HEALTH_TIMEOUT_S", 0.5)

    async def connect_to(answer: bytes | None) -> BaseException:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            if answer is None:
                await asyncio.sleep(30)  # hung: the request is read, no answer comes
            writer.write(answer or b"")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        t0 = asyncio.get_running_loop().time()
        try:
            with pytest.raises(BackendError) as caught:
                await TokenEngineBackend.connect(
                    "sglang",
                    f"http://127.0.0.1:{port}",
                    model_dir=smollm2_dir,
                    model_name="m",
                    max_context_tokens=2048,
                    timeout_s=600.0,
                )
        finally:
            server.close()
        assert asyncio.get_running_loop().time() - t0 < 5.0
        return caught.value

    hung = asyncio.run(connect_to(None))
    assert "did not answer GET /health within 0.5 s" in str(hung)
    assert "hung" in str(hung)
    not_found = asyncio.run(connect_to(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"))
    assert "answered 404 to GET /health: inference.url must be the sglang server's root" in str(not_found)


def test_an_update_that_did_not_step_publishes_nothing() -> None:
    """``RLTrainer.swap_weights(changed=False)`` (the update skipped: no samples, every advantage 0) moves the version
    on without publishing: a llama.cpp engine is not restarted with an adapter equal to the one it serves."""
    from agentbolt.config import GRPOConfig
    from agentbolt.store.memory import InMemoryLightningStore
    from agentbolt.trainer.loop import RLTrainer

    class Backend:
        model_name = "m"
        model_version = "base"
        pauses = 0

        @contextlib.asynccontextmanager
        async def paused(self) -> AsyncIterator[None]:
            self.pauses += 1
            yield

        def set_model_version(self, version: str) -> None:
            self.model_version = version

    published: list[str] = []

    async def publish(version: str) -> None:
        published.append(version)

    backend = Backend()
    trainer = RLTrainer(
        InMemoryLightningStore(), backend, None, GRPOConfig(), gateway_url="http://x", publish_weights=publish
    )
    asyncio.run(trainer.swap_weights("step-1", changed=False))
    assert published == [] and backend.pauses == 0
    assert backend.model_version == "step-1" and trainer.versions == ["base", "step-1"]
    asyncio.run(trainer.swap_weights("step-2"))
    assert published == ["step-2"] and backend.pauses == 1
    assert backend.model_version == "step-2" and trainer.versions == ["base", "step-1", "step-2"]
