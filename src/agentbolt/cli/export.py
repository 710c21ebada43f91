"""``agentbolt export``: a store's finished rollouts as a data set file (JSON Lines or Parquet).

Two kinds of rows:

- **sft** (supervised fine-tuning), OpenAI's chat fine-tuning format, one object per succeeded rollout:
  ``{"messages": [...], "tools": [...]}`` (``tools`` only when the call sent some). The messages are those of the
  latest attempt's last gateway LLM call that returned a message: its request messages, then the assistant message
  it returned (:func:`agentbolt.algorithms.apo.store_evaluator.conversation`; a tool loop re-sends the whole
  conversation, so the last call holds it all). Keys whose value is ``None`` are left out of each message.
- **rl**, one row per training sample exactly as the trainer built it, with its provenance: the rows and their
  columns are built by :func:`agentbolt.adapter.export_rows.rl_rows` (see :mod:`agentbolt.adapter.export_rows`,
  shared with the dashboard's transitions route). By default (``advantages: recorded``) the rollouts a trainer
  recorded come out as the update received them: its advantages, loss masks, sample boundaries and credited rewards
  (column ``advantage_source`` = ``trained``), whatever settings the run used; the other rollouts (a store written
  before the trainer recorded its batches, or val/test rollouts asked for with ``mode``: ``rl`` exports the
  training rollouts only unless told otherwise) are recomputed with ``credit_assignment``,
  ``advantage_estimator``, ``merge_samples`` and ``agent_match`` (``advantage_source`` = ``recomputed``).
  ``advantages: recomputed`` recomputes every rollout, records or not. :func:`load_rl_samples` reads a file back into
  the :class:`~agentbolt.adapter.samples.TrainingSample` objects the torch trainer consumes.

Parquet needs pyarrow (``pip install 'agentbolt[export]'``). A nested SFT column that pyarrow cannot give one type
(e.g. messages whose ``content`` is text in one row and a list of parts in another) is written as JSON text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, model_validator
from rich.console import Console

from agentbolt import semconv
from agentbolt.adapter.export_rows import FinishedRollout, rl_rows, sample_of_row
from agentbolt.adapter.join import is_gateway_llm_span
from agentbolt.adapter.samples import TrainingSample
from agentbolt.algorithms.apo.store_evaluator import conversation
from agentbolt.errors import ConfigError
from agentbolt.types import RolloutMode, RolloutStatus, Span, TrainedSample

ExportKind = Literal["sft", "rl"]
FORMAT_OF_SUFFIX: dict[str, str] = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
"""The format a file name's suffix says (``--format`` left out: that one; given: they must agree)."""
ExportFormat = Literal["jsonl", "parquet"]
AdvantageChoice = Literal["recorded", "recomputed"]

PYARROW_HINT = "pip install 'agentbolt[export]'"
"""How to get pyarrow for ``--format parquet``."""


class ExportConfig(BaseModel):
    """What ``agentbolt export`` writes.

    Attributes:
        store: the store (see :func:`agentbolt.cli.stores.open_store`).
        kind: ``sft`` or ``rl`` rows (module docstring).
        format: ``jsonl`` or ``parquet``; left out, the one ``out``'s suffix names (``.parquet``/``.pq``: Parquet,
            else JSON Lines); a suffix of the other format is refused.
        out: the file to write (replaced when it exists).
        mode: only rollouts of this mode; ``None``: all. Given as ``all`` it becomes ``None``; not given, it is
            ``train`` for ``rl`` (validation and test rollouts are greedy evaluation runs on held-out tasks, not
            training data) and ``None`` for ``sft``.
        resources_id: only rollouts that ran against this resources version.
        min_reward: only rollouts whose final reward is at least this (rollouts without one are left out).
        credit_assignment / advantage_estimator / merge_samples / agent_match: as in
            :class:`agentbolt.config.GRPOConfig` (``rl`` only; with ``advantages: recorded``, for the rollouts the
            trainer recorded nothing for).
        advantages: ``recorded`` (default): the trainer's recorded samples where there are some, recomputed
            elsewhere; ``recomputed``: every rollout recomputed with the settings above (module docstring).
    """

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _defaults_from_kind_and_name(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        mode = data.get("mode")
        modes = [m.value for m in RolloutMode]
        if isinstance(mode, str) and mode not in (*modes, "all"):
            raise ValueError(f"--mode should be {', '.join(modes)} or all, not {mode!r}")
        if mode == "all":
            data["mode"] = None
        elif mode is None and data.get("kind") == "rl":
            data["mode"] = RolloutMode.TRAIN
        out = data.get("out")
        if isinstance(out, str) and out.endswith(("/", os.sep)):
            raise ValueError(f"--out {out} ends in a path separator: give a file name, e.g. {out}export.jsonl")
        if out is not None:
            out = Path(out)
            if out.is_dir():
                raise ValueError(f"--out {out} is a folder: give a file name in it, e.g. {out / 'export.jsonl'}")
            named = FORMAT_OF_SUFFIX.get(out.suffix.lower())
            chosen = data.get("format")
            if chosen is None:
                data["format"] = named or "jsonl"
            elif named is not None and chosen in get_args(ExportFormat) and named != chosen:
                raise ValueError(
                    f"--out {out.name} names a {named} file but --format is {chosen}: end the name in .{chosen}, "
                    "or leave --format out to write what the name says"
                )
        return data

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
    advantages: AdvantageChoice = "recorded"


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


def _sft_filter_hint(finished: Sequence[FinishedRollout], mode_chosen: bool) -> str:
    """What an SFT export without ``--min-reward`` kept: every succeeded rollout whatever its reward (SFT copies
    its answers, the poor ones too), of every mode unless ``--mode`` was given; and the options that filter."""
    kept = [item.rollout for item in finished if item.rollout.status is RolloutStatus.SUCCEEDED]
    low = sum(1 for r in kept if r.final_reward is None or r.final_reward <= 0)
    modes: dict[str, int] = {}
    for r in kept:
        modes[r.mode.value] = modes.get(r.mode.value, 0) + 1
    kept_text = f"kept every succeeded rollout whatever its reward ({low} of {len(kept)} scored 0 or less or none)"
    hint = "--min-reward R keeps only answers scored R or more"
    if not mode_chosen and len(modes) > 1:
        kept_text += ", of every mode (" + ", ".join(f"{m} {n}" for m, n in sorted(modes.items())) + ")"
        hint += ", --mode train only the training rollouts"
    return f"{kept_text}: {hint}"


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
        records: list[TrainedSample] = []
        if config.kind == "rl" and config.advantages == "recorded":
            records = await store.query_trained_samples()
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
            records=records,
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
        of_mode = f" {config.mode.value}" if config.mode is not None else ""
        console.print(
            f"wrote {len(rows)} {config.kind} {unit} from {len(finished)} finished{of_mode} rollouts to {config.out}"
        )
        console.print(f"left out: {why}" if skipped else "nothing left out")
        if config.kind == "sft" and config.min_reward is None:
            console.print(_sft_filter_hint(finished, config.mode is not None), markup=False, highlight=False)
        if config.kind == "rl":
            n_trained = sum(1 for row in rows if row["advantage_source"] == "trained")
            console.print(
                f"advantages: {n_trained} rows as the trainer recorded them, {len(rows) - n_trained} recomputed "
                f"({config.advantage_estimator}, {config.credit_assignment} credit)"
            )
        if as_json:
            console.print(f"columns written as JSON text (no single Parquet type): {', '.join(as_json)}")
    return len(rows)
