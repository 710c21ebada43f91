"""Settings of the ``torch`` trainer backend, importable without torch (configs are validated before any model
loads; :mod:`agentbolt.algorithms.rl.torch_backend` is the backend itself)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Aggregation = Literal["token_mean", "sequence_mean", "rollout_mean"]
"""How token losses become the batch loss (:func:`agentbolt.algorithms.rl.losses.aggregate_token_losses`)."""

KLEstimator = Literal["k1", "k3"]
"""Estimator of the KL penalty to the reference policy (:mod:`agentbolt.algorithms.rl.losses`)."""

DEFAULT_LORA_TARGET_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""Every attention and MLP projection of Llama/Qwen-style blocks ("LoRA without regret", Schulman et al., Thinking
Machines 2025: LoRA on all layers, MLP included, matches full fine-tuning far better than attention-only)."""


class TorchTrainerConfig(BaseModel):
    """Settings of the ``torch`` trainer backend (frozen; round-trips through YAML/JSON).

    Attributes:
        learning_rate: AdamW learning rate. 1e-4 for LoRA: LoRA wants about 10x the full fine-tuning rate
            (Tinker docs, "LoRA primer"; tinker-cookbook ``hyperparam_utils.get_lr``), whose RL values sit around
            1e-6..1e-5; Tinker's supervised LoRA formula gives ~5e-4 for Qwen2.5-0.5B and RL is run lower.
        weight_decay: AdamW decoupled weight decay (0: decay would pull LoRA B back towards the base model).
        max_grad_norm: the global gradient norm is clipped to this (> 0).
        lora_r / lora_alpha: LoRA rank and scale (the update is ``alpha / r * B @ A``).
        lora_dropout: must be 0, so the policy that is trained is exactly the one that sampled (dropout would make the
            importance ratio differ from 1 before any update).
        lora_target_modules: module names that get LoRA adapters.
        micro_batch_tokens: budget of one right-padded micro-batch, ``rows * longest sequence`` (a longer sequence
            gets a micro-batch of its own). Activation memory grows linearly with it (peft also keeps a float32 copy
            of each adapted layer's input). Measured peak RSS of the whole process, SmolLM2-135M in bf16 on CPU:
            6.1 GB at 4096, 4.4 GB at 2048 (the default), 3.3 GB at 1024, 2.3 GB at 1024 with
            ``gradient_checkpointing``; expect about twice the activations for Qwen2.5-0.5B. Raise it on a GPU
            (for Qwen2.5-0.5B on an 80+ GB GPU: 16384-32768 without ``gradient_checkpointing``, 65536 with it;
            see the module docstring).
        clip_low / clip_high: PPO-clip bounds ``[1 - clip_low, 1 + clip_high]`` (DAPO clip-higher defaults,
            arXiv:2503.14476).
        loss_aggregation: ``token_mean`` (DAPO), ``sequence_mean`` (GRPO) or ``rollout_mean`` (every rollout weighs
            the same however its calls were split into samples), see :func:`ppo_clip_loss`.
        kl_coef / kl_estimator: weight (>= 0) and estimator (``k1``/``k3``) of a KL penalty to the reference policy,
            the base model with the LoRA adapter disabled (one more no-grad forward per micro-batch when > 0).
        tis_cap: truncated importance sampling (> 0): the ratio is anchored at the trainer's own logprobs before the
            update (detached; one optimizer step per batch, so pi_old is the current policy) and each token is
            weighted by ``min(pi_old / pi_sampling, tis_cap)`` for samples made by stale weights (see
            :func:`~agentbolt.algorithms.rl.losses.truncated_is_weights`); ``None``: the ratio is anchored at the
            sampling logprobs, no weight.
        logprob_chunk_tokens: positions per ``lm_head`` + log-softmax chunk (memory vs. speed).
        gradient_checkpointing: recompute decoder activations in the backward (less memory, about one more forward
            of compute). Non-reentrant ``torch.utils.checkpoint`` on every decoder layer (transformers'
            ``activation_checkpointing_enable``, ``gradient_checkpointing_enable`` before 5.x); the loss and the
            LoRA gradients are the same as without it (tested to 1e-6 in float32). The ``lm_head`` + log-softmax
            chunks are always recomputed in the backward, whatever this says (a frozen head's by
            :mod:`~agentbolt.algorithms.rl.head_logprobs`, a trainable one's under checkpointing).
        shared_prefix_min_tokens: when every sample of a step starts with the same ids for at least this many
            tokens before its first trained token (the calc agent's system prompt and tools: ~250 tokens), that
            prefix is forwarded once per micro-batch (batch 1) and its keys and values are shared by every row,
            whose own forward starts after it; micro-batches are planned on the rows' remaining lengths. The loss
            and the gradients are those of the full forward (the same function, summed in another order: tested on a
            float64 model to relative 1e-6, the float32 rounding of the log-softmax).
            0 turns it off; off as well with ``gradient_checkpointing``.
        sequence_packing: with a shared prefix (and SDPA attention), the rows' remaining ids are packed several to
            a row (first-fit decreasing, :func:`~agentbolt.adapter.samples.plan_packed_micro_batches`) instead of
            each row being right-padded to the longest: each packed id keeps its own position and attends to the
            prefix and to its own sequence only (a block-diagonal causal mask), so the loss and gradients are those
            of the padded forward (tested to 1e-6 on a float64 model) while padding positions, about a quarter of
            the calc agent's update, are no longer forwarded. ``micro_batch_tokens`` then bounds packed
            positions. Off: right-padded rows (e.g. on a GPU, where a custom mask keeps SDPA off its flash kernel).
        value_head: add a value head for PPO with GAE (the ``gae`` estimator): a float32 linear layer ``H -> 1``
            on the policy's last hidden state, zero-initialized, in the same optimizer step. The hidden state is
            detached, so the value loss trains the head alone and never moves the LoRA policy (a shared backbone
            trained by both losses let the value gradient dominate the clipped norm); see
            :meth:`TorchPolicyTrainer.values`.
        vf_coef: weight of the value loss ``0.5 * (V - return)^2``, averaged over the batch's trained tokens
            (PPO, Schulman et al. 2017, arXiv:1707.06347, eq. 9, ``c_1``); read only with ``value_head``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    learning_rate: float = Field(default=1e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = DEFAULT_LORA_TARGET_MODULES
    micro_batch_tokens: int = Field(default=2048, ge=1)
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.28, ge=0)
    loss_aggregation: Aggregation = "token_mean"
    kl_coef: float = Field(default=0.0, ge=0)
    kl_estimator: KLEstimator = "k3"
    tis_cap: float | None = Field(default=None, gt=0)
    logprob_chunk_tokens: int = Field(default=512, ge=1)
    gradient_checkpointing: bool = False
    shared_prefix_min_tokens: int = Field(default=32, ge=0)
    sequence_packing: bool = True
    value_head: bool = False
    vf_coef: float = Field(default=0.5, ge=0)

    @field_validator("lora_dropout")
    @classmethod
    def _no_dropout(cls, value: float) -> float:
        if value != 0.0:
            raise ValueError(
                f"lora_dropout must be 0 (got {value}): the trained policy must equal the sampling policy, or the "
                "importance ratio is off before any update"
            )
        return value

    @field_validator("lora_target_modules")
    @classmethod
    def _some_targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("lora_target_modules is empty; name at least one module, e.g. q_proj")
        return value
