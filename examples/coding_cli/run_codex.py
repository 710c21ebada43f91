"""Run the Codex CLI (``@openai/codex`` from npm, unchanged) against the agentbolt gateway on one tiny coding task,
then report what the store recorded and how much of it is trainable.

Run from the repository root (needs Node/npm; no network beyond npm for the first install)::

    .venv/bin/python -m examples.coding_cli.run_codex
    .venv/bin/python -m examples.coding_cli.run_codex --task "Create hello.txt containing hi" --max-tokens 256

Steps: install the CLI into a cache folder if missing (``npm install --prefix``); start ``agentbolt serve`` (a
subprocess, SQLite store, the embedded model); publish a resources version whose ``llm`` enforces the sampling
settings (temperature, a ``max_tokens`` cap per call: Codex sends none); enqueue one rollout, claim it and mark its
attempt running, as a runner would; run ``codex exec`` in a fresh temporary folder with its model provider pointed
at the attempt's gateway URL over the Responses API (``wire_api = "responses"``); score the folder (reward 1 when
``hello.txt`` holds ``hi``), close the attempt, and read the spans back: LLM calls OK / ERROR, trainable
transitions (:func:`agentbolt.adapter.trajectory.build_trajectory`), whether each call's response token ids decode
to its recorded text, which later prompts extend earlier ones token for token, and the training samples
:func:`agentbolt.adapter.samples.merge_transitions` makes of them with equal advantages.

Codex settings beyond the provider: ``--disable multi_agent`` and ``-c web_search="disabled"`` drop the two tools
the gateway cannot serve (a ``namespace`` tool group and the hosted ``web_search`` tool); ``--json`` prints Codex's
events, read here to say what it did; retries are off so that every call in the store is one Codex made once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentbolt import semconv
from agentbolt.adapter.samples import merge_transitions
from agentbolt.adapter.trajectory import build_trajectory
from agentbolt.client import SyncHttpLightningStore
from agentbolt.types import LLM, AttemptStatus, Span, Transition

CODEX_PACKAGE = "@openai/codex"
CODEX_VERSION = "0.171.0"
"""The version this example was run with (``codex-cli 0.171.0``); ``--codex-version latest`` tries the newest."""
DEFAULT_TASK = (
    'Call the exec_command tool with the arguments {"cmd": "echo hi > hello.txt"} and no others. Then answer done.'
)
"""Spelled out for a 0.5B model: asked "Create hello.txt containing hi", Qwen2.5-Coder-0.5B answers with a JSON block
in text (no tool call) and the run ends after one call."""
PROVIDER = "agentbolt"
KEY_ENV = "AGENTBOLT_GATEWAY_KEY"


@dataclass
class CallCheck:
    """One recorded LLM call (one ``agentbolt.llm_call`` span) and the checks made on it."""

    sequence_id: int
    status: str
    prompt_tokens: int = 0
    response_tokens: int = 0
    decodes_to_text: bool | None = None
    extends_previous: bool | None = None
    divergence: str | None = None
    error: str | None = None
    response_preview: str = ""


@dataclass
class Report:
    """What one run did and what it left in the store (printed, and written to ``OUT/report.json``)."""

    cli: str
    command: list[str]
    rollout_id: str
    attempt_id: str
    llm_calls: int = 0
    ok_calls: int = 0
    error_calls: int = 0
    codex_errors: list[str] = field(default_factory=list)
    trainable_transitions: int = 0
    samples_after_merge: int = 0
    tokens_unmerged: int = 0
    tokens_merged: int = 0
    reward: float = 0.0
    exit_code: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    codex_did: list[str] = field(default_factory=list)
    folder: dict[str, str] = field(default_factory=dict)
    calls: list[CallCheck] = field(default_factory=list)


def install_codex(cache_dir: Path, version: str) -> Path:
    """The ``codex`` launcher in ``cache_dir/codex-<version>``, installed there with npm when missing."""
    prefix = cache_dir / f"codex-{version}"
    binary = prefix / "node_modules" / ".bin" / "codex"
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("npm is not on PATH; install Node.js 20+ to run the Codex CLI")
        prefix.mkdir(parents=True, exist_ok=True)
        print(f"installing {CODEX_PACKAGE}@{version} into {prefix} ...", flush=True)
        subprocess.run(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", f"{CODEX_PACKAGE}@{version}"],
            check=True,
        )
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(out_dir: Path, model: str, port: int, timeout_s: float = 600.0) -> subprocess.Popen[bytes]:
    """``agentbolt serve`` on ``127.0.0.1:port`` with ``out_dir/store.db``, its log in ``out_dir/server.log``;
    returns once ``/v1/health`` answers (the model is loaded before the server listens)."""
    agentbolt = Path(sys.executable).with_name("agentbolt")
    command = [str(agentbolt), "serve", "--store", f"sqlite:///{out_dir / 'store.db'}", "--create", "--model", model]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    log = (out_dir / "server.log").open("wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"agentbolt serve exited with {server.returncode}; see {out_dir / 'server.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=2.0).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(1.0)
    server.terminate()
    raise SystemExit(f"agentbolt serve did not answer within {timeout_s:.0f} s; see {out_dir / 'server.log'}")


def codex_command(codex: Path, base_url: str, model: str, work_dir: Path, task: str) -> list[str]:
    """``codex exec`` with a model provider at ``base_url`` (Responses API) and nothing else changed but the two
    tools the gateway cannot serve and the retries."""
    provider = f"model_providers.{PROVIDER}"
    settings = [
        f"{provider}.name=agentbolt",
        f"{provider}.base_url={base_url}",
        f"{provider}.wire_api=responses",
        f"{provider}.env_key={KEY_ENV}",
        f"{provider}.request_max_retries=0",
        f"{provider}.stream_max_retries=0",
        f"{provider}.stream_idle_timeout_ms=3600000",  # a CPU prefill of the ~6k-token prompt takes minutes
        f"model_provider={PROVIDER}",
        'web_search="disabled"',
    ]
    command = [str(codex), "exec", "--json", "--skip-git-repo-check", "--ephemeral", "--color", "never"]
    command += ["--sandbox", "workspace-write", "--disable", "multi_agent", "-m", model, "-C", str(work_dir)]
    for setting in settings:
        command += ["-c", setting]
    return [*command, task]


def run_codex(command: list[str], codex_home: Path, out_dir: Path, timeout_s: float) -> tuple[int | None, bool]:
    """Run Codex with its stdin closed; events to ``out_dir/codex.jsonl``, stderr to ``out_dir/codex.stderr``.
    Returns ``(exit code or None, timed out)``."""
    codex_home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CODEX_HOME": str(codex_home), KEY_ENV: "unused", "NO_COLOR": "1"}
    with (out_dir / "codex.jsonl").open("wb") as events, (out_dir / "codex.stderr").open("wb") as errors:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=events, stderr=errors, env=env)
        try:
            return process.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
            return None, True


def codex_actions(events_path: Path) -> tuple[list[str], list[str]]:
    """What Codex did, one line per completed item of its ``--json`` events (commands, file changes, messages), and
    the errors it reported (a request the gateway refused with a 4xx is one: such requests leave no span)."""
    actions: list[str] = []
    errors: list[str] = []
    for line in events_path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        item = event.get("item") or {}
        if event.get("type") in ("error", "turn.failed"):
            errors.append(f"{event['type']}: {json.dumps(event.get('error') or event.get('message'))[:300]}")
        if event.get("type") != "item.completed":
            continue
        kind = item.get("type") or item.get("item_type")
        if kind == "command_execution":
            output = (item.get("aggregated_output") or "").strip().replace("\n", " | ")
            actions.append(f"ran {item.get('command')!r} -> exit {item.get('exit_code')}: {output[:120]!r}")
        elif kind == "file_change":
            actions.append(f"changed files: {[(c.get('kind'), c.get('path')) for c in item.get('changes') or []]}")
        elif kind == "error":
            errors.append(f"error item: {item.get('message')!r}")
        elif kind in ("agent_message", "reasoning"):
            actions.append(f"{kind}: {(item.get('text') or item.get('message') or '')[:200]!r}")
        else:
            actions.append(f"{kind}: {json.dumps(item)[:200]}")
    return actions, errors


def folder_contents(work_dir: Path, limit_bytes: int = 200) -> dict[str, str]:
    """Every file Codex left in ``work_dir`` (relative path -> its first bytes as text)."""
    return {
        str(path.relative_to(work_dir)): path.read_bytes()[:limit_bytes].decode(errors="replace")
        for path in sorted(work_dir.rglob("*"))
        if path.is_file()
    }


def check_calls(spans: list[Span], transitions: list[Transition], tokenizer: Any) -> list[CallCheck]:
    """One :class:`CallCheck` per LLM span: response ids decoded (special tokens kept, then the end-of-turn token
    stripped) against the recorded response text, and whether the prompt starts with an earlier OK call's prompt
    + response (the extension property that lets :func:`merge_transitions` merge them)."""
    by_span = {t.span_id: t for t in transitions}
    checks: list[CallCheck] = []
    previous: Transition | None = None
    for span in spans:
        if span.name != semconv.SPAN_LLM_CALL:
            continue
        attributes = span.attributes
        check = CallCheck(span.sequence_id, span.status.code if span.status.code != "UNSET" else "OK")
        if check.status == "ERROR":
            check.error = str(attributes.get(semconv.LLM_ERROR) or span.status.description)
            checks.append(check)
            continue
        prompt_ids = list(attributes.get(semconv.LLM_PROMPT_TOKEN_IDS) or [])
        response_ids = list(attributes.get(semconv.LLM_RESPONSE_TOKEN_IDS) or [])
        text = str(attributes.get(semconv.LLM_RESPONSE_TEXT) or "")
        check.prompt_tokens, check.response_tokens = len(prompt_ids), len(response_ids)
        check.response_preview = text[:160]
        decoded = tokenizer.decode(response_ids, skip_special_tokens=False)
        end = tokenizer.eos_token or ""
        check.decodes_to_text = decoded == text or (bool(end) and decoded.removesuffix(end) == text)
        transition = by_span.get(span.span_id)
        if previous is not None:
            earlier = previous.prompt_token_ids + previous.response_token_ids
            check.extends_previous = prompt_ids[: len(earlier)] == earlier
            if not check.extends_previous:
                check.divergence = _divergence(earlier, prompt_ids, tokenizer)
        previous = transition or previous
        checks.append(check)
    return checks


def _divergence(earlier: list[int], later: list[int], tokenizer: Any, context: int = 12) -> str:
    """Where ``later`` stops repeating ``earlier``: the first differing token position and a few tokens of each."""
    at = next(
        (i for i, (a, b) in enumerate(zip(earlier, later, strict=False)) if a != b), min(len(earlier), len(later))
    )
    start = max(0, at - context)
    was = tokenizer.decode(earlier[start : at + context], skip_special_tokens=False)
    now = tokenizer.decode(later[start : at + context], skip_special_tokens=False)
    return f"token {at}: earlier prompt + response {was!r}, this prompt {now!r}"


def run(args: argparse.Namespace) -> Report:
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "store.db").unlink(missing_ok=True)
    codex = install_codex(Path(args.cache).expanduser(), args.codex_version)
    version = subprocess.run([str(codex), "--version"], capture_output=True, text=True, check=True).stdout.strip()
    port = free_port()
    print(f"starting agentbolt serve on port {port} with {args.model} ...", flush=True)
    server = start_server(out_dir, args.model, port)
    store = SyncHttpLightningStore(f"http://127.0.0.1:{port}")
    try:
        sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
        llm = LLM(endpoint=f"http://127.0.0.1:{port}/v1", model=args.model, sampling_parameters=sampling)
        resources = store.add_resources({"llm": llm.model_copy(update={"sampling_enforced": True})})
        rollout = store.enqueue_rollout(
            {"task": args.task}, resources_id=resources.resources_id, metadata={"task_id": "codex-hello"}
        )
        claimed = store.claim_rollout("codex-cli")
        assert claimed is not None and claimed.rollout.rollout_id == rollout.rollout_id
        attempt_id = claimed.attempt.attempt_id
        store.update_attempt(rollout.rollout_id, attempt_id, AttemptStatus.RUNNING)
        base_url = llm.for_attempt(rollout.rollout_id, attempt_id).endpoint

        work_dir = Path(tempfile.mkdtemp(prefix="codex-task-"))
        command = codex_command(codex, base_url, args.model, work_dir, args.task)
        report = Report(
            cli=f"{CODEX_PACKAGE} ({version})", command=command, rollout_id=rollout.rollout_id, attempt_id=attempt_id
        )
        print("running:", " ".join(command), flush=True)
        started = time.monotonic()
        report.exit_code, report.timed_out = run_codex(command, out_dir / "codex-home", out_dir, args.timeout_s)
        report.wall_s = round(time.monotonic() - started, 1)
        report.codex_did, report.codex_errors = codex_actions(out_dir / "codex.jsonl")
        report.folder = folder_contents(work_dir)
        report.reward = 1.0 if report.folder.get("hello.txt", "").strip().lower() == "hi" else 0.0
        status = AttemptStatus.FAILED if report.timed_out else AttemptStatus.SUCCEEDED
        error = {"message": f"codex exec ran past {args.timeout_s} s"} if report.timed_out else None
        store.update_attempt(rollout.rollout_id, attempt_id, status, error=error, final_reward=report.reward)

        spans = store.query_spans(rollout.rollout_id, attempt_id)
        trajectory = build_trajectory(store.get_rollout(rollout.rollout_id), attempt_id, spans)
        transitions = trajectory.transitions
        from transformers import AutoTokenizer  # the served model's tokenizer (after the server prepared it)

        from agentbolt.inference.model_files import prepared_path

        tokenizer = AutoTokenizer.from_pretrained(str(prepared_path(args.model)))
        report.calls = check_calls(sorted(spans, key=lambda s: s.sequence_id), transitions, tokenizer)
        report.llm_calls = len(report.calls)
        report.ok_calls = sum(c.status == "OK" for c in report.calls)
        report.error_calls = sum(c.status == "ERROR" for c in report.calls)
        report.trainable_transitions = len(transitions)
        if transitions:
            samples = merge_transitions(transitions, [1.0] * len(transitions), rollout.rollout_id)
            report.samples_after_merge = len(samples)
            report.tokens_unmerged = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in transitions)
            report.tokens_merged = sum(len(s.input_ids) for s in samples)
        shutil.rmtree(work_dir, ignore_errors=True)
        return report
    finally:
        store.close()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def format_report(report: Report) -> str:
    lines = [
        f"CLI: {report.cli}",
        "command: " + " ".join(json.dumps(part) if " " in part else part for part in report.command),
        f"rollout {report.rollout_id} attempt {report.attempt_id}; exit code {report.exit_code}"
        + (" (timed out)" if report.timed_out else "")
        + f"; wall {report.wall_s} s",
        f"LLM calls recorded: {report.llm_calls} (OK {report.ok_calls}, ERROR {report.error_calls})",
        f"trainable transitions: {report.trainable_transitions}; samples after merging (equal advantages): "
        f"{report.samples_after_merge} ({report.tokens_unmerged} tokens unmerged -> {report.tokens_merged} merged)",
        f"reward (hello.txt holds 'hi'): {report.reward}",
        "calls:",
    ]
    for check in report.calls:
        if check.status == "ERROR":
            lines.append(f"  #{check.sequence_id} ERROR {check.error}")
            continue
        lines.append(
            f"  #{check.sequence_id} OK prompt {check.prompt_tokens} + response {check.response_tokens} tokens; "
            f"ids decode to the recorded text: {check.decodes_to_text}; extends the previous call: "
            f"{check.extends_previous}; text: {check.response_preview!r}"
        )
        if check.divergence:
            lines.append(f"     diverges at {check.divergence}")
    lines.append("what Codex did:")
    lines += [f"  {action}" for action in report.codex_did] or ["  (no completed items)"]
    lines.append("errors and warnings Codex reported (a refused request shows up only here):")
    lines += [f"  {error}" for error in report.codex_errors] or ["  (none)"]
    lines.append(f"folder afterwards: {report.folder or '(empty)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--task", default=DEFAULT_TASK, help="the prompt given to codex exec")
    parser.add_argument("--model", default="qwen2.5-0.5b", help="embedded model (32k context; smollm2's 8k is short)")
    parser.add_argument("--max-tokens", type=int, default=256, help="generated-token cap of every call")
    parser.add_argument("--temperature", type=float, default=0.2, help="sampling temperature of every call")
    parser.add_argument("--timeout-s", type=float, default=2400.0, help="wall-clock limit of codex exec")
    parser.add_argument("--codex-version", default=CODEX_VERSION, help="npm version of @openai/codex")
    cache = Path(os.environ.get("AGENTBOLT_CACHE", "~/.cache/agentbolt")) / "cli"
    parser.add_argument("--cache", default=str(cache), help="where the CLI is installed")
    parser.add_argument("--out", default="runs/coding_cli", help="store.db, logs, Codex events and report.json")
    args = parser.parse_args(argv)
    report = run(args)
    text = format_report(report)
    print(text)
    out_dir = Path(args.out)
    (out_dir / "report.json").write_text(json.dumps(report, default=lambda o: o.__dict__, indent=2))
    (out_dir / "report.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
