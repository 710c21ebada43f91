"""Pure functions of the reflective Pareto optimizer (GEPA; Agrawal et al., 2025, arXiv:2507.19457).

No I/O here: scores, ancestry and prompts come in as plain mappings and the results go out as new ones.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

ScoresByTask = Mapping[str, float]
"""task_id -> reward of one candidate."""


def pareto_front(scores_C: Mapping[str, ScoresByTask]) -> dict[str, frozenset[str]]:
    """The candidates that are best on at least one task, each with the tasks it is best on.

    Rule (GEPA, section 3.3 and Algorithm 2, "Pareto-based candidate selection"): for each task ``t``, the winners
    are every candidate whose score on ``t`` equals the highest score any candidate has on ``t`` (ties included: all
    candidates that tie at the top win ``t``). A candidate stays on the front while it wins at least one task. Only
    candidates with a score for ``t`` compete on ``t``.

    Consequences: a task on which all candidates tie (all 0.0, say) keeps every candidate on the front; a candidate
    with the best mean may still be off the front (A = (1, 0), B = (0, 1), C = (0.9, 0.9)), so callers pick the
    final answer by mean score, not from the front alone.

    Args:
        scores_C: candidate_id -> (task_id -> reward), in candidate creation order.

    Returns:
        candidate_id -> the tasks it wins, for the candidates on the front, in the input order.

    Example:
        >>> scores = {"a": {"t1": 1.0, "t2": 0.0}, "b": {"t1": 1.0, "t2": 0.5}, "c": {"t1": 0.0, "t2": 0.5}}
        >>> front = pareto_front(scores)
        >>> {candidate_id: sorted(won) for candidate_id, won in front.items()}
        {'a': ['t1'], 'b': ['t1', 't2'], 'c': ['t2']}
    """
    best_T: dict[str, float] = {}
    for scores in scores_C.values():
        for task_id, score in scores.items():
            if task_id not in best_T or score > best_T[task_id]:
                best_T[task_id] = score
    front: dict[str, frozenset[str]] = {}
    for candidate_id, scores in scores_C.items():
        won = frozenset(task_id for task_id, score in scores.items() if score == best_T[task_id])
        if won:
            front[candidate_id] = won
    return front


def select_for_mutation(front: Mapping[str, frozenset[str]], rng: random.Random) -> str:
    """Draw one candidate of the front, with probability proportional to how many tasks it wins (GEPA, Algorithm 2:
    candidates that are best on more tasks are picked more often; every front member keeps a chance).

    Raises:
        ValueError: the front is empty.
    """
    if not front:
        raise ValueError("cannot select from an empty Pareto front")
    candidate_ids = list(front)
    weights = [len(front[candidate_id]) for candidate_id in candidate_ids]
    return rng.choices(candidate_ids, weights=weights, k=1)[0]


def ancestors(candidate_id: str, parents: Mapping[str, Sequence[str]]) -> set[str]:
    """Every candidate reachable through ``parents`` (candidate_id -> its parent ids), ``candidate_id`` excluded."""
    seen: set[str] = set()
    stack = list(parents.get(candidate_id, ()))
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(parents.get(current, ()))
    return seen


def merge_prompts(
    ancestor: Mapping[str, str], first: Mapping[str, str], second: Mapping[str, str], *, prefer_first: bool
) -> dict[str, str]:
    """Combine two descendants of ``ancestor`` prompt by prompt (GEPA, section 3.4, "System Aware Merge").

    For each prompt name: if only one descendant changed it from the ancestor, take that one's text; if both kept it,
    keep it; if both changed it (differently), take ``first``'s when ``prefer_first`` (the caller passes the
    better-scoring descendant first) else ``second``'s.

    Example:
        >>> merge_prompts({"a": "A0", "b": "B0"}, {"a": "A1", "b": "B0"}, {"a": "A0", "b": "B2"}, prefer_first=True)
        {'a': 'A1', 'b': 'B2'}
    """
    merged: dict[str, str] = {}
    for name, base in ancestor.items():
        one, two = first.get(name, base), second.get(name, base)
        if one == two:
            merged[name] = one
        elif one == base:
            merged[name] = two
        elif two == base:
            merged[name] = one
        else:
            merged[name] = one if prefer_first else two
    return merged
