"""GEPA-style reflective Pareto optimizer over several named prompts at once.

Loop (Agrawal et al., 2025, arXiv:2507.19457, Algorithm 1):
    0. publish the seed and score it on every validation task;
    1. each iteration, while ``max_iterations`` and the rollout budget allow:
       a. *merge* (section 3.4), when the last iteration accepted a new candidate and merges are left: take two
          front members with a common ancestor, combine them prompt by prompt (:func:`.pareto.merge_prompts`),
          check the result on ``merge_subsample_size`` validation tasks against the better parent, and if it holds
          up, score it on the rest and add it to the pool; an attempted merge ends the iteration;
       b. otherwise *reflective mutation*: draw a parent from the Pareto front weighted by the tasks it wins
          (:func:`.pareto.select_for_mutation`), pick its next prompt name (round-robin per candidate), run it on a
          training minibatch, show the optimizer the traces with their feedback (the ``reflection_traces`` worst
          ones when set, and one line per task) and ask for a new text of that one prompt (when the reply holds no
          usable text, a second call gives its reasoning to the ``edit`` template, as APO does with a critique);
          the child is published, run on the same minibatch, and accepted only if its sum of rewards there beats
          the parent's; an accepted child is scored on every validation task.
    2. the pool used for selection and merging is the Pareto front of the accepted candidates
       (:func:`.pareto.pareto_front`); the answer is the accepted candidate with the best mean validation reward.

Every proposed candidate, accepted or not, is a resources version (so the minibatch rollouts of a rejected child are
traceable too); the result lists rejected ones with empty validation scores and ``accepted=False``.
"""

from __future__ import annotations

import itertools
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
from .config import GEPAConfig
from .optimizer_llm import OptimizerLLM
from .pareto import ancestors, merge_prompts, pareto_front, select_for_mutation
from .templates import TemplateSet, load_templates
from .types import (
    Candidate,
    Evaluator,
    OptimizationResult,
    ScoredCandidate,
    TaskInput,
    Usage,
    format_outcomes,
    format_trace,
    task_id_of,
)


