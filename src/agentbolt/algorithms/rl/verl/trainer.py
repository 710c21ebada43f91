"""The ``verl`` :class:`~agentbolt.trainer.loop.PolicyUpdater`: our samples through verl's actor update.

**GPU only and never run**: no test in this repository executes this module, and it has never run on a GPU. It is
written against verl 0.9.1's source (``verl/trainer/ppo/ray_trainer.py`` ``RayPPOTrainer._update_actor`` and the
``CheckpointEngineManager.update_weights`` call after each step); verl's internal API changes between releases, so
check it against the installed version before relying on it. verl is imported lazily, inside the methods.

Setup (verl's single-node recipe, :mod:`.config`): compose verl's ``ppo_trainer`` config with
:meth:`~.config.VerlTrainerConfig.to_overrides`, build a ``RayPPOTrainer`` and call ``init_workers()`` (FSDP actor
and vLLM rollout replicas on the node's GPUs), then hand it to :class:`VerlPolicyUpdater`. One ``train_step``:

1. drop samples with no trained token or advantage exactly 0 (no gradient, as the torch backend does);
2. :func:`~.data.samples_to_verl` at the config's fixed widths, padded to a multiple of the GPU count
   (:func:`~.data.pad_rows`), as a ``DataProto`` with the batch temperature in ``meta_info``;
3. verl's padding removal and ``actor_rollout_wg.update_actor`` over ``ppo_mini_batch_size * rollout_n``
   sequences per optimizer step; the returned metrics are averaged into floats.

:meth:`VerlPolicyUpdater.sync_weights` pushes the new actor weights into verl's vLLM replicas.
"""

from __future__ import annotations

from typing import Any

from agentbolt.adapter.samples import TrainingSample
from agentbolt.algorithms.rl.verl.config import VerlTrainerConfig
from agentbolt.algorithms.rl.verl.data import VerlBatch, batch_temperature, pad_rows, samples_to_verl


def to_data_proto(batch: VerlBatch, meta_info: dict[str, Any]) -> Any:
    """``batch`` as a verl ``DataProto`` (non-tensor fields as numpy object arrays). Imports verl and numpy."""
    import numpy as np
    from verl import DataProto  # pyright: ignore

    non_tensors = {key: np.array(values, dtype=object) for key, values in batch.non_tensors().items()}
    return DataProto.from_dict(tensors=dict(batch.tensors), non_tensors=non_tensors, meta_info=meta_info)


class VerlPolicyUpdater:
    """A :class:`~agentbolt.trainer.loop.PolicyUpdater` over an initialized verl ``RayPPOTrainer``. GPU only.

    Args:
        config: the settings the verl trainer was built with.
        ppo_trainer: a ``verl.trainer.ppo.ray_trainer.RayPPOTrainer`` after ``init_workers()``.
        pad_token_id: the tokenizer's pad id.
    """

    def __init__(self, config: VerlTrainerConfig, ppo_trainer: Any, *, pad_token_id: int) -> None:
        self.config = config
        self.ppo_trainer = ppo_trainer
        self.pad_token_id = pad_token_id
        self.steps_done = 0

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]:
        """One verl actor update on ``samples``; returns verl's metrics (means) plus ``verl/n_samples``."""
        from verl.utils import tensordict_utils as tu  # pyright: ignore
        from verl.workers.utils.padding import left_right_2_no_padding  # pyright: ignore

        kept = [s for s in samples if s.n_loss_tokens and s.advantage != 0.0]
        if not kept:
            return {"verl/n_samples": 0.0}
        batch = samples_to_verl(
            kept,
            pad_token_id=self.pad_token_id,
            prompt_width=self.config.max_prompt_length,
            response_width=self.config.max_response_length,
        )
        batch = pad_rows(batch, self.config.n_gpus_per_node)
        data = to_data_proto(batch, {"temperature": batch_temperature(kept), "multi_turn": True})
        tensordict = left_right_2_no_padding(data.to_tensordict())
        mini_batch = self.config.ppo_mini_batch_size * self.config.rollout_n
        tu.assign_non_tensor(
            tensordict,
            calculate_entropy=self.config.entropy_coeff != 0.0,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=mini_batch,
            mini_batch_size=mini_batch,
            epochs=self.config.ppo_epochs,
            seed=self.steps_done,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
        )
        output = self.ppo_trainer.actor_rollout_wg.update_actor(tensordict)
        metrics = tu.get(output, "metrics") or {}
        self.steps_done += 1
        stats = {"verl/n_samples": float(len(kept))}
        for key, value in metrics.items():
            values = value if isinstance(value, list) else [value]
            numbers = [float(v) for v in values]
            if numbers:
                stats[f"verl/{key}"] = sum(numbers) / len(numbers)
        return stats

    def sync_weights(self) -> None:
        """Push the actor's weights into verl's vLLM replicas (verl's checkpoint engine; sleep/wake handled there)."""
        self.ppo_trainer.checkpoint_manager.update_weights(self.steps_done)
