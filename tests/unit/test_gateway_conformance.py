"""docs/gateway_conformance.md is generated from the code and current; every field of the real APIs (the keys of
the ``openai`` and ``anthropic`` packages' request types) has a row."""

from __future__ import annotations

from pathlib import Path

from agentbolt.server.gateway.conformance import PROTOCOLS, conformance_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "gateway_conformance.md"


def test_committed_table_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == conformance_markdown(), (
        "docs/gateway_conformance.md is out of date; run: .venv/bin/python scripts/gateway_conformance.py"
    )


def test_every_field_of_the_real_request_types_has_a_row() -> None:
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_params

    chat = PROTOCOLS["OpenAI Chat Completions"][1]
    assert set(chat_params.CompletionCreateParamsBase.__annotations__) <= set(chat)
    completions = PROTOCOLS["OpenAI Completions"][1]
    assert set(completion_create_params.CompletionCreateParamsBase.__annotations__) <= set(completions)


def test_a_field_a_backend_cannot_pass_on_is_refused_for_that_backend_only() -> None:
    table = conformance_markdown()
    (prompt_row,) = [line for line in table.splitlines() if line.startswith("| `prompt` |") and "token ids" in line]
    assert prompt_row.split(" | ")[1:4] == ["honoured (in this process)", "refused (400)", "refused (400)"]
