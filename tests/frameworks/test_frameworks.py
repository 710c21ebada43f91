"""The framework examples (``examples/frameworks``) as integration tests: each agent, in its own environment, solves
calc tasks through the gateway of a real server serving the real SmolLM2-135M, and leaves trainable trajectories.

Setup: one ``agentbolt serve`` process (this environment: the server, the embedded backend, a SQLite store) for the
module. Each test enqueues two calc tasks and runs ``agentbolt run`` from ``.venv-frameworks/<name>`` (built by
``make framework-envs``: the frameworks' pins conflict, so each has its own environment, without torch), which exits
after two attempts. Pinned, for every framework:

- both rollouts succeed;
- every LLM call made went through the gateway and became a transition with prompt token ids, response token ids
  and one logprob per response token (no flag, no untrainable call, no traced call the gateway missed), and at
  least one request offered the calculator tool;
- the framework's instrumentor recorded the calls (tracer LLM spans of its OpenInference scope);
- every transition carries the agent name the framework gave the agent;
- the reward the agent emitted (one unnamed reward, 0 or 1: SmolLM2 rarely gets arithmetic right) is the
  trajectory's final reward and the rollout's.

A missing environment fails the test (never skips it): run ``make framework-envs``.
:func:`test_agents_change_only_the_base_url_and_the_reward` checks the agents' source: what ties each one to
agentbolt is the LLM resource's URL and one ``emit_reward`` line, each marked ``# agentbolt``.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from examples.calc_agent.tasks import Task, load_val_sets

from agentbolt import semconv
from agentbolt.adapter import build_trajectory
from agentbolt.client import SyncHttpLightningStore
from agentbolt.types import LLM, RolloutStatus, Span, Trajectory

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / ".venv-frameworks"
EXAMPLES = REPO / "examples" / "frameworks"
STAMP = ".agentbolt-installed"
RUNNER_TIMEOUT_S = 600.0
"""Generous: alone a framework runs its two tasks in 4-10 s, but with other work on the 2 cores CrewAI took >240 s."""
TASKS_PER_TEST = 2

OI_KIND = "openinference.span.kind"
OI_LLM = "LLM"
TEST_ENV = {
    # CrewAI's own telemetry and trace upload try to reach the internet; off, as any offline deployment sets them.
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OMP_NUM_THREADS": "2",
}


@dataclass(frozen=True)
class Framework:
    """One example: its folder under examples/frameworks, the agent names its calls must carry, and the
    OpenInference scopes (instrumentors) expected to record its LLM calls."""

    name: str
    agent_names: frozenset[str]
    llm_scopes: frozenset[str]


FRAMEWORKS = [
    Framework("openai_plain", frozenset({"calculator"}), frozenset({"openinference.instrumentation.openai"})),
    Framework("langgraph", frozenset({"solver"}), frozenset({"openinference.instrumentation.langchain"})),
    Framework(
        "openai_agents", frozenset({"calculator_agent"}), frozenset({"openinference.instrumentation.openai_agents"})
    ),
    Framework(
        "autogen", frozenset({"calculator_agent"}), frozenset({"openinference.instrumentation.autogen_agentchat"})
    ),
    # CrewAI 1.x calls the model with the openai client: the openai instrumentor records the calls, under the
    # CrewAI instrumentor's agent spans.
    Framework("crewai", frozenset({"Calculator"}), frozenset({"openinference.instrumentation.openai"})),
]


def _environment(name: str) -> Path:
    """The framework's environment; fails (never skips) when ``make framework-envs`` has not built it."""
    venv = ENVS / name
    if not (venv / STAMP).exists() or not (venv / "bin" / "agentbolt").exists():
        pytest.fail(
            f"the {name} example's environment {venv} is missing or incomplete: run `make framework-envs` "
            f"(or scripts/build_framework_env.sh {name})"
        )
    return venv


