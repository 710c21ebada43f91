"""APO beam search on a scripted world: bookkeeping, one resources version per candidate, the optimizer call cache,
template overrides. No model: the evaluator and the optimizer are deterministic scripts written for these tests.

The scripted world: task ``k`` of kind ``n`` scores 1.0 when the prompt contains ``rule<n>``, else 0.0; the trace's
feedback says ``needs rule<n>``. The scripted optimizer's critique names the rule of the first trace it is shown
(``missing: rule<n>``) and its edit appends ``rule<n> v<variant>`` to the prompt.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletion

from agentbolt.algorithms.apo import (
    APOConfig,
    CallCache,
    Candidate,
    OptimizerLLM,
    TaskResult,
    TemplateOverride,
    Trace,
    call_key,
    load_templates,
    optimize_apo,
)
from agentbolt.algorithms.apo.candidates import extract_prompt, restore_dropped_fields
from agentbolt.algorithms.apo.types import format_outcomes, format_trace
from agentbolt.errors import ConfigError
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import LLM, PromptTemplate, RolloutMode

TASKS = [
    {"task_id": "t0", "kind": 1},
    {"task_id": "t1", "kind": 2},
    {"task_id": "t2", "kind": 1},
    {"task_id": "t3", "kind": 3},
]
SEED = "Book a room at {time}."


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


class ScriptedOptimizer:
    """Answers critique and edit requests of the shipped templates deterministically; records every request."""

    def __init__(self, *, edit_suffix: str = "", drop: str | None = None) -> None:
        self.requests: list[str] = []
        self.edit_suffix = edit_suffix
        self.drop = drop  # a placeholder the edit replaces by "noon"

    async def create(self, *, model: str, messages: list[dict[str, str]], **params: object) -> ChatCompletion:
        request = messages[0]["content"]
        self.requests.append(request)
        if "<critique>" in request:
            prompt = re.search(r"<current_prompt>\n(.*?)\n</current_prompt>", request, re.DOTALL)
            rule = re.search(r"missing: (rule\d)", request)
            variant = re.search(r"version (\d+)\s+of", request)
            assert prompt and rule and variant
            text = f"{prompt.group(1)} {rule.group(1)} v{variant.group(1)}{self.edit_suffix}"
            return completion(f"<prompt>{text.replace(self.drop, 'noon') if self.drop else text}</prompt>")
        rule = re.search(r"Feedback: needs (rule\d)", request)
        return completion(f"- missing: {rule.group(1) if rule else 'rule9'}")


class ScriptedEvaluator:
    """Scores a candidate by the rules its prompt contains; records (candidate, task ids, mode) of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], RolloutMode]] = []

    async def __call__(
        self, candidate: Candidate, tasks: Sequence[Mapping[str, object]], *, mode: RolloutMode
    ) -> list[TaskResult]:
        ids = [str(task["task_id"]) for task in tasks]
        self.calls.append((candidate.candidate_id, ids, mode))
        prompt = candidate.prompts["prompt_template"]
        results = []
        for task in tasks:
            rule = f"rule{task['kind']}"
            reward = 1.0 if rule in prompt else 0.0
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "Nova"}]
            trace = Trace(messages=messages, answer="Nova", feedback=f"needs {rule}")
            results.append(TaskResult(str(task["task_id"]), reward, trace, rollout_id=f"ro-{candidate.candidate_id}"))
        return results


def run_apo(config: APOConfig, optimizer: OptimizerLLM, evaluator: ScriptedEvaluator):
    async def main():
        store = InMemoryLightningStore()
        try:
            result = await optimize_apo(
                config,
                seed_prompts={"prompt_template": SEED},
                train_tasks=TASKS,
                val_tasks=TASKS,
                store=store,
                evaluator=evaluator,
                optimizer=optimizer,
                base_resources={"llm": LLM(endpoint="http://127.0.0.1:1/v1", model="m")},
                run_metadata={"run_id": "test"},
            )
            versions = await store.query_resources()
        finally:
            await store.close()
        return result, versions

    return asyncio.run(main())


