"""The llama.cpp engine for real: ``llama-server`` built from source (``scripts/build_llama_cpp.sh``, run by
``.ci/run``), SmolLM2-135M converted to GGUF by llama.cpp's own converter, served token-in/token-out.

Pinned:
- the gateway's backend sends the prompt as ids and records the ids llama.cpp generated (the end-of-turn id
  included) with one logprob each, and those logprobs are the model's tempered distribution: within bf16 noise of
  a float32 torch forward over the same ids, at T = 1 and T = 0.7;
- a stop string ends the answer; the ids end before it (llama.cpp gives no probabilities for its tokens);
- a one-step training run (``local_training`` with ``inference.engine: llamacpp``, the job's own path): after the
  update the server is restarted with the new LoRA adapter (converted by ``convert_lora_to_gguf.py``), and the
  same prompt's first-token logprob changes, to the one the trained policy (base + saved adapter, torch) gives.

Skipped when llama.cpp is not built here, unless ``AGENTBOLT_REQUIRE_LLAMA_CPP=1`` (set by ``.ci/run``, which builds
it): then a missing build fails.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from agentbolt.config import GRPOConfig
from agentbolt.errors import ConfigError
from agentbolt.inference.base import GenerationRequest, GenerationResult

pytestmark = pytest.mark.slow

AGENT = "tests.integration.two_call_agent:two_call_agent"
TASKS = [{"task_id": "color", "question": "Name a color."}, {"task_id": "fruit", "question": "Name a fruit."}]
QUESTION = [{"role": "user", "content": "What is 2+2? Answer briefly."}]


@pytest.fixture(scope="module")
def llama_cpp() -> None:
    from agentbolt.inference.llamacpp import LlamaCppTools

    try:
        LlamaCppTools.find()
    except ConfigError as exc:
        if os.environ.get("AGENTBOLT_REQUIRE_LLAMA_CPP") == "1":
            pytest.fail(f"AGENTBOLT_REQUIRE_LLAMA_CPP=1 but {exc}")
        pytest.skip(str(exc))


def _torch_logprobs(
    model_dir: Path, ids: list[int], n_prompt: int, temperature: float, adapter: Path | None = None
) -> list[float]:
    """log_softmax(logits / T) of a float32 forward at each generated id (one per id after the prompt)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    chosen = torch.tensor(ids[n_prompt:])[:, None]
    return torch.log_softmax(logits[n_prompt - 1 : -1] / temperature, -1).gather(1, chosen)[:, 0].tolist()


async def _serve(model_dir: Path, tmp_path: Path) -> tuple[Any, Any]:
    """A ``llama-server`` with two slots of 1024 tokens and the token engine backend on it (closing the backend
    stops the server)."""
    from agentbolt.inference.llamacpp import start_llama_server
    from agentbolt.inference.token_engines import TokenEngineBackend

    server = await start_llama_server(
        model_dir, tmp_path / "engine", gguf_cache_dir=tmp_path / "gguf", parallel=2, context_per_slot=1024
    )
    backend = await TokenEngineBackend.connect(
        "llamacpp",
        server.url,
        model_dir=model_dir,
        model_name="smollm2",
        max_context_tokens=1024,
        on_close=server.stop,
    )
    return server, backend


