"""``agentbolt export``: a store's finished rollouts as a data set file (JSON Lines or Parquet).

Two kinds of rows:

- **sft** (supervised fine-tuning), OpenAI's chat fine-tuning format, one object per succeeded rollout:
  ``{"messages": [...], "tools": [...]}`` (``tools`` only when the call sent some). The messages are those of the
  latest attempt's last gateway LLM call that returned a message: its request messages, then the assistant message
  it returned (:func:`agentbolt.algorithms.apo.store_evaluator.conversation`; a tool loop re-sends the whole
  conversation, so the last call holds it all). Keys whose value is ``None`` are left out of each message.
- **rl**, one row per training sample exactly as the trainer builds it: rollouts are split into the trainer's step
  batches (by ``mode`` and ``metadata["train_step"]``), each batch goes through
  :func:`~agentbolt.trainer.batch.select_trajectories` and :func:`~agentbolt.trainer.batch.samples_for_step`
  (credit scheme, advantage estimator per ``(task_id, resources_id)`` group, merging). Columns (:data:`RL_COLUMNS`):
  ``prompt_token_ids`` are the sample's tokens before its first trained token, ``response_token_ids`` the rest;
  ``response_loss_mask`` and ``response_sampling_logprobs`` are aligned with ``response_token_ids`` (mask 1 on
  tokens the model generated, 0 on tool/user tokens merged in between, whose logprob is 0.0); ``span_ids`` and
  ``transition_rewards`` list the merged LLM calls (gateway span ids) and the reward credit gave each. A rollout
  whose ``resources_id`` was left to claim time is grouped by its latest attempt's. :func:`load_rl_samples` reads
  a file back into the :class:`~agentbolt.algorithms.rl.samples.TrainingSample` objects the torch trainer consumes.

Parquet needs pyarrow (``pip install 'agentbolt[export]'``). A nested SFT column that pyarrow cannot give one type
(e.g. messages whose ``content`` is text in one row and a list of parts in another) is written as JSON text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from rich.console import Console

from agentbolt import semconv
from agentbolt.adapter.join import is_gateway_llm_span
from agentbolt.algorithms.apo.store_evaluator import conversation
from agentbolt.algorithms.rl.samples import TrainingSample
from agentbolt.cli.stores import FinishedRollout
from agentbolt.errors import AgentboltError, ConfigError
from agentbolt.types import Rollout, RolloutMode, RolloutStatus, Span, Trajectory

ExportKind = Literal["sft", "rl"]
ExportFormat = Literal["jsonl", "parquet"]

PYARROW_HINT = "pip install 'agentbolt[export]'"
"""How to get pyarrow for ``--format parquet``."""

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


class ExportConfig(BaseModel):
    """What ``agentbolt export`` writes.

    Attributes:
        store: the store (see :func:`agentbolt.cli.stores.open_store`).
        kind: ``sft`` or ``rl`` rows (module docstring).
        format: ``jsonl`` or ``parquet``.
        out: the file to write (replaced when it exists).
        mode: only rollouts of this mode; ``None``: all.
        resources_id: only rollouts that ran against this resources version.
        min_reward: only rollouts whose final reward is at least this (rollouts without one are left out).
        credit_assignment / advantage_estimator / merge_samples / agent_match: as in
            :class:`agentbolt.config.GRPOConfig` (``rl`` only).
    """

    model_config = ConfigDict(frozen=True)

    store: str
    kind: ExportKind
    format: ExportFormat = "jsonl"
    out: Path
    mode: RolloutMode | None = None
    resources_id: str | None = None
    min_reward: float | None = None
    credit_assignment: str = "broadcast"
    advantage_estimator: str = "grpo"
    merge_samples: bool = True
    agent_match: str | None = None


# ----------------------------------------------------------------------------------------------------------- sft rows
def _clean_message(message: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if value is not None}


def sft_row(spans: Sequence[Span]) -> dict[str, Any] | None:
    """The SFT row of one attempt's spans (module docstring); ``None`` when no gateway call returned a message."""
    calls = [
        span
        for span in sorted(spans, key=lambda s: s.sequence_id)
        if is_gateway_llm_span(span) and isinstance(span.attributes.get(semconv.LLM_RESPONSE_MESSAGE), Mapping)
    ]
    if not calls:
        return None
    last = calls[-1]
    row: dict[str, Any] = {"messages": [_clean_message(m) for m in conversation([last])]}
    tools = last.attributes.get(semconv.LLM_REQUEST_TOOLS)
    if isinstance(tools, list) and tools:
        row["tools"] = tools
    return row


def sft_rows(finished: Sequence[FinishedRollout], *, min_reward: float | None = None) -> tuple[list[dict], dict]:
    """SFT rows of the succeeded rollouts (final reward ``>= min_reward`` when given), and counts of the rest.

    Returns:
        ``(rows, skipped)``: ``skipped`` maps a reason (``"not succeeded"``, ``"below min reward"``, ``"no gateway
        call"``) to a count of rollouts.
    """
    rows: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    for item in finished:
        if item.rollout.status is not RolloutStatus.SUCCEEDED or item.attempt is None:
            skip("not succeeded")
            continue
        reward = item.rollout.final_reward
        if min_reward is not None and (reward is None or reward < min_reward):
            skip("below min reward")
            continue
        row = sft_row(item.spans)
        if row is None:
            skip("no gateway call")
            continue
        rows.append(row)
    return rows, skipped


