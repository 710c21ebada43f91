"""``VerlTrainerConfig``: the verl backend on one multi-GPU node, checked before anything starts. Pure, no verl.

The recipe is verl's single-node run: ``python3 -m verl.trainer.main_ppo`` with hydra overrides over
``verl/trainer/config/ppo_trainer.yaml``, an FSDP actor and vLLM rollout replicas colocated on the same GPUs
(hybrid engine), ``trainer.nnodes=1``. :meth:`VerlTrainerConfig.to_overrides` writes those overrides; with verl
0.9.1 installed (CPU only, no GPU), the default overrides compose against that yaml and pass verl's own
``verl/utils/config.py`` ``validate_config``.

Batch sizes follow verl's units: ``train_batch_size`` and ``ppo_mini_batch_size`` count **prompts** (tasks);
verl multiplies both by ``rollout_n`` to get sequences. ``ppo_micro_batch_size_per_gpu`` counts sequences.
"""

from __future__ import annotations

import re
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentbolt.algorithms.rl.losses import Aggregation, KLEstimator

VERL_LOSS_AGG_MODES: Final[dict[str, str]] = {"token_mean": "token-mean", "sequence_mean": "seq-mean-token-mean"}
"""Our loss aggregation names -> verl's ``actor.loss_agg_mode`` (verl ``trainer/ppo/core_algos.py`` ``agg_loss``).
``rollout_mean`` has no verl counterpart."""

_PLAIN_VALUE = re.compile(r"^[A-Za-z0-9_./~+:-]+$")


