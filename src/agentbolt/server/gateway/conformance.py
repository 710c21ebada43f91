"""The gateway's conformance table: each protocol x request field x backend -> honoured, recorded or refused.

Made from the code, so it cannot drift: the protocols' field tables (``CHAT_FIELDS``, ``COMPLETIONS_FIELDS``,
``RESPONSES_FIELDS``, ``MESSAGES_FIELDS``: what the gateway does with each field, the same tables the request
readers check keys against) and the backends' ``refused_request_fields`` (what a backend cannot pass on).
``scripts/gateway_conformance.py`` writes it to docs/gateway_conformance.md; a test checks the file is current.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentbolt.server.gateway.anthropic_format import COUNT_TOKENS_FIELDS, MESSAGES_FIELDS
from agentbolt.server.gateway.completions_format import COMPLETIONS_FIELDS
from agentbolt.server.gateway.openai_format import CHAT_FIELDS
from agentbolt.server.gateway.responses_format import RESPONSES_FIELDS

PROTOCOLS: dict[str, tuple[str, Mapping[str, str]]] = {
    "OpenAI Chat Completions": ("POST .../v1/chat/completions", CHAT_FIELDS),
    "OpenAI Completions": ("POST .../v1/completions", COMPLETIONS_FIELDS),
    "OpenAI Responses": ("POST .../v1/responses", RESPONSES_FIELDS),
    "Anthropic Messages": ("POST .../v1/messages", MESSAGES_FIELDS),
    "Anthropic count_tokens": ("POST .../v1/messages/count_tokens", COUNT_TOKENS_FIELDS),
}

REQUEST_FIELD_OF: dict[str, str] = {
    "stop": "stop",
    "stop_sequences": "stop",
    "response_format": "output_format",
    "text": "output_format",
    "output_config": "output_format",
    "output_format": "output_format",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "logprobs": "logprobs",
    "top_logprobs": "top_logprobs",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "logit_bias": "logit_bias",
    "seed": "seed",
    "prompt": "prompt",
    "chat_template_kwargs": "chat_template_kwargs",
}
"""Protocol field -> the :class:`~agentbolt.inference.base.GenerationRequest` field it reaches the backend as
(fields not listed are handled by the gateway itself: messages, sampling rules, recording)."""


BACKENDS = ("embedded", "vllm", "openai", "engines")
"""The table's columns: ``agentbolt serve``'s backends, and the token-in/token-out engines of a job's
``inference.engine`` (llama.cpp, vLLM, SGLang: :mod:`agentbolt.inference.token_engines`)."""


def backend_refusals() -> dict[str, frozenset[str]]:
    """Backend name -> the request fields it cannot pass on."""
    from agentbolt.inference.openai_compat import OpenAICompatBackend
    from agentbolt.inference.token_engines import TokenEngineBackend
    from agentbolt.inference.vllm import VLLMBackend

    return {
        "embedded": frozenset(),
        "vllm": VLLMBackend.refused_request_fields,
        "openai": OpenAICompatBackend.refused_request_fields,
        "engines": TokenEngineBackend.refused_request_fields,
    }


def backend_partial_refusals() -> dict[str, Mapping[str, str]]:
    """Backend name -> request field -> which of its values the backend refuses (the others it honours)."""
    from agentbolt.inference.token_engines import TokenEngineBackend

    return {"engines": TokenEngineBackend.refused_request_values}


_HOW = {
    "embedded": "in this process",
    "vllm": "forwarded to vLLM",
    "openai": "forwarded to the API",
    "engines": "sent to the engine",
}


def _first_clause(what: str) -> str:
    """``refused unless null: ...`` -> ``refused unless null``."""
    cut = len(what)
    for mark in (":", ";", "(", ",", " ("):
        at = what.find(mark)
        if at >= 0:
            cut = min(cut, at)
    return what[:cut].strip()


def _cell(
    field: str,
    what: str,
    backend: str,
    refused: frozenset[str],
    *,
    tokenizes: bool = False,
    partly: Mapping[str, str] | None = None,
) -> str:
    clause = _first_clause(what)
    if clause == "refused":
        return "refused (400)"
    if tokenizes and backend not in ("embedded", "engines"):  # the token engines tokenize here, as embedded does
        return "refused (400)"
    request_field = REQUEST_FIELD_OF.get(field)
    if request_field is not None and request_field in refused:
        return "refused (400)"
    if clause == "honoured" and request_field is not None:
        values = (partly or {}).get(request_field)
        if values:
            return f"honoured ({_HOW[backend]}) but {values}: refused (400)"
        return f"honoured ({_HOW[backend]})"
    return clause


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def conformance_markdown() -> str:
    """The table as Markdown (stable text, final newline)."""
    refusals = backend_refusals()
    partial = backend_partial_refusals()
    lines = [
        "# Gateway conformance",
        "",
        "What the gateway does with each request field of each protocol, per inference backend. Generated from the",
        "code by `scripts/gateway_conformance.py` (do not edit by hand; a test checks it is current).",
        "",
        "- **honoured**: the field does what the real API does. *in this process*: the embedded backend does it",
        "  (stop strings, logprobs, penalties, constrained decoding with llguidance); *forwarded*: the remote server",
        "  does it.",
        "- **recorded**: stored on the call's spans (`agentbolt.llm.request.<field>`); it changes nothing in the",
        "  answer.",
        "- **refused (400)**: answered with a 400 in the protocol's error shape whose `param` names the field, before",
        "  anything is generated or recorded. A key the real API does not have is refused the same way.",
        "",
        "Columns: `embedded`, `vllm` and `openai` are the backends of `agentbolt serve --backend`; `engines` are the",
        "token-in/token-out engines a train or eval job serves through (`inference.engine: llamacpp | vllm | sglang`:",
        "the gateway renders the prompt to ids itself, so counting tokens works there too).",
        "",
        "In the rollouts of a train or eval job, the job's version sets temperature, top_p and the token budget, and",
        "drops penalties and logit bias (the trainer's logprobs assume the plain tempered distribution); what the",
        "agent asked for is recorded as `agentbolt.llm.sampling_requested`.",
        "",
        "The same routes answer at the server's plain `/v1` (`/v1/chat/completions`, `/v1/completions`,",
        "`/v1/responses`, `/v1/messages`, `/v1/messages/count_tokens`) outside any rollout, with the same fields, and",
        'record nothing: "recorded" fields are then accepted and dropped, and `previous_response_id` is refused',
        "(no response is kept to continue from).",
        "",
    ]
    for protocol, (route, fields) in PROTOCOLS.items():
        lines += [f"## {protocol}: `{route}`", ""]
        if protocol == "Anthropic count_tokens":
            lines += ["Counting tokens needs the served model's tokenizer: the embedded backend and the engines.", ""]
        lines += [f"| field | {' | '.join(BACKENDS)} | what the gateway does |", "|---|---|---|---|---|---|"]
        for field in sorted(fields):
            what = fields[field]
            cells = [
                _cell(
                    field,
                    what,
                    backend,
                    refusals[backend],
                    tokenizes=protocol == "Anthropic count_tokens",
                    partly=partial.get(backend),
                )
                for backend in BACKENDS
            ]
            lines.append(f"| `{field}` | {' | '.join(cells)} | {_escape(what)} |")
        lines.append("")
    return "\n".join(lines)
