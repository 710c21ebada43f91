"""resolve_sampling: which temperature, top_p and max_tokens a gateway call runs with (hand-written cases)."""

from __future__ import annotations

from agentbolt.server.gateway.openai_format import DEFAULT_MAX_TOKENS
from agentbolt.server.gateway.sampling import attempt_llm, resolve_sampling
from agentbolt.types import LLM, PromptTemplate

JOB = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 64}


def _llm(enforced: bool, sampling: dict[str, float | int] | None = None) -> LLM:
    return LLM(endpoint="http://x/v1", model="m", sampling_parameters=sampling or JOB, sampling_enforced=enforced)


def _applied(requested: dict[str, float | int], llm: LLM | None) -> tuple[float, float, int]:
    s = resolve_sampling(requested, llm)
    assert s.requested == requested
    return s.temperature, s.top_p, s.max_tokens


def test_no_version_the_request_then_the_api_defaults() -> None:
    assert _applied({}, None) == (1.0, 1.0, DEFAULT_MAX_TOKENS)
    assert _applied({"temperature": 0.2, "max_tokens": 5}, None) == (0.2, 1.0, 5)


def test_a_users_version_fills_only_what_the_request_leaves_unset() -> None:
    assert _applied({}, _llm(False)) == (0.7, 1.0, 64)
    assert _applied({"temperature": 1.3, "max_tokens": 500}, _llm(False)) == (1.3, 1.0, 500)
    assert _applied({"top_p": 0.9}, _llm(False, {"max_tokens": 8})) == (1.0, 0.9, 8)


def test_an_enforced_version_decides_temperature_and_top_p_and_caps_max_tokens() -> None:
    assert _applied({}, _llm(True)) == (0.7, 1.0, 64)
    assert _applied({"temperature": 0.0, "top_p": 0.5, "max_tokens": 500}, _llm(True)) == (0.7, 1.0, 64)
    assert _applied({"max_tokens": 10}, _llm(True)) == (0.7, 1.0, 10)  # a smaller budget is the agent's choice
    # A key the version does not set is the request's (then the default).
    assert _applied({"top_p": 0.8}, _llm(True, {"temperature": 0.0})) == (0.0, 0.8, DEFAULT_MAX_TOKENS)


def test_the_versions_llm_is_the_one_named_llm_or_the_only_one() -> None:
    a, b = _llm(True), _llm(False)
    prompt = PromptTemplate(template="x")
    assert attempt_llm({"llm": a, "other": b}) is a
    assert attempt_llm({"policy": b, "prompt": prompt}) is b
    assert attempt_llm({"x": a, "y": b}) is None
    assert attempt_llm({"prompt": prompt}) is None
