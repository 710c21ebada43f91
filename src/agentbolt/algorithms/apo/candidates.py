"""What APO and GEPA share: publishing a candidate as a resources version, asking the evaluator once per
(candidate, mode, task), and checking the prompts the optimizer LLM proposes.

Resources version of a candidate (:meth:`CandidatePublisher.publish`): the base resources (e.g. ``{"llm": LLM}``)
plus one :class:`~agentbolt.types.PromptTemplate` per prompt name, with metadata
``{"algorithm", "round", "origin", "parent_resources_ids", "prompt_names", **run_metadata}``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentbolt.store.base import LightningStore
from agentbolt.types import PromptTemplate, Resource, RolloutMode

from .types import Candidate, Evaluator, TaskInput, TaskResult, Usage, task_id_of

_NO_TAG = r"((?:(?!</?(?:current_|new_)?prompt>).)*)"  # text holding none of the prompt tags
_PROMPT_BLOCK_RE = re.compile(r"<(?:new_)?prompt>" + _NO_TAG + r"</(?:new_)?prompt>", re.DOTALL | re.IGNORECASE)
_OPEN_TAG_RE = re.compile(r"<(?:current_|new_)?prompt>", re.IGNORECASE)
_CURRENT_BLOCK_RE = re.compile(r"<current_prompt>(.*?)</current_prompt>", re.DOTALL | re.IGNORECASE)
_MIXED_BLOCK_RE = re.compile(
    r"<(?:current_|new_)?prompt>" + _NO_TAG + r"</(?:current_|new_)?prompt>", re.DOTALL | re.IGNORECASE
)
_FENCE_RE = re.compile(r"^```[A-Za-z]*\n(.*?)\n?```$", re.DOTALL)


@dataclass(frozen=True)
class ProgressEvent:
    """One step of an optimization, for progress bars and logs.

    Attributes:
        algorithm: ``"apo"`` or ``"gepa"``.
        round_index: the APO round or GEPA iteration (1-based; 0 for the seed's evaluation).
        rounds: the planned number of rounds or iterations.
        phase: what just finished: ``"seed"``, ``"round"`` (APO), ``"iteration"`` (GEPA).
        best_val_score: the best mean validation reward so far.
        rollouts: rollouts used so far.
        message: one line for a human (what was proposed, accepted or rejected).
    """

    algorithm: str
    round_index: int
    rounds: int
    phase: str
    best_val_score: float
    rollouts: int
    message: str = ""


ProgressCallback = Callable[[ProgressEvent], None]


class CandidatePublisher:
    """Writes each candidate as a new, immutable resources version and returns it as a :class:`Candidate`."""

    def __init__(
        self,
        store: LightningStore,
        *,
        algorithm: str,
        base_resources: Mapping[str, Resource] | None = None,
        run_metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.algorithm = algorithm
        self.base_resources = dict(base_resources or {})
        self.run_metadata = dict(run_metadata or {})

    async def publish(
        self,
        prompts: Mapping[str, str],
        *,
        origin: str,
        round_index: int,
        parent_ids: Sequence[str] = (),
        extra_metadata: Mapping[str, Any] | None = None,
    ) -> Candidate:
        """Add the resources version of ``prompts`` (see the module docstring) and return the candidate.

        Raises:
            ConfigError: a prompt name collides with a base resource name.
        """
        from agentbolt.errors import ConfigError

        clash = sorted(set(prompts) & set(self.base_resources))
        if clash:
            raise ConfigError(f"prompt name(s) {clash} are also base resource names; rename the prompt resources")
        resources: dict[str, Resource] = dict(self.base_resources)
        resources.update({name: PromptTemplate(template=text) for name, text in prompts.items()})
        metadata = {
            **self.run_metadata,
            "algorithm": self.algorithm,
            "round": round_index,
            "origin": origin,
            "parent_resources_ids": list(parent_ids),
            "prompt_names": sorted(prompts),
            **(extra_metadata or {}),
        }
        update = await self.store.add_resources(resources, metadata=metadata)
        return Candidate(
            candidate_id=update.resources_id,
            prompts=dict(prompts),
            parent_ids=tuple(parent_ids),
            origin=origin,
            round_index=round_index,
        )


class EvaluationBook:
    """Asks the evaluator for each (candidate, mode, task) once and remembers the result; counts rollouts."""

    def __init__(self, evaluator: Evaluator, usage: Usage) -> None:
        self.evaluator = evaluator
        self.usage = usage
        self._results: dict[tuple[str, str, str], TaskResult] = {}

    async def evaluate(self, candidate: Candidate, tasks: Sequence[TaskInput], mode: RolloutMode) -> list[TaskResult]:
        """Results of ``candidate`` on ``tasks`` in task order; only tasks not yet run in ``mode`` reach the
        evaluator.

        Raises:
            ValueError: the evaluator returned a different number of results, or other task ids, than asked.
        """
        ids = [task_id_of(task) for task in tasks]
        missing = [
            task
            for task, task_id in zip(tasks, ids, strict=True)
            if self._key(candidate, mode, task_id) not in self._results
        ]
        if missing:
            results = await self.evaluator(candidate, missing, mode=mode)
            asked = [task_id_of(task) for task in missing]
            got = [result.task_id for result in results]
            if got != asked:
                raise ValueError(
                    f"the evaluator must return one result per task in task order; asked for {asked}, got {got}"
                )
            self.usage.rollouts += len(results)
            for result in results:
                self._results[self._key(candidate, mode, result.task_id)] = result
        return [self._results[self._key(candidate, mode, task_id)] for task_id in ids]

    async def scores(self, candidate: Candidate, tasks: Sequence[TaskInput], mode: RolloutMode) -> dict[str, float]:
        """``task_id -> reward`` of ``candidate`` on ``tasks`` (see :meth:`evaluate`)."""
        return {result.task_id: result.reward for result in await self.evaluate(candidate, tasks, mode)}

    @staticmethod
    def _key(candidate: Candidate, mode: RolloutMode, task_id: str) -> tuple[str, str, str]:
        return (candidate.candidate_id, str(mode), task_id)


def extract_prompt(reply: str, *, allow_bare: bool, request: str | None = None) -> str | None:
    """The prompt text in an optimizer reply, stripped; ``None`` when there is none.

    ``request`` is the text the optimizer was sent. With it, two kinds of pasted-back text are known: a block of the
    reply that is also a block of the request outside its ``<current_prompt>`` (the template's own wording, "between
    <prompt> and </prompt>") is dropped before the rule below is applied; and a candidate whose text is the current
    prompt or the start of it (the request's ``<current_prompt>``, copied before the new text) is an echo, passed over
    for any later rule that finds new text. Both measured with Qwen2.5-Coder-1.5B, whose replies often open by copying
    the current prompt, then give the new one in a tag left open when ``max_tokens`` cuts it.

    Rule, first that applies with new text: the last complete ``<prompt>...</prompt>`` block (``<new_prompt>`` is
    accepted as well: small models rename the tag); the last block whose tags do not match
    (``<current_prompt>...</prompt>``: the model opened with the tag it was shown and closed with the one asked for);
    the text after the last unclosed ``<prompt>``, ``<new_prompt>`` or ``<current_prompt>`` (a reply cut by
    ``max_tokens``); the last ``<current_prompt>...</current_prompt>`` block (small models put their new text in the
    tag they were shown); with ``allow_bare`` (the edit template asks for the prompt only), the whole reply without a
    surrounding Markdown code fence. When every candidate is an echo, the first one is returned (and
    :func:`rejection_reason` refuses it as already tried). Text inside complete ``<current_prompt>`` blocks is never
    searched for the other tags, and a block never spans another prompt tag. An empty result is ``None``.

    Example:
        >>> extract_prompt("<current_prompt>old</current_prompt> <new_prompt>new</new_prompt>", allow_bare=False)
        'new'
    """
    current = [block.strip() for block in _CURRENT_BLOCK_RE.findall(request or "")]

    def is_echo(text: str) -> bool:
        return any(prompt.startswith(text.strip()) for prompt in current)

    echoed = _CURRENT_BLOCK_RE.findall(reply)
    rest = _CURRENT_BLOCK_RE.sub("", reply)
    if request is not None:
        asked = {block.strip() for block in _MIXED_BLOCK_RE.findall(_CURRENT_BLOCK_RE.sub("", request))}
        rest = _MIXED_BLOCK_RE.sub(lambda match: "" if match.group(1).strip() in asked else match.group(0), rest)
    candidates = [*reversed(_PROMPT_BLOCK_RE.findall(rest)), *reversed(_MIXED_BLOCK_RE.findall(rest))]
    # an unclosed tag counts once no complete block with new text is left (echoed blocks are cut out first)
    unechoed = _MIXED_BLOCK_RE.sub(lambda match: "" if is_echo(match.group(1)) else match.group(0), rest)
    opens = list(_OPEN_TAG_RE.finditer(unechoed))
    if opens and not _MIXED_BLOCK_RE.search(unechoed):
        candidates.append(unechoed[opens[-1].end() :])
    candidates.extend(reversed(echoed))
    if allow_bare and not candidates:
        candidates.append(reply)
    if not candidates:
        return None
    text = next((text for text in candidates if not is_echo(text)), candidates[0]).strip()
    fenced = _FENCE_RE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    return text or None


def template_fields(text: str) -> frozenset[str] | None:
    """The ``str.format`` field names of ``text`` (``"{date} at {time}"`` -> ``{"date", "time"}``), or ``None`` when
    ``PromptTemplate.format(**values)`` could not fill it: unbalanced braces, or a positional field (``{}``, ``{0}``).
    ``{a.b}`` and ``{a[0]}`` count as field ``a``."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return None
    names: set[str] = set()
    for _, field_name, _, _ in parsed:
        if field_name is None:
            continue
        base = re.split(r"[.\[]", field_name, maxsplit=1)[0]
        if not base or base.isdigit():
            return None
        names.add(base)
    return frozenset(names)


def placeholder_list(text: str) -> str:
    """The placeholders of ``text`` as written in a template (``"{date}, {time}"``), or ``"none"``."""
    fields = template_fields(text) or frozenset()
    return ", ".join("{" + name + "}" for name in sorted(fields)) if fields else "none"


def escape_new_fields(parent_text: str, new_text: str | None) -> str | None:
    """``new_text`` with every ``str.format`` field that ``parent_text`` lacks turned into literal text (``{options}``
    -> ``{{options}}``, which the agent's template renders as ``{options}``); ``None`` stays ``None``.

    Optimizer LLMs often invent placeholders (``{options}``, ``{equipment_availability}``) that the agent cannot
    fill; escaping keeps the rest of the edit usable instead of rejecting it. Text that ``str.format`` cannot parse
    (unbalanced braces) is returned unchanged, for :func:`rejection_reason` to refuse. Fields of the parent keep
    their conversion and format spec.

    Example:
        >>> escape_new_fields("At {time}.", "At {time}. Pick one of {options}.")
        'At {time}. Pick one of {{options}}.'
    """
    if new_text is None:
        return None
    allowed = template_fields(parent_text) or frozenset()
    try:
        parsed = list(string.Formatter().parse(new_text))
    except ValueError:
        return new_text
    out: list[str] = []
    for literal, field_name, format_spec, conversion in parsed:
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if field_name is None:
            continue
        field = field_name + (f"!{conversion}" if conversion else "") + (f":{format_spec}" if format_spec else "")
        base = re.split(r"[.\[]", field_name, maxsplit=1)[0]
        if base in allowed and not base.isdigit():
            out.append("{" + field + "}")
        else:
            out.append("{{" + field.replace("{", "{{").replace("}", "}}") + "}}")
    return "".join(out)


_SENTENCE_RE = re.compile(r"[^\n.!?]*[.!?]?")


def restore_dropped_fields(parent_text: str, new_text: str | None) -> str | None:
    """``new_text`` with the parent's sentences that hold placeholders ``new_text`` dropped appended as a last
    paragraph; ``None`` stays ``None``, and text that ``str.format`` cannot parse is returned unchanged.

    A placeholder carries a task's input (``{needs}``): a prompt without it cannot be right for every task, and
    optimizer LLMs often leave some out of a rewrite. Instead of losing the rewrite, the sentence of the parent that
    held the field (a sentence ends at ``.``, ``!``, ``?`` or a line break) comes back, in the parent's order.

    Example:
        >>> print(restore_dropped_fields("Meet at {time}. Bring {needs}.", "Be on time: {time}."))
        Be on time: {time}.
        <BLANKLINE>
        Bring {needs}.
    """
    if new_text is None:
        return None
    kept = template_fields(new_text)
    if kept is None:
        return new_text
    dropped = (template_fields(parent_text) or frozenset()) - kept
    if not dropped:
        return new_text
    sentences: list[str] = []
    for match in _SENTENCE_RE.finditer(parent_text):
        sentence = match.group(0).strip()
        fields = template_fields(sentence) if sentence else None
        if fields and fields & dropped:
            sentences.append(sentence)
            dropped = dropped - fields
    if dropped:  # a field the sentence split could not place (braces across sentences): name it plainly
        sentences.extend(f"{name}: {{{name}}}" for name in sorted(dropped))
    return new_text.rstrip() + "\n\n" + " ".join(sentences)


def repair_edit(parent_text: str, new_text: str | None) -> str | None:
    """An edit made usable where possible: invented placeholders escaped (:func:`escape_new_fields`), then dropped
    ones restored (:func:`restore_dropped_fields`). What is still unusable is left to :func:`rejection_reason`."""
    return restore_dropped_fields(parent_text, escape_new_fields(parent_text, new_text))


def rejection_reason(parent_text: str, new_text: str | None, seen_texts: Iterable[str]) -> str | None:
    """Why a proposed prompt is unusable, or ``None`` when it is usable.

    Rules: it must exist (non-empty), differ from every text already tried for that prompt name, and have exactly the
    parent's ``str.format`` fields (:func:`template_fields`), so the agent can still fill it.
    """
    if new_text is None:
        return "no prompt in the reply"
    if new_text in set(seen_texts):
        return "same as a prompt already tried"
    fields = template_fields(new_text)
    if fields is None:
        return "braces that str.format cannot fill"
    expected = template_fields(parent_text) or frozenset()
    if fields != expected:
        return f"placeholders changed from {sorted(expected)} to {sorted(fields)}"
    return None
