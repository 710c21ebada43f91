"""Our training samples <-> verl's actor-update batch, and verl generation output -> transitions. Pure, torch only.

**verl's layout** (verl 0.9.1, ``verl/experimental/agent_loop/agent_loop.py`` ``_agent_loop_postprocess`` and
``_postprocess``; read by ``verl/workers/utils/losses.py`` ``ppo_loss`` after
``verl/workers/utils/padding.py`` ``left_right_2_no_padding``): each row is a prompt **left**-padded to a width
``P`` followed by a response **right**-padded to a width ``R``. For a batch of ``B`` rows:

================== ============ ======= ======================================================================
key                shape        dtype   meaning
================== ============ ======= ======================================================================
``prompts``        ``(B, P)``   int64   prompt ids, left-padded with ``pad_token_id``
``responses``      ``(B, R)``   int64   response ids, right-padded with ``pad_token_id``
``input_ids``      ``(B, P+R)`` int64   ``cat(prompts, responses)``
``attention_mask`` ``(B, P+R)`` int64   1 on real tokens (prompt and response, tool tokens included), 0 on pads
``position_ids``   ``(B, P+R)`` int64   ``clamp(cumsum(attention_mask) - 1, min=0)`` (verl ``utils/model.py``
                                        ``compute_position_id_with_mask``)
``response_mask``  ``(B, R)``   int64   1 on tokens the model generated (trained), 0 on tool/user tokens inside
                                        the response and on padding
``old_log_probs``  ``(B, R)``   float   log pi_old of each response token; 0.0 where ``response_mask`` is 0
``rollout_log_probs`` ``(B, R)`` float  the same values (verl's name for the inference engine's logprobs)
``advantages``     ``(B, R)``   float   the sample's advantage on every ``response_mask`` token, 0.0 elsewhere
================== ============ ======= ======================================================================

**Mapping a sample.** The prompt is every token before the sample's first trained token (``loss_mask == 1``); the
response is the rest, so a merged sample (:func:`~agentbolt.adapter.samples.merge_transitions`) keeps its
later tool/user tokens inside the response with ``response_mask`` 0, as verl's multi-turn agent loop does.
``old_log_probs`` are our ``sampling_logprobs`` (the gateway's), so verl's PPO ratio is anchored at the sampling
policy, like :mod:`agentbolt.algorithms.rl.torch_backend` without ``tis_cap``. Non-tensor fields travel beside the
tensors: ``rollout_id`` and ``sampling_temperature`` per row.

Worked example (``pad_token_id = 0``): sample A ``input_ids [5, 6, 7, 8, 9]``, ``loss_mask [0, 0, 0, 1, 1]``,
``sampling_logprobs [0, 0, 0, -0.5, -0.25]``, advantage 1.0; sample B (two merged calls) ``input_ids [1, 2, 3, 4, 5,
6]``, ``loss_mask [0, 0, 1, 1, 0, 1]``, ``sampling_logprobs [0, 0, -0.5, -1, 0, -2]``, advantage -0.5. A's prompt
has 3 tokens and its response 2; B's 2 and 4; so ``P = 3``, ``R = 4``::

    prompts        = [[5, 6, 7], [0, 1, 2]]                       (B, P) = (2, 3)
    responses      = [[8, 9, 0, 0], [3, 4, 5, 6]]                 (B, R) = (2, 4)
    attention_mask = [[1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]]
    position_ids   = [[0, 1, 2, 3, 4, 4, 4], [0, 0, 1, 2, 3, 4, 5]]
    response_mask  = [[1, 1, 0, 0], [1, 1, 0, 1]]
    old_log_probs  = [[-0.5, -0.25, 0, 0], [-0.5, -1, 0, -2]]
    advantages     = [[1, 1, 0, 0], [-0.5, -0.5, 0, -0.5]]

Floats are stored as ``float_dtype`` (float32 by default, verl's dtype), so a round trip returns exactly the values
that float32 can represent; pass ``float_dtype=torch.float64`` for a bit-exact round trip of any float.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import torch

from agentbolt.adapter.samples import TrainingSample
from agentbolt.errors import ConfigError
from agentbolt.types import Transition

PROMPTS: Final = "prompts"
RESPONSES: Final = "responses"
INPUT_IDS: Final = "input_ids"
ATTENTION_MASK: Final = "attention_mask"
POSITION_IDS: Final = "position_ids"
RESPONSE_MASK: Final = "response_mask"
OLD_LOG_PROBS: Final = "old_log_probs"
ROLLOUT_LOG_PROBS: Final = "rollout_log_probs"
ADVANTAGES: Final = "advantages"

ROLLOUT_ID: Final = "rollout_id"
"""Non-tensor field: the rollout of each row."""
SAMPLING_TEMPERATURE: Final = "sampling_temperature"
"""Non-tensor field: the temperature each row was sampled at."""
PADDING_ROLLOUT_ID: Final = "__padding__"
"""The rollout id of rows added by :func:`pad_rows` (they carry no trained token)."""


@dataclass(frozen=True)
class VerlBatch:
    """A batch in verl's actor-update layout (see the module docstring for every key, shape and dtype).

    Attributes:
        tensors: ``key -> tensor``; every tensor has ``B`` rows.
        rollout_ids: ``(B,)`` the rollout of each row.
        sampling_temperatures: ``(B,)`` the temperature each row was sampled at.
    """

    tensors: dict[str, torch.Tensor]
    rollout_ids: list[str]
    sampling_temperatures: list[float]

    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return len(self.rollout_ids)

    @property
    def prompt_width(self) -> int:
        """P, the padded prompt width."""
        return int(self.tensors[PROMPTS].shape[1])

    @property
    def response_width(self) -> int:
        """R, the padded response width."""
        return int(self.tensors[RESPONSES].shape[1])

    def non_tensors(self) -> dict[str, list[str] | list[float]]:
        """The non-tensor fields by name (``rollout_id``, ``sampling_temperature``), one entry per row."""
        return {ROLLOUT_ID: list(self.rollout_ids), SAMPLING_TEMPERATURE: list(self.sampling_temperatures)}


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` positions ``clamp(cumsum(mask) - 1, min=0)``: 0 on left padding, counting up over real tokens,
    repeating the last position on right padding (verl ``utils/model.py`` ``compute_position_id_with_mask``)."""
    return torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0)


