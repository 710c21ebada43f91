"""The ``torch`` trainer backend: LoRA policy-gradient steps on one device (CPU or one GPU) with transformers + peft.

:func:`attach_lora` injects LoRA layers into the given model in place (no weight copy). The caller either serves
generation from that same model, so the next generation after :meth:`TorchPolicyTrainer.train_step` samples from
the updated policy, or serves a plain copy and writes merged weights into it after each step
(:mod:`agentbolt.algorithms.rl.weight_sync`, faster on CPU). Between steps the model stays in ``eval()`` mode with
``requires_grad`` only on LoRA parameters. Nobody may generate from the trained model while a step runs (train mode,
weights changing).

One ``train_step``:

1. drop samples with advantage exactly 0 (no gradient under GRPO-style estimators) or no trained token;
2. sort by length and pack right-padded micro-batches of at most ``micro_batch_tokens`` tokens, padding included
   (:func:`~agentbolt.adapter.samples.plan_micro_batches`);
3. per micro-batch: forward in the model's own dtype (bf16 for the embedded model), token logprobs of the actual next
   tokens with a float32 log-softmax, PPO-clip with the whole batch's token count as normalizer, backward;
4. clip the gradient norm and take one AdamW step (skipped, with the gradient dropped, when the norm is not finite).

Token logprobs never materialize the full ``(B, T, V)`` float32 log-softmax: the decoder's last hidden states are
gathered at the trained positions only, and ``lm_head`` + ``logsumexp`` run over chunks of ``logprob_chunk_tokens``
positions, so at most one ``(chunk, V)`` float32 block (V = 151,936 for Qwen2.5) is alive at a time, in the forward
and in the backward: with a frozen head (a LoRA policy's) through :mod:`~agentbolt.algorithms.rl.head_logprobs`,
whose backward recomputes a chunk's logits and writes the log-softmax gradient in place; with a trainable head under
activation checkpointing. This assumes the causal-LM head is ``lm_head(decoder(x))``
(Llama, Qwen2/3, Mistral, SmolLM, ...); models that soft-cap or scale their final logits are refused.

Devices: the trainer runs where the model's trainable parameters are (``cpu``, ``cuda`` or ``cuda:N``): move the
model before :func:`attach_lora`. Each micro-batch is collated on the host (one ``(B, T)`` int64/float32 tensor per
field, a few hundred KB) and copied to the device once; pinned memory is not used, since a pinned allocation per
micro-batch costs more than it saves at that size. On CUDA the step's host-device synchronizations are the per
micro-batch loss statistics (``.item()``) and the gradient norm, ``train_step_s`` is measured after
``torch.cuda.synchronize``, and the peak device memory of the step is reported. Weights stay in the model's dtype
(load it in ``torch.bfloat16`` on a GPU: every CUDA GPU since Ampere runs bf16 matmuls natively); adapters are
float32. No autocast is used: the forward runs in the base weights' dtype, as the sampler's does.

On a GPU, raise ``micro_batch_tokens`` (fewer, larger micro-batches keep the device busy). Activations grow
linearly with it. For the Qwen2.5-0.5B architecture in bf16 with LoRA r16 on every projection, the tensors saved for
the backward (summed with ``torch.autograd.graph.saved_tensors_hooks``, weights excluded, CPU, SDPA attention) are
1.97 MB per token without gradient checkpointing (peft keeps a float32 copy of each adapted layer's input) and
0.047 MB per token with it, plus about 1/24 of the former for the layer being recomputed. So 16,384 tokens take
about 32 GB of activations without checkpointing, 32,768 about 64 GB, and 65,536 tokens about 3 + 5 GB with it,
on top of 1.3 GB of weights. ``scripts/gpu_check.py`` measures the real peak on a GPU (``docs/gpu.md``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch.utils.checkpoint import checkpoint

from agentbolt.adapter.samples import PackedMicroBatch, TrainingSample, plan_micro_batches, plan_packed_micro_batches
from agentbolt.algorithms.rl.head_logprobs import head_logprobs
from agentbolt.algorithms.rl.losses import ppo_clip_loss, rollout_mean_weights
from agentbolt.algorithms.rl.trainer_config import TorchTrainerConfig
from agentbolt.errors import ConfigError
from agentbolt.inference import packed_linear
from agentbolt.inference.kv_cache import as_cache, cache_kwarg, cache_layers, common_prefix_length, output_cache

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

VALUE_HEAD_FILE = "value_head.safetensors"
"""The value head's tensors in a checkpoint (:meth:`TorchPolicyTrainer.save_state`)."""

TRAINER_STATE_FILE = "trainer_state.pt"
"""Optimizer state, step count and RNG states in a checkpoint (:meth:`TorchPolicyTrainer.save_state`)."""


