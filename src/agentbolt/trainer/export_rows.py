"""The ``rl`` rows of finished rollouts: training samples exactly as the trainer builds them, with their provenance.

Used by ``agentbolt export --format rl`` (:mod:`agentbolt.cli.export` writes them to JSON Lines or Parquet) and by the
dashboard's transitions route (:mod:`agentbolt.server.dashboard_api`, advantages of a rollout's group). Rollouts
are split into the trainer's step batches (by ``mode`` and ``metadata["train_step"]``), each batch goes through
:func:`~agentbolt.trainer.batch.select_trajectories` and :func:`~agentbolt.trainer.batch.samples_for_step` (credit
scheme, advantage estimator per ``(task_id, resources_id)`` group, merging). Columns (:data:`RL_COLUMNS`):
``prompt_token_ids`` are the sample's tokens before its first trained token, ``response_token_ids`` the rest;
``response_loss_mask`` and ``response_sampling_logprobs`` are aligned with ``response_token_ids`` (mask 1 on tokens the
model generated, 0 on tool/user tokens merged in between, whose logprob is 0.0); ``span_ids`` and
``transition_rewards`` list the merged LLM calls (gateway span ids) and the reward credit gave each. A rollout whose
``resources_id`` was left to claim time is grouped by its latest attempt's. :func:`sample_of_row` turns a row back into
the :class:`~agentbolt.algorithms.rl.samples.TrainingSample` the torch trainer consumes.

Pure functions over rollouts already read from a store (:class:`FinishedRollout`); no I/O. Importing this module does
not import torch (the trainer's batch code is imported when :func:`rl_rows` runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentbolt.algorithms.rl.samples import TrainingSample
from agentbolt.errors import AgentboltError, ConfigError
from agentbolt.types import Attempt, Rollout, RolloutMode, Span, Trajectory

RL_COLUMNS: tuple[str, ...] = (
    "rollout_id",
    "attempt_id",
    "task_id",
    "resources_id",
    "mode",
    "train_step",
    "span_ids",
    "prompt_token_ids",
    "response_token_ids",
    "response_loss_mask",
    "response_sampling_logprobs",
    "sampling_temperature",
    "advantage",
    "reward",
    "transition_rewards",
)
"""The columns of an ``rl`` export, in order (module docstring); ``reward`` is the rollout's final reward."""


@dataclass
class FinishedRollout:
    """One rollout read back: its latest attempt (``None`` if it never ran) and that attempt's spans."""

    rollout: Rollout
    attempt: Attempt | None
    spans: list[Span]


def _split(sample: TrainingSample) -> tuple[int, list[int], list[float]]:
    """``(P, response loss mask, response logprobs)``: P is the position of the sample's first trained token."""
    first = sample.loss_mask.index(1)
    if any(sample.sampling_logprobs[:first]):
        raise AgentboltError(f"sample of rollout {sample.rollout_id} has logprobs on untrained prompt tokens (a bug)")
    return first, sample.loss_mask[first:], sample.sampling_logprobs[first:]


def _calls_of_samples(trajectory: Trajectory, samples: Sequence[TrainingSample]) -> list[list[int]]:
    """Which transitions (indices) each sample of one trajectory holds. A sample's tokens are its last merged call's
    prompt + response, and every earlier merged call's prompt + response is a prefix of them; a call in none of the
    samples (its sample had no trained token) is left out."""
    out: list[list[int]] = [[] for _ in samples]
    j = 0
    for k, transition in enumerate(trajectory.transitions):
        if j >= len(samples):
            break
        tokens = [*transition.prompt_token_ids, *transition.response_token_ids]
        ids = samples[j].input_ids
        if tokens == ids:
            out[j].append(k)
            j += 1
        elif len(tokens) < len(ids) and ids[: len(tokens)] == tokens:
            out[j].append(k)
    if j != len(samples):
        raise AgentboltError(f"rollout {trajectory.rollout_id}: samples do not match its transitions (a bug)")
    return out


