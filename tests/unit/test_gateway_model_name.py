"""A call that names another model than the served one is answered by the served model, and the gateway says so
once per name (vLLM would answer 404)."""

from __future__ import annotations

from agentbolt.server.gateway.routes import other_model_note


def test_another_model_name_is_noted_once_per_name() -> None:
    note = other_model_note("gpt-4o-test-note", "qwen2.5-0.5b")
    assert note is not None and "'gpt-4o-test-note'" in note and "'qwen2.5-0.5b'" in note
    assert "gen_ai.request.model" in note
    assert other_model_note("gpt-4o-test-note", "qwen2.5-0.5b") is None  # once
    assert other_model_note("claude-test-note", "qwen2.5-0.5b") is not None  # another name: its own line
    assert other_model_note("qwen2.5-0.5b", "qwen2.5-0.5b") is None  # the served name
    assert other_model_note(None, "qwen2.5-0.5b") is None  # no name given