def samples_to_verl(
    samples: Sequence[TrainingSample],
    *,
    pad_token_id: int = 0,
    prompt_width: int | None = None,
    response_width: int | None = None,
    float_dtype: torch.dtype = torch.float32,
) -> VerlBatch:
    """Our samples as one verl actor-update batch (layout and worked example in the module docstring).

    Args:
        samples: ``(B,)`` samples, each with at least one trained token; rows keep this order.
        pad_token_id: the id written on padding (masked out everywhere; verl's agent loop pads with the tokenizer's).
        prompt_width / response_width: ``P`` / ``R``; default the batch's longest prompt / response. Set them to
            verl's ``rollout.prompt_length`` / ``rollout.response_length`` for fixed shapes.
        float_dtype: dtype of ``old_log_probs``, ``rollout_log_probs`` and ``advantages``.

    Returns:
        A :class:`VerlBatch` with every key of the module docstring's table.

    Raises:
        ConfigError: no samples, a sample with no trained token (drop it first; it carries no gradient), or a prompt
            or response longer than the given width.
    """
    if not samples:
        raise ConfigError("cannot build a verl batch from no samples")
    splits: list[int] = []
    for k, sample in enumerate(samples):
        if 1 not in sample.loss_mask:
            raise ConfigError(
                f"sample {k} (rollout {sample.rollout_id}) has no trained token; drop samples with an all-zero "
                "loss_mask before converting (they carry no gradient)"
            )
        splits.append(sample.loss_mask.index(1))
    response_lengths = [s.n_tokens - p for s, p in zip(samples, splits, strict=True)]
    width_p = max(splits) if prompt_width is None else prompt_width
    width_r = max(response_lengths) if response_width is None else response_width
    if max(splits) > width_p:
        raise ConfigError(
            f"a prompt has {max(splits)} tokens but prompt_width is {width_p}; raise max_prompt_length "
            "or drop the sample"
        )
    if max(response_lengths) > width_r:
        raise ConfigError(
            f"a response has {max(response_lengths)} tokens but response_width is {width_r}; raise "
            "max_response_length or drop the sample"
        )
    n = len(samples)
    prompts = torch.full((n, width_p), pad_token_id, dtype=torch.long)
    responses = torch.full((n, width_r), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, width_p + width_r), dtype=torch.long)
    response_mask = torch.zeros((n, width_r), dtype=torch.long)
    logprobs = torch.zeros((n, width_r), dtype=float_dtype)
    advantages = torch.zeros((n, width_r), dtype=float_dtype)
    for i, (sample, p, r) in enumerate(zip(samples, splits, response_lengths, strict=True)):
        if p:
            prompts[i, width_p - p :] = torch.tensor(sample.input_ids[:p], dtype=torch.long)
        attention[i, width_p - p : width_p + r] = 1
        responses[i, :r] = torch.tensor(sample.input_ids[p:], dtype=torch.long)
        mask = torch.tensor(sample.loss_mask[p:], dtype=torch.long)
        response_mask[i, :r] = mask
        logprobs[i, :r] = torch.tensor(sample.sampling_logprobs[p:], dtype=float_dtype) * mask.to(float_dtype)
        advantages[i, :r] = torch.tensor(sample.advantage, dtype=float_dtype) * mask.to(float_dtype)
    tensors = {
        PROMPTS: prompts,
        RESPONSES: responses,
        INPUT_IDS: torch.cat([prompts, responses], dim=1),
        ATTENTION_MASK: attention,
        POSITION_IDS: position_ids_from_mask(attention),
        RESPONSE_MASK: response_mask,
        OLD_LOG_PROBS: logprobs,
        ROLLOUT_LOG_PROBS: logprobs.clone(),
        ADVANTAGES: advantages,
    }
    return VerlBatch(tensors, [s.rollout_id for s in samples], [s.sampling_temperature for s in samples])


