"""Weight-push bookkeeping: byte-exact buckets, the version ledger, vLLM's control requests (fake transport, CPU)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from agentbolt.algorithms.rl.weight_sync_plan import (
    ParamSpec,
    PushStatus,
    WeightVersionLedger,
    bucket_tensors,
    param_spec,
    plan_buckets,
    run_push,
)
from agentbolt.errors import BackendError, ConfigError, ConflictError
from agentbolt.inference.vllm import AnnouncedBucket, VLLMWeightPushClient


def weights() -> dict[str, torch.Tensor]:
    return {
        "a": torch.zeros(2, 3, dtype=torch.float32),  # 6 * 4 = 24 bytes
        "b": torch.zeros(4, dtype=torch.bfloat16),  # 4 * 2 = 8
        "c": torch.zeros(10, dtype=torch.float32),  # 10 * 4 = 40 (> 32: alone)
        "d": torch.zeros(1, dtype=torch.int64),  # 8
        "e": torch.zeros(3, dtype=torch.float16),  # 6
    }


def test_param_spec_counts_bytes() -> None:
    assert param_spec("a", weights()["a"]) == ParamSpec("a", "float32", (2, 3), 24)
    assert param_spec("b", weights()["b"]) == ParamSpec("b", "bfloat16", (4,), 8)


def test_buckets_are_greedy_ordered_and_byte_exact() -> None:
    # a (24) + b (8) = 32 fits exactly; c (40) is alone and oversized; d (8) + e (6) = 14.
    buckets = plan_buckets(weights(), max_bucket_bytes=32)
    assert [(b.index, b.names, b.nbytes, b.oversized) for b in buckets] == [
        (0, ["a", "b"], 32, False),
        (1, ["c"], 40, True),
        (2, ["d", "e"], 14, False),
    ]
    assert buckets[0].dtype_names == ["float32", "bfloat16"]
    assert buckets[0].shapes == [[2, 3], [4]]
    # One byte less: b no longer fits next to a.
    assert [b.names for b in plan_buckets(weights(), max_bucket_bytes=31)] == [["a"], ["b"], ["c"], ["d", "e"]]
    # Everything in one bucket; the same plan from the specs alone.
    specs = [param_spec(n, t) for n, t in weights().items()]
    assert [b.names for b in plan_buckets(specs, max_bucket_bytes=86)] == [["a", "b", "c", "d", "e"]]
    assert plan_buckets(specs, 32) == plan_buckets(weights(), 32)
    assert plan_buckets({}, 32) == []


def test_plan_refuses_bad_input() -> None:
    with pytest.raises(ConfigError, match="max_bucket_bytes must be >= 1"):
        plan_buckets(weights(), 0)
    spec = ParamSpec("a", "float32", (1,), 4)
    with pytest.raises(ConfigError, match="appears twice"):
        plan_buckets([spec, spec], 8)


def test_bucket_tensors_checks_announced_specs() -> None:
    w = weights()
    first = plan_buckets(w, 32)[0]
    assert [name for name, _ in bucket_tensors(w, first)] == ["a", "b"]
    w["b"] = torch.zeros(4, dtype=torch.float32)
    with pytest.raises(ConfigError, match=r"b: announced bfloat16\[4\] but the tensor is float32\[4\]"):
        bucket_tensors(w, first)
    del w["a"]
    with pytest.raises(ConfigError, match="no such tensor"):
        bucket_tensors(w, first)


def test_ledger_orders_versions_and_records_outcomes() -> None:
    ledger = WeightVersionLedger()
    assert ledger.loaded_version("vllm-0") is None
    ledger.begin("vllm-0", 1, buckets_total=2)
    with pytest.raises(ConflictError, match="version 1 is still being pushed"):
        ledger.begin("vllm-0", 2, 2)
    ledger.bucket_applied("vllm-0", 1)
    with pytest.raises(ConflictError, match="only 1 of 2 buckets"):
        ledger.finish("vllm-0", 1)
    ledger.bucket_applied("vllm-0", 1)
    with pytest.raises(ConflictError, match="all applied"):
        ledger.bucket_applied("vllm-0", 1)
    ledger.finish("vllm-0", 1)
    assert ledger.loaded_version("vllm-0") == 1
    with pytest.raises(ConflictError, match="already holds version 1"):
        ledger.begin("vllm-0", 1, 2)
    with pytest.raises(ConflictError, match="older version 0 is out of order"):
        ledger.begin("vllm-0", 0, 2)
    # Version 3 is interrupted: the engine holds a mix, 2 is now out of order, 3 may be retried.
    ledger.begin("vllm-0", 3, 2)
    ledger.bucket_applied("vllm-0", 3)
    ledger.interrupt("vllm-0", 3, "connection reset")
    assert ledger.loaded_version("vllm-0") is None
    with pytest.raises(ConflictError, match="version 3 was attempted last"):
        ledger.begin("vllm-0", 2, 2)
    ledger.begin("vllm-0", 3, 0)
    ledger.finish("vllm-0", 3)
    assert ledger.loaded_version("vllm-0") == 3
    assert ledger.versions("vllm-0", PushStatus.APPLIED) == [1, 3]
    assert ledger.versions("vllm-0", PushStatus.INTERRUPTED) == [3]
    interrupted = ledger.history("vllm-0")[1]
    assert (interrupted.buckets_done, interrupted.reason) == (1, "connection reset")
    # Engines are independent; bad arguments and unknown pushes are refused.
    ledger.begin("vllm-1", 0, 1)
    with pytest.raises(ConflictError, match="no push of version 5"):
        ledger.finish("vllm-1", 5)
    with pytest.raises(ConfigError, match=">= 0"):
        ledger.begin("vllm-2", -1, 1)


def test_run_push_records_applied_and_interrupted() -> None:
    ledger = WeightVersionLedger()
    buckets = plan_buckets(weights(), 32)
    sent: list[int] = []
    record = run_push(ledger, "e", 1, buckets, lambda b: sent.append(b.index))
    assert sent == [0, 1, 2] and record.status is PushStatus.APPLIED and record.buckets_done == 3

    def fail_on_second(bucket: object) -> None:
        if getattr(bucket, "index", None) == 1:
            raise RuntimeError("nccl timeout")

    with pytest.raises(RuntimeError, match="nccl timeout"):
        run_push(ledger, "e", 2, buckets, fail_on_second)
    last = ledger.history("e")[-1]
    assert (last.status, last.buckets_done, last.reason) == (
        PushStatus.INTERRUPTED,
        1,
        "bucket 1: RuntimeError: nccl timeout",
    )
    with pytest.raises(ConflictError, match="duplicate"):
        run_push(ledger, "e", 1, buckets, lambda b: None)


def fake_vllm(requests: list[tuple[str, str, object]], fail_update: int | None = None) -> httpx.MockTransport:
    """A vLLM server's weight-transfer routes that record each request; ``fail_update``: the n-th update fails."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        requests.append((request.method, request.url.path, body))
        if request.url.path == "/get_world_size":
            return httpx.Response(200, json={"world_size": 2})
        updates = sum(1 for _, path, _ in requests if path == "/update_weights")
        if request.url.path == "/update_weights" and updates == fail_update:
            return httpx.Response(500, text="worker died")
        if request.url.path in {"/pause", "/resume", "/update_weights", "/init_weight_transfer_engine"}:
            return httpx.Response(200, json={})
        return httpx.Response(404)

    return httpx.MockTransport(handle)