# ------------------------------------------------------------------------------------------------------------ rl rows
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


def load_rl_samples(path: str | Path) -> list[TrainingSample]:
    """The training samples of an ``rl`` export file (JSON Lines or Parquet, told apart by content), in file order.

    Raises:
        ConfigError: the file cannot be read, is not an ``rl`` export, or is Parquet and pyarrow is missing.
    """
    return [sample_of_row(row) for row in read_rows(path)]


# ------------------------------------------------------------------------------------------------------ file formats
def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise ConfigError(
            f"Parquet files need pyarrow, which is not installed: {PYARROW_HINT}, or use --format jsonl"
        ) from exc
    return pyarrow


def _arrow_column(pa: Any, values: list[Any]) -> tuple[Any, bool]:
    """``(array, as_json)``: the column as pyarrow infers it, else as JSON text."""
    try:
        return pa.array(values), False
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in values]), True


def write_rows(rows: Sequence[Mapping[str, Any]], path: Path, fmt: ExportFormat) -> list[str]:
    """Write ``rows`` to ``path`` (replaced whole: written beside it, then renamed). Columns are the union of the
    rows' keys in first-seen order; a row without a column has null there (Parquet) or lacks the key (JSON Lines).

    Returns:
        The Parquet columns written as JSON text (see the module docstring); ``[]`` for JSON Lines.

    Raises:
        ConfigError: Parquet without pyarrow, or the file cannot be written.
    """
    pa = _pyarrow() if fmt == "parquet" else None
    tmp = path.with_name(f".{path.name}.tmp")
    as_json: list[str] = []
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if pa is None:
            with tmp.open("w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        else:
            columns: dict[str, None] = {}
            for row in rows:
                columns.update(dict.fromkeys(row))
            arrays = []
            for name in columns:
                array, encoded = _arrow_column(pa, [row.get(name) for row in rows])
                arrays.append(array)
                if encoded:
                    as_json.append(name)
            pa.parquet.write_table(pa.Table.from_arrays(arrays, names=list(columns)), tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    return as_json


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of an export file: Parquet when it starts with ``PAR1``, else JSON Lines.

    Raises:
        ConfigError: the file is missing or unreadable, or Parquet without pyarrow.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            magic = f.read(4)
        if magic == b"PAR1":
            return _pyarrow().parquet.read_table(path).to_pylist()
        with path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the export file {path}: {exc}") from exc


# ------------------------------------------------------------------------------------------------------------ command
async def run_export(config: ExportConfig, *, token: str | None = None, console: Console | None = None) -> int:
    """Read the store, build the rows of ``config.kind``, write ``config.out``; return the number of rows written.

    Progress and the summary go to ``console`` (``None``: silent).

    Raises:
        ConfigError: a bad store or file (see :func:`~agentbolt.cli.stores.open_store`, :func:`write_rows`), an
            empty store, or no rollout matching the filters; the message says which filter left nothing.
        AgentboltError: the store failed (e.g. the server is unreachable or refused the token).
    """
    from agentbolt.cli.stores import TERMINAL, open_store, query_all_rollouts, read_finished
    from agentbolt.store import redact_url

    if config.format == "parquet":
        _pyarrow()  # fail before reading the whole store
    store = open_store(config.store, token=token)
    try:
        everything = await query_all_rollouts(store, mode=config.mode)
        if not everything:
            where = f" of mode {config.mode.value}" if config.mode is not None else ""
            raise ConfigError(
                f"the store {redact_url(config.store)} has no rollouts{where}; run a training or evaluation job "
                "against it first" + (", or drop --mode" if config.mode is not None else "")
            )
        terminal = [r for r in everything if r.status in TERMINAL]
        finished = await read_finished(store, terminal, resources_id=config.resources_id, console=console)
    finally:
        await store.close()
    if not finished:
        raise ConfigError(
            f"no finished rollout ran against resources {config.resources_id!r} ({len(terminal)} finished rollouts "
            f"read); check the id (rollouts list theirs in `agentbolt inspect`) or drop --resources"
            if config.resources_id is not None
            else f"none of the {len(everything)} rollouts has finished yet; wait for them, then export again"
        )
    if config.kind == "sft":
        rows, skipped = sft_rows(finished, min_reward=config.min_reward)
    else:
        rows, skipped = rl_rows(
            finished,
            credit_assignment=config.credit_assignment,
            advantage_estimator=config.advantage_estimator,
            merge_samples=config.merge_samples,
            agent_match=config.agent_match,
            min_reward=config.min_reward,
        )
    why = ", ".join(f"{count} {reason}" for reason, count in skipped.items()) or "none left out"
    if not rows:
        raise ConfigError(
            f"no {config.kind} rows from the {len(finished)} finished rollouts read ({why}); relax --min-reward, "
            "--mode or --resources, or check that the agent calls the gateway's base URL"
        )
    as_json = write_rows(rows, config.out, config.format)
    if console is not None:
        unit = "samples" if config.kind == "rl" else "conversations"
        console.print(f"wrote {len(rows)} {config.kind} {unit} from {len(finished)} finished rollouts to {config.out}")
        console.print(f"left out: {why}")
        if as_json:
            console.print(f"columns written as JSON text (no single Parquet type): {', '.join(as_json)}")
    return len(rows)
