"""What a training job prints when it ends: the validation table and totals (:func:`print_summary`), then the
files it wrote and the commands that use them (:func:`print_run_end`), or, when no step updated the weights, a
warning in place of those commands."""

from __future__ import annotations

import contextlib
import shlex
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentbolt.cli.command_name import agentbolt_command
from agentbolt.errors import ConfigError
from agentbolt.trainer.job_config import TrainConfig, load_tasks_module
from agentbolt.trainer.step_report import no_update_warning


def print_run_end(console: Console, config: TrainConfig, summary: dict[str, Any]) -> None:
    """The files and checkpoints the run wrote and the commands that use them; when no step updated the weights
    (:func:`~agentbolt.trainer.step_report.no_update_warning`), the warning instead of the commands (its checkpoints
    are the starting weights)."""
    warning = no_update_warning(summary["step_rows"], config.model)
    if warning is None:
        _print_next_steps(console, config, summary)
        return
    console.print(warning, style="bold yellow", markup=False, highlight=False)
    _print_written(console, config.out_dir, untrained=True)
    console.print(f"see the rewards with: {agentbolt_command()} rollouts --store {config.out_dir / 'store.db'}")


def _print_written(console: Console, out: Path, *, untrained: bool = False) -> list[Any]:
    """Print the files the job wrote (and its checkpoints, marked as the starting weights when ``untrained``);
    return the checkpoints found."""
    from agentbolt.trainer.checkpoint import list_checkpoints

    console.print(f"wrote {out / 'store.db'}, {out / 'summary.json'}, {out / 'reward_curve.png'}")
    found = list_checkpoints(out)
    if found:
        names = ", ".join(info.path.name for info in found)
        note = " (untrained: the weights the run started from)" if untrained else ""
        console.print(f"checkpoints: {names} (in {out / 'checkpoints'}){note}")
    return found


def _print_next_steps(console: Console, config: TrainConfig, summary: dict[str, Any]) -> None:
    """The files the job wrote and the commands that use them."""
    from agentbolt.trainer.checkpoint import best_checkpoint

    out = config.out_dir
    found = _print_written(console, out)
    if not found:
        return
    chosen = best_checkpoint(found) or found[-1]
    model = shlex.quote(config.model)
    console.print("next:")
    cli = agentbolt_command()
    checkpoint = shlex.quote(str(chosen.path))
    console.print(f"  {cli} serve --model {model} --adapter {checkpoint}   # serve it")
    split: str | None = None
    with contextlib.suppress(ConfigError):
        split = "test" if hasattr(load_tasks_module(config.tasks), "load_test_tasks") else "val"
    if split == "val" and not (summary.get("val_accuracy_before") or summary.get("val_accuracy_after")):
        split = None  # no validation set (val_size 0, or a tasks file without val_tasks): nothing for eval to score
    if split is not None:
        config_yaml = shlex.quote(str(chosen.path / "config.yaml"))
        here = shlex.quote(str(Path.cwd()))  # the agent (and a tasks module) import from the job's folder
        console.print(
            f"  cd {here} && {cli} eval {config_yaml} --checkpoint {checkpoint} --split {split}   # score it",
            markup=False,
            highlight=False,
        )
    console.print(f"  {cli} export-model {checkpoint} --out {shlex.quote(str(out / 'model'))}")
    console.print(f"  {cli} serve --store {shlex.quote(str(out / 'store.db'))}   # dashboard of this run")


def no_learning_warning(before: dict[str, float], after: dict[str, float], store: str) -> str | None:
    """A warning when validation accuracy did not rise: the mean over the sets scored both before and after
    (unit: fraction correct) is not higher after training; ``None`` when it rose, was already 1 (nothing left to
    gain), or a side is missing."""
    common = [name for name in before if name in after]
    if not common:
        return None
    mean_before = sum(before[name] for name in common) / len(common)
    mean_after = sum(after[name] for name in common) / len(common)
    if mean_after > mean_before or mean_before >= 1.0:
        return None
    return (
        f"warning: validation accuracy did not rise (mean over {len(common)} sets {mean_before:.1%} -> "
        f"{mean_after:.1%}): this run did not learn. Short GRPO runs vary from run to run; look at the last step's "
        f"rollouts ({agentbolt_command()} rollouts --store {store}, then inspect one) for what the policy settled "
        "on, and run again with another --seed, more steps or a reward that ranks that behaviour lower."
    )


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    """The validation accuracy table, the reward per step and totals, skipped updates and failed rollouts."""
    table = Table(title="validation accuracy")
    table.add_column("set")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    before, after = summary["val_accuracy_before"], summary["val_accuracy_after"]
    for name in dict.fromkeys([*before, *after]):
        table.add_row(
            name,
            f"{before[name]:.1%}" if name in before else "-",
            f"{after[name]:.1%}" if name in after else "-",
        )
    if before or after:
        console.print(table)
    warning = no_learning_warning(before, after, summary.get("store", "OUT/store.db"))
    if warning is not None:
        console.print(warning, style="bold yellow", markup=False, highlight=False)
    console.print(
        f"train reward per step: {[None if r is None else round(r, 3) for r in summary['train_reward']]}  "
        f"rollouts in the store: {summary['n_rollouts']}  "  # a resumed run's store holds the stopped run's too
        f"transitions: {summary['n_transitions']}  "
        f"wall: {summary['wall_seconds']:.0f}s"
        + (
            f" ({summary['wall_seconds_total']:.0f}s with the run it resumed)"
            if summary.get("resumed_from_step") is not None
            else ""
        )
    )
    skipped = summary.get("updates_skipped") or {}
    if skipped and summary.get("updates_applied"):  # (none applied: the job's closing warning says so)
        listed = ", ".join(f"{kind} x{n}" for kind, n in skipped.items())
        console.print(
            f"updates: {summary['updates_applied']} of {len(summary['step_rows'])} steps moved the weights "
            f"(skipped: {listed})",
            markup=False,
            highlight=False,
        )
    causes = summary.get("failure_causes") or {}
    if causes:  # the rollouts that gave nothing to train on, over the run, by cause (the step lines have them too)
        listed = ", ".join(f"{cause} {n}" for cause, n in causes.items())
        console.print(
            f"not trained: {sum(causes.values())} rollouts ({listed}); list them with "
            f"{agentbolt_command()} rollouts --store {summary.get('store', 'OUT/store.db')} --status failed",
            markup=False,
            highlight=False,
        )
