"""``inference.quantization: int8`` end to end on SmolLM2-135M (the embedded model, a SQLite store, the real server
and a runner process): the served model's RMSNorm-fed linears calibrate on the first served rows and then run in
int8 (:mod:`agentbolt.inference.int8_linear`), the job turns truncated importance sampling on, one training step
trains on what int8 served, and the next request is served from weights quantized again after the update (a changed
greedy logprob)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from agentbolt.config import GRPOConfig
from agentbolt.inference.base import GenerationRequest

pytestmark = pytest.mark.slow
AGENT = "tests.integration.two_call_agent:two_call_agent"
TASKS = [{"task_id": "color", "question": "Name a color."}, {"task_id": "fruit", "question": "Name a fruit."}]
LONG = [{"role": "user", "content": "Describe, in many words, how a river carves a canyon over a million years. " * 6}]


def test_a_training_step_serves_int8_and_the_update_is_quantized_again(
    tmp_path: Path, smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    from agentbolt.algorithms.rl.trainer_config import TorchTrainerConfig
    from agentbolt.inference import int8_linear
    from agentbolt.trainer.job_config import InferenceConfig
    from agentbolt.trainer.local import INT8_TIS_CAP, LocalMachine, local_training

    if not int8_linear.available():
        pytest.skip("no int8 engine (fbgemm/x86) in this torch")
    monkeypatch.setattr(int8_linear, "CALIBRATION_ROWS", 64)  # the output projection sees one row per decode step
    grpo = GRPOConfig(steps=1, tasks_per_step=2, group_size=2, max_tokens=6, advantage_estimator="rloo")
    machine = LocalMachine(
        model=smollm2_dir,
        agent=AGENT,
        runner_processes=1,
        runner_concurrency=4,
        inference=InferenceConfig(quantization="int8"),
    )
    probe = GenerationRequest(messages=LONG, max_tokens=1, temperature=0)

    async def scenario():
        async with local_training(
            machine, db_path=tmp_path / "store.db", grpo=grpo, trainer_config=TorchTrainerConfig(learning_rate=5e-3)
        ) as local:
            backend = local.trainer.backend
            model = backend.model
            marked = [m for m in model.modules() if int8_linear.is_marked(m)]
            for _ in range(3):  # prefill rows calibrate q..up; the decode rows, the output projection
                await backend.generate(GenerationRequest(messages=LONG, max_tokens=24, temperature=1.0))
            calibrated = [int8_linear._states[m].packed is not None for m in marked]
            before = await backend.generate(probe)
            q_proj = next(m for n, m in model.named_modules() if n.endswith("layers.0.self_attn.q_proj"))
            packed_before = int8_linear._states[q_proj].packed
            result = await local.trainer.train_step(1, TASKS)
            after = await backend.generate(probe)
            packed_after = int8_linear._states[q_proj].packed
            return (
                model.config.num_hidden_layers,
                len(marked),
                calibrated,
                local.trainer.updater.config.tis_cap,
                before,
                result,
                after,
                packed_before,
                packed_after,
            )

    layers, n_marked, calibrated, tis_cap, before, result, after, packed_before, packed_after = asyncio.run(scenario())
    assert n_marked == 6 * layers + 1  # q, k, v, o, gate, up per layer, and the output projection
    assert all(calibrated)
    assert tis_cap == INT8_TIS_CAP  # not set by the caller: on with int8 serving
    assert result.n_rollouts == 4 and result.n_failed == 0 and result.n_transitions > 0
    # with truncated importance sampling approx_kl is 0 by construction; sampling_kl is int8 serving against the
    # trainer's logprobs at step start
    assert result.update_stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    kl = result.update_stats["sampling_kl"]
    assert math.isfinite(kl) and 0 < kl < 0.05, kl
    assert packed_after is not packed_before  # the update changed the served weights: quantized again
    assert before.response_token_ids and after.response_token_ids
    assert after.model_version != before.model_version
    assert not torch.isclose(torch.tensor(after.response_logprobs[0]), torch.tensor(before.response_logprobs[0]))
