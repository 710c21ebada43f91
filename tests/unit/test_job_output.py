"""The closing warning of a training run whose validation accuracy did not rise."""

from __future__ import annotations

from agentbolt.trainer.job_output import no_learning_warning


def test_no_learning_warning_compares_the_mean_over_the_sets_scored_both_times() -> None:
    before = {"basic": 0.125, "chain": 0.0, "gsm": 0.0}
    # mean 0.125 / 3 -> 0.0: fell
    fell = no_learning_warning(before, {"basic": 0.0, "chain": 0.0, "gsm": 0.0}, "runs/demo/store.db")
    assert fell is not None and "did not rise (mean over 3 sets 4.2% -> 0.0%)" in fell
    assert "rollouts --store runs/demo/store.db" in fell and "--seed" in fell
    # unchanged is not learning either
    assert no_learning_warning({"a": 0.5}, {"a": 0.5}, "s.db") is not None
    # already perfect before: nothing to rise to, no warning
    assert no_learning_warning({"a": 1.0}, {"a": 1.0}, "s.db") is None
    # rose: no warning; a set scored only after (or only before) is left out of the comparison
    assert no_learning_warning(before, {"basic": 0.75, "chain": 1.0, "gsm": 0.125}, "s.db") is None
    assert no_learning_warning({"a": 0.5}, {"a": 0.625, "b": 0.0}, "s.db") is None
    assert no_learning_warning({}, {"a": 1.0}, "s.db") is None
    assert no_learning_warning({"a": 0.0}, {}, "s.db") is None