def rows_of_samples(
    trajectories: Sequence[Trajectory],
    samples: Sequence[TrainingSample],
    *,
    mode: RolloutMode,
    train_step: int | None = None,
) -> list[dict[str, Any]]:
    """The ``rl`` rows (:data:`RL_COLUMNS`) of one step batch: ``samples`` as made from ``trajectories`` by
    :func:`~agentbolt.trainer.batch.samples_for_step` (which wrote each transition's credited ``reward``)."""
    by_rollout: dict[str, list[TrainingSample]] = {}
    for sample in samples:
        by_rollout.setdefault(sample.rollout_id, []).append(sample)
    rows: list[dict[str, Any]] = []
    for trajectory in trajectories:
        own = by_rollout.get(trajectory.rollout_id, [])
        for sample, calls in zip(own, _calls_of_samples(trajectory, own), strict=True):
            n_prompt, mask, logprobs = _split(sample)
            transitions = [trajectory.transitions[k] for k in calls]
            rows.append(
                {
                    "rollout_id": trajectory.rollout_id,
                    "attempt_id": trajectory.attempt_id,
                    "task_id": trajectory.task_id,
                    "resources_id": trajectory.resources_id,
                    "mode": mode.value,
                    "train_step": train_step,
                    "span_ids": [t.span_id or "" for t in transitions],
                    "prompt_token_ids": sample.input_ids[:n_prompt],
                    "response_token_ids": sample.input_ids[n_prompt:],
                    "response_loss_mask": mask,
                    "response_sampling_logprobs": logprobs,
                    "sampling_temperature": sample.sampling_temperature,
                    "advantage": sample.advantage,
                    "reward": trajectory.final_reward,
                    "transition_rewards": [float(t.reward) if t.reward is not None else 0.0 for t in transitions],
                }
            )
    return rows


def _train_step_of(rollout: Rollout) -> int | None:
    value = rollout.metadata.get("train_step")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rl_rows(
    finished: Sequence[FinishedRollout],
    *,
    credit_assignment: str = "broadcast",
    advantage_estimator: str = "grpo",
    merge_samples: bool = True,
    agent_match: str | None = None,
    min_reward: float | None = None,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The ``rl`` rows of finished rollouts (module docstring) and counts of the rollouts left out, by reason.

    ``min_reward`` drops rollouts before the batches are formed, so advantages are computed over the kept ones.

    Raises:
        ConfigError: an unknown credit scheme or estimator, or ``gae`` (it needs the trainer's value head).
    """
    from agentbolt.algorithms.rl.advantages import VALUE_HEAD_ESTIMATOR, check_estimator_name
    from agentbolt.algorithms.rl.credit import build_credit_scheme
    from agentbolt.trainer.batch import samples_for_step, select_trajectories

    credit = build_credit_scheme(credit_assignment)
    check_estimator_name(advantage_estimator)
    if advantage_estimator == VALUE_HEAD_ESTIMATOR:
        raise ConfigError(
            "advantage estimator gae needs the trainer's value head, which an export does not have; export with a "
            "group estimator such as grpo, rloo or reinforce_pp"
        )
    skipped: dict[str, int] = {}
    batches: dict[tuple[str, int | None], list[FinishedRollout]] = {}
    for item in finished:
        reward = item.rollout.final_reward
        if min_reward is not None and (reward is None or reward < min_reward):
            skipped["below min reward"] = skipped.get("below min reward", 0) + 1
            continue
        rollout = item.rollout
        if rollout.resources_id is None and item.attempt is not None:  # group by what the attempt ran against
            rollout = rollout.model_copy(update={"resources_id": item.attempt.resources_id})
        key = (rollout.mode.value, _train_step_of(rollout))
        batches.setdefault(key, []).append(FinishedRollout(rollout, item.attempt, item.spans))
    rows: list[dict[str, Any]] = []
    for (mode, train_step), items in batches.items():
        selection = select_trajectories([(i.rollout, i.attempt, i.spans) for i in items], agent_match=agent_match)
        for reason, count in selection.infra_failures.items():
            skipped[f"infrastructure failure ({reason})"] = skipped.get(f"infrastructure failure ({reason})", 0) + count
        if selection.n_failed:
            skipped["failed or no reward"] = skipped.get("failed or no reward", 0) + selection.n_failed
        if selection.n_unmatched:
            skipped["no call of a matching agent"] = (
                skipped.get("no call of a matching agent", 0) + selection.n_unmatched
            )
        step = samples_for_step(
            selection.trajectories, credit=credit, estimator=advantage_estimator, merge=merge_samples
        )
        rows.extend(
            rows_of_samples(selection.trajectories, step.batch.samples, mode=RolloutMode(mode), train_step=train_step)
        )
    return rows, skipped


def sample_of_row(row: Mapping[str, Any]) -> TrainingSample:
    """The :class:`TrainingSample` of one ``rl`` row (the inverse of :func:`rows_of_samples`).

    Raises:
        ConfigError: a column is missing or the lists do not fit together.
    """
    try:
        prompt = [int(x) for x in row["prompt_token_ids"]]
        response = [int(x) for x in row["response_token_ids"]]
        mask = [int(x) for x in row["response_loss_mask"]]
        logprobs = [float(x) for x in row["response_sampling_logprobs"]]
        return TrainingSample(
            input_ids=[*prompt, *response],
            loss_mask=[0] * len(prompt) + mask,
            sampling_logprobs=[0.0] * len(prompt) + logprobs,
            advantage=float(row["advantage"]),
            rollout_id=str(row["rollout_id"]),
            sampling_temperature=float(row["sampling_temperature"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"not a row of an rl export ({type(exc).__name__}: {exc}); columns: {RL_COLUMNS}") from exc