@pytest.fixture(scope="module")
def server_url(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``agentbolt serve`` with the embedded SmolLM2-135M and a SQLite store, on 127.0.0.1 and a free port."""
    folder = tmp_path_factory.mktemp("frameworks")
    cmd = [sys.executable, "-m", "agentbolt.cli.main", "serve", "--store", f"sqlite:///{folder / 'store.db'}"]
    cmd += ["--create", "--port", "0", "--model", "smollm2-135m"]
    env = {**os.environ, **TEST_ENV, "AGENTBOLT_CACHE": str(smollm2_dir.parent.parent), "PYTHONUNBUFFERED": "1"}
    env["COLUMNS"] = "200"
    log_path = folder / "serve.log"  # a file, not a pipe: a pipe nobody reads would block the server once full
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = None
        deadline = time.monotonic() + 180
        while url is None and time.monotonic() < deadline:
            assert proc.poll() is None, f"agentbolt serve exited early ({proc.returncode}): {log_path.read_text()}"
            found = re.search(r"serving on (http://127\.0\.0\.1:\d+)", log_path.read_text())
            url = found.group(1) if found else None
            time.sleep(0.2)
        assert url is not None, f"agentbolt serve did not report its URL: {log_path.read_text()[-2000:]}"
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)  # SIGINT may be ignored: a make run in the background ignores it
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@functools.cache
def _tasks() -> list[Task]:
    sets = load_val_sets(1)
    return [sets["rg_chain_sum"][0], sets["rg_basic_arithmetic"][0]][:TASKS_PER_TEST]


def _run_runner(venv: Path, framework: str, url: str, attempts: int) -> subprocess.CompletedProcess[str]:
    cmd = [str(venv / "bin" / "agentbolt"), "run", "--store", url, "--worker-id", f"runner-{framework}"]
    cmd += ["--agent", f"examples.frameworks.{framework}.agent:calc_agent", "--exit-after", str(attempts)]
    # no OPENAI_API_KEY: the agents need none, and with one the Agents SDK would upload its traces to OpenAI
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "OPENAI_API_KEY")}
    env.update(TEST_ENV, COLUMNS="200")
    try:
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"the {framework} runner did not end {attempts} attempts in {RUNNER_TIMEOUT_S:.0f} s: {out}{err}")


def _describe(spans: list[Span]) -> str:
    """The spans' names, kinds, scopes and agent-naming attributes, to show what a framework recorded."""
    keys = (OI_KIND, semconv.OTEL_SCOPE_NAME, "agent.name", "graph.node.id", "gen_ai.agent.name", "metadata")
    lines = []
    for s in spans:
        found = {k: str(s.attributes[k])[:160] for k in keys if k in s.attributes}
        lines.append(f"  #{s.sequence_id} {s.name} span={s.span_id[:8]} parent={(s.parent_id or '')[:8]} {found}")
    return "\n".join(lines)


@pytest.mark.parametrize("framework", FRAMEWORKS, ids=[f.name for f in FRAMEWORKS])
def test_framework_agent_leaves_trainable_trajectories(framework: Framework, server_url: str) -> None:
    venv = _environment(framework.name)
    tasks = _tasks()
    with SyncHttpLightningStore(server_url) as store:
        resources = store.add_resources({"llm": LLM(endpoint=server_url, model="smollm2")})
        rollouts = [
            store.enqueue_rollout(
                dict(task), resources_id=resources.resources_id, metadata={"task_id": task["task_id"]}
            )
            for task in tasks
        ]
        t0 = time.perf_counter()
        done = _run_runner(venv, framework.name, server_url, attempts=len(rollouts))
        elapsed = time.perf_counter() - t0
        runner_log = f"runner exit {done.returncode}; stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        assert done.returncode == 0, runner_log
        finished = store.wait_for_rollouts([r.rollout_id for r in rollouts], timeout_s=30)
        assert len(finished) == len(rollouts), runner_log

        trajectories: list[tuple[Trajectory, list[Span]]] = []
        for rollout in finished:
            attempts = store.query_attempts(rollout.rollout_id)
            errors = [a.error for a in attempts if a.error]
            assert rollout.status is RolloutStatus.SUCCEEDED, f"{errors}\n{runner_log}"
            spans = store.query_spans(rollout.rollout_id, attempts[-1].attempt_id)
            trajectories.append((build_trajectory(rollout, attempts[-1].attempt_id, spans), spans))
    print(f"{framework.name}: {len(rollouts)} rollouts in {elapsed:.1f} s (runner process included)")

    offered_tools = False
    for (trajectory, spans), rollout in zip(trajectories, finished, strict=True):
        recorded = _describe(spans)
        gateway = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        traced = [s for s in spans if s.attributes.get(OI_KIND) == OI_LLM]
        assert gateway, f"no LLM call reached the gateway:\n{recorded}"
        assert {s.attributes.get(semconv.OTEL_SCOPE_NAME) for s in traced} & framework.llm_scopes, (
            f"no LLM span from {sorted(framework.llm_scopes)}:\n{recorded}"
        )
        offered_tools |= any("calculator" in str(s.attributes.get(semconv.LLM_REQUEST_TOOLS, "")) for s in gateway)

        # every call is a trainable transition
        assert trajectory.trainable and not trajectory.flags, f"{trajectory.flags}:\n{recorded}"
        assert len(trajectory.transitions) == len(gateway) and trajectory.untrainable_calls == 0, recorded
        for transition in trajectory.transitions:
            assert transition.prompt_token_ids and transition.response_token_ids
            assert len(transition.sampling_logprobs) == len(transition.response_token_ids)
            assert all(logprob <= 0.0 for logprob in transition.sampling_logprobs)

        # named after the framework's agent, through the join of each traced call with the gateway's record of it
        names = {t.agent_name for t in trajectory.transitions}
        assert names == framework.agent_names, (
            f"{framework.name}: transitions named {names}, expected {set(framework.agent_names)} "
            f"({trajectory.tracer_only_calls} traced calls not joined to a gateway call); spans:\n{recorded}"
        )
        assert trajectory.tracer_only_calls == 0, recorded

        # the agent's reward: one unnamed reward span, 0 or 1, which is the trajectory's and the rollout's
        rewards = [s for s in spans if s.name == semconv.SPAN_REWARD]
        assert len(rewards) == 1 and semconv.REWARD_NAME not in rewards[0].attributes, recorded
        emitted = rewards[0].attributes[semconv.REWARD_VALUE]
        assert emitted in (0.0, 1.0)
        assert trajectory.final_reward == emitted == rollout.final_reward
        assert trajectory.intermediate_rewards == [(rewards[0].sequence_id, emitted)]
        assert rewards[0].sequence_id > max(s.sequence_id for s in gateway)  # scored after its last call
    assert offered_tools, f"no request of {framework.name} offered the calculator tool"


_ALLOWED_IMPORTS = {"LLM", "emit_reward"}
"""What an example agent may import from agentbolt: the resource's type and the reward call."""


@pytest.mark.parametrize("framework", FRAMEWORKS, ids=[f.name for f in FRAMEWORKS])
def test_agents_change_only_the_base_url_and_the_reward(framework: Framework) -> None:
    """An example agent is the framework's own code: its ties to agentbolt are the LLM resource's URL and one
    ``emit_reward``, on lines marked ``# agentbolt`` (the plain-openai agent also names its agent, marked optional),
    and its README lists what changed."""
    source = (EXAMPLES / framework.name / "agent.py").read_text()
    tree = ast.parse(source)
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "agentbolt"
        for alias in node.names
    }
    assert imported <= _ALLOWED_IMPORTS, f"imports {imported - _ALLOWED_IMPORTS} from agentbolt"
    lines = source.splitlines()
    uses = [
        line for line in lines if re.search(r"\bllm\.endpoint\b|\bemit_reward\(|\bagentbolt\.\w+\(", line.split("#")[0])
    ]
    assert sum("emit_reward(" in line for line in uses) == 1
    assert sum("llm.endpoint" in line for line in uses) == 1
    unmarked = [line.strip() for line in uses if "# agentbolt" not in line]
    assert not unmarked, f"agentbolt-specific lines without a '# agentbolt' marker: {unmarked}"
    readme = (EXAMPLES / framework.name / "README.md").read_text()
    assert "## What changed" in readme and "emit_reward" in readme and "base URL" in readme
