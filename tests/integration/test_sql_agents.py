"""The two-agent SQL system (``examples/sql_agent``): its protocol, and training the writer only.

Fast tests drive :func:`run_system` with a scripted model (no server): call order, agent names, approval,
corrections, garbage. The slow test trains the writer for one GRPO step on SmolLM2-135M with
``agent_match="writer"`` and asserts exactly which transitions went into the batch: the writer's calls, all of
them, and none of the checker's, which are still recorded in the store.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from examples.sql_agent import agents, train
from examples.sql_agent.agents import (
    CHECKER,
    WRITER,
    ChatEndpoint,
    SqlAgentsConfig,
    compact_schema,
    describe_result,
    parse_verdict,
    run_system,
)
from examples.sql_agent.reward import QueryResult, run_sql
from examples.sql_agent.tasks import SqlTask, load_tasks
from openai.types.chat import ChatCompletion

from agentbolt import semconv
from agentbolt.adapter import build_trajectory
from agentbolt.adapter.samples import TrainingSample
from agentbolt.config import GRPOConfig
from agentbolt.trainer.loop import StepResult
from agentbolt.types import Rollout, RolloutStatus, Span

REPO_ROOT = Path(__file__).resolve().parents[2]
OPENAI_INSTRUMENTED = importlib.util.find_spec("openinference.instrumentation.openai") is not None
"""The runner instruments openai when the ``[integrations]`` extra is installed; the agent names then also reach
the gateway's calls through the tracer, not only through the ``x-agentbolt-agent`` header."""
TASKS = {task.task_id: task for task in load_tasks()}
COUNT_TASK = TASKS["easy-01"]  # "How many customers are there?" -> 59


def _completion(text: str | None) -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        }
    )


@dataclass
class ScriptedModel:
    """Stands in for ``client.chat.completions.create``: returns the scripted replies in order and records, for
    each call, the agent scope it was made in and the request."""

    replies: list[str | None]
    calls: list[tuple[str | None, list[dict[str, Any]], dict[str, Any]]] = field(default_factory=list)

    def __call__(self, *, model: str, messages: list[dict[str, Any]], **kwargs: Any) -> ChatCompletion:
        header = kwargs.get("extra_headers", {}).get(semconv.AGENT_NAME_HEADER)
        assert header == current_agent_name(), "the header names the agent scope the call is made in"
        self.calls.append((current_agent_name(), [dict(m) for m in messages], {"model": model, **kwargs}))
        return _completion(self.replies[len(self.calls) - 1])


def current_agent_name() -> str | None:
    """The agent scope the caller runs in (``agentbolt.agent(...)``), read back through the tracing API."""
    from agentbolt.tracing.agents import current_agent_name as scope_name

    return scope_name()


def _run(replies: Sequence[str | None], task: SqlTask = COUNT_TASK) -> tuple[agents.SystemRun, ScriptedModel]:
    model = ScriptedModel(list(replies))
    run = run_system(task, model, model, writer_model="w", checker_model="c")
    return run, model


# --- the protocol, with a scripted model -----------------------------------------------------------------------------


def test_approved_draft_is_final_and_takes_two_calls() -> None:
    run, model = _run(["```sql\nSELECT COUNT(*) FROM Customer;\n```", "APPROVE"])
    assert [agent for agent, _, _ in model.calls] == [WRITER, CHECKER]
    assert [agent for agent, _ in run.calls] == [WRITER, CHECKER]
    assert run.verdict.approved and run.revision_text is None
    assert run.final_sql == "SELECT COUNT(*) FROM Customer"
    assert (run.draft_reward, run.reward, run.reason) == (1.0, 1.0, "match")
    checker_prompt = model.calls[1][1][1]["content"]
    assert COUNT_TASK.question in checker_prompt and "1 row (COUNT(*)): (59,)" in checker_prompt
    assert model.calls[0][2]["model"] == "w" and model.calls[1][2]["model"] == "c"


def test_correction_leads_to_one_revision_that_extends_the_writers_conversation() -> None:
    run, model = _run(
        [
            "SELECT COUNT(*) FROM Customers",  # a wrong table name: an error to show the checker
            "Use this:\n```sql\nSELECT COUNT(CustomerId) FROM Customer\n```",
            "```sql\nSELECT COUNT(CustomerId) FROM Customer\n```",
        ]
    )
    assert [agent for agent, _, _ in model.calls] == [WRITER, CHECKER, WRITER]
    assert run.draft_result is not None and run.draft_result.error == "SQL error: no such table: Customers"
    assert not run.verdict.approved and run.verdict.suggestion == "SELECT COUNT(CustomerId) FROM Customer"
    draft_messages, revision_messages = model.calls[0][1], model.calls[2][1]
    assert revision_messages[:2] == draft_messages
    assert revision_messages[2] == {"role": "assistant", "content": "SELECT COUNT(*) FROM Customers"}
    follow_up = revision_messages[3]["content"]
    assert "no such table: Customers" in follow_up and "SELECT COUNT(CustomerId) FROM Customer" in follow_up
    assert (run.draft_reward, run.reward) == (0.0, 1.0)