CONFIG = APOConfig(rounds=2, beam_width=2, branch_factor=2, train_batch_size=10, worst_k=1)


def test_beam_bookkeeping_on_a_scripted_optimizer() -> None:
    script = ScriptedOptimizer()
    optimizer = OptimizerLLM(script.create, model="scripted", sampling={"temperature": 0.7})
    evaluator = ScriptedEvaluator()
    result, _ = run_apo(CONFIG, optimizer, evaluator)

    by_prompt = {c.candidate.prompts["prompt_template"]: c for c in result.candidates}
    # Round 1: the seed's worst trace is t0 (all 0.0, batch order), so both branches add rule1: val 2/4.
    # Round 2: each of the two rule1 candidates gets rule2 (t1 is its first failure) twice: val 3/4.
    expected = {
        SEED: 0.0,
        f"{SEED} rule1 v1": 0.5,
        f"{SEED} rule1 v2": 0.5,
        f"{SEED} rule1 v1 rule2 v1": 0.75,
        f"{SEED} rule1 v1 rule2 v2": 0.75,
        f"{SEED} rule1 v2 rule2 v1": 0.75,
        f"{SEED} rule1 v2 rule2 v2": 0.75,
    }
    assert {text: c.val_score for text, c in by_prompt.items()} == expected
    assert [c.candidate.round_index for c in result.candidates] == [0, 1, 1, 2, 2, 2, 2]
    # Ties go to the older candidate: the best is the first 0.75 one, made from the first beam member.
    assert result.best.candidate.prompts["prompt_template"] == f"{SEED} rule1 v1 rule2 v1"
    assert result.best.candidate.parent_ids == (by_prompt[f"{SEED} rule1 v1"].candidate.candidate_id,)
    assert result.seed.val_score == 0.0
    # Calls: 2 per (beam member, branch): round 1 has 1 x 2, round 2 has 2 x 2.
    assert result.usage.optimizer_calls == 12 == len(script.requests)
    assert result.usage.cache_hits == 0
    # Rollouts: seed val 4; round 1 seed train 4 + 2 children val 8; round 2 beam train 8 + 4 children val 16.
    assert result.usage.rollouts == 40
    assert sum(len(ids) for _, ids, _ in evaluator.calls) == 40
    # A candidate never runs twice on the same task in the same mode.
    seen = [(cid, task_id, mode) for cid, ids, mode in evaluator.calls for task_id in ids]
    assert len(seen) == len(set(seen))


def test_one_resources_version_per_candidate() -> None:
    script = ScriptedOptimizer()
    evaluator = ScriptedEvaluator()
    result, versions = run_apo(CONFIG, OptimizerLLM(script.create, model="scripted"), evaluator)

    assert [v.resources_id for v in versions] == [c.candidate.candidate_id for c in result.candidates]
    by_id = {v.resources_id: v for v in versions}
    for scored in result.candidates:
        version = by_id[scored.candidate.candidate_id]
        template = version.resources["prompt_template"]
        assert isinstance(template, PromptTemplate)
        assert template.template == scored.candidate.prompts["prompt_template"]
        assert isinstance(version.resources["llm"], LLM)
        assert version.metadata["algorithm"] == "apo"
        assert version.metadata["round"] == scored.candidate.round_index
        assert version.metadata["parent_resources_ids"] == list(scored.candidate.parent_ids)
        assert version.metadata["run_id"] == "test"
    # Every evaluation ran under an existing resources version (the id the evaluator enqueues with).
    assert {cid for cid, _, _ in evaluator.calls} <= set(by_id)