async def optimize_gepa(
    config: GEPAConfig,
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
    """Run the reflective Pareto optimizer from ``seed_prompts``; arguments as in :func:`.beam.optimize_apo`.

    Raises:
        ConfigError: no training or validation tasks, no seed prompt, or a ``prompt_names`` entry that is not a seed
            prompt.
    """
    started = time.monotonic()
    if not seed_prompts:
        raise ConfigError("GEPA needs at least one seed prompt")
    if not train_tasks or not val_tasks:
        raise ConfigError(f"GEPA needs training and validation tasks; got {len(train_tasks)} and {len(val_tasks)}")
    names = list(config.prompt_names or seed_prompts)
    unknown = sorted(set(names) - set(seed_prompts))
    if unknown:
        raise ConfigError(f"prompt_names {unknown} are not seed prompts; have {sorted(seed_prompts)}")
    state = _State(
        config,
        names,
        train_tasks,
        val_tasks,
        store,
        evaluator,
        optimizer,
        base_resources,
        run_metadata,
        templates or load_templates(config.templates),
    )

    seed = await state.publisher.publish(seed_prompts, origin="seed", round_index=0)
    await state.accept(seed, await state.book.scores(seed, val_tasks, RolloutMode.VAL))
    state.report(on_progress, 0, "seed", f"seed {seed.candidate_id}")

    merge_due = False
    for iteration in range(1, config.max_iterations + 1):
        if config.max_rollouts is not None and state.usage.rollouts >= config.max_rollouts:
            break
        if merge_due and config.use_merge and state.merges < config.max_merges:
            merge_due = False
            message = await state.try_merge(iteration)
            if message is not None:
                state.report(on_progress, iteration, "iteration", message)
                continue
        accepted, message = await state.reflect(iteration)
        merge_due = merge_due or accepted
        state.report(on_progress, iteration, "iteration", message)

    state.usage.optimizer_calls, state.usage.cache_hits = optimizer.calls, optimizer.cache_hits
    state.usage.wall_s = time.monotonic() - started
    ordered = list(state.scored.values())
    accepted_list = [candidate for candidate in ordered if candidate.accepted]
    best = max(accepted_list, key=lambda candidate: candidate.val_score)  # the first of equal scores
    return OptimizationResult(
        algorithm="gepa", best=best, seed=state.scored[seed.candidate_id], candidates=ordered, usage=state.usage
    )


class _State:
    """The optimizer's bookkeeping: candidates, their validation scores, lineage and counters."""

    def __init__(
        self,
        config: GEPAConfig,
        names: list[str],
        train_tasks: Sequence[TaskInput],
        val_tasks: Sequence[TaskInput],
        store: LightningStore,
        evaluator: Evaluator,
        optimizer: OptimizerLLM,
        base_resources: Mapping[str, Resource] | None,
        run_metadata: Mapping[str, Any] | None,
        templates: TemplateSet,
    ) -> None:
        self.config = config
        self.names = names
        self.train_tasks = train_tasks
        self.val_tasks = val_tasks
        self.optimizer = optimizer
        self.rng = random.Random(config.seed)
        self.usage = Usage()
        self.book = EvaluationBook(evaluator, self.usage)
        self.publisher = CandidatePublisher(
            store, algorithm="gepa", base_resources=base_resources, run_metadata=run_metadata
        )
        self.templates = templates
        self.scored: dict[str, ScoredCandidate] = {}
        self.parents: dict[str, tuple[str, ...]] = {}
        self.next_name: dict[str, int] = {}
        self.tried: dict[str, set[str]] = {name: set() for name in names}
        self.tried_merges: set[tuple[str, str, str]] = set()
        self.merges = 0

    @property
    def front(self) -> dict[str, frozenset[str]]:
        """The Pareto front of the accepted candidates (the pool)."""
        return pareto_front({cid: c.val_scores for cid, c in self.scored.items() if c.accepted})

    async def accept(self, candidate: Candidate, val_scores: Mapping[str, float]) -> None:
        self.scored[candidate.candidate_id] = ScoredCandidate(candidate, dict(val_scores), accepted=True)
        self.parents[candidate.candidate_id] = candidate.parent_ids
        for name in self.names:
            self.tried[name].add(candidate.prompts[name])

    def reject(self, candidate: Candidate) -> None:
        self.scored[candidate.candidate_id] = ScoredCandidate(candidate, {}, accepted=False)
        self.parents[candidate.candidate_id] = candidate.parent_ids

    async def reflect(self, iteration: int) -> tuple[bool, str]:
        """One reflective mutation; returns (accepted, a line for the log)."""
        front = self.front
        parent = self.scored[select_for_mutation(front, self.rng)].candidate
        turn = self.next_name.get(parent.candidate_id, 0)
        self.next_name[parent.candidate_id] = turn + 1
        name = self.names[turn % len(self.names)]
        size = min(self.config.minibatch_size, len(self.train_tasks))
        batch = [self.train_tasks[i] for i in sorted(self.rng.sample(range(len(self.train_tasks)), size))]
        results = await self.book.evaluate(parent, batch, RolloutMode.TRAIN)
        if all(result.reward >= self.config.perfect_score for result in results):
            return False, f"{parent.candidate_id} is perfect on the minibatch; skipped"
        pairs = list(zip(batch, results, strict=True))
        if self.config.reflection_traces is not None:
            pairs = sorted(pairs, key=lambda pair: pair[1].reward)[: self.config.reflection_traces]
        traces = "\n\n".join(
            format_trace(task, result, max_chars=self.config.max_trace_chars) for task, result in pairs
        )
        current = parent.prompts[name]
        outcomes = format_outcomes(batch, results)
        request = self.templates.render(
            "reflect",
            prompt_name=name,
            prompt=current,
            traces=traces,
            outcomes=outcomes,
            placeholders=placeholder_list(current),
        )
        reply = await self.optimizer.complete(request, sample_index=iteration)
        new_text = repair_edit(current, extract_prompt(reply, allow_bare=False, request=request))
        reason = rejection_reason(current, new_text, self.tried[name])
        if reason is not None:
            # The reflection's reasoning stays useful when its new text is not (often the current text pasted back):
            # one more call turns it into a prompt with the edit template, as APO's critique is turned.
            rewrite = self.templates.render(
                "edit",
                prompt=current,
                critique=reply.strip(),
                traces=traces,
                outcomes=outcomes,
                placeholders=placeholder_list(current),
                variant="1",
                variants="1",
            )
            reply = await self.optimizer.complete(rewrite, sample_index=iteration)
            new_text = repair_edit(current, extract_prompt(reply, allow_bare=True, request=rewrite))
            reason = rejection_reason(current, new_text, self.tried[name])
        if reason is not None or new_text is None:
            self.usage.rejected_edits += 1
            return False, f"reflection on {parent.candidate_id}.{name} gave no usable prompt ({reason})"
        self.tried[name].add(new_text)
        child = await self.publisher.publish(
            {**parent.prompts, name: new_text},
            origin="reflect",
            round_index=iteration,
            parent_ids=(parent.candidate_id,),
            extra_metadata={"mutated_prompt": name},
        )
        child_results = await self.book.evaluate(child, batch, RolloutMode.TRAIN)
        parent_sum = sum(result.reward for result in results)
        child_sum = sum(result.reward for result in child_results)
        if child_sum <= parent_sum:
            self.reject(child)
            return False, f"{child.candidate_id} ({name}) {child_sum:.2f} <= parent {parent_sum:.2f} on the minibatch"
        await self.accept(child, await self.book.scores(child, self.val_tasks, RolloutMode.VAL))
        return True, f"{child.candidate_id} ({name}) accepted: val {self.scored[child.candidate_id].val_score:.3f}"

    async def try_merge(self, iteration: int) -> str | None:
        """One merge attempt; ``None`` when no pair of front members can be merged (the iteration then reflects)."""
        found = self._merge_candidates()
        if found is None:
            return None
        first, second, ancestor, prompts = found
        self.tried_merges.add((first.candidate_id, second.candidate_id, ancestor.candidate_id))
        merged = await self.publisher.publish(
            prompts,
            origin="merge",
            round_index=iteration,
            parent_ids=(first.candidate_id, second.candidate_id),
            extra_metadata={"ancestor_resources_id": ancestor.candidate_id},
        )
        size = min(self.config.merge_subsample_size, len(self.val_tasks))
        subsample = [self.val_tasks[i] for i in sorted(self.rng.sample(range(len(self.val_tasks)), size))]
        scores = await self.book.scores(merged, subsample, RolloutMode.VAL)
        sub_ids = [task_id_of(task) for task in subsample]
        bar = max(sum(self.scored[c.candidate_id].val_scores[t] for t in sub_ids) for c in (first, second))
        if sum(scores.values()) < bar:
            self.reject(merged)
            return f"merge {merged.candidate_id} of {first.candidate_id}+{second.candidate_id} below its parents"
        self.merges += 1
        await self.accept(merged, await self.book.scores(merged, self.val_tasks, RolloutMode.VAL))
        return f"merge {merged.candidate_id} accepted: val {self.scored[merged.candidate_id].val_score:.3f}"

    def _merge_candidates(self) -> tuple[Candidate, Candidate, Candidate, dict[str, str]] | None:
        """Two front members, a common ancestor and their merged prompts, not tried before and different from both
        (so each contributes a change); pairs are visited in a seeded random order, ancestors newest first."""
        front_ids = list(self.front)
        pairs = list(itertools.combinations(front_ids, 2))
        self.rng.shuffle(pairs)
        known = {tuple(sorted(c.candidate.prompts.items())) for c in self.scored.values()}
        for first_id, second_id in pairs:
            first_anc, second_anc = ancestors(first_id, self.parents), ancestors(second_id, self.parents)
            if first_id in second_anc or second_id in first_anc:
                continue
            first, second = self.scored[first_id], self.scored[second_id]
            if second.val_score > first.val_score:
                first, second = second, first
            creation = list(self.scored)
            for ancestor_id in sorted(first_anc & second_anc, key=creation.index, reverse=True):
                key = (first.candidate.candidate_id, second.candidate.candidate_id, ancestor_id)
                if key in self.tried_merges:
                    continue
                ancestor = self.scored[ancestor_id].candidate
                prompts = merge_prompts(
                    ancestor.prompts, first.candidate.prompts, second.candidate.prompts, prefer_first=True
                )
                if tuple(sorted(prompts.items())) in known:
                    continue
                return first.candidate, second.candidate, ancestor, prompts
        return None

    def report(self, on_progress: ProgressCallback | None, iteration: int, phase: str, message: str) -> None:
        if on_progress is None:
            return
        best = max((c.val_score for c in self.scored.values() if c.accepted), default=0.0)
        on_progress(
            ProgressEvent("gepa", iteration, self.config.max_iterations, phase, best, self.usage.rollouts, message)
        )
