"""Validation success is an explicit setting (issue 22, item 6): ``grpo.accuracy_reward_name`` and
``grpo.success_threshold``, shown in words, applied by the RL evaluation and by prompt optimization's evaluator, and
a named reward that no rollout recorded is reported instead of read in silence.

The evaluations run real rollouts: a real :class:`~agentbolt.runner.worker.Runner` executes the agent below against
a SQLite store; no model is needed (the agent returns its reward without an LLM call).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentbolt import emit_reward, rollout, semconv
from agentbolt.adapter.trajectory import accuracy_reward, describe_success, has_named_reward, is_correct
from agentbolt.algorithms.apo.store_evaluator import StoreEvaluator
from agentbolt.algorithms.apo.types import Candidate
from agentbolt.config import GRPOConfig
from agentbolt.runner.worker import Runner
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.trainer.loop import RLTrainer
from agentbolt.types import RolloutMode, Span


@rollout
async def graded_agent(task: dict[str, Any]) -> float:
    """Returns the task's ``reward``; emits it as ``correct`` too when the task says so; raises when it says so."""
    if task.get("raise"):
        raise RuntimeError("the agent failed")
    if task.get("named"):
        emit_reward(task["reward"], name="correct")
    return float(task["reward"])


def _reward(sequence_id: int, value: float, name: str | None = None) -> Span:
    attributes: dict[str, Any] = {semconv.REWARD_VALUE: value}
    if name is not None:
        attributes[semconv.REWARD_NAME] = name
    return Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence_id=sequence_id,
        span_id=f"sp-{sequence_id}",
        trace_id="tr-1",
        name=semconv.SPAN_REWARD,
        start_time=1000.0 + sequence_id,
        end_time=1000.5 + sequence_id,
        attributes=attributes,
    )


class _Backend:
    model_name = "none"
    model_version = "base"

    def paused(self) -> object:
        return contextlib.nullcontext()

    def set_model_version(self, version: str) -> None:
        self.model_version = version


@contextlib.asynccontextmanager
async def _served_store(tmp_path: Path) -> AsyncIterator[SqliteLightningStore]:
    store = SqliteLightningStore(tmp_path / "store.db")
    runner = Runner(graded_agent, store, concurrency=4, poll_interval_s=0.02, instrument=False)
    stop = asyncio.Event()
    running = asyncio.create_task(runner.run(stop=stop))
    try:
        yield store
    finally:
        stop.set()
        await running
        await store.close()


TASKS = [{"task_id": f"t{i}", "reward": r} for i, r in enumerate([0.2, 0.5, 0.7, 1.0])]


def test_the_rule_in_words_and_its_parts() -> None:
    assert describe_success(None) == "final reward >= 1.0"
    assert describe_success("", 0.5) == "final reward >= 0.5"
    assert describe_success("correct", 0.75) == "reward 'correct' >= 0.75"
    assert [is_correct(v, 0.5) for v in (None, 0.49, 0.5, 2.0)] == [False, False, True, True]
    spans = [_reward(2, 0.25, name="format_ok"), _reward(3, 0.5)]
    assert accuracy_reward(spans, "") == 0.5  # "" reads the final reward, like None
    assert [has_named_reward(spans, n) for n in (None, "", "format_ok", "correct")] == [True, True, True, False]
    config = GRPOConfig()
    assert (config.accuracy_reward_name, config.success_threshold) == (None, 1.0)  # default: final reward >= 1.0


@pytest.mark.parametrize(
    ("settings", "named", "accuracy", "missing"),
    [
        ({}, False, 0.25, []),  # the default: final reward >= 1.0 (only 1.0 counts)
        ({"success_threshold": 0.5}, False, 0.75, []),  # 0.5, 0.7 and 1.0
        ({"accuracy_reward_name": "correct", "success_threshold": 0.6}, True, 0.5, []),  # 0.7 and 1.0
        # Named but never recorded: scored by the final reward, and reported.
        ({"accuracy_reward_name": "correct", "success_threshold": 0.6}, False, 0.5, ["before"]),
    ],
)
def test_rl_evaluation_applies_the_setting_and_reports_a_missing_named_reward(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    settings: dict[str, Any],
    named: bool,
    accuracy: float,
    missing: list[str],
) -> None:
    async def scenario() -> tuple[dict[str, float], list[str]]:
        async with _served_store(tmp_path) as store:
            trainer = RLTrainer(store, _Backend(), None, GRPOConfig(**settings), gateway_url="http://127.0.0.1:9")
            tasks = [{**task, "named": named} for task in TASKS]
            result = await trainer.evaluate({"graded": tasks}, label="before")
            return result, trainer.accuracy_reward_missing

    with caplog.at_level(logging.WARNING, logger="agentbolt.trainer.loop"):
        result, reported = asyncio.run(scenario())
    assert result == {"graded": accuracy}
    assert reported == missing
    warned = [r.getMessage() for r in caplog.records if "no validation rollout recorded" in r.getMessage()]
    assert len(warned) == len(missing)
    if missing:
        assert "a reward named 'correct'" in warned[0]


def test_rl_evaluation_says_how_many_rollouts_failed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a new-user pass: an agent that always raised showed 'before 0.0%' as if the model had been scored."""

    async def scenario() -> dict[str, float]:
        async with _served_store(tmp_path) as store:
            trainer = RLTrainer(store, _Backend(), None, GRPOConfig(), gateway_url="http://127.0.0.1:9")
            failing = [{**task, "raise": True} for task in TASKS[:2]]
            return await trainer.evaluate({"graded": TASKS[2:], "broken": failing}, label="before")

    with caplog.at_level(logging.WARNING, logger="agentbolt.trainer.loop"):
        result = asyncio.run(scenario())
    assert result == {"graded": 0.5, "broken": 0.0}  # 0.7 and 1.0: one correct; failed rollouts count as wrong
    warned = [r.getMessage() for r in caplog.records if "did not succeed" in r.getMessage()]
    assert warned == [
        "evaluation 'before': 2 of 4 validation rollouts did not succeed and count as wrong (broken: 2 of 2); "
        "`agentbolt rollouts --store STORE --mode val --status failed,cancelled` lists them with their cause"
    ]


@pytest.mark.parametrize(("named", "missing"), [(True, False), (False, True)])
def test_prompt_optimization_evaluator_reports_a_missing_named_reward(
    tmp_path: Path, named: bool, missing: bool
) -> None:
    async def scenario() -> tuple[list[float], bool, int, int]:
        async with _served_store(tmp_path) as store:
            update = await store.add_resources({})
            evaluator = StoreEvaluator(store, reward_name="correct", poll_s=0.05)
            assert evaluator.reward_name_missing is False  # nothing read yet
            tasks = [{**task, "named": named} for task in TASKS]
            results = await evaluator(
                Candidate(candidate_id=update.resources_id, prompts={}), tasks, mode=RolloutMode.VAL
            )
            return (
                [r.reward for r in results],
                evaluator.reward_name_missing,
                evaluator.rollouts_read,
                evaluator.named_reward_seen,
            )

    rewards, reported, read, seen = asyncio.run(scenario())
    assert rewards == [0.2, 0.5, 0.7, 1.0]
    assert (reported, read, seen) == (missing, 4, 0 if missing else 4)
    assert [is_correct(r, 0.7) for r in rewards] == [False, False, True, True]