def _hydra_value(value: str | int | float | bool) -> str:
    """One override value: booleans as ``true``/``false``, floats by ``repr`` (``1e-06``), strings quoted when they
    hold characters hydra's override grammar treats specially (spaces, ``=``, ``,``, brackets, quotes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if _PLAIN_VALUE.match(value):
        return value
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


class VerlTrainerConfig(BaseModel):
    """Settings of the ``verl`` trainer backend on one node (frozen; round-trips through YAML/JSON).

    Attributes:
        model_path: Hugging Face id or local directory of the policy (``actor_rollout_ref.model.path``).
        n_gpus_per_node: GPUs of the node, shared by the FSDP actor and the vLLM rollout (``trainer.n_gpus_per_node``).
        tensor_model_parallel_size: vLLM tensor parallelism per rollout replica; the node runs
            ``n_gpus_per_node / tensor_model_parallel_size`` replicas (``rollout.tensor_model_parallel_size``).
        train_batch_size: prompts (tasks) per training step (``data.train_batch_size``).
        rollout_n: samples per prompt, the GRPO group size (``rollout.n``).
        ppo_mini_batch_size: prompts per optimizer step; ``train_batch_size / ppo_mini_batch_size`` steps per batch
            and epoch (``actor.ppo_mini_batch_size``).
        ppo_micro_batch_size_per_gpu: sequences per forward/backward on one GPU (gradient accumulation unit).
        log_prob_micro_batch_size_per_gpu: sequences per no-grad log-prob forward on one GPU (rollout and, with a KL
            loss, reference); verl refuses to start without it.
        ppo_epochs: passes over each batch.
        max_prompt_length / max_response_length: token widths ``P`` / ``R`` of verl's padded batch; a merged
            sample's response includes its tool tokens, so size ``R`` for whole multi-call trajectories.
        learning_rate: actor AdamW learning rate (``actor.optim.lr``; verl's default 1e-6 is for full fine-tuning).
        clip_low / clip_high: PPO-clip bounds ``[1 - clip_low, 1 + clip_high]`` (DAPO clip-higher defaults,
            arXiv:2503.14476); ``clip_ratio_c``: dual-clip bound for negative advantages (Ye et al. 2020,
            arXiv:1912.09729), > 1.
        loss_aggregation: ``token_mean`` or ``sequence_mean`` (mapped by :data:`VERL_LOSS_AGG_MODES`).
        kl_coef / kl_estimator: KL-to-reference loss weight (0 = off, no reference model) and estimator (verl
            accepts ``k1``/``k3`` as ``kl_loss_type``).
        entropy_coeff: entropy bonus weight (0 = off).
        temperature: rollout sampling temperature; verl's actor divides the logits by it when recomputing logprobs.
        gpu_memory_utilization: fraction of each GPU vLLM may take (weights + KV cache), in (0, 1].
        enable_gradient_checkpointing: recompute activations in the actor backward.
        lora_rank / lora_alpha: LoRA adapter (0 = full fine-tuning).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: str = Field(min_length=1)
    n_gpus_per_node: int = Field(default=8, ge=1)
    tensor_model_parallel_size: int = Field(default=2, ge=1)
    train_batch_size: int = Field(default=64, ge=1)
    rollout_n: int = Field(default=8, ge=1)
    ppo_mini_batch_size: int = Field(default=16, ge=1)
    ppo_micro_batch_size_per_gpu: int = Field(default=4, ge=1)
    log_prob_micro_batch_size_per_gpu: int = Field(default=8, ge=1)
    ppo_epochs: int = Field(default=1, ge=1)
    max_prompt_length: int = Field(default=1024, ge=1)
    max_response_length: int = Field(default=2048, ge=1)
    learning_rate: float = Field(default=1e-6, gt=0)
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.28, ge=0)
    clip_ratio_c: float = Field(default=3.0, gt=1)
    loss_aggregation: Aggregation = "token_mean"
    kl_coef: float = Field(default=0.0, ge=0)
    kl_estimator: KLEstimator = "k3"
    entropy_coeff: float = Field(default=0.0, ge=0)
    temperature: float = Field(default=1.0, gt=0)
    gpu_memory_utilization: float = Field(default=0.6, gt=0, le=1)
    enable_gradient_checkpointing: bool = True
    lora_rank: int = Field(default=0, ge=0)
    lora_alpha: int = Field(default=16, ge=1)
    rollout_name: Literal["vllm"] = "vllm"

    @model_validator(mode="after")
    def _check_verl_rules(self) -> VerlTrainerConfig:
        if self.loss_aggregation not in VERL_LOSS_AGG_MODES:
            raise ValueError(
                f"loss_aggregation {self.loss_aggregation!r} has no verl counterpart; use one of "
                f"{sorted(VERL_LOSS_AGG_MODES)} with the verl backend, or the torch backend for rollout_mean"
            )
        gpus, tp = self.n_gpus_per_node, self.tensor_model_parallel_size
        if gpus % tp:
            raise ValueError(
                f"tensor_model_parallel_size {tp} must divide n_gpus_per_node {gpus} (each vLLM replica takes {tp} "
                f"GPUs of the node); use a divisor of {gpus}, e.g. {max(d for d in range(1, tp + 1) if gpus % d == 0)}"
            )
        sequences = self.train_batch_size * self.rollout_n
        if sequences % gpus:
            raise ValueError(
                f"train_batch_size * rollout_n = {self.train_batch_size} * {self.rollout_n} = {sequences} sequences "
                f"must be divisible by n_gpus_per_node {gpus} (verl splits each batch evenly over the GPUs; verl "
                "utils/config.py validate_config); change train_batch_size or rollout_n"
            )
        if self.ppo_mini_batch_size > self.train_batch_size:
            raise ValueError(
                f"ppo_mini_batch_size {self.ppo_mini_batch_size} must be <= train_batch_size {self.train_batch_size} "
                "(verl workers/config/actor.py ActorConfig.validate); lower ppo_mini_batch_size"
            )
        if self.train_batch_size % self.ppo_mini_batch_size:
            raise ValueError(
                f"train_batch_size {self.train_batch_size} must be a multiple of ppo_mini_batch_size "
                f"{self.ppo_mini_batch_size}, or the last optimizer step of each batch sees fewer prompts; "
                "make ppo_mini_batch_size a divisor of train_batch_size"
            )
        mini_sequences = self.ppo_mini_batch_size * self.rollout_n
        if mini_sequences % gpus:
            raise ValueError(
                f"ppo_mini_batch_size * rollout_n = {mini_sequences} sequences per optimizer step must be divisible "
                f"by n_gpus_per_node {gpus} (each GPU takes an equal share); change ppo_mini_batch_size"
            )
        per_gpu = mini_sequences // gpus
        if per_gpu % self.ppo_micro_batch_size_per_gpu:
            raise ValueError(
                f"each GPU gets {per_gpu} sequences per optimizer step (ppo_mini_batch_size * rollout_n / "
                f"n_gpus_per_node), which must be a multiple of ppo_micro_batch_size_per_gpu "
                f"{self.ppo_micro_batch_size_per_gpu} (verl fsdp actor normalization); use a divisor of {per_gpu}"
            )
        return self

    @property
    def loss_agg_mode(self) -> str:
        """verl's name of :attr:`loss_aggregation`."""
        return VERL_LOSS_AGG_MODES[self.loss_aggregation]

    @property
    def n_rollout_replicas(self) -> int:
        """vLLM replicas on the node: ``n_gpus_per_node / tensor_model_parallel_size``."""
        return self.n_gpus_per_node // self.tensor_model_parallel_size

    @property
    def sequences_per_step(self) -> int:
        """Sequences per training step: ``train_batch_size * rollout_n``."""
        return self.train_batch_size * self.rollout_n

    @property
    def optimizer_steps_per_batch(self) -> int:
        """``ppo_epochs * train_batch_size / ppo_mini_batch_size``."""
        return self.ppo_epochs * self.train_batch_size // self.ppo_mini_batch_size

    def to_overrides(self) -> list[str]:
        """Hydra ``key=value`` overrides of verl's ``ppo_trainer`` config for this recipe, in a fixed order.

        ``algorithm.adv_estimator=grpo`` keeps verl from building a critic (agentbolt computes the advantages);
        the reference model is configured only when ``kl_coef > 0``.
        """
        actor = "actor_rollout_ref.actor"
        rollout = "actor_rollout_ref.rollout"
        model = "actor_rollout_ref.model"
        values: list[tuple[str, str | int | float | bool]] = [
            ("algorithm.adv_estimator", "grpo"),
            ("algorithm.use_kl_in_reward", False),
            ("data.train_batch_size", self.train_batch_size),
            ("data.max_prompt_length", self.max_prompt_length),
            ("data.max_response_length", self.max_response_length),
            (f"{model}.path", self.model_path),
            (f"{model}.use_remove_padding", True),
            (f"{model}.enable_gradient_checkpointing", self.enable_gradient_checkpointing),
        ]
        if self.lora_rank:
            values += [(f"{model}.lora_rank", self.lora_rank), (f"{model}.lora_alpha", self.lora_alpha)]
        values += [
            (f"{actor}.optim.lr", self.learning_rate),
            (f"{actor}.ppo_mini_batch_size", self.ppo_mini_batch_size),
            (f"{actor}.ppo_micro_batch_size_per_gpu", self.ppo_micro_batch_size_per_gpu),
            (f"{actor}.ppo_epochs", self.ppo_epochs),
            (f"{actor}.clip_ratio_low", self.clip_low),
            (f"{actor}.clip_ratio_high", self.clip_high),
            (f"{actor}.clip_ratio_c", self.clip_ratio_c),
            (f"{actor}.loss_agg_mode", self.loss_agg_mode),
            (f"{actor}.entropy_coeff", self.entropy_coeff),
            (f"{actor}.use_kl_loss", self.kl_coef > 0),
        ]
        if self.kl_coef > 0:
            values += [
                (f"{actor}.kl_loss_coef", self.kl_coef),
                (f"{actor}.kl_loss_type", self.kl_estimator),
                ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", self.log_prob_micro_batch_size_per_gpu),
            ]
        values += [
            (f"{rollout}.name", self.rollout_name),
            (f"{rollout}.n", self.rollout_n),
            (f"{rollout}.temperature", self.temperature),
            (f"{rollout}.tensor_model_parallel_size", self.tensor_model_parallel_size),
            (f"{rollout}.gpu_memory_utilization", self.gpu_memory_utilization),
            (f"{rollout}.log_prob_micro_batch_size_per_gpu", self.log_prob_micro_batch_size_per_gpu),
            (f"{rollout}.calculate_log_probs", True),
            ("trainer.nnodes", 1),
            ("trainer.n_gpus_per_node", self.n_gpus_per_node),
        ]
        return [f"{key}={_hydra_value(value)}" for key, value in values]