def test_rerun_replays_optimizer_from_cache(tmp_path: Path) -> None:
    first = ScriptedOptimizer()
    run_apo(CONFIG, OptimizerLLM(first.create, model="scripted", cache=CallCache(tmp_path)), ScriptedEvaluator())
    second = ScriptedOptimizer()
    optimizer = OptimizerLLM(second.create, model="scripted", cache=CallCache(tmp_path))
    result, _ = run_apo(CONFIG, optimizer, ScriptedEvaluator())
    assert second.requests == []
    assert result.usage.optimizer_calls == result.usage.cache_hits == 12


def test_repeated_call_is_a_cache_hit(tmp_path: Path) -> None:
    script = ScriptedOptimizer()
    optimizer = OptimizerLLM(script.create, model="m", sampling={"temperature": 0.5}, cache=CallCache(tmp_path))

    async def main() -> list[str]:
        return [
            await optimizer.complete("Feedback: needs rule1"),
            await optimizer.complete("Feedback: needs rule1"),
            await optimizer.complete("Feedback: needs rule1", sample_index=1),
        ]

    replies = asyncio.run(main())
    assert replies == ["- missing: rule1"] * 3
    assert (optimizer.calls, optimizer.cache_hits, len(script.requests)) == (3, 1, 2)
    messages = [{"role": "user", "content": "x"}]
    assert call_key("m", messages, {"temperature": 0.5}) == call_key("m", messages, {"temperature": 0.5})
    assert call_key("m", messages, {"temperature": 0.5}) != call_key("m", messages, {"temperature": 0.6})
    assert call_key("m", messages, {}) != call_key("other", messages, {})


def test_invented_placeholders_are_escaped_dropped_ones_restored_bad_braces_rejected() -> None:
    config = APOConfig(rounds=1, branch_factor=2, worst_k=1)
    script = ScriptedOptimizer(edit_suffix=" {room}")
    result, versions = run_apo(config, OptimizerLLM(script.create, model="m"), ScriptedEvaluator())
    # {room} is no field of the seed: kept as literal text, so both edits are usable (and the agent can fill them)
    assert result.usage.rejected_edits == 0 and len(versions) == len(result.candidates) == 3
    edits = [c.candidate.prompts["prompt_template"] for c in result.candidates[1:]]
    assert edits == [f"{SEED} rule1 v1 {{{{room}}}}", f"{SEED} rule1 v2 {{{{room}}}}"]
    assert PromptTemplate(template=edits[0]).format(time="09:00") == "Book a room at 09:00. rule1 v1 {room}"

    dropping = ScriptedOptimizer(drop="{time}")
    result, versions = run_apo(config, OptimizerLLM(dropping.create, model="m"), ScriptedEvaluator())
    # the edit lost the seed's {time}: the seed's sentence holding it comes back as a last paragraph
    assert result.usage.rejected_edits == 0 and len(versions) == len(result.candidates) == 3
    edits = [c.candidate.prompts["prompt_template"] for c in result.candidates[1:]]
    assert edits == [f"Book a room at noon. rule1 v{v}\n\nBook a room at {{time}}." for v in (1, 2)]

    unbalanced = ScriptedOptimizer(edit_suffix=" {oops")
    result, versions = run_apo(config, OptimizerLLM(unbalanced.create, model="m"), ScriptedEvaluator())
    assert result.usage.rejected_edits == 2  # str.format cannot fill "{oops": refused, nothing published
    assert len(versions) == len(result.candidates) == 1
    assert result.best.candidate.prompts["prompt_template"] == SEED


