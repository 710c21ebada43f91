"""``agentbolt serve --adapter OUT/checkpoints/step-N``: a real server process serves the trained policy.

The checkpoint is written the way a run writes it (``TorchPolicyTrainer.save_state`` + ``checkpoint.json``), with LoRA
``B`` set to random values large enough to change greedy decoding. Pinned: the served greedy tokens are the argmax
tokens of the base model with the adapter merged (teacher-forced in this process, bf16 tolerance), they are not those
of the base model, calls carry the checkpoint's weights version, and bad options are refused with exit code 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.serve_process import start_serve

pytestmark = pytest.mark.slow


def _write_checkpoint(smollm2_dir: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora

    config = TorchTrainerConfig(lora_r=4, lora_alpha=8)
    policy = attach_lora(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16), config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    TorchPolicyTrainer(policy, config, pad_token_id=0).save_state(folder)
    meta = {
        "format": 1,
        "step": 3,
        "model": "smollm2-135m",
        "base_model_dir": str(smollm2_dir),
        "model_version": "step-3",
        "val_accuracy": None,
        "created_at": 0.0,
        "loop": {},
    }
    (folder / "checkpoint.json").write_text(json.dumps(meta))


def _gaps(model_dir: Path, adapter: Path | None, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """For each served token: max logit minus the token's logit (0 when it is the argmax), teacher-forced."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentbolt.algorithms.rl.weight_sync import apply_adapter

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    if adapter is not None:
        apply_adapter(model, adapter)
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()  # (len(token_ids), V)
    picked = logits.gather(1, torch.tensor(token_ids).unsqueeze(1)).squeeze(1)
    return (logits.max(dim=1).values - picked).tolist()


def _plain_protocols(url: str) -> dict[str, Any]:
    """The server's plain /v1 through the real ``openai`` and ``anthropic`` clients: each protocol answers, streams
    several deltas, and the plain Responses route refuses ``previous_response_id``."""
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    ant = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    ask = "Name three colours."
    found: dict[str, Any] = {}
    found["responses_text"] = oai.responses.create(model="m", input=ask, max_output_tokens=12).output_text
    found["completions_text"] = oai.completions.create(model="m", prompt="Red, green and", max_tokens=8).choices[0].text
    with oai.responses.stream(model="m", input=ask, max_output_tokens=12, temperature=0) as events:
        found["responses_deltas"] = sum(e.type == "response.output_text.delta" for e in events)
    chunks = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": ask}], max_tokens=12, temperature=0, stream=True
    )
    found["chat_deltas"] = sum(bool(c.choices and c.choices[0].delta.content) for c in chunks)
    with ant.messages.stream(model="m", max_tokens=12, messages=[{"role": "user", "content": ask}]) as stream:
        found["messages_deltas"] = sum(1 for _ in stream.text_stream)
    messages: Any = [{"role": "user", "content": ask}]
    found["input_tokens"] = ant.messages.count_tokens(model="m", messages=messages).input_tokens
    try:
        oai.responses.create(model="m", input=ask, max_output_tokens=4, previous_response_id="resp_x")
        found["previous_refused"] = ""
    except openai.BadRequestError as exc:
        found["previous_refused"] = str(exc)
    return found


def test_serve_adapter_serves_the_merged_policy(
    tmp_path: Path, smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = tmp_path / "run" / "checkpoints" / "step-3"
    _write_checkpoint(smollm2_dir, checkpoint)
    monkeypatch.setenv("AGENTBOLT_CACHE", str(smollm2_dir.parent.parent))
    proc, url = start_serve(
        *("--store", f"sqlite:///{tmp_path / 's.db'}", "--create", "--port", "0", "--adapter", str(checkpoint)),
        timeout_s=120,
    )
    try:
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "model": "smollm2-135m",
                "messages": [{"role": "user", "content": "Name three colours."}],
                "max_tokens": 16,
                "temperature": 0,
            },
            timeout=120,
        ).json()
        # an llm resources version points runners' agents at this server (agentbolt run uses the latest one)
        from agentbolt.client.sync_store import SyncHttpLightningStore

        store = SyncHttpLightningStore(url)
        latest = store.get_resources()
        for _ in range(100):
            if latest is not None:
                break
            time.sleep(0.1)
            latest = store.get_resources()
        store.close()
        plain = _plain_protocols(url)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert plain["responses_text"] and plain["completions_text"] is not None
    # streamed token by token: several text deltas per answer (was: the whole answer in one chunk)
    assert plain["responses_deltas"] >= 3 and plain["messages_deltas"] >= 3 and plain["chat_deltas"] >= 3, plain
    assert plain["input_tokens"] > 5
    assert "previous_response_id" in plain["previous_refused"]
    # recorded nowhere: the store has no span of these calls
    import sqlite3

    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("SELECT COUNT(*) FROM spans").fetchone()[0] == 0
    assert latest is not None and latest.resources["llm"].endpoint == f"{url}/v1"  # type: ignore[union-attr]
    assert latest.resources["llm"].model == "smollm2-135m"  # type: ignore[union-attr]
    assert reply["system_fingerprint"] == "step-3"
    prompt_ids, token_ids = reply["prompt_token_ids"], reply["choices"][0]["token_ids"]
    assert len(token_ids) >= 4
    merged = _gaps(smollm2_dir, checkpoint, prompt_ids, token_ids)
    base = _gaps(smollm2_dir, None, prompt_ids, token_ids)
    assert max(merged) < 0.5, merged  # greedy under the merged policy (bf16 noise between batched and single runs)
    assert max(base) > 1.0, base  # and not what the base model would have said


def test_serve_adapter_refusals(tmp_path: Path, smollm2_dir: Path) -> None:
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentbolt.cli.main", "serve", "--port", "0", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    empty = tmp_path / "empty"
    empty.mkdir()
    result = serve("--adapter", str(empty))
    assert result.returncode == 2 and "holds no LoRA adapter" in result.stdout + result.stderr
    checkpoint = tmp_path / "run" / "checkpoints" / "step-3"
    _write_checkpoint(smollm2_dir, checkpoint)
    # folders next to a checkpoint: the error names the one to give
    for near in (tmp_path / "run", tmp_path / "run" / "checkpoints"):
        result = serve("--adapter", str(near))
        said = " ".join((result.stdout + result.stderr).split())
        assert result.returncode == 2 and "not one checkpoint" in said and f"--adapter {checkpoint}" in said, said
    result = serve("--adapter", str(smollm2_dir))  # a whole model folder: --model FOLDER
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2 and f"serve it with --model {smollm2_dir}" in said, said
    result = serve("--adapter", str(checkpoint), "--model", "qwen2.5-0.5b")
    assert result.returncode == 2 and "was trained from 'smollm2-135m'" in result.stdout + result.stderr
    result = serve("--adapter", str(checkpoint), "--backend", "vllm", "--backend-url", "http://127.0.0.1:1/v1")
    assert result.returncode == 2 and "needs the embedded backend" in result.stdout + result.stderr