def test_vllm_push_sends_one_update_per_bucket() -> None:
    requests: list[tuple[str, str, object]] = []
    client = VLLMWeightPushClient("http://vllm:8000/", transport=fake_vllm(requests))
    ledger = WeightVersionLedger()
    buckets = plan_buckets(weights(), 32)
    broadcast: list[list[str]] = []

    def send(bucket: AnnouncedBucket) -> None:
        broadcast.append(bucket.names)

    assert client.world_size() == 2
    client.pause()
    run_push(ledger, client.server_url, 7, buckets, lambda b: client.push_bucket(b, send))
    client.resume()
    client.close()
    assert broadcast == [["a", "b"], ["c"], ["d", "e"]]
    assert [path for _, path, _ in requests] == [
        "/get_world_size",
        "/pause",
        "/update_weights",
        "/update_weights",
        "/update_weights",
        "/resume",
    ]
    assert requests[2][2] == {
        "update_info": {
            "names": ["a", "b"],
            "dtype_names": ["float32", "bfloat16"],
            "shapes": [[2, 3], [4]],
            "packed": True,
        }
    }
    assert ledger.loaded_version("http://vllm:8000") == 7


def test_vllm_push_failure_interrupts_the_version() -> None:
    requests: list[tuple[str, str, object]] = []
    client = VLLMWeightPushClient("http://vllm:8000", transport=fake_vllm(requests, fail_update=2))
    ledger = WeightVersionLedger()
    with pytest.raises(BackendError, match="answered 500: worker died"):
        run_push(ledger, "vllm", 1, plan_buckets(weights(), 32), lambda b: client.push_bucket(b, lambda _: None))
    record = ledger.history("vllm")[-1]
    assert (record.status, record.buckets_done) == (PushStatus.INTERRUPTED, 1)
    plain = VLLMWeightPushClient("http://vllm:8000", transport=httpx.MockTransport(lambda _: httpx.Response(404)))
    with pytest.raises(BackendError, match="no /pause route; start it with VLLM_SERVER_DEV_MODE=1"):
        plain.pause()