def test_template_override_from_config_text_and_path(tmp_path: Path) -> None:
    critique_file = tmp_path / "critique.md"
    critique_file.write_text("FILE CRITIQUE of {prompt}\n{traces}\n", encoding="utf-8")
    config = APOConfig.model_validate(
        {
            "rounds": 1,
            "branch_factor": 1,
            "worst_k": 1,
            "templates": {"critique": {"path": str(critique_file)}, "edit": {"text": EDIT_OVERRIDE}},
        }
    )
    script = ScriptedOptimizer()
    result, _ = run_apo(config, OptimizerLLM(script.create, model="m"), ScriptedEvaluator())
    assert script.requests[0].startswith("FILE CRITIQUE of Book a room at {time}.")
    assert script.requests[1].startswith("CUSTOM EDIT")
    assert result.best.val_score == 0.5

    relative = load_templates({"critique": TemplateOverride(path="critique.md")}, base_dir=tmp_path)
    assert relative.texts["critique"].startswith("FILE CRITIQUE")
    assert "<critique>" in load_templates().texts["edit"]  # the shipped file, read from the package


EDIT_OVERRIDE = (
    "CUSTOM EDIT\n<current_prompt>\n{prompt}\n</current_prompt>\n<critique>{critique}</critique> version {variant} of"
)


def test_bad_template_overrides_fail_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"lacks the placeholder\(s\) \{traces\}"):
        load_templates({"critique": TemplateOverride(text="only {prompt}")})
    with pytest.raises(ConfigError, match="unknown optimizer template 'gradient'"):
        load_templates({"gradient": TemplateOverride(text="{prompt}")})
    with pytest.raises(ConfigError, match="cannot read"):
        load_templates({"edit": TemplateOverride(path=str(tmp_path / "missing.md"))})
    with pytest.raises(ValueError, match="exactly one of 'path' or 'text'"):
        TemplateOverride(path="a.md", text="b")


def test_rendering_leaves_other_braces_and_inserted_text_alone() -> None:
    templates = load_templates({"critique": TemplateOverride(text='{prompt} {"json": 1} {traces} {unknown}')})
    rendered = templates.render("critique", prompt="P {time}", traces="T {prompt}")
    assert rendered == 'P {time} {"json": 1} T {prompt} {unknown}'


def test_critique_and_edit_show_every_batch_outcome_and_the_worst_traces() -> None:
    """worst_k=1 shows one full trace; the outcome lines cover all 4 batch tasks (reward, answer, feedback)."""
    script = ScriptedOptimizer()
    optimizer = OptimizerLLM(script.create, model="scripted", sampling={"temperature": 0.7})
    run_apo(
        APOConfig(rounds=1, beam_width=1, branch_factor=1, train_batch_size=10, worst_k=1),
        optimizer,
        ScriptedEvaluator(),
    )
    critique = script.requests[0]
    assert critique.count("### Task ") == 1 and "### Task t0 (reward 0.00)" in critique
    expected_lines = [
        "- t0: reward 0.00; answer: Nova; needs rule1",
        "- t1: reward 0.00; answer: Nova; needs rule2",
        "- t2: reward 0.00; answer: Nova; needs rule1",
        "- t3: reward 0.00; answer: Nova; needs rule3",
    ]
    assert "\n".join(expected_lines) in critique
    edit = script.requests[1]  # the edit step sees the failing examples too, not only the critique (Pryzant et al.)
    assert "<critique>\n- missing: rule1\n</critique>" in edit
    assert edit.count("### Task ") == 1 and "### Task t0 (reward 0.00)" in edit and "Feedback: needs rule1" in edit
    assert "\n".join(expected_lines) in edit


def test_format_outcomes_by_hand() -> None:
    results = [
        TaskResult("s04", 1.0, Trace(answer="Quark", feedback="Correct: Quark.")),
        TaskResult("s05", 0.0, Trace(answer=None, feedback="x" * 300)),
        TaskResult("s06", 0.0, None),
    ]
    text = format_outcomes([{"task_id": "s04"}, {"task_id": "s05"}, {"task_id": "s06"}], results)
    assert text.splitlines() == [
        "- s04: reward 1.00; answer: Quark; Correct: Quark.",
        "- s05: reward 0.00; answer: (none); " + "x" * 197 + "...",
        "- s06: reward 0.00; answer: (none)",
    ]
    with pytest.raises(ValueError, match="3 tasks but 2 results"):
        format_outcomes([{"task_id": "a"}, {"task_id": "b"}, {"task_id": "c"}], results[:2])