def test_garbage_everywhere_scores_zero_and_never_raises() -> None:
    run, model = _run(["", None, "I am not sure what you mean."])
    assert [agent for agent, _, _ in model.calls] == [WRITER, CHECKER, WRITER]
    assert "Query:\n(none)" in model.calls[1][1][1]["content"]
    assert "no query found" in model.calls[1][1][1]["content"]
    assert "(no reason given)" in model.calls[2][1][3]["content"]
    assert run.draft_sql is None and run.final_sql is None
    assert (run.reward, run.reason) == (0.0, "no SQL found in the final answer")


def test_revision_without_sql_scores_zero_even_when_the_draft_was_right() -> None:
    run, _ = _run(["```sql\nSELECT COUNT(*) FROM Customer\n```", "No, this is wrong.", "Sorry."])
    assert run.draft_reward == 1.0 and run.reward == 0.0 and run.final_sql is None


@pytest.mark.parametrize(
    ("reply", "approved", "suggestion"),
    [
        ("APPROVE", True, None),
        ("approved, looks right", True, None),
        ("```sql\nSELECT 3\n```", False, "SELECT 3"),
        ("```sql\nSELECT 1\n```", False, None),  # the draft repeated without approval
        ("APPROVE\n```sql\nselect  1;\n```", True, None),  # the draft repeated: no correction
        ("APPROVE but better:\n```sql\nSELECT 2\n```", False, "SELECT 2"),  # a different query wins
        ("", False, None),
        (None, False, None),
        ("The query is wrong.", False, None),
    ],
)
def test_parse_verdict(reply: str | None, approved: bool, suggestion: str | None) -> None:
    verdict = parse_verdict(reply, "SELECT 1")
    assert (verdict.approved, verdict.suggestion) == (approved, suggestion)


def test_describe_result() -> None:
    assert describe_result(None) == "no query found"
    assert describe_result(QueryResult(error="SQL error: boom")) == "error: SQL error: boom"
    assert describe_result(QueryResult(columns=("a",), rows=())) == "no rows"
    many = describe_result(run_sql("SELECT GenreId, Name FROM Genre ORDER BY GenreId"))
    assert many.startswith("25 rows (GenreId, Name): (1, 'Rock'); (2, 'Jazz')") and many.endswith(" ...")
    long = describe_result(run_sql("SELECT Name FROM Track LIMIT 500"), max_rows=500)
    assert len(long) == agents.RESULT_PREVIEW_CHARS and long.endswith("...")


def test_compact_schema_is_short_and_marks_foreign_keys() -> None:
    schema = compact_schema()
    lines = schema.splitlines()
    assert len(lines) == 11 and len(schema) < 1200
    track = next(line for line in lines if line.startswith("Track("))
    assert track.startswith("Track(TrackId, Name, AlbumId -> Album, MediaTypeId -> MediaType, GenreId -> Genre")


def test_checker_endpoint_from_env() -> None:
    assert SqlAgentsConfig.from_env({}).checker is None
    config = SqlAgentsConfig.from_env(
        {agents.CHECKER_URL_ENV: "http://other:8000/v1", agents.CHECKER_MODEL_ENV: "big", agents.CHECKER_KEY_ENV: "k"}
    )
    assert config.checker == ChatEndpoint("http://other:8000/v1", "big", "k")
    with pytest.raises(ValueError, match=agents.CHECKER_MODEL_ENV):
        SqlAgentsConfig.from_env({agents.CHECKER_URL_ENV: "http://other:8000/v1"})


def test_train_options() -> None:
    config = train.parse_args([])
    assert (config.agent_match, config.steps, config.bands) == ("writer", 2, ("easy",))
    with pytest.raises(SystemExit):
        train.parse_args(["--checker-base-url", "http://x/v1"])  # without --checker-model


def test_agent_module_does_not_import_torch() -> None:
    code = "import sys, examples.sql_agent.agents, examples.sql_agent.train; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"


# --- training the writer only, on SmolLM2 ----------------------------------------------------------------------------


class RecordingUpdater:
    """Wraps the trainer backend and keeps every batch it is given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[list[TrainingSample]] = []

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]:
        self.batches.append(list(samples))
        return self.inner.train_step(samples)


def _trainable_llm_spans(spans: Sequence[Span]) -> list[Span]:
    """The gateway's LLM spans that carry token ids and did not fail, in store order."""
    llm = [s for s in spans if s.name == semconv.SPAN_LLM_CALL and s.status.code != "ERROR"]
    return sorted((s for s in llm if s.attributes.get(semconv.LLM_RESPONSE_TOKEN_IDS)), key=lambda s: s.sequence_id)


def _masked_runs(sample: TrainingSample) -> list[list[int]]:
    """The maximal runs of tokens under ``loss_mask == 1``: the responses a sample trains on (one per call, also
    when consecutive calls are merged into one sample)."""
    runs: list[list[int]] = []
    previous = 0
    for token, mask in zip(sample.input_ids, sample.loss_mask, strict=True):
        if mask and not previous:
            runs.append([])
        if mask:
            runs[-1].append(token)
        previous = mask
    return runs