def _row_spans(tensors: Mapping[str, torch.Tensor]) -> tuple[int, list[tuple[int, int]]]:
    """``P`` and each row's ``(prompt length, response length)``, checking the left/right padding.

    Raises:
        ConfigError: a key is missing, shapes disagree, or a row's mask is not left-padded prompt + right-padded
            response.
    """
    for key in (RESPONSES, INPUT_IDS, ATTENTION_MASK):
        if key not in tensors:
            raise ConfigError(f"verl batch has no {key!r} tensor; it needs {RESPONSES}, {INPUT_IDS}, {ATTENTION_MASK}")
    input_ids = tensors[INPUT_IDS]
    attention = tensors[ATTENTION_MASK]
    width_r = int(tensors[RESPONSES].shape[1])
    width_p = int(input_ids.shape[1]) - width_r
    if attention.shape != input_ids.shape or width_p < 0:
        raise ConfigError(
            f"verl batch shapes disagree: input_ids {tuple(input_ids.shape)}, attention_mask "
            f"{tuple(attention.shape)}, responses {tuple(tensors[RESPONSES].shape)}; expected (B, P+R), (B, P+R), "
            "(B, R)"
        )
    spans: list[tuple[int, int]] = []
    for i, row in enumerate(attention.tolist()):
        p = sum(row[:width_p])
        r = sum(row[width_p:])
        if row[:width_p] != [0] * (width_p - p) + [1] * p or row[width_p:] != [1] * r + [0] * (width_r - r):
            raise ConfigError(
                f"row {i} of the verl batch is not a left-padded prompt followed by a right-padded response "
                f"(attention_mask {row})"
            )
        spans.append((p, r))
    return width_p, spans