def test_format_trace_cuts_the_messages_and_keeps_the_answer_and_feedback() -> None:
    trace = Trace(
        messages=({"role": "user", "content": "Book {x}."}, {"role": "tool", "content": "y" * 100}),
        answer="Atlas",
        feedback="Wrong: the expected choice was No Room, the agent answered Atlas.",
    )
    head = '### Task s01 (reward 0.00)\nInput: {"n": 1}'
    tail = "Parsed answer: Atlas\nFeedback: Wrong: the expected choice was No Room, the agent answered Atlas."
    body = "[user] Book {x}.\n[tool] " + "y" * 100
    task = {"task_id": "s01", "n": 1}
    result = TaskResult("s01", 0.0, trace)
    assert format_trace(task, result, max_chars=1000) == "\n".join([head, body, tail])
    # 200 characters: the frame is 42 (heading, input) + 96 (answer, feedback) + the 2 line breaks around the
    # messages = 140, so the messages get 60
    assert len(head) + len(tail) + 2 == 140
    assert format_trace(task, result, max_chars=200) == "\n".join([head, body[:57] + "...", tail])
    assert len(format_trace(task, result, max_chars=200)) == 200
    # a limit the frame cannot fit in cuts the whole text, as before
    cut = format_trace(task, result, max_chars=100)
    assert cut == ("\n".join([head, body, tail]))[:97] + "..."
    no_messages = Trace(answer="Atlas", feedback=trace.feedback)
    assert format_trace(task, TaskResult("s01", 0.0, no_messages), max_chars=1000) == head + "\n" + tail
    no_trace = format_trace(task, TaskResult("s01", 0.0, None), max_chars=30)
    assert no_trace == (head + "\n(no trace recorded)")[:27] + "..."


@pytest.mark.parametrize(
    ("reply", "allow_bare", "expected"),
    [
        ("Reasoning.\n<prompt>\nA {time}\n</prompt>", False, "A {time}"),
        ("<prompt>first</prompt> then <prompt>second</prompt>", False, "second"),
        (
            "<current_prompt>\nold {time}\n</current_prompt>\n<new_prompt>\nnew {time}\n</new_prompt>",
            False,
            "new {time}",
        ),
        ("Improved:\n<current_prompt>\nnew {time}\n</current_prompt>\nThis is better.", False, "new {time}"),
        ("no tags at all", False, None),
        ("no tags at all", True, "no tags at all"),
        ("Sure.\n<prompt>\ncut by max_tokens", False, "cut by max_tokens"),
        ("New text:\n<current_prompt>\nmixed {time}\n</prompt>\nWhy: clearer.", True, "mixed {time}"),
        ("<prompt>\nmixed {time}\n</current_prompt> done", False, "mixed {time}"),
        ("<current_prompt>old</current_prompt>\n<prompt>a</current_prompt>\n<prompt>b</prompt>", False, "b"),
        ("```\nfenced {time}\n```", True, "fenced {time}"),
        ("   ", True, None),
    ],
)
def test_extract_prompt_by_hand(reply: str, allow_bare: bool, expected: str | None) -> None:
    assert extract_prompt(reply, allow_bare=allow_bare) == expected


def test_extract_prompt_drops_the_request_wording_pasted_back() -> None:
    # Qwen2.5-Coder-1.5B (GEPA run, 2026-12-01) echoed the end of the edit request, then began its prompt
    ask = "Reply with the new prompt only, between <prompt> and </prompt>."
    request = "<current_prompt>\nBook {date}.\n</current_prompt>\n" + ask
    reply = (
        "</critique>\nReply with the new prompt only, between <prompt> and </prompt>.\n<prompt>\nBook {date}. Rules:"
    )
    assert extract_prompt(reply, allow_bare=True) == "and"  # without the request the echo wins
    assert extract_prompt(reply, allow_bare=True, request=request) == "Book {date}. Rules:"
    # only the echo goes: a block with other text stays, and so does one equal to the current prompt
    assert extract_prompt("between <prompt>Book {date} now.</prompt>", allow_bare=False, request=request) == (
        "Book {date} now."
    )
    assert extract_prompt("<prompt>Book {date}.</prompt>", allow_bare=False, request=request) == "Book {date}."
    assert extract_prompt("only <prompt> and </prompt>", allow_bare=False, request=request) is None


