"""Policy losses on token logprobs (DESIGN.md, LightningRL step 5). Numeric only: no model, no optimizer.

``ppo_clip_loss`` is PPO's clipped surrogate (Schulman et al., "Proximal Policy Optimization Algorithms",
arXiv:1707.06347, eq. 7) applied per token, with the asymmetric "clip-higher" bounds of DAPO (Yu et al., arXiv:
2503.14476, section 3.1). The advantage is one number per sequence (the rollout's, broadcast to its masked tokens).
Options, each off by default:

- **KL to a reference policy** (:func:`kl_penalty`), by the k1 or k3 estimator of J. Schulman, "Approximating KL
  Divergence", 2020, http://joschu.net/blog/kl-approx.html; GRPO adds ``beta * k3`` to the per-token loss
  (arXiv:2402.03300, eq. 4).
- **Truncated importance sampling** (:func:`truncated_is_weights`) for off-policy tokens, i.e. sampled by a policy
  other than the one the update starts from (an older resources version, or an inference engine whose numerics
  differ from the trainer's): each token's policy-gradient term is weighted by ``min(pi_old / pi_behavior, C)``
  (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
  https://fengyao.notion.site/off-policy-rl; the truncation of IMPALA's V-trace, Espeholt et al., arXiv:1802.01561,
  section 4.1).

Aggregation (:func:`aggregate_token_losses`), chosen by name:

- ``token_mean`` (DAPO section 3.3): every trained token of the batch weighs the same.
- ``sequence_mean`` (GRPO's eq. 3): every training sample weighs the same (its token mean, averaged over samples).
- ``rollout_mean``: every rollout weighs the same, however many samples it was split into and however long it
  is: each token of rollout ``r`` weighs ``1 / (R * N_r)``, with ``R`` the rollouts of the batch and ``N_r`` the
  trained tokens of ``r`` over all its samples (:func:`rollout_mean_weights`). The token weights do not depend on
  how ``r`` was split, so neither does the loss; each rollout's total weight is ``1 / R``.

Gradient accumulation is exact: pass ``normalizer`` = the whole batch's count (``token_mean``: its masked tokens,
``sequence_mean``: its samples) or, for ``rollout_mean``, weights computed over the whole batch, to every
micro-batch call and sum the losses (or backpropagate each); the sum equals the loss of one call on the whole batch,
and so do the accumulated gradients.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from agentbolt.algorithms.rl.trainer_config import Aggregation, KLEstimator
from agentbolt.errors import ConfigError

LOG_RATIO_LIMIT = 20.0
"""``log pi - log pi_old`` is clamped to ``[-20, 20]`` before ``exp`` so one stale token cannot overflow the ratio
to ``inf`` (verl clamps the same quantity the same way). Inside the clip range it never binds."""

AGGREGATIONS: tuple[Aggregation, ...] = ("token_mean", "sequence_mean", "rollout_mean")


def kl_penalty(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from (about) pi (Schulman 2020, "Approximating
    KL Divergence"). With ``log_r = log pi_ref - log pi``:

    - ``k1 = -log_r = log pi - log pi_ref``: unbiased, high variance, can be negative per token.
    - ``k3 = exp(log_r) - 1 - log_r``: unbiased, lower variance, >= 0 per token (GRPO's, arXiv:2402.03300, eq. 4).

    As a differentiable loss term, note: the gradient of k1 is ``grad log pi`` alone, whose expectation under pi is
    0, so ``kl_coef * k1`` in the loss pulls nothing toward the reference on average; use k1 as a reward penalty
    (subtract ``beta * k1`` from the token rewards, REINFORCE++'s eq. 8) or k3 in the loss.

    Args:
        logprobs_BT: ``(B, T)`` log pi(token) under the policy being trained (carries the gradient).
        ref_logprobs_BT: ``(B, T)`` log pi_ref(token) under the reference policy (detached here).
        estimator: ``k1`` or ``k3``.

    Returns:
        ``(B, T)`` float32 per-token estimates (unit: nats); ``log_r`` is clamped to ``[-20, 20]`` first.

    Raises:
        ConfigError: shapes differ, or an unknown estimator.
    """
    if logprobs_BT.shape != ref_logprobs_BT.shape:
        raise ConfigError(
            f"logprobs {tuple(logprobs_BT.shape)} and ref_logprobs {tuple(ref_logprobs_BT.shape)} must have one shape"
        )
    log_r = (ref_logprobs_BT.detach().to(torch.float32) - logprobs_BT.to(torch.float32)).clamp(
        -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT
    )
    if estimator == "k1":
        return -log_r
    if estimator == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ConfigError(f"unknown KL estimator {estimator!r}; known: k1, k3")


