"""Bookkeeping of a weight push from the trainer to inference engines (vLLM): buckets and a version ledger. Pure.

Pushing weights to a separate engine (vLLM docs, "Weight Transfer": ``init_weight_transfer_engine`` once, then per
sync ``update_weights`` calls that each announce names, dtypes and shapes before the bytes are broadcast) needs:

1. **What to send**: HF-named full tensors, e.g. :func:`agentbolt.algorithms.rl.weight_sync.merged_lora_weights`.
2. **Buckets** (:func:`plan_buckets`): the tensors cut into groups of at most ``max_bucket_bytes`` each, in the
   given order (a model's ``named_parameters()`` order, the same on every rank), each tensor whole; a tensor
   bigger than the limit travels alone. One bucket is one ``update_weights`` call, so the peak extra memory of a
   push is about one bucket on each side. vLLM requires the announced metadata and the sent tensors to agree one
   for one ("the two WeightSource channels must agree"); :func:`bucket_tensors` checks that before anything is sent.
3. **A version ledger** (:class:`WeightVersionLedger`): per engine, which trainer version it holds, which pushes
   were fully applied and which were interrupted (the engine then holds a mix of two versions until a push of
   that version or a newer one completes).

:func:`run_push` ties them together around any push function (the GPU-only vLLM one is
:func:`agentbolt.inference.vllm.push_weight_buckets`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from agentbolt.errors import ConfigError, ConflictError


@dataclass(frozen=True)
class ParamSpec:
    """What an engine is told about one tensor before its bytes arrive.

    Attributes:
        name: the parameter's name in the serving (HF) model, e.g. ``model.layers.0.self_attn.q_proj.weight``.
        dtype_name: torch dtype without the ``torch.`` prefix (``bfloat16``), vLLM's ``dtype_names`` entry.
        shape: the full (unsharded) shape.
        nbytes: ``numel * element_size``, bytes on the wire.
    """

    name: str
    dtype_name: str
    shape: tuple[int, ...]
    nbytes: int


def param_spec(name: str, tensor: torch.Tensor) -> ParamSpec:
    """The :class:`ParamSpec` of ``tensor`` (``nbytes = numel * element_size``)."""
    return ParamSpec(
        name=name,
        dtype_name=str(tensor.dtype).removeprefix("torch."),
        shape=tuple(int(d) for d in tensor.shape),
        nbytes=tensor.numel() * tensor.element_size(),
    )


@dataclass(frozen=True)
class WeightBucket:
    """One group of tensors pushed together (one ``update_weights`` call).

    Attributes:
        index: position in the plan, from 0.
        params: the tensors' specs, in push order.
        oversized: True when the bucket holds one tensor bigger than ``max_bucket_bytes``.
    """

    index: int
    params: tuple[ParamSpec, ...]
    oversized: bool = False

    @property
    def names(self) -> list[str]:
        """Parameter names, in push order."""
        return [p.name for p in self.params]

    @property
    def dtype_names(self) -> list[str]:
        """dtype names, in push order (vLLM ``update_info["dtype_names"]``)."""
        return [p.dtype_name for p in self.params]

    @property
    def shapes(self) -> list[list[int]]:
        """Shapes, in push order (vLLM ``update_info["shapes"]``)."""
        return [list(p.shape) for p in self.params]

    @property
    def nbytes(self) -> int:
        """Total bytes of the bucket."""
        return sum(p.nbytes for p in self.params)


def plan_buckets(
    weights: Mapping[str, torch.Tensor] | Sequence[ParamSpec], max_bucket_bytes: int
) -> list[WeightBucket]:
    """Cut ``weights`` into buckets of at most ``max_bucket_bytes``, keeping their order.

    Greedy and stable: a tensor joins the current bucket while the bucket's bytes plus its own stay within the
    limit, else it starts the next bucket; a tensor bigger than the limit gets a bucket of its own (``oversized``).
    The same input always gives the same plan, so every trainer rank computes the same one.

    Args:
        weights: ``name -> tensor`` (only shapes and dtypes are read) or their :class:`ParamSpec` list, in push
            order.
        max_bucket_bytes: the byte limit of one bucket (>= 1).

    Returns:
        Buckets in order; concatenating their names gives the input names in order. Empty input -> ``[]``.

    Raises:
        ConfigError: ``max_bucket_bytes < 1`` or a name appears twice.
    """
    if max_bucket_bytes < 1:
        raise ConfigError(f"max_bucket_bytes must be >= 1, got {max_bucket_bytes}")
    specs = (
        [param_spec(name, tensor) for name, tensor in weights.items()]
        if isinstance(weights, Mapping)
        else list(weights)
    )
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ConfigError(f"parameter {spec.name!r} appears twice; each tensor is pushed once")
        seen.add(spec.name)
    groups: list[list[ParamSpec]] = []
    used = 0
    for spec in specs:
        if groups and groups[-1] and used + spec.nbytes <= max_bucket_bytes:
            groups[-1].append(spec)
            used += spec.nbytes
        else:
            groups.append([spec])
            used = spec.nbytes
    return [
        WeightBucket(index=k, params=tuple(group), oversized=len(group) == 1 and group[0].nbytes > max_bucket_bytes)
        for k, group in enumerate(groups)
    ]


def bucket_tensors(weights: Mapping[str, torch.Tensor], bucket: WeightBucket) -> list[tuple[str, torch.Tensor]]:
    """The bucket's ``(name, tensor)`` pairs in push order, checked against what the bucket announces.

    Raises:
        ConfigError: a tensor is missing, or its dtype or shape differs from the bucket's spec (the engine would
            split the byte stream differently: vLLM docs, "the two WeightSource channels must agree").
    """
    pairs: list[tuple[str, torch.Tensor]] = []
    for spec in bucket.params:
        if spec.name not in weights:
            raise ConfigError(f"bucket {bucket.index} announces {spec.name!r} but the weights have no such tensor")
        actual = param_spec(spec.name, weights[spec.name])
        if actual != spec:
            raise ConfigError(
                f"{spec.name}: announced {spec.dtype_name}{list(spec.shape)} but the tensor is "
                f"{actual.dtype_name}{list(actual.shape)}; re-plan the buckets from the tensors being sent"
            )
        pairs.append((spec.name, weights[spec.name]))
    return pairs


class PushStatus(StrEnum):
    """The state of one push of one version to one engine."""

    IN_PROGRESS = "in_progress"
    """Buckets are being sent; the engine holds a mix of versions."""
    APPLIED = "applied"
    """Every bucket arrived; the engine serves this version."""
    INTERRUPTED = "interrupted"
    """The push stopped early; the engine holds a mix of versions until a later push completes."""


@dataclass
class PushRecord:
    """One push of ``version`` to ``engine``.

    Attributes:
        engine: the engine's name (e.g. its URL).
        version: the trainer version pushed (the train step, >= 0).
        buckets_total / buckets_done: the plan's bucket count and how many were applied.
        status: see :class:`PushStatus`.
        reason: why it was interrupted.
    """

    engine: str
    version: int
    buckets_total: int
    buckets_done: int = 0
    status: PushStatus = PushStatus.IN_PROGRESS
    reason: str | None = None


@dataclass
class WeightVersionLedger:
    """Which trainer version each inference engine holds, and the history of pushes to it. Thread-safe.

    Rules (per engine): one push at a time; a push's version must be newer than the last applied one (equal:
    duplicate; older: out of order), and not older than the last attempted one; the version of an interrupted
    push may be pushed again. :meth:`finish` requires every bucket to have been applied.
    """

    _records: dict[str, list[PushRecord]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, engine: str, version: int, buckets_total: int) -> PushRecord:
        """Start pushing ``version`` (``buckets_total`` buckets) to ``engine``.

        Raises:
            ConfigError: ``version < 0`` or ``buckets_total < 0``.
            ConflictError: a push to this engine is in progress, or ``version`` is a duplicate or out of order.
        """
        if version < 0 or buckets_total < 0:
            raise ConfigError(f"version and buckets_total must be >= 0, got {version} and {buckets_total}")
        with self._lock:
            history = self._records.setdefault(engine, [])
            if history and history[-1].status is PushStatus.IN_PROGRESS:
                raise ConflictError(
                    f"engine {engine}: version {history[-1].version} is still being pushed; finish or interrupt it "
                    f"before pushing version {version}"
                )
            applied = self._applied(history)
            if applied is not None and version == applied:
                raise ConflictError(f"engine {engine} already holds version {version}; a duplicate push is refused")
            if applied is not None and version < applied:
                raise ConflictError(
                    f"engine {engine} holds version {applied}; pushing older version {version} is out of order"
                )
            if history and version < history[-1].version:
                raise ConflictError(
                    f"engine {engine}: version {history[-1].version} was attempted last; pushing older version "
                    f"{version} is out of order (push {history[-1].version} or newer)"
                )
            record = PushRecord(engine, version, buckets_total)
            history.append(record)
            return record

    def bucket_applied(self, engine: str, version: int) -> PushRecord:
        """Count one more bucket of the push in progress as applied.

        Raises:
            ConflictError: no push of ``version`` is in progress on ``engine``, or every bucket was already counted.
        """
        with self._lock:
            record = self._in_progress(engine, version)
            if record.buckets_done >= record.buckets_total:
                raise ConflictError(
                    f"engine {engine}: version {version} has only {record.buckets_total} buckets, all applied"
                )
            record.buckets_done += 1
            return record

    def finish(self, engine: str, version: int) -> PushRecord:
        """Mark the push applied: ``engine`` now serves ``version``.

        Raises:
            ConflictError: no push of ``version`` is in progress, or not every bucket was applied (call
                :meth:`interrupt` instead).
        """
        with self._lock:
            record = self._in_progress(engine, version)
            if record.buckets_done != record.buckets_total:
                raise ConflictError(
                    f"engine {engine}: only {record.buckets_done} of {record.buckets_total} buckets of version "
                    f"{version} were applied; interrupt the push instead of finishing it"
                )
            record.status = PushStatus.APPLIED
            return record

    def interrupt(self, engine: str, version: int, reason: str) -> PushRecord:
        """Mark the push interrupted (the engine holds a mix of versions until a later push completes).

        Raises:
            ConflictError: no push of ``version`` is in progress on ``engine``.
        """
        with self._lock:
            record = self._in_progress(engine, version)
            record.status = PushStatus.INTERRUPTED
            record.reason = reason
            return record

    def loaded_version(self, engine: str) -> int | None:
        """The version ``engine`` serves; ``None`` if nothing was applied yet or the latest push did not complete
        (the weights are then a mix)."""
        with self._lock:
            history = self._records.get(engine, [])
            if not history or history[-1].status is not PushStatus.APPLIED:
                return None
            return history[-1].version

    def history(self, engine: str) -> list[PushRecord]:
        """Copies of the pushes to ``engine``, oldest first."""
        with self._lock:
            return [PushRecord(**vars(r)) for r in self._records.get(engine, [])]

    def versions(self, engine: str, status: PushStatus) -> list[int]:
        """Versions whose push to ``engine`` ended in ``status``, oldest first."""
        return [r.version for r in self.history(engine) if r.status is status]

    @staticmethod
    def _applied(history: list[PushRecord]) -> int | None:
        applied = [r.version for r in history if r.status is PushStatus.APPLIED]
        return applied[-1] if applied else None

    def _in_progress(self, engine: str, version: int) -> PushRecord:
        history = self._records.get(engine, [])
        if not history or history[-1].status is not PushStatus.IN_PROGRESS or history[-1].version != version:
            raise ConflictError(f"engine {engine}: no push of version {version} is in progress")
        return history[-1]


def run_push(
    ledger: WeightVersionLedger,
    engine: str,
    version: int,
    buckets: Sequence[WeightBucket],
    push_bucket: Callable[[WeightBucket], None],
) -> PushRecord:
    """Push ``buckets`` in order with ``push_bucket``, recording the push in ``ledger``.

    Returns:
        The applied record.

    Raises:
        ConflictError: the ledger refuses the version (nothing is pushed).
        Exception: whatever ``push_bucket`` raised; the push is then recorded as interrupted, with the error as
            reason and the buckets applied so far.
    """
    ledger.begin(engine, version, len(buckets))
    for bucket in buckets:
        try:
            push_bucket(bucket)
        except BaseException as error:
            ledger.interrupt(engine, version, f"bucket {bucket.index}: {type(error).__name__}: {error}")
            raise
        ledger.bucket_applied(engine, version)
    return ledger.finish(engine, version)
