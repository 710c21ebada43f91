"""Tasks of the calc agent: the training set, the held-out validation sets, and the correctness checker.

Every task is a :class:`Task` dict ``{"task_id", "question", "answer", "source"}``; ``answer`` is the gold as text
(``"42"``, ``"2/3"``, ``"3244047.1"``, or a choice letter such as ``"C"``).

Sets (``source`` names):
    * ``rg_basic_arithmetic`` and ``rg_chain_sum``: reasoning-gym 0.1.25 generators at their default difficulty
      (basic_arithmetic: 2-6 terms of 1-4 digits with parentheses and negation; chain_sum: 2-6 terms of 1-4 digits).
      Training uses ``TRAIN_SEED`` and mixes the two (alternating); validation uses ``VAL_SEED``.
    * ``calc_x``: 10 word problems from Calc-X (``data/calc_x_sample.jsonl``, fields ``question``/``result``); two
      golds are multiple-choice letters.
    * ``gsm_hard``: 64 GSM-Hard problems (``data/gsm_hard.jsonl``, fields ``input``/``target``), GSM8K with large
      numbers.

Data hygiene, applied to every reasoning-gym item:
    * basic_arithmetic computes its gold with floor division, so about 1% of its golds are not the true value of the
      expression (``-1 / 27`` has gold ``-1``). Items whose gold differs from the exact value computed by
      :func:`calculator.evaluate` are dropped, so the calculator and the gold always agree.
    * training never contains a question of any validation pool (whatever ``n_per_set`` is later used), nor the same
      question twice. reasoning-gym seeds item ``i`` with ``seed + i``, so seeds 42 and 1234 overlap from index 1192
      on; the deduplication is what keeps the sets disjoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import TypedDict

from .calculator import CalculatorError, evaluate

TRAIN_SEED = 42
VAL_SEED = 1234
VAL_POOL_SIZE = 200
"""Validation items per reasoning-gym set; :func:`load_val_sets` takes the first ``n_per_set`` of this pool."""
RG_GENERATORS = ("basic_arithmetic", "chain_sum")
VAL_SET_NAMES = ("rg_basic_arithmetic", "rg_chain_sum", "calc_x", "gsm_hard")
DATA_DIR = Path(__file__).resolve().parent / "data"
REL_TOLERANCE = 1e-4

_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUMBER_RE = re.compile(
    rf"(?<![\d.])(?P<sign>[-+\u2212]?)(?P<num>{_NUM})(?:[eE](?P<exp>[-+]?\d+))?"
    rf"(?:\s*/\s*(?P<den>{_NUM}))?"
)
_LETTER_GOLD_RE = re.compile(r"[A-Z]")


class Task(TypedDict):
    """One task of the calc agent."""

    task_id: str
    """Unique across all sets, e.g. ``rg_chain_sum-seed42-17``, ``calc_x-ape210k__00384263``, ``gsm_hard-3``."""
    question: str
    """The text given to the model as the user message."""
    answer: str
    """The gold answer as text: a number, a fraction ``a/b``, or a choice letter."""
    source: str
    """The set it comes from: one of ``VAL_SET_NAMES`` (training tasks use the reasoning-gym names)."""


def load_train_tasks(size: int = 512, seed: int = TRAIN_SEED, val_seed: int = VAL_SEED) -> list[Task]:
    """Return ``size`` training tasks, alternating reasoning-gym basic_arithmetic and chain_sum.

    Deterministic in ``(size, seed, val_seed)``; a smaller ``size`` gives a prefix of a larger one. Questions of the
    validation pools built with ``val_seed`` (and repeated questions) are skipped, so train and val are disjoint.

    Raises:
        ValueError: ``size`` is negative.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    excluded = {_question_key(task["question"]) for tasks in _val_pools(val_seed).values() for task in tasks}
    streams = [_rg_stream(name, seed) for name in RG_GENERATORS]
    tasks: list[Task] = []
    while len(tasks) < size:
        for stream in streams:
            for task in stream:
                key = _question_key(task["question"])
                if key not in excluded:
                    excluded.add(key)
                    tasks.append(task)
                    break
            if len(tasks) >= size:
                break
    return tasks


def load_val_sets(n_per_set: int | None = None, seed: int = VAL_SEED) -> dict[str, list[Task]]:
    """Return the held-out validation sets, keyed by ``VAL_SET_NAMES``, each cut to its first ``n_per_set`` tasks.

    ``None`` returns everything: ``VAL_POOL_SIZE`` tasks for each reasoning-gym set, 10 for calc_x, 64 for gsm_hard.

    Raises:
        ValueError: ``n_per_set`` is negative.
    """
    if n_per_set is not None and n_per_set < 0:
        raise ValueError(f"n_per_set must be >= 0 or None, got {n_per_set}")
    pools = _val_pools(seed)
    return {name: tasks[:n_per_set] if n_per_set is not None else tasks for name, tasks in pools.items()}


