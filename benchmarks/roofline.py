"""The machine side of benchmarks/generation.py: memory read bandwidth, the weight bytes a decode step reads, and
the linear-layer probe (the model's matrices through the embedded backend's own packed kernels), with the floor of a
level's work in linears alone. See generation.py's docstring (roofline, linear roofline) for what each figure means."""

from __future__ import annotations

import gc
import json
import math
import statistics
import struct
import time
from pathlib import Path
from typing import Any


def measure_bandwidth(threads: int, gib: float, repeats: int) -> dict[str, Any]:
    """Read bandwidth (``.sum()`` of a float32 tensor) and copy bandwidth (``copy_``, read + written bytes), GB/s."""
    import torch

    torch.set_num_threads(threads)
    n = max(1, int(gib * 2**30) // 4)
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page of both before timing
    src.sum()
    reads: list[float] = []
    copies: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        src.sum()
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - started)
    nbytes = n * 4
    del src, dst
    gc.collect()
    return {
        "bandwidth_bytes": nbytes,
        "bandwidth_repeats": repeats,
        "read_gb_s": round(nbytes / statistics.median(reads) / 1e9, 2),
        "read_gb_s_max": round(nbytes / min(reads) / 1e9, 2),
        "copy_gb_s": round(2 * nbytes / statistics.median(copies) / 1e9, 2),
    }


def _tensor_headers(directory: Path) -> tuple[bool, list[tuple[str, dict[str, Any]]]]:
    """Whether the model ties its embeddings (``config.json``), and ``(name, header entry)`` of every tensor in the
    safetensors headers of ``directory`` (dtype, shape, data_offsets), files in name order."""
    config = json.loads((directory / "config.json").read_text())
    tensors: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(directory.glob("*.safetensors")):
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        tensors += [(name, info) for name, info in header.items() if name != "__metadata__"]
    return bool(config.get("tie_word_embeddings", False)), tensors


def weight_bytes(directory: Path) -> dict[str, Any]:
    """Bytes of weights one decode step reads, from the safetensors headers of ``directory``: as stored, and as the
    embedded backend serves them (packed matrices in ``packed_linear.compute_dtype()``)."""
    import torch

    from agentbolt.inference import packed_linear

    served_itemsize = torch.empty((), dtype=packed_linear.compute_dtype()).element_size()
    tied, tensors = _tensor_headers(directory)
    total = served = 0
    input_embedding = served_input_embedding = 0
    for name, info in tensors:
        size = info["data_offsets"][1] - info["data_offsets"][0]
        numel = math.prod(info["shape"])
        packed = info["dtype"] == "BF16" and len(info["shape"]) == 2 and numel >= packed_linear.MIN_PACKED_ELEMENTS
        served_size = numel * served_itemsize if packed else size
        total += size
        served += served_size
        if name.endswith("embed_tokens.weight"):
            input_embedding += size
            served_input_embedding += served_size
    return {
        "weight_bytes_total": total,
        "weight_bytes_per_step": total if tied else total - input_embedding,
        "served_dtype": str(packed_linear.compute_dtype()).removeprefix("torch."),
        "served_weight_bytes_per_step": served if tied else served - served_input_embedding,
        "tied_embeddings": tied,
    }


PREFILL_PROBE_ROWS = 64
"""Prompt ids in one pass of the linear-floor probe's prefill figure (about one admission of a few calc questions)."""


def _weight_shapes(directory: Path) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """The (out, in) shapes of the matrices a decode step multiplies (the packed 2-D bf16 weights of
    ``model.safetensors``, the input embedding left out) and the output projection's shape (the tied embedding's
    when the embeddings are tied)."""
    from agentbolt.inference import packed_linear

    tied, tensors = _tensor_headers(directory)
    shapes: list[tuple[int, int]] = []
    head: tuple[int, int] | None = None
    for name, info in tensors:
        shape = info["shape"]
        if len(shape) != 2 or math.prod(shape) < packed_linear.MIN_PACKED_ELEMENTS:
            continue
        if name.endswith("lm_head.weight") or (tied and name.endswith("embed_tokens.weight")):
            head = (int(shape[0]), int(shape[1]))
        elif not name.endswith("embed_tokens.weight"):
            shapes.append((int(shape[0]), int(shape[1])))
    return shapes, head


