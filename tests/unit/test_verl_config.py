"""VerlTrainerConfig: verl's divisibility rules and its hydra overrides (hand-checked cases, no verl)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentbolt.algorithms.rl.verl.config import VerlTrainerConfig


def make(**changes: object) -> VerlTrainerConfig:
    return VerlTrainerConfig.model_validate({"model_path": "Qwen/Qwen2.5-0.5B-Instruct", **changes})


def test_defaults_satisfy_every_rule() -> None:
    config = make()
    # 64 prompts * 8 samples = 512 sequences over 8 GPUs; mini-batch 16 * 8 = 128 -> 16 per GPU, 4 micro-batches of 4.
    assert config.sequences_per_step == 512
    assert config.n_rollout_replicas == 4
    assert config.optimizer_steps_per_batch == 4
    assert config.loss_agg_mode == "token-mean"
    assert make(loss_aggregation="sequence_mean").loss_agg_mode == "seq-mean-token-mean"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tensor_model_parallel_size": 3}, r"tensor_model_parallel_size 3 must divide n_gpus_per_node 8.*e\.g\. 2"),
        # 6 prompts * 5 samples = 30 sequences; 30 % 8 = 6.
        ({"train_batch_size": 6, "rollout_n": 5, "ppo_mini_batch_size": 6}, r"= 30 sequences must be divisible by"),
        ({"train_batch_size": 8, "ppo_mini_batch_size": 16}, r"ppo_mini_batch_size 16 must be <= train_batch_size 8"),
        ({"train_batch_size": 48, "ppo_mini_batch_size": 32}, r"48 must be a multiple of ppo_mini_batch_size 32"),
        # mini 3 * 8 = 24 sequences over 16 GPUs: 24 % 16 = 8 (the batch 12 * 8 = 96 = 6 * 16 passes).
        (
            {"n_gpus_per_node": 16, "train_batch_size": 12, "ppo_mini_batch_size": 3},
            r"ppo_mini_batch_size \* rollout_n = 24 sequences per optimizer step must be divisible by",
        ),
        # 16 * 8 / 8 = 16 sequences per GPU per optimizer step; 16 % 5 = 1.
        ({"ppo_micro_batch_size_per_gpu": 5}, r"each GPU gets 16 sequences.*use a divisor of 16"),
        ({"loss_aggregation": "rollout_mean"}, r"'rollout_mean' has no verl counterpart"),
        ({"gpu_memory_utilization": 1.5}, r"less than or equal to 1"),
        ({"clip_ratio_c": 1.0}, r"greater than 1"),
        ({"unknown_knob": 1}, r"Extra inputs are not permitted"),
    ],
)
def test_rules_say_what_to_change(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        make(**changes)


def test_config_is_frozen_and_round_trips() -> None:
    config = make(kl_coef=0.01, lora_rank=32)
    with pytest.raises(ValidationError):
        config.rollout_n = 4  # type: ignore[misc]
    assert VerlTrainerConfig.model_validate_json(config.model_dump_json()) == config


def test_overrides_for_the_default_recipe() -> None:
    assert make().to_overrides() == [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        "data.train_batch_size=64",
        "data.max_prompt_length=1024",
        "data.max_response_length=2048",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.actor.optim.lr=1e-06",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.clip_ratio_c=3.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=8",
    ]


def test_overrides_add_kl_lora_and_quote_odd_paths() -> None:
    overrides = make(model_path="/models/my model=v2", kl_coef=0.001, kl_estimator="k1", lora_rank=16).to_overrides()
    assert "actor_rollout_ref.model.path='/models/my model=v2'" in overrides
    assert "actor_rollout_ref.model.lora_rank=16" in overrides
    assert "actor_rollout_ref.model.lora_alpha=16" in overrides
    assert "actor_rollout_ref.actor.use_kl_loss=true" in overrides
    assert "actor_rollout_ref.actor.kl_loss_coef=0.001" in overrides
    assert "actor_rollout_ref.actor.kl_loss_type=k1" in overrides
    assert "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8" in overrides
