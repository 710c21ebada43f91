"""The ``rl`` rows of finished rollouts: training samples exactly as the trainer built them, with their provenance.

Used by ``agentbolt export --kind rl`` (:mod:`agentbolt.cli.export` writes them to JSON Lines or Parquet) and by the
dashboard's transitions route (:mod:`agentbolt.server.dashboard_api`, advantages of a rollout's group).

Two sources (column ``advantage_source``):

- ``trained``: the samples a policy update received, from the trainer's record in the store
  (:class:`~agentbolt.types.TrainedSample`, :func:`trained_rows`): its advantages, loss masks, sample boundaries and
  credited rewards, whatever estimator, credit scheme, staleness rule or ``agent_match`` the run used. The tokens and
  logprobs are read from the recorded LLM spans.
- ``recomputed``: rollouts without a record (val/test rollouts, stores written before the trainer recorded its
  batches) are split into the trainer's step batches (by ``mode`` and ``metadata["train_step"]``), and each batch goes
  through the trainer's own batch step (:meth:`~agentbolt.adapter.lightning_rl.LightningRL.batch`: the given credit
  scheme, advantage estimator per ``(task_id, resources_id)`` group, merging).

Columns (:data:`RL_COLUMNS`):
``prompt_token_ids`` are the sample's tokens before its first trained token, ``response_token_ids`` the rest;
``response_loss_mask`` and ``response_sampling_logprobs`` are aligned with ``response_token_ids`` (mask 1 on tokens the
model generated, 0 on tool/user tokens merged in between, whose logprob is 0.0); ``span_ids`` and
``transition_rewards`` list the merged LLM calls (gateway span ids) and the reward credit gave each. A rollout whose
``resources_id`` was left to claim time is grouped by its latest attempt's. :func:`sample_of_row` turns a row back into
the :class:`~agentbolt.adapter.samples.TrainingSample` the torch trainer consumes. ``advantage_estimator`` and
``credit_assignment`` name the settings that made ``advantage``; ``trained`` says whether the update could learn from a
recorded sample (False: skipped for an advantage of exactly 0; ``None`` when recomputed); under ``gae``,
``response_token_advantages`` and ``response_token_returns`` hold the per-token values (0.0 on untrained tokens;
``None`` otherwise).

Pure functions over rollouts already read from a store (:class:`FinishedRollout`); no I/O and no torch, so the server
(L2) and ``agentbolt export`` use them with the ``[server]`` extra alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentbolt.adapter import build_trajectory
from agentbolt.adapter.advantages import VALUE_HEAD_ESTIMATOR
from agentbolt.adapter.batch import TrajectorySelection, select_trajectories
from agentbolt.adapter.lightning_rl import LightningRL
from agentbolt.adapter.samples import TrainingSample
from agentbolt.config import GRPOConfig
from agentbolt.errors import AgentboltError, ConfigError
from agentbolt.types import Attempt, Rollout, RolloutMode, Span, TrainedSample, Trajectory

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
    "advantage_source",
    "advantage_estimator",
    "credit_assignment",
    "trained",
    "response_token_advantages",
    "response_token_returns",
)
"""The columns of an ``rl`` export, in order (module docstring); ``reward`` is the rollout's final reward."""

TRAINED: Final = "trained"
RECOMPUTED: Final = "recomputed"
"""The values of the ``advantage_source`` column."""


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
    advantage_estimator: str = "grpo",
    credit_assignment: str = "broadcast",
) -> list[dict[str, Any]]:
    """The recomputed ``rl`` rows (:data:`RL_COLUMNS`) of one step batch: ``samples`` as made from ``trajectories``
    by :func:`~agentbolt.adapter.batch.samples_for_step` (which wrote each transition's credited ``reward``) with
    the named settings."""
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
                    "advantage_source": RECOMPUTED,
                    "advantage_estimator": advantage_estimator,
                    "credit_assignment": credit_assignment,
                    "trained": None,
                    "response_token_advantages": None,
                    "response_token_returns": None,
                }
            )
    return rows