def measure_linear_floor(
    directory: Path, threads: int, rows: list[int], prefill_rows: int, repeats: int
) -> dict[str, Any]:
    """The linear-layer floor of a step: time of one pass of ``r`` rows through every matrix of the model (random
    weights of the model's shapes, packed once in ``packed_linear.compute_dtype()`` with the embedded backend's own
    kernel pair, ``torch.ops.mkldnn._reorder_linear_weight`` then ``_linear_pointwise``), median of ``repeats``.

    Returns ``linear_step_ms`` (rows -> ms of a decode step's linears, output projection included),
    ``linear_roofline_tokens_per_s`` (rows -> rows / that time: a decode step's tokens/s if it did nothing but its
    matrix products, so an upper bound that counts compute, unlike the bandwidth roofline) and
    ``prefill_ms_per_token`` (the linears of ``prefill_rows`` prompt ids in one pass, output projection left out as
    prefill runs it on the last position only, per id), and what those times mean for the hardware:
    ``linear_gflops`` (rows -> 2 * rows * (sum of out * in over the matrices) / time, 1e9 FLOP/s; the matrix
    products' arithmetic rate), ``linear_read_gb_s`` (rows -> bytes of the packed weights / time: the read
    bandwidth that pass used, to set beside the measured bandwidth; well below it means the pass is bound by
    compute, not memory) and ``prefill_gflops`` (the prefill pass's rate)."""
    import torch

    from agentbolt.inference import packed_linear

    torch.set_num_threads(threads)
    dtype = packed_linear.compute_dtype()
    shapes, head = _weight_shapes(directory)
    generator = torch.Generator().manual_seed(0)

    def packed(shape: tuple[int, int]) -> Any:
        weight = (torch.randn(shape, generator=generator) * 0.02).to(dtype)
        return torch.ops.mkldnn._reorder_linear_weight(weight, packed_linear.BATCH_HINT)

    body = [(shape[1], packed(shape)) for shape in shapes]
    head_packed = None if head is None else (head[1], packed(head))

    def step(n: int, with_head: bool) -> float:
        matrices = body + ([head_packed] if with_head and head_packed else [])
        inputs = {width: torch.randn((n, width), generator=generator).to(dtype) for width, _ in matrices}
        passes: list[float] = []
        for _ in range(repeats + 1):  # the first pass warms the kernels for this row count
            started = time.perf_counter()
            for width, weight in matrices:
                torch.ops.mkldnn._linear_pointwise(inputs[width], weight, None, "none", [], "")
            passes.append(time.perf_counter() - started)
        return statistics.median(passes[1:])

    step_ms = {str(n): round(1000 * step(n, True), 2) for n in rows}
    prefill_ms = 1000 * step(prefill_rows, False) / prefill_rows
    body_elements = sum(out * width for out, width in shapes)
    step_elements = body_elements + (head[0] * head[1] if head is not None else 0)
    element_bytes = torch.empty((), dtype=dtype).element_size()
    return {
        "linear_dtype": str(dtype).removeprefix("torch."),
        "linear_matrices": len(shapes) + (head is not None),
        "linear_step_ms": step_ms,
        "linear_roofline_tokens_per_s": {n: round(int(n) / ms * 1000, 1) for n, ms in step_ms.items()},
        "prefill_rows": prefill_rows,
        "prefill_ms_per_token": round(prefill_ms, 3),
        "linear_gflops": {n: round(2 * step_elements * int(n) / ms / 1e6, 1) for n, ms in step_ms.items()},
        "linear_read_gb_s": {n: round(step_elements * element_bytes / ms / 1e6, 2) for n, ms in step_ms.items()},
        "prefill_gflops": round(2 * body_elements / prefill_ms / 1e6, 1),
    }