def test_ids_and_logprobs_are_the_engines_and_match_a_torch_forward(
    llama_cpp: None, smollm2_dir: Path, tmp_path: Path
) -> None:

    first_cached: list[int] = []

    async def scenario() -> list[tuple[float, object]]:
        server, backend = await _serve(smollm2_dir, tmp_path)
        try:
            out: list[tuple[float, object]] = []
            for temperature in (1.0, 0.7):
                # a sampled id can end inside a UTF-8 character: llama.cpp does not score it, the answer is served
                # unscored with that cause named, and the next seed is tried
                for seed in range(1, 7):
                    request = GenerationRequest(
                        messages=QUESTION, max_tokens=24, temperature=temperature, logprobs=True, seed=seed
                    )
                    result = await backend.generate(request)
                    first_cached.append(result.extra["cached_prompt_tokens"])
                    if result.trainable:
                        break
                    assert "UTF-8" in str(result.extra.get("not_trainable_reason")), result.extra
                out.append((temperature, result))
            stopped = await backend.generate(
                GenerationRequest(
                    messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
                    max_tokens=40,
                    temperature=0,
                    stop=(", 4,",),
                )
            )
            out.append((-1.0, stopped))
            return out
        finally:
            await backend.close()
            assert server._process is None  # closing the backend stopped the server it started

    results = asyncio.run(scenario())
    from agentbolt.inference.prompt_encoding import PromptEncoder

    encoder = PromptEncoder.from_model_dir(smollm2_dir)
    # a fresh server reused nothing for its first prompt (llama.cpp's timings.cache_n, not its slot size)
    assert first_cached[0] == 0
    for temperature, result in results[:2]:
        assert result.prompt_token_ids == encoder.encode_prompt(QUESTION)  # the ids we rendered are the ids it ran
        ids = result.response_token_ids
        assert ids and len(result.response_logprobs) == len(ids)
        if result.finish_reason == "stop":
            assert ids[-1] in encoder.stop_token_ids  # the end-of-turn id is recorded, as the embedded backend does
        n_prompt = len(result.prompt_token_ids)
        reference = _torch_logprobs(smollm2_dir, result.prompt_token_ids + ids, n_prompt, temperature)
        diffs = [abs(a - b) for a, b in zip(result.response_logprobs, reference, strict=True)]
        # measured: max 0.041 (T=1) and 0.048 (T=0.7), mean signed 0.006: the bf16 GGUF against a float32 forward
        assert max(diffs) < 0.15 and sum(diffs) / len(diffs) < 0.05, (temperature, diffs)
        shown = len(ids) - (1 if result.finish_reason == "stop" else 0)  # the end-of-turn id is not text
        assert result.token_logprobs is not None and len(result.token_logprobs) == shown
    stopped = results[2][1]
    assert stopped.text == "1, 2, 3" and stopped.stop_sequence == ", 4," and stopped.finish_reason == "stop"
    assert encoder.decode(stopped.response_token_ids) == "1, 2, 3"


def test_streaming_sends_text_as_generated_and_records_every_id(
    llama_cpp: None, smollm2_dir: Path, tmp_path: Path
) -> None:
    """``stream``: llama.cpp's streamed ``/completion``, one event per id. The text arrives in pieces that join to the
    result's text; the ids and logprobs are the engine's (against a float32 torch forward); a stop string's ids are
    streamed with their probabilities, so they are recorded while the text ends before it; a cancelled stream
    returns what was generated, ``abort``."""
    from agentbolt.inference.token_engines import TokenEngineBackend

    async def collect(
        backend: TokenEngineBackend, request: GenerationRequest, cancel_after: int | None = None
    ) -> tuple[list[str], GenerationResult]:
        stream = await backend.stream(request)
        pieces: list[str] = []
        async for piece in stream.text_deltas():
            pieces.append(piece)
            if cancel_after is not None and len(pieces) == cancel_after:
                stream.cancel()
        return pieces, await stream.result()

    async def scenario() -> list[tuple[list[str], GenerationResult]]:
        server, backend = await _serve(smollm2_dir, tmp_path)
        try:
            count = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
            story = [{"role": "user", "content": "Tell me a long story about a dragon."}]
            # At T = 1 a sampled id can end inside a UTF-8 character; llama.cpp neither streams nor scores it, so
            # that answer is served unscored with the cause named (checked here) and the next seed is tried.
            for seed in range(1, 7):
                sampled = await collect(
                    backend, GenerationRequest(messages=QUESTION, max_tokens=24, temperature=1.0, seed=seed)
                )
                if sampled[1].trainable:
                    break
                assert "UTF-8" in str(sampled[1].extra.get("not_trainable_reason")), sampled[1].extra
                assert "".join(sampled[0]) == sampled[1].text and sampled[1].response_token_ids == []
            return [
                sampled,
                await collect(backend, GenerationRequest(messages=count, max_tokens=40, temperature=0, stop=(", 4,",))),
                await collect(
                    backend, GenerationRequest(messages=story, max_tokens=200, temperature=0), cancel_after=3
                ),
            ]
        finally:
            await backend.close()

    (pieces, result), (stop_pieces, stopped), (cut_pieces, cut) = asyncio.run(scenario())
    assert result.trainable, "six sampled answers in a row were unscored"
    assert len(pieces) > 1 and "".join(pieces) == result.text
    ids = result.response_token_ids
    n_prompt = len(result.prompt_token_ids)
    reference = _torch_logprobs(smollm2_dir, result.prompt_token_ids + ids, n_prompt, 1.0)
    diffs = [abs(a - b) for a, b in zip(result.response_logprobs, reference, strict=True)]
    assert max(diffs) < 0.15 and sum(diffs) / len(diffs) < 0.05, diffs

    from agentbolt.inference.prompt_encoding import PromptEncoder

    encoder = PromptEncoder.from_model_dir(smollm2_dir)
    assert stopped.text == "1, 2, 3" and "".join(stop_pieces) == "1, 2, 3"
    assert stopped.stop_sequence == ", 4," and stopped.finish_reason == "stop"
    streamed_ids = stopped.response_token_ids
    assert encoder.decode(streamed_ids).startswith("1, 2, 3, 4")  # the stop string's ids are recorded too
    assert len(stopped.response_logprobs) == len(streamed_ids)

    assert cut.finish_reason == "abort" and len(cut_pieces) >= 3
    assert 3 <= len(cut.response_token_ids) < 200
    assert len(cut.response_logprobs) == len(cut.response_token_ids)