def test_extract_prompt_passes_over_an_echo_of_the_current_prompt() -> None:
    # Qwen2.5-Coder-1.5B (APO run, 2026-12-01): both round-2 edits copied the current prompt first, then began the
    # new one in a tag that max_tokens left open; the echo was taken and refused, so the round had no candidate
    current = "Book a room on {date}. The function `choose` returns the room ID."
    request = f"<current_prompt>\n{current}\n</current_prompt>\nReply between <prompt> and </prompt>."
    mixed_echo = f"<current_prompt>\n{current}\n</prompt>\n\n<prompt>\nTo book a room on {{date}}:\n1. Filter the"
    assert extract_prompt(mixed_echo, allow_bare=True) == current  # without the request: the complete block
    assert extract_prompt(mixed_echo, allow_bare=True, request=request) == "To book a room on {date}:\n1. Filter the"
    shown_tag = f"<current_prompt>\n{current}\n</current_prompt>\n### Improved\n<current_prompt>\n{current}\nRules: a"
    assert extract_prompt(shown_tag, allow_bare=True, request=request) == f"{current}\nRules: a"
    # an echo cut short is an echo too; with nothing else in the reply the echo comes back (and is refused later)
    assert extract_prompt("<prompt>Book a room on {date}. The func", allow_bare=False, request=request) == (
        "Book a room on {date}. The func"
    )
    assert (
        extract_prompt(f"<prompt>{current}</prompt> <prompt>New {{date}}.</prompt>", allow_bare=False, request=request)
        == "New {date}."
    )
    assert (
        extract_prompt(f"<prompt>New {{date}}.</prompt> <prompt>{current}</prompt>", allow_bare=False, request=request)
        == "New {date}."
    )
    assert (
        extract_prompt(f"<current_prompt>{current}</current_prompt> then {current}", allow_bare=True, request=request)
        == current
    )


def test_restore_dropped_fields_brings_back_the_parents_sentences() -> None:
    parent = "Book a room on {date} at {time}. Needed equipment: {needs}! Accessible: {accessible_required}?"
    # every field kept: unchanged
    assert restore_dropped_fields(parent, "At {time} on {date}: {needs}, {accessible_required}") == (
        "At {time} on {date}: {needs}, {accessible_required}"
    )
    # {needs} and {accessible_required} dropped: their two sentences, in the parent's order
    assert restore_dropped_fields(parent, "Pick a room for {date} {time}.\n") == (
        "Pick a room for {date} {time}.\n\nNeeded equipment: {needs}! Accessible: {accessible_required}?"
    )
    # a sentence holding a dropped and a kept field comes back whole (the kept field then appears twice)
    assert restore_dropped_fields(parent, "Room at {time}, needs {needs}, access {accessible_required}.") == (
        "Room at {time}, needs {needs}, access {accessible_required}.\n\nBook a room on {date} at {time}."
    )
    # line breaks end sentences too
    assert restore_dropped_fields("Date: {date}\nTime: {time}", "When: {date}") == "When: {date}\n\nTime: {time}"
    # a field split across sentences by a format spec with a dot: named plainly
    assert restore_dropped_fields("Cost {price:.2f} now.", "Cheap.") == "Cheap.\n\nprice: {price}"
    assert restore_dropped_fields(parent, None) is None
    assert restore_dropped_fields(parent, "unbalanced {") == "unbalanced {"