def verl_to_samples(
    tensors: Mapping[str, torch.Tensor],
    rollout_ids: Sequence[str],
    sampling_temperatures: Sequence[float] | None = None,
) -> list[TrainingSample]:
    """The inverse of :func:`samples_to_verl`: one :class:`TrainingSample` per row with a trained token.

    Reads ``input_ids``, ``responses``, ``attention_mask``, ``response_mask``, ``old_log_probs`` and ``advantages``
    (a verl ``TensorDict`` works as the mapping). ``input_ids`` loses its padding; ``loss_mask`` is 0 on the prompt
    and ``response_mask`` on the response; ``sampling_logprobs`` are ``old_log_probs`` on trained tokens and 0.0
    elsewhere; the advantage is the value on the row's trained tokens.

    Args:
        tensors: the batch (module docstring).
        rollout_ids: ``(B,)`` the rollout of each row.
        sampling_temperatures: ``(B,)``; default 1.0 for every row.

    Returns:
        Samples in row order; rows with no trained token (such as :func:`pad_rows` padding) are left out.

    Raises:
        ConfigError: a key is missing, lengths disagree, the padding is not verl's, a row has an empty prompt, or
            a row's advantages differ between its trained tokens (a sample holds one advantage).
    """
    width_p, spans = _row_spans(tensors)
    for key in (RESPONSE_MASK, OLD_LOG_PROBS, ADVANTAGES):
        if key not in tensors:
            raise ConfigError(f"verl batch has no {key!r} tensor")
    n = len(spans)
    temperatures = [1.0] * n if sampling_temperatures is None else list(sampling_temperatures)
    if len(rollout_ids) != n or len(temperatures) != n:
        raise ConfigError(
            f"verl batch has {n} rows but {len(rollout_ids)} rollout ids and {len(temperatures)} temperatures"
        )
    input_ids = tensors[INPUT_IDS].tolist()
    masks = tensors[RESPONSE_MASK].tolist()
    logprobs = tensors[OLD_LOG_PROBS].tolist()
    advantages = tensors[ADVANTAGES].tolist()
    samples: list[TrainingSample] = []
    for i, (p, r) in enumerate(spans):
        mask = [int(m) for m in masks[i][:r]]
        if 1 not in mask:
            continue
        if p == 0:
            raise ConfigError(f"row {i} of the verl batch has an empty prompt; its first token cannot be scored")
        values = {advantages[i][j] for j in range(r) if mask[j]}
        if len(values) != 1:
            raise ConfigError(
                f"row {i} (rollout {rollout_ids[i]}) has different advantages on its trained tokens "
                f"({sorted(values)}); a TrainingSample holds one advantage per sequence"
            )
        samples.append(
            TrainingSample(
                input_ids=[int(t) for t in input_ids[i][width_p - p : width_p + r]],
                loss_mask=[0] * p + mask,
                sampling_logprobs=[0.0] * p + [float(logprobs[i][j]) if mask[j] else 0.0 for j in range(r)],
                advantage=float(values.pop()),
                rollout_id=rollout_ids[i],
                sampling_temperature=float(temperatures[i]),
            )
        )
    return samples


def batch_temperature(samples: Sequence[TrainingSample]) -> float:
    """The one sampling temperature of ``samples``.

    verl's actor divides the logits by a single ``meta_info["temperature"]`` per batch (verl 0.9.1
    ``trainer/ppo/ray_trainer.py`` ``_update_actor``), so a batch must not mix temperatures.

    Raises:
        ConfigError: no samples, or more than one temperature (split the batch by temperature, or sample every
            trained call at the same temperature).
    """
    temperatures = sorted({s.sampling_temperature for s in samples})
    if len(temperatures) != 1:
        raise ConfigError(
            f"verl trains a batch at one temperature, got {temperatures or 'no samples'}; sample every trained "
            "call at the same temperature or split the batch by temperature"
        )
    return temperatures[0]


