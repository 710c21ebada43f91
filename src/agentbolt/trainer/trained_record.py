"""What each policy update trained on, written to the store before the update runs.

:meth:`RLTrainer.finish_step <agentbolt.trainer.loop.RLTrainer.finish_step>` calls :func:`record_trained_batch` once
per step, right after the batch is final (credit assignment, advantages, the staleness rule, merging, and GAE under
``gae``) and before the update. The store then holds, per sample of the batch, what the update used
(:class:`~agentbolt.types.TrainedSample`): the rollout and attempt, the merged LLM calls in order with the offsets of
their responses, the loss mask, the advantage (per token under ``gae``, with the value targets), each call's credited
reward and staleness, the sampling temperature, and whether the update could learn from it at all. The dashboard's
Tokens page and ``agentbolt export --kind rl`` show these values instead of recomputing them with default settings.

Compact by design: token ids and logprobs stay in the LLM spans and are referenced (span id + offsets), the loss mask
is stored as runs of 1s, and ``gae`` values only for trained tokens. A sample of ``L`` tokens whose calls are the
spans ``s_1 .. s_n`` is rebuilt as ``prompt(s_n) + response(s_n)`` (merging guarantees every earlier call's prompt +
response is a prefix of it).

:func:`trained_samples` is pure; :func:`record_trained_batch` adds the one store write.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentbolt.adapter.batch import StalenessSettings
from agentbolt.adapter.samples import TrainingSample
from agentbolt.adapter.staleness import MODEL_VERSION_KEY, staleness_weight, version_staleness
from agentbolt.config import GRPOConfig
from agentbolt.errors import AgentboltError
from agentbolt.store.base import LightningStore
from agentbolt.types import TrainedCall, TrainedSample, Trajectory, Transition


def update_can_learn(sample: TrainingSample) -> bool:
    """Whether an update can learn from ``sample``: it has a trained token, and its advantage is not exactly 0
    (per-token ``gae`` advantages always count). The torch backend skips the other samples
    (:meth:`~agentbolt.algorithms.rl.torch_backend.TorchPolicyTrainer.train_step`, ``n_skipped_zero_advantage``)."""
    return sample.n_loss_tokens > 0 and (sample.token_advantages is not None or sample.advantage != 0.0)


def loss_mask_ranges(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """The ``[start, end)`` runs where ``loss_mask`` (``(L,)``, values 0/1) is 1, in order.

    >>> loss_mask_ranges([0, 0, 1, 1, 0, 1])
    [(2, 4), (5, 6)]
    """
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for position, value in enumerate([*loss_mask, 0]):
        if value and start is None:
            start = position
        elif not value and start is not None:
            runs.append((start, position))
            start = None
    return runs


def _call(
    transition: Transition, response_start: int, response_end: int, staleness: StalenessSettings | None
) -> TrainedCall:
    behind: int | None = None
    weight = 1.0
    if staleness is not None:
        version = transition.metadata.get(MODEL_VERSION_KEY)
        behind = version_staleness(None if version is None else str(version), staleness.versions)
        weight = staleness_weight(behind, staleness.max_staleness, staleness.policy, staleness.decay)
    return TrainedCall(
        span_id=transition.span_id or "",
        response_start=response_start,
        response_end=response_end,
        reward=None if transition.reward is None else float(transition.reward),
        staleness=behind,
        staleness_weight=weight,
    )


def trained_samples(
    train_step: int,
    samples: Sequence[TrainingSample],
    trajectories: Sequence[Trajectory],
    *,
    advantage_estimator: str,
    credit_assignment: str,
    staleness: StalenessSettings | None = None,
) -> list[TrainedSample]:
    """The records of one update's batch, one per sample, in batch order (``sample_index`` = position).

    Args:
        train_step: the step whose update receives ``samples``.
        samples: the batch exactly as the update receives it; each sample's ``calls`` name its merged transitions
            (:func:`~agentbolt.adapter.samples.merge_transitions` sets them).
        trajectories: the step's trained trajectories, after credit assignment (which wrote each transition's
            ``reward``); they give each sample's attempt and each call's reward and weights version.
        advantage_estimator / credit_assignment: the names of the settings that made the advantages.
        staleness: the staleness bound the batch was built under (asynchronous training); ``None``: synchronous,
            every call's ``staleness`` is ``None`` and its weight 1.

    Returns:
        :class:`~agentbolt.types.TrainedSample` records; ``token_advantages``/``token_returns`` only for samples
        that carry per-token values (``gae``), restricted to their trained tokens.

    Raises:
        AgentboltError: a sample without ``calls``, or whose rollout or calls are not among ``trajectories`` (a bug:
            the batch was not made from them).
    """
    by_rollout = {t.rollout_id: t for t in trajectories}
    records: list[TrainedSample] = []
    for index, sample in enumerate(samples):
        trajectory = by_rollout.get(sample.rollout_id)
        if trajectory is None or not sample.calls:
            raise AgentboltError(
                f"sample {index} of step {train_step} (rollout {sample.rollout_id}) has no calls or no trajectory; "
                "record batches made by samples_for_step from the step's trajectories"
            )
        transitions = {t.span_id: t for t in trajectory.transitions}
        calls: list[TrainedCall] = []
        for call in sample.calls:
            transition = transitions.get(call.span_id)
            if transition is None or call.span_id is None:
                raise AgentboltError(
                    f"sample {index} of step {train_step}: call {call.span_id} is not in its trajectory"
                )
            calls.append(_call(transition, call.response_start, call.response_end, staleness))
        positions = [k for k, m in enumerate(sample.loss_mask) if m]
        records.append(
            TrainedSample(
                train_step=train_step,
                sample_index=index,
                rollout_id=sample.rollout_id,
                attempt_id=trajectory.attempt_id,
                calls=calls,
                loss_mask_ranges=loss_mask_ranges(sample.loss_mask),
                advantage=sample.advantage,
                token_advantages=None
                if sample.token_advantages is None
                else [sample.token_advantages[k] for k in positions],
                token_returns=None if sample.token_returns is None else [sample.token_returns[k] for k in positions],
                sampling_temperature=sample.sampling_temperature,
                trained=update_can_learn(sample),
                advantage_estimator=advantage_estimator,
                credit_assignment=credit_assignment,
            )
        )
    return records


async def record_trained_batch(
    store: LightningStore,
    train_step: int,
    samples: Sequence[TrainingSample],
    trajectories: Sequence[Trajectory],
    *,
    config: GRPOConfig,
    staleness: StalenessSettings | None = None,
) -> list[TrainedSample]:
    """Write what the update of ``train_step`` is about to train on (:func:`trained_samples`) to the store, replacing
    any earlier record of that step (a resumed run redoing it); return the records.

    Raises:
        AgentboltError: see :func:`trained_samples`; and the store's errors (e.g. BackendError when it is down).
    """
    records = trained_samples(
        train_step,
        samples,
        trajectories,
        advantage_estimator=config.advantage_estimator,
        credit_assignment=config.credit_assignment,
        staleness=staleness,
    )
    await store.put_trained_samples(train_step, records)
    return records