def _trained_row(item: FinishedRollout, record: TrainedSample) -> dict[str, Any]:
    """The ``rl`` row of one recorded sample, its tokens and logprobs read from the attempt's spans.

    Raises:
        AgentboltError: the record names a call the spans do not have, or offsets that do not match its tokens.
    """
    assert item.attempt is not None
    trajectory = build_trajectory(item.rollout, item.attempt.attempt_id, item.spans)
    by_span = {t.span_id: t for t in trajectory.transitions}
    calls = [by_span.get(call.span_id) for call in record.calls]
    last = calls[-1]
    input_ids = [] if last is None else [*last.prompt_token_ids, *last.response_token_ids]
    if any(t is None for t in calls) or len(input_ids) != record.n_tokens:
        raise AgentboltError(
            f"the trained sample {record.sample_index} of step {record.train_step} does not match the spans of attempt "
            f"{record.attempt_id} (rollout {record.rollout_id}); the store is inconsistent"
        )
    mask = record.loss_mask()
    logprobs = [0.0] * len(input_ids)
    for call, transition in zip(record.calls, calls, strict=True):
        assert transition is not None
        if input_ids[call.response_start : call.response_end] != transition.response_token_ids:
            raise AgentboltError(f"call {call.span_id} of trained sample {record.sample_index}: offsets do not match")
        for k, logprob in zip(range(call.response_start, call.response_end), transition.sampling_logprobs, strict=True):
            logprobs[k] = float(logprob) if mask[k] else 0.0
    first = mask.index(1)
    per_token: dict[str, list[float] | None] = {"response_token_advantages": None, "response_token_returns": None}
    for column, values in (
        ("response_token_advantages", record.token_advantages),
        ("response_token_returns", record.token_returns),
    ):
        if values is not None:
            at = dict(zip(record.trained_positions(), values, strict=True))
            per_token[column] = [at.get(k, 0.0) for k in range(first, len(input_ids))]
    return {
        "rollout_id": record.rollout_id,
        "attempt_id": record.attempt_id,
        "task_id": trajectory.task_id,
        "resources_id": trajectory.resources_id or item.attempt.resources_id,
        "mode": item.rollout.mode.value,
        "train_step": record.train_step,
        "span_ids": [call.span_id for call in record.calls],
        "prompt_token_ids": input_ids[:first],
        "response_token_ids": input_ids[first:],
        "response_loss_mask": mask[first:],
        "response_sampling_logprobs": logprobs[first:],
        "sampling_temperature": record.sampling_temperature,
        "advantage": record.advantage,
        "reward": trajectory.final_reward,
        "transition_rewards": [call.reward if call.reward is not None else 0.0 for call in record.calls],
        "advantage_source": TRAINED,
        "advantage_estimator": record.advantage_estimator,
        "credit_assignment": record.credit_assignment,
        "trained": record.trained,
        **per_token,
    }