@pytest.mark.slow
def test_training_step_batches_only_the_writers_calls(tmp_path: Path, smollm2_dir: Path) -> None:
    from agentbolt.trainer.local import LocalMachine, local_training

    tasks = [TASKS["easy-01"].model_dump(mode="json"), TASKS["easy-05"].model_dump(mode="json")]
    grpo = GRPOConfig(steps=1, tasks_per_step=2, group_size=2, max_tokens=24)

    async def scenario() -> tuple[StepResult, RecordingUpdater, list[Rollout], dict[str, list[Span]], dict[str, float]]:
        machine = LocalMachine(model=smollm2_dir, agent=train.AGENT_REFERENCE, runner_processes=1, runner_concurrency=4)
        async with local_training(machine, db_path=tmp_path / "store.db", grpo=grpo, agent_match="writer") as local:
            recorder = RecordingUpdater(local.trainer.updater)
            local.trainer.updater = recorder
            result = await local.trainer.train_step(1, tasks)
            rollouts = await local.store.query_rollouts()
            spans: dict[str, list[Span]] = {}
            for rollout in rollouts:
                attempts = await local.store.query_attempts(rollout.rollout_id)
                assert len(attempts) == 1, f"rollout {rollout.rollout_id} was retried"
                spans[rollout.rollout_id] = await local.store.query_spans(rollout.rollout_id, attempts[0].attempt_id)
            metrics = {m.name: m.value for m in await local.store.query_metrics()}
        return result, recorder, rollouts, spans, metrics

    result, recorder, rollouts, spans_by_rollout, metrics = asyncio.run(scenario())

    assert len(rollouts) == 4 and all(r.status is RolloutStatus.SUCCEEDED for r in rollouts)
    assert result.n_failed == 0 and result.n_unmatched == 0 and len(result.rewards) == 4

    # Who made each call, as the adapter names them (the runner's openai instrumentation puts each call under its
    # agent's span); the protocol's call order checks the names: draft, review, and a revision unless approved.
    writer_spans: list[Span] = []
    checker_spans: list[Span] = []
    for rollout in rollouts:
        spans = spans_by_rollout[rollout.rollout_id]
        everything = build_trajectory(rollout, spans[0].attempt_id, spans)
        names = [t.agent_name for t in everything.transitions]
        assert names in ([WRITER, CHECKER], [WRITER, CHECKER, WRITER]), (rollout.rollout_id, names)
        assert everything.untrainable_calls == 0
        by_id = {s.span_id: s for s in _trainable_llm_spans(spans)}
        assert [t.span_id for t in everything.transitions] == list(by_id)
        # The agent scopes themselves are recorded (one span per scope entry, in the same order), and with the
        # openai instrumentation each gateway call is joined to the client's span inside its scope.
        scopes = sorted((s for s in spans if s.name == semconv.SPAN_AGENT), key=lambda s: s.sequence_id)
        assert [s.attributes.get(semconv.AGENT_NAME) for s in scopes] == names
        if OPENAI_INSTRUMENTED:
            assert all("tracer_span_id" in t.metadata for t in everything.transitions)
        writer_spans += [by_id[t.span_id or ""] for t in everything.transitions if t.agent_name == WRITER]
        checker_spans += [by_id[t.span_id or ""] for t in everything.transitions if t.agent_name == CHECKER]
    assert len(checker_spans) == 4  # recorded in the store: one review per rollout

    # Exactly the writer's calls are in the batch, and the counts add up.
    assert sorted(result.batch_span_ids) == sorted(s.span_id for s in writer_spans)
    assert not set(result.batch_span_ids) & {s.span_id for s in checker_spans}
    assert result.kept_by_agent == {WRITER: len(writer_spans)}
    assert result.dropped_by_agent == {CHECKER: len(checker_spans)}
    assert result.n_transitions == len(writer_spans) and result.n_dropped == len(checker_spans)
    assert metrics["n_transitions"] == len(writer_spans) and metrics["n_transitions_dropped"] == len(checker_spans)

    # What the optimizer got: the writer's responses, each exactly once, after a writer's prompt; nothing else.
    assert len(recorder.batches) == 1
    batch = recorder.batches[0]
    trained = sorted(run for sample in batch for run in _masked_runs(sample))
    assert trained == sorted(list(s.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]) for s in writer_spans)
    writer_prompts = [list(s.attributes[semconv.LLM_PROMPT_TOKEN_IDS]) for s in writer_spans]
    checker_prompts = [list(s.attributes[semconv.LLM_PROMPT_TOKEN_IDS]) for s in checker_spans]
    for sample in batch:
        assert any(sample.input_ids[: len(p)] == p for p in writer_prompts)
        assert not any(sample.input_ids[: len(p)] == p for p in checker_prompts)
    assert "update_s" in metrics