def linear_floor_fields(roof: dict[str, Any], line: dict[str, Any], delta: dict[str, float] | None) -> dict[str, Any]:
    """A gateway level's ``linear_floor_s`` (:func:`linear_floor_s` of its decode steps and prefilled ids),
    ``linear_floor_tokens_per_s`` (its generated tokens over that) and ``linear_floor_share`` (that over its wall
    time: the part of the level that was matrix products at the probe's speed); and
    ``full_batch_roofline_tokens_per_s``: the level's generated tokens over the time its work would take with every
    decode step full (``concurrency`` rows, :func:`full_batch_floor_s`), what the level could give with no ramp, no
    drain and nothing but matrix products. Every field is ``None`` without ``delta`` (an arm whose stats do not
    count decode steps and prefilled ids)."""
    floor = (
        None
        if delta is None
        else linear_floor_s(roof, int(delta["decode_rows"]), int(delta["decode_steps"]), int(delta["prefill_tokens"]))
    )
    if delta is None or not floor:
        return dict.fromkeys(
            ("linear_floor_s", "linear_floor_tokens_per_s", "linear_floor_share", "full_batch_roofline_tokens_per_s")
        )
    decoded = max(0, int(line["generated_tokens"]) - int(line["requests"]))  # a request's first id: its prefill pass
    full = full_batch_floor_s(roof, int(line["concurrency"]), decoded, int(delta["prefill_tokens"]))
    return {
        "linear_floor_s": round(floor, 3),
        "linear_floor_tokens_per_s": round(line["generated_tokens"] / floor, 1),
        "linear_floor_share": round(floor / line["wall_s"], 3) if line["wall_s"] else None,
        "full_batch_roofline_tokens_per_s": round(line["generated_tokens"] / full, 1) if full else None,
    }


def full_batch_floor_s(roof: dict[str, Any], concurrency: int, decoded_tokens: int, prefill_tokens: int) -> float:
    """Seconds the linears alone need for ``decoded_tokens`` (generated tokens after each request's first, which
    comes out of its prefill) in steps of ``concurrency`` full rows
    (``decoded_tokens / concurrency`` steps at the probe's ``linear_step_ms`` of that row count) plus
    ``prefill_tokens`` prompt ids at its per-id prefill cost: a compute roofline for the level's own mix of prefill
    and decode (0.0 without a probe at that row count)."""
    step_ms = roof["linear_step_ms"].get(str(concurrency))
    if step_ms is None or concurrency <= 0:
        return 0.0
    return (decoded_tokens / concurrency * step_ms + prefill_tokens * roof["prefill_ms_per_token"]) / 1000


def linear_floor_s(roof: dict[str, Any], decode_rows: int, decode_steps: int, prefill_tokens: int) -> float | None:
    """Seconds the linears alone need for a level's work: ``decode_steps`` steps of ``decode_rows / decode_steps``
    rows each (the step time interpolated linearly between the measured row counts) plus ``prefill_tokens`` ids at
    the measured per-id prefill cost; ``None`` without decode steps."""
    if not decode_steps:
        return None
    points = sorted((int(n), ms) for n, ms in roof["linear_step_ms"].items())
    mean_rows = decode_rows / decode_steps
    below = [p for p in points if p[0] <= mean_rows] or points[:1]
    above = [p for p in points if p[0] >= mean_rows] or points[-1:]
    (n0, t0), (n1, t1) = below[-1], above[0]
    step_ms = t0 if n1 == n0 else t0 + (t1 - t0) * (mean_rows - n0) / (n1 - n0)
    return (decode_steps * step_ms + prefill_tokens * roof["prefill_ms_per_token"]) / 1000