def load_calc_x() -> list[Task]:
    """The Calc-X sample (``data/calc_x_sample.jsonl``): ``question`` -> question, ``result`` -> answer."""
    return [
        Task(
            task_id=f"calc_x-{row['id']}", question=row["question"], answer=str(row["result"]).strip(), source="calc_x"
        )
        for row in _read_jsonl(DATA_DIR / "calc_x_sample.jsonl")
    ]


def load_gsm_hard() -> list[Task]:
    """GSM-Hard (``data/gsm_hard.jsonl``): ``input`` -> question, ``target`` (a float) -> canonical answer text."""
    return [
        Task(
            task_id=f"gsm_hard-{index}",
            question=row["input"],
            answer=_float_text(float(row["target"])),
            source="gsm_hard",
        )
        for index, row in enumerate(_read_jsonl(DATA_DIR / "gsm_hard.jsonl"))
    ]


def first_number(text: str | None) -> str | None:
    """The first number or fraction in ``text`` (``"-1,234.5"``, ``"2/3"``, ``"1e3"``), as written; else ``None``."""
    if not text:
        return None
    match = _NUMBER_RE.search(text)
    return match.group(0) if match else None


def parse_number(text: str | None) -> Fraction | None:
    """The exact value of the first number or fraction in ``text`` (commas dropped, ``a/b`` divided), else ``None``.

    Example:
        >>> parse_number("about $1,234.50 total")
        Fraction(2469, 2)
        >>> parse_number("2/3")
        Fraction(2, 3)
    """
    if not text:
        return None
    match = _NUMBER_RE.search(text)
    if match is None:
        return None
    value = Fraction(match.group("num").replace(",", ""))
    if match.group("exp"):
        exponent = int(match.group("exp"))
        if abs(exponent) > 400:
            return None
        value *= Fraction(10) ** exponent
    if match.group("den"):
        denominator = Fraction(match.group("den").replace(",", ""))
        if denominator == 0:
            return None
        value /= denominator
    return -value if match.group("sign") in ("-", "\u2212") else value


def is_correct(pred: str | None, task: Task) -> bool:
    """Whether the predicted answer ``pred`` matches the gold of ``task``.

    ``pred`` is the text of the answer (a bare number, or the whole text after ``Answer:``).
        * Letter golds (``"C"``): ``pred`` must start with that letter, optionally in parentheses, not followed by
          another letter or digit (``"C"``, ``"C) 6"``, ``"(C)"`` count; ``"6"`` and ``"Choice C"`` do not).
        * Numeric golds: the first number or fraction of ``pred`` is compared as a number. An integer gold must be
          matched exactly (``"12.0"`` matches ``"12"``); any other gold within a relative error of
          ``REL_TOLERANCE`` (so ``"0.6667"`` matches ``"2/3"``, ``"0.667"`` does not).
    """
    if pred is None:
        return False
    gold = task["answer"].strip()
    if _LETTER_GOLD_RE.fullmatch(gold):
        return re.match(rf"\(?{gold}(?![A-Za-z0-9])", pred.strip()) is not None
    gold_value = parse_number(gold)
    if gold_value is None:
        return pred.strip().lower() == gold.lower()
    value = parse_number(pred)
    if value is None:
        return False
    if gold_value.denominator == 1:
        return value == gold_value
    return abs(value - gold_value) <= REL_TOLERANCE * abs(gold_value)


def _val_pools(seed: int) -> dict[str, list[Task]]:
    pools: dict[str, list[Task]] = {}
    for name in RG_GENERATORS:
        seen: set[str] = set()
        pool: list[Task] = []
        for task in _rg_stream(name, seed):
            key = _question_key(task["question"])
            if key not in seen:
                seen.add(key)
                pool.append(task)
            if len(pool) == VAL_POOL_SIZE:
                break
        pools[f"rg_{name}"] = pool
    pools["calc_x"] = load_calc_x()
    pools["gsm_hard"] = load_gsm_hard()
    return pools


def _rg_stream(name: str, seed: int) -> Iterator[Task]:
    """Tasks of one reasoning-gym generator at its default config, by index, skipping items with a wrong gold."""
    import reasoning_gym  # lazy: importing it takes about a second

    dataset = reasoning_gym.create_dataset(name, seed=seed, size=1_000_000)
    for index in range(len(dataset)):
        item = dataset[index]
        try:
            exact = evaluate(item["metadata"]["expression"])
        except CalculatorError:
            continue
        if Fraction(exact) != Fraction(item["answer"]):
            continue
        yield Task(
            task_id=f"rg_{name}-seed{seed}-{index}",
            question=item["question"],
            answer=str(item["answer"]),
            source=f"rg_{name}",
        )


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _float_text(value: float) -> str:
    """``3431580.0`` -> ``"3431580"``; ``3244047.0999999996`` -> ``"3244047.1"`` (15 significant digits)."""
    if value.is_integer():
        return str(int(value))
    return f"{value:.15g}"


def _question_key(question: str) -> str:
    return " ".join(question.split()).lower()
