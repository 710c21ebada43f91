"""The prompt-optimization job around APO / GEPA: the config file and its dispatch, seed prompts, the diff of the
best prompt, and the evaluator that reads scores and traces back from a real SQLite store filled by a real runner."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentbolt import PromptTemplate, emit_reward, rollout, semconv
from agentbolt.algorithms.apo import APOConfig, StoreEvaluator, optimize_apo
from agentbolt.algorithms.apo.store_evaluator import conversation, task_result_from_spans
from agentbolt.errors import BackendError, ConfigError
from agentbolt.runner.worker import Runner
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.trainer.job_config import TrainConfig, load_job_config
from agentbolt.trainer.prompt_opt import (
    PromptOptConfig,
    check_job_inputs,
    prompt_diff,
    resolve_seed_prompts,
    write_outputs,
)
from agentbolt.types import Rollout, RolloutMode, RolloutStatus, Span

REPO = Path(__file__).resolve().parents[2]


def test_room_config_is_a_prompt_job_and_algorithm_selects_the_config(tmp_path: Path) -> None:
    job = load_job_config(REPO / "examples/room_agent/config.yaml")
    assert isinstance(job, PromptOptConfig) and job.algorithm == "apo" and job.apo.rounds == 2
    gepa = load_job_config(REPO / "examples/room_agent/config.yaml", ["algorithm=gepa", "gepa.max_iterations=3"])
    assert isinstance(gepa, PromptOptConfig) and gepa.algorithm == "gepa" and gepa.gepa.max_iterations == 3
    assert isinstance(load_job_config(REPO / "examples/calc_agent/config.yaml"), TrainConfig)
    with pytest.raises(ConfigError, match="algorithm 'dspy' is unknown; use one of lightningrl, apo, gepa"):
        load_job_config(REPO / "examples/room_agent/config.yaml", ["algorithm=dspy"])
    with pytest.raises(
        ConfigError, match=r"apo\.rounds \(--set apo\.rounds=0\): Input should be greater than or equal"
    ):
        load_job_config(REPO / "examples/room_agent/config.yaml", ["apo.rounds=0"])
    with pytest.raises(ConfigError, match=r"grpo \(--set grpo\.steps=2\): unknown setting; known here: algorithm, "):
        load_job_config(REPO / "examples/room_agent/config.yaml", ["grpo.steps=2"])  # an RL section in an APO job
    with pytest.raises(
        ConfigError, match=r"apo\.rouns \(--set apo\.rouns=2\): unknown setting; did you mean apo\.rounds\?$"
    ):
        load_job_config(REPO / "examples/room_agent/config.yaml", ["apo.rouns=2"])


def test_optimizer_model_is_checked_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbolt.inference import model_files

    room = REPO / "examples/room_agent/config.yaml"
    out = tmp_path / "never"
    # the config's agent model (the 1.5B) is an optional extra; smollm2-135m is installed by `make setup`
    job = load_job_config(room, [f"out_dir={out}", "model=smollm2-135m", "optimizer_model=smollm2-135m"])
    assert isinstance(job, PromptOptConfig) and job.optimizer_model == "smollm2-135m"
    assert len(check_job_inputs(job)[2]) == 19  # installed by `make setup`; not loaded here
    unknown = load_job_config(room, [f"out_dir={out}", "model=smollm2-135m", "optimizer_model=qwen-9000"])
    assert isinstance(unknown, PromptOptConfig)
    with pytest.raises(ConfigError, match="unknown embedded model 'qwen-9000'; known models: .*qwen2.5-coder-1.5b"):
        check_job_inputs(unknown)
    # a registered model whose package is not installed (and that is not prepared): refused with the pip command
    missing = model_files.ModelSpec(
        name="not-installed-model",
        description="a model for this test; its package does not exist",
        parts=(model_files.ModelPart("agentbolt_test_no_such_part", "m.gguf", 1, "0" * 64, "no-such-part==1.0"),),
        size_bytes=1,
        sha256="0" * 64,
        install_command="pip install no-such-part==1.0",
    )
    monkeypatch.setitem(model_files.MODEL_SPECS, missing.name, missing)
    monkeypatch.setenv("AGENTBOLT_CACHE", str(tmp_path / "cache"))
    absent = load_job_config(room, [f"out_dir={out}", "model=smollm2-135m", "optimizer_model=not-installed-model"])
    assert isinstance(absent, PromptOptConfig)
    with pytest.raises(BackendError, match="needs the package 'no-such-part==1.0'.*pip install no-such-part==1.0"):
        check_job_inputs(absent)
    # with an optimizer URL, optimizer_model is not used, so not checked
    hosted = load_job_config(
        room,
        [
            f"out_dir={out}",
            "model=smollm2-135m",
            "optimizer_model=not-installed-model",
            "optimizer.base_url=http://127.0.0.1:9/v1",
        ],
    )
    assert isinstance(hosted, PromptOptConfig) and len(check_job_inputs(hosted)[2]) == 19
    assert not out.exists()


def test_overwrite_keeps_the_old_store_when_the_agent_does_not_import(tmp_path: Path) -> None:
    # found by a new-user pass: --overwrite removed store.db, then the agent import failed and nothing replaced it
    from agentbolt.trainer.job import run_training
    from agentbolt.trainer.prompt_opt import run_prompt_optimization

    for config_file, job_runner in (
        ("examples/room_agent/config.yaml", run_prompt_optimization),
        ("examples/calc_agent/config.yaml", run_training),
    ):
        out = tmp_path / Path(config_file).parent.name
        out.mkdir()
        (out / "store.db").write_bytes(b"an earlier run")
        job = load_job_config(
            REPO / config_file, [f"out_dir={out}", "model=smollm2-135m", "overwrite=true", "agent=nope_mod:agent"]
        )
        with pytest.raises(ConfigError, match="cannot import agent module 'nope_mod'"):
            asyncio.run(job_runner(job))  # type: ignore[arg-type]
        assert (out / "store.db").read_bytes() == b"an earlier run"


def test_bad_config_paths_and_override_values_are_config_errors(tmp_path: Path) -> None:
    room = REPO / "examples/room_agent/config.yaml"
    with pytest.raises(ConfigError, match="cannot read config file .*give the path of a YAML file"):
        load_job_config(tmp_path)
    for value in ("apo.templates.edit.text={prompt} {critique}", "apo.rounds=[1"):
        with pytest.raises(ConfigError, match="the value is not valid YAML .*quote it"):
            load_job_config(room, [value])
    quoted = load_job_config(room, ['apo.templates.edit.text="{prompt} {critique}"'])
    assert isinstance(quoted, PromptOptConfig) and quoted.apo.templates["edit"].text == "{prompt} {critique}"


def test_seed_prompts_come_from_the_file_or_a_reference() -> None:
    from examples.room_agent.agent import BASELINE_PROMPT

    assert resolve_seed_prompts(PromptOptConfig(algorithm="apo")) == {"prompt_template": BASELINE_PROMPT}
    inline = PromptOptConfig(algorithm="gepa", seed_prompts={"planner": "Plan {task}", "writer": "Write"})
    assert resolve_seed_prompts(inline) == {"planner": "Plan {task}", "writer": "Write"}
    for reference, message in (
        ("examples.room_agent.agent", "must look like package.module:ATTRIBUTE"),
        ("examples.room_agent.agent:NOPE", "cannot load seed_prompts_from"),
        ("examples.room_agent.agent:MAX_TOOL_CALLS", "must be a string or a mapping"),
    ):
        with pytest.raises(ConfigError, match=message):
            resolve_seed_prompts(PromptOptConfig(algorithm="apo", seed_prompts_from=reference))


def test_prompt_diff_is_a_unified_diff_per_changed_prompt(tmp_path: Path) -> None:
    seed = {"a": "Book a room.\nSay which.", "b": "unchanged"}
    best = {"a": "Book a room.\nPick the smallest free room.\nSay which.", "b": "unchanged"}
    diff = prompt_diff(seed, best)
    assert diff == (
        "--- seed/a\n+++ best/a\n@@ -1,2 +1,3 @@\n Book a room.\n+Pick the smallest free room.\n Say which.\n"
    )
    assert prompt_diff(seed, seed) == ""
    summary: dict[str, Any] = {"best_prompts": best}
    write_outputs(tmp_path, summary, diff)
    assert json.loads((tmp_path / "best_prompts.json").read_text()) == best
    assert (tmp_path / "best_prompt.a.txt").read_text() == best["a"]
    assert (tmp_path / "prompt.diff").read_text() == diff


def _span(name: str, sequence_id: int, **attributes: Any) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence_id=sequence_id,
        span_id=f"{sequence_id:016x}",
        trace_id="0" * 31 + "1",
        name=name,
        start_time=float(sequence_id),
        end_time=float(sequence_id),
        attributes=attributes,
    )


def _rollout(status: RolloutStatus) -> Rollout:
    return Rollout(rollout_id="ro-1", input={}, status=status, enqueue_time=0.0)


def test_task_result_reads_reward_conversation_answer_and_feedback_from_spans() -> None:
    first_call = _span(
        semconv.SPAN_LLM_CALL,
        1,
        **{
            semconv.LLM_REQUEST_MESSAGES: [{"role": "user", "content": "Book a room"}],
            semconv.LLM_RESPONSE_MESSAGE: {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        },
    )
    second_call = _span(
        semconv.SPAN_LLM_CALL,
        2,
        **{
            semconv.LLM_REQUEST_MESSAGES: [
                {"role": "user", "content": "Book a room"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "[...]"},
            ],
            semconv.LLM_RESPONSE_MESSAGE: {"role": "assistant", "content": "Answer: Lyra"},
        },
    )
    named = _span(
        semconv.SPAN_REWARD,
        3,
        **{
            semconv.REWARD_VALUE: 0.0,
            semconv.REWARD_NAME: "correct",
            semconv.REWARD_ANSWER: "Lyra",
            semconv.REWARD_FEEDBACK: "Wrong: the expected choice was Nova, the agent answered Lyra.",
        },
    )
    final = _span(semconv.SPAN_REWARD, 4, **{semconv.REWARD_VALUE: 0.25})
    spans = [first_call, second_call, named, final]
    result = task_result_from_spans("s01", _rollout(RolloutStatus.SUCCEEDED), spans)
    assert result.task_id == "s01" and result.rollout_id == "ro-1"
    assert result.reward == 0.25  # the final (unnamed) reward
    assert task_result_from_spans("s01", _rollout(RolloutStatus.SUCCEEDED), spans, reward_name="correct").reward == 0.0
    assert result.trace is not None
    assert [m["role"] for m in result.trace.messages] == ["user", "assistant", "tool", "assistant"]
    assert result.trace.messages[-1]["content"] == "Answer: Lyra"
    assert result.trace.answer == "Lyra"
    assert result.trace.feedback == "Wrong: the expected choice was Nova, the agent answered Lyra."
    # a failed rollout scores 0.0 even with a reward span, and its exception becomes the feedback
    crash = _span(
        semconv.SPAN_EXCEPTION, 5, **{semconv.EXCEPTION_TYPE: "KeyError", semconv.EXCEPTION_MESSAGE: "'room'"}
    )
    failed = task_result_from_spans("s01", _rollout(RolloutStatus.FAILED), [first_call, final, crash])
    assert failed.reward == 0.0 and failed.trace is not None
    assert failed.trace.feedback == "the agent raised KeyError: 'room'"
    assert conversation([named]) == []


@rollout
def keyword_agent(task: dict[str, Any], prompt_template: PromptTemplate) -> float:
    """Scores 1.0 when the prompt, filled with the task, names the task's keyword; says why on the reward span."""
    text = prompt_template.format(city=task["city"])
    hit = task["keyword"] in text
    emit_reward(
        1.0 if hit else 0.0,
        name="correct",
        attributes={semconv.REWARD_ANSWER: text, semconv.REWARD_FEEDBACK: f"the prompt must mention {task['keyword']}"},
    )
    return 1.0 if hit else 0.0