def test_one_training_step_is_served_with_the_new_adapter(
    llama_cpp: None, smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentbolt.algorithms.rl.trainer_config import TorchTrainerConfig
    from agentbolt.inference.llamacpp import LLAMA_CPP_ENV, default_llama_cpp_dir
    from agentbolt.trainer.job_config import InferenceConfig
    from agentbolt.trainer.local import LocalMachine, local_training

    monkeypatch.setenv(LLAMA_CPP_ENV, str(default_llama_cpp_dir()))
    monkeypatch.setenv("AGENTBOLT_CACHE", str(smollm2_dir.parent.parent))  # the GGUF goes beside the test's model
    grpo = GRPOConfig(steps=1, tasks_per_step=2, group_size=2, max_tokens=6, advantage_estimator="rloo")
    machine = LocalMachine(
        model=smollm2_dir,
        agent=AGENT,
        runner_processes=1,
        runner_concurrency=4,
        inference=InferenceConfig(engine="llamacpp", parallel=4, context_per_request=1024),
    )
    trainer_config = TorchTrainerConfig(learning_rate=2e-3)
    probe = GenerationRequest(messages=QUESTION, max_tokens=1, temperature=0)  # greedy: a plain softmax logprob

    async def scenario():
        async with local_training(
            machine, db_path=tmp_path / "out" / "store.db", grpo=grpo, trainer_config=trainer_config
        ) as local:
            backend = local.trainer.backend
            before = await backend.generate(probe)
            result = await local.trainer.train_step(1, TASKS)
            after = await backend.generate(probe)
            return before, result, after, backend.model_version

    before, result, after, version = asyncio.run(scenario())
    assert result.n_rollouts == 4 and result.n_transitions > 0
    # A sampled id that ends inside a UTF-8 character gets no probability from llama.cpp: such a call is served but
    # not trained (engine_protocols), so at temperature 1 a rollout can now and then have no trainable call (seen
    # once in CI-like runs: 1 of 4). Any other failure is a defect.
    assert set(result.causes) <= {"no_trainable_call"}, result.cause_details
    assert result.n_failed <= 1, result.cause_details
    assert version == "step-1" and after.model_version == "step-1" and before.model_version == "base"
    approx_kl = result.update_stats.get("approx_kl")
    print(f"llama.cpp engine: approx_kl at step start {approx_kl}")  # serving vs training logprobs
    assert approx_kl is not None and abs(approx_kl) < 0.05
    adapter = tmp_path / "out" / "engine" / "adapters" / "step-1"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert (tmp_path / "out" / "engine" / "adapters" / "step-1.gguf").is_file()

    n = len(before.prompt_token_ids)
    assert after.prompt_token_ids == before.prompt_token_ids
    [base] = _torch_logprobs(smollm2_dir, after.prompt_token_ids + after.response_token_ids, n, 1.0)
    [trained] = _torch_logprobs(smollm2_dir, after.prompt_token_ids + after.response_token_ids, n, 1.0, adapter)
    [base_before] = _torch_logprobs(smollm2_dir, before.prompt_token_ids + before.response_token_ids, n, 1.0)
    assert abs(before.response_logprobs[0] - base_before) < 0.05  # before the update: the base weights
    assert abs(trained - base) > 0.02, (base, trained)  # the update moved this logprob...
    # ...and it is served: llama.cpp rounds each matmul's input to bf16 (the dot product of its bf16 weights) where
    # this float32 reference does not, and the gap grows with the move (seen once: served -2.074, torch -2.010 after a
    # move of 2.17 from -4.18)
    served = after.response_logprobs[0]
    assert abs(served - trained) < 0.05 + 0.05 * abs(trained - base), (after.response_logprobs, trained, base)
    # nearer the trained policy than the base one by 2x: llama.cpp's bf16 noise (~0.02) against a move that can be
    # small (seen: served -1.591, trained -1.612, base -1.528: 76% of a 0.083 move, which a 4x bound refused)
    assert abs(served - trained) < abs(served - base) / 2, (after.response_logprobs, trained, base)