def trained_rows(
    finished: Sequence[FinishedRollout], records: Sequence[TrainedSample]
) -> tuple[list[dict[str, Any]], set[str]]:
    """The ``rl`` rows of the recorded samples whose attempt is the latest of a rollout in ``finished`` (module
    docstring, ``trained``), by ``train_step`` then ``sample_index``; and the ids of the rollouts they cover.

    Raises:
        AgentboltError: a record does not match its attempt's spans (an inconsistent store).
    """
    latest = {(f.rollout.rollout_id, f.attempt.attempt_id): f for f in finished if f.attempt is not None}
    kept = sorted(
        (r for r in records if (r.rollout_id, r.attempt_id) in latest), key=lambda r: (r.train_step, r.sample_index)
    )
    rows = [_trained_row(latest[(r.rollout_id, r.attempt_id)], r) for r in kept]
    return rows, {r.rollout_id for r in kept}


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
    records: Sequence[TrainedSample] = (),
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The ``rl`` rows of finished rollouts (module docstring) and counts of the rollouts left out, by reason.

    Rollouts with a trainer's record among ``records`` come first, as trained (:func:`trained_rows`); a train rollout
    of a recorded step without one was not in that step's batch and is left out. The others are recomputed with
    ``credit_assignment``, ``advantage_estimator``, ``merge_samples`` and ``agent_match`` (which therefore apply to
    recomputed rows only). ``min_reward`` drops rollouts first, so recomputed advantages are over the kept ones.

    Raises:
        ConfigError: an unknown credit scheme or estimator, or ``gae`` (it needs the trainer's value head).
        AgentboltError: a record does not match its attempt's spans.
    """
    if advantage_estimator == VALUE_HEAD_ESTIMATOR:
        raise ConfigError(
            "advantage estimator gae needs the trainer's value head, which an export does not have; export with a "
            "group estimator such as grpo, rloo or reinforce_pp"
        )
    algorithm = LightningRL(
        GRPOConfig(
            credit_assignment=credit_assignment, advantage_estimator=advantage_estimator, merge_samples=merge_samples
        ),
        agent_match=agent_match,
    )
    skipped: dict[str, int] = {}
    kept: list[FinishedRollout] = []
    for item in finished:
        reward = item.rollout.final_reward
        if min_reward is not None and (reward is None or reward < min_reward):
            skipped["below min reward"] = skipped.get("below min reward", 0) + 1
            continue
        kept.append(item)
    rows, covered = trained_rows(kept, records)
    recorded_steps = {r.train_step for r in records}

    def count(selection: TrajectorySelection, *, not_in_batch: bool = False) -> None:
        reasons = {f"infrastructure failure ({reason})": n for reason, n in selection.infra_failures.items()}
        reasons["failed or no reward"] = selection.n_failed
        reasons["no call of a matching agent"] = selection.n_unmatched
        if not_in_batch:  # trainable by the rules, yet the trainer did not train it (e.g. its agent_match)
            reasons["not in its step's trained batch"] = len(selection.trajectories)
        for reason, n in reasons.items():
            if n:
                skipped[reason] = skipped.get(reason, 0) + n

    left_out: list[FinishedRollout] = []  # train rollouts of a recorded step that are not in its record
    batches: dict[tuple[str, int | None], list[FinishedRollout]] = {}
    for item in kept:
        rollout = item.rollout
        if rollout.rollout_id in covered:
            continue
        if rollout.mode is RolloutMode.TRAIN and _train_step_of(rollout) in recorded_steps:
            left_out.append(item)
            continue
        if rollout.resources_id is None and item.attempt is not None:  # group by what the attempt ran against
            rollout = rollout.model_copy(update={"resources_id": item.attempt.resources_id})
        key = (rollout.mode.value, _train_step_of(rollout))
        batches.setdefault(key, []).append(FinishedRollout(rollout, item.attempt, item.spans))
    if left_out:
        count(select_trajectories([(i.rollout, i.attempt, i.spans) for i in left_out]), not_in_batch=True)
    for (mode, train_step), items in batches.items():
        batch = algorithm.batch([(i.rollout, i.attempt, i.spans) for i in items], versions=[])
        count(batch.selection)
        rows.extend(
            rows_of_samples(
                batch.trajectories,
                batch.samples,
                mode=RolloutMode(mode),
                train_step=train_step,
                advantage_estimator=advantage_estimator,
                credit_assignment=credit_assignment,
            )
        )
    return rows, skipped


def sample_of_row(row: Mapping[str, Any]) -> TrainingSample:
    """The :class:`TrainingSample` of one ``rl`` row (the inverse of :func:`rows_of_samples` and :func:`trained_rows`;
    ``gae`` rows get their per-token values back).

    Raises:
        ConfigError: a column is missing or the lists do not fit together.
    """
    try:
        prompt = [int(x) for x in row["prompt_token_ids"]]
        response = [int(x) for x in row["response_token_ids"]]
        mask = [int(x) for x in row["response_loss_mask"]]
        logprobs = [float(x) for x in row["response_sampling_logprobs"]]
        advantages, returns = (
            None if row.get(column) is None else [0.0] * len(prompt) + [float(x) for x in row[column]]
            for column in ("response_token_advantages", "response_token_returns")
        )
        return TrainingSample(
            input_ids=[*prompt, *response],
            loss_mask=[0] * len(prompt) + mask,
            sampling_logprobs=[0.0] * len(prompt) + logprobs,
            advantage=float(row["advantage"]),
            rollout_id=str(row["rollout_id"]),
            sampling_temperature=float(row["sampling_temperature"]),
            token_advantages=advantages,
            token_returns=returns,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"not a row of an rl export ({type(exc).__name__}: {exc}); columns: {RL_COLUMNS}") from exc
