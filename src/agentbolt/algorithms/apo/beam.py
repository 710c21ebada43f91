"""APO: textual-gradient beam search over one named prompt.

One round (Pryzant et al., 2023, arXiv:2305.03495, Algorithm 1, with agent-lightning's beam defaults in spirit):
    1. draw ``train_batch_size`` training tasks; run every beam member on them;
    2. for each beam member and each branch ``b < branch_factor``: show the optimizer the member's ``worst_k``
       lowest-reward traces, and one line per batch task (reward, answer, feedback) so patterns across the batch
       show, and ask for a critique (the textual gradient); then ask for an edited prompt answering that critique,
       shown the same traces and outcome lines (the paper's edit step also sees the failing examples, not only the
       gradient); ``sample_index = b`` keeps the branches distinct and cacheable;
    3. repair the edit (:func:`~.candidates.repair_edit`: placeholders it invented are escaped, sentences of the
       parent holding placeholders it dropped come back); publish every usable edit as a new resources version
       (:mod:`.candidates`); score it on the validation batch;
    4. the next beam is the ``beam_width`` best of (beam + new edits) by mean validation reward; a tie goes to the
       older candidate, so the beam never gets worse on validation.

Determinism: the random draws use ``random.Random(config.seed)``; evaluator and optimizer calls of one phase run
concurrently, but candidates are published and ranked in a fixed order (beam order, then branch order), so the same
evaluator and optimizer answers give the same resources versions and the same result.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentbolt.errors import ConfigError
from agentbolt.store.base import LightningStore
from agentbolt.types import Resource, RolloutMode

from .candidates import (
    CandidatePublisher,
    EvaluationBook,
    ProgressCallback,
    ProgressEvent,
    extract_prompt,
    placeholder_list,
    rejection_reason,
    repair_edit,
)
from .config import APOConfig
from .optimizer_llm import OptimizerLLM
from .templates import TemplateSet, load_templates
from .types import (
    Candidate,
    Evaluator,
    OptimizationResult,
    ScoredCandidate,
    TaskInput,
    TaskResult,
    Usage,
    format_outcomes,
    format_trace,
)


async def optimize_apo(
    config: APOConfig,
    *,
    seed_prompts: Mapping[str, str],
    train_tasks: Sequence[TaskInput],
    val_tasks: Sequence[TaskInput],
    store: LightningStore,
    evaluator: Evaluator,
    optimizer: OptimizerLLM,
    base_resources: Mapping[str, Resource] | None = None,
    templates: TemplateSet | None = None,
    run_metadata: Mapping[str, Any] | None = None,
    on_progress: ProgressCallback | None = None,
) -> OptimizationResult:
    """Run APO from ``seed_prompts`` and return every candidate with its validation scores and the best one.

    Args:
        config: the search settings.
        seed_prompts: prompt name -> starting template text.
        train_tasks: tasks for the critiques (each with a string ``task_id``).
        val_tasks: tasks for selection.
        store: where each candidate is written as a resources version.
        evaluator: runs a candidate on tasks (see :class:`~.types.Evaluator`).
        optimizer: the optimizer LLM; its call and cache-hit counts are copied into ``result.usage``.
        base_resources: resources every version also holds (e.g. ``{"llm": LLM(...)}``).
        templates: optimizer templates; default: the shipped ones with ``config.templates`` applied.
        run_metadata: extra metadata on every resources version (e.g. ``{"run_id": ...}``).
        on_progress: called after the seed's evaluation and after every round.

    Raises:
        ConfigError: no training or validation tasks, or ``prompt_name`` missing from ``seed_prompts`` (or not given
            while there are several prompts).
    """
    started = time.monotonic()
    name = _prompt_name(config, seed_prompts)
    if not train_tasks or not val_tasks:
        raise ConfigError(f"APO needs training and validation tasks; got {len(train_tasks)} and {len(val_tasks)}")
    templates = templates or load_templates(config.templates)
    rng = random.Random(config.seed)
    usage = Usage()
    book = EvaluationBook(evaluator, usage)
    publisher = CandidatePublisher(store, algorithm="apo", base_resources=base_resources, run_metadata=run_metadata)
    val_batch = _draw(rng, val_tasks, config.val_batch_size)

    seed = await publisher.publish(seed_prompts, origin="seed", round_index=0)
    scored: dict[str, ScoredCandidate] = {
        seed.candidate_id: ScoredCandidate(seed, await book.scores(seed, val_batch, RolloutMode.VAL))
    }
    beam = [seed]
    tried_texts = {seed.prompts[name]}
    _report(on_progress, 0, config.rounds, "seed", scored, usage, f"seed {seed.candidate_id}")

    for round_index in range(1, config.rounds + 1):
        batch = _draw(rng, train_tasks, config.train_batch_size)
        batch_results = await asyncio.gather(*(book.evaluate(parent, batch, RolloutMode.TRAIN) for parent in beam))
        jobs = [
            (parent, branch, results)
            for parent, results in zip(beam, batch_results, strict=True)
            for branch in range(config.branch_factor)
        ]
        replies = await asyncio.gather(
            *(
                _critique_and_edit(optimizer, templates, config, name, parent, batch, results, branch)
                for parent, branch, results in jobs
            )
        )
        children: list[Candidate] = []
        for (parent, _, _), (request, reply) in zip(jobs, replies, strict=True):
            new_text = repair_edit(parent.prompts[name], extract_prompt(reply, allow_bare=True, request=request))
            if rejection_reason(parent.prompts[name], new_text, tried_texts) is not None or new_text is None:
                usage.rejected_edits += 1
                continue
            tried_texts.add(new_text)
            children.append(
                await publisher.publish(
                    {**parent.prompts, name: new_text},
                    origin="edit",
                    round_index=round_index,
                    parent_ids=(parent.candidate_id,),
                )
            )
        child_scores = await asyncio.gather(*(book.scores(child, val_batch, RolloutMode.VAL) for child in children))
        for child, scores in zip(children, child_scores, strict=True):
            scored[child.candidate_id] = ScoredCandidate(child, scores)
        pool = beam + children
        ranked = sorted(pool, key=lambda candidate: -scored[candidate.candidate_id].val_score)  # stable: older first
        beam = ranked[: config.beam_width]
        _report(
            on_progress,
            round_index,
            config.rounds,
            "round",
            scored,
            usage,
            f"{len(children)} new candidate(s), {len(jobs) - len(children)} rejected; beam "
            + ", ".join(f"{c.candidate_id}={scored[c.candidate_id].val_score:.3f}" for c in beam),
        )

    usage.optimizer_calls, usage.cache_hits = optimizer.calls, optimizer.cache_hits
    usage.wall_s = time.monotonic() - started
    ordered = list(scored.values())
    best = max(ordered, key=lambda candidate: candidate.val_score)  # max keeps the first of equal scores
    return OptimizationResult(
        algorithm="apo", best=best, seed=scored[seed.candidate_id], candidates=ordered, usage=usage
    )


async def _critique_and_edit(
    optimizer: OptimizerLLM,
    templates: TemplateSet,
    config: APOConfig,
    name: str,
    parent: Candidate,
    batch: Sequence[TaskInput],
    results: Sequence[TaskResult],
    branch: int,
) -> tuple[str, str]:
    """The edit request and reply of one branch: critique of the parent's worst traces, then an edit answering it
    (shown the critique and the same traces and outcome lines)."""
    pairs = sorted(zip(batch, results, strict=True), key=lambda pair: pair[1].reward)[: config.worst_k]
    traces = "\n\n".join(format_trace(task, result, max_chars=config.max_trace_chars) for task, result in pairs)
    prompt = parent.prompts[name]
    outcomes = format_outcomes(batch, results)
    critique = await optimizer.complete(
        templates.render("critique", prompt=prompt, traces=traces, outcomes=outcomes), sample_index=branch
    )
    edit_request = templates.render(
        "edit",
        prompt=prompt,
        critique=critique.strip(),
        traces=traces,
        outcomes=outcomes,
        placeholders=placeholder_list(prompt),
        variant=str(branch + 1),
        variants=str(config.branch_factor),
    )
    return edit_request, await optimizer.complete(edit_request, sample_index=branch)


def _prompt_name(config: APOConfig, seed_prompts: Mapping[str, str]) -> str:
    if config.prompt_name is not None:
        if config.prompt_name not in seed_prompts:
            raise ConfigError(f"prompt_name {config.prompt_name!r} is not a seed prompt; have {sorted(seed_prompts)}")
        return config.prompt_name
    if len(seed_prompts) != 1:
        raise ConfigError(f"set prompt_name: APO edits one prompt, and the seed has {sorted(seed_prompts) or 'none'}")
    return next(iter(seed_prompts))


def _draw(rng: random.Random, tasks: Sequence[TaskInput], size: int | None) -> list[TaskInput]:
    """``size`` tasks drawn without replacement, in their original order; all when ``size`` is None or larger."""
    if size is None or size >= len(tasks):
        return list(tasks)
    picked = sorted(rng.sample(range(len(tasks)), size))
    return [tasks[index] for index in picked]


def _report(
    on_progress: ProgressCallback | None,
    round_index: int,
    rounds: int,
    phase: str,
    scored: Mapping[str, ScoredCandidate],
    usage: Usage,
    message: str,
) -> None:
    if on_progress is None:
        return
    best = max((candidate.val_score for candidate in scored.values()), default=0.0)
    on_progress(ProgressEvent("apo", round_index, rounds, phase, best, usage.rollouts, message))
