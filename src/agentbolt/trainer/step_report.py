"""What a training job says about each step and about its failures: the step line, why an update was skipped, the
failure causes counted over the run, and the rule that stops a job that has nothing to train on.

Causes are those of :mod:`agentbolt.adapter.causes`. A job stops (``grpo.fail_after`` consecutive steps without a
trainable trajectory) with :class:`NothingToTrain`, whose message is a one-screen summary of the causes, each with
one example and what to do; the job's ``summary.json`` keeps the same counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentbolt.adapter.causes import HINTS
from agentbolt.cli.command_name import agentbolt_command
from agentbolt.errors import AgentboltError
from agentbolt.trainer.loop import StepResult


class NothingToTrain(AgentboltError):
    """The job stopped: ``fail_after`` consecutive steps gave no trainable trajectory. Exit code 1."""

    exit_code = 1


SKIP_NO_SAMPLES = "no samples to train on"
SKIP_ZERO_ADVANTAGE = "every advantage is 0"
SKIP_NO_LOSS_TOKENS = "no sample has a trained token"
SKIP_NONFINITE_GRADIENT = "the gradient norm was not finite"
SKIP_NO_STEP = "the trainer took no step"
SKIP_KINDS = (SKIP_NO_SAMPLES, SKIP_ZERO_ADVANTAGE, SKIP_NO_LOSS_TOKENS, SKIP_NONFINITE_GRADIENT, SKIP_NO_STEP)
"""The kinds of skipped update: each :func:`skipped_update_reason` text starts with one (its details follow)."""


def skipped_update_reason(result: StepResult) -> str | None:
    """Why the step's update did not move the policy, or ``None`` when it did (read from the trainer's stats): one of
    :data:`SKIP_KINDS`, with the counts after it.

    The torch trainer reports ``stepped`` (0.0 or 1.0), ``n_skipped_zero_advantage``, ``n_skipped_no_loss_tokens``
    and ``grad_norm`` (:meth:`agentbolt.algorithms.rl.torch_backend.TorchTrainerBackend.train_step`).
    """
    stats = result.update_stats
    if result.n_samples == 0:
        return SKIP_NO_SAMPLES
    if stats.get("stepped", 1.0) != 0.0:
        return None
    zero = int(stats.get("n_skipped_zero_advantage", 0))
    empty = int(stats.get("n_skipped_no_loss_tokens", 0))
    if zero and zero + empty >= result.n_samples:
        return f"{SKIP_ZERO_ADVANTAGE} ({zero} samples: each group's rollouts had the same reward)"
    if empty and zero + empty >= result.n_samples:
        return f"{SKIP_NO_LOSS_TOKENS} ({empty} samples; e.g. every response masked as truncated)"
    grad = stats.get("grad_norm", math.nan)
    if not math.isfinite(grad):
        return f"{SKIP_NONFINITE_GRADIENT}; the gradient was dropped"
    return SKIP_NO_STEP


UPDATE_SKIP_HINTS: dict[str, str] = {
    SKIP_ZERO_ADVANTAGE: (
        "the rollouts of each task all got the same reward, so GRPO has nothing to prefer: make rewards differ "
        "within a group (more rollouts per task with grpo.group_size, a higher grpo.temperature, tasks nearer the "
        "model's level, or a graded reward instead of 0/1)"
    ),
    SKIP_NO_LOSS_TOKENS: (
        "every answer was left out of the loss (e.g. cut at grpo.max_tokens with grpo.truncated=mask): raise "
        "grpo.max_tokens or set grpo.truncated=keep"
    ),
    SKIP_NONFINITE_GRADIENT: "lower learning_rate, and check that every reward is a finite number",
    SKIP_NO_SAMPLES: "no rollout gave a trainable call: see the failure causes above",
}
"""What to do about each kind of skipped update (:data:`SKIP_KINDS`)."""


def update_counts(rows: list[dict[str, Any]]) -> tuple[int, dict[str, int]]:
    """From the summary's step rows (``update_skipped``: :func:`skipped_update_reason` or ``None``): the number of
    steps whose update moved the weights, and the skipped ones per kind (:data:`SKIP_KINDS`; a text that starts
    with none of them, e.g. from another version, counts under itself)."""
    applied = 0
    skipped: dict[str, int] = {}
    for row in rows:
        reason = row.get("update_skipped")
        if reason is None:
            applied += 1
            continue
        kind = next((k for k in SKIP_KINDS if str(reason).startswith(k)), str(reason))
        skipped[kind] = skipped.get(kind, 0) + 1
    return applied, skipped


def no_update_warning(rows: list[dict[str, Any]], model: str) -> str | None:
    """The end-of-run warning when no step of the run (every segment of a resumed one) updated the weights, else
    ``None``: its checkpoints then hold the weights the run started from, which serving or exporting would not
    tell apart from a trained model."""
    applied, skipped = update_counts(rows)
    if applied or not rows:
        return None
    listed = ", ".join(f"{kind} x{n}" for kind, n in sorted(skipped.items(), key=lambda kv: -kv[1]))
    lines = [
        f"warning: no step updated the weights ({len(rows)} steps, every update skipped: {listed}). The checkpoints "
        f"hold the weights this run started from ({model}, untrained): serving or exporting them gives the base "
        "model back."
    ]
    lines += [f"  -> {UPDATE_SKIP_HINTS[kind]}" for kind in skipped if kind in UPDATE_SKIP_HINTS]
    return "\n".join(lines)


def step_line(result: StepResult) -> str:
    """The one line a job prints after each step: reward, time, what was trained, what failed and why."""
    reward = f"{result.reward_mean:.3f}±{result.reward_std:.3f}" if result.rewards else "n/a (no rollout scored)"
    parts = [
        f"step {result.train_step}: reward {reward}",
        f"waited {result.wait_s:.0f}s",
        f"update {result.update_s:.0f}s",
        f"transitions {result.n_transitions}",
    ]
    failed = result.n_failed + result.n_infra_failed
    if failed:
        causes = ", ".join(f"{cause} {n}" for cause, n in sorted(result.causes.items(), key=lambda kv: -kv[1]))
        parts.append(f"failed {failed}/{result.n_rollouts} ({causes})" if causes else f"failed {failed}")
    else:
        parts.append("failed 0")
    if result.n_truncated:
        parts.append(f"truncated {result.n_truncated}/{result.n_calls} calls at max_tokens")
    if result.untrainable_calls:
        n = sum(result.untrainable_calls.values())
        reason, _ = max(result.untrainable_calls.items(), key=lambda kv: kv[1])
        parts.append(f"untrainable calls {n} (left out; e.g. {reason})")
    if result.staleness is not None:
        parts.append(f"staleness {result.staleness.mean_staleness:.2f} dropped {result.staleness.n_dropped}")
    skipped = skipped_update_reason(result)
    if skipped is not None:
        parts.append(f"update skipped: {skipped}")
    return "  ".join(parts)


@dataclass
class FailureWatch:
    """Counts failure causes over a run and trips after ``fail_after`` consecutive steps without a trainable
    trajectory (``fail_after`` 0: never).

    Attributes:
        fail_after: the limit (``grpo.fail_after``).
        causes / details: rollouts per cause over the run, and the first detail seen per cause.
        n_truncated / n_calls: trained calls cut at ``max_tokens``, and all trained calls, over the run.
        empty_streak: consecutive steps, up to the last one seen, without a trainable trajectory.
        steps_seen: steps counted (this process's).
        unscoped_calls: reads how many LLM calls have reached the server's plain ``/v1`` LLM routes so far
            (recorded nowhere: an agent that ignored ``llm.endpoint``); ``None`` when the server is not in reach.
        unscoped_total / unscoped_last_step: such calls over the run, and during the last step seen.
    """

    fail_after: int
    causes: dict[str, int] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    n_truncated: int = 0
    n_calls: int = 0
    n_rollouts: int = 0
    empty_streak: int = 0
    steps_seen: int = 0
    unscoped_calls: Callable[[], int] | None = None
    unscoped_total: int = 0
    unscoped_last_step: int = 0

    def add(self, result: StepResult) -> None:
        """Count one step's figures (and the unscoped calls made since the previous step)."""
        if self.unscoped_calls is not None:
            now = self.unscoped_calls()
            self.unscoped_last_step = now - self.unscoped_total
            self.unscoped_total = now
        for cause, n in result.causes.items():
            self.causes[cause] = self.causes.get(cause, 0) + n
        for cause, detail in result.cause_details.items():
            self.details.setdefault(cause, detail)
        self.n_truncated += result.n_truncated
        self.n_calls += result.n_calls
        self.n_rollouts += result.n_rollouts
        self.empty_streak = self.empty_streak + 1 if result.n_transitions == 0 else 0
        self.steps_seen += 1

    @property
    def tripped(self) -> bool:
        """True once ``fail_after`` consecutive steps had no trainable trajectory."""
        return self.fail_after > 0 and self.empty_streak >= self.fail_after

    @property
    def nothing_trained(self) -> bool:
        """True when every step seen had no trainable trajectory (a run shorter than ``fail_after`` steps that
        trained nothing ends as a tripped one does; ``fail_after`` 0 turns this off too)."""
        return self.fail_after > 0 and self.steps_seen > 0 and self.empty_streak == self.steps_seen

    @property
    def failed(self) -> bool:
        """:attr:`tripped`, or the run ended with :attr:`nothing_trained`."""
        return self.tripped or self.nothing_trained

    def to_summary(self) -> dict[str, Any]:
        """The run's failure figures, for ``summary.json``."""
        return {
            "failure_causes": dict(sorted(self.causes.items(), key=lambda kv: -kv[1])),
            "failure_examples": dict(self.details),
            "truncated_calls": self.n_truncated,
            "trained_calls": self.n_calls,
            "stopped_for_failures": self.failed,
            "unscoped_gateway_calls": self.unscoped_total,
        }

    def unscoped_line(self) -> str | None:
        """A warning line when LLM calls reached the server's root during the last step, else ``None``."""
        if not self.unscoped_last_step:
            return None
        return (
            f"  {self.unscoped_last_step} LLM calls reached the server's plain /v1 routes (no rollout in the "
            "URL): they are recorded nowhere and train nothing; the agent's client must use base_url=llm.endpoint"
        )

    def report(self, store: str = "sqlite:///OUT/store.db") -> str:
        """A one-screen summary of the causes: count, an example and what to do, most frequent first; ``store``
        is named in the closing ``agentbolt rollouts`` command."""
        if self.tripped:
            streak, limit = self.empty_streak, self.fail_after
            head = f"no trainable trajectory in {streak} consecutive steps (grpo.fail_after={limit})"
        else:
            head = f"no trainable trajectory in any of the {self.steps_seen} steps run: nothing was trained"
        lines = [f"{head}; the job stopped. Causes over {self.n_rollouts} rollouts:"]
        for cause, n in sorted(self.causes.items(), key=lambda kv: -kv[1])[:8]:
            detail = self.details.get(cause, "")
            lines.append(f"  {cause} x{n}" + (f": {detail[:300]}" if detail else ""))
            hint = HINTS.get(cause)
            if hint and hint not in detail:
                lines.append(f"      -> {hint}")
        if self.unscoped_total:
            lines.append(f"  {self.unscoped_total} LLM calls reached the server's root instead of llm.endpoint")
        if not self.causes:
            lines.append("  (no rollout failed: every rollout was left out by agent_match or had no trainable call)")
        lines.append(f"see them with: {agentbolt_command()} rollouts --store {store}")
        if self.nothing_trained:
            lines.append(
                "no checkpoint was written by this run (nothing was trained): fix the cause, then run again with "
                "--overwrite (or --resume, to go on from an earlier run's checkpoint)"
            )
        return "\n".join(lines)
