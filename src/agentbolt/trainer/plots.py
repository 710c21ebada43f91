"""Figures of training runs (matplotlib, Agg backend): one run's reward curve and validation bars, several runs'
curves side by side (``agentbolt plot``)."""

from __future__ import annotations

import math
from pathlib import Path

from agentbolt.errors import ConfigError


def plot_reward_curves(
    path: Path, runs: dict[str, list[float | None]], *, title: str = "train reward per step"
) -> None:
    """Write one figure with a train-reward curve per run (e.g. one run per advantage estimator).

    Args:
        path: the PNG to write.
        runs: ``label -> mean train reward of each step`` (step 1 first; ``None`` for a step with no scored
            rollout: a gap in the curve).
        title: the figure's title.

    Raises:
        ConfigError: ``runs`` is empty.
    """
    if not runs:
        raise ConfigError("no runs to plot; give at least one summary.json")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rewards in runs.items():
        ax.plot(list(range(1, len(rewards) + 1)), _gaps(rewards), marker="o", label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_xlabel("train step")
    ax.set_ylabel("mean train reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_reward_curve(
    path: Path, train_reward: list[float | None], val_before: dict[str, float], val_after: dict[str, float]
) -> None:
    """Write the demo's figure: train reward per step (left), validation accuracy before/after per set (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    steps = list(range(1, len(train_reward) + 1))
    ax1.plot(steps, _gaps(train_reward), marker="o")
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_xlabel("train step")
    ax1.set_ylabel("mean train reward (shaped)")
    ax1.set_title("train reward")
    ax1.grid(alpha=0.3)
    names = list(dict.fromkeys([*val_before, *val_after]))
    xs = range(len(names))
    width = 0.38
    for offset, label, values in ((-width / 2, "before", val_before), (width / 2, "after", val_after)):
        # each bar carries its value, so a 0% bar (no height) still reads "0%"; a set not scored reads "n/a"
        heights = [values.get(n, math.nan) for n in names]
        bars = ax2.bar([x + offset for x in xs], heights, width, label=label)
        texts = ["" if math.isnan(h) else f"{h:.1%}".replace(".0%", "%") for h in heights]  # 12.5%, 0%
        ax2.bar_label(bars, labels=texts, padding=2, fontsize=8)
        for x, h in zip(xs, heights, strict=True):
            if math.isnan(h):
                ax2.text(x + offset, 0.01, "n/a", ha="center", va="bottom", fontsize=8, color="gray")
    ax2.set_xticks(list(xs), names, rotation=15)
    ax2.set_xlim(-0.6, len(names) - 0.4)  # a set scored only before or after keeps its slot
    ax2.set_ylim(0, 1.25)  # room above 100% for the labels and the legend
    ax2.set_ylabel("accuracy")
    ax2.set_title("validation accuracy")
    ax2.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax2.legend(loc="upper right", ncols=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gaps(values: list[float | None]) -> list[float]:
    """``values`` with ``None`` as NaN (matplotlib leaves a gap there)."""
    return [math.nan if v is None else float(v) for v in values]