class EditThatAddsSmallest:
    """A deterministic scripted optimizer for this test: the critique names the feedback it saw; the edit appends
    "smallest" to the prompt."""

    def __init__(self) -> None:
        self.calls = 0
        self.cache_hits = 0
        self.prompts: list[str] = []

    async def complete(self, prompt: str, *, sample_index: int = 0) -> str:
        self.calls += 1
        self.prompts.append(prompt)
        if "<critique>" not in prompt:
            return "The prompt never says smallest."
        return "<prompt>Find a room in {city}; pick the smallest.</prompt>"


def test_apo_through_the_store_and_a_real_runner(tmp_path: Path) -> None:
    """Every candidate is a resources version, every score comes from a rollout run by a real runner under that
    version, and the optimizer is shown the feedback the agent put on its reward span."""

    async def scenario() -> None:
        store = SqliteLightningStore(tmp_path / "store.db")
        runner = Runner(keyword_agent, store, concurrency=4, poll_interval_s=0.02, instrument=False)
        stop = asyncio.Event()
        running = asyncio.create_task(runner.run(stop=stop))
        finished: list[int] = []
        try:
            tasks = [{"task_id": f"t{i}", "city": f"C{i}", "keyword": "smallest"} for i in range(4)]
            evaluator = StoreEvaluator(store, reward_name="correct", on_finished=finished.append, poll_s=0.05)
            optimizer = EditThatAddsSmallest()
            result = await optimize_apo(
                APOConfig(rounds=1, beam_width=1, branch_factor=1, train_batch_size=2, worst_k=2),
                seed_prompts={"prompt_template": "Find a room in {city}."},
                train_tasks=tasks[:2],
                val_tasks=tasks[2:],
                store=store,
                evaluator=evaluator,
                optimizer=optimizer,  # type: ignore[arg-type]
            )
        finally:
            stop.set()
            await running
        assert result.seed.val_score == 0.0 and result.best.val_score == 1.0
        assert result.best.candidate.prompts == {"prompt_template": "Find a room in {city}; pick the smallest."}
        assert "the prompt must mention smallest" in optimizer.prompts[0]  # feedback from the span reached it
        assert result.usage.rollouts == 2 + 2 + 2 == sum(finished)  # seed val, seed train batch, child val
        rollouts = await store.query_rollouts()
        by_version: dict[str | None, list[Rollout]] = {}
        for one in rollouts:
            by_version.setdefault(one.resources_id, []).append(one)
        seed_id, child_id = result.seed.candidate.candidate_id, result.best.candidate.candidate_id
        assert sorted(by_version) == sorted([seed_id, child_id])
        assert {r.mode for r in by_version[seed_id]} == {RolloutMode.VAL, RolloutMode.TRAIN}
        assert all(r.status is RolloutStatus.SUCCEEDED for r in rollouts)
        assert all(r.final_reward == 1.0 for r in by_version[child_id])
        child_version = await store.get_resources(child_id)
        assert child_version is not None and child_version.metadata["parent_resources_ids"] == [seed_id]
        await store.close()

    asyncio.run(scenario())


def bad_val_sets(n_per_set: int | None = None) -> dict[str, list[Any]]:
    """A tasks module's validation sets with a row that is not a task (for the check below)."""
    return {"val": [{"task_id": "v0"}, "not a task"]}


def test_a_prompt_job_checks_every_task_before_anything_runs(tmp_path: Path) -> None:
    from agentbolt.trainer.prompt_opt import check_job_inputs

    module = tmp_path / "bad_prompt_tasks.py"
    module.write_text(
        "from tests.unit.test_prompt_opt_job import bad_val_sets as load_val_sets\n"
        "def load_train_tasks(size=8):\n    return [{'task_id': 't0'}]\n"
    )
    job = load_job_config(
        REPO / "examples/room_agent/config.yaml",
        [f"out_dir={tmp_path / 'out'}", "model=smollm2-135m", f"tasks={module.stem}"],
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ConfigError, match=r"load_val_sets\(\) set 'val': item 1 is a string"):
            check_job_inputs(job)  # type: ignore[arg-type]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module.stem, None)
    assert not (tmp_path / "out").exists()
