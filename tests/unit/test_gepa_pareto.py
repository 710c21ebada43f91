"""The reflective Pareto optimizer: the front rule on hand-made scores, weighted selection, lineage, merge, and a
run over two named prompts on a scripted world (no model).

Scripted world: task ``(name, n)`` scores 1.0 when prompt ``name`` contains ``rule<n>``; its feedback says
``needs <name>:rule<n>``. The scripted reflection adds to the named prompt the first rule the feedback asks of it
that the prompt lacks (no ``<prompt>`` block, so no candidate, when there is none).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from openai.types.chat import ChatCompletion

from agentbolt.algorithms.apo import (
    Candidate,
    GEPAConfig,
    OptimizerLLM,
    TaskResult,
    Trace,
    merge_prompts,
    optimize_gepa,
    pareto_front,
    select_for_mutation,
)
from agentbolt.algorithms.apo.pareto import ancestors
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import PromptTemplate, RolloutMode


def test_front_keeps_every_candidate_best_on_some_task_ties_included() -> None:
    scores = {
        "a": {"t1": 1.0, "t2": 0.0, "t3": 0.0},
        "b": {"t1": 1.0, "t2": 0.5, "t3": 0.0},  # ties a on t1
        "c": {"t1": 0.0, "t2": 0.5, "t3": 0.0},  # ties b on t2
        "d": {"t1": 0.5, "t2": 0.25, "t3": 0.0},
    }
    # t3: everyone ties at 0.0, so all four win it and stay.
    assert pareto_front(scores) == {
        "a": frozenset({"t1", "t3"}),
        "b": frozenset({"t1", "t2", "t3"}),
        "c": frozenset({"t2", "t3"}),
        "d": frozenset({"t3"}),
    }
    without_t3 = {name: {t: s for t, s in by_task.items() if t != "t3"} for name, by_task in scores.items()}
    assert pareto_front(without_t3) == {"a": frozenset({"t1"}), "b": frozenset({"t1", "t2"}), "c": frozenset({"t2"})}


def test_best_mean_can_be_off_the_front_and_missing_scores_do_not_compete() -> None:
    assert list(
        pareto_front({"A": {"t1": 1.0, "t2": 0.0}, "B": {"t1": 0.0, "t2": 1.0}, "C": {"t1": 0.9, "t2": 0.9}})
    ) == [
        "A",
        "B",
    ]
    assert pareto_front({"x": {"t1": 0.2}, "y": {"t2": 0.1}}) == {"x": frozenset({"t1"}), "y": frozenset({"t2"})}
    assert pareto_front({}) == {}


def test_selection_is_weighted_by_tasks_won() -> None:
    rng = random.Random(0)
    counts = Counter(
        select_for_mutation({"one": frozenset({"t1"}), "three": frozenset({"t2", "t3", "t4"})}, rng)
        for _ in range(4000)
    )
    assert abs(counts["three"] / 4000 - 0.75) < 0.03


def test_ancestors_and_merge_take_the_changed_prompt() -> None:
    parents = {"s": (), "x": ("s",), "y": ("s",), "z": ("x", "y")}
    assert ancestors("z", parents) == {"s", "x", "y"}
    assert ancestors("s", parents) == set()
    ancestor = {"plan": "P0", "answer": "A0", "check": "C0"}
    first = {"plan": "P1", "answer": "A0", "check": "C1"}
    second = {"plan": "P0", "answer": "A2", "check": "C2"}
    assert merge_prompts(ancestor, first, second, prefer_first=True) == {"plan": "P1", "answer": "A2", "check": "C1"}
    assert merge_prompts(ancestor, first, second, prefer_first=False) == {"plan": "P1", "answer": "A2", "check": "C2"}


TASKS = [
    {"task_id": "t0", "prompt": "plan", "rule": 1},
    {"task_id": "t1", "prompt": "answer", "rule": 2},
    {"task_id": "t2", "prompt": "plan", "rule": 3},
    {"task_id": "t3", "prompt": "answer", "rule": 4},
]


def completion(text: str) -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        }
    )


async def scripted_reflection(*, model: str, messages: list[dict[str, str]], **params: object) -> ChatCompletion:
    request = messages[0]["content"]
    if "<critique>" in request:  # the edit request made when a reflection gave no prompt: the text pasted back
        current = re.search(r"<current_prompt>\n(.*?)\n</current_prompt>", request, re.DOTALL)
        assert current is not None
        return completion(f"<prompt>{current.group(1)}</prompt>")
    name_match = re.search(r'Its name is "(\w+)"', request)
    prompt_match = re.search(r"<current_prompt>\n(.*?)\n</current_prompt>", request, re.DOTALL)
    assert name_match and prompt_match
    name, prompt = name_match.group(1), prompt_match.group(1)
    for rule in re.findall(rf"needs {name}:(rule\d)", request):
        if rule not in prompt:
            return completion(f"The feedback asks for {rule}.\n<prompt>{prompt} {rule}</prompt>")
    return completion("Nothing to change.")


async def scripted_evaluator(
    candidate: Candidate, tasks: Sequence[Mapping[str, object]], *, mode: RolloutMode
) -> list[TaskResult]:
    results = []
    for task in tasks:
        name, rule = str(task["prompt"]), f"rule{task['rule']}"
        reward = 1.0 if rule in candidate.prompts[name] else 0.0
        trace = Trace(messages=[{"role": "user", "content": "book"}], answer="x", feedback=f"needs {name}:{rule}")
        results.append(TaskResult(str(task["task_id"]), reward, trace))
    return results


def test_gepa_run_over_two_named_prompts(tmp_path: Path) -> None:
    config = GEPAConfig(max_iterations=12, minibatch_size=4, merge_subsample_size=4, seed=0)
    optimizer = OptimizerLLM(scripted_reflection, model="scripted")

    async def main():
        store = SqliteLightningStore(tmp_path / "store.db")
        try:
            result = await optimize_gepa(
                config,
                seed_prompts={"plan": "Plan {time}.", "answer": "Answer."},
                train_tasks=TASKS,
                val_tasks=TASKS,
                store=store,
                evaluator=scripted_evaluator,
                optimizer=optimizer,
            )
            versions = await store.query_resources()
        finally:
            await store.close()
        return result, versions

    result, versions = asyncio.run(main())

    # Every proposed candidate, accepted or not, is one resources version holding both named prompts.
    assert [v.resources_id for v in versions] == [c.candidate.candidate_id for c in result.candidates]
    for version, scored in zip(versions, result.candidates, strict=True):
        assert version.metadata["algorithm"] == "gepa"
        assert version.metadata["origin"] == scored.candidate.origin
        assert version.metadata["parent_resources_ids"] == list(scored.candidate.parent_ids)
        for name in ("plan", "answer"):
            resource = version.resources[name]
            assert isinstance(resource, PromptTemplate)
            assert resource.template == scored.candidate.prompts[name]
    # Both prompts were mutated, placeholders kept, and the search solved every validation task.
    assert result.best.val_score == 1.0
    assert "{time}" in result.best.candidate.prompts["plan"]
    assert {c.candidate.origin for c in result.candidates} >= {"seed", "reflect"}
    accepted = [c for c in result.candidates if c.accepted]
    assert all(set(c.val_scores) == {"t0", "t1", "t2", "t3"} for c in accepted)
    assert all(c.val_scores == {} for c in result.candidates if not c.accepted)
    # Pinned trajectory (seed 0): plan+rule1, answer+rule2, their merge, then rule3/rule4, and a second merge.
    assert [c.candidate.origin for c in result.candidates] == [
        "seed", "reflect", "reflect", "merge", "reflect", "reflect", "merge",
    ]  # fmt: skip
    # A merge combines two accepted candidates that share an ancestor, taking each one's changed prompt.
    first_merge = result.candidates[3].candidate
    assert set(first_merge.parent_ids) == {
        result.candidates[1].candidate.candidate_id,
        result.candidates[2].candidate.candidate_id,
    }
    assert dict(first_merge.prompts) == {"plan": "Plan {time}. rule1", "answer": "Answer. rule2"}
    assert versions[3].metadata["ancestor_resources_id"] == result.candidates[0].candidate.candidate_id
    assert result.usage.optimizer_calls >= len([c for c in result.candidates if c.candidate.origin == "reflect"])
    assert result.usage.rollouts > 0


def test_gepa_stops_at_the_rollout_budget() -> None:
    result = run_in_memory(
        GEPAConfig(max_iterations=50, max_rollouts=10, minibatch_size=2),
        {"plan": "Plan.", "answer": "Answer."},
        scripted_evaluator,
        OptimizerLLM(scripted_reflection, model="scripted"),
    )
    # Seed val 4; no iteration starts at >= 10, and one iteration uses at most 2 + 2 + 4 rollouts.
    assert 10 <= result.usage.rollouts <= 10 + 8


def test_a_reflection_without_a_usable_prompt_is_rewritten_with_the_edit_template() -> None:
    requests: list[str] = []

    async def echoing(*, model: str, messages: list[dict[str, str]], **params: object) -> ChatCompletion:
        # The reflection states the rule but pastes the current text back; the edit request gets the new text.
        request = messages[0]["content"]
        requests.append(request)
        prompt = re.search(r"<current_prompt>\n(.*?)\n</current_prompt>", request, re.DOTALL)
        assert prompt is not None
        if "<critique>" not in request:
            return completion(f"Add rule1.\n<current_prompt>\n{prompt.group(1)}\n</current_prompt>")
        assert "<critique>\nAdd rule1." in request  # the reflection's whole reply is the critique
        return completion(f"<prompt>{prompt.group(1)} rule1</prompt>")

    result = run_in_memory(
        GEPAConfig(max_iterations=1, minibatch_size=4, use_merge=False, seed=0),
        {"plan": "Plan {time}."},
        one_prompt_evaluator,
        OptimizerLLM(echoing, model="scripted"),
    )
    assert len(requests) == 2 and 'Its name is "plan"' in requests[0] and "<critique>" in requests[1]
    shown = re.findall(r"^### Task .*$|^- \S+: reward .*$", requests[0], re.MULTILINE)  # traces and outcome lines
    assert shown and all(line in requests[1] for line in shown)  # the rewrite sees the same runs
    assert result.usage.optimizer_calls == 2 and result.usage.rejected_edits == 0
    assert [c.candidate.prompts["plan"] for c in result.candidates] == ["Plan {time}.", "Plan {time}. rule1"]
    assert result.candidates[1].accepted and result.best.candidate.prompts["plan"] == "Plan {time}. rule1"


def test_reflection_traces_shows_the_worst_traces_and_one_line_per_task() -> None:
    requests: list[str] = []

    async def recording(*, model: str, messages: list[dict[str, str]], **params: object) -> ChatCompletion:
        requests.append(messages[0]["content"])
        return await scripted_reflection(model=model, messages=messages, **params)

    async def t2_passes(
        candidate: Candidate, tasks: Sequence[Mapping[str, object]], *, mode: RolloutMode
    ) -> list[TaskResult]:
        results = await one_prompt_evaluator(candidate, tasks, mode=mode)
        return [TaskResult(r.task_id, 1.0, r.trace) if r.task_id == "t2" else r for r in results]

    run_in_memory(
        GEPAConfig(max_iterations=1, minibatch_size=4, reflection_traces=2, use_merge=False, seed=0),
        {"plan": "Plan {time}."},
        t2_passes,
        OptimizerLLM(recording, model="scripted"),
    )
    # The minibatch is all 4 tasks; t2 scores 1, the rest 0: the two worst in minibatch order are t0 and t1.
    assert re.findall(r"### Task (t\d)", requests[0]) == ["t0", "t1"]
    assert "- t2: reward 1.00; answer: x; needs plan:rule3" in requests[0]
    assert "- t3: reward 0.00; answer: x; needs plan:rule4" in requests[0]


async def one_prompt_evaluator(
    candidate: Candidate, tasks: Sequence[Mapping[str, object]], *, mode: RolloutMode
) -> list[TaskResult]:
    """The scripted world with every task asking for prompt ``plan``."""
    return await scripted_evaluator(candidate, [{**task, "prompt": "plan"} for task in tasks], mode=mode)


def run_in_memory(config: GEPAConfig, seed_prompts: dict[str, str], evaluator, optimizer: OptimizerLLM):
    """``optimize_gepa`` over ``TASKS`` (train and validation) with a real in-memory store."""
    from agentbolt.store.memory import InMemoryLightningStore

    async def main():
        store = InMemoryLightningStore()
        try:
            return await optimize_gepa(
                config,
                seed_prompts=seed_prompts,
                train_tasks=TASKS,
                val_tasks=TASKS,
                store=store,
                evaluator=evaluator,
                optimizer=optimizer,
            )
        finally:
            await store.close()

    return asyncio.run(main())