def pad_rows(batch: VerlBatch, multiple: int) -> VerlBatch:
    """``batch`` with rows appended until ``B`` is a multiple of ``multiple`` (verl splits a batch evenly over its
    data-parallel ranks).

    Each added row repeats row 0's tokens (a real, non-empty sequence) with ``response_mask``, logprobs and
    advantages all 0 and rollout id :data:`PADDING_ROLLOUT_ID`, so it adds no gradient and no token to a
    ``token-mean`` loss. Under ``seq-mean-token-mean`` it still counts as a sequence: the loss is scaled by
    ``B / (B + added)``.

    Raises:
        ConfigError: ``multiple < 1``.
    """
    if multiple < 1:
        raise ConfigError(f"multiple must be >= 1, got {multiple}")
    added = -batch.batch_size % multiple
    if added == 0:
        return batch
    zeroed = {RESPONSE_MASK, OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, ADVANTAGES}
    tensors: dict[str, torch.Tensor] = {}
    for key, tensor in batch.tensors.items():
        extra = tensor[:1].repeat(added, *([1] * (tensor.dim() - 1)))
        if key in zeroed:
            extra = torch.zeros_like(extra)
        tensors[key] = torch.cat([tensor, extra], dim=0)
    return VerlBatch(
        tensors,
        [*batch.rollout_ids, *[PADDING_ROLLOUT_ID] * added],
        [*batch.sampling_temperatures, *[batch.sampling_temperatures[0]] * added],
    )


def transitions_from_verl_generation(
    tensors: Mapping[str, torch.Tensor], *, temperature: float | None = None
) -> list[list[Transition]]:
    """verl rollout output (``prompts``/``responses``/``attention_mask``, optional ``response_mask``,
    ``rollout_log_probs``) as our transitions, one list (a trajectory's calls, in order) per row.

    A row's response is cut at its runs of ``response_mask == 1``: each run is one LLM call whose prompt is the
    row's prompt plus every response token before the run (earlier calls and the tool/user tokens between them).
    This is the inverse of :func:`~agentbolt.adapter.samples.merge_transitions`. Without ``response_mask``
    the whole response is one call.

    Args:
        tensors: verl's generation batch (``(B, P)``, ``(B, R)``, ``(B, P+R)`` as in the module docstring).
        temperature: written as ``metadata["temperature"]`` on every transition when given.

    Returns:
        ``(B,)`` lists of transitions; a row with no generated token gives an empty list.

    Raises:
        ConfigError: a key is missing (``rollout_log_probs`` included: without the engine's logprobs the calls
            cannot be trained), shapes disagree, or the padding is not verl's.
    """
    width_p, spans = _row_spans(tensors)
    if ROLLOUT_LOG_PROBS not in tensors:
        raise ConfigError(
            "verl generation output has no 'rollout_log_probs'; set actor_rollout_ref.rollout.calculate_log_probs="
            "true so the engine returns them"
        )
    input_ids = tensors[INPUT_IDS].tolist()
    logprobs = tensors[ROLLOUT_LOG_PROBS].tolist()
    masks = tensors[RESPONSE_MASK].tolist() if RESPONSE_MASK in tensors else None
    metadata = {} if temperature is None else {"temperature": temperature}
    rows: list[list[Transition]] = []
    for i, (p, r) in enumerate(spans):
        tokens = [int(t) for t in input_ids[i][width_p - p : width_p + r]]
        mask = [1] * r if masks is None else [int(m) for m in masks[i][:r]]
        calls: list[Transition] = []
        j = 0
        while j < r:
            if not mask[j]:
                j += 1
                continue
            end = j
            while end < r and mask[end]:
                end += 1
            calls.append(
                Transition(
                    prompt_token_ids=tokens[: p + j],
                    response_token_ids=tokens[p + j : p + end],
                    sampling_logprobs=[float(x) for x in logprobs[i][j:end]],
                    metadata=dict(metadata),
                )
            )
            j = end
        rows.append(calls)
    return rows
