"""Samples <-> verl's actor batch (agentbolt.algorithms.rl.verl.data); hand-computed tensors, CPU only, no verl."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from agentbolt.adapter.samples import TrainingSample, merge_transitions
from agentbolt.algorithms.rl.verl.data import (
    ADVANTAGES,
    ATTENTION_MASK,
    INPUT_IDS,
    OLD_LOG_PROBS,
    PADDING_ROLLOUT_ID,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    ROLLOUT_LOG_PROBS,
    batch_temperature,
    pad_rows,
    samples_to_verl,
    transitions_from_verl_generation,
    verl_to_samples,
)
from agentbolt.errors import ConfigError
from agentbolt.types import Transition

# The module docstring's worked example. A: prompt [5, 6, 7] (3), response [8, 9] (2).
# B: two merged calls; first trained token at index 2, so prompt [1, 2] (2), response [3, 4, 5, 6] (4), where 5 is
# a tool token (mask 0). P = max(3, 2) = 3, R = max(2, 4) = 4. All floats are exact in float32.
SAMPLE_A = TrainingSample([5, 6, 7, 8, 9], [0, 0, 0, 1, 1], [0.0, 0.0, 0.0, -0.5, -0.25], 1.0, "r-a", 0.7)
SAMPLE_B = TrainingSample([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1], [0.0, 0.0, -0.5, -1.0, 0.0, -2.0], -0.5, "r-b", 0.7)


def test_worked_example_gives_exact_padded_tensors() -> None:
    batch = samples_to_verl([SAMPLE_A, SAMPLE_B])
    t = batch.tensors
    assert (batch.batch_size, batch.prompt_width, batch.response_width) == (2, 3, 4)
    assert t[PROMPTS].tolist() == [[5, 6, 7], [0, 1, 2]]
    assert t[RESPONSES].tolist() == [[8, 9, 0, 0], [3, 4, 5, 6]]
    assert t[INPUT_IDS].tolist() == [[5, 6, 7, 8, 9, 0, 0], [0, 1, 2, 3, 4, 5, 6]]
    assert t[ATTENTION_MASK].tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]]
    # clamp(cumsum - 1, 0): A counts 0..4 then repeats 4 on right padding; B is 0 on its left pad, then 0..5.
    assert t[POSITION_IDS].tolist() == [[0, 1, 2, 3, 4, 4, 4], [0, 0, 1, 2, 3, 4, 5]]
    assert t[RESPONSE_MASK].tolist() == [[1, 1, 0, 0], [1, 1, 0, 1]]
    assert t[OLD_LOG_PROBS].tolist() == [[-0.5, -0.25, 0.0, 0.0], [-0.5, -1.0, 0.0, -2.0]]
    assert t[ROLLOUT_LOG_PROBS].tolist() == t[OLD_LOG_PROBS].tolist()
    assert t[ADVANTAGES].tolist() == [[1.0, 1.0, 0.0, 0.0], [-0.5, -0.5, 0.0, -0.5]]
    assert t[INPUT_IDS].dtype == torch.long and t[OLD_LOG_PROBS].dtype == torch.float32
    assert batch.non_tensors() == {"rollout_id": ["r-a", "r-b"], "sampling_temperature": [0.7, 0.7]}


def test_fixed_widths_and_pad_id() -> None:
    batch = samples_to_verl([SAMPLE_A], pad_token_id=-1, prompt_width=4, response_width=3)
    assert batch.tensors[PROMPTS].tolist() == [[-1, 5, 6, 7]]
    assert batch.tensors[RESPONSES].tolist() == [[8, 9, -1]]
    assert batch.tensors[ATTENTION_MASK].tolist() == [[0, 1, 1, 1, 1, 1, 0]]
    assert batch.tensors[POSITION_IDS].tolist() == [[0, 0, 1, 2, 3, 4, 4]]


def test_round_trip_is_exact() -> None:
    batch = samples_to_verl([SAMPLE_A, SAMPLE_B], pad_token_id=99, prompt_width=5, response_width=6)
    assert verl_to_samples(batch.tensors, batch.rollout_ids, batch.sampling_temperatures) == [SAMPLE_A, SAMPLE_B]
    # float64 keeps values float32 cannot hold (0.1, -1/3) bit for bit.
    odd = TrainingSample([3, 4, 5], [0, 1, 1], [0.0, -0.1, -1 / 3], 0.1, "r-c")
    wide = samples_to_verl([odd], float_dtype=torch.float64)
    assert verl_to_samples(wide.tensors, wide.rollout_ids, wide.sampling_temperatures) == [odd]
    narrow = samples_to_verl([odd])
    back = verl_to_samples(narrow.tensors, narrow.rollout_ids)[0]
    assert back.sampling_logprobs[1] == float(torch.tensor(-0.1, dtype=torch.float32))
    assert back.sampling_temperature == 1.0


def test_samples_to_verl_refuses_what_verl_cannot_take() -> None:
    untrained = TrainingSample([1, 2], [0, 0], [0.0, 0.0], 1.0, "r-x")
    with pytest.raises(ConfigError, match="no trained token"):
        samples_to_verl([SAMPLE_A, untrained])
    with pytest.raises(ConfigError, match="prompt_width is 2"):
        samples_to_verl([SAMPLE_A], prompt_width=2)
    with pytest.raises(ConfigError, match="response_width is 1"):
        samples_to_verl([SAMPLE_A], response_width=1)
    with pytest.raises(ConfigError, match="no samples"):
        samples_to_verl([])


def test_verl_to_samples_checks_layout_and_advantages() -> None:
    batch = samples_to_verl([SAMPLE_A, SAMPLE_B])
    mixed = dict(batch.tensors)
    mixed[ADVANTAGES] = torch.tensor([[1.0, 2.0, 0.0, 0.0], [-0.5, -0.5, 0.0, -0.5]])
    with pytest.raises(ConfigError, match="different advantages"):
        verl_to_samples(mixed, batch.rollout_ids)
    holed = dict(batch.tensors)
    holed[ATTENTION_MASK] = torch.tensor([[1, 0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]])
    with pytest.raises(ConfigError, match="not a left-padded prompt"):
        verl_to_samples(holed, batch.rollout_ids)
    with pytest.raises(ConfigError, match="2 rows but 1 rollout ids"):
        verl_to_samples(batch.tensors, ["r-a"])
    missing = {k: v for k, v in batch.tensors.items() if k != OLD_LOG_PROBS}
    with pytest.raises(ConfigError, match="old_log_probs"):
        verl_to_samples(missing, batch.rollout_ids)


def test_pad_rows_adds_untrained_copies_of_row_zero() -> None:
    batch = pad_rows(samples_to_verl([SAMPLE_A, SAMPLE_B]), 4)
    assert batch.batch_size == 4
    assert batch.rollout_ids == ["r-a", "r-b", PADDING_ROLLOUT_ID, PADDING_ROLLOUT_ID]
    assert batch.tensors[INPUT_IDS][2].tolist() == [5, 6, 7, 8, 9, 0, 0]
    assert batch.tensors[RESPONSE_MASK][2:].sum().item() == 0
    assert batch.tensors[ADVANTAGES][2:].abs().sum().item() == 0.0
    assert verl_to_samples(batch.tensors, batch.rollout_ids, batch.sampling_temperatures) == [SAMPLE_A, SAMPLE_B]
    assert pad_rows(batch, 2) is batch
    with pytest.raises(ConfigError, match="multiple must be >= 1"):
        pad_rows(batch, 0)


def test_batch_temperature_refuses_a_mix() -> None:
    assert batch_temperature([SAMPLE_A, SAMPLE_B]) == 0.7
    other = TrainingSample([1, 2], [0, 1], [0.0, -1.0], 1.0, "r-d", 1.0)
    with pytest.raises(ConfigError, match=r"one temperature, got \[0.7, 1.0\]"):
        batch_temperature([SAMPLE_A, other])


def test_generation_output_splits_into_calls_and_merges_back() -> None:
    # One verl multi-turn row: prompt [1, 2]; response [3, 4 | tool 5 | 6] with logprobs [-0.5, -1, 0, -2].
    tensors = {
        PROMPTS: torch.tensor([[0, 1, 2]]),
        RESPONSES: torch.tensor([[3, 4, 5, 6, 0]]),
        INPUT_IDS: torch.tensor([[0, 1, 2, 3, 4, 5, 6, 0]]),
        ATTENTION_MASK: torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0]]),
        RESPONSE_MASK: torch.tensor([[1, 1, 0, 1, 0]]),
        ROLLOUT_LOG_PROBS: torch.tensor([[-0.5, -1.0, 0.0, -2.0, 0.0]]),
    }
    [calls] = transitions_from_verl_generation(tensors, temperature=0.7)
    assert [(c.prompt_token_ids, c.response_token_ids, c.sampling_logprobs) for c in calls] == [
        ([1, 2], [3, 4], [-0.5, -1.0]),
        ([1, 2, 3, 4, 5], [6], [-2.0]),
    ]
    assert calls[0].metadata == {"temperature": 0.7}
    assert merge_transitions(calls, [-0.5, -0.5], "r-b") == [SAMPLE_B]
    no_mask = {k: v for k, v in tensors.items() if k != RESPONSE_MASK}
    [[whole]] = transitions_from_verl_generation(no_mask)
    assert whole.response_token_ids == [3, 4, 5, 6] and whole.metadata == {}
    no_logprobs = {k: v for k, v in tensors.items() if k != ROLLOUT_LOG_PROBS}
    with pytest.raises(ConfigError, match="calculate_log_probs"):
        transitions_from_verl_generation(no_logprobs)


def test_transitions_round_trip_through_samples() -> None:
    calls = [
        Transition(prompt_token_ids=[7, 8], response_token_ids=[9], sampling_logprobs=[-0.25]),
        Transition(prompt_token_ids=[7, 8, 9, 10], response_token_ids=[11, 12], sampling_logprobs=[-0.5, -1.0]),
    ]
    [sample] = merge_transitions(calls, [2.0, 2.0], "r-e")
    batch = samples_to_verl([sample])
    [back] = transitions_from_verl_generation(batch.tensors)
    assert [(c.prompt_token_ids, c.response_token_ids, c.sampling_logprobs) for c in back] == [
        (c.prompt_token_ids, c.response_token_ids, c.sampling_logprobs) for c in calls
    ]


def test_package_import_does_not_import_verl() -> None:
    code = (
        "import sys; import agentbolt.algorithms.rl.verl.data, agentbolt.algorithms.rl.verl.config, "
        "agentbolt.algorithms.rl.verl.trainer; print('verl' in sys.modules, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