def attach_lora(model: PreTrainedModel, config: TorchTrainerConfig) -> PeftModel:
    """Inject LoRA adapters into ``model`` in place and return the ``PeftModel`` wrapping it.

    No weight is copied: ``model`` itself now holds the LoRA layers, so generating with ``model`` or with the
    returned wrapper samples from the LoRA policy. The result is in ``eval()`` mode with
    ``requires_grad`` on the LoRA parameters only; adapters are kept in float32 (peft's default for a bf16/fp16
    base), and LoRA ``B`` starts at 0, so the policy is unchanged until the first step.

    Raises:
        ConfigError: ``model`` already has adapters, or none of ``config.lora_target_modules`` exists in it.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    from agentbolt.algorithms.rl.adapter_files import quiet_peft_deprecation

    if isinstance(model, PeftModel) or getattr(model, "peft_config", None):
        raise ConfigError("the model already has adapters; attach_lora must be called once, on the base model")
    if config.gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x; the old name warns
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora_config = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with quiet_peft_deprecation():
            peft_model = get_peft_model(model, lora_config)
    except ValueError as exc:
        raise ConfigError(f"cannot attach LoRA to {config.lora_target_modules}: {exc}") from exc
    for name, param in peft_model.named_parameters():
        param.requires_grad_("lora_" in name)
    peft_model.eval()
    assert isinstance(peft_model, PeftModel)
    return peft_model


def save_adapter(model: PeftModel, path: str | Path) -> Path:
    """Write the LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``) under ``path``.

    Only the adapter is written (a few MB), never the base weights. Returns the directory.
    """
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    # save_embedding_layers=False: embeddings are never adapted here (and peft would look up the base model's hub
    # config to decide)
    model.save_pretrained(str(directory), save_embedding_layers=False)
    return directory


class TorchPolicyTrainer:
    """PPO-clip LoRA updates of a model built by :func:`attach_lora` (see the module docstring).

    Args:
        model: a model returned by :func:`attach_lora`.
        config: the settings (``lora_*`` fields were used by :func:`attach_lora`; the rest are read here).
        pad_token_id: token id used for right padding (never trained on: padding is outside the loss mask and
            the attention mask).

    Raises:
        ConfigError: the model has no trainable parameter, or applies a final-logit soft-cap / scale.
    """

    def __init__(self, model: PeftModel, config: TorchTrainerConfig, pad_token_id: int) -> None:
        self.model = model
        self.config = config
        self.pad_token_id = pad_token_id
        base = cast("PreTrainedModel", model.get_base_model())
        for attribute in ("final_logit_softcapping", "logit_scale"):
            if getattr(base.config, attribute, None) not in (None, 1.0):
                raise ConfigError(
                    f"{type(base).__name__} applies {attribute} to its logits; the torch backend computes logprobs "
                    "as lm_head(decoder(x)) and does not support it"
                )
        self._decoder = base.get_decoder()
        self._attention = str(getattr(base.config, "_attn_implementation", None))
        self._cache_kwarg = cache_kwarg(self._decoder)
        head = base.get_output_embeddings()
        if not isinstance(head, torch.nn.Module):
            raise ConfigError(f"{type(base).__name__} has no output embedding (lm_head) module")
        self._lm_head: torch.nn.Module = head
        # a frozen head (LoRA leaves it alone) takes the fused log-softmax backward of head_logprobs.py
        self._frozen_head = not any(p.requires_grad for p in head.parameters())
        # On a CPU, LoRA layers run as one autograd function in the CPU's fast matmul dtype (float32 where bf16 is
        # emulated): inference/lora_matmul.py. Idempotent; the served copy of the model gets the same forward.
        packed_linear.install(model)
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ConfigError("the model has no trainable parameter; build it with attach_lora(model, config)")
        self.device = self._params[0].device
        self.value_head: torch.nn.Linear | None = None
        """``H -> 1`` float32 value head (``config.value_head``); ``None`` without one."""
        if config.value_head:
            hidden_size = int(base.config.hidden_size)
            self.value_head = torch.nn.Linear(hidden_size, 1, dtype=torch.float32, device=self.device)
            torch.nn.init.zeros_(self.value_head.weight)  # V = 0 at first: GAE starts as Monte Carlo returns
            torch.nn.init.zeros_(self.value_head.bias)
            self._params += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(self._params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.train_steps = 0
        """Optimizer steps taken so far."""

    def train_step(self, samples: Sequence[TrainingSample]) -> dict[str, float]:
        """One optimizer step on ``samples`` (see the module docstring).

        Returns:
            Floats: ``loss`` (the batch's PPO-clip loss), ``clip_fraction``, ``approx_kl`` (k3, mean over trained
            tokens), ``sampling_kl`` (k3 between the serving engine's and the trainer's logprobs; equals
            ``approx_kl`` without ``tis_cap``), ``tis_weight_mean`` / ``tis_truncated_fraction`` (1 / 0 without
            ``tis_cap``), ``kl_reference`` (mean KL estimate to the reference; ``nan`` when ``kl_coef`` is 0),
            ``ratio_mean``, ``grad_norm`` (before clipping; ``nan`` when no step was taken), ``value_loss`` and
            ``value_mean`` (the value head's loss and mean estimate over trained tokens; ``nan`` without gae),
            ``stepped`` (1.0 or 0.0), ``n_samples`` (trained), ``n_skipped_zero_advantage``,
            ``n_skipped_no_loss_tokens``, ``n_tokens`` (non-padding tokens of the samples), ``n_loss_tokens``,
            ``n_padding_tokens``, ``n_forwarded_positions`` (positions the decoder actually ran, padding included,
            the shared prefix counted once per micro-batch), ``shared_prefix_tokens`` (see
            ``TorchTrainerConfig.shared_prefix_min_tokens``; 0 when not used), ``n_micro_batches``, ``tokens_per_s``,
            ``train_step_s``, ``learning_rate``,
            ``peak_rss_bytes`` (process peak resident memory so far) and, on CUDA, ``peak_device_memory_bytes``
            (peak bytes allocated by torch on the device during this step: the counter is reset when it starts).
            ``train_step_s`` is wall-clock seconds (after a device synchronize on CUDA); ``tokens_per_s`` is
            ``n_tokens / train_step_s``.
            The keys are the same whether or not a step was taken. When no sample is left (every advantage is 0)
            nothing runs: ``stepped`` is 0 and the measured-only values (``approx_kl``, ``clip_fraction``,
            ``ratio_mean``, ``grad_norm``) are ``nan``. A non-finite gradient norm also gives ``stepped`` 0.
        """
        start = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        per_token = any(s.token_advantages is not None for s in samples)
        if per_token and not all(s.token_advantages is not None for s in samples):
            raise ConfigError("either every sample has token_advantages (gae) or none does")
        if per_token and self.value_head is not None and any(s.token_returns is None for s in samples):
            raise ConfigError("the value head needs token_returns on every sample (rollout_gae sets them)")

        def useful(s: TrainingSample) -> bool:  # can move the policy (with gae: the value head too)
            return per_token or s.advantage != 0.0

        n_zero = sum(1 for s in samples if not useful(s))
        n_empty = sum(1 for s in samples if useful(s) and s.n_loss_tokens == 0)
        kept = [s for s in samples if useful(s) and s.n_loss_tokens > 0]
        stats: dict[str, float] = {
            "n_skipped_zero_advantage": float(n_zero),
            "n_skipped_no_loss_tokens": float(n_empty),
            "n_samples": float(len(kept)),
            "learning_rate": self.config.learning_rate,
        }
        if not kept:
            nothing = {
                "loss": 0.0,
                "n_tokens": 0.0,
                "n_loss_tokens": 0.0,
                "n_padding_tokens": 0.0,
                "n_forwarded_positions": 0.0,
                "shared_prefix_tokens": 0.0,
                "n_micro_batches": 0.0,
            }
            not_measured = {
                "value_loss": math.nan,
                "value_mean": math.nan,
                "approx_kl": math.nan,
                "sampling_kl": math.nan,
                "tis_weight_mean": math.nan,
                "tis_truncated_fraction": math.nan,
                "kl_reference": math.nan,
                "clip_fraction": math.nan,
                "ratio_mean": math.nan,
                "grad_norm": math.nan,
            }
            stats.update(stepped=0.0, **nothing, **not_measured)
            return self._finish(stats, start, n_tokens=0)

        total_loss_tokens = sum(s.n_loss_tokens for s in kept)
        # token_mean divides by the batch's trained tokens, sequence_mean by its sequences (see ppo_clip_loss)
        token_mean = self.config.loss_aggregation == "token_mean"
        normalizer = float(total_loss_tokens) if token_mean else float(len(kept))
        prefix_len = self._shared_prefix_length(kept)
        plan = self._plan(kept, prefix_len)
        # rollout_mean: per-token weights over the whole batch, so each rollout weighs the same however split
        weights = (
            rollout_mean_weights([s.rollout_id for s in kept], [s.n_loss_tokens for s in kept])
            if self.config.loss_aggregation == "rollout_mean"
            else None
        )

        loss_sum = 0.0
        kl_sum = clip_sum = ratio_sum = kl_ref_sum = value_loss_sum = value_sum = 0.0
        sampling_kl_sum = tis_weight_sum = tis_truncated_sum = 0.0
        n_padding = n_forwarded = 0
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        try:
            for indices, packing in plan:
                batch = [kept[i] for i in indices]
                tensors = self._collate(batch, packing)
                logprobs, values = self._token_logprobs_and_values(tensors, prefix_len=prefix_len)
                ref_logprobs = None
                if self.config.kl_coef > 0:
                    with torch.no_grad(), self.model.disable_adapter():
                        ref_logprobs = self._token_logprobs(tensors)
                loss, loss_stats = ppo_clip_loss(
                    logprobs,
                    tensors["sampling_logprobs"][:, 1:],
                    tensors["token_advantages"][:, 1:] if per_token else tensors["advantages"],
                    tensors["loss_mask"][:, 1:],
                    clip_low=self.config.clip_low,
                    clip_high=self.config.clip_high,
                    aggregation=self.config.loss_aggregation,
                    normalizer=normalizer if weights is None else None,
                    old_logprobs_BT=logprobs.detach() if self.config.tis_cap is not None else None,
                    tis_cap=self.config.tis_cap,
                    ref_logprobs_BT=ref_logprobs,
                    kl_coef=self.config.kl_coef,
                    kl_estimator=self.config.kl_estimator,
                    token_weights_B=None
                    if weights is None
                    else torch.tensor([weights[i] for i in indices], dtype=torch.float32, device=self.device),
                )
                if values is not None and per_token:
                    # PPO's L^VF (arXiv:1707.06347, eq. 9): 0.5 (V - return)^2, mean over the batch's trained tokens
                    trained = tensors["loss_mask"][:, 1:].to(torch.bool)
                    error = torch.where(trained, values - tensors["token_returns"][:, 1:], values.new_zeros(()))
                    value_loss = 0.5 * error.pow(2).sum() / total_loss_tokens
                    value_loss_sum += float(value_loss.item())
                    value_sum += float(torch.where(trained, values, values.new_zeros(())).sum().item())
                    loss = loss + self.config.vf_coef * value_loss
                loss.backward()
                loss_sum += float(loss.item())
                n = loss_stats.n_loss_tokens
                kl_sum += loss_stats.approx_kl * n
                sampling_kl_sum += loss_stats.sampling_kl * n
                tis_weight_sum += loss_stats.tis_weight_mean * n
                tis_truncated_sum += loss_stats.tis_truncated_fraction * n
                kl_ref_sum += loss_stats.kl_reference * n
                clip_sum += loss_stats.clip_fraction * n
                ratio_sum += loss_stats.ratio_mean * n
                tails = len(batch) * (max(s.n_tokens for s in batch) - prefix_len)  # right-padded rows
                if packing is not None:
                    tails = packing.n_rows * packing.width
                n_padding += tails - sum(s.n_tokens - prefix_len for s in batch)
                n_forwarded += prefix_len + tails
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, self.config.max_grad_norm).item())
            stepped = math.isfinite(grad_norm)
            if stepped:
                self.optimizer.step()
                self.train_steps += 1
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            self.model.eval()

        n_tokens = sum(s.n_tokens for s in kept)
        has_values = self.value_head is not None and per_token
        stats.update(
            loss=loss_sum,
            value_loss=value_loss_sum if has_values else math.nan,
            value_mean=value_sum / total_loss_tokens if has_values else math.nan,
            approx_kl=kl_sum / total_loss_tokens,
            sampling_kl=sampling_kl_sum / total_loss_tokens,
            tis_weight_mean=tis_weight_sum / total_loss_tokens,
            tis_truncated_fraction=tis_truncated_sum / total_loss_tokens,
            kl_reference=kl_ref_sum / total_loss_tokens,
            clip_fraction=clip_sum / total_loss_tokens,
            ratio_mean=ratio_sum / total_loss_tokens,
            grad_norm=grad_norm,
            stepped=1.0 if stepped else 0.0,
            n_tokens=float(n_tokens),
            n_loss_tokens=float(total_loss_tokens),
            n_padding_tokens=float(n_padding),
            n_forwarded_positions=float(n_forwarded),
            shared_prefix_tokens=float(prefix_len),
            n_micro_batches=float(len(plan)),
        )
        return self._finish(stats, start, n_tokens=n_tokens)

    def trainer_logprobs(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        """log pi(token) under the current policy, computed exactly as ``train_step`` does, without a gradient.

        Returns:
            One ``(L,)`` list per sample, aligned like ``sampling_logprobs``: 0.0 where ``loss_mask`` is 0. Compare
            with ``sampling_logprobs`` to measure the sampler/trainer mismatch.
        """
        return self._per_token(samples, self._token_logprobs)

    def values(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        """The value head's ``V(s_k)`` for every trained token ``k`` under the current weights, without a gradient.

        ``V(s_k)`` is read from the hidden state of position ``k - 1`` (the state before token ``k`` is generated),
        in float32.

        Returns:
            One ``(L,)`` list per sample, aligned like ``sampling_logprobs``: 0.0 where ``loss_mask`` is 0.

        Raises:
            ConfigError: the trainer has no value head (``TorchTrainerConfig.value_head``).
        """
        if self.value_head is None:
            raise ConfigError("this trainer has no value head; build it with TorchTrainerConfig(value_head=True)")

        def values_BT(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
            values = self._token_logprobs_and_values(tensors, logprobs=False)[1]
            assert values is not None
            return values

        return self._per_token(samples, values_BT)

    @torch.no_grad()
    def _per_token(
        self, samples: Sequence[TrainingSample], compute: Callable[[dict[str, torch.Tensor]], torch.Tensor]
    ) -> list[list[float]]:
        """Run ``compute`` (collated micro-batch -> ``(B, T - 1)`` values of the tokens ``1..T-1``) in eval mode
        over micro-batches; return one ``(L,)`` list per sample, aligned with its tokens, 0.0 off the loss mask."""
        was_training = self.model.training
        self.model.eval()
        out: list[list[float]] = [[] for _ in samples]
        try:
            prefix_len = self._shared_prefix_length(samples)
            for indices, packing in self._plan(samples, prefix_len):
                tensors = self._collate([samples[i] for i in indices], packing)
                tensors["prefix_len"] = torch.tensor(prefix_len)
                computed = compute(tensors).cpu()
                for row, i in enumerate(indices):
                    n = samples[i].n_tokens
                    values = [0.0, *computed[row, : n - 1].tolist()]
                    out[i] = [v if m else 0.0 for v, m in zip(values, samples[i].loss_mask, strict=True)]
        finally:
            self.model.train(was_training)
        return out

    def save_adapter(self, path: str | Path) -> Path:
        """Write the current LoRA adapter under ``path`` (see :func:`save_adapter`)."""
        return save_adapter(self.model, path)

    def save_state(self, directory: str | Path) -> None:
        """Write everything a resumed run needs to continue this trainer exactly, into ``directory`` (created):

        - ``adapter_config.json`` + ``adapter_model.safetensors``: the LoRA adapter in peft's format
          (:func:`save_adapter`; loads with ``PeftModel.from_pretrained(base_model, directory)``);
        - ``value_head.safetensors``: the value head's ``weight`` ``(1, H)`` and ``bias`` ``(1,)``, float32, when
          there is one;
        - ``trainer_state.pt``: the AdamW state (moments and step counts of every trainable tensor), the number of
          optimizer steps taken, and torch's RNG states (CPU, and every CUDA device when CUDA is initialized).
          There is no learning-rate scheduler (the rate is constant), so none is saved.

        Restored by :meth:`load_state`.
        """
        from safetensors.torch import save_file

        directory = Path(directory)
        save_adapter(self.model, directory)
        if self.value_head is not None:
            head = {name: t.detach().cpu().contiguous() for name, t in self.value_head.state_dict().items()}
            save_file(head, str(directory / VALUE_HEAD_FILE))
        state: dict[str, object] = {
            "optimizer": self.optimizer.state_dict(),
            "train_steps": self.train_steps,
            "torch_rng": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        torch.save(state, directory / TRAINER_STATE_FILE)

    def load_state(self, directory: str | Path) -> None:
        """Load what :meth:`save_state` wrote into this trainer: the LoRA weights (into the live adapter, in place),
        the value head, the optimizer state, the step count and torch's RNG states.

        Raises:
            ConfigError: a file is missing, the checkpoint has a value head and this trainer not (or the reverse),
                or its tensors do not fit this model (another model or other LoRA settings).
        """
        import pickle

        from peft import set_peft_model_state_dict
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from agentbolt.algorithms.rl.adapter_files import short_reason

        directory = Path(directory)
        adapter_file = directory / "adapter_model.safetensors"
        state_file = directory / TRAINER_STATE_FILE
        for needed in (adapter_file, state_file):
            if not needed.is_file():
                raise ConfigError(f"checkpoint {directory} has no {needed.name}; it is not a complete checkpoint")
        head_file = directory / VALUE_HEAD_FILE
        if head_file.is_file() != (self.value_head is not None):
            have = "has a" if head_file.is_file() else "has no"
            raise ConfigError(
                f"checkpoint {directory} {have} value head and this run's trainer "
                f"{'does not' if self.value_head is None else 'does'}; resume with the same advantage_estimator"
            )
        try:  # read every file first: a truncated one is damage, not a model mismatch
            adapter = load_file(str(adapter_file), device=str(self.device))
            head = load_file(str(head_file), device=str(self.device)) if self.value_head is not None else None
            state = torch.load(state_file, map_location="cpu", weights_only=True)
        except (SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError) as exc:
            raise ConfigError(
                f"checkpoint {directory} is damaged ({short_reason(exc)}); delete that folder to resume "
                "from the one before it"
            ) from None
        try:
            result = set_peft_model_state_dict(self.model, adapter)
            if getattr(result, "unexpected_keys", None):
                raise ConfigError(f"unexpected tensors {result.unexpected_keys[:3]}")
            missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
            if missing:
                raise ConfigError(f"LoRA tensors missing from the checkpoint, e.g. {missing[:3]}")
            if self.value_head is not None and head is not None:
                self.value_head.load_state_dict(head)
            self.optimizer.load_state_dict(state["optimizer"])
            for group in self.optimizer.param_groups:  # this run's setting wins (the same unless it was changed)
                group["lr"] = self.config.learning_rate
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ConfigError(
                f"checkpoint {directory} does not fit this model ({short_reason(exc)}); resume with the model and LoRA "
                "settings (torch_trainer.lora_*) it was trained with"
            ) from None
        self.train_steps = int(state["train_steps"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    def _plan(
        self, samples: Sequence[TrainingSample], prefix_len: int
    ) -> list[tuple[list[int], PackedMicroBatch | None]]:
        """Micro-batches of ``samples`` (indices) for a forward that starts after ``prefix_len`` shared ids: packed
        several to a row (``sequence_packing``, with a shared prefix and SDPA attention), else right-padded rows."""
        tails = [s.n_tokens - prefix_len for s in samples]
        budget = self.config.micro_batch_tokens
        if prefix_len > 0 and self.config.sequence_packing and self._attention == "sdpa":
            return [(plan.indices, plan) for plan in plan_packed_micro_batches(tails, budget)]
        return [(indices, None) for indices in plan_micro_batches(tails, budget)]

    def _collate(
        self, batch: Sequence[TrainingSample], packing: PackedMicroBatch | None = None
    ) -> dict[str, torch.Tensor]:
        """Right-pad a micro-batch: ``input_ids``/``attention_mask``/``loss_mask`` ``(B, T)`` int64,
        ``sampling_logprobs`` ``(B, T)`` float32, ``advantages`` and ``inverse_temperatures`` ``(B,)`` float32;
        with ``packing``, also ``pack_rows`` / ``pack_offsets`` ``(B,)`` int64 (where each row's tail after the
        shared prefix goes in the packed forward, :meth:`_hidden_states`)."""
        width = max(s.n_tokens for s in batch)
        rows = len(batch)
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((rows, width), dtype=torch.long)
        loss_mask = torch.zeros((rows, width), dtype=torch.long)
        sampling_logprobs = torch.zeros((rows, width), dtype=torch.float32)
        token_advantages = torch.zeros((rows, width), dtype=torch.float32)
        token_returns = torch.zeros((rows, width), dtype=torch.float32)
        for row, sample in enumerate(batch):
            n = sample.n_tokens
            input_ids[row, :n] = torch.tensor(sample.input_ids, dtype=torch.long)
            attention_mask[row, :n] = 1
            loss_mask[row, :n] = torch.tensor(sample.loss_mask, dtype=torch.long)
            sampling_logprobs[row, :n] = torch.tensor(sample.sampling_logprobs, dtype=torch.float32)
            if sample.token_advantages is not None:
                token_advantages[row, :n] = torch.tensor(sample.token_advantages, dtype=torch.float32)
            if sample.token_returns is not None:
                token_returns[row, :n] = torch.tensor(sample.token_returns, dtype=torch.float32)
        tensors = {
            "token_advantages": token_advantages,
            "token_returns": token_returns,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "loss_mask": loss_mask,
            "sampling_logprobs": sampling_logprobs,
            "advantages": torch.tensor([s.advantage for s in batch], dtype=torch.float32),
            "inverse_temperatures": torch.tensor([1.0 / s.sampling_temperature for s in batch], dtype=torch.float32),
        }
        if packing is not None:
            tensors["pack_rows"] = torch.tensor(packing.rows, dtype=torch.long)
            tensors["pack_offsets"] = torch.tensor(packing.offsets, dtype=torch.long)
        return {name: t.to(self.device) for name, t in tensors.items()}

    def _token_logprobs(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """``(B, T - 1)`` float32: entry ``[b, t]`` is log pi(input_ids[b, t + 1] | input_ids[b, : t + 1]) at the
        trained positions (``loss_mask[b, t + 1] == 1``), 0 elsewhere. Differentiable when grad is enabled."""
        return self._token_logprobs_and_values(tensors, values=False)[0]

    def _shared_prefix_length(self, samples: Sequence[TrainingSample]) -> int:
        """How many leading ids every sample shares and may be forwarded once (see
        ``TorchTrainerConfig.shared_prefix_min_tokens``): the common prefix, cut one id before the earliest trained
        token (so every trained token is predicted from a position after it), 0 when shorter than the setting."""
        minimum = self.config.shared_prefix_min_tokens
        if minimum <= 0 or self.config.gradient_checkpointing or len(samples) < 2:
            return 0
        first_trained = min(s.loss_mask.index(1) if 1 in s.loss_mask else s.n_tokens for s in samples)
        shared = min(common_prefix_length([s.input_ids for s in samples]), first_trained - 1)
        return shared if shared >= minimum else 0

    def _hidden_states(self, tensors: dict[str, torch.Tensor], prefix_len: int) -> torch.Tensor:
        """``(B, T, H)`` last hidden states of the right-padded micro-batch, in the model's dtype. With
        ``prefix_len`` P > 0 (every row's first P ids are the same): the prefix runs once, batch 1, and its keys and
        values are expanded (a view) to every row; the rows run from position P with that cache. The autograd
        graph goes through the expansion, so the prefix's share of the gradient is the sum over rows, as in the
        full forward."""
        input_ids = tensors["input_ids"]
        if prefix_len <= 0:
            return self._decoder(input_ids=input_ids, attention_mask=tensors["attention_mask"], use_cache=False)[
                "last_hidden_state"
            ]
        rows, width = input_ids.shape
        head = self._decoder(input_ids=input_ids[:1, :prefix_len], use_cache=True)
        prefix_kv = cache_layers(output_cache(head))
        if "pack_rows" in tensors:
            tail_BWH = self._packed_tails(tensors, prefix_len, prefix_kv)
        else:
            shared = as_cache([(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in prefix_kv])
            positions = torch.arange(prefix_len, width, device=input_ids.device).unsqueeze(0).expand(rows, -1)
            tail_BWH = self._decoder(
                input_ids=input_ids[:, prefix_len:],
                attention_mask=tensors["attention_mask"],
                position_ids=positions,
                use_cache=True,
                **{self._cache_kwarg: shared},
            )["last_hidden_state"]
        return torch.cat([head["last_hidden_state"].expand(rows, -1, -1), tail_BWH], dim=1)

    def _packed_tails(
        self, tensors: dict[str, torch.Tensor], prefix_len: int, prefix_kv: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """``(B, T - P, H)`` hidden states of every row's tail (after the ``P = prefix_len`` shared ids; zeros past
        a row's end), from one forward of the tails packed several to a row (``pack_rows`` / ``pack_offsets``).

        Packed row ``r`` holds tails back to back; each position keeps its own sequence's ``position_ids`` (``P``
        on) and attends to the shared prefix's keys and values (``prefix_kv``, per layer ``(1, KV, P, D)``) and to
        the earlier positions of its own tail only, through a ``(R, 1, C, P + C)`` boolean mask (block-diagonal
        causal after the prefix columns), so every tail gets the same attention as in its own row. Padding slots
        see only the prefix (no row of the mask is empty) and are never read back."""
        input_ids, device = tensors["input_ids"], tensors["input_ids"].device
        rows_B, offsets_B = tensors["pack_rows"], tensors["pack_offsets"]
        width = input_ids.shape[1] - prefix_len
        lengths_B = tensors["attention_mask"].sum(dim=1) - prefix_len  # (B,)
        n_rows = int(rows_B.max()) + 1
        C = int((offsets_B + lengths_B).max())
        t_W = torch.arange(width, device=device)
        valid_BW = t_W.unsqueeze(0) < lengths_B.unsqueeze(1)
        slot_BW = rows_B.unsqueeze(1) * C + offsets_B.unsqueeze(1) + t_W.unsqueeze(0)  # flat slot of each position
        slots = slot_BW[valid_BW]
        ids = torch.full((n_rows * C,), self.pad_token_id, dtype=input_ids.dtype, device=device)
        ids[slots] = input_ids[:, prefix_len:][valid_BW]
        positions = torch.zeros((n_rows * C,), dtype=torch.long, device=device)
        positions[slots] = (prefix_len + t_W).expand_as(valid_BW)[valid_BW]
        segment = torch.full((n_rows * C,), -1, dtype=torch.long, device=device)
        segment[slots] = torch.arange(len(rows_B), device=device).unsqueeze(1).expand_as(valid_BW)[valid_BW]
        segment_RC = segment.view(n_rows, C)
        causal = torch.ones((C, C), dtype=torch.bool, device=device).tril()
        own_RCC = (segment_RC.unsqueeze(2) == segment_RC.unsqueeze(1)) & (segment_RC.unsqueeze(2) >= 0) & causal
        mask = torch.cat([own_RCC.new_ones((n_rows, C, prefix_len)), own_RCC], dim=2).unsqueeze(1)
        cache = as_cache([(k.expand(n_rows, -1, -1, -1), v.expand(n_rows, -1, -1, -1)) for k, v in prefix_kv])
        packed = self._decoder(
            input_ids=ids.view(n_rows, C),
            position_ids=positions.view(n_rows, C),
            attention_mask=mask,
            use_cache=True,
            **{self._cache_kwarg: cache},
        )["last_hidden_state"]  # (R, C, H)
        flat = packed.reshape(n_rows * C, -1)
        gathered = flat[slot_BW.clamp(max=n_rows * C - 1)]  # (B, W, H); positions past a row's end are zeroed
        return torch.where(valid_BW.unsqueeze(2), gathered, gathered.new_zeros(()))

    def _token_logprobs_and_values(
        self,
        tensors: dict[str, torch.Tensor],
        *,
        logprobs: bool = True,
        values: bool = True,
        prefix_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decoder forward: the token logprobs of :meth:`_token_logprobs` (zeros when ``logprobs`` is False)
        and, with a value head and ``values``, ``(B, T - 1)`` float32 values aligned the same way (entry ``[b, t]``
        is the value of the state before token ``t + 1``), else ``None``. ``prefix_len``: see
        :meth:`_hidden_states` (default ``tensors["prefix_len"]`` when present, else 0)."""
        input_ids = tensors["input_ids"]
        predicted = tensors["loss_mask"][:, 1:].to(torch.bool)  # (B, T-1)
        if prefix_len is None:
            prefix_len = int(tensors["prefix_len"]) if "prefix_len" in tensors else 0
        hidden = self._hidden_states(tensors, prefix_len)  # (B, T, H), model dtype
        hidden_NH = hidden[:, :-1][predicted]  # (N, H): the positions that predict a trained token
        value_out = None
        if values and self.value_head is not None:
            # detached: the value loss trains the head only, never the LoRA policy it reads (no interference)
            value_N = self.value_head(hidden_NH.detach().float()).squeeze(-1)  # (N,) float32
            value_out = torch.zeros(predicted.shape, dtype=torch.float32, device=input_ids.device)
            value_out = value_out.masked_scatter(predicted, value_N)
        out = torch.zeros(predicted.shape, dtype=torch.float32, device=input_ids.device)
        if not logprobs:
            return out, value_out
        targets_N = input_ids[:, 1:][predicted]  # (N,)
        rows = torch.arange(input_ids.shape[0], device=input_ids.device).unsqueeze(1).expand_as(predicted)
        inverse_temperatures_N = tensors["inverse_temperatures"][rows[predicted]]  # (N,)
        chunk = self.config.logprob_chunk_tokens
        if self._frozen_head:
            logprobs_N = head_logprobs(hidden_NH, targets_N, inverse_temperatures_N, self._lm_head, chunk)
            return out.masked_scatter(predicted, logprobs_N), value_out
        pieces: list[torch.Tensor] = []
        for lo in range(0, targets_N.shape[0], chunk):
            args = (hidden_NH[lo : lo + chunk], targets_N[lo : lo + chunk], inverse_temperatures_N[lo : lo + chunk])
            if torch.is_grad_enabled():
                piece = checkpoint(self._chunk_logprobs, *args, use_reentrant=False)
            else:
                piece = self._chunk_logprobs(*args)
            assert isinstance(piece, torch.Tensor)
            pieces.append(piece)
        logprobs_N = torch.cat(pieces) if pieces else hidden.new_zeros((0,), dtype=torch.float32)
        return out.masked_scatter(predicted, logprobs_N), value_out

    def _chunk_logprobs(
        self, hidden_NH: torch.Tensor, targets_N: torch.Tensor, inverse_temperatures_N: torch.Tensor
    ) -> torch.Tensor:
        """``(N,)`` float32 log-softmax of ``lm_head(hidden) / temperature`` at ``targets``; the ``(N, V)`` logits
        are computed in the model's dtype (as the sampler does), then upcast to float32."""
        logits = self._lm_head(hidden_NH).float() * inverse_temperatures_N.unsqueeze(1)  # (N, V) float32
        picked = logits.gather(1, targets_N.unsqueeze(1)).squeeze(1)
        return picked - torch.logsumexp(logits, dim=1)

    def _finish(self, stats: dict[str, float], start: float, *, n_tokens: int) -> dict[str, float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the optimizer step's kernels may still be queued
        elapsed = time.perf_counter() - start
        stats["train_step_s"] = elapsed
        stats["tokens_per_s"] = n_tokens / elapsed if elapsed > 0 else 0.0
        stats["peak_rss_bytes"] = float(_peak_rss_bytes())
        if self.device.type == "cuda":
            stats["peak_device_memory_bytes"] = float(torch.cuda.max_memory_allocated(self.device))
        return stats


def _peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (``getrusage``: KiB on Linux, bytes on macOS); 0 if unknown."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024
