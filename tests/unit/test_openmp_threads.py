"""release_openmp_threads ends the calling thread's libgomp workers (real torch, real threads, /proc thread count)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from agentbolt.inference.openmp_threads import _loaded_libgomp, release_openmp_threads, run_then_release

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or _loaded_libgomp() is None, reason="torch runs on libgomp only on Linux"
)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _on_new_thread(work: Callable[[], None]) -> None:
    """Run ``work`` on a fresh thread (its own OpenMP pool); its exceptions and failed asserts reach the test."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(work).result()


def _parallel_op() -> None:
    x = torch.arange(4_000_000, dtype=torch.float32)
    float(x.exp_().sum())  # far above torch's grain size: a 2-thread parallel region


def test_release_ends_the_calling_threads_openmp_workers() -> None:
    before_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: dict[str, object] = {}

    def work() -> None:
        _parallel_op()
        seen["after_op"] = _threads()
        seen["released"] = release_openmp_threads()
        seen["after_release"] = _threads()
        _parallel_op()  # the next region starts its workers again
        seen["after_again"] = _threads()
        release_openmp_threads()

    try:
        _on_new_thread(work)
    finally:
        torch.set_num_threads(before_threads)
    assert seen["released"] is True
    assert seen["after_release"] == seen["after_op"] - 1  # the pool's one worker (2 threads: this one + 1)
    assert seen["after_again"] == seen["after_op"]


def test_run_then_release_returns_and_releases_even_when_the_function_raises() -> None:
    torch.set_num_threads(2)
    counts: list[int] = []

    def op_then_fail() -> None:
        _parallel_op()
        counts.append(_threads())
        raise ValueError("boom")

    def work() -> None:
        assert run_then_release(lambda a, b=0: a + b, 1, b=2) == 3
        with pytest.raises(ValueError, match="boom"):
            run_then_release(op_then_fail)
        counts.append(_threads())

    _on_new_thread(work)
    assert counts[1] == counts[0] - 1
