"""Policy losses on token logprobs (DESIGN.md, LightningRL step 5). Numeric only: no model, no optimizer.

``ppo_clip_loss`` is PPO's clipped surrogate (Schulman et al., "Proximal Policy Optimization Algorithms",
arXiv:1707.06347, eq. 7) applied per token, with the asymmetric "clip-higher" bounds of DAPO (Yu et al., arXiv:
2503.14476, section 3.1) and token-level aggregation (DAPO section 3.3). The advantage is one number per sequence
(the rollout's, broadcast to its masked tokens).

Gradient accumulation is exact: pass ``normalizer`` = the number of masked tokens in the *whole* batch to every
micro-batch call and sum the losses (or backpropagate each); the sum equals the loss of one call on the whole batch,
and so do the accumulated gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from agentbolt.errors import ConfigError

LOG_RATIO_LIMIT = 20.0
"""``log pi - log pi_old`` is clamped to ``[-20, 20]`` before ``exp`` so one stale token cannot overflow the ratio
to ``inf`` (verl clamps the same quantity the same way). Inside the clip range it never binds."""

Aggregation = Literal["token_mean", "sequence_mean"]


@dataclass(frozen=True)
class PPOClipStats:
    """Diagnostics of one :func:`ppo_clip_loss` call, averaged over its masked tokens (``n_loss_tokens`` of them),
    so micro-batch stats combine by a token-weighted mean.

    Attributes:
        clip_fraction: share of masked tokens whose gradient the clip removed: ``A > 0`` and
            ``ratio > 1 + clip_high``, or ``A < 0`` and ``ratio < 1 - clip_low``.
        approx_kl: mean of the k3 estimator ``(ratio - 1) - log(ratio)`` of KL(pi_old || pi) over tokens sampled
            from pi_old (J. Schulman, "Approximating KL Divergence", 2020, http://joschu.net/blog/kl-approx.html);
            non-negative per token, 0 when the policies agree.
        ratio_mean: mean of ``pi / pi_old``.
        n_loss_tokens: masked tokens in this call.
    """

    clip_fraction: float
    approx_kl: float
    ratio_mean: float
    n_loss_tokens: int


def ppo_clip_loss(
    logprobs_BT: torch.Tensor,
    sampling_logprobs_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    loss_mask_BT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: Aggregation = "token_mean",
    normalizer: float | None = None,
) -> tuple[torch.Tensor, PPOClipStats]:
    """PPO-clip loss, per token, aggregated over the masked tokens.

    Per masked token t of sequence b, with ``ratio = exp(logprobs - sampling_logprobs)`` and ``A = advantages[b]``::

        loss_t = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)

    Aggregations:

    - ``token_mean`` (default; DAPO's token-level loss): ``sum_{b,t} mask * loss_t / normalizer``; ``normalizer``
      defaults to the number of masked tokens here. Every trained token weighs the same.
    - ``sequence_mean`` (GRPO's original eq. 3, arXiv:2402.03300): each sequence's token mean, summed over
      sequences, divided by ``normalizer`` (default: the number of sequences with at least one masked token).

    Args:
        logprobs_BT: ``(B, T)`` log pi(token) under the policy being trained; carries the gradient. Any float
            dtype; the math runs in float32.
        sampling_logprobs_BT: ``(B, T)`` log pi_old(token) under the sampling policy (no gradient).
        advantages_B: ``(B,)`` one advantage per sequence.
        loss_mask_BT: ``(B, T)`` 1 (or True) on trained tokens, 0 elsewhere; values outside the mask are ignored,
            including non-finite ones.
        clip_low: ``eps_low`` in ``[0, 1)``: the ratio's lower clip is ``1 - clip_low``.
        clip_high: ``eps_high >= 0``: the ratio's upper clip is ``1 + clip_high`` (DAPO's clip-higher: 0.28).
        aggregation: ``token_mean`` or ``sequence_mean`` (above).
        normalizer: the denominator; pass the whole batch's count when this call sees one micro-batch of it.

    Returns:
        ``(loss, stats)``: a float32 scalar tensor (0 with a zero gradient when nothing is masked) and
        :class:`PPOClipStats`.

    Raises:
        ConfigError: mismatched shapes, clip bounds out of range, an unknown aggregation or ``normalizer <= 0``.
    """
    if logprobs_BT.shape != sampling_logprobs_BT.shape or logprobs_BT.shape != loss_mask_BT.shape:
        raise ConfigError(
            f"logprobs {tuple(logprobs_BT.shape)}, sampling_logprobs {tuple(sampling_logprobs_BT.shape)} and "
            f"loss_mask {tuple(loss_mask_BT.shape)} must all be (B, T)"
        )
    if logprobs_BT.dim() != 2 or advantages_B.shape != logprobs_BT.shape[:1]:
        raise ConfigError(
            f"advantages must be (B,) = ({logprobs_BT.shape[0]},) for (B, T) logprobs, got {tuple(advantages_B.shape)}"
        )
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ConfigError(f"need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if normalizer is not None and not normalizer > 0:
        raise ConfigError(f"normalizer must be > 0, got {normalizer}")

    mask = loss_mask_BT.to(torch.bool)
    mask_f = mask.to(torch.float32)
    advantages = advantages_B.to(torch.float32).unsqueeze(1)  # (B, 1)
    log_ratio = logprobs_BT.to(torch.float32) - sampling_logprobs_BT.to(torch.float32).detach()
    log_ratio = torch.where(mask, log_ratio, torch.zeros_like(log_ratio))
    log_ratio = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)  # (B, T)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    loss_BT = -torch.minimum(unclipped, clipped) * mask_f

    if aggregation == "token_mean":
        denominator = float(normalizer) if normalizer is not None else max(float(mask_f.sum().item()), 1.0)
        loss = loss_BT.sum() / denominator
    elif aggregation == "sequence_mean":
        tokens_B = mask_f.sum(dim=1)
        per_sequence = loss_BT.sum(dim=1) / tokens_B.clamp(min=1.0)
        n_sequences = max(float((tokens_B > 0).sum().item()), 1.0)
        denominator = float(normalizer) if normalizer is not None else n_sequences
        loss = per_sequence.sum() / denominator
    else:
        raise ConfigError(f"unknown aggregation {aggregation!r}; known: sequence_mean, token_mean")

    with torch.no_grad():
        n_tokens = int(mask.sum().item())
        count = max(n_tokens, 1)
        clipped_away = ((advantages > 0) & (ratio > 1.0 + clip_high)) | ((advantages < 0) & (ratio < 1.0 - clip_low))
        stats = PPOClipStats(
            clip_fraction=float((clipped_away & mask).sum().item()) / count,
            approx_kl=float((((ratio - 1.0) - log_ratio) * mask_f).sum().item()) / count,
            ratio_mean=float((ratio * mask_f).sum().item()) / count,
            n_loss_tokens=n_tokens,
        )
    return loss, stats
