"""Fuzz the real ``agentbolt serve`` (SQLite store, no model) from its own OpenAPI document with schemathesis.

Every operation of ``/openapi.json`` gets its examples, the boundary values of each field (schemathesis' coverage
phase: ``5e-324``, ``2**63``, empty strings, wrong types...), a bounded number of generated requests, positive and
negative, and stateful sequences that follow the ids one answer gives to the next request, with a fixed seed. About
2,500 cases, under a minute on a 2-core machine. The test fails on:

- a 5xx, except the 503 a gateway route answers without an inference backend (``code: no_backend``, declared);
- an answered status code the document does not declare for the operation (``status_code_conformance``);
- an answer whose body or content type is not the declared one (``response_schema_conformance``,
  ``content_type_conformance``);
- an operation the run did not reach, or an error of schemathesis itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import schemathesis
from schemathesis.engine import Status, events, from_schema
from tests.integration.serve_process import start_serve

TOKEN = "fuzz-token"
MAX_EXAMPLES = 25
"""Generated requests per operation and generation mode in the fuzzing phase (the coverage phase adds its own)."""
SEED = 20_260_422
CHECKS = ("status_code_conformance", "content_type_conformance", "response_schema_conformance")
"""schemathesis' checks run on every answer; 5xx are judged by :func:`_server_error` instead of its own check."""
MIN_CASES = 1_000
"""Fewer generated cases than this means the run did not really fuzz (e.g. a phase silently skipped)."""


@dataclass
class _Run:
    cases: int = 0
    operations: set[str] = field(default_factory=set)
    failures: dict[tuple[str, str, int | None], str] = field(default_factory=dict)
    """``(operation, problem, status) -> one reproduction`` (curl command and message)."""
    errors: list[str] = field(default_factory=list)

    def fail(self, operation: str, problem: str, status: int | None, detail: str) -> None:
        self.failures.setdefault((operation, problem, status), detail)

    def report(self) -> str:
        lines = [f"{len(self.failures)} distinct failures in {self.cases} cases:"]
        for (operation, problem, status), detail in sorted(self.failures.items(), key=str):
            lines.append(f"- {operation}: {problem} ({status})\n    {detail}")
        lines += [f"- schemathesis error: {error}" for error in self.errors]
        return "\n".join(lines)


def _server_error(path: str, status: int, body: bytes | None) -> str | None:
    """Why a 5xx answer to a request for ``path`` is a failure; ``None`` for the documented 503 of a gateway route
    without a backend."""
    if status != 503 or not path.endswith(("/models", "/completions", "/responses", "/messages", "/count_tokens")):
        return f"server error {status}: {(body or b'')[:300]!r}"
    try:
        code = json.loads(body or b"{}").get("error", {}).get("code")
    except (ValueError, AttributeError):
        code = None
    if code != "no_backend" and b"has no inference backend" not in (body or b""):
        return f"503 that is not the gateway's no-backend answer: {(body or b'')[:300]!r}"
    return None


def _config() -> Any:
    phases = {"examples": True, "coverage": True, "fuzzing": True, "stateful": True}
    return schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "headers": {"Authorization": f"Bearer {TOKEN}"},
            "workers": 1,
            "continue-on-failure": True,
            "request-timeout": 30,
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
            "phases": {name: {"enabled": enabled} for name, enabled in phases.items()},
            "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
        }
    )


def _record(run: _Run, event: events.ScenarioFinished) -> None:
    recorder = event.recorder
    run.operations.add(recorder.label)
    run.cases += len(recorder.cases)
    for interaction in recorder.interactions.values():
        response = interaction.response
        if response is None or response.status_code < 500:
            continue
        request = interaction.request
        why = _server_error(urlsplit(request.uri).path, response.status_code, response.content)
        if why is not None:
            sent = f"{request.method} {request.uri} {(request.body or b'')[:300]!r}"
            run.fail(recorder.label, "not_a_server_error", response.status_code, f"{why}\n    {sent}")
    for case_id, checks in recorder.checks.items():
        for check in checks:
            if check.status != Status.FAILURE or check.failure_info is None:
                continue
            interaction = recorder.interactions.get(case_id)
            status = interaction.response.status_code if interaction and interaction.response else None
            failure = check.failure_info.failure
            detail = f"{failure.title}: {(failure.message or '')[:400]}\n    {check.failure_info.code_sample[:600]}"
            run.fail(recorder.label, check.name, status, detail)


def test_fuzzed_api_answers_only_documented_statuses(tmp_path: Path) -> None:
    proc, url = start_serve(
        "--store", f"sqlite:///{tmp_path / 'store.db'}", "--create", "--port", "0", "--token", TOKEN
    )
    started = time.monotonic()
    try:
        schema = schemathesis.openapi.from_url(
            f"{url}/openapi.json", config=_config(), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )
        documented = {f"{method.upper()} {path}" for path, ops in schema.raw_schema["paths"].items() for method in ops}
        run = _Run()
        for event in from_schema(schema).execute():
            if isinstance(event, events.ScenarioFinished):
                _record(run, event)
            elif isinstance(event, events.NonFatalError):
                run.errors.append(f"{event.label}: {event.info.format()[:600]}")
            elif isinstance(event, events.FatalError):
                run.errors.append(repr(event.exception))
    finally:
        proc.terminate()
        server_log = proc.communicate(timeout=30)[0]
    elapsed = time.monotonic() - started
    print(f"schemathesis: {run.cases} cases over {len(run.operations)} operations in {elapsed:.1f} s")
    assert not run.failures and not run.errors, run.report() + f"\nserver log (tail):\n{server_log[-3000:]}"
    assert documented - run.operations == set(), "operations the fuzz run never reached"
    assert run.cases >= MIN_CASES, f"only {run.cases} cases were generated"
    assert "Traceback" not in server_log, server_log[-3000:]


def test_every_operation_declares_its_error_answers_with_a_body() -> None:
    from agentbolt.server.app import create_app
    from agentbolt.store.memory import InMemoryLightningStore

    spec = create_app(InMemoryLightningStore()).openapi()
    assert "HTTPValidationError" not in json.dumps(spec), "FastAPI's 422 body is not what the API answers"
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            responses = operation["responses"]
            assert "401" in responses, where
            if "requestBody" in operation:
                assert {"400", "413"} <= set(responses), where
            for status, response in responses.items():
                if int(status) >= 400 and path != "/v1/traces":  # OTLP answers in its request's encoding
                    assert response["content"]["application/json"]["schema"]["$ref"], f"{where} {status}"
