"""The benchmark's correctness checks (benchmarks/store_workload.py) must catch what they claim to catch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "store_workload.py"


@pytest.fixture(scope="module")
def wl() -> ModuleType:
    spec = importlib.util.spec_from_file_location("store_workload_under_test", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _read_back(wl: ModuleType, i: int, k: int) -> list[dict]:
    spans = [
        {
            "span_id": f"{i * k + j + 1:016x}",
            "seq": j + 1,
            "name": wl.SPAN_NAME,
            "attributes": wl.span_attributes(i, j, k),
            "reward": None,
        }
        for j in range(k)
    ]
    spans.append({"span_id": "r", "seq": k + 1, "name": "reward", "attributes": {}, "reward": wl.reward_for(i)})
    return spans


def test_exact_spans_pass(wl: ModuleType) -> None:
    assert set(wl.check_rollout_spans(7, 5, _read_back(wl, 7, 5), set()).values()) == {0}


def test_each_defect_is_counted(wl: ModuleType) -> None:
    k = 5
    lost = _read_back(wl, 3, k)
    del lost[2]
    assert wl.check_rollout_spans(3, k, lost, set())["missing"] == 1

    corrupt = _read_back(wl, 3, k)
    corrupt[1]["attributes"]["prompt_token_ids"][0] += 1
    assert wl.check_rollout_spans(3, k, corrupt, set())["corrupt"] == 1

    swapped = _read_back(wl, 3, k)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    assert wl.check_rollout_spans(3, k, swapped, set())["out_of_order"] == 2  # by sequence and by span index

    doubled = _read_back(wl, 3, k)
    doubled.insert(1, dict(doubled[0]))
    assert wl.check_rollout_spans(3, k, doubled, set())["duplicate"] == 2  # a repeated id, and one span too many

    wrong_reward = _read_back(wl, 3, k)
    wrong_reward[-1]["reward"] = 0.5
    assert wl.check_rollout_spans(3, k, wrong_reward, set())["rewards_wrong"] == 1
    assert wl.check_rollout_spans(3, k, _read_back(wl, 3, k)[:-1], set())["rewards_missing"] == 1


def test_verify_fails_on_a_lost_or_double_claim(wl: ModuleType) -> None:
    ids = {0: "ro-a", 1: "ro-b"}
    read = wl.ReadResult()
    for i, rid in ids.items():
        read.checks[rid] = wl.check_rollout_spans(i, 3, _read_back(wl, i, 3), read.span_ids_seen)
    states = {"ro-a": ("succeeded", 1), "ro-b": ("succeeded", 1)}
    assert wl.verify(2, ids, ["ro-a", "ro-b"], ["ro-a", "ro-b"], read, states, False)["ok"]
    assert not wl.verify(2, ids, ["ro-a", "ro-a", "ro-b"], ["ro-a", "ro-b"], read, states, False)["ok"]
    assert not wl.verify(2, ids, ["ro-a"], ["ro-a"], read, states, False)["ok"]  # ro-b never claimed
    assert not wl.verify(2, ids, ["ro-a", "ro-b"], ["ro-a", "ro-b"], read, {**states, "ro-b": ("failed", 2)}, False)[
        "ok"
    ]