def truncated_is_weights(old_logprobs_BT: torch.Tensor, sampling_logprobs_BT: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance-sampling weights ``min(pi_old / pi_behavior, cap)`` per token, without gradient.

    Yao et al. 2025 (https://fengyao.notion.site/off-policy-rl, "truncated importance sampling", cap 2 there);
    IMPALA's truncated weights ``min(rho_bar, pi / mu)`` (arXiv:1802.01561, section 4.1).

    Args:
        old_logprobs_BT: ``(B, T)`` log pi_old(token): the trainer's own logprobs before this update.
        sampling_logprobs_BT: ``(B, T)`` log pi_behavior(token): the policy that sampled (the gateway's logprobs).
        cap: ``C > 0``, the largest weight.

    Returns:
        ``(B, T)`` float32 weights in ``(0, cap]``; the log-ratio is clamped to ``[-20, 20]`` before ``exp``.

    Raises:
        ConfigError: shapes differ, or ``cap <= 0``.
    """
    if old_logprobs_BT.shape != sampling_logprobs_BT.shape:
        raise ConfigError(
            f"old_logprobs {tuple(old_logprobs_BT.shape)} and sampling_logprobs "
            f"{tuple(sampling_logprobs_BT.shape)} must have one shape"
        )
    if not cap > 0:
        raise ConfigError(f"the truncation cap must be > 0, got {cap}")
    with torch.no_grad():
        log_w = old_logprobs_BT.to(torch.float32) - sampling_logprobs_BT.to(torch.float32)
        return torch.exp(log_w.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)).clamp(max=cap)


def rollout_mean_weights(rollout_ids_N: Sequence[Hashable], loss_tokens_N: Sequence[int]) -> list[float]:
    """Per-token weight of each training sample under ``rollout_mean``: ``1 / (R * N_r)``.

    ``R`` is the number of distinct rollouts among those with at least one trained token, and ``N_r`` the trained
    tokens of the sample's rollout summed over all its samples. Compute it once over the whole batch and pass each
    micro-batch its slice (as ``token_weights_B`` of :func:`ppo_clip_loss`). Each rollout's total weight,
    ``sum over its samples of weight * tokens``, is ``1 / R`` however it was split.

    Args:
        rollout_ids_N: ``(N,)`` the rollout of each sample.
        loss_tokens_N: ``(N,)`` trained tokens of each sample (>= 0).

    Returns:
        ``(N,)`` weights; 0.0 for samples of a rollout with no trained token.

    Raises:
        ConfigError: lengths differ, or a count is negative.
    """
    if len(rollout_ids_N) != len(loss_tokens_N):
        raise ConfigError(
            f"got {len(rollout_ids_N)} rollout ids but {len(loss_tokens_N)} token counts; give one per sample"
        )
    tokens_by_rollout: dict[Hashable, int] = {}
    for rollout_id, n in zip(rollout_ids_N, loss_tokens_N, strict=True):
        if n < 0:
            raise ConfigError(f"loss token counts must be >= 0, got {n} for rollout {rollout_id}")
        tokens_by_rollout[rollout_id] = tokens_by_rollout.get(rollout_id, 0) + n
    n_rollouts = sum(1 for n in tokens_by_rollout.values() if n > 0)
    return [1.0 / (n_rollouts * tokens_by_rollout[r]) if tokens_by_rollout[r] > 0 else 0.0 for r in rollout_ids_N]


def aggregate_token_losses(
    loss_BT: torch.Tensor,
    loss_mask_BT: torch.Tensor,
    aggregation: Aggregation,
    *,
    normalizer: float | None = None,
    token_weights_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to a scalar (aggregations in the module docstring).

    - ``token_mean``: ``sum_{b,t} m * loss / normalizer``; ``normalizer`` defaults to the masked tokens here.
    - ``sequence_mean``: ``sum_b (sum_t m * loss / n_b) / normalizer``, ``n_b`` the masked tokens of row b;
      ``normalizer`` defaults to the rows with at least one masked token.
    - ``rollout_mean``: ``sum_{b,t} w_b * m * loss``, with ``w_b`` from :func:`rollout_mean_weights` (required;
      already normalized, so ``normalizer`` must be None).

    Args:
        loss_BT: ``(B, T)`` per-token losses; values outside the mask are ignored, including non-finite ones.
        loss_mask_BT: ``(B, T)`` 1 (or True) on trained tokens.
        aggregation: ``token_mean``, ``sequence_mean`` or ``rollout_mean``.
        normalizer: the denominator of the first two; pass the whole batch's count for a micro-batch.
        token_weights_B: ``(B,)`` per-token weight of each row, for ``rollout_mean``.

    Returns:
        A float32 scalar (0 with a zero gradient when nothing is masked).

    Raises:
        ConfigError: shapes differ, unknown aggregation, ``normalizer <= 0``, or ``token_weights_B`` missing
            (``rollout_mean``) or given where it is not used, or a ``normalizer`` with ``rollout_mean``.
    """
    if loss_BT.shape != loss_mask_BT.shape or loss_BT.dim() != 2:
        raise ConfigError(f"loss {tuple(loss_BT.shape)} and loss_mask {tuple(loss_mask_BT.shape)} must both be (B, T)")
    if aggregation not in AGGREGATIONS:
        raise ConfigError(f"unknown aggregation {aggregation!r}; known: {', '.join(sorted(AGGREGATIONS))}")
    if normalizer is not None and not normalizer > 0:
        raise ConfigError(f"normalizer must be > 0, got {normalizer}")
    if aggregation == "rollout_mean":
        if token_weights_B is None:
            raise ConfigError(
                "rollout_mean needs token_weights_B: compute rollout_mean_weights(rollout_ids, loss_tokens) over "
                "the whole batch and pass each micro-batch its rows"
            )
        if normalizer is not None:
            raise ConfigError("rollout_mean weights are already normalized; pass normalizer=None")
        if token_weights_B.shape != loss_BT.shape[:1]:
            raise ConfigError(f"token_weights must be (B,) = ({loss_BT.shape[0]},), got {tuple(token_weights_B.shape)}")
    elif token_weights_B is not None:
        raise ConfigError(f"token_weights_B is only used by rollout_mean, not {aggregation}")

    mask = loss_mask_BT.to(torch.bool)
    mask_f = mask.to(torch.float32)
    # where, not multiply: a masked-out inf or nan must not turn into nan
    masked = torch.where(mask, loss_BT.to(torch.float32), torch.zeros((), dtype=torch.float32, device=loss_BT.device))
    if aggregation == "token_mean":
        denominator = float(normalizer) if normalizer is not None else max(float(mask_f.sum().item()), 1.0)
        return masked.sum() / denominator
    if aggregation == "sequence_mean":
        tokens_B = mask_f.sum(dim=1)
        per_sequence = masked.sum(dim=1) / tokens_B.clamp(min=1.0)
        n_sequences = max(float((tokens_B > 0).sum().item()), 1.0)
        denominator = float(normalizer) if normalizer is not None else n_sequences
        return per_sequence.sum() / denominator
    assert token_weights_B is not None
    return (masked.sum(dim=1) * token_weights_B.to(torch.float32).to(masked.device)).sum()


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
        kl_reference: mean of the chosen estimator of KL(pi || pi_ref); NaN without a reference.
        tis_weight_mean: mean truncated importance weight (1.0 without truncated importance sampling).
        tis_truncated_fraction: share of masked tokens whose weight the cap lowered (0.0 without it).
        sampling_kl: the same k3 estimator between the sampler and the trainer, ``d - 1 - log d`` with ``d =
            pi_trainer / pi_sampling`` (``pi_trainer``: ``old_logprobs`` when given, else the logprobs of this
            forward): how far the serving engine's logprobs sit from the trainer's. Without truncated importance
            sampling it equals ``approx_kl``; with it ``approx_kl`` is 0 by construction (the ratio is anchored at
            the trainer's own logprobs) and this is the figure to watch.
    """

    clip_fraction: float
    approx_kl: float
    ratio_mean: float
    n_loss_tokens: int
    kl_reference: float = math.nan
    tis_weight_mean: float = 1.0
    tis_truncated_fraction: float = 0.0
    sampling_kl: float = 0.0


def _same_shape(name: str, tensor: torch.Tensor | None, shape: torch.Size) -> None:
    if tensor is not None and tensor.shape != shape:
        raise ConfigError(f"{name} {tuple(tensor.shape)} must be (B, T) = {tuple(shape)} like logprobs")


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
    token_weights_B: torch.Tensor | None = None,
    old_logprobs_BT: torch.Tensor | None = None,
    tis_cap: float | None = None,
    ref_logprobs_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
) -> tuple[torch.Tensor, PPOClipStats]:
    """PPO-clip loss, per token, aggregated over the masked tokens.

    Per masked token t of sequence b, with ``ratio = exp(logprobs - anchor)``, ``anchor = old_logprobs`` when given
    and ``sampling_logprobs`` otherwise, and ``A = advantages[b]``::

        loss_t = w_t * -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) + kl_coef * kl_t

    ``w_t = min(exp(old_logprobs - sampling_logprobs), tis_cap)`` with ``tis_cap`` (truncated importance sampling,
    :func:`truncated_is_weights`), else 1; ``kl_t = kl_penalty(logprobs, ref_logprobs, kl_estimator)`` with
    ``ref_logprobs``, else 0. Then :func:`aggregate_token_losses`.

    Args:
        logprobs_BT: ``(B, T)`` log pi(token) under the policy being trained; carries the gradient. Any float
            dtype; the math runs in float32.
        sampling_logprobs_BT: ``(B, T)`` log pi_behavior(token) under the policy that sampled (the gateway's
            logprobs; no gradient). Without ``old_logprobs_BT`` it is also pi_old, the ratio's anchor.
        advantages_B: ``(B,)`` one advantage per sequence, or ``(B, T)`` one per token (GAE,
            :mod:`agentbolt.algorithms.rl.ppo_gae`); per-token values outside the mask are ignored.
        loss_mask_BT: ``(B, T)`` 1 (or True) on trained tokens, 0 elsewhere; values outside the mask are ignored,
            including non-finite ones.
        clip_low: ``eps_low`` in ``[0, 1)``: the ratio's lower clip is ``1 - clip_low``.
        clip_high: ``eps_high >= 0``: the ratio's upper clip is ``1 + clip_high`` (DAPO's clip-higher: 0.28).
        aggregation: ``token_mean``, ``sequence_mean`` or ``rollout_mean`` (module docstring).
        normalizer: the denominator of ``token_mean``/``sequence_mean``; pass the whole batch's count when this
            call sees one micro-batch of it.
        token_weights_B: ``(B,)`` per-token weight of each row for ``rollout_mean`` (:func:`rollout_mean_weights`).
        old_logprobs_BT: ``(B, T)`` log pi_old(token): the trainer's logprobs before this update (no gradient).
        tis_cap: truncate the importance weight ``pi_old / pi_behavior`` at this value (> 0); needs
            ``old_logprobs_BT``. ``None``: no importance weight.
        ref_logprobs_BT: ``(B, T)`` log pi_ref(token) under a reference policy; needed when ``kl_coef != 0``.
        kl_coef: ``beta >= 0``, the KL penalty's weight.
        kl_estimator: ``k1`` or ``k3`` (:func:`kl_penalty`).

    Returns:
        ``(loss, stats)``: a float32 scalar tensor (0 with a zero gradient when nothing is masked) and
        :class:`PPOClipStats`.

    Raises:
        ConfigError: mismatched shapes, clip bounds out of range, an unknown aggregation or KL estimator,
            ``normalizer <= 0``, ``tis_cap`` without ``old_logprobs_BT`` or ``<= 0``, ``kl_coef < 0`` or
            ``kl_coef > 0`` without ``ref_logprobs_BT``, or a ``token_weights_B`` problem
            (:func:`aggregate_token_losses`).
    """
    shape = logprobs_BT.shape
    if sampling_logprobs_BT.shape != shape or loss_mask_BT.shape != shape:
        raise ConfigError(
            f"logprobs {tuple(shape)}, sampling_logprobs {tuple(sampling_logprobs_BT.shape)} and "
            f"loss_mask {tuple(loss_mask_BT.shape)} must all be (B, T)"
        )
    if logprobs_BT.dim() != 2 or advantages_B.shape not in (shape[:1], shape):
        raise ConfigError(
            f"advantages must be (B,) = ({shape[0]},) or (B, T) = {tuple(shape)} for (B, T) logprobs, got "
            f"{tuple(advantages_B.shape)}"
        )
    _same_shape("old_logprobs", old_logprobs_BT, shape)
    _same_shape("ref_logprobs", ref_logprobs_BT, shape)
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ConfigError(f"need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if tis_cap is not None and old_logprobs_BT is None:
        raise ConfigError(
            "tis_cap needs old_logprobs_BT (the trainer's logprobs before the update): the importance weight is "
            "pi_old / pi_behavior"
        )
    if not kl_coef >= 0.0:
        raise ConfigError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0.0 and ref_logprobs_BT is None:
        raise ConfigError(f"kl_coef={kl_coef} needs ref_logprobs_BT (the reference policy's logprobs)")
    if kl_estimator not in ("k1", "k3"):
        raise ConfigError(f"unknown KL estimator {kl_estimator!r}; known: k1, k3")

    mask = loss_mask_BT.to(torch.bool)
    mask_f = mask.to(torch.float32)
    zero = torch.zeros((), dtype=torch.float32, device=logprobs_BT.device)
    if advantages_B.dim() == 1:
        advantages = advantages_B.to(torch.float32).unsqueeze(1)  # (B, 1)
    else:  # per-token advantages (GAE); outside the mask they are ignored
        advantages = torch.where(mask, advantages_B.to(torch.float32), zero)  # (B, T)
    anchor = old_logprobs_BT if old_logprobs_BT is not None else sampling_logprobs_BT
    log_ratio = logprobs_BT.to(torch.float32) - anchor.to(torch.float32).detach()
    log_ratio = torch.where(mask, log_ratio, zero).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)  # (B, T)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    loss_BT = -torch.minimum(unclipped, clipped)

    tis_w: torch.Tensor | None = None
    if tis_cap is not None:
        assert old_logprobs_BT is not None
        tis_w = torch.where(mask, truncated_is_weights(old_logprobs_BT, sampling_logprobs_BT, tis_cap), zero)
        loss_BT = tis_w * loss_BT
    kl_BT: torch.Tensor | None = None
    if ref_logprobs_BT is not None:
        # mask the inputs, not only the output, so a masked-out inf cannot send a NaN into the gradient
        kl_BT = kl_penalty(
            torch.where(mask, logprobs_BT.to(torch.float32), zero),
            torch.where(mask, ref_logprobs_BT.to(torch.float32), zero),
            kl_estimator,
        )
        if kl_coef > 0.0:
            loss_BT = loss_BT + kl_coef * kl_BT

    loss = aggregate_token_losses(loss_BT, mask, aggregation, normalizer=normalizer, token_weights_B=token_weights_B)

    with torch.no_grad():
        n_tokens = int(mask.sum().item())
        count = max(n_tokens, 1)
        clipped_away = ((advantages > 0) & (ratio > 1.0 + clip_high)) | ((advantages < 0) & (ratio < 1.0 - clip_low))
        tis_mean, tis_truncated = 1.0, 0.0
        trainer_lp = (old_logprobs_BT if old_logprobs_BT is not None else logprobs_BT).to(torch.float32)
        served = torch.where(mask, trainer_lp - sampling_logprobs_BT.to(torch.float32), zero)
        served = served.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        if tis_w is not None and tis_cap is not None and old_logprobs_BT is not None:
            raw = old_logprobs_BT.to(torch.float32) - sampling_logprobs_BT.to(torch.float32)
            tis_mean = float((tis_w * mask_f).sum().item()) / count if n_tokens else 1.0
            tis_truncated = float(((raw > math.log(tis_cap)) & mask).sum().item()) / count
        stats = PPOClipStats(
            clip_fraction=float((clipped_away & mask).sum().item()) / count,
            approx_kl=float((((ratio - 1.0) - log_ratio) * mask_f).sum().item()) / count,
            ratio_mean=float((ratio * mask_f).sum().item()) / count,
            n_loss_tokens=n_tokens,
            kl_reference=float(kl_BT.sum().item()) / count if kl_BT is not None else math.nan,
            tis_weight_mean=tis_mean,
            tis_truncated_fraction=tis_truncated,
            sampling_kl=float((((torch.exp(served) - 1.0) - served) * mask_f).sum().item()) / count,
        )
    return loss, stats
