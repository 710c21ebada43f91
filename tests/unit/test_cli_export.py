"""agentbolt export / inspect, the pure parts, on hand-made spans: SFT rows, RL rows built by the trainer's own
pipeline (and read back into the same samples), the file formats (read back with pandas), the span tree."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agentbolt import semconv
from agentbolt.adapter.batch import samples_for_step, select_trajectories
from agentbolt.adapter.credit import build_credit_scheme
from agentbolt.cli.export import load_rl_samples, read_rows, rl_rows, sample_of_row, sft_row, sft_rows, write_rows
from agentbolt.cli.inspect_cmd import span_tree
from agentbolt.cli.stores import FinishedRollout, open_store
from agentbolt.errors import ConfigError
from agentbolt.trainer.trained_record import trained_samples
from agentbolt.types import Attempt, AttemptStatus, Rollout, RolloutMode, RolloutStatus, Span, SpanStatus

OK, DONE = RolloutStatus.SUCCEEDED, AttemptStatus.SUCCEEDED


def _rollout(rollout_id: str, task_id: str, reward: float | None, **kw: Any) -> Rollout:
    metadata = {"task_id": task_id, **kw.pop("metadata", {})}
    return Rollout(
        rollout_id=rollout_id,
        input={"q": task_id},
        enqueue_time=1.0,
        status=kw.pop("status", OK),
        final_reward=reward,
        resources_id=kw.pop("resources_id", "rs-1"),
        metadata=metadata,
        **kw,
    )


def _attempt(rollout_id: str, status: AttemptStatus = DONE) -> Attempt:
    return Attempt(rollout_id=rollout_id, attempt_id=f"at-{rollout_id}", sequence_id=1, status=status, start_time=1.0)


def _span(rollout_id: str, seq: int, name: str, attributes: dict[str, Any], **kw: Any) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=f"at-{rollout_id}",
        sequence_id=seq,
        span_id=f"sp-{rollout_id}-{seq}",
        trace_id="tr",
        name=name,
        start_time=10.0 + seq,
        end_time=10.5 + seq,
        attributes=attributes,
        **kw,
    )


def _llm(rollout_id: str, seq: int, prompt: list[int], response: list[int], **extra: Any) -> Span:
    attributes = {
        semconv.LLM_PROMPT_TOKEN_IDS: prompt,
        semconv.LLM_RESPONSE_TOKEN_IDS: response,
        semconv.LLM_RESPONSE_LOGPROBS: [-0.1 * (i + 1) for i in range(len(response))],
        semconv.LLM_TRAINABLE: True,
        semconv.GEN_AI_RESPONSE_FINISH_REASON: ["stop"],
        semconv.LLM_REQUEST_MESSAGES: [{"role": "user", "content": f"q{seq}"}],
        semconv.LLM_RESPONSE_MESSAGE: {"role": "assistant", "content": f"a{seq}", "tool_calls": None},
        **extra,
    }
    return _span(rollout_id, seq, semconv.SPAN_LLM_CALL, attributes, status=SpanStatus(code="OK"))


def _reward(rollout_id: str, seq: int, value: float, name: str | None = None) -> Span:
    attributes: dict[str, Any] = {semconv.REWARD_VALUE: value}
    if name is not None:
        attributes[semconv.REWARD_NAME] = name
    return _span(rollout_id, seq, semconv.SPAN_REWARD, attributes)


def _finished(rollout: Rollout, spans: list[Span]) -> FinishedRollout:
    return FinishedRollout(rollout, _attempt(rollout.rollout_id), spans)


# ------------------------------------------------------------------------------------------------------------- sft
def test_sft_row_is_the_last_answered_call_in_openai_chat_format() -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}
    spans = [
        _llm("r1", 1, [1], [2]),
        _llm(
            "r1",
            2,
            [1, 2, 3],
            [4],
            **{
                semconv.LLM_REQUEST_MESSAGES: [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "2+2?"},
                ],
                semconv.LLM_REQUEST_TOOLS: tools,
                semconv.LLM_RESPONSE_MESSAGE: {"role": "assistant", "content": None, "tool_calls": [call]},
            },
        ),
        # a later failed call returned no message: it is not the conversation's end
        _span("r1", 3, semconv.SPAN_LLM_CALL, {semconv.LLM_ERROR: "boom"}, status=SpanStatus(code="ERROR")),
        _reward("r1", 4, 1.0),
    ]
    assert sft_row(spans) == {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "tool_calls": [call]},  # content None left out
        ],
        "tools": tools,
    }
    assert sft_row([_reward("r1", 1, 1.0)]) is None


def test_sft_rows_filter_by_status_and_min_reward() -> None:
    finished = [
        _finished(_rollout("r1", "t1", 1.0), [_llm("r1", 1, [1], [2])]),
        _finished(_rollout("r2", "t1", 0.2), [_llm("r2", 1, [1], [2])]),
        _finished(_rollout("r3", "t2", None, status=RolloutStatus.FAILED), [_llm("r3", 1, [1], [2])]),
        _finished(_rollout("r4", "t2", 1.0), [_reward("r4", 1, 1.0)]),
    ]
    rows, skipped = sft_rows(finished, min_reward=0.5)
    assert rows == [{"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]}]
    assert skipped == {"below min reward": 1, "not succeeded": 1, "no gateway call": 1}
    assert len(sft_rows(finished)[0]) == 2


# -------------------------------------------------------------------------------------------------------------- rl
def _rl_batch() -> list[FinishedRollout]:
    return [
        # task t1, group of 2: r1's two calls extend each other (merged into one sample), r2 fails the task
        _finished(
            _rollout("r1", "t1", 1.0),
            [_llm("r1", 1, [5, 6], [7, 8]), _llm("r1", 2, [5, 6, 7, 8, 9], [10]), _reward("r1", 3, 1.0)],
        ),
        _finished(_rollout("r2", "t1", 0.0), [_llm("r2", 1, [5, 6], [11]), _reward("r2", 2, 0.0)]),
        # task t2: the same greedy call twice (identical tokens): two samples, not merged
        _finished(
            _rollout("r3", "t2", 1.0), [_llm("r3", 1, [1, 2], [3]), _llm("r3", 2, [1, 2], [3]), _reward("r3", 3, 1.0)]
        ),
        _finished(_rollout("r4", "t2", 0.5), [_llm("r4", 1, [1, 2], [4]), _reward("r4", 2, 0.5)]),
        # the agent raised: left out and counted
        _finished(_rollout("r5", "t2", None, status=RolloutStatus.FAILED), [_llm("r5", 1, [1], [2])]),
    ]


def test_rl_rows_are_the_trainers_samples_with_their_provenance() -> None:
    finished = _rl_batch()
    rows, skipped = rl_rows(finished)
    assert skipped == {"failed or no reward": 1}
    assert [(r["rollout_id"], r["span_ids"]) for r in rows] == [
        ("r1", ["sp-r1-1", "sp-r1-2"]),
        ("r2", ["sp-r2-1"]),
        ("r3", ["sp-r3-1"]),
        ("r3", ["sp-r3-2"]),
        ("r4", ["sp-r4-1"]),
    ]
    merged = rows[0]
    assert merged["prompt_token_ids"] == [5, 6]
    assert merged["response_token_ids"] == [7, 8, 9, 10]
    assert merged["response_loss_mask"] == [1, 1, 0, 1]  # 9 is a tool/user token between the two calls
    assert merged["response_sampling_logprobs"] == pytest.approx([-0.1, -0.2, 0.0, -0.1])
    # grpo over t1's rewards [1, 0]: mean 0.5, sample std 0.7071, so +-0.7071 (eps 1e-6 aside)
    assert merged["advantage"] == pytest.approx(0.70710, abs=1e-4)
    assert rows[1]["advantage"] == pytest.approx(-0.70710, abs=1e-4)
    assert merged["reward"] == 1.0 and merged["transition_rewards"] == [1.0, 1.0]  # broadcast credit
    assert (merged["task_id"], merged["attempt_id"], merged["mode"], merged["resources_id"]) == (
        "t1",
        "at-r1",
        "train",
        "rs-1",
    )

    # the rows read back are exactly the samples the trainer builds from the same rollouts
    selection = select_trajectories([(f.rollout, f.attempt, f.spans) for f in _rl_batch()])
    direct = samples_for_step(selection.trajectories, credit=build_credit_scheme("broadcast"), estimator="grpo")
    assert [sample_of_row(r) for r in rows] == direct.batch.samples


def test_rl_rows_follow_the_trainers_step_batches_and_filters() -> None:
    # the same task at two train steps: two groups of one, so grpo gives 0 to each
    finished = [
        _finished(_rollout("a", "t1", 1.0, metadata={"train_step": 0}), [_llm("a", 1, [1], [2]), _reward("a", 2, 1.0)]),
        _finished(_rollout("b", "t1", 0.0, metadata={"train_step": 1}), [_llm("b", 1, [1], [3]), _reward("b", 2, 0.0)]),
    ]
    rows, _ = rl_rows(finished)
    assert [(r["train_step"], r["advantage"]) for r in rows] == [(0, 0.0), (1, 0.0)]
    rows, skipped = rl_rows(finished, min_reward=0.5)
    assert [r["rollout_id"] for r in rows] == ["a"] and skipped == {"below min reward": 1}
    rows, _ = rl_rows(_rl_batch(), merge_samples=False)
    assert [r["span_ids"] for r in rows][:2] == [["sp-r1-1"], ["sp-r1-2"]]
    with pytest.raises(ConfigError, match="value head"):
        rl_rows(finished, advantage_estimator="gae")
    with pytest.raises(ConfigError, match="nope"):
        rl_rows(finished, advantage_estimator="nope")


def test_rl_rows_of_val_rollouts_are_their_own_groups() -> None:
    train = _finished(_rollout("a", "t1", 1.0), [_llm("a", 1, [1], [2]), _reward("a", 2, 1.0)])
    val = _finished(_rollout("b", "t1", 0.0, mode=RolloutMode.VAL), [_llm("b", 1, [1], [3]), _reward("b", 2, 0.0)])
    rows, _ = rl_rows([train, val])
    assert [(r["mode"], r["advantage"]) for r in rows] == [("train", 0.0), ("val", 0.0)]


def test_rl_rows_of_recorded_rollouts_are_what_the_update_received() -> None:
    # The trainer ran step 4 with rloo and discounted credit (gamma 0.5) on r1..r4 and recorded its batch; r6 ran in
    # the same step but was left out of the batch (none recorded for it); the val rollout v was never trained.
    finished = [
        _finished(f.rollout.model_copy(update={"metadata": {**f.rollout.metadata, "train_step": 4}}), f.spans)
        for f in _rl_batch()
    ]
    finished.append(
        _finished(_rollout("r6", "t3", 1.0, metadata={"train_step": 4}), [_llm("r6", 1, [1], [2]), _reward("r6", 2, 1)])
    )
    finished.append(
        _finished(_rollout("v", "t1", 1.0, mode=RolloutMode.VAL), [_llm("v", 1, [5, 6], [7]), _reward("v", 2, 1.0)])
    )
    selection = select_trajectories([(f.rollout, f.attempt, f.spans) for f in finished[:5]])
    batch = samples_for_step(
        selection.trajectories, credit=build_credit_scheme("discounted", gamma=0.5), estimator="rloo"
    ).batch.samples
    records = trained_samples(
        4, batch, selection.trajectories, advantage_estimator="rloo", credit_assignment="discounted"
    )

    rows, skipped = rl_rows(finished, records=records)  # the export's own settings: grpo, broadcast
    trained = [r for r in rows if r["advantage_source"] == "trained"]
    assert [sample_of_row(r) for r in trained] == batch  # tokens, masks, logprobs and advantages as trained
    assert [r["advantage"] for r in trained] == [s.advantage for s in batch]
    assert {(r["advantage_estimator"], r["credit_assignment"], r["train_step"]) for r in trained} == {
        ("rloo", "discounted", 4)
    }
    assert trained[0]["span_ids"] == ["sp-r1-1"] and trained[0]["transition_rewards"] == [0.5]  # discounted
    assert [r["rollout_id"] for r in rows if r["advantage_source"] == "recomputed"] == ["v"]
    assert skipped == {"failed or no reward": 1, "not in its step's trained batch": 1}

    recomputed, _ = rl_rows(finished, records=[])  # --advantages recomputed: grpo + broadcast everywhere
    assert {r["advantage_source"] for r in recomputed} == {"recomputed"}
    assert [r["advantage"] for r in recomputed][:2] != [s.advantage for s in batch][:2]


# ----------------------------------------------------------------------------------------------------------- files
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_rl_files_load_in_pandas_and_round_trip_into_samples(tmp_path: Path, fmt: str) -> None:
    pd = pytest.importorskip("pandas")
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    rows, _ = rl_rows(_rl_batch())
    path = tmp_path / f"rl.{fmt}"
    assert write_rows(rows, path, fmt) == []  # type: ignore[arg-type]
    frame = pd.read_parquet(path) if fmt == "parquet" else pd.read_json(path, lines=True)
    assert list(frame.columns)[:3] == ["rollout_id", "attempt_id", "task_id"] and len(frame) == len(rows)
    assert list(frame["response_token_ids"][0]) == [7, 8, 9, 10]
    assert read_rows(path) == rows
    assert load_rl_samples(path) == [sample_of_row(r) for r in rows]


def test_sft_parquet_keeps_nested_messages_or_falls_back_to_json_text(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]},
    ]
    assert write_rows(rows, tmp_path / "a.parquet", "parquet") == []
    frame = pd.read_parquet(tmp_path / "a.parquet")
    assert frame["messages"][0][1]["content"] == "yo" and frame["tools"][0] is None
    mixed = [*rows, {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]}]
    assert write_rows(mixed, tmp_path / "b.parquet", "parquet") == ["messages"]
    assert '"parts"' in pd.read_parquet(tmp_path / "b.parquet")["messages"][2]


def test_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="no store file"):
        open_store(str(tmp_path / "missing.db"))
    with pytest.raises(ConfigError, match="no store file"):
        open_store(f"sqlite:///{tmp_path}/missing.db")
    with pytest.raises(ConfigError, match="empty store"):
        open_store("memory://")
    with pytest.raises(ConfigError, match="not a row of an rl export"):
        sample_of_row({"rollout_id": "r"})
    with pytest.raises(ConfigError, match="cannot read"):
        read_rows(tmp_path / "nope.jsonl")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(ConfigError, match=r"agentbolt\[export\]"):
        write_rows([{"a": 1}], tmp_path / "x.parquet", "parquet")


# --------------------------------------------------------------------------------------------------------- inspect
def test_span_tree_nests_by_parent_and_labels_what_each_span_is() -> None:
    agent = _span("r", 1, semconv.SPAN_AGENT, {semconv.AGENT_NAME: "writer"})
    call = _llm(
        "r",
        2,
        [1],
        [2],
        **{
            semconv.GEN_AI_REQUEST_MODEL: "smol",
            semconv.GEN_AI_USAGE_INPUT_TOKENS: 12,
            semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 3,
        },
    ).model_copy(update={"parent_id": agent.span_id})
    tool = _span("r", 3, "calc", {semconv.OI_SPAN_KIND: "TOOL", semconv.OI_INPUT_VALUE: "1+1"}, parent_id=agent.span_id)
    boom = _span("r", 4, semconv.SPAN_EXCEPTION, {semconv.EXCEPTION_TYPE: "KeyError", semconv.EXCEPTION_MESSAGE: "'x'"})
    reward = _reward("r", 5, 0.5, name="format")
    orphan = _span("r", 6, "other", {}, parent_id="missing")
    roots = span_tree([reward, tool, call, boom, agent, orphan])  # any order in: sequence order out
    assert [n.kind for n in roots] == ["agent", "exception", "reward", "span"]
    assert [c.kind for c in roots[0].children] == ["llm", "tool"]
    llm = roots[0].children[0]
    assert llm.label == "LLM call smol: 12 tokens in, 3 out, finish stop: 'a2'"
    assert llm.duration_s == pytest.approx(0.5)
    assert roots[0].children[1].label == "tool calc(1+1)"
    assert roots[1].label == "exception KeyError: 'x'"
    assert roots[2].label == "reward format = 0.5"
    assert roots[0].to_json()["children"][0]["span_id"] == call.span_id


def test_rl_exports_training_rollouts_unless_another_mode_is_asked() -> None:
    from agentbolt.cli.export import ExportConfig

    rl = ExportConfig(store="x.db", kind="rl", out=Path("r.jsonl"))
    assert rl.mode == RolloutMode.TRAIN  # val/test rollouts are greedy evaluation runs on held-out tasks
    assert ExportConfig(store="x.db", kind="rl", out=Path("r.jsonl"), mode="all").mode is None
    assert ExportConfig(store="x.db", kind="rl", out=Path("r.jsonl"), mode="val").mode == RolloutMode.VAL
    assert ExportConfig(store="x.db", kind="sft", out=Path("s.jsonl")).mode is None
    assert ExportConfig(store="x.db", kind="sft", out=Path("s.jsonl"), mode="all").mode is None


def test_export_format_follows_the_file_name_and_a_mismatch_is_refused(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from agentbolt.cli.export import ExportConfig

    assert ExportConfig(store="x.db", kind="rl", out=tmp_path / "r.parquet").format == "parquet"
    assert ExportConfig(store="x.db", kind="rl", out=tmp_path / "r.jsonl").format == "jsonl"
    assert ExportConfig(store="x.db", kind="rl", out=tmp_path / "r.data").format == "jsonl"
    assert ExportConfig(store="x.db", kind="rl", out=tmp_path / "r.data", format="parquet").format == "parquet"
    with pytest.raises(ValidationError, match="names a jsonl file but --format is parquet"):
        ExportConfig(store="x.db", kind="rl", out=tmp_path / "r.jsonl", format="parquet")
    with pytest.raises(ValidationError, match="is a folder: give a file name in it"):
        ExportConfig(store="x.db", kind="rl", out=tmp_path)
    with pytest.raises(ValidationError, match="--mode should be train, val, test or all, not 'bogus'"):
        ExportConfig(store="x.db", kind="rl", out=tmp_path / "r.jsonl", mode="bogus")
